//! The HTTP face of every error: one table from error to status and stable `code`, and the
//! body `{"error": {"code": "...", "message": "..."}}` of API.md.
//!
//! The codes, their statuses and when each is used are one table, `ErrorCode`
//! (`domain/code.rs`); README's error table is checked against it. Here each `ApiError`
//! picks its code and status: a `ValidationError` is 400 (`Invalid`), 404 (`Missing`, e.g.
//! `unknown_metric`) or 409 (`Conflict`); a `StoreError` is 503 (`replicas_unavailable` for a
//! write refused for want of replicas, else `store_unavailable`), with `Retry-After: 1` like
//! every 503; 401 adds `WWW-Authenticate: Bearer`; 429 adds `Retry-After` in whole seconds.
//!
//! 5xx bodies stay opaque; the cause goes to the log. The exception is a write refused before
//! anything was sent (`StoreError::Refused`, whatever its code): its message names the
//! guarantee that could not be given, by slot range (never a node address or a value), and
//! says that nothing was written. 4xx messages are returned to the caller but never logged
//! (they may quote a value).

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;

use crate::domain::{ErrorCode, ValidationError};
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
    /// A valid token without the permission the route needs (403).
    #[error("{0}")]
    Forbidden(String),
    /// A token past its rate or its concurrency (429, with `Retry-After`).
    #[error("{message}")]
    RateLimited {
        message: String,
        retry_after: std::time::Duration,
    },
    #[error(transparent)]
    Unavailable(StoreError),
    /// This instance is at one of its limits (in-flight requests, buffered body bytes).
    #[error("{0}")]
    Overloaded(String),
    #[error("{0}")]
    Internal(String),
}

impl From<crate::auth::Denied> for ApiError {
    fn from(d: crate::auth::Denied) -> Self {
        use crate::auth::Denied;
        match d {
            Denied::Unauthorized(m) => ApiError::Unauthorized(m),
            Denied::Forbidden(m) => ApiError::Forbidden(m),
            Denied::RateLimited {
                message,
                retry_after,
            } => ApiError::RateLimited {
                message,
                retry_after,
            },
        }
    }
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
    /// Its stable code (see `ErrorCode` for the table of codes and statuses).
    pub fn code(&self) -> ErrorCode {
        match self {
            ApiError::Invalid(v) | ApiError::Missing(v) | ApiError::Conflict(v) => v.code,
            ApiError::InvalidJson(_) => ErrorCode::InvalidJson,
            ApiError::InvalidBody(_) => ErrorCode::InvalidBody,
            ApiError::PayloadTooLarge { .. } => ErrorCode::PayloadTooLarge,
            ApiError::RequestTimeout(_) => ErrorCode::RequestTimeout,
            ApiError::NotFound => ErrorCode::NotFound,
            ApiError::MethodNotAllowed => ErrorCode::MethodNotAllowed,
            ApiError::Unauthorized(_) => ErrorCode::Unauthorized,
            ApiError::Forbidden(_) => ErrorCode::Forbidden,
            ApiError::RateLimited { .. } => ErrorCode::RateLimited,
            ApiError::Unavailable(StoreError::Refused(Refusal::Replicas { .. })) => {
                ErrorCode::ReplicasUnavailable
            }
            ApiError::Unavailable(
                StoreError::Refused(Refusal::KeyspaceLost) | StoreError::Lost(_),
            ) => ErrorCode::KeyspaceLost,
            ApiError::Unavailable(_) => ErrorCode::StoreUnavailable,
            ApiError::Overloaded(_) => ErrorCode::Overloaded,
            ApiError::Internal(_) => ErrorCode::Internal,
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
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
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
            ApiError::Unavailable(e @ StoreError::Lost(_)) => {
                tracing::warn!(error = %e, "keyspace lost, answering 503");
                crate::store::LOST_MESSAGE.to_owned()
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
        if let ApiError::RateLimited { retry_after, .. } = self {
            // Whole seconds, at least 1 (RFC 9110), rounded up so a retry at once is not early.
            let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
            res.insert_header(("Retry-After", secs.max(1).to_string()));
        }
        if status == StatusCode::UNAUTHORIZED {
            res.insert_header(("WWW-Authenticate", "Bearer"));
        }
        res.json(json!({"error": {"code": self.code().as_str(), "message": message}}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every answer's status is one its code's row allows, so `ErrorCode::statuses` (and the
    /// README table checked against it) tells the truth.
    #[test]
    fn every_status_is_in_its_codes_row() {
        let v = |c| ValidationError::new(c, "x");
        let mut errors = vec![
            ApiError::InvalidJson("x".into()),
            ApiError::InvalidBody("x".into()),
            ApiError::PayloadTooLarge { limit: 1 },
            ApiError::RequestTimeout(std::time::Duration::from_secs(10)),
            ApiError::NotFound,
            ApiError::Missing(v(ErrorCode::UnknownMetric)),
            ApiError::Missing(v(ErrorCode::UnknownRule)),
            ApiError::Conflict(v(ErrorCode::MetricInUse)),
            ApiError::Conflict(v(ErrorCode::TooManyDefinitions)),
            ApiError::MethodNotAllowed,
            ApiError::Unauthorized("x".into()),
            ApiError::Forbidden("x".into()),
            ApiError::RateLimited {
                message: "x".into(),
                retry_after: std::time::Duration::from_millis(1500),
            },
            ApiError::Unavailable(StoreError::Timeout(std::time::Duration::from_millis(1))),
            ApiError::Unavailable(StoreError::Refused(Refusal::Replicas {
                primary: "p".into(),
                slots: "0-1".into(),
                needed: 1,
                online: 0,
            })),
            ApiError::Unavailable(StoreError::Refused(Refusal::NoTime {
                left: std::time::Duration::ZERO,
            })),
            ApiError::Unavailable(StoreError::Refused(Refusal::KeyspaceLost)),
            ApiError::Unavailable(StoreError::Lost("x".into())),
            ApiError::Overloaded("x".into()),
            ApiError::Internal("x".into()),
        ];
        // Every code a 400 row names can come through validation.
        errors.extend(
            ErrorCode::ALL
                .iter()
                .filter(|c| c.statuses().contains(&400))
                .map(|&c| ApiError::Invalid(v(c))),
        );
        let mut answered = std::collections::HashSet::new();
        for e in &errors {
            let status = e.status_code().as_u16();
            assert!(
                e.code().statuses().contains(&status),
                "{:?} answers {status}, its row says {:?}",
                e.code(),
                e.code().statuses()
            );
            answered.insert((e.code(), status));
        }
        // And every (code, status) of the table is reachable.
        for &c in ErrorCode::ALL {
            for &s in c.statuses() {
                assert!(answered.contains(&(c, s)), "{c} {s} is never answered");
            }
        }
    }
}
