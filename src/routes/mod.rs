//! HTTP routes (actix-web). `configure` mounts every route; handlers live in one module per
//! resource and only translate between HTTP and the services.

pub mod check;
pub mod events;
pub mod health;
pub mod json;
pub mod lists;
pub mod velocity;

use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::{Next, from_fn};
use actix_web::{HttpResponse, web};

use crate::auth::{require_admin, require_read, require_write};
use crate::error::ApiError;
use crate::metrics::Metrics;

/// Mounts every route; each `/v1` route requires its role (see `auth`).
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/v1/lists/{list}/entries")
            .route(web::post().to(lists::upsert).wrap(from_fn(require_write)))
            .route(web::delete().to(lists::remove).wrap(from_fn(require_write)))
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource("/v1/lists/{list}/entries/{dimension}/{value:.*}")
            .route(web::get().to(lists::lookup).wrap(from_fn(require_read)))
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource("/v1/check")
            .route(web::post().to(check::check).wrap(from_fn(require_read)))
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource("/v1/metrics")
            .route(
                web::get()
                    .to(velocity::list_metrics)
                    .wrap(from_fn(require_read)),
            )
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource("/v1/metrics/{id}")
            .route(
                web::put()
                    .to(velocity::put_metric)
                    .wrap(from_fn(require_admin)),
            )
            .route(
                web::get()
                    .to(velocity::get_metric)
                    .wrap(from_fn(require_read)),
            )
            .route(
                web::delete()
                    .to(velocity::delete_metric)
                    .wrap(from_fn(require_admin)),
            )
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource("/v1/rules")
            .route(
                web::get()
                    .to(velocity::list_rules)
                    .wrap(from_fn(require_read)),
            )
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource("/v1/rules/{id}")
            .route(
                web::put()
                    .to(velocity::put_rule)
                    .wrap(from_fn(require_admin)),
            )
            .route(
                web::get()
                    .to(velocity::get_rule)
                    .wrap(from_fn(require_read)),
            )
            .route(
                web::delete()
                    .to(velocity::delete_rule)
                    .wrap(from_fn(require_admin)),
            )
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource("/v1/events")
            .route(
                web::post()
                    .to(events::post_events)
                    .wrap(from_fn(require_write)),
            )
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource("/v1/features")
            .route(
                web::post()
                    .to(events::post_features)
                    .wrap(from_fn(require_read)),
            )
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource("/v1/evaluate")
            .route(
                web::post()
                    .to(events::post_evaluate)
                    .wrap(from_fn(require_read)),
            )
            .default_service(web::to(method_not_allowed)),
    )
    .service(web::resource("/healthz").route(web::get().to(health::healthz)))
    .service(web::resource("/readyz").route(web::get().to(health::readyz)))
    .service(web::resource("/metrics").route(web::get().to(health::metrics)));
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

/// Times every request by route pattern (never the raw path, which may carry an identifier)
/// and logs one line per request.
pub async fn observe(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = Instant::now();
    let metrics = req.app_data::<web::Data<Metrics>>().cloned();
    let method = req.method().to_string();
    let res = next.call(req).await?;
    let route = res
        .request()
        .match_pattern()
        .unwrap_or_else(|| "unmatched".to_owned());
    let status = res.status().as_u16();
    let elapsed = started.elapsed();
    if let Some(m) = metrics {
        m.http_requests
            .with_label_values(&[route.as_str(), method.as_str(), &status.to_string()])
            .observe(elapsed.as_secs_f64());
    }
    let error_code = res
        .response()
        .error()
        .and_then(|e| e.as_error::<ApiError>())
        .map(ApiError::code);
    let latency_us = elapsed.as_micros() as u64;
    if status >= 500 {
        tracing::warn!(method, route, status, latency_us, error_code, "request");
    } else {
        tracing::debug!(method, route, status, latency_us, error_code, "request");
    }
    Ok(res)
}
