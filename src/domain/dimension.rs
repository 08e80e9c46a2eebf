//! Dimensions: the kind of identity a value is (phone, IMEI, IP...). The built-in ones have
//! their own normalisation rules (see `value`); any other `^[a-z][a-z0-9_]{0,31}$` name is a
//! custom dimension whose values are opaque strings.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::code::ErrorCode;
use super::error::ValidationError;

/// The kind of identity a value is. Parsed only through `FromStr`/`TryFrom<String>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Dimension {
    Uid,
    Phone,
    IdCard,
    Device,
    Imei,
    WifiMac,
    Ip,
    Email,
    /// A custom dimension name, `^[a-z][a-z0-9_]{0,31}$`, not one of the built-in names.
    Custom(String),
}

impl Dimension {
    pub const BUILT_IN: [Dimension; 8] = [
        Dimension::Uid,
        Dimension::Phone,
        Dimension::IdCard,
        Dimension::Device,
        Dimension::Imei,
        Dimension::WifiMac,
        Dimension::Ip,
        Dimension::Email,
    ];
    pub const CUSTOM_MAX_LEN: usize = 32;

    pub fn as_str(&self) -> &str {
        match self {
            Dimension::Uid => "uid",
            Dimension::Phone => "phone",
            Dimension::IdCard => "id_card",
            Dimension::Device => "device",
            Dimension::Imei => "imei",
            Dimension::WifiMac => "wifi_mac",
            Dimension::Ip => "ip",
            Dimension::Email => "email",
            Dimension::Custom(name) => name,
        }
    }

    /// Whether values of this dimension identify a person closely enough that they must never
    /// be logged raw (see `mask_value`).
    pub fn is_personal(&self) -> bool {
        !matches!(self, Dimension::Custom(_))
    }
}

impl TryFrom<String> for Dimension {
    type Error = ValidationError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        if let Some(d) = Self::BUILT_IN.iter().find(|d| d.as_str() == s) {
            return Ok(d.clone());
        }
        let b = s.as_bytes();
        let valid = !b.is_empty()
            && b.len() <= Self::CUSTOM_MAX_LEN
            && b[0].is_ascii_lowercase()
            && b[1..]
                .iter()
                .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_');
        if !valid {
            // The refused name only when it is a plain name of a dimension's length.
            let shown = if b.len() <= Self::CUSTOM_MAX_LEN && super::error::shown_key(&s) == s {
                format!(" {s:?}")
            } else {
                String::new()
            };
            return Err(ValidationError::new(
                ErrorCode::UnknownDimension,
                format!(
                    "unknown dimension{shown}: expected uid, phone, id_card, device, imei, wifi_mac, ip, email or a custom name matching ^[a-z][a-z0-9_]{{0,31}}$"
                ),
            ));
        }
        Ok(Dimension::Custom(s))
    }
}

impl std::str::FromStr for Dimension {
    type Err = ValidationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::try_from(s.to_owned())
    }
}

impl From<Dimension> for String {
    fn from(d: Dimension) -> String {
        match d {
            Dimension::Custom(name) => name,
            other => other.as_str().to_owned(),
        }
    }
}

impl fmt::Display for Dimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_names_round_trip() {
        for d in Dimension::BUILT_IN {
            assert_eq!(d.as_str().parse::<Dimension>().unwrap(), d);
        }
    }

    #[test]
    fn custom_and_unknown() {
        assert_eq!(
            "merchant_id".parse::<Dimension>().unwrap(),
            Dimension::Custom("merchant_id".into())
        );
        for bad in [
            "",
            "Phone",
            "1abc",
            "a-b",
            "a b",
            &format!("a{}", "b".repeat(32)),
        ] {
            let err = bad.parse::<Dimension>().unwrap_err();
            assert_eq!(err.code, "unknown_dimension", "{bad:?}");
        }
    }
}
