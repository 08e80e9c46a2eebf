//! `GET /v1/audit`: the audit trail for operators (see `audit_trail`).

use actix_web::{HttpResponse, web};

use crate::audit_trail::{AuditQuery, AuditTrail, RawAuditQuery};
use crate::error::ApiError;

/// `GET /v1/audit?list=&sandbox=&dimension=&value=&who=&op=&since=&until=&limit=&cursor=`
pub async fn audit(
    trail: web::Data<AuditTrail>,
    query: web::Query<RawAuditQuery>,
) -> Result<HttpResponse, ApiError> {
    let query = AuditQuery::try_from(query.into_inner())?;
    let page = trail.page(&query).await?;
    Ok(HttpResponse::Ok().json(page))
}
