//! The stored expiry code: the one place that knows how an expiry is kept in Redis (and in the
//! embedded store). A code is whole seconds since 2020-01-01T00:00:00Z, rounded up, so that an
//! entry is never dropped before the instant the caller asked for; `0` means never. Seconds
//! since 2020 fit a 32-bit integer until 2156 and stay below 2^31 until 2088, so a listpack
//! keeps each value in 6 bytes (Unix milliseconds would take 10; see `layout`).
//!
//! Invariant: every conversion between Unix milliseconds and a code, and the "still live" rule
//! (`is_live`, and its Lua twin in `scripts::LIVE`), is written here and nowhere else. The
//! domain's `Expiry` (what the API accepts) turns into a code only through this module, and
//! the latest instant it accepts (`domain::LATEST_EXPIRY_MS`) is the latest a code can hold
//! (checked by a test below).

use std::time::Duration;

use crate::domain::Expiry;

/// 2020-01-01T00:00:00Z in Unix milliseconds: the epoch of stored expiry codes.
pub const EPOCH_2020_MS: i64 = 1_577_836_800_000;

/// An expiry as stored: whole seconds since 2020 (`0` = never).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExpiryCode(u32);

impl ExpiryCode {
    /// The code of an entry that never expires.
    pub const NEVER: ExpiryCode = ExpiryCode(0);

    /// The code as read from the store.
    pub const fn new(raw: u32) -> Self {
        Self(raw)
    }

    /// The integer to store.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// The code of an expiry at `at_ms` (Unix ms), rounded up to the next whole second; an
    /// instant at or before 2020 becomes the first second after it (already past, never
    /// "never"). `None` after the last second a code can hold (2156).
    pub fn encode(at_ms: i64) -> Option<Self> {
        let since = at_ms.checked_sub(EPOCH_2020_MS)?;
        let secs = since.div_euclid(1000) + i64::from(since.rem_euclid(1000) != 0);
        u32::try_from(secs.max(1)).ok().map(Self)
    }

    /// When the entry stops being listed, in Unix ms; `None` for never.
    pub fn decode(self) -> Option<i64> {
        (self.0 != 0).then(|| EPOCH_2020_MS + i64::from(self.0) * 1000)
    }

    /// Whether an entry with this code is still listed at `now_ms`.
    pub fn is_live(self, now_ms: i64) -> bool {
        self.decode().is_none_or(|at| now_ms < at)
    }

    /// Time left before the entry stops being listed, as of `now_ms`: `None` for never, zero
    /// once it has expired.
    pub fn remaining(self, now_ms: i64) -> Option<Duration> {
        self.decode()
            .map(|at| Duration::from_millis(u64::try_from(at - now_ms).unwrap_or(0)))
    }

    /// `now_ms` as the Lua scripts compare it with a code (`c * 1000 > now`, `scripts::LIVE`):
    /// milliseconds since 2020.
    pub fn script_now(now_ms: i64) -> i64 {
        now_ms - EPOCH_2020_MS
    }
}

impl From<u32> for ExpiryCode {
    fn from(raw: u32) -> Self {
        Self(raw)
    }
}

impl From<Expiry> for ExpiryCode {
    fn from(e: Expiry) -> Self {
        match e {
            Expiry::Never => Self::NEVER,
            // `Expiry::at_ms` accepts nothing after `LATEST_EXPIRY_MS`, the last second a code
            // holds (tested below), so this cannot saturate for a parsed expiry.
            Expiry::At(ms) => Self::encode(ms).unwrap_or(Self(u32::MAX)),
        }
    }
}

// The domain's expiry meets its stored code here (not in `domain`, which knows nothing of
// storage): `lists` stores `expiry.code()` and reads `Expiry::from_code(code)`.
impl Expiry {
    /// Decodes a stored code (`0` = never).
    pub fn from_code(code: u32) -> Self {
        match ExpiryCode::new(code).decode() {
            None => Expiry::Never,
            Some(ms) => Expiry::At(ms),
        }
    }

    /// The stored code.
    pub fn code(self) -> u32 {
        ExpiryCode::from(self).get()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::domain::LATEST_EXPIRY_MS;

    const NOW: i64 = 1_790_000_000_000;

    #[test]
    fn encodes_rounding_up_to_whole_seconds() {
        assert_eq!(ExpiryCode::encode(EPOCH_2020_MS + 1), Some(ExpiryCode(1)));
        assert_eq!(
            ExpiryCode::encode(EPOCH_2020_MS + 1000),
            Some(ExpiryCode(1))
        );
        assert_eq!(
            ExpiryCode::encode(EPOCH_2020_MS + 1001),
            Some(ExpiryCode(2))
        );
        assert_eq!(
            ExpiryCode::encode(EPOCH_2020_MS - 5_000),
            Some(ExpiryCode(1)),
            "before 2020: already past, never 'never'"
        );
        assert_eq!(ExpiryCode::encode(i64::MIN), None);
        assert_eq!(ExpiryCode::encode(i64::MAX), None);
    }

    #[test]
    fn the_domain_limit_is_the_last_second_a_code_holds() {
        assert_eq!(
            ExpiryCode::encode(LATEST_EXPIRY_MS),
            Some(ExpiryCode(u32::MAX))
        );
        assert_eq!(ExpiryCode::encode(LATEST_EXPIRY_MS + 1), None);
        assert_eq!(ExpiryCode(u32::MAX).decode(), Some(LATEST_EXPIRY_MS));
    }

    #[test]
    fn never_is_zero_and_always_live() {
        assert_eq!(ExpiryCode::from(Expiry::Never), ExpiryCode::NEVER);
        assert_eq!(ExpiryCode::NEVER.decode(), None);
        assert!(ExpiryCode::NEVER.is_live(i64::MAX));
        assert_eq!(ExpiryCode::NEVER.remaining(NOW), None);
        assert_eq!(Expiry::from_code(0), Expiry::Never);
    }

    #[test]
    fn live_until_the_second_it_names() {
        let c = ExpiryCode::encode(NOW + 1).unwrap();
        assert_eq!(c.decode(), Some(NOW + 1000));
        assert!(c.is_live(NOW + 999));
        assert!(!c.is_live(NOW + 1000));
        assert_eq!(c.remaining(NOW), Some(Duration::from_secs(1)));
        assert_eq!(c.remaining(NOW + 5000), Some(Duration::ZERO));
        // The Lua rule `c * 1000 > now` says the same as `is_live`.
        let lua_live = |now: i64| i64::from(c.get()) * 1000 > ExpiryCode::script_now(now);
        assert!(lua_live(NOW + 999) && !lua_live(NOW + 1000));
    }

    #[test]
    fn codes_stay_six_byte_integers_until_2088() {
        let e = Expiry::after_ttl(86_400, NOW).unwrap();
        assert_eq!(Expiry::from_code(e.code()), e);
        assert!(e.code() < (1 << 31));
    }

    proptest! {
        #[test]
        fn every_code_round_trips(raw in 1u32..) {
            let c = ExpiryCode::new(raw);
            let ms = c.decode().unwrap();
            prop_assert_eq!(ExpiryCode::encode(ms), Some(c));
            prop_assert_eq!(Expiry::from_code(raw).code(), raw);
        }

        #[test]
        fn encoding_rounds_up_by_less_than_a_second(ms in EPOCH_2020_MS + 1..=LATEST_EXPIRY_MS) {
            let c = ExpiryCode::encode(ms).unwrap();
            let at = c.decode().unwrap();
            prop_assert!(at >= ms && at < ms + 1000, "{ms} -> {at}");
            prop_assert!(c.is_live(ms - 1) && !c.is_live(at));
            let e = Expiry::at_ms(ms, ms - 1).unwrap();
            prop_assert_eq!(e.expires_at_ms(), Some(at), "the domain rounds the same way");
            prop_assert_eq!(ExpiryCode::from(e), c);
        }
    }
}
