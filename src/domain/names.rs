//! Identifiers with a fixed alphabet: list names, sandboxes, metric and rule ids, event types
//! and field names. None of their alphabets holds `\n`, `:`, `{` or `}`, which the storage
//! layout relies on to join them unambiguously and to place hash tags.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::code::ErrorCode;
use super::error::ValidationError;

fn check_ident(
    s: &str,
    max: usize,
    allowed: impl Fn(u8) -> bool,
    code: ErrorCode,
    what: &str,
    pattern: &str,
) -> Result<(), ValidationError> {
    if s.is_empty() || s.len() > max || !s.bytes().all(allowed) {
        // The refused text only when it is a plain name within the length (`Black`): never
        // one over its limit (10 KB) nor anything else (`+8613800138000`).
        let shown = if s.len() <= max && super::error::shown_key(s) == s {
            format!("{what} {s:?} must match {pattern}")
        } else {
            format!("{what} must match {pattern}")
        };
        return Err(ValidationError::new(code, shown));
    }
    Ok(())
}

/// Declares a string newtype built only through `TryFrom<String>` / `FromStr`.
macro_rules! ident {
    ($(#[$doc:meta])* $name:ident, $max:expr, $allowed:expr, $code:expr, $what:literal, $pattern:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            pub const MAX_LEN: usize = $max;

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = ValidationError;

            fn try_from(s: String) -> Result<Self, Self::Error> {
                check_ident(&s, $max, $allowed, $code, $what, $pattern)?;
                Ok(Self(s))
            }
        }

        impl std::str::FromStr for $name {
            type Err = ValidationError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::try_from(s.to_owned())
            }
        }

        impl From<$name> for String {
            fn from(v: $name) -> String {
                v.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

fn lower_ident(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'
}

ident!(
    /// A list name: `^[a-z0-9_-]{1,32}$` (`black`, `white`, `fraud_device`).
    ListName, 32, |b| lower_ident(b) || b == b'-', ErrorCode::InvalidList, "list", "^[a-z0-9_-]{1,32}$"
);
ident!(
    /// A sandbox (business-line isolation id): `^[A-Za-z0-9_-]{1,64}$`, default `default`.
    Sandbox, 64, |b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-', ErrorCode::InvalidSandbox, "sandbox", "^[A-Za-z0-9_-]{1,64}$"
);
ident!(
    /// A metric id: `^[a-z0-9_]{1,64}$`.
    MetricId, 64, lower_ident, ErrorCode::InvalidMetricId, "metric id", "^[a-z0-9_]{1,64}$"
);
ident!(
    /// A rule id: `^[a-z0-9_]{1,64}$`.
    RuleId, 64, lower_ident, ErrorCode::InvalidRuleId, "rule id", "^[a-z0-9_]{1,64}$"
);
ident!(
    /// An event type (`transaction`, `login`): `^[A-Za-z0-9_.-]{1,64}$`.
    EventType, 64, |b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-', ErrorCode::InvalidEventType, "event type", "^[A-Za-z0-9_.-]{1,64}$"
);
ident!(
    /// The name of an event field (`device_id`, `amount`): `^[A-Za-z0-9_.-]{1,64}$`.
    FieldName, 64, |b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-', ErrorCode::InvalidField, "field name", "^[A-Za-z0-9_.-]{1,64}$"
);

impl Sandbox {
    pub const DEFAULT: &'static str = "default";

    /// Parses an optional sandbox, `None` meaning the default one.
    pub fn parse_or_default(s: Option<String>) -> Result<Self, ValidationError> {
        match s {
            Some(s) => Self::try_from(s),
            None => Ok(Self::default()),
        }
    }
}

impl Default for Sandbox {
    fn default() -> Self {
        Self(Self::DEFAULT.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_names() {
        for ok in ["black", "fraud_device", "a", "x-1", &"a".repeat(32)] {
            assert!(ok.parse::<ListName>().is_ok(), "{ok} should be a list name");
        }
        for bad in ["", "Black", "a b", "a:b", "a\nb", &"a".repeat(33)] {
            assert!(
                bad.parse::<ListName>().is_err(),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn sandboxes() {
        for ok in ["default", "Loan_2", "x-Y", &"a".repeat(64)] {
            assert!(ok.parse::<Sandbox>().is_ok(), "{ok} should be a sandbox");
        }
        for bad in ["", "a.b", "a/b", "é", &"a".repeat(65)] {
            assert!(
                bad.parse::<Sandbox>().is_err(),
                "{bad:?} should be rejected"
            );
        }
        assert_eq!(Sandbox::parse_or_default(None).unwrap().as_str(), "default");
    }
}
