//! Entry expiry. The API speaks Unix milliseconds; storage keeps whole seconds since
//! 2020-01-01T00:00:00Z, rounded up (an entry is never dropped before the time the caller
//! asked for), so the listpack holds a 32-bit integer (6 bytes) until 2088. `0` means never.

use std::time::{SystemTime, UNIX_EPOCH};

use super::{ErrorCode, ValidationError};

/// 2020-01-01T00:00:00Z in Unix milliseconds: the epoch of stored expiries.
pub const EPOCH_2020_MS: i64 = 1_577_836_800_000;

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
    /// Whole seconds since 2020-01-01T00:00:00Z, at least 1.
    At(u32),
}

impl Expiry {
    /// Decodes the stored integer (`0` = never).
    pub fn from_code(code: u32) -> Self {
        if code == 0 {
            Expiry::Never
        } else {
            Expiry::At(code)
        }
    }

    /// The stored integer.
    pub fn code(self) -> u32 {
        match self {
            Expiry::Never => 0,
            Expiry::At(s) => s,
        }
    }

    /// An absolute expiry in Unix ms, rounded up to the next whole second. It must lie after
    /// `now_ms` and before 2156 (the end of a u32 of seconds).
    pub fn at_ms(expires_at_ms: i64, now_ms: i64) -> Result<Self, ValidationError> {
        if expires_at_ms <= now_ms {
            return Err(ValidationError::new(
                ErrorCode::ExpiryInPast,
                "expires_at is not in the future",
            ));
        }
        let since = expires_at_ms - EPOCH_2020_MS;
        let secs = (since + 999).div_euclid(1000).max(1);
        u32::try_from(secs).map(Expiry::At).map_err(|_| {
            ValidationError::new(
                ErrorCode::InvalidExpiry,
                "expires_at is too far in the future (after 2156)",
            )
        })
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
            Expiry::At(s) => Some(EPOCH_2020_MS + i64::from(s) * 1000),
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

    #[test]
    fn code_round_trip() {
        assert_eq!(Expiry::from_code(0), Expiry::Never);
        assert!(Expiry::Never.is_live(i64::MAX));
        let e = Expiry::after_ttl(86_400, NOW).unwrap();
        assert_eq!(Expiry::from_code(e.code()), e);
        // Seconds since 2020 stay below 2^31 until 2088: a 6-byte listpack integer.
        assert!(e.code() < (1 << 31));
    }
}
