//! The one error type of input validation: a stable snake_case `code` for machines and a
//! message that says what was wrong and where (`entries[3].value: ...`).

use super::ErrorCode;
use std::fmt;

/// A caller's mistake found while parsing input. Always maps to a 4xx.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ValidationError {
    /// Stable machine-readable code (`invalid_value`, `unknown_dimension`, ...).
    pub code: ErrorCode,
    /// Human-readable message, prefixed with the location of the bad input when known.
    pub message: String,
}

impl ValidationError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// Prefixes the message with where the bad input sits, e.g. `entries[3].value`.
    pub fn at(mut self, location: impl fmt::Display) -> Self {
        self.message = format!("{location}: {}", self.message);
        self
    }
}
