//! `/v1/metrics` and `/v1/rules`: run-time definitions of velocity metrics and rules.

use actix_web::{HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

use super::json::JsonBody;
use crate::domain::{MetricId, RuleId};
use crate::error::ApiError;
use crate::velocity::Velocity;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricBody {
    expr: String,
    resolution: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleBody {
    expr: String,
}

fn metric_id(raw: String) -> Result<MetricId, ApiError> {
    MetricId::try_from(raw).map_err(|e| e.at("path").into())
}

fn rule_id(raw: String) -> Result<RuleId, ApiError> {
    RuleId::try_from(raw).map_err(|e| e.at("path").into())
}

/// `PUT /v1/metrics/{id}`
pub async fn put_metric(
    v: web::Data<Velocity>,
    id: web::Path<String>,
    body: JsonBody<MetricBody>,
) -> Result<HttpResponse, ApiError> {
    let id = metric_id(id.into_inner())?;
    let def = v
        .put_metric(id, &body.0.expr, body.0.resolution.as_deref())
        .await?;
    Ok(HttpResponse::Ok().json(def))
}

/// `GET /v1/metrics/{id}`
pub async fn get_metric(
    v: web::Data<Velocity>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(v.metric(&metric_id(id.into_inner())?)?))
}

/// `GET /v1/metrics`
pub async fn list_metrics(v: web::Data<Velocity>) -> HttpResponse {
    HttpResponse::Ok().json(json!({ "metrics": v.list_metrics() }))
}

/// `DELETE /v1/metrics/{id}`: refused (409) while a rule reads the metric.
pub async fn delete_metric(
    v: web::Data<Velocity>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = metric_id(id.into_inner())?;
    v.delete_metric(&id).await?;
    Ok(HttpResponse::Ok().json(json!({ "deleted": id })))
}

/// `PUT /v1/rules/{id}`
pub async fn put_rule(
    v: web::Data<Velocity>,
    id: web::Path<String>,
    body: JsonBody<RuleBody>,
) -> Result<HttpResponse, ApiError> {
    let id = rule_id(id.into_inner())?;
    Ok(HttpResponse::Ok().json(v.put_rule(id, &body.0.expr).await?))
}

/// `GET /v1/rules/{id}`
pub async fn get_rule(
    v: web::Data<Velocity>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(v.rule(&rule_id(id.into_inner())?)?))
}

/// `GET /v1/rules`
pub async fn list_rules(v: web::Data<Velocity>) -> HttpResponse {
    HttpResponse::Ok().json(json!({ "rules": v.list_rules() }))
}

/// `DELETE /v1/rules/{id}`
pub async fn delete_rule(
    v: web::Data<Velocity>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = rule_id(id.into_inner())?;
    v.delete_rule(&id).await?;
    Ok(HttpResponse::Ok().json(json!({ "deleted": id })))
}
