//! The one error type of input validation: a stable snake_case `code` for machines and a
//! message that says what was wrong and where (`entries[3].value: ...`).
//!
//! A message never quotes what the caller sent: not a value (a phone number), not a refused
//! name (it may be 10 KB or a phone number), not a map key that is not a plain name
//! ([`shown_key`]). It names the place and what was expected.

use super::code::ErrorCode;
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

    /// Refuses a request of `n` `what` (`"entries"`, `"events"`) past the `max` one request
    /// may carry, with `code`.
    pub fn check_count(n: usize, max: usize, code: ErrorCode, what: &str) -> Result<(), Self> {
        if n > max {
            return Err(Self::new(
                code,
                format!("{n} {what} in one request; at most {max}"),
            ));
        }
        Ok(())
    }

    /// Refuses a source text (`what`: "an expression", "a rule") longer than `max` bytes,
    /// before it is parsed.
    pub fn check_len(src: &str, max: usize, code: ErrorCode, what: &str) -> Result<(), Self> {
        if src.len() > max {
            return Err(Self::new(code, format!("{what} is at most {max} bytes")));
        }
        Ok(())
    }

    /// An error in a parsed text, at its 1-based `col`umn.
    pub fn at_column(code: ErrorCode, col: usize, msg: impl Into<String>) -> Self {
        Self::new(code, format!("column {col}: {}", msg.into()))
    }

    /// Prefixes the message with where the bad input sits, e.g. `entries[3].value`.
    pub fn at(mut self, location: impl fmt::Display) -> Self {
        self.message = format!("{location}: {}", self.message);
        self
    }
}

/// A map key as an error message may show it: itself if it is a plain name
/// (`^[A-Za-z_][A-Za-z0-9_]{0,63}$`: a field or dimension name), else `?` (a caller's key
/// may be anything, a phone number included).
pub fn shown_key(key: &str) -> &str {
    let plain = (1..=64).contains(&key.len())
        && key.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if plain { key } else { "?" }
}
