//! `/v1/metrics` and `/v1/rules`: run-time definitions of velocity metrics and rules.

use actix_web::{HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

use super::gate::Offload;
use super::json::JsonBody;
use super::schemas::{DeletedDoc, ErrorBody, MetricsDoc, RulesDoc};
use crate::domain::{MetricId, RuleId};
use crate::error::ApiError;
use crate::velocity::Velocity;
use crate::velocity::model::{MetricDef, RuleDef};

/// A metric: its expression and optional resolution (`1h`; the window must be a multiple).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricBody {
    expr: String,
    resolution: Option<String>,
}

/// A rule: comparisons of metric ids with numbers, joined by AND / OR.
#[derive(Deserialize, utoipa::ToSchema)]
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

#[utoipa::path(
    put,
    path = "/v1/metrics/{id}",
    summary = "Define or change a metric",
    request_body = MetricBody,
    params(("id" = String, Path, description = "`^[a-z0-9_]{1,64}$`")),
    responses(
        (status = 200, description = "The definition (a changed one gets a new version)", body = MetricDef),
        (status = 400, description = "A bad id, expression (the message gives the column) or resolution", body = ErrorBody),
    )
)]
/// `PUT /v1/metrics/{id}`
pub async fn put_metric(
    v: web::Data<Velocity>,
    id: web::Path<String>,
    body: JsonBody<MetricBody>,
    offload: Offload,
) -> Result<HttpResponse, ApiError> {
    let id = metric_id(id.into_inner())?;
    let body = body.0;
    let def = offload
        .run(async move {
            Ok(v.put_metric(id, &body.expr, body.resolution.as_deref())
                .await?)
        })
        .await?;
    Ok(HttpResponse::Ok().json(def))
}

#[utoipa::path(
    get,
    path = "/v1/metrics/{id}",
    summary = "One metric",
    params(("id" = String, Path, description = "`^[a-z0-9_]{1,64}$`")),
    responses(
        (status = 200, description = "The definition", body = MetricDef),
        (status = 400, description = "A bad id", body = ErrorBody),
        (status = 404, description = "No such metric (`unknown_metric`)", body = ErrorBody),
    )
)]
/// `GET /v1/metrics/{id}`
pub async fn get_metric(
    v: web::Data<Velocity>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(v.metric(&metric_id(id.into_inner())?)?))
}

#[utoipa::path(
    get,
    path = "/v1/metrics",
    summary = "Every metric",
    responses(
        (status = 200, description = "Every definition", body = MetricsDoc),
    )
)]
/// `GET /v1/metrics`
pub async fn list_metrics(v: web::Data<Velocity>) -> HttpResponse {
    HttpResponse::Ok().json(json!({ "metrics": v.list_metrics() }))
}

#[utoipa::path(
    delete,
    path = "/v1/metrics/{id}",
    summary = "Delete a metric",
    params(("id" = String, Path, description = "`^[a-z0-9_]{1,64}$`")),
    responses(
        (status = 200, description = "Deleted", body = DeletedDoc),
        (status = 400, description = "A bad id", body = ErrorBody),
        (status = 404, description = "No such metric (`unknown_metric`)", body = ErrorBody),
        (status = 409, description = "A rule reads it (`metric_in_use`)", body = ErrorBody),
    )
)]
/// `DELETE /v1/metrics/{id}`: refused (409) while a rule reads the metric.
pub async fn delete_metric(
    v: web::Data<Velocity>,
    id: web::Path<String>,
    offload: Offload,
) -> Result<HttpResponse, ApiError> {
    let id = metric_id(id.into_inner())?;
    let gone = id.clone();
    offload
        .run(async move { Ok(v.delete_metric(&gone).await?) })
        .await?;
    Ok(HttpResponse::Ok().json(json!({ "deleted": id })))
}

#[utoipa::path(
    put,
    path = "/v1/rules/{id}",
    summary = "Define or change a rule",
    request_body = RuleBody,
    params(("id" = String, Path, description = "`^[a-z0-9_]{1,64}$`")),
    responses(
        (status = 200, description = "The rule", body = RuleDef),
        (status = 400, description = "A bad id or expression, or a metric that is not defined", body = ErrorBody),
    )
)]
/// `PUT /v1/rules/{id}`
pub async fn put_rule(
    v: web::Data<Velocity>,
    id: web::Path<String>,
    body: JsonBody<RuleBody>,
    offload: Offload,
) -> Result<HttpResponse, ApiError> {
    let id = rule_id(id.into_inner())?;
    let expr = body.0.expr;
    let rule = offload
        .run(async move { Ok(v.put_rule(id, &expr).await?) })
        .await?;
    Ok(HttpResponse::Ok().json(rule))
}

#[utoipa::path(
    get,
    path = "/v1/rules/{id}",
    summary = "One rule",
    params(("id" = String, Path, description = "`^[a-z0-9_]{1,64}$`")),
    responses(
        (status = 200, description = "The rule", body = RuleDef),
        (status = 400, description = "A bad id", body = ErrorBody),
        (status = 404, description = "No such rule (`unknown_rule`)", body = ErrorBody),
    )
)]
/// `GET /v1/rules/{id}`
pub async fn get_rule(
    v: web::Data<Velocity>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(v.rule(&rule_id(id.into_inner())?)?))
}

#[utoipa::path(
    get,
    path = "/v1/rules",
    summary = "Every rule",
    responses(
        (status = 200, description = "Every rule", body = RulesDoc),
    )
)]
/// `GET /v1/rules`
pub async fn list_rules(v: web::Data<Velocity>) -> HttpResponse {
    HttpResponse::Ok().json(json!({ "rules": v.list_rules() }))
}

#[utoipa::path(
    delete,
    path = "/v1/rules/{id}",
    summary = "Delete a rule",
    params(("id" = String, Path, description = "`^[a-z0-9_]{1,64}$`")),
    responses(
        (status = 200, description = "Deleted", body = DeletedDoc),
        (status = 400, description = "A bad id", body = ErrorBody),
        (status = 404, description = "No such rule (`unknown_rule`)", body = ErrorBody),
    )
)]
/// `DELETE /v1/rules/{id}`
pub async fn delete_rule(
    v: web::Data<Velocity>,
    id: web::Path<String>,
    offload: Offload,
) -> Result<HttpResponse, ApiError> {
    let id = rule_id(id.into_inner())?;
    let gone = id.clone();
    offload
        .run(async move { Ok(v.delete_rule(&gone).await?) })
        .await?;
    Ok(HttpResponse::Ok().json(json!({ "deleted": id })))
}
