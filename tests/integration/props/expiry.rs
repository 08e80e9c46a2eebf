//! Section 4 of the properties, the expiry encoding: rounded up to a whole second, never at or
//! before now, `after_ttl`, and the epoch constants.

use namelist::domain::Expiry;
use namelist::store::expiry::EPOCH_2020_MS;
use proptest::prelude::*;

use super::{Y2021_MS, Y2088_MS, Y2100_MS, Y2150_MS, config};

/// (now, expires_at): now in [2021, 2100), expires_at in (now, 2150], often within a few
/// seconds of now so that the rounding to whole seconds is exercised.
fn now_and_expiry() -> impl Strategy<Value = (i64, i64)> {
    (
        Y2021_MS..Y2100_MS,
        prop_oneof![
            1i64..=3_000,
            1i64..=86_400_000,
            1i64..=(Y2150_MS - Y2021_MS)
        ],
    )
        .prop_map(|(now, delta)| (now, (now + delta).min(Y2150_MS)))
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn expiry_rounds_up_to_a_whole_second(
        (now, at) in now_and_expiry(),
        probe in any::<prop::sample::Index>(),
    ) {
        let e = Expiry::at_ms(at, now);
        prop_assert!(e.is_ok(), "at_ms({}, {}) should be Ok, got {:?}", at, now, e);
        let e = e.unwrap_or(Expiry::Never);
        prop_assert!(e.code() >= 1, "code of {:?} is at least 1", e);
        prop_assert_eq!(Expiry::from_code(e.code()), e, "from_code(code) round-trips");

        let stored = e.expires_at_ms();
        prop_assert!(stored.is_some(), "{:?} expires", e);
        let stored = stored.unwrap_or_default();
        prop_assert!(
            at <= stored && stored < at + 1000,
            "expires_at {} stored as {}: should round up to within a second", at, stored
        );
        prop_assert_eq!((stored - EPOCH_2020_MS) % 1000, 0, "stored expiry {} is a whole second", stored);
        prop_assert_eq!(
            i64::from(e.code()),
            (stored - EPOCH_2020_MS) / 1000,
            "code is seconds since 2020"
        );

        // Live strictly before the stored expiry, dead at and after it.
        let t = now + probe.index(usize::try_from(stored - now + 2_000).unwrap_or(usize::MAX)) as i64;
        prop_assert_eq!(e.is_live(t), t < stored, "is_live({}) with expiry at {}", t, stored);
        prop_assert!(e.is_live(stored - 1), "live 1 ms before {}", stored);
        prop_assert!(!e.is_live(stored), "not live at {}", stored);
        prop_assert!(e.is_live(now), "live at now {} (expiry {})", now, stored);

        if at < Y2088_MS {
            prop_assert!(e.code() < 1 << 31, "an expiry before 2088 ({}) fits in 31 bits: {}", at, e.code());
        }
    }

    #[test]
    fn expiry_at_or_before_now_is_rejected(now in Y2021_MS..Y2100_MS, back in 0i64..=10_000_000_000) {
        let r = Expiry::at_ms(now - back, now);
        prop_assert_eq!(
            r.as_ref().map_err(|e| e.code.as_str()),
            Err("expiry_in_past"),
            "at_ms({}, {}) is in the past: {:?}", now - back, now, r
        );
    }

    #[test]
    fn after_ttl_is_at_ms_of_now_plus_ttl(
        now in Y2021_MS..Y2100_MS,
        ttl in prop_oneof![1u64..=10, 1u64..=86_400 * 365, 1u64..=((Y2150_MS - Y2021_MS) / 1000) as u64],
    ) {
        let ttl_ms = i64::try_from(ttl).unwrap_or(i64::MAX) * 1000;
        let at = now + ttl_ms;
        prop_assume!(at <= Y2150_MS);
        let relative = Expiry::after_ttl(ttl, now);
        let absolute = Expiry::at_ms(at, now);
        prop_assert!(relative.is_ok(), "after_ttl({}, {}) should be Ok: {:?}", ttl, now, relative);
        prop_assert_eq!(relative, absolute, "after_ttl({}, {}) == at_ms({}, {})", ttl, now, at, now);
    }
}

#[test]
fn expiry_epoch_constants() {
    // The constants above are what they say they are (seconds since 2020 stay below 2^31
    // until 2088-01-19).
    assert_eq!(EPOCH_2020_MS, 1_577_836_800_000);
    assert_eq!((Y2088_MS - EPOCH_2020_MS) / 1000 / 86_400, 68 * 365 + 17);
    const {
        assert!((Y2088_MS - EPOCH_2020_MS) / 1000 < 1 << 31);
        assert!((Y2150_MS - EPOCH_2020_MS) / 1000 < u32::MAX as i64);
    }
}
