//! `GET /v1/audit` and `POST /v1/audit`: the audit trail for operators (see `audit_trail`).

use actix_web::{HttpResponse, web};

use super::json::JsonBody;
use super::openapi::ErrorBody;
use crate::audit_trail::{AuditPage, AuditQuery, AuditSearch, AuditTrail, RawAuditQuery};
use crate::error::ApiError;

#[utoipa::path(
    get,
    path = "/v1/audit",
    tag = "lists",
    summary = "The audit trail, newest first, paged and filtered",
    description = "Role: read.",
    params(RawAuditQuery),
    responses(
        (status = 200, description = "Records with masked values and keyed fingerprints; `next_cursor` continues", body = AuditPage),
        (status = 400, description = "A bad filter (`invalid_filter`, `invalid_list`, `invalid_sandbox`, `unknown_dimension`, `invalid_value`) or cursor (`invalid_cursor`), an unknown parameter (`invalid_body`)", body = ErrorBody),
        (status = 401, description = "Tokens are configured and no valid bearer token was sent (`unauthorized`, with `WWW-Authenticate: Bearer`)", body = ErrorBody),
        (status = 403, description = "The token's role is too low (`forbidden`)", body = ErrorBody),
        (status = 503, description = "`store_unavailable` (the store did not answer within the deadline) or `overloaded`; with `Retry-After`", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
/// `GET /v1/audit?list=&sandbox=&dimension=&value=&who=&op=&since=&until=&limit=&cursor=`
pub async fn audit(
    trail: web::Data<AuditTrail>,
    query: web::Query<RawAuditQuery>,
) -> Result<HttpResponse, ApiError> {
    page(&trail, query.into_inner()).await
}

#[utoipa::path(
    post,
    path = "/v1/audit",
    tag = "lists",
    summary = "The audit trail, filters in the body (a searched value stays out of the URL)",
    description = "Role: read. The same filters and answer as `GET /v1/audit`; the console uses it.",
    request_body = AuditSearch,
    responses(
        (status = 200, description = "Records with masked values and keyed fingerprints; `next_cursor` continues", body = AuditPage),
        (status = 400, description = "A bad body, filter or cursor", body = ErrorBody),
        (status = 401, description = "Tokens are configured and no valid bearer token was sent (`unauthorized`, with `WWW-Authenticate: Bearer`)", body = ErrorBody),
        (status = 403, description = "The token's role is too low (`forbidden`)", body = ErrorBody),
        (status = 408, description = "The body did not arrive within 10 s (`request_timeout`)", body = ErrorBody),
        (status = 413, description = "Body over `max_body_bytes` (`payload_too_large`)", body = ErrorBody),
        (status = 503, description = "`store_unavailable` (the store did not answer within the deadline) or `overloaded`; with `Retry-After`", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
/// `POST /v1/audit` with the filters as a JSON object.
pub async fn search(
    trail: web::Data<AuditTrail>,
    body: JsonBody<AuditSearch>,
) -> Result<HttpResponse, ApiError> {
    page(&trail, RawAuditQuery::try_from(body.0)?).await
}

async fn page(trail: &AuditTrail, raw: RawAuditQuery) -> Result<HttpResponse, ApiError> {
    let query = AuditQuery::try_from(raw)?;
    Ok(HttpResponse::Ok().json(trail.page(&query).await?))
}
