//! HTTP routes (actix-web). `configure` mounts every route; handlers live in one module per
//! resource and only translate between HTTP and the services.

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

use crate::auth::Permission;
use crate::domain::ErrorCode;
use crate::error::ApiError;
use crate::metrics::Metrics;

/// What a route needs of its caller (see `auth` for what each permission means).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// No token: probes, scrapers, the API's own description.
    Open,
    /// Any valid token.
    Token,
    /// A token holding this permission.
    Permission(Permission),
}

impl Need {
    /// As the OpenAPI document and the README say it.
    pub fn describe(self) -> String {
        match self {
            Need::Open => "no token".to_owned(),
            Need::Token => "any token".to_owned(),
            Need::Permission(p) => format!("permission `{}`", p.as_str()),
        }
    }
}

/// Which budget of the instance a route's requests share (see `limits`): the risk engine's
/// per-request calls, writes, and operators' reads and definitions never wait for each
/// other's room, and operators' work runs on its own lane (`lane`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// Probes and `/metrics`: no budget, no token.
    Probe,
    /// `check`, `features`, `evaluate`: `max_in_flight_requests`.
    Engine,
    /// Entries and events: `max_in_flight_writes`.
    Write,
    /// Lists, lookups, audit, definitions, whoami: `max_in_flight_operator`, on the operator
    /// lane.
    Operator,
}

impl Class {
    /// The `class` label of the budget metrics.
    pub fn label(self) -> &'static str {
        match self {
            Class::Probe => "probe",
            Class::Engine => "engine",
            Class::Write => "write",
            Class::Operator => "operator",
        }
    }
}

/// What a route asks of the store, and so which 503s it can answer (the OpenAPI document's
/// 503 line is derived from it: `openapi::Gates`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreUse {
    /// Nothing: only a full budget (`overloaded`).
    None,
    /// Reads: also `store_unavailable`.
    Reads,
    /// Writes: also `replicas_unavailable` (with `write_replicas`).
    Writes,
}

/// One API route as mounted: the method, the path pattern (actix syntax: `{value:.*}` takes
/// the rest of the path), what its caller needs, the budget it counts against and what it
/// asks of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteDef {
    pub method: &'static str,
    pub path: &'static str,
    pub need: Need,
    pub class: Class,
    pub store: StoreUse,
}

fn guarded(route: actix_web::Route, def: RouteDef) -> actix_web::Route {
    match def.need {
        Need::Open => route,
        _ => route.wrap(from_fn(move |req, next| gate::gate(def, req, next))),
    }
}

/// Declares the API's routes once: `configure` mounts them (any other method on a path is a
/// 405), each behind its gate (`gate`: token, permission, per-token limits, body, class
/// budget), and `ROUTES` lists them, which `tests/integration/openapi.rs` compares with the OpenAPI
/// document both ways, the OpenAPI document takes each operation's "Needs" and error
/// responses from, and `tests/integration/auth.rs` compares with the README's table. A route added here
/// and not documented fails those tests.
macro_rules! api_routes {
    ($( $path:literal => [ $( $method:ident $handler:path, $need:expr, $class:ident, $store:ident );+ $(;)? ] ),* $(,)?) => {
        /// Every API route, in mounting order.
        pub const ROUTES: &[RouteDef] = &[
            $( $( RouteDef { method: stringify!($method), path: $path, need: $need, class: Class::$class, store: StoreUse::$store }, )+ )*
        ];

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

const CHECK: Need = Need::Permission(Permission::Check);
const LISTS: Need = Need::Permission(Permission::Lists);
const AUDIT: Need = Need::Permission(Permission::Audit);
const ENTRIES: Need = Need::Permission(Permission::Entries);
const EVENTS: Need = Need::Permission(Permission::Events);
const DEFINITIONS: Need = Need::Permission(Permission::Definitions);

api_routes! {
    "/v1/lists" => [GET lists::summaries, LISTS, Operator, Reads],
    "/v1/lists/-/lookup" => [POST lists::lookup_posted, LISTS, Operator, Reads],
    "/v1/lists/-/lookup/{dimension}/{value:.*}" => [GET lists::lookup_everywhere, LISTS, Operator, Reads],
    "/v1/audit" => [GET audit::audit, AUDIT, Operator, Reads; POST audit::search, AUDIT, Operator, Reads],
    "/v1/whoami" => [GET console::whoami, Need::Token, Operator, None],
    "/v1/lists/{list}/entries" => [POST lists::upsert, ENTRIES, Write, Writes; DELETE lists::remove, ENTRIES, Write, Writes],
    "/v1/lists/{list}/entries/{dimension}/{value:.*}" => [GET lists::lookup, LISTS, Operator, Reads],
    "/v1/check" => [POST check::check, CHECK, Engine, Reads],
    "/v1/metrics" => [GET velocity::list_metrics, CHECK, Operator, Reads],
    "/v1/metrics/{id}" => [
        PUT velocity::put_metric, DEFINITIONS, Operator, Writes;
        GET velocity::get_metric, CHECK, Operator, Reads;
        DELETE velocity::delete_metric, DEFINITIONS, Operator, Writes
    ],
    "/v1/rules" => [GET velocity::list_rules, CHECK, Operator, Reads],
    "/v1/rules/{id}" => [
        PUT velocity::put_rule, DEFINITIONS, Operator, Writes;
        GET velocity::get_rule, CHECK, Operator, Reads;
        DELETE velocity::delete_rule, DEFINITIONS, Operator, Writes
    ],
    "/v1/events" => [POST events::post_events, EVENTS, Write, Writes],
    "/v1/features" => [POST events::post_features, CHECK, Engine, Reads],
    // With an `event`, also `events` (checked by the handler, which sees the body), and a
    // write.
    "/v1/evaluate" => [POST events::post_evaluate, CHECK, Engine, Writes],
    "/healthz" => [GET health::healthz, Need::Open, Probe, None],
    "/readyz" => [GET health::readyz, Need::Open, Probe, None],
    "/metrics" => [GET health::metrics, Need::Open, Probe, None],
}

/// The route of `method` and `path` pattern, if it is one.
pub fn route_def(method: &str, path: &str) -> Option<&'static RouteDef> {
    ROUTES.iter().find(|r| r.method == method && r.path == path)
}

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
