//! Metric definitions and the window arithmetic of API.md, in one place:
//!
//! * an event at `ts` falls in sub-window `floor(ts / r)`;
//! * the value at `t` aggregates sub-windows `[floor(t/r) - W/r + 1, floor(t/r)]`;
//! * an event whose sub-window is older than that range at the present is *late*;
//! * a sub-window's data is useless once `t ≥ (i + W/r) · r`, so that is when its storage
//!   expires.
//!
//! Default resolution (when a definition gives none): the smallest step of the ladder
//! 1s 2s 5s 10s 15s 20s 30s 1m 2m 5m 10m 15m 20m 30m 1h 2h 3h 4h 6h 8h 12h 1d that divides the
//! window into at most 30 sub-windows (10m → 20s, 1h → 2m, 1d → 1h, 7d → 6h, 30d → 1d); if none
//! does (windows over 30 days, or not a multiple of a step), the smallest whole number of
//! seconds that does. An explicit resolution must divide the window into at most 240
//! sub-windows, so every hash (AVG keeps two fields per sub-window) stays a listpack.
//!
//! Amounts (SUM, AVG, MIN, MAX) are decimal numbers with at most 4 decimal places, kept as
//! integers scaled by 10,000: exact, never floats.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::expr::{self, Aggregation};
use crate::domain::{ErrorCode, EventType, FieldName, MetricId, RuleId, ValidationError};

/// Most sub-windows a window may be split into.
pub const MAX_SUB_WINDOWS: i64 = 240;
/// Sub-windows the default resolution aims at, at most.
pub const DEFAULT_SUB_WINDOWS: i64 = 30;
/// Longest window.
pub const MAX_WINDOW_MS: i64 = 400 * 86_400_000;
/// Amounts are scaled by this (4 decimal places).
pub const AMOUNT_SCALE: i64 = 10_000;
/// The largest amount, scaled: 9×10^11 units, below 2^53 as the server's Lua needs.
pub const MAX_AMOUNT_SCALED: i128 = 900_000_000_000 * AMOUNT_SCALE as i128;

const LADDER_S: [i64; 22] = [
    1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600, 7200, 10_800, 14_400,
    21_600, 28_800, 43_200, 86_400,
];

/// The resolution used when a definition gives none (see the module docs).
pub fn default_resolution(window_ms: i64) -> i64 {
    if let Some(step) = LADDER_S
        .iter()
        .map(|s| s * 1000)
        .find(|r| window_ms % r == 0 && window_ms / r <= DEFAULT_SUB_WINDOWS)
    {
        return step;
    }
    let secs = window_ms / 1000;
    let min = (secs + DEFAULT_SUB_WINDOWS - 1) / DEFAULT_SUB_WINDOWS;
    let min = min.max(1);
    (min..=secs)
        .find(|d| secs % d == 0)
        .map_or(window_ms, |d| d * 1000)
}

/// What a definition says, without its identity and version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MetricSpec {
    pub expr: String,
    pub aggregation: Aggregation,
    #[schema(value_type = String)]
    pub event: EventType,
    #[schema(value_type = Option<String>)]
    pub field: Option<FieldName>,
    #[schema(value_type = Vec<String>)]
    pub group_by: Vec<FieldName>,
    pub window_ms: i64,
    pub resolution_ms: i64,
}

impl MetricSpec {
    /// Parses a definition body.
    pub fn parse(expr: &str, resolution: Option<&str>) -> Result<Self, ValidationError> {
        let p = expr::parse(expr)?;
        if p.window_ms > MAX_WINDOW_MS {
            return Err(ValidationError::new(
                ErrorCode::InvalidExpr,
                "the window is longer than 400 days",
            ));
        }
        let resolution_ms = match resolution {
            None => default_resolution(p.window_ms),
            Some(r) => {
                let r = expr::parse_duration(r)
                    .map_err(|m| ValidationError::new(ErrorCode::InvalidResolution, m))?;
                if p.window_ms % r != 0 {
                    return Err(ValidationError::new(
                        ErrorCode::InvalidResolution,
                        "the window must be a whole multiple of the resolution",
                    ));
                }
                if p.window_ms / r > MAX_SUB_WINDOWS {
                    return Err(ValidationError::new(
                        ErrorCode::InvalidResolution,
                        format!(
                            "the resolution splits the window into {} sub-windows; at most {MAX_SUB_WINDOWS}",
                            p.window_ms / r
                        ),
                    ));
                }
                r
            }
        };
        Ok(Self {
            expr: expr.trim().to_owned(),
            aggregation: p.aggregation,
            event: p.event,
            field: p.field,
            group_by: p.group_by,
            window_ms: p.window_ms,
            resolution_ms,
        })
    }

    /// What makes two definitions the same metric (the expression's spelling does not).
    pub fn fingerprint(&self) -> String {
        let by: Vec<&str> = self.group_by.iter().map(FieldName::as_str).collect();
        format!(
            "{:?}|{}|{}|{}|{}|{}",
            self.aggregation,
            self.event,
            self.field.as_ref().map_or("", FieldName::as_str),
            by.join(","),
            self.window_ms,
            self.resolution_ms
        )
    }
}

/// A stored metric: its id, version and spec. Serialises as API.md's response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MetricDef {
    #[schema(value_type = String)]
    pub id: MetricId,
    pub version: u64,
    #[serde(flatten)]
    pub spec: MetricSpec,
}

impl MetricDef {
    fn r(&self) -> i64 {
        self.spec.resolution_ms
    }

    /// Sub-windows in the window (`W / r`).
    pub fn slots(&self) -> i64 {
        self.spec.window_ms / self.r()
    }

    /// The sub-window of a timestamp.
    pub fn sub(&self, ts_ms: i64) -> i64 {
        ts_ms.div_euclid(self.r())
    }

    /// The first sub-window the value at `t` reads.
    pub fn lo(&self, t_ms: i64) -> i64 {
        self.sub(t_ms) - self.slots() + 1
    }

    /// Whether an event at `ts` is too old for this metric to ever read again at `now`.
    pub fn is_late(&self, ts_ms: i64, now_ms: i64) -> bool {
        self.sub(ts_ms) < self.lo(now_ms)
    }

    /// When the data of sub-window `sub` stops being readable (and may expire).
    pub fn expire_at(&self, sub: i64) -> i64 {
        (sub + self.slots()) * self.r()
    }
}

/// A stored rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RuleDef {
    #[schema(value_type = String)]
    pub id: RuleId,
    pub version: u64,
    pub expr: String,
    /// The metrics it reads.
    #[schema(value_type = Vec<String>)]
    pub metrics: Vec<MetricId>,
}

/// An exact decimal amount, scaled by 10,000.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Amount(pub i64);

impl Amount {
    /// Parses a JSON number's text (or a numeric string): at most 4 decimal places, an optional
    /// exponent, within ±9.2×10^14.
    pub fn parse(text: &str) -> Result<Self, String> {
        const WHY: &str = "is not a number with at most 4 decimal places";
        let t = text.trim();
        let (neg, t) = match t.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, t.strip_prefix('+').unwrap_or(t)),
        };
        let (mantissa, exp) = match t.find(['e', 'E']) {
            Some(i) => {
                let e: i64 = t[i + 1..].parse().map_err(|_| WHY.to_owned())?;
                // Anything past ±40 is either zero-padded nonsense or out of range.
                if e.unsigned_abs() > 40 {
                    return Err("is out of range".into());
                }
                (&t[..i], e)
            }
            None => (t, 0),
        };
        let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        if (int.is_empty() && frac.is_empty())
            || !int.bytes().all(|b| b.is_ascii_digit())
            || !frac.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(WHY.to_owned());
        }
        // digits × 10^(exp − frac_len + 4) must be an integer.
        let digits: String = format!("{int}{frac}");
        let digits = digits.trim_start_matches('0');
        if frac.len() > 40 || int.len() > 40 {
            return Err("is out of range".into());
        }
        let shift = exp - frac.len() as i64 + 4;
        let value: i128 = if digits.is_empty() {
            0
        } else if shift >= 0 {
            if digits.len() as i64 + shift > 20 {
                return Err("is too large".into());
            }
            let d: i128 = digits.parse().map_err(|_| WHY.to_owned())?;
            d * 10i128.pow(shift as u32)
        } else {
            let cut = (-shift) as usize;
            let (keep, dropped) = digits.split_at(digits.len().saturating_sub(cut));
            if dropped.bytes().any(|b| b != b'0')
                || digits.len() < cut && digits.bytes().any(|b| b != b'0')
            {
                return Err(WHY.to_owned());
            }
            if keep.len() > 20 {
                return Err("is too large".into());
            }
            if keep.is_empty() {
                0
            } else {
                keep.parse().map_err(|_| WHY.to_owned())?
            }
        };
        let value = if neg { -value } else { value };
        // Redis's Lua compares numbers as doubles (MIN, MAX): stay within 2^53 to stay exact.
        if value.abs() > MAX_AMOUNT_SCALED {
            return Err("is too large (at most 900,000,000,000)".into());
        }
        Ok(Amount(value as i64))
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.0 < 0 { "-" } else { "" };
        let a = self.0.unsigned_abs();
        let (int, frac) = (a / AMOUNT_SCALE as u64, a % AMOUNT_SCALE as u64);
        if frac == 0 {
            write!(f, "{sign}{int}")
        } else {
            let frac = format!("{frac:04}");
            write!(f, "{sign}{int}.{}", frac.trim_end_matches('0'))
        }
    }
}

/// A scaled amount as a JSON number: an integer when whole, else a float (exact to 4 places).
pub fn amount_json(scaled: i64) -> serde_json::Value {
    if scaled % AMOUNT_SCALE == 0 {
        serde_json::Value::from(scaled / AMOUNT_SCALE)
    } else {
        serde_json::Value::from(scaled as f64 / AMOUNT_SCALE as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_resolutions() {
        let s = 1000;
        for (w, r) in [
            (600 * s, 20 * s),
            (3600 * s, 120 * s),
            (86_400 * s, 3600 * s),
            (7 * 86_400 * s, 6 * 3600 * s),
            (30 * 86_400 * s, 86_400 * s),
            (7 * s, s),
            (90 * 86_400 * s, 3 * 86_400 * s),
            (31 * 86_400 * s, 89_280 * s),
            (97 * s, 97 * s),
        ] {
            let got = default_resolution(w);
            assert_eq!(got, r, "window {w}");
            assert_eq!(w % got, 0);
            assert!(w / got <= DEFAULT_SUB_WINDOWS || got == w);
        }
    }

    #[test]
    fn spec_parsing_and_limits() {
        let s = MetricSpec::parse("COUNT(7d, transaction, device_id)", Some("1d")).unwrap();
        assert_eq!((s.window_ms, s.resolution_ms), (604_800_000, 86_400_000));
        assert_eq!(
            MetricSpec::parse("COUNT(7d, tx, d)", Some("5d"))
                .unwrap_err()
                .code,
            "invalid_resolution"
        );
        assert_eq!(
            MetricSpec::parse("COUNT(1d, tx, d)", Some("1m"))
                .unwrap_err()
                .code,
            "invalid_resolution",
            "1440 sub-windows"
        );
        assert_eq!(
            MetricSpec::parse("COUNT(401d, tx, d)", None)
                .unwrap_err()
                .code,
            "invalid_expr"
        );
        let a = MetricSpec::parse("count(7d, transaction) by device_id", None).unwrap();
        let b = MetricSpec::parse("COUNT(7d, transaction, device_id)", None).unwrap();
        assert_eq!(a.fingerprint(), b.fingerprint(), "spelling does not matter");
        let c = MetricSpec::parse("COUNT(7d, transaction, device_id)", Some("1d")).unwrap();
        assert_ne!(b.fingerprint(), c.fingerprint(), "resolution does");
    }

    #[test]
    fn window_arithmetic() {
        let d = MetricDef {
            id: "m".parse().unwrap(),
            version: 1,
            spec: MetricSpec::parse("COUNT(7d, tx, d)", Some("1d")).unwrap(),
        };
        let day = 86_400_000;
        let t = 1_532_496_076_032; // seed 000's example
        assert_eq!(d.sub(t), 17_737);
        assert_eq!(d.lo(t), 17_731);
        assert!(!d.is_late(17_731 * day, t));
        assert!(d.is_late(17_731 * day - 1, t));
        assert_eq!(d.expire_at(17_737), 17_744 * day);
        assert!(
            d.lo(d.expire_at(17_737)) > 17_737,
            "expired data is never read"
        );
        assert!(d.lo(d.expire_at(17_737) - 1) <= 17_737, "nor expires early");
    }

    #[test]
    fn amounts_are_exact() {
        for (text, scaled) in [
            ("166.6", 1_666_000),
            ("0.0001", 1),
            ("-12.5", -125_000),
            ("1e3", 10_000_000),
            ("1.5E-3", 15),
            ("100", 1_000_000),
            ("0", 0),
            ("0.10000", 1_000),
            (" 7 ", 70_000),
        ] {
            assert_eq!(Amount::parse(text), Ok(Amount(scaled)), "{text}");
        }
        let long_zero = format!("0.{}", "0".repeat(100));
        for bad in [
            "",
            "abc",
            "1.00001",
            "1e-5",
            "--1",
            "1.2.3",
            "1e400",
            "99999999999999999999",
            "900000000000.0001",
            "1e2147483647",
            "1.0000e-2147483648",
            "1e-9223372036854775808",
            "0e99999999999",
            long_zero.as_str(),
        ] {
            assert!(Amount::parse(bad).is_err(), "{bad:?} should be refused");
        }
        assert_eq!(
            Amount::parse("-900000000000"),
            Ok(Amount(-9_000_000_000_000_000))
        );
        assert_eq!(Amount(1_666_000).to_string(), "166.6");
        assert_eq!(Amount(-15).to_string(), "-0.0015");
        assert_eq!(amount_json(1_666_000), serde_json::json!(166.6));
        assert_eq!(amount_json(2_000_000), serde_json::json!(200));
    }
}
