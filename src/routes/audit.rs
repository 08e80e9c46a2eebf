//! `GET /v1/audit` and `POST /v1/audit`: the audit trail for operators (see `audit_trail`).

use actix_web::{HttpResponse, web};

use super::gate::Offload;
use super::json::JsonBody;
use super::query::Query;
use super::schemas::ErrorBody;
use crate::audit_trail::{AuditPage, AuditQuery, AuditTrail, RawAuditQuery};
use crate::error::ApiError;

/// The 200 of both ways to read the trail.
const PAGE: &str = "Records with masked values and keyed fingerprints; `next_cursor` continues";

#[utoipa::path(
    get,
    path = "/v1/audit",
    summary = "The audit trail, newest first, paged and filtered",
    params(RawAuditQuery),
    responses(
        (status = 200, description = PAGE, body = AuditPage),
        (status = 400, description = "A bad filter (`invalid_filter`, `invalid_list`, `invalid_sandbox`, `unknown_dimension`, `invalid_value`) or cursor (`invalid_cursor`), an unknown parameter (`invalid_body`)", body = ErrorBody),
    )
)]
/// `GET /v1/audit?list=&sandbox=&dimension=&value=&who=&op=&since=&until=&limit=&cursor=`
pub async fn audit(
    trail: web::Data<AuditTrail>,
    query: Query<RawAuditQuery>,
    offload: Offload,
) -> Result<HttpResponse, ApiError> {
    page(trail, query.into_inner(), offload).await
}

#[utoipa::path(
    post,
    path = "/v1/audit",
    summary = "The audit trail, filters in the body (a searched value stays out of the URL)",
    description = "The same filters and answer as `GET /v1/audit`; the console uses it.",
    request_body = RawAuditQuery,
    responses(
        (status = 200, description = PAGE, body = AuditPage),
        (status = 400, description = "A bad body, filter or cursor", body = ErrorBody),
    )
)]
/// `POST /v1/audit` with the filters as a JSON object.
pub async fn search(
    trail: web::Data<AuditTrail>,
    body: JsonBody<RawAuditQuery>,
    offload: Offload,
) -> Result<HttpResponse, ApiError> {
    page(trail, body.0, offload).await
}

/// Checks the query here, then reads and filters the trail on the operator lane.
async fn page(
    trail: web::Data<AuditTrail>,
    raw: RawAuditQuery,
    offload: Offload,
) -> Result<HttpResponse, ApiError> {
    let query = AuditQuery::parse(raw, &trail.rules())?;
    offload
        .json(async move { Ok::<AuditPage, ApiError>(trail.page(&query).await?) })
        .await
}
