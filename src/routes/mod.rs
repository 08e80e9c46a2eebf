//! HTTP routes (actix-web). `configure` mounts every route; handlers live in one module per
//! resource and only translate between HTTP and the services.

pub mod audit;
pub mod check;
pub mod console;
pub mod events;
pub mod health;
pub mod json;
pub mod limits;
pub mod lists;
pub mod openapi;
pub mod velocity;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::{Next, from_fn};
use actix_web::{HttpResponse, web};
use tracing::Instrument;

use crate::auth::{require_admin, require_read, require_write};
use crate::domain::ErrorCode;
use crate::error::ApiError;
use crate::metrics::Metrics;

/// Who may call a route (see `auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No token: probes, scrapers, the API's own description.
    Open,
    Read,
    Write,
    Admin,
}

/// One API route as mounted: the method, the path pattern (actix syntax: `{value:.*}` takes
/// the rest of the path) and who may call it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteDef {
    pub method: &'static str,
    pub path: &'static str,
    pub access: Access,
}

fn guarded(route: actix_web::Route, access: Access) -> actix_web::Route {
    match access {
        Access::Open => route,
        Access::Read => route.wrap(from_fn(require_read)),
        Access::Write => route.wrap(from_fn(require_write)),
        Access::Admin => route.wrap(from_fn(require_admin)),
    }
}

/// Declares the API's routes once: `configure` mounts them (any other method on a path is a
/// 405) and `ROUTES` lists them, which `tests/openapi.rs` compares with the OpenAPI document
/// both ways. A route added here and not documented fails that test.
macro_rules! api_routes {
    ($( $path:literal => [ $( $method:ident $handler:path, $access:ident );+ $(;)? ] ),* $(,)?) => {
        /// Every API route, in mounting order.
        pub const ROUTES: &[RouteDef] = &[
            $( $( RouteDef { method: stringify!($method), path: $path, access: Access::$access }, )+ )*
        ];

        /// Mounts every API route with its access, and the documentation (`openapi`).
        pub fn configure(cfg: &mut web::ServiceConfig) {
            $(
                let resource = web::resource($path)
                    $( .route(guarded(
                        web::method(actix_web::http::Method::$method).to($handler),
                        Access::$access,
                    )) )+
                    .default_service(web::to(method_not_allowed));
                cfg.service(resource);
            )*
            openapi::configure(cfg);
            console::configure(cfg);
        }
    };
}

api_routes! {
    "/v1/lists" => [GET lists::summaries, Read],
    "/v1/lists/-/lookup/{dimension}/{value:.*}" => [GET lists::lookup_everywhere, Read],
    "/v1/audit" => [GET audit::audit, Read; POST audit::search, Read],
    "/v1/whoami" => [GET console::whoami, Read],
    "/v1/lists/{list}/entries" => [POST lists::upsert, Write; DELETE lists::remove, Write],
    "/v1/lists/{list}/entries/{dimension}/{value:.*}" => [GET lists::lookup, Read],
    "/v1/check" => [POST check::check, Read],
    "/v1/metrics" => [GET velocity::list_metrics, Read],
    "/v1/metrics/{id}" => [
        PUT velocity::put_metric, Admin;
        GET velocity::get_metric, Read;
        DELETE velocity::delete_metric, Admin
    ],
    "/v1/rules" => [GET velocity::list_rules, Read],
    "/v1/rules/{id}" => [
        PUT velocity::put_rule, Admin;
        GET velocity::get_rule, Read;
        DELETE velocity::delete_rule, Admin
    ],
    "/v1/events" => [POST events::post_events, Write],
    "/v1/features" => [POST events::post_features, Read],
    "/v1/evaluate" => [POST events::post_evaluate, Read],
    "/healthz" => [GET health::healthz, Open],
    "/readyz" => [GET health::readyz, Open],
    "/metrics" => [GET health::metrics, Open],
}

/// Any path that is not a route.
pub async fn not_found() -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound)
}

async fn method_not_allowed() -> Result<HttpResponse, ApiError> {
    Err(ApiError::MethodNotAllowed)
}

/// Query-string and path extraction errors, as JSON 400s.
pub fn query_error(
    err: actix_web::error::QueryPayloadError,
    _: &actix_web::HttpRequest,
) -> actix_web::Error {
    ApiError::InvalidBody(format!("query string: {err}")).into()
}

/// The header a request id is read from (when the caller sends a sane one) and echoed in.
pub const REQUEST_ID: &str = "x-request-id";

/// A caller's request id if it is 1 to 64 characters of `[A-Za-z0-9._:-]` and not digits
/// alone (anything else could be a log injection, or a phone, IMEI or ID card number), else a
/// new one.
fn request_id(req: &ServiceRequest) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static BOOT: OnceLock<u32> = OnceLock::new();
    let sane = |s: &&str| {
        (1..=64).contains(&s.len())
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
            && !s
                .bytes()
                .all(|b| b.is_ascii_digit() || matches!(b, b'X' | b'x' | b'-' | b' '))
    };
    match req
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(sane)
    {
        Some(id) => id.to_owned(),
        None => format!(
            "{:08x}-{:x}",
            BOOT.get_or_init(rand::random::<u32>),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ),
    }
}

/// Runs every request in a `request` span (method, route pattern, request id: never the raw
/// path, which may carry an identifier), times it by route pattern, logs one line per
/// request and echoes the request id in `x-request-id`.
pub async fn observe(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let started = Instant::now();
    let metrics = req.app_data::<web::Data<Metrics>>().cloned();
    let method = req.method().clone();
    let route = req
        .match_pattern()
        .unwrap_or_else(|| "unmatched".to_owned());
    let id = request_id(&req);
    let span = tracing::info_span!("request", method = method.as_str(), route, request_id = id);
    let mut res = next
        .call(req)
        .instrument(span.clone())
        .await?
        .map_into_boxed_body();
    let status = res.status();
    let elapsed = started.elapsed();
    if let Some(m) = metrics {
        m.http_requests
            .with_label_values(&[route.as_str(), method.as_str(), status.as_str()])
            .observe(elapsed.as_secs_f64());
    }
    if let Ok(v) = HeaderValue::from_str(&id) {
        res.headers_mut()
            .insert(HeaderName::from_static(REQUEST_ID), v);
    }
    let error_code = res
        .response()
        .error()
        .and_then(|e| e.as_error::<ApiError>())
        .map(ApiError::code);
    let overloaded = error_code == Some(ErrorCode::Overloaded);
    let error_code = error_code.map(ErrorCode::as_str);
    let latency_us = elapsed.as_micros() as u64;
    let status = status.as_u16();
    let _in = span.enter();
    // Overload is logged at debug: one warning per refused request would add to the load.
    if status >= 500 && !overloaded {
        tracing::warn!(status, latency_us, error_code, "request");
    } else {
        tracing::debug!(status, latency_us, error_code, "request");
    }
    Ok(res)
}
