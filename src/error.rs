//! The HTTP face of every error: one table from error to status and stable `code`, and the
//! body `{"error": {"code": "...", "message": "..."}}` of API.md.
//!
//! | error                          | status | code                      |
//! |--------------------------------|--------|---------------------------|
//! | validation (`ValidationError`) | 400    | its own (`invalid_value`, `unknown_dimension`, ...) |
//! | body not JSON                  | 400    | `invalid_json`            |
//! | JSON of the wrong shape        | 400    | `invalid_body`            |
//! | body over the limit            | 413    | `payload_too_large`       |
//! | body not received within 10 s  | 408    | `request_timeout`         |
//! | no such route                  | 404    | `not_found`               |
//! | no such metric / rule          | 404    | `unknown_metric` / `unknown_rule` |
//! | metric still read by a rule    | 409    | `metric_in_use`           |
//! | method not allowed             | 405    | `method_not_allowed`      |
//! | no or invalid bearer token     | 401    | `unauthorized` (+ `WWW-Authenticate: Bearer`) |
//! | a token whose role is too low  | 403    | `forbidden`               |
//! | store unreachable or too slow  | 503    | `store_unavailable` (+ `Retry-After: 1`) |
//! | a write refused unsent: a primary it needs has fewer online replicas than `write_replicas` | 503 | `replicas_unavailable` (+ `Retry-After: 1`) |
//! | a concurrency or memory limit reached | 503 | `overloaded` (+ `Retry-After: 1`) |
//! | anything else                  | 500    | `internal`                |
//!
//! 5xx bodies stay opaque; the cause goes to the log. The exception is a write refused before
//! anything was sent (`StoreError::Refused`, whatever its code): its message names the
//! guarantee that could not be given, by slot range (never a node address or a value), and
//! says that nothing was written. 4xx messages are returned to the caller but never logged
//! (they may quote a value).

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;

use crate::domain::ValidationError;
use crate::lists::ListsError;
use crate::store::{Refusal, StoreError};

/// An error answered to an HTTP caller.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("{0}")]
    InvalidJson(String),
    #[error("{0}")]
    InvalidBody(String),
    #[error("request body larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("the request body did not arrive within {0:?}")]
    RequestTimeout(std::time::Duration),
    #[error("no such resource")]
    NotFound,
    /// A named thing that does not exist (404 with its own code, e.g. `unknown_metric`).
    #[error(transparent)]
    Missing(ValidationError),
    /// A change that conflicts with the current state (409, e.g. `metric_in_use`).
    #[error(transparent)]
    Conflict(ValidationError),
    #[error("method not allowed on this resource")]
    MethodNotAllowed,
    /// No valid bearer token (401).
    #[error("{0}")]
    Unauthorized(String),
    /// A valid token whose role is too low (403).
    #[error("{0}")]
    Forbidden(String),
    #[error(transparent)]
    Unavailable(StoreError),
    /// This instance is at one of its limits (in-flight requests, buffered body bytes).
    #[error("{0}")]
    Overloaded(String),
    #[error("{0}")]
    Internal(String),
}

impl From<ListsError> for ApiError {
    fn from(e: ListsError) -> Self {
        match e {
            ListsError::Invalid(v) => ApiError::Invalid(v),
            ListsError::Unavailable(s) => ApiError::Unavailable(s),
        }
    }
}

impl From<crate::velocity::VelocityError> for ApiError {
    fn from(e: crate::velocity::VelocityError) -> Self {
        use crate::velocity::VelocityError as V;
        match e {
            V::Invalid(v) => ApiError::Invalid(v),
            V::NotFound(v) => ApiError::Missing(v),
            V::Conflict(v) => ApiError::Conflict(v),
            V::Unavailable(s) => ApiError::Unavailable(s),
        }
    }
}

impl ApiError {
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Invalid(v) | ApiError::Missing(v) | ApiError::Conflict(v) => v.code,
            ApiError::InvalidJson(_) => "invalid_json",
            ApiError::InvalidBody(_) => "invalid_body",
            ApiError::PayloadTooLarge { .. } => "payload_too_large",
            ApiError::RequestTimeout(_) => "request_timeout",
            ApiError::NotFound => "not_found",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::Unavailable(StoreError::Refused(Refusal::Replicas { .. })) => {
                "replicas_unavailable"
            }
            ApiError::Unavailable(_) => "store_unavailable",
            ApiError::Overloaded(_) => "overloaded",
            ApiError::Internal(_) => "internal",
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Invalid(_) | ApiError::InvalidJson(_) | ApiError::InvalidBody(_) => {
                StatusCode::BAD_REQUEST
            }
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::NotFound | ApiError::Missing(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::Unavailable(_) | ApiError::Overloaded(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        let message = match self {
            ApiError::Unavailable(StoreError::Refused(r)) => {
                tracing::warn!(error = %r, "write refused, answering 503");
                r.public_message()
            }
            ApiError::Unavailable(e) => {
                tracing::warn!(error = %e, "answering 503");
                "the store did not answer in time; retry later".to_owned()
            }
            ApiError::Internal(e) => {
                tracing::error!(error = %e, "internal error");
                "internal error".to_owned()
            }
            other => other.to_string(),
        };
        let mut res = HttpResponse::build(status);
        if status == StatusCode::SERVICE_UNAVAILABLE {
            res.insert_header(("Retry-After", "1"));
        }
        if status == StatusCode::UNAUTHORIZED {
            res.insert_header(("WWW-Authenticate", "Bearer"));
        }
        res.json(json!({"error": {"code": self.code(), "message": message}}))
    }
}
