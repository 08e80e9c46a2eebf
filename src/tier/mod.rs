//! The local tier in front of the store: whole buckets held in memory, so that a lookup whose
//! bucket is held never leaves the process, whether the entry is listed or not.
//!
//! One module per part, each stating at its top the rules it keeps:
//!
//! * `holding`: the unit (a bucket read whole, kept as a sorted `copy`), where copies are kept
//!   (a moka cache, or a complete tier's `Index`) and the memory budget they stay within.
//! * `modes`: sizing the keyspace up and choosing complete or partial mode; partial mode's
//!   filters of every bucket (`filter`) and hot buckets (`sketch`).
//! * `coherence`: exact in place: changes applied to copies, reads in flight and filters;
//!   changes of unknown value (dirty copies, read again).
//! * `recent`: changes heard lately (conflicts) and this instance's own writes.
//! * `trust`: trust and generations (the subscription, its proofs of delivery), and the
//!   staleness of a fail-open answer.
//! * `sweep`: what falls due, and the passes over every bucket that find it.
//! * `worker`: the background worker (sizing, loading, refreshing, paced) and its queue.
//! * `registry`: `RegistryCache`, the prefix-length registries.
//!
//! `LocalTier` (here) is the facade: the type, its construction and the check path (`lookup`,
//! `held`). Its other public methods live with their part: writes heard (`apply`,
//! `changed_unknown`, `forget_expired`, `verify`: `coherence`), this instance's writes
//! (`write_mark`, `wrote_acked`, `remember_own`: `recent`; `wrote`: `coherence`), the
//! subscription (`clock`, `proven`, `lost_sync`, `resumed`, `resynced`, `invalidate_all`,
//! `synced`, `is_trusted`: `trust`), the worker (`run`, `is_complete`, `wait_settled`,
//! `wait_idle`: `worker`; `held_stats`, `filter_bytes`: `holding`).
//!
//! # Lock order
//!
//! Each part owns its locks (`lock::Ranked`: a std mutex with a rank). A thread takes one of
//! them only while every tier lock it already holds ranks lower:
//!
//! 1. `sync` (`trust`: trust and generations);
//! 2. `recent` (`recent`: changes heard lately, own writes);
//! 3. the stripes (`coherence`: reads in flight), several only in ascending order
//!    (`Stripes::lock_all`, while copies move between the cache and the index or are
//!    weighed again);
//! 4. `queue` (`worker`);
//! 5. `hot` (`modes`: hot buckets read lately);
//! 6. `sweep` (`sweep`).
//!
//! Only the stripes nest today: every other lock is taken alone and released before the next
//! (a change is recorded under `recent`, applied under its bucket's stripe, then the bucket is
//! queued), and none is held across an `.await` or a store call. Under a stripe lock, moka's
//! eviction listener and the weigher touch only atomics, and waking the worker (`Notify`) takes
//! no tier lock. Debug builds check the order on every lock (`lock`: a thread-local stack of
//! the ranks held and a `debug_assert!`), so every test exercises it on the paths it runs;
//! release builds keep only the ranks.

mod coherence;
mod copy;
mod filter;
mod holding;
mod lock;
mod modes;
mod recent;
mod registry;
mod sketch;
mod sweep;
#[cfg(test)]
mod testing;
mod trust;
mod worker;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use moka::notification::RemovalCause;

pub use copy::BucketCopy;
pub use recent::WriteMark;
pub use registry::RegistryCache;
pub use trust::LIVE_BOUND;

use crate::store::EntryKey;
use coherence::Stripes;
use holding::{Held, Index, SCALE_ONE};
use lock::{Rank, Ranked};
use modes::HotReads;
use recent::Recent;
use sweep::{Ring, Sweep};
use trust::{NO_CLOCK, SyncState};
use worker::Queue;

/// How the tier holds the keyspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    /// No tier: every lookup goes to the store (embedded store, or a zero budget).
    Off = 0,
    /// Measuring bucket sizes before choosing.
    Sizing = 1,
    /// Every bucket is (or is being) held.
    Complete = 2,
    /// The hottest buckets within the budget; the rest per lookup.
    Partial = 3,
}

impl Mode {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => Mode::Sizing,
            2 => Mode::Complete,
            3 => Mode::Partial,
            _ => Mode::Off,
        }
    }

    /// The `mode` label of `namelist_tier_mode`.
    pub fn label(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Sizing => "sizing",
            Mode::Complete => "complete",
            Mode::Partial => "partial",
        }
    }
}

/// The tier's tuning.
#[derive(Debug, Clone)]
pub struct TierSettings {
    /// Bytes the copies may take; 0 turns the tier off.
    pub budget_bytes: u64,
    /// Most buckets held; 0 turns the tier off.
    pub max_buckets: u64,
    /// Without proofs of delivery: the longest a copy answers after the read it comes from
    /// started. With them: the shortest period of the safety-net re-reads (see the module
    /// docs, *Trust and generations*).
    pub ttl: Duration,
    /// Background reads per second (loading, refreshing); 0: unpaced.
    pub fetch_rate: u64,
    /// With proofs of delivery: buckets re-read per second, on average, only because of
    /// their age (the safety net); 0: every `ttl / 2` as without proofs.
    pub refresh_rate: u64,
    /// Two changes of one field within this window are read again (see the module docs):
    /// at least the longest a write may take between landing and publishing.
    pub conflict_window: Duration,
}

/// What a lookup found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// The bucket is held and current: the raw code stored for the key, if any.
    Local(Option<u32>),
    /// Ask the store.
    Remote,
}

/// The local tier of one instance.
pub struct LocalTier {
    copies: Option<moka::sync::Cache<u32, Arc<BucketCopy>>>,
    /// Complete mode's copies (see the module docs); `None` when complete mode is impossible.
    index: Option<Index>,
    /// What the copies may take (the budget less the index's slots).
    copies_budget: u64,
    /// Set when a copy did not fit the index: the worker turns the tier partial.
    overflowed: AtomicBool,
    /// The filters' bits per entry (an `f64`'s bits; 0 without filters), for the metrics.
    filter_bits: AtomicU64,
    /// Lookups sent to the store only because the subscription's last proof of delivery was
    /// older than `LIVE_BOUND` (for the metrics).
    pub unproven: AtomicU64,
    /// Partial mode's filters of every bucket (`filter`), while partial and room allows.
    filters: ArcSwapOption<filter::Filters>,
    /// When the tier was made: the filters' stamps count from here.
    epoch: Instant,
    buckets: u32,
    settings: TierSettings,
    mode: AtomicU8,
    trusted: AtomicBool,
    /// When the subscription last proved that it delivers (`Liveness`), in nanoseconds since
    /// `epoch`; `NO_CLOCK` when it gives no proofs (an in-process bus). While trusted, what is
    /// held is known in sync as of this instant, not as of now, and answers locally only
    /// while the proof is younger than `LIVE_BOUND`.
    proven_ns: AtomicU64,
    /// Trust and generations (`trust`).
    sync: Ranked<SyncState>,
    held: Arc<Held>,
    /// Reads in flight (`coherence`).
    stripes: Stripes,
    /// The worker's queue, and what wakes it (`worker`).
    queue: Queue,
    sketch: sketch::Sketch,
    /// Hot buckets read lately, and when (see `heat_due`).
    hot_reads: HotReads,
    /// Changes heard lately, and this instance's own acknowledged upserts.
    recent: Recent,
    /// The sweep's progress (`sweep`).
    sweep: Ranked<Sweep>,
    /// Background reads done and failed, by reason, for the metrics.
    pub fetched: AtomicU64,
    pub fetch_errors: AtomicU64,
}

impl LocalTier {
    /// A tier for a keyspace of `buckets` buckets; off when `enabled` is false or the budget
    /// or bucket cap is zero.
    pub fn new(buckets: u32, settings: TierSettings, enabled: bool) -> Arc<Self> {
        let on = enabled && settings.budget_bytes > 0 && settings.max_buckets > 0;
        let held = Arc::new(Held::default());
        held.current.store(Held::tag(1), Ordering::Relaxed);
        held.generation.store(1, Ordering::Relaxed);
        held.scale.store(SCALE_ONE, Ordering::Relaxed);
        // The index only where complete mode is possible (every copy there weighs at least
        // `INDEXED_OVERHEAD`), and its bytes come out of the copies' budget.
        let index_bytes =
            u64::from(buckets) * std::mem::size_of::<ArcSwapOption<BucketCopy>>() as u64;
        let indexed = on
            && u64::from(buckets) * copy::INDEXED_OVERHEAD as u64 <= settings.budget_bytes
            && u64::from(buckets) <= settings.max_buckets;
        let index = indexed.then(|| Index {
            on: AtomicBool::new(false),
            slots: (0..buckets).map(|_| ArcSwapOption::empty()).collect(),
            held: AtomicI64::new(0),
            bytes: AtomicI64::new(0),
        });
        let copies_budget = settings.budget_bytes - if indexed { index_bytes } else { 0 };
        let copies = on.then(|| {
            let min_weight =
                (settings.budget_bytes / settings.max_buckets).min(u64::from(u32::MAX));
            let listener_held = held.clone();
            let weigher_held = held.clone();
            moka::sync::Cache::builder()
                .max_capacity(copies_budget)
                .weigher(move |_: &u32, c: &Arc<BucketCopy>| {
                    let scale = weigher_held.scale.load(Ordering::Relaxed);
                    Held::weight(c.bytes() as u64, min_weight, scale)
                })
                .eviction_listener(move |_: Arc<u32>, c: Arc<BucketCopy>, _: RemovalCause| {
                    listener_held.released(&c, c.bytes());
                })
                .build()
        });
        Arc::new(Self {
            copies,
            index,
            copies_budget,
            overflowed: AtomicBool::new(false),
            filter_bits: AtomicU64::new(0),
            unproven: AtomicU64::new(0),
            filters: ArcSwapOption::empty(),
            epoch: Instant::now(),
            buckets,
            mode: AtomicU8::new(if on { Mode::Sizing } else { Mode::Off } as u8),
            trusted: AtomicBool::new(false),
            proven_ns: AtomicU64::new(NO_CLOCK),
            sync: Ranked::new(
                Rank::Sync,
                SyncState {
                    trusted: false,
                    generation: 1,
                    broke_at: None,
                    ended: BTreeMap::new(),
                    began: Instant::now(),
                },
            ),
            held,
            stripes: Stripes::new(),
            queue: Queue::new(),
            sketch: sketch::Sketch::new(buckets),
            hot_reads: HotReads::new(),
            recent: Recent::new(),
            sweep: Ranked::new(
                Rank::Sweep,
                Sweep {
                    cursor: 0,
                    due: Vec::new(),
                    gathered_at: None,
                    gathered_gen: 0,
                    oldest: Duration::ZERO,
                    answering: None,
                    copies: Ring::default(),
                    filters: Ring::default(),
                },
            ),
            settings,
            fetched: AtomicU64::new(0),
            fetch_errors: AtomicU64::new(0),
        })
    }

    pub fn mode(&self) -> Mode {
        Mode::from_u8(self.mode.load(Ordering::Acquire))
    }

    pub(super) fn generation(&self) -> u64 {
        self.held.generation.load(Ordering::Acquire)
    }

    /// Whether `copy` may answer a normal (not fail-open) lookup at `now`.
    pub(super) fn usable(&self, copy: &BucketCopy, now: Instant) -> bool {
        self.current(now)
            && copy.generation == self.generation()
            && copy.dirty_since.is_none()
            && self.young_enough(copy.fetched_at, now)
    }

    /// The check path: the key's answer if its bucket is held and current, else `Remote`
    /// (and, by the mode's rule, the bucket is queued to be read in the background).
    pub fn lookup(&self, key: &EntryKey, now: Instant) -> Lookup {
        let Some(copies) = &self.copies else {
            return Lookup::Remote;
        };
        let answer = |held: Option<&BucketCopy>| match held {
            Some(c) if self.usable(c, now) => Lookup::Local(c.get(key.field)),
            Some(_) => Lookup::Remote,
            None => {
                let wanted = match self.mode() {
                    Mode::Complete => self.is_trusted(),
                    Mode::Partial => {
                        self.sketch.touch(key.bucket) && self.heat_due(key.bucket, now)
                    }
                    Mode::Off | Mode::Sizing => false,
                };
                if wanted {
                    self.queue.push(key.bucket);
                }
                Lookup::Remote
            }
        };
        // The index while it is on (complete mode), else the filter (partial mode: a "no"
        // needs neither the cache nor its bookkeeping), else the cache.
        match self.index.as_ref().and_then(|i| i.get(key.bucket)) {
            Some(indexed) => answer(indexed.as_deref()),
            None if self.filtered_out(key, now) => Lookup::Local(None),
            None => answer(copies.get(&key.bucket).as_deref()),
        }
    }

    /// Whether the bucket's filter is current and says `key` is not in the bucket.
    fn filtered_out(&self, key: &EntryKey, now: Instant) -> bool {
        let filters = self.filters.load();
        let Some(f) = filters.as_ref() else {
            return false;
        };
        let generation = self.generation();
        self.current(now)
            && f.stamp(key.bucket, generation)
                .is_some_and(|(g, at)| g == generation && self.young_enough(at, now))
            && !f.may_hold(key.bucket, key.field)
    }

    /// For a fail-open answer: the key's code in whatever copy is held (current or not), and
    /// when that copy was last known in sync. `None` when the bucket is not held.
    /// A filter that says the key is absent answers too.
    /// This instance's own acknowledged writes answer too (`remember_own`): for a field whose
    /// bucket is not held, or held as last known in sync no later than the write was sent,
    /// its code as of the write's sending (it took effect between then and the
    /// acknowledgement; dated by the acknowledgement, an instance too busy to process it at
    /// once would claim writes acknowledged meanwhile elsewhere had been seen). `None` when
    /// nothing here knows the key: never "absent" by default.
    pub fn held(&self, key: &EntryKey, now: Instant) -> Option<(Option<u32>, Instant)> {
        self.copies.as_ref()?;
        let own = self.recent.own(key);
        let newer_own = |at: Instant| own.filter(|(_, sent)| *sent >= at);
        if let Some(c) = self.get(key.bucket) {
            let at = self.synced_at(c.generation, c.dirty_since, c.fetched_at, now);
            return Some(newer_own(at).unwrap_or((c.get(key.field), at)));
        }
        let filters = self.filters.load();
        let from_filter = filters.as_ref().and_then(|f| {
            let (generation, fetched_at) = f.stamp(key.bucket, self.generation())?;
            (!f.may_hold(key.bucket, key.field))
                .then(|| (None, self.synced_at(generation, None, fetched_at, now)))
        });
        match from_filter {
            Some((code, at)) => Some(newer_own(at).unwrap_or((code, at))),
            None => own,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier::testing::*;

    #[test]
    fn filters_answer_absent_fields_until_they_cannot_be_trusted() {
        let t = filtered_tier(Duration::from_secs(3));
        let now = Instant::now();
        assert_eq!(t.lookup(&key(9), now), Lookup::Remote, "never read");
        read_filter(&t, vec![(5, LATER), (6, LATER)]);
        assert!(t.get(1).is_none(), "no copy kept");
        let now = Instant::now();
        assert_eq!(t.lookup(&key(5), now), Lookup::Remote, "present: the store");
        let absent: Vec<i64> = (100..200)
            .filter(|f| t.lookup(&key(*f), now) == Lookup::Local(None))
            .collect();
        assert!(
            absent.len() > 90,
            "{} of 100 absent fields answered",
            absent.len()
        );
        let gone = absent[0];

        // A write heard: the field is "maybe" from then on.
        t.apply(&[(key(gone), Some(LATER))], true);
        assert_eq!(t.lookup(&key(gone), Instant::now()), Lookup::Remote);
        // A removal is not taken out of the bits: still the store.
        t.apply(&[(key(gone), None)], true);
        assert_eq!(t.lookup(&key(gone), Instant::now()), Lookup::Remote);

        // Past the TTL: not used.
        let other = absent[1];
        let later = Instant::now() + Duration::from_secs(61);
        assert_eq!(t.lookup(&key(other), later), Lookup::Remote);

        // Fail-open: an absent field answers "not listed", as of the read.
        let (code, _) = t.held(&key(other), Instant::now()).expect("filter answers");
        assert_eq!(code, None);
        assert_eq!(t.held(&key(5), Instant::now()), None, "maybe: unknown");

        // A write of this instance (outcome unknown): unusable, queued for its filter only.
        t.wrote(&[key(other)], t.write_mark());
        assert_eq!(t.lookup(&key(other), Instant::now()), Lookup::Remote);
        {
            let q = t.queue.lock();
            assert!(q.queued.contains(&1) && q.filter_only.contains(&1));
        }
        let (batch, only) = t.next_batch(Instant::now());
        assert_eq!(batch[0], 1, "urgent first");
        assert!(only.contains(&1));
        assert_eq!(batch.iter().filter(|b| **b == 1).count(), 1, "once");
        read_filter(&t, vec![(5, LATER), (6, LATER)]);
        assert_eq!(t.lookup(&key(other), Instant::now()), Lookup::Local(None));

        // A new generation (resubscribed, or an import): unusable until read again.
        t.invalidate_all();
        assert_eq!(t.lookup(&key(other), Instant::now()), Lookup::Remote);
        // Untrusted: not used either.
        read_filter(&t, vec![(5, LATER)]);
        assert_eq!(t.lookup(&key(other), Instant::now()), Lookup::Local(None));
        t.lost_sync();
        assert_eq!(t.lookup(&key(other), Instant::now()), Lookup::Remote);
    }
}
