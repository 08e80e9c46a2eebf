//! What the parts' tests share: tiers set up without a worker, and reads installed by hand.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{LocalTier, Mode, TierSettings};
use crate::store::EntryKey;

/// Codes far in the future (2088 is u32::MAX seconds after 2020).
pub(super) const LATER: u32 = 4_000_000_000;

pub(super) fn settings(budget: u64, window: Duration) -> TierSettings {
    TierSettings {
        budget_bytes: budget,
        max_buckets: 1_000_000,
        ttl: Duration::from_secs(60),
        fetch_rate: 0,
        refresh_rate: 0,
        conflict_window: window,
    }
}

/// A trusted tier in complete mode over 8 buckets, no worker running.
pub(super) fn tier(window: Duration) -> Arc<LocalTier> {
    complete_tier(8, 64 << 20, window)
}

/// A trusted tier in complete mode over `buckets` within `budget` bytes, no worker running.
pub(super) fn complete_tier(buckets: u32, budget: u64, window: Duration) -> Arc<LocalTier> {
    let t = LocalTier::new(buckets, settings(budget, window), true);
    t.resynced();
    turn_complete(&t);
    t
}

/// Turns `t` complete by hand, no worker deciding it: the mode, then the index.
pub(super) fn turn_complete(t: &LocalTier) {
    t.mode.store(Mode::Complete as u8, Ordering::Relaxed);
    t.index_for(Mode::Complete);
}

/// A trusted tier in partial mode over 8 buckets with filters (10 bits an entry for
/// buckets of ~4 entries), no worker running.
pub(super) fn filtered_tier(window: Duration) -> Arc<LocalTier> {
    let t = LocalTier::new(8, settings(64 << 20, window), true);
    t.resynced();
    t.mode.store(Mode::Partial as u8, Ordering::Relaxed);
    t.filters_for(Mode::Partial, 4.0);
    assert!(t.filter_bytes() > 0);
    t
}

/// Reads bucket 1 for its filter only, as the partial sweep does.
pub(super) fn read_filter(t: &LocalTier, pairs: Vec<(i64, u32)>) {
    let read = t.begin_read(&[1], HashSet::from([1]));
    t.finish_read(read, Ok(vec![pairs])).unwrap();
}

pub(super) fn key(field: i64) -> EntryKey {
    EntryKey { bucket: 1, field }
}

pub(super) fn install(t: &LocalTier, pairs: Vec<(i64, u32)>) {
    let read = t.begin_read(&[1], HashSet::new());
    t.finish_read(read, Ok(vec![pairs])).unwrap();
}

/// The codes field `f` may show: from the write at `floor` on (the newest the instance must
/// reflect), else its initial code or any write's.
pub(super) fn allowed_values(
    initial: &BTreeMap<i64, u32>,
    writes: &[(i64, Option<u32>)],
    f: i64,
    floor: Option<usize>,
) -> Vec<Option<u32>> {
    let of_f = |w: &[(i64, Option<u32>)]| {
        w.iter()
            .filter(|(g, _)| *g == f)
            .map(|(_, c)| *c)
            .collect::<Vec<_>>()
    };
    match floor {
        Some(j) => of_f(&writes[j..]),
        None => std::iter::once(initial.get(&f).map(|c| LATER - c))
            .chain(of_f(writes))
            .collect(),
    }
}

/// Reads buckets `0..n`, 200 entries each (field `b * 1,000 + i`), through the tier.
pub(super) fn read_full_buckets(t: &LocalTier, n: u32) {
    for b in 0..n {
        let read = t.begin_read(&[b], HashSet::new());
        let pairs = (0..200)
            .map(|i| (i64::from(b) * 1_000 + i, LATER))
            .collect();
        t.finish_read(read, Ok(vec![pairs])).unwrap();
    }
}
