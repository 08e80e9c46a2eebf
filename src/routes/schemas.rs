//! The OpenAPI schemas of what handlers send and receive that is not a type of their own: the
//! error body every route answers with, and the response shapes handlers build with `json!`
//! (the `*Doc` types, which exist only for the document). A leaf of `routes`: handlers name
//! these in their `#[utoipa::path]`, `openapi` collects them, and nothing here imports a
//! handler or the document.

use std::borrow::Cow;

use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

use crate::domain::ErrorCode;

impl PartialSchema for ErrorCode {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "A stable, machine-readable error code (README, \"Errors\"): never renamed, its \
                 statuses never change.",
            ))
            .enum_values(Some(ErrorCode::ALL.iter().map(|c| c.as_str())))
            .into()
    }
}

impl ToSchema for ErrorCode {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("ErrorCode")
    }
}

/// Every error: `{"error": {"code": "...", "message": "..."}}`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ErrorBody {
    error: ErrorDetail,
}

#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ErrorDetail {
    code: ErrorCode,
    /// What was wrong and where (never a personal value).
    message: String,
}

/// `{"written": n}`
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct WrittenDoc {
    written: usize,
}

/// `{"removed": n}`: entries that were present and not yet expired.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct RemovedDoc {
    removed: usize,
}

/// One entry looked up: `listed`, and its expiry when listed (`null`: never expires).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ListedDoc {
    listed: bool,
    #[schema(required = false)]
    expires_at: Option<i64>,
}

/// `{"deleted": id}`
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct DeletedDoc {
    deleted: String,
}

/// `{"metrics": [...]}`
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct MetricsDoc {
    metrics: Vec<crate::velocity::model::MetricDef>,
}

/// `{"rules": [...]}`
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct RulesDoc {
    rules: Vec<crate::velocity::model::RuleDef>,
}

/// Feature values by metric id (`null`: AVG/MIN/MAX with nothing seen); `capped` names the
/// distinct counts read at their member cap.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct FeaturesDoc {
    #[schema(value_type = Object)]
    values: serde_json::Value,
    #[schema(required = false)]
    capped: Option<Vec<String>>,
}

/// `POST /v1/evaluate`: the check's answer, the features and each rule's outcome.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct EvaluateDoc {
    #[schema(required = false)]
    hits: Option<Vec<crate::lists::Hit>>,
    degraded: bool,
    #[schema(required = false)]
    stale_ms: Option<u64>,
    #[schema(required = false)]
    decision: Option<String>,
    #[schema(value_type = Object)]
    features: serde_json::Value,
    #[schema(value_type = Object)]
    rules: serde_json::Value,
}

/// `{"status": "ok"}`, or `/readyz`'s `{"status": "ready"|"unavailable", "store": kind}`, with
/// `"durable"` for the embedded store.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct StatusDoc {
    status: String,
    /// `redis` or `memory` (the embedded store).
    #[schema(required = false)]
    store: Option<String>,
    /// The embedded store only: whether what it acknowledges survives a restart (a data
    /// directory) or lives in this process's memory alone.
    #[schema(required = false)]
    durable: Option<bool>,
}
