//! Entry expiry as the API speaks it: never, or an instant in Unix milliseconds rounded up to
//! the next whole second (an entry is never dropped before the time the caller asked for).
//! How an expiry is stored (a 32-bit code, seconds since 2020) is decided in `store::expiry`,
//! which also converts between the two (`Expiry::code`, `Expiry::from_code`); the latest
//! instant accepted here is the latest that code can hold (a test there checks they agree).

use std::time::{SystemTime, UNIX_EPOCH};

use super::code::ErrorCode;
use super::error::ValidationError;

/// The latest expiry accepted: 2156-02-07T06:28:15Z, the last second the stored code holds.
pub const LATEST_EXPIRY_MS: i64 = 5_872_804_095_000;

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// When an entry stops being listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Expiry {
    Never,
    /// Unix milliseconds, a whole second.
    At(i64),
}

impl Expiry {
    /// An absolute expiry in Unix ms, rounded up to the next whole second. It must lie after
    /// `now_ms` and no later than `LATEST_EXPIRY_MS` (2156).
    pub fn at_ms(expires_at_ms: i64, now_ms: i64) -> Result<Self, ValidationError> {
        if expires_at_ms <= now_ms {
            return Err(ValidationError::new(
                ErrorCode::ExpiryInPast,
                "expires_at is not in the future",
            ));
        }
        if expires_at_ms > LATEST_EXPIRY_MS {
            return Err(ValidationError::new(
                ErrorCode::InvalidExpiry,
                "expires_at is too far in the future (after 2156)",
            ));
        }
        // No overflow: at most LATEST_EXPIRY_MS, itself a whole second.
        Ok(Expiry::At(
            expires_at_ms.div_euclid(1000) * 1000
                + 1000 * i64::from(expires_at_ms.rem_euclid(1000) != 0),
        ))
    }

    /// A relative expiry: `ttl_seconds` (at least 1) from `now_ms`.
    pub fn after_ttl(ttl_seconds: u64, now_ms: i64) -> Result<Self, ValidationError> {
        if ttl_seconds == 0 {
            return Err(ValidationError::new(
                ErrorCode::InvalidExpiry,
                "ttl_seconds must be at least 1",
            ));
        }
        let ms = i64::try_from(ttl_seconds)
            .ok()
            .and_then(|s| s.checked_mul(1000))
            .and_then(|d| d.checked_add(now_ms))
            .ok_or_else(|| {
                ValidationError::new(ErrorCode::InvalidExpiry, "ttl_seconds is too large")
            })?;
        Self::at_ms(ms, now_ms).map_err(|e| {
            ValidationError::new(
                ErrorCode::InvalidExpiry,
                e.message.replace("expires_at", "ttl_seconds"),
            )
        })
    }

    /// Unix ms at which the entry stops being listed; `None` for never.
    pub fn expires_at_ms(self) -> Option<i64> {
        match self {
            Expiry::Never => None,
            Expiry::At(ms) => Some(ms),
        }
    }

    /// Whether an entry with this expiry is still listed at `now_ms`.
    pub fn is_live(self, now_ms: i64) -> bool {
        self.expires_at_ms().is_none_or(|at| now_ms < at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_790_000_000_000;

    #[test]
    fn rounds_up_to_whole_seconds() {
        let e = Expiry::at_ms(NOW + 1, NOW).unwrap();
        assert_eq!(e.expires_at_ms(), Some(NOW + 1000));
        let e = Expiry::at_ms(NOW + 1000, NOW).unwrap();
        assert_eq!(e.expires_at_ms(), Some(NOW + 1000));
        assert!(e.is_live(NOW + 999));
        assert!(!e.is_live(NOW + 1000));
    }

    #[test]
    fn rejects_past_and_out_of_range() {
        assert_eq!(Expiry::at_ms(NOW, NOW).unwrap_err().code, "expiry_in_past");
        assert_eq!(
            Expiry::at_ms(i64::MAX, NOW).unwrap_err().code,
            "invalid_expiry"
        );
        assert_eq!(
            Expiry::after_ttl(0, NOW).unwrap_err().code,
            "invalid_expiry"
        );
        assert_eq!(
            Expiry::after_ttl(u64::MAX, NOW).unwrap_err().code,
            "invalid_expiry"
        );
    }
}
