//! Operations endpoints: `/healthz` (the process is up), `/readyz` (the store answers),
//! `/metrics` (Prometheus text). None needs a token.

use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use serde_json::json;

use super::schemas::StatusDoc;
use crate::lists::NameLists;
use crate::metrics::Metrics;

#[utoipa::path(
    get,
    path = "/healthz",
    summary = "The process is up",
    description = "No token needed.",
    responses(
        (status = 200, description = "Always", body = StatusDoc),
    )
)]
/// `GET /healthz`
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

#[utoipa::path(
    get,
    path = "/readyz",
    summary = "The store answers",
    description = "No token needed.",
    responses(
        (status = 200, description = "Ready", body = StatusDoc), (status = 503, description = "The store did not answer within 1 s", body = StatusDoc),
    )
)]
/// `GET /readyz`: 200 only while the store answers a ping within a second (a failure is
/// logged by the store call).
pub async fn readyz(lists: web::Data<NameLists>) -> HttpResponse {
    let store = lists.store();
    let (status, mut body) = match lists.ping(Duration::from_secs(1)).await {
        Ok(()) => (StatusCode::OK, json!({"status": "ready"})),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "unavailable"}),
        ),
    };
    body["store"] = json!(store.kind());
    if let Some(durable) = store.durable() {
        body["durable"] = json!(durable);
    }
    HttpResponse::build(status).json(body)
}

#[utoipa::path(
    get,
    path = "/metrics",
    summary = "Prometheus metrics",
    description = "No token needed.",
    responses(
        (status = 200, description = "Prometheus text format", body = String, content_type = "text/plain"),
    )
)]
/// `GET /metrics`
pub async fn metrics(metrics: web::Data<Metrics>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(metrics.scrape())
}
