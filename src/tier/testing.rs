//! What the parts' tests share: tiers set up without a worker, and reads installed by hand.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::coherence::Read;
use super::{LocalTier, Lookup, Mode, TierSettings};
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

/// The store of the interleaving proptests: bucket 1's fields as they stand, and every write
/// in the order it landed.
pub(super) struct Model {
    pub store: BTreeMap<i64, u32>,
    pub writes: Vec<(i64, Option<u32>)>,
}

impl Model {
    /// The store holding `initial` (field → how far before `LATER` it expires).
    pub fn new(initial: &BTreeMap<i64, u32>) -> Self {
        Self {
            store: initial.iter().map(|(f, c)| (*f, LATER - c)).collect(),
            writes: Vec::new(),
        }
    }

    /// A write lands: `Some` upserts, `None` deletes.
    pub fn write(&mut self, f: i64, c: Option<u32>) {
        match c {
            Some(c) => self.store.insert(f, c),
            None => self.store.remove(&f),
        };
        self.writes.push((f, c));
    }

    /// The bucket as a read of it now returns it.
    pub fn pairs(&self) -> Vec<(i64, u32)> {
        self.store.iter().map(|(f, c)| (*f, *c)).collect()
    }

    /// What a check of field `f` answers: the tier's copy, or the store when sent there.
    pub fn answer(&self, t: &LocalTier, f: i64) -> Option<u32> {
        match t.lookup(&key(f), Instant::now()) {
            Lookup::Local(c) => c,
            Lookup::Remote => self.store.get(&f).copied(),
        }
    }
}

/// A read of bucket 1 racing the steps of an interleaving: it begins, reads the store and is
/// installed at three points within them, in that order.
pub(super) struct RacingRead {
    points: [usize; 3],
    filter_only: bool,
    read: Option<Read>,
    snapshot: Option<Vec<(i64, u32)>>,
    installed: bool,
}

impl RacingRead {
    /// The three points, each at most `n` (the number of steps); `filter_only` reads the
    /// bucket for its filter only, as the partial sweep does.
    pub fn new(marks: (usize, usize, usize), n: usize, filter_only: bool) -> Self {
        let mut points = [marks.0.min(n), marks.1.min(n), marks.2.min(n)];
        points.sort_unstable();
        Self {
            points,
            filter_only,
            read: None,
            snapshot: None,
            installed: false,
        }
    }

    /// Before step `i`: begins, reads or installs the read where it is due. True once it
    /// is installed.
    pub fn before_step(&mut self, i: usize, t: &LocalTier, model: &Model) -> bool {
        if i == self.points[0] {
            let only = if self.filter_only {
                HashSet::from([1])
            } else {
                HashSet::new()
            };
            self.read = Some(t.begin_read(&[1], only));
        }
        if i == self.points[1] {
            self.snapshot = Some(model.pairs());
        }
        if i == self.points[2] {
            let read = self.read.take().expect("begun before");
            let pairs = self.snapshot.take().expect("read before");
            t.finish_read(read, Ok(vec![pairs])).unwrap();
            self.installed = true;
        }
        self.installed
    }
}

/// Another instance's write to one of `fields` of bucket 1: an upsert of a code before
/// `LATER`, or a delete.
pub(super) fn other_write(
    fields: std::ops::Range<i64>,
) -> impl proptest::strategy::Strategy<Value = (i64, Option<u32>)> {
    use proptest::prelude::*;
    (fields, proptest::option::of(1u32..4)).prop_map(|(f, c)| (f, c.map(|c| LATER - c)))
}
