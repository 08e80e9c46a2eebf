//! Identifiers with a fixed alphabet: list names and sandboxes. Their alphabets exclude `\n`,
//! which the storage layout relies on to join them unambiguously.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::ValidationError;

fn check_ident(
    s: &str,
    max: usize,
    allowed: impl Fn(u8) -> bool,
    what: &str,
) -> Result<(), ValidationError> {
    if s.is_empty() || s.len() > max || !s.bytes().all(allowed) {
        return Err(ValidationError::new(
            if what == "list" {
                "invalid_list"
            } else {
                "invalid_sandbox"
            },
            format!("{what} {s:?} must match {}", pattern(what, max)),
        ));
    }
    Ok(())
}

fn pattern(what: &str, max: usize) -> String {
    if what == "list" {
        format!("^[a-z0-9_-]{{1,{max}}}$")
    } else {
        format!("^[A-Za-z0-9_-]{{1,{max}}}$")
    }
}

/// A list name: `^[a-z0-9_-]{1,32}$` (`black`, `white`, `fraud_device`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ListName(String);

impl ListName {
    pub const MAX_LEN: usize = 32;

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ListName {
    type Error = ValidationError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        check_ident(
            &s,
            Self::MAX_LEN,
            |b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-',
            "list",
        )?;
        Ok(Self(s))
    }
}

impl std::str::FromStr for ListName {
    type Err = ValidationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::try_from(s.to_owned())
    }
}

impl From<ListName> for String {
    fn from(v: ListName) -> String {
        v.0
    }
}

impl fmt::Display for ListName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A sandbox (business-line isolation id): `^[A-Za-z0-9_-]{1,64}$`, default `default`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Sandbox(String);

impl Sandbox {
    pub const MAX_LEN: usize = 64;
    pub const DEFAULT: &'static str = "default";

    pub fn as_str(&self) -> &str {
        &self.0
    }

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

impl TryFrom<String> for Sandbox {
    type Error = ValidationError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        check_ident(
            &s,
            Self::MAX_LEN,
            |b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-',
            "sandbox",
        )?;
        Ok(Self(s))
    }
}

impl std::str::FromStr for Sandbox {
    type Err = ValidationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::try_from(s.to_owned())
    }
}

impl From<Sandbox> for String {
    fn from(v: Sandbox) -> String {
        v.0
    }
}

impl fmt::Display for Sandbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
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
