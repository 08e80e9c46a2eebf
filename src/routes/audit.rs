//! `GET /v1/audit`: the audit trail for operators (see `audit_trail`).

use actix_web::{HttpResponse, web};

use super::openapi::ErrorBody;
use crate::audit_trail::{AuditPage, AuditQuery, AuditTrail, RawAuditQuery};
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
    let query = AuditQuery::try_from(query.into_inner())?;
    let page = trail.page(&query).await?;
    Ok(HttpResponse::Ok().json(page))
}
