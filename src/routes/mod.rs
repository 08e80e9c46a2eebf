//! HTTP routes (actix-web). `configure` mounts every route; handlers live in one module per
//! resource and only translate between HTTP and the services.
//!
//! Layering: each module imports only modules of `routes` below it, so none imports one above
//! it and no two import each other (a module's own `tests` aside):
//!
//! ```text
//! routes (this module)   everything: it mounts the table and observes every request
//! openapi                table, schemas, and the handlers (its `paths`)
//! handlers               gate, query, json, schemas (and events: check's body)
//!   audit check console events health lists velocity
//! gate                   table, limits, json
//! query                  json
//! json                   limits
//! limits                 table
//! table                  nothing of routes: handler names are tokens of `route_table!`,
//!                        resolved only where this module mounts them
//! schemas                nothing of routes
//! ```

pub mod audit;
pub mod check;
pub mod console;
pub mod events;
pub mod gate;
pub mod health;
pub mod json;
pub mod limits;
pub mod lists;
pub mod openapi;
pub mod query;
pub mod schemas;
pub mod table;
pub mod velocity;

pub use self::table::{Class, Need, ROUTES, RouteDef, StoreUse, route_def};

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::{Next, from_fn};
use actix_web::{HttpResponse, web};
use tracing::Instrument;

use self::table::{AUDIT, CHECK, DEFINITIONS, ENTRIES, EVENTS, LISTS};
use crate::domain::ErrorCode;
use crate::error::ApiError;
use crate::metrics::Metrics;

fn guarded(route: actix_web::Route, def: RouteDef) -> actix_web::Route {
    match def.need {
        Need::Open => route,
        _ => route.wrap(from_fn(move |req, next| gate::gate(def, req, next))),
    }
}

/// Mounts every route of the table (`table::route_table!`) with its gate, any other method
/// on a path answering 405, then the documentation (`openapi`) and the console.
macro_rules! mount_routes {
    ($( $path:literal => [ $( $method:ident $handler:path, $need:expr, $class:ident, $store:ident );+ $(;)? ] ),* $(,)?) => {
        /// Mounts every API route with its gate, and the documentation (`openapi`).
        pub fn configure(cfg: &mut web::ServiceConfig) {
            $(
                let resource = web::resource($path)
                    $( .route(guarded(
                        web::method(actix_web::http::Method::$method).to($handler),
                        RouteDef { method: stringify!($method), path: $path, need: $need, class: Class::$class, store: StoreUse::$store },
                    )) )+
                    .default_service(web::to(method_not_allowed));
                cfg.service(resource);
            )*
            openapi::configure(cfg);
            console::configure(cfg);
        }
    };
}

table::route_table!(mount_routes);

/// Any path that is not a route.
pub async fn not_found() -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound)
}

async fn method_not_allowed() -> Result<HttpResponse, ApiError> {
    Err(ApiError::MethodNotAllowed)
}

/// The header a request id is read from (when the caller sends a sane one) and echoed in.
pub const REQUEST_ID: &str = "x-request-id";

/// Whether a caller's request id looks like an id and nothing else: a UUID, a ULID, or 8 to
/// 64 hex digits and `-` with at least one letter. Anything else could be a log injection, or
/// a phone, IMEI, ID card number or address (`203.0.113.77` is not an id), and is replaced.
pub fn sane_request_id(s: &str) -> bool {
    let b = s.as_bytes();
    let uuid = b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        });
    // Crockford's base32 (no I, L, O, U), 26 characters, the first at most 7.
    let ulid = b.len() == 26
        && matches!(b[0], b'0'..=b'7')
        && b.iter().all(|c| {
            let c = c.to_ascii_uppercase();
            c.is_ascii_digit()
                || (c.is_ascii_uppercase() && !matches!(c, b'I' | b'L' | b'O' | b'U'))
        });
    let hex = (8..=64).contains(&b.len())
        && b.iter().all(|c| c.is_ascii_hexdigit() || *c == b'-')
        && b.iter().any(u8::is_ascii_alphabetic);
    uuid || ulid || hex
}

/// A caller's request id if it is sane (`sane_request_id`), else a new one.
fn request_id(req: &ServiceRequest) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static BOOT: OnceLock<u32> = OnceLock::new();
    match req
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|s| sane_request_id(s))
    {
        Some(id) => id.to_owned(),
        None => format!(
            "{:08x}-{:x}",
            BOOT.get_or_init(rand::random::<u32>),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ),
    }
}

/// The `method` label of a request: the methods HTTP defines, else `other`, so that made-up
/// methods (`FOOBAR`) cannot each make a series of their own.
pub fn method_label(method: &actix_web::http::Method) -> &'static str {
    use actix_web::http::Method;
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "other",
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
    let method = method_label(req.method());
    // A pattern of `ROUTES` (or one of the documentation's): a closed set, never the path.
    let route = req
        .match_pattern()
        .unwrap_or_else(|| "unmatched".to_owned());
    let id = request_id(&req);
    let span = tracing::info_span!("request", method, route, request_id = id);
    let mut res = next
        .call(req)
        .instrument(span.clone())
        .await?
        .map_into_boxed_body();
    let status = res.status();
    let elapsed = started.elapsed();
    if let Some(m) = metrics {
        m.http_requests
            .with_label_values(&[route.as_str(), method, status.as_str()])
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
