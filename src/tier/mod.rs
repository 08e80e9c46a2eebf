//! The local tier in front of the store: whole buckets held in memory, so that a lookup whose
//! bucket is held never leaves the process, whether the entry is listed or not.
//!
//! * **Unit.** A bucket (~200 entries) is read whole (`EntryStore::get_buckets`) and kept as a
//!   sorted copy (`copy`, 8 to 12 bytes an entry): every lookup that falls in it, hit or miss, is a
//!   binary search. Copies live in an index by bucket number (complete mode, below) or a moka
//!   cache weighted by their bytes (partial mode), capped at the memory budget (and at
//!   `max_buckets` copies: each weighs at least `budget / max_buckets`), so memory stays
//!   within the budget whatever the keyspace.
//! * **Modes.** At start-up the worker reads a sample of buckets to measure their mean size.
//!   If all N buckets fit the budget, the tier is *complete*: the worker loads every bucket in
//!   the background (pipelined, paced at `fetch_rate` buckets/s, resumed where it stopped
//!   after a store error) and then answers every lookup locally. Otherwise it is *partial*: it
//!   keeps a Bloom filter of every bucket's fields (`filter`, 4-10 bits an entry, up to
//!   `FILTER_SHARE` of the budget; the cache's weigher charges copies for that room), read by
//!   the worker like a copy (every bucket, again by the safety net below, not kept as a copy), so a
//!   lookup of a value on no list is answered locally whatever its bucket (87-99 % of them).
//!   In the rest of the budget it preloads copies until 90 % full, then fetches a bucket only
//!   when the sketch (`sketch`) says it is touched far more than the average bucket (at most
//!   once per `ttl / 2` each), and moka's TinyLFU keeps the hottest. Every other lookup (the
//!   listed values, and the filters' false positives) goes to the store per key (`HGET`), on
//!   the caller's path as before; a whole bucket is never fetched on a caller's path. Why: a
//!   bucket read costs Redis ~9 `HGET`s (`dump`), and with uniform traffic a bucket fetched
//!   into a tier holding a fraction c of the keyspace serves c/(1-c) lookups before it is
//!   evicted: at 20x the budget, 0.05; a filter read every `ttl / 2` serves every absent
//!   lookup in its bucket meanwhile. (docs/design/tier.md and docs/performance.md have the measurements.)
//! * **Exact in place.** Every write's message carries the new codes (`Invalidation::Changes`)
//!   and is applied to the copy in place. A bucket being read when a change arrives gets the
//!   change logged and applied on top of what the read returns, so a read that raced a write
//!   never installs an older state: changes are absolute (field := code), applying one that
//!   the read already saw is a no-op, and messages of one bucket arrive in write order.
//! * **When values are not known** the bucket's copy is marked dirty (used only for fail-open)
//!   and read again in the background: a message from an older build (`Keys`), a write made
//!   by this instance whose outcome is unknown (an error: a timeout may still land) or whose
//!   message is not atomic with it, and a non-atomic message for a field changed within
//!   `conflict_window` (on a cluster, and for deletes, a write and its message are not one
//!   atomic step, so two concurrent writers' messages may arrive in the other order than
//!   their writes; the later-arriving one is then the non-atomic one, and reading again after
//!   it settles it; an atomic message cannot overtake a write).
//! * **Own writes.** An upsert this instance made and had acknowledged, its message atomic
//!   with it (one node), is applied at once (`wrote_acked`): its codes are known, and
//!   applying them is what its message will do. Read again instead where that could be
//!   wrong: a change of the field heard between sending and the acknowledgement with another
//!   code (their order is unknown), or a new generation since sending. The codes written are
//!   remembered for `conflict_window`, and a message bringing another code to such a field
//!   reads the bucket again, so an older write's message arriving late cannot take the
//!   writer back behind its own acknowledged write.
//! * **Trust and generations.** While the invalidation subscription is down, writes elsewhere
//!   go unseen: the tier is *untrusted* and every lookup goes to the store, but copies stay
//!   for fail-open answers. Resubscribing catches up from the change log where it can
//!   (`resumed`, `invalidation`): only the buckets written meanwhile are marked dirty and
//!   read again, the rest answer again at once. Where it cannot (a gap in the log, no log),
//!   resubscribing, like a `Bulk` import, starts a new generation:
//!   copies of older generations are used only for fail-open until read again, which the
//!   worker does at once. With proofs of delivery (Redis) that is the whole rule: a copy in the
//!   current generation, while the last proof is under `LIVE_BOUND`, has heard every change
//!   since its read, whatever its age. Age drives only a safety net against a change whose
//!   message never reached the feed (on a cluster a write and its message are two steps):
//!   each held bucket is read again between one and two `refresh_period`s
//!   (`buckets / refresh_rate`, at least `ttl / 2`), so its cost is `refresh_rate` reads a
//!   second whatever the keyspace (issue 26: at 50M entries the old rule re-read 4,499 buckets
//!   a second per instance). Without proofs (an in-process bus) a copy is never used more than
//!   `ttl` after its read started, and is read again from `ttl / 2` on. Never on a caller's
//!   path.
//! * **Filters** follow the same rules: one answers only while trusted, for the current
//!   generation, by the same age rule as copies, and unless a change of unknown value reached its
//!   bucket since (then it is read again, for the filter only); every insert or refresh heard
//!   is added to its bits, and a deletion stays in them (a false positive) until the next read.
//!   With Redis unreachable, a filter's "absent" answers fail-open lookups too.
//! * **A complete tier keeps its copies in an index** by bucket number (`Index`), not in the
//!   cache: a lookup loads one pointer, where a cache read also records itself for the
//!   eviction policy (in a profile of the new-subject mix, moka's `get` and its bookkeeping
//!   were ~15 % of the service's CPU), and a copy costs ~190 B less without the cache's
//!   bookkeeping (`INDEXED_OVERHEAD`; 14.3 B against 15.7 B an entry resident at 10M
//!   entries). Nothing is evicted from a complete tier, so it needs no policy; a copy that
//!   would take it past the budget (the keyspace grew) is not kept and the worker turns the
//!   tier partial at once (a copy's growth is reserved atomically, so copies installed at
//!   once cannot pass the budget together). A partial tier keeps its copies in the cache, the index off and
//!   empty; a mode change moves them under every stripe lock.
//! * **Staleness of a fail-open answer** (`stale_ms`): the time since each copy used was last
//!   known in sync (now, while trusted and current; when the subscription broke, or its
//!   generation ended, or it turned dirty, otherwise).
//!
//! `RegistryCache` caches the prefix-length registries (IP prefixes, phone segment and e-mail
//! domain lengths) per scope (a TTL and an epoch).

mod copy;
mod filter;
mod sketch;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use moka::future::Cache;
use moka::notification::RemovalCause;

pub use copy::BucketCopy;

use crate::domain::now_ms;
use crate::instrumented::Instrumented;
use crate::metrics::{StoreOp, TierGauges};
use crate::store::{Deadline, EntryKey, EntryStore, LoggedChange, PrefixLen, Scope, StoreError};

/// Buckets read per round trip.
const BATCH: usize = 64;
/// Passes over every bucket per refresh period, at most (see `Ring`).
const PASSES_PER_REFRESH: u32 = 16;
/// Buckets the worker looks at per sweep step.
const SCAN_STEP: u32 = 4096;
/// How often the answering gauge counts the filters in sync (a look at every bucket's stamp:
/// ~1 ms at 1M buckets).
const ANSWERING_EVERY: Duration = Duration::from_secs(2);
/// Buckets read to measure their mean size before choosing the mode.
const SAMPLE: u32 = 64;
/// How long one background read may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Complete mode needs the projected size within this share of the budget (room to grow).
const COMPLETE_SHARE: f64 = 0.9;
/// Partial mode preloads until this share of the budget is used.
const PRELOAD_SHARE: f64 = 0.9;
/// Partial mode's filters take at most this share of the budget (at most
/// `filter::MAX_BITS_PER_ENTRY`); the copies get the rest.
const FILTER_SHARE: f64 = 0.9;
/// Fixed-point one for `Held::scale`.
const SCALE_ONE: u64 = 1 << 16;
/// Field → time of the last change heard, kept for conflict detection; past this many,
/// every change is treated as a conflict (read again) until old ones age out.
const RECENT_CAP: usize = 1_000_000;
const STRIPES: usize = 256;

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

/// Trust and generations (see the module docs).
struct SyncState {
    trusted: bool,
    generation: u64,
    /// When the subscription broke (while untrusted).
    broke_at: Option<Instant>,
    /// When recent generations stopped being in sync.
    ended: BTreeMap<u64, Instant>,
    /// When the current generation began (every copy in it was read after).
    began: Instant,
}

/// Changes heard lately, for conflict detection, and this instance's own upserts applied
/// at their acknowledgement (see `LocalTier::wrote_acked`).
struct Recent {
    /// Field → the last change heard of it.
    heard: HashMap<EntryKey, Heard>,
    /// Changes heard so far: a write's mark (`write_mark`) is this count when it was sent.
    seq: u64,
    /// Field → the code this instance wrote and had acknowledged, and when.
    own: HashMap<EntryKey, (Option<u32>, Instant)>,
    /// When old entries of both maps were last forgotten.
    pruned: Instant,
}

#[derive(Clone, Copy)]
struct Heard {
    at: Instant,
    seq: u64,
    code: Option<u32>,
}

impl Recent {
    /// Forgets what is older than `window`, at most once per window: each map holds about
    /// two windows' worth of fields.
    fn prune(&mut self, now: Instant, window: Duration) {
        if self.heard.len() + self.own.len() > 1024
            && now.saturating_duration_since(self.pruned) >= window
        {
            self.heard
                .retain(|_, h| now.saturating_duration_since(h.at) < window);
            self.own
                .retain(|_, (_, at)| now.saturating_duration_since(*at) < window);
            self.pruned = now;
        }
    }
}

/// Where the tier stood when this instance sent a write: what its acknowledgement is
/// compared with (`LocalTier::wrote_acked`).
#[derive(Debug, Clone, Copy)]
pub struct WriteMark {
    generation: u64,
    seq: u64,
    /// When the write was sent: a copy that misses it was last known in sync then.
    at: Instant,
}

/// A read of one bucket in flight, and the changes heard meanwhile.
#[derive(Default)]
struct Fetching {
    log: Vec<(i64, Option<u32>)>,
    /// A change of unknown value arrived meanwhile: install the copy dirty.
    poisoned: bool,
    /// A read for the copy found this one (for the filter only) in flight and was skipped:
    /// keep the copy.
    wanted: bool,
}

/// A read of some buckets, between `begin_read` and `finish_read`.
struct Read {
    buckets: Vec<u32>,
    generation: u64,
    started: Instant,
    /// Read for their filters only: installed as copies only where one is held already.
    filter_only: HashSet<u32>,
}

#[derive(Default)]
struct Queue {
    urgent: VecDeque<u32>,
    queued: HashSet<u32>,
    /// Queued for their filter only (partial mode): the read is not kept as a copy.
    filter_only: HashSet<u32>,
}

/// Counters shared with the cache's eviction listener.
#[derive(Default)]
struct Held {
    /// Bytes of the copies held (`BucketCopy::bytes` in the cache, `indexed_bytes` in the
    /// index).
    bytes: AtomicI64,
    /// Copies of the current generation held: the generation's low 32 bits (`Held::tag`),
    /// then the count, in one word, so that a copy counted as current just as its generation
    /// ends is wiped with it: `LocalTier::new_generation` resets the word before it publishes
    /// the new generation, and a copy of the old one no longer matches the tag.
    current: AtomicU64,
    generation: AtomicU64,
    /// What the weigher charges a copy per byte, in 1/65,536ths: above one while filters
    /// take part of the budget, so the cache (built before the filters are sized) holds
    /// copies of at most `budget − filter bytes`.
    scale: AtomicU64,
    /// Buckets read and the entries they held, since the mode was last reconsidered.
    read_buckets: AtomicU64,
    read_entries: AtomicU64,
    /// And what their copies took (`BucketCopy::bytes`).
    read_bytes: AtomicU64,
}

impl Held {
    const COUNT: u64 = 0xFFFF_FFFF;

    /// `current`'s word for `generation` with no copy counted.
    fn tag(generation: u64) -> u64 {
        (generation & Self::COUNT) << 32
    }

    /// Copies of the current generation held.
    fn current(&self) -> u64 {
        self.current.load(Ordering::Acquire) & Self::COUNT
    }

    /// Counts `copy` in (`up`) or out of `current` if it is of the generation counted.
    fn count(&self, copy: &BucketCopy, up: bool) {
        let tag = Self::tag(copy.generation);
        let _ = self
            .current
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                let n = w & Self::COUNT;
                (w & !Self::COUNT == tag).then(|| {
                    tag | if up {
                        (n + 1).min(Self::COUNT)
                    } else {
                        n.saturating_sub(1)
                    }
                })
            });
    }

    /// A copy weighing `bytes` is now held (in the cache or the index).
    fn holding(&self, copy: &BucketCopy, bytes: usize) {
        self.bytes.fetch_add(bytes as i64, Ordering::Relaxed);
        self.count(copy, true);
    }

    /// A copy weighing `bytes` is no longer held.
    fn released(&self, copy: &BucketCopy, bytes: usize) {
        self.bytes.fetch_sub(bytes as i64, Ordering::Relaxed);
        self.count(copy, false);
    }
}

/// Progress of the background sweep.
struct Sweep {
    /// Partial mode's preload: the next bucket to look at.
    cursor: u32,
    /// Held buckets due for a refresh (partial mode), gathered once per `ttl / 8`.
    due: Vec<u32>,
    gathered_at: Option<Instant>,
    gathered_gen: u64,
    /// Oldest copy seen in the last full pass, for the gauge.
    oldest: Duration,
    /// The answering gauge's last value and when it was counted (every `ANSWERING_EVERY`:
    /// a look at every filter's stamp).
    answering: Option<(Instant, f64)>,
    /// Complete mode's passes over every copy.
    copies: Ring,
    /// Partial mode's passes over every filter.
    filters: Ring,
}

/// Passes over every bucket, reading what is missing or due; each pass then sleeps until the
/// first bucket it found not yet due falls due, and at least `refresh_at /
/// PASSES_PER_REFRESH`. What a pass found due is read in its batches (a failed read goes back
/// to the queue), so nothing else can fall due by age before then; a new generation ends the
/// sleep, and a dirty copy or a missing bucket is queued. So a bucket is read again at most
/// `refresh_at / PASSES_PER_REFRESH` late, far within the TTL (twice `refresh_at`), and the
/// sweep costs at most that many passes a period: passes that followed each other at once
/// while writes dirtied buckets, or whenever the next bucket fell due (reads spread over
/// time), took 40 % and 8 % of the service's CPU.
#[derive(Default)]
struct Ring {
    cursor: u32,
    /// This pass: the oldest read seen, and when the first bucket not yet due will be.
    pass_oldest: Duration,
    pass_due: Option<Instant>,
    /// After a pass: no scanning until then, in this generation.
    idle_until: Option<Instant>,
    idle_generation: u64,
}

impl Ring {
    /// Looks at up to `SCAN_STEP` buckets from the cursor and adds those due to `batch` (up to
    /// `BATCH`). `state(b)`: when what is held of `b` was read and whether it is due; `None`
    /// when nothing usable is held (due). Returns the oldest read seen when a pass ends.
    fn scan(
        &mut self,
        buckets: u32,
        generation: u64,
        now: Instant,
        refresh_at: Duration,
        batch: &mut Vec<u32>,
        state: impl Fn(u32) -> Option<(Instant, bool)>,
    ) -> Option<Duration> {
        if self
            .idle_until
            .is_some_and(|t| now < t && self.idle_generation == generation)
        {
            return None;
        }
        self.idle_until = None;
        if self.cursor >= buckets {
            self.cursor = 0;
        }
        let mut finished = None;
        let mut looked = 0;
        while batch.len() < BATCH && looked < SCAN_STEP && buckets > 0 {
            let b = self.cursor;
            let held = state(b);
            if let Some((at, _)) = held {
                self.pass_oldest = self.pass_oldest.max(now.saturating_duration_since(at));
            }
            match held {
                Some((at, false)) => {
                    let at = at + refresh_at;
                    self.pass_due = Some(self.pass_due.map_or(at, |d| d.min(at)));
                }
                _ => {
                    if !batch.contains(&b) {
                        batch.push(b);
                    }
                }
            }
            looked += 1;
            self.cursor = (b + 1) % buckets;
            if self.cursor == 0 {
                finished = Some(std::mem::take(&mut self.pass_oldest));
                let at_least = now + refresh_at / PASSES_PER_REFRESH;
                self.idle_until = Some(
                    self.pass_due
                        .take()
                        .map_or(now + refresh_at, |due| due.max(at_least)),
                );
                self.idle_generation = generation;
                break;
            }
        }
        finished
    }
}

/// Where a complete tier keeps its copies: a slot per bucket (8 bytes a bucket, taken from
/// the copies' budget; made only when the keyspace could be held complete, so at most
/// 8 / `INDEXED_OVERHEAD` = 1.7 % of the budget). On in complete mode, when the cache holds
/// nothing; off and empty in partial mode. A copy is in one of the two, never both.
struct Index {
    on: AtomicBool,
    slots: Box<[ArcSwapOption<BucketCopy>]>,
    /// Slots set, and the bytes (`BucketCopy::indexed_bytes`) of their copies.
    held: AtomicI64,
    bytes: AtomicI64,
}

impl Index {
    fn get(&self, bucket: u32) -> Option<arc_swap::Guard<Option<Arc<BucketCopy>>>> {
        if !self.is_on() {
            return None;
        }
        self.slots.get(bucket as usize).map(ArcSwapOption::load)
    }

    fn is_on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// Sets `bucket`'s slot (`None` empties it) and returns what it held; the caller holds
    /// the bucket's stripe lock.
    fn swap(&self, bucket: u32, copy: Option<Arc<BucketCopy>>) -> Option<Arc<BucketCopy>> {
        let slot = self.slots.get(bucket as usize)?;
        let (set, bytes) = copy
            .as_ref()
            .map_or((0, 0), |c| (1, c.indexed_bytes() as i64));
        let old = slot.swap(copy);
        let (unset, freed) = old
            .as_ref()
            .map_or((0, 0), |c| (1, c.indexed_bytes() as i64));
        self.held.fetch_add(set - unset, Ordering::Relaxed);
        self.bytes.fetch_add(bytes - freed, Ordering::Relaxed);
        old
    }

    /// Sets `bucket`'s slot to `copy` if the bytes held stay within `budget` (or do not
    /// grow), and returns what it held; else leaves it and gives `copy` back. The growth is
    /// reserved atomically, so copies of different buckets installed at once cannot together
    /// pass the budget. The caller holds the bucket's stripe lock.
    fn put_within(
        &self,
        bucket: u32,
        copy: Arc<BucketCopy>,
        budget: i64,
    ) -> Result<Option<Arc<BucketCopy>>, Arc<BucketCopy>> {
        let Some(slot) = self.slots.get(bucket as usize) else {
            return Err(copy);
        };
        let replaced = slot.load().as_ref().map_or(0, |c| c.indexed_bytes() as i64);
        let grow = copy.indexed_bytes() as i64 - replaced;
        let reserved = self
            .bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                (grow <= 0 || held + grow <= budget).then_some(held + grow)
            });
        if reserved.is_err() {
            return Err(copy);
        }
        let old = slot.swap(Some(copy));
        self.held
            .fetch_add(1 - i64::from(old.is_some()), Ordering::Relaxed);
        Ok(old)
    }
}

/// The local tier of one instance.
/// `proven_ns` when the subscription gives no proofs of delivery.
const NO_CLOCK: u64 = u64::MAX;

/// How old the subscription's last proof of delivery may be for the tier to answer a check
/// locally as current: within the invalidation bound (100 ms) that non-degraded answers
/// promise, less the time a message takes to arrive. Proofs come every
/// `Liveness::PROOF_EVERY` (25 ms); past this, lookups go to Redis (no generation change,
/// nothing read again) until the next proof.
pub const LIVE_BOUND: Duration = Duration::from_millis(90);

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
    sync: Mutex<SyncState>,
    held: Arc<Held>,
    stripes: Box<[Mutex<HashMap<u32, Fetching>>]>,
    queue: Mutex<Queue>,
    /// Set (under the queue lock) while the worker holds a batch taken from it.
    busy: AtomicBool,
    wake: tokio::sync::Notify,
    sketch: sketch::Sketch,
    /// Hot buckets read lately, and when (see `heat_due`).
    hot_reads: Mutex<HashMap<u32, Instant>>,
    /// Changes heard lately, and this instance's own acknowledged upserts.
    recent: Mutex<Recent>,
    sweep: Mutex<Sweep>,
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
                    let bytes = (c.bytes() as u64).max(min_weight);
                    let scale = weigher_held.scale.load(Ordering::Relaxed);
                    (u128::from(bytes) * u128::from(scale) / u128::from(SCALE_ONE))
                        .min(u128::from(u32::MAX)) as u32
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
            sync: Mutex::new(SyncState {
                trusted: false,
                generation: 1,
                broke_at: None,
                ended: BTreeMap::new(),
                began: Instant::now(),
            }),
            held,
            stripes: (0..STRIPES).map(|_| Mutex::new(HashMap::new())).collect(),
            queue: Mutex::new(Queue::default()),
            busy: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
            sketch: sketch::Sketch::new(buckets),
            hot_reads: Mutex::new(HashMap::new()),
            recent: Mutex::new(Recent {
                heard: HashMap::new(),
                seq: 0,
                own: HashMap::new(),
                pruned: Instant::now(),
            }),
            sweep: Mutex::new(Sweep {
                cursor: 0,
                due: Vec::new(),
                gathered_at: None,
                gathered_gen: 0,
                oldest: Duration::ZERO,
                answering: None,
                copies: Ring::default(),
                filters: Ring::default(),
            }),
            settings,
            fetched: AtomicU64::new(0),
            fetch_errors: AtomicU64::new(0),
        })
    }

    /// Whether answers from the tier (and the registry cache) may be given as authoritative:
    /// the invalidation subscription is up.
    pub fn is_trusted(&self) -> bool {
        self.trusted.load(Ordering::Acquire)
    }

    /// Trusted, and (with a clock of proofs) proven to receive invalidations within
    /// `LIVE_BOUND`: what may answer a check locally as current.
    fn current(&self, now: Instant) -> bool {
        if !self.is_trusted() {
            return false;
        }
        let proven = now.saturating_duration_since(self.proven_at(now)) <= LIVE_BOUND;
        if !proven {
            self.unproven.fetch_add(1, Ordering::Relaxed);
        }
        proven
    }

    /// Until when what the subscription delivered is known complete: `now` without a clock.
    fn proven_at(&self, now: Instant) -> Instant {
        match self.proven_ns.load(Ordering::Acquire) {
            NO_CLOCK => now,
            ns => (self.epoch + Duration::from_nanos(ns)).min(now),
        }
    }

    /// A subscription begins: `clock` says whether it gives proofs of delivery (then the
    /// first proof is its start, `at`).
    pub fn clock(&self, clock: bool, at: Instant) {
        let ns = if clock {
            at.saturating_duration_since(self.epoch).as_nanos() as u64
        } else {
            NO_CLOCK
        };
        self.proven_ns.store(ns, Ordering::Release);
    }

    /// The subscription delivered everything published before `sent` (and the listener
    /// applied it).
    pub fn proven(&self, sent: Instant) {
        let ns = sent.saturating_duration_since(self.epoch).as_nanos() as u64;
        let _ = self
            .proven_ns
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                (p != NO_CLOCK && p < ns).then_some(ns)
            });
    }

    pub fn mode(&self) -> Mode {
        Mode::from_u8(self.mode.load(Ordering::Relaxed))
    }

    fn generation(&self) -> u64 {
        self.held.generation.load(Ordering::Acquire)
    }

    fn stripe(&self, bucket: u32) -> std::sync::MutexGuard<'_, HashMap<u32, Fetching>> {
        self.stripes[bucket as usize % STRIPES]
            .lock()
            .expect("stripe lock")
    }

    /// The subscription broke: writes elsewhere may go unseen from now on. Returns until
    /// when what is held was known in sync, if it was trusted until now (what a catch-up
    /// from the change log must start before: `resumed`).
    pub fn lost_sync(&self) -> Option<Instant> {
        let mut st = self.sync.lock().expect("sync lock");
        let mut broke = None;
        if st.trusted {
            st.trusted = false;
            // In sync only as far as the subscription last proved it.
            broke = Some(self.proven_at(Instant::now()));
            st.broke_at = broke;
        }
        self.trusted.store(false, Ordering::Release);
        broke
    }

    /// Subscribed again, and the change log told which buckets were written since the
    /// subscription broke (`invalidation`): those are read again (answered from the store
    /// until then, their filters too), and everything else held is current again as it is,
    /// in the same generation: nothing else is read again.
    pub fn resumed(&self, touched: &BTreeSet<u32>) {
        let since = {
            let st = self.sync.lock().expect("sync lock");
            st.broke_at.unwrap_or_else(Instant::now)
        };
        self.dirty(touched.iter().copied().collect(), since);
        let mut st = self.sync.lock().expect("sync lock");
        st.broke_at = None;
        st.trusted = true;
        self.trusted.store(true, Ordering::Release);
        drop(st);
        self.wake.notify_one();
    }

    /// Subscribed (again): everything held may have changed unseen, so a new generation
    /// starts and the worker reads every held bucket again.
    pub fn resynced(&self) {
        let mut st = self.sync.lock().expect("sync lock");
        let ended = st.broke_at.take().unwrap_or_else(Instant::now);
        self.new_generation(&mut st, ended);
        st.trusted = true;
        self.trusted.store(true, Ordering::Release);
        drop(st);
        self.wake.notify_one();
    }

    /// Whether the current generation began at or after `at` (every copy in it read since).
    pub fn generation_began_since(&self, at: Instant) -> bool {
        self.sync.lock().expect("sync lock").began >= at
    }

    /// Changes read from the change log, old enough that their messages have arrived if
    /// they were ever published (`invalidation::follow_log`): a copy of the current
    /// generation that holds another code for a field, or a filter that says an upserted
    /// field is absent, missed a message (or saw a later change: reading again settles
    /// both). Those buckets are read again, their copies known in sync only until `since`.
    /// Returns how many.
    pub fn verify(&self, changes: &[LoggedChange], since: Instant) -> usize {
        if self.copies.is_none() {
            return 0;
        }
        let filters = self.filters.load();
        let generation = self.generation();
        let mut missed = HashSet::new();
        for c in changes {
            if missed.contains(&c.bucket) {
                continue;
            }
            let disagrees = match self.get(c.bucket) {
                Some(copy) => {
                    copy.generation == generation
                        && copy.dirty_since.is_none()
                        && copy.get(c.field) != c.code
                }
                None => {
                    c.code.is_some()
                        && filters.as_ref().is_some_and(|f| {
                            f.stamp(c.bucket, generation)
                                .is_some_and(|(g, _)| g == generation)
                                && !f.may_hold(c.bucket, c.field)
                        })
                }
            };
            if disagrees {
                missed.insert(c.bucket);
            }
        }
        let n = missed.len();
        if n > 0 {
            self.dirty(missed, since);
        }
        n
    }

    /// Entries were written in bulk (import): anything held may be out of date.
    pub fn invalidate_all(&self) {
        let mut st = self.sync.lock().expect("sync lock");
        self.new_generation(&mut st, Instant::now());
        drop(st);
        self.wake.notify_one();
    }

    fn new_generation(&self, st: &mut SyncState, ended: Instant) {
        st.ended.insert(st.generation, ended);
        while st.ended.len() > 64 {
            st.ended.pop_first();
        }
        st.generation += 1;
        st.began = Instant::now();
        // The count first: a read that sees the new generation installs after this.
        self.held
            .current
            .store(Held::tag(st.generation), Ordering::Release);
        self.held.generation.store(st.generation, Ordering::Release);
    }

    /// Whether `copy` may answer a normal (not fail-open) lookup at `now`.
    fn usable(&self, copy: &BucketCopy, now: Instant) -> bool {
        self.current(now)
            && copy.generation == self.generation()
            && copy.dirty_since.is_none()
            && self.young_enough(copy.fetched_at, now)
    }

    /// Whether what was read at `at` may still answer by its age: always while the feed gives
    /// proofs of delivery (what was held since is known to have heard every change; the
    /// generation and the proof's age are checked apart), else within `ttl`.
    fn young_enough(&self, at: Instant, now: Instant) -> bool {
        self.proven_feed() || now.saturating_duration_since(at) <= self.settings.ttl
    }

    /// Whether the subscription gives proofs of delivery (a Redis store's; an in-process
    /// bus's does not).
    fn proven_feed(&self) -> bool {
        self.proven_ns.load(Ordering::Acquire) != NO_CLOCK
    }

    /// The mean period of the safety-net re-reads: `ttl / 2` without proofs of delivery (or
    /// with `refresh_rate` 0); with them, long enough that the age-driven re-reads of all
    /// buckets stay near `refresh_rate` a second, whatever the keyspace.
    fn refresh_period(&self) -> Duration {
        let floor = self.settings.ttl / 2;
        if !self.paced() {
            return floor;
        }
        floor.max(Duration::from_secs_f64(
            f64::from(self.buckets) / self.settings.refresh_rate as f64,
        ))
    }

    /// Whether the safety net is paced by `refresh_rate` (proofs of delivery, a rate set).
    fn paced(&self) -> bool {
        self.proven_feed() && self.settings.refresh_rate > 0
    }

    /// When what is held of `bucket` falls due by age: from `ttl / 2` without proofs; with
    /// them, between one and two `refresh_period`s, by a fixed share per bucket, so that a
    /// keyspace loaded at once is not re-read at once.
    fn refresh_after(&self, bucket: u32) -> Duration {
        let period = self.refresh_period();
        if !self.paced() {
            return period;
        }
        let share = f64::from(bucket.wrapping_mul(0x9E37_79B9)) / f64::from(u32::MAX);
        period.mul_f64(1.0 + share)
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
                    self.enqueue(key.bucket);
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

    /// Whether a hot bucket may be read now: at most once per `ttl / 2` each, so that one
    /// the cache declines to admit (the budget full of hotter ones) is not read over and over.
    fn heat_due(&self, bucket: u32, now: Instant) -> bool {
        let cooldown = self.settings.ttl / 2;
        let mut hot = self.hot_reads.lock().expect("hot lock");
        if hot.len() >= 4096 {
            hot.retain(|_, at| now.saturating_duration_since(*at) < cooldown);
        }
        match hot.get(&bucket) {
            Some(at) if now.saturating_duration_since(*at) < cooldown => false,
            _ => {
                hot.insert(bucket, now);
                true
            }
        }
    }

    /// For a fail-open answer: the key's code in whatever copy is held (current or not), and
    /// when that copy was last known in sync. `None` when the bucket is not held.
    /// A filter that says the key is absent answers too.
    /// This instance's own acknowledged writes answer too (`remember_own`): for a field whose
    /// bucket is not held, or held from before the write, its code as of the write's
    /// acknowledgement. `None` when nothing here knows the key: never "absent" by default.
    pub fn held(&self, key: &EntryKey, now: Instant) -> Option<(Option<u32>, Instant)> {
        self.copies.as_ref()?;
        let own = self
            .recent
            .lock()
            .expect("recent lock")
            .own
            .get(key)
            .copied();
        let newer_own = |at: Instant| own.filter(|(_, acked)| *acked > at);
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

    /// When what was read at `fetched_at` in `generation` (dirty since `dirty_since`) was
    /// last known in sync.
    fn synced_at(
        &self,
        generation: u64,
        dirty_since: Option<Instant>,
        fetched_at: Instant,
        now: Instant,
    ) -> Instant {
        if let Some(t) = dirty_since {
            return t;
        }
        let st = self.sync.lock().expect("sync lock");
        if generation == st.generation {
            return if st.trusted {
                self.proven_at(now)
            } else {
                st.broke_at.unwrap_or(now)
            };
        }
        st.ended.get(&generation).copied().unwrap_or(fetched_at)
    }

    /// When the tier as a whole was last known in sync (now, while trusted); `None` when off.
    pub fn synced(&self, now: Instant) -> Option<Instant> {
        self.copies.as_ref()?;
        let st = self.sync.lock().expect("sync lock");
        Some(if st.trusted {
            self.proven_at(now)
        } else {
            st.broke_at.unwrap_or(now)
        })
    }

    fn enqueue(&self, bucket: u32) {
        let mut q = self.queue.lock().expect("queue lock");
        q.filter_only.remove(&bucket);
        if q.queued.insert(bucket) {
            q.urgent.push_back(bucket);
            drop(q);
            self.wake.notify_one();
        }
    }

    /// Queues `bucket` to be read for its filter (not kept as a copy unless one is held).
    fn enqueue_filter(&self, bucket: u32) {
        let mut q = self.queue.lock().expect("queue lock");
        if q.queued.insert(bucket) {
            q.filter_only.insert(bucket);
            q.urgent.push_back(bucket);
            drop(q);
            self.wake.notify_one();
        }
    }

    /// Changes heard from a write (`Invalidation::Changes`): applied to held copies and to
    /// reads in flight. Read again instead: the bucket of a field changed again within the
    /// conflict window by a non-atomic message, or changed to another code than this
    /// instance's own acknowledged upsert of it within the window (an older write's message
    /// arriving after that upsert was applied, or a later write: reading again settles both).
    pub fn apply(&self, changes: &[(EntryKey, Option<u32>)], atomic: bool) {
        if self.copies.is_none() || changes.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut conflicts = HashSet::new();
        // A conflicting pair of changes leaves the copy known in sync only before the
        // earlier of them (or, with no earlier one heard, the window before this one).
        let mut since = now;
        {
            let window = self.settings.conflict_window;
            let mut recent = self.recent.lock().expect("recent lock");
            recent.prune(now, window);
            for (k, code) in changes {
                recent.seq += 1;
                let heard = Heard {
                    at: now,
                    seq: recent.seq,
                    code: *code,
                };
                let full = recent.heard.len() >= RECENT_CAP;
                let previous = if full {
                    None
                } else {
                    recent.heard.insert(*k, heard)
                };
                let close = previous.is_some_and(|h| now.saturating_duration_since(h.at) < window);
                let not_own = recent.own.get(k).is_some_and(|(own, at)| {
                    own != code && now.saturating_duration_since(*at) < window
                });
                if (!atomic && (full || close)) || not_own {
                    conflicts.insert(k.bucket);
                    let earlier = match (previous, recent.own.get(k)) {
                        (Some(h), _) if close => h.at,
                        (_, Some((_, at))) if not_own => *at,
                        _ => now.checked_sub(window).unwrap_or(now),
                    };
                    since = since.min(earlier);
                }
            }
        }
        self.apply_in_place(changes);
        if !conflicts.is_empty() {
            self.dirty(conflicts, since);
        }
    }

    /// Where the tier stands now: taken before this instance sends a write, for
    /// `wrote_acked`.
    pub fn write_mark(&self) -> WriteMark {
        let seq = self.recent.lock().expect("recent lock").seq;
        WriteMark {
            generation: self.generation(),
            seq,
            at: Instant::now(),
        }
    }

    /// This instance's upsert of `changes`, sent at `mark`, was acknowledged, and its message
    /// is published atomically with it (one node): applied to the copies at once, as its
    /// message will be, rather than marked dirty and read again (`wrote`), so the writer's
    /// next check sees it without a read. Where that cannot be known right, the bucket is
    /// read again as before: a change of the field heard since `mark` with another code
    /// (its order against this write is unknown), a new generation since `mark` (messages
    /// may have been lost), no conflict window to watch later messages in, or full maps.
    /// A message arriving later with another code reads the bucket again (`apply`).
    pub fn wrote_acked(&self, changes: &[(EntryKey, Option<u32>)], mark: WriteMark) {
        if self.copies.is_none() || changes.is_empty() {
            return;
        }
        let window = self.settings.conflict_window;
        if window.is_zero() || mark.generation != self.generation() {
            self.remember_own(changes);
            self.wrote(&changes.iter().map(|(k, _)| *k).collect::<Vec<_>>(), mark);
            return;
        }
        let now = Instant::now();
        let mut unsure = HashSet::new();
        {
            let mut recent = self.recent.lock().expect("recent lock");
            recent.prune(now, window);
            let full = recent.heard.len() >= RECENT_CAP || recent.own.len() >= RECENT_CAP;
            for (k, code) in changes {
                let raced = recent
                    .heard
                    .get(k)
                    .is_some_and(|h| h.seq > mark.seq && h.code != *code);
                if full || raced {
                    unsure.insert(k.bucket);
                }
                // Unsure too: a message of an older write arriving after the bucket is read
                // again must not take the field back behind this write.
                if !full {
                    recent.own.insert(*k, (*code, now));
                }
            }
        }
        let sure: Vec<_> = changes
            .iter()
            .filter(|(k, _)| !unsure.contains(&k.bucket))
            .copied()
            .collect();
        self.apply_in_place(&sure);
        if !unsure.is_empty() {
            self.dirty(unsure, mark.at);
        }
    }

    /// This instance's write of `changes` was acknowledged: what a fail-open answer may say of
    /// these fields while their buckets are not held (or are held older), as of now
    /// (`held`). Kept for the conflict window, like every own write.
    pub fn remember_own(&self, changes: &[(EntryKey, Option<u32>)]) {
        if self.copies.is_none() || changes.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut recent = self.recent.lock().expect("recent lock");
        recent.prune(now, self.settings.conflict_window);
        if recent.own.len() < RECENT_CAP {
            for (k, code) in changes {
                recent.own.insert(*k, (*code, now));
            }
        }
    }

    /// Applies `changes` to held copies, reads in flight and filters.
    fn apply_in_place(&self, changes: &[(EntryKey, Option<u32>)]) {
        let mut by_bucket: BTreeMap<u32, Vec<(i64, Option<u32>)>> = BTreeMap::new();
        for (k, code) in changes {
            by_bucket
                .entry(k.bucket)
                .or_default()
                .push((k.field, *code));
        }
        let now_ms = now_ms();
        let filters = self.filters.load();
        for (bucket, fields) in by_bucket {
            let mut stripe = self.stripe(bucket);
            if let Some(f) = stripe.get_mut(&bucket) {
                f.log.extend_from_slice(&fields);
            }
            if let Some(filters) = filters.as_ref() {
                for (field, code) in &fields {
                    if code.is_some() {
                        filters.add(bucket, *field);
                    }
                }
            }
            if let Some(copy) = self.get(bucket) {
                self.put(bucket, copy.with_changes(&fields, now_ms));
            }
        }
    }

    /// Fields changed to values not known here (an older writer's `Keys`).
    pub fn changed_unknown(&self, keys: &[EntryKey]) {
        self.dirty(keys.iter().map(|k| k.bucket).collect(), Instant::now());
    }

    /// This instance wrote (or tried to write) these fields, sent at `mark`, the outcome or
    /// the order of its message unknown (else `wrote_acked`): their buckets are read again,
    /// and answered from the store until then (read-your-writes whatever the outcome). A copy
    /// held meanwhile was last known in sync when the write was sent, not after.
    pub fn wrote(&self, keys: &[EntryKey], mark: WriteMark) {
        self.dirty(keys.iter().map(|k| k.bucket).collect(), mark.at);
    }

    /// Marks the held copies of `buckets` (and reads in flight) out of date since `since`
    /// (the earliest such time is kept) and queues them.
    fn dirty(&self, buckets: HashSet<u32>, since: Instant) {
        if self.copies.is_none() {
            return;
        }
        let filters = self.filters.load();
        let generation = self.generation();
        for bucket in buckets {
            let mut stripe = self.stripe(bucket);
            let fetching = stripe.get_mut(&bucket).map(|f| f.poisoned = true).is_some();
            let filtered = filters.as_ref().is_some_and(|f| {
                let had = f.stamp(bucket, generation).is_some();
                f.invalidate(bucket);
                had
            });
            let held = match self.get(bucket) {
                Some(copy) => {
                    if copy.dirty_since.is_none_or(|d| d > since) {
                        self.put(bucket, copy.dirtied(since));
                    }
                    true
                }
                None => false,
            };
            drop(stripe);
            if held || fetching {
                self.enqueue(bucket);
            } else if filtered {
                self.enqueue_filter(bucket);
            }
        }
    }

    /// Lazy expiry deleted `key` while it held `code`: drop it from the copy too, so that
    /// later checks do not ask for the same deletion again.
    pub fn forget_expired(&self, key: &EntryKey, code: u32) {
        let _stripe = self.stripe(key.bucket);
        if let Some(copy) = self.get(key.bucket)
            && copy.get(key.field) == Some(code)
        {
            self.put(
                key.bucket,
                copy.with_changes(&[(key.field, None)], now_ms()),
            );
        }
    }

    /// The index while it is on (complete mode).
    fn index_on(&self) -> Option<&Index> {
        self.index.as_ref().filter(|i| i.is_on())
    }

    /// The copy held of `bucket`, wherever the mode keeps it.
    fn get(&self, bucket: u32) -> Option<Arc<BucketCopy>> {
        match self.index_on() {
            Some(index) => index.get(bucket).and_then(|slot| (*slot).clone()),
            None => self.copies.as_ref()?.get(&bucket),
        }
    }

    /// Installs a copy (the caller holds the bucket's stripe lock).
    fn put(&self, bucket: u32, copy: BucketCopy) {
        self.put_arc(bucket, Arc::new(copy));
    }

    /// Installs a copy: in the index in complete mode, else in the cache. A copy that would
    /// take the index past the copies' budget (the keyspace outgrew a complete copy) is not
    /// kept, nor is the older one it replaces: that bucket is answered by the store until the
    /// worker turns the tier partial (`overflowed`). The caller holds the bucket's stripe
    /// lock, or every stripe lock.
    fn put_arc(&self, bucket: u32, copy: Arc<BucketCopy>) {
        let Some(copies) = &self.copies else { return };
        let Some(index) = self.index_on() else {
            self.held.holding(&copy, copy.bytes());
            copies.insert(bucket, copy);
            return;
        };
        let old = match index.put_within(bucket, copy.clone(), self.copies_budget as i64) {
            Ok(old) => {
                self.held.holding(&copy, copy.indexed_bytes());
                old
            }
            Err(_) => {
                self.overflowed.store(true, Ordering::Relaxed);
                self.wake.notify_one();
                index.swap(bucket, None)
            }
        };
        if let Some(old) = old {
            self.held.released(&old, old.indexed_bytes());
        }
    }

    /// Copies held, in the cache and the index.
    fn count(&self) -> u64 {
        let Some(copies) = &self.copies else { return 0 };
        let indexed = self
            .index
            .as_ref()
            .map_or(0, |i| i.held.load(Ordering::Relaxed).max(0) as u64);
        copies.entry_count() + indexed
    }

    /// Reads `buckets` from the store and installs them (with the changes heard meanwhile).
    /// Buckets already being read are skipped.
    async fn fetch(
        &self,
        store: &Instrumented<dyn EntryStore>,
        buckets: &[u32],
        filter_only: HashSet<u32>,
    ) -> Result<(), StoreError> {
        let read = self.begin_read(buckets, filter_only);
        if read.buckets.is_empty() {
            return Ok(());
        }
        let wanted = &read.buckets;
        let pairs = store
            .call(
                StoreOp::Buckets,
                Deadline::after(FETCH_TIMEOUT),
                |s| async move {
                    let r = s.get_buckets(wanted).await?;
                    if r.len() != wanted.len() {
                        return Err(StoreError::corrupt(format!(
                            "asked for {} buckets, got {}",
                            wanted.len(),
                            r.len()
                        )));
                    }
                    Ok(r)
                },
            )
            .await;
        self.finish_read(read, pairs)
    }

    /// Registers a read of `buckets` (those not already being read), so that changes heard
    /// from now on are logged for it. A bucket wanted as a copy whose read for the filter only
    /// is in flight is skipped, and that read keeps the copy instead.
    fn begin_read(&self, buckets: &[u32], filter_only: HashSet<u32>) -> Read {
        use std::collections::hash_map::Entry;
        let mut owned = Vec::with_capacity(buckets.len());
        for &b in buckets {
            match self.stripe(b).entry(b) {
                Entry::Vacant(e) => {
                    e.insert(Fetching::default());
                    owned.push(b);
                }
                Entry::Occupied(mut e) => e.get_mut().wanted |= !filter_only.contains(&b),
            }
        }
        Read {
            buckets: owned,
            generation: self.generation(),
            started: Instant::now(),
            filter_only,
        }
    }

    /// Installs what a read returned, each bucket with the changes logged since it began
    /// applied on top (dirty if a change of unknown value arrived); on failure forgets it.
    fn finish_read(
        &self,
        read: Read,
        result: Result<Vec<Vec<(i64, u32)>>, StoreError>,
    ) -> Result<(), StoreError> {
        let all = match result {
            Ok(all) => all,
            Err(e) => {
                for &b in &read.buckets {
                    self.stripe(b).remove(&b);
                }
                self.fetch_errors.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
        };
        self.fetched
            .fetch_add(read.buckets.len() as u64, Ordering::Relaxed);
        self.held
            .read_buckets
            .fetch_add(read.buckets.len() as u64, Ordering::Relaxed);
        let now_ms = now_ms();
        let filters = self.filters.load();
        for (b, pairs) in read.buckets.into_iter().zip(all) {
            let mut copy = BucketCopy::from_pairs(pairs, now_ms, read.started, read.generation);
            self.held
                .read_entries
                .fetch_add(copy.len() as u64, Ordering::Relaxed);
            self.held
                .read_bytes
                .fetch_add(copy.bytes() as u64, Ordering::Relaxed);
            let mut stripe = self.stripe(b);
            let fetching = stripe.remove(&b).expect("registered by begin_read");
            if !fetching.log.is_empty() {
                copy = copy.with_changes(&fetching.log, now_ms);
            }
            if let Some(f) = filters.as_ref() {
                let fields = copy.pairs().map(|(field, _)| field);
                f.rebuild(b, fields, read.generation, read.started, !fetching.poisoned);
            }
            if fetching.poisoned {
                copy = copy.dirtied(read.started);
            }
            let keep = !read.filter_only.contains(&b) || fetching.wanted || self.get(b).is_some();
            if keep {
                self.put(b, copy);
            }
            drop(stripe);
            if fetching.poisoned {
                if keep {
                    self.enqueue(b);
                } else {
                    self.enqueue_filter(b);
                }
            }
        }
        Ok(())
    }

    /// Whether the held copy of `bucket` (if any) should be read again now.
    fn due(&self, bucket: u32, copy: Option<&BucketCopy>, now: Instant) -> bool {
        match copy {
            None => true,
            Some(c) => {
                c.generation != self.generation()
                    || c.dirty_since.is_some()
                    || now.saturating_duration_since(c.fetched_at) >= self.refresh_after(bucket)
            }
        }
    }

    /// The next buckets to read: urgent ones first, then the sweep's; and which of them are
    /// read for their filters only.
    fn next_batch(&self, now: Instant) -> (Vec<u32>, HashSet<u32>) {
        let mut batch = Vec::with_capacity(BATCH);
        let mut filter_only = HashSet::new();
        {
            let mut q = self.queue.lock().expect("queue lock");
            while batch.len() < BATCH {
                let Some(b) = q.urgent.pop_front() else { break };
                q.queued.remove(&b);
                if q.filter_only.remove(&b) {
                    filter_only.insert(b);
                }
                batch.push(b);
            }
            self.busy.store(true, Ordering::Release);
        }
        let Some(copies) = &self.copies else {
            return (batch, filter_only);
        };
        let mut sweep = self.sweep.lock().expect("sweep lock");
        match self.mode() {
            Mode::Complete => {
                let generation = self.generation();
                let refresh_at = self.refresh_period();
                // The index, not the cache: a cache lookup records a read for its
                // eviction policy, which made the sweep the service's largest CPU cost.
                let state = |b: u32| match self.index.as_ref().and_then(|i| i.get(b)) {
                    Some(slot) => slot
                        .as_ref()
                        .map(|c| (c.fetched_at, self.due(b, Some(c), now))),
                    None => copies
                        .get(&b)
                        .map(|c| (c.fetched_at, self.due(b, Some(&c), now))),
                };
                let Sweep { copies: ring, .. } = &mut *sweep;
                if let Some(oldest) =
                    ring.scan(self.buckets, generation, now, refresh_at, &mut batch, state)
                {
                    sweep.oldest = oldest;
                }
            }
            Mode::Partial => {
                // Preload while there is room, then refresh what is held.
                copies.run_pending_tasks();
                let room = (copies.weighted_size() as f64)
                    < PRELOAD_SHARE * self.settings.budget_bytes as f64
                    && copies.entry_count() < self.settings.max_buckets;
                if room && u64::from(sweep.cursor) < u64::from(self.buckets) {
                    let mut looked = 0;
                    while batch.len() < BATCH / 2
                        && looked < SCAN_STEP
                        && sweep.cursor < self.buckets
                    {
                        let b = sweep.cursor;
                        if copies.get(&b).is_none() && !batch.contains(&b) {
                            batch.push(b);
                        }
                        looked += 1;
                        sweep.cursor += 1;
                    }
                }
                let regather = sweep.gathered_gen != self.generation()
                    || sweep
                        .gathered_at
                        .is_none_or(|t| now.saturating_duration_since(t) >= self.settings.ttl / 8);
                if regather && sweep.due.is_empty() {
                    let mut oldest = Duration::ZERO;
                    let mut due = Vec::new();
                    for (b, c) in copies.iter() {
                        oldest = oldest.max(now.saturating_duration_since(c.fetched_at));
                        if self.due(*b, Some(&c), now) {
                            due.push(*b);
                        }
                    }
                    sweep.oldest = oldest;
                    sweep.due = due;
                    sweep.gathered_at = Some(now);
                    sweep.gathered_gen = self.generation();
                }
                while batch.len() < BATCH {
                    let Some(b) = sweep.due.pop() else { break };
                    if !batch.contains(&b) {
                        batch.push(b);
                    }
                }
                // Then every bucket's filter, read again from `ttl / 2` on.
                let filters = self.filters.load();
                if let Some(f) = filters.as_ref() {
                    let generation = self.generation();
                    let refresh_at = self.refresh_period();
                    let state = |b: u32| {
                        f.stamp(b, generation).map(|(g, at)| {
                            let due = g != generation
                                || now.saturating_duration_since(at) >= self.refresh_after(b);
                            (at, due)
                        })
                    };
                    let from = batch.len();
                    sweep.filters.scan(
                        self.buckets,
                        generation,
                        now,
                        refresh_at,
                        &mut batch,
                        state,
                    );
                    filter_only.extend(&batch[from..]);
                }
            }
            Mode::Off | Mode::Sizing => {}
        }
        (batch, filter_only)
    }

    /// Reads a sample of buckets, installs them, and chooses complete or partial mode from
    /// their mean size.
    async fn size_up(&self, store: &Instrumented<dyn EntryStore>) -> Result<(), StoreError> {
        let n = self.buckets.max(1);
        let sample: Vec<u32> = (0..SAMPLE.min(n))
            .map(|i| (u64::from(i) * u64::from(n) / u64::from(SAMPLE.min(n))) as u32)
            .collect();
        self.fetch(store, &sample, HashSet::new()).await?;
        let held: Vec<Arc<BucketCopy>> = sample.iter().filter_map(|b| self.get(*b)).collect();
        let n = held.len().max(1) as f64;
        let mean = held.iter().map(|c| c.bytes()).sum::<usize>() as f64 / n;
        let entries = held.iter().map(|c| c.len()).sum::<usize>() as f64 / n;
        self.choose(mean, entries);
        Ok(())
    }

    /// Complete when N copies of `mean` bytes (as the cache weighs them) fit the budget (with
    /// room) and the bucket cap, at what the index, where a complete tier keeps them, costs;
    /// buckets hold `entries` on average (for the filters).
    fn choose(&self, mean: f64, entries: f64) {
        let s = &self.settings;
        let min_weight = (s.budget_bytes / s.max_buckets) as f64;
        let indexed = mean - copy::COPY_OVERHEAD as f64 + copy::INDEXED_OVERHEAD as f64;
        let projected = f64::from(self.buckets) * indexed.max(min_weight);
        let complete = projected <= COMPLETE_SHARE * s.budget_bytes as f64
            && u64::from(self.buckets) <= s.max_buckets;
        let mode = if complete {
            Mode::Complete
        } else {
            Mode::Partial
        };
        self.set_mode(mode, mean, entries, projected);
    }

    /// Puts the tier in `mode` (buckets of `mean` bytes and `entries` entries, `projected`
    /// bytes for all of them).
    fn set_mode(&self, mode: Mode, mean: f64, entries: f64, projected: f64) {
        let s = &self.settings;
        let previous = Mode::from_u8(self.mode.swap(mode as u8, Ordering::Relaxed));
        if previous != mode || (mode == Mode::Partial && self.filters_outgrown(entries)) {
            // Filters first: copies the index hands to the cache are then weighed with the
            // filters' room already charged.
            self.filters_for(mode, entries);
            if previous != mode {
                self.index_for(mode);
            }
            let refresh = self.refresh_period();
            let per_refresh = f64::from(self.buckets) / refresh.as_secs_f64();
            tracing::info!(
                mode = mode.label(),
                buckets = self.buckets,
                mean_bucket_bytes = mean as u64,
                projected_bytes = projected as u64,
                budget_bytes = s.budget_bytes,
                load_secs = u64::from(self.buckets)
                    .checked_div(s.fetch_rate)
                    .unwrap_or(0),
                refresh_secs = refresh.as_secs(),
                "local tier mode chosen"
            );
            let every_bucket = mode == Mode::Complete || self.filter_bytes() > 0;
            if every_bucket
                && !self.proven_feed()
                && s.fetch_rate > 0
                && per_refresh > s.fetch_rate as f64
            {
                tracing::warn!(
                    buckets = self.buckets,
                    fetch_rate = s.fetch_rate,
                    "refreshing every bucket (copy or filter) within cache_ttl_ms / 2 needs more \
                     than fetch_rate reads/s: buckets will pass their TTL and be answered by the \
                     store; raise cache_ttl_ms or local_fetch_rate"
                );
            }
        }
    }

    /// Moves the copies where `mode` keeps them, under every stripe lock (so no `put`, which
    /// holds one, sees the flag and the copies disagree). Complete: the index turns on and
    /// the cache's copies are dropped (the sweep reads every bucket anyway). Partial: the index turns off
    /// and its copies go to the cache, which keeps what its budget admits. Meanwhile a
    /// lookup finding nothing goes to the store.
    fn index_for(&self, mode: Mode) {
        let (Some(index), Some(copies)) = (&self.index, &self.copies) else {
            return;
        };
        let on = mode == Mode::Complete;
        if index.is_on() == on {
            return;
        }
        let _stripes: Vec<_> = self
            .stripes
            .iter()
            .map(|s| s.lock().expect("stripe lock"))
            .collect();
        index.on.store(on, Ordering::Release);
        if on {
            // One by one: the listener runs at once for each (`invalidate_all` would leave
            // the counts, and so `is_complete`, to the cache's next maintenance).
            let held: Vec<u32> = copies.iter().map(|(b, _)| *b).collect();
            for b in held {
                copies.invalidate(&b);
            }
            return;
        }
        for b in 0..self.buckets {
            if let Some(copy) = index.swap(b, None) {
                self.held.released(&copy, copy.indexed_bytes());
                self.put_arc(b, copy);
            }
        }
    }

    /// Entries a bucket of `mean_bytes` holds at least (a copy's bytes less its overhead, at
    /// most 12 an entry): where only bytes are known.
    fn entries_in(mean_bytes: f64) -> f64 {
        (mean_bytes - copy::COPY_OVERHEAD as f64) / 12.0
    }

    /// Whether buckets of `entries` want filters a quarter larger or smaller than those
    /// held (the keyspace grew or shrank since they were sized), or some where there are none.
    fn filters_outgrown(&self, entries: f64) -> bool {
        let room = (FILTER_SHARE * self.settings.budget_bytes as f64) as u64;
        let want = filter::Filters::plan(self.buckets, entries, room);
        let have = self.filters.load().as_ref().map(|f| f.words());
        match (want, have) {
            (Some(w), Some(h)) => w * 4 > h * 5 || w * 5 < h * 4,
            (w, h) => w.is_some() != h.is_some(),
        }
    }

    /// Sizes filters of every bucket for partial mode (within `FILTER_SHARE` of the budget,
    /// if at least `filter::MIN_BITS_PER_ENTRY` fit) and makes the cache charge copies for
    /// their room; drops them in the other modes.
    fn filters_for(&self, mode: Mode, entries: f64) {
        if self.copies.is_none() {
            return;
        }
        let budget = self.settings.budget_bytes;
        let made = (mode == Mode::Partial)
            .then(|| {
                let room = (FILTER_SHARE * budget as f64) as u64;
                filter::Filters::sized(self.buckets, entries, room, self.epoch)
                    .map(|f| (f, entries))
            })
            .flatten();
        self.filter_bits.store(
            made.as_ref()
                .map_or(0.0, |(f, e)| f.bits_per_entry(*e))
                .to_bits(),
            Ordering::Relaxed,
        );
        if mode == Mode::Partial && made.is_none() {
            // What it would take: the minimum bits an entry, over the filters' share.
            let needed = f64::from(self.buckets)
                * ((entries.max(1.0) * filter::MIN_BITS_PER_ENTRY / 64.0).ceil() + 2.0)
                * 8.0
                / FILTER_SHARE;
            tracing::warn!(
                buckets = self.buckets,
                budget_mib = budget >> 20,
                needed_mib = (needed / f64::from(1u32 << 20)).ceil() as u64,
                "local tier: filters of every bucket do not fit local_memory_mb: values on no \
                 list are looked up in the store (raise local_memory_mb to the needed size)"
            );
        }
        let scale = match &made {
            Some((f, entries)) => {
                tracing::info!(
                    bytes = f.bytes(),
                    bits_per_entry = format!("{:.1}", f.bits_per_entry(*entries)),
                    probes = f.probes(),
                    "local tier: filters of every bucket"
                );
                let rest = budget.saturating_sub(f.bytes()).max(1);
                (u128::from(SCALE_ONE) * u128::from(budget)).div_ceil(u128::from(rest)) as u64
            }
            None => SCALE_ONE,
        };
        // The weight of a copy is fixed when it is inserted: under a larger scale, those held
        // would count for less than they now should and the budget would be overrun. Filters
        // are sized again only when the mean bucket moved by a quarter (rare), so the copies
        // go and are read again as the mode's rules say. Under every stripe lock (each `put`
        // holds one, so none weighed at the old scale lands after) and one by one (the
        // listener keeps the counts at once; `invalidate_all` would leave them, and entries
        // inserted in its instant, to the cache's maintenance).
        let _stripes: Vec<_> = self
            .stripes
            .iter()
            .map(|s| s.lock().expect("stripe lock"))
            .collect();
        let previous = self.held.scale.swap(scale, Ordering::Relaxed);
        self.filters.store(made.map(|(f, _)| Arc::new(f)));
        if scale > previous
            && let Some(copies) = &self.copies
        {
            let held: Vec<u32> = copies.iter().map(|(b, _)| *b).collect();
            for b in held {
                copies.invalidate(&b);
            }
        }
    }

    /// The mean copy held, as the cache weighs it (`BucketCopy::bytes`), once `at_least`
    /// (and one) are.
    fn mean_held(&self, at_least: u64) -> Option<f64> {
        let count = self.count();
        (count >= at_least.max(1)).then(|| {
            let bytes = self.held.bytes.load(Ordering::Relaxed).max(0) as f64 / count as f64;
            match self.index_on() {
                Some(_) => bytes - copy::INDEXED_OVERHEAD as f64 + copy::COPY_OVERHEAD as f64,
                None => bytes,
            }
        })
    }

    /// Re-evaluates the mode from the buckets read since last time, or else the copies held
    /// (once enough are read or held to say).
    fn reconsider(&self) {
        if self.copies.is_none() {
            return;
        }
        let reads = self.held.read_buckets.swap(0, Ordering::Relaxed);
        let entries = self.held.read_entries.swap(0, Ordering::Relaxed);
        let bytes = self.held.read_bytes.swap(0, Ordering::Relaxed);
        if reads >= u64::from(SAMPLE) {
            self.choose(bytes as f64 / reads as f64, entries as f64 / reads as f64);
            return;
        }
        if let Some(mean) = self.mean_held(u64::from(SAMPLE)) {
            self.choose(mean, Self::entries_in(mean));
        }
    }

    /// Exports the tier's state.
    fn export(&self, gauges: &TierGauges) {
        if self.copies.is_none() {
            gauges.set_mode(Mode::Off.label());
            return;
        }
        let now = Instant::now();
        gauges.set_mode(self.mode().label());
        gauges.budget_bytes.set(self.settings.budget_bytes as i64);
        gauges
            .bytes
            .set(self.held.bytes.load(Ordering::Relaxed).max(0) + self.filter_bytes() as i64);
        gauges.buckets.set(self.count() as i64);
        let current = self.held.current() as f64;
        let loaded = (current / f64::from(self.buckets.max(1))).min(1.0);
        gauges.loaded.set(loaded);
        let stale = self
            .synced(now)
            .map_or(0.0, |t| now.saturating_duration_since(t).as_secs_f64());
        gauges.stale_seconds.set(stale);
        let (oldest, answering) = {
            let mut sweep = self.sweep.lock().expect("sweep lock");
            let answering = match (self.mode(), self.filters.load().as_ref()) {
                (Mode::Partial, Some(f)) if self.is_trusted() => match sweep.answering {
                    Some((at, v)) if now.saturating_duration_since(at) < ANSWERING_EVERY => v,
                    _ => {
                        let v = f.of_generation(self.generation()) as f64
                            / f64::from(self.buckets.max(1));
                        sweep.answering = Some((now, v));
                        v
                    }
                },
                (Mode::Complete, _) if self.is_trusted() => loaded,
                _ => 0.0,
            };
            (sweep.oldest, answering)
        };
        gauges.oldest_copy_seconds.set(oldest.as_secs_f64());
        gauges.answering.set(answering);
        gauges
            .filter_bits_per_entry
            .set(f64::from_bits(self.filter_bits.load(Ordering::Relaxed)));
        gauges.set_totals(
            self.fetched.load(Ordering::Relaxed),
            self.fetch_errors.load(Ordering::Relaxed),
            self.unproven.load(Ordering::Relaxed),
        );
    }

    /// The background worker: sizes the keyspace up, loads, refreshes and rereads buckets,
    /// paced, and exports the gauges; runs until aborted. Does nothing while untrusted (a
    /// read then could not be trusted either) or when the tier is off.
    pub async fn run(
        self: Arc<Self>,
        store: Instrumented<dyn EntryStore>,
        gauges: Arc<TierGauges>,
    ) {
        if self.copies.is_none() {
            self.export(&gauges);
            return;
        }
        const MIN_BACKOFF: Duration = Duration::from_millis(50);
        const MAX_BACKOFF: Duration = Duration::from_secs(2);
        let mut backoff = MIN_BACKOFF;
        let mut exported = Instant::now() - Duration::from_secs(1);
        let mut reconsidered = Instant::now();
        loop {
            let now = Instant::now();
            if now.duration_since(exported) >= Duration::from_millis(250) {
                self.export(&gauges);
                self.sketch.age();
                exported = now;
            }
            if !self.is_trusted() {
                let _ =
                    tokio::time::timeout(Duration::from_millis(100), self.wake.notified()).await;
                continue;
            }
            if self.mode() == Mode::Sizing {
                match self.size_up(&store).await {
                    Ok(()) => backoff = MIN_BACKOFF,
                    Err(e) => {
                        tracing::debug!(error = %e, "sizing the local tier failed; retrying");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                }
                continue;
            }
            if now.duration_since(reconsidered) >= self.settings.ttl {
                self.reconsider();
                reconsidered = now;
            }
            if self.overflowed.swap(false, Ordering::Relaxed) && self.mode() == Mode::Complete {
                // A copy did not fit: the keyspace outgrew the budget before `reconsider`
                // saw it. Partial, with buckets the size of those held.
                let mean = self.mean_held(1).unwrap_or(self.copies_budget as f64);
                let projected = f64::from(self.buckets) * mean;
                tracing::warn!(
                    budget_bytes = self.settings.budget_bytes,
                    "the keyspace outgrew a complete local tier: turning partial"
                );
                self.set_mode(Mode::Partial, mean, Self::entries_in(mean), projected);
                reconsidered = now;
            }
            let (batch, filter_only) = self.next_batch(now);
            if batch.is_empty() {
                self.busy.store(false, Ordering::Release);
                let _ =
                    tokio::time::timeout(Duration::from_millis(100), self.wake.notified()).await;
                continue;
            }
            let started = Instant::now();
            let fetched = self.fetch(&store, &batch, filter_only.clone()).await;
            if fetched.is_ok() {
                self.busy.store(false, Ordering::Release);
            }
            match fetched {
                Ok(()) => backoff = MIN_BACKOFF,
                Err(e) => {
                    tracing::debug!(error = %e, buckets = batch.len(), "local tier read failed; retrying");
                    // Resume where it stopped: the failed buckets go first next time.
                    {
                        let mut q = self.queue.lock().expect("queue lock");
                        for b in batch.iter().rev() {
                            if q.queued.insert(*b) {
                                q.urgent.push_front(*b);
                                if filter_only.contains(b) {
                                    q.filter_only.insert(*b);
                                }
                            }
                        }
                        self.busy.store(false, Ordering::Release);
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            }
            if self.settings.fetch_rate > 0 {
                let pace =
                    Duration::from_secs_f64(batch.len() as f64 / self.settings.fetch_rate as f64);
                tokio::time::sleep(pace.saturating_sub(started.elapsed())).await;
            }
        }
    }

    /// Whether every bucket is held, current and in sync (complete mode, loaded).
    pub fn is_complete(&self) -> bool {
        self.is_trusted()
            && self.mode() == Mode::Complete
            && self.held.current() >= u64::from(self.buckets)
    }

    /// Waits until the tier has settled (tests and benches): off, partial once sized, or
    /// complete and loaded. `false` on timeout.
    pub async fn wait_settled(&self, limit: Duration) -> bool {
        let started = Instant::now();
        while started.elapsed() < limit {
            let settled = match self.mode() {
                Mode::Off | Mode::Partial => true,
                Mode::Sizing => false,
                Mode::Complete => self.is_complete(),
            };
            if settled {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        false
    }

    /// Waits until nothing is queued or being read (tests): every copy made dirty has been
    /// read again. `false` on timeout.
    pub async fn wait_idle(&self, limit: Duration) -> bool {
        let started = Instant::now();
        while started.elapsed() < limit {
            let queued = !self.queue.lock().expect("queue lock").urgent.is_empty()
                || self.busy.load(Ordering::Acquire);
            let reading = self
                .stripes
                .iter()
                .any(|s| !s.lock().expect("stripe lock").is_empty());
            if !queued && !reading {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        false
    }

    /// Copies held, and the bytes they and the filters take (tests and benches).
    pub fn held_stats(&self) -> (u64, u64) {
        match &self.copies {
            Some(c) => {
                c.run_pending_tasks();
                (
                    self.count(),
                    self.held.bytes.load(Ordering::Relaxed).max(0) as u64 + self.filter_bytes(),
                )
            }
            None => (0, 0),
        }
    }

    /// Bytes the filters take (0 without).
    pub fn filter_bytes(&self) -> u64 {
        self.filters.load().as_ref().map_or(0, |f| f.bytes())
    }
}

/// Cached prefix-length registries (IP prefixes, phone segments, e-mail domains), per (list,
/// sandbox).
pub struct RegistryCache {
    entries: Cache<Scope, Arc<Vec<PrefixLen>>>,
    epoch: AtomicU64,
}

impl RegistryCache {
    pub fn new(ttl: Duration) -> Arc<Self> {
        Arc::new(Self {
            entries: Cache::builder()
                .max_capacity(100_000)
                .time_to_live(ttl)
                .build(),
            epoch: AtomicU64::new(0),
        })
    }

    /// The registries of `scopes`, from the cache or in one store call (by `deadline`).
    pub async fn get(
        &self,
        store: &Instrumented<dyn EntryStore>,
        scopes: &[Scope],
        trusted: bool,
        deadline: Deadline,
    ) -> Result<Vec<Arc<Vec<PrefixLen>>>, StoreError> {
        let mut out: Vec<Option<Arc<Vec<PrefixLen>>>> = Vec::with_capacity(scopes.len());
        for s in scopes {
            out.push(if trusted {
                self.entries.get(s).await
            } else {
                None
            });
        }
        let missing: Vec<Scope> = scopes
            .iter()
            .zip(&out)
            .filter(|(_, v)| v.is_none())
            .map(|(s, _)| s.clone())
            .collect();
        if !missing.is_empty() {
            let started = self.epoch.load(Ordering::Acquire);
            let fetched = store
                .call(StoreOp::Registry, deadline, |s| s.prefix_lengths(&missing))
                .await?;
            // A backend answering for fewer scopes than asked is a store fault, not a panic.
            if fetched.len() != missing.len() {
                return Err(StoreError::corrupt(format!(
                    "prefix registries: {} answers for {} scopes",
                    fetched.len(),
                    missing.len()
                )));
            }
            let mut fetched = missing.into_iter().zip(fetched.into_iter().map(Arc::new));
            for slot in out.iter_mut().filter(|v| v.is_none()) {
                let Some((scope, lens)) = fetched.next() else {
                    break;
                };
                self.entries.insert(scope.clone(), lens.clone()).await;
                if self.epoch.load(Ordering::Acquire) != started {
                    self.entries.invalidate(&scope).await;
                }
                *slot = Some(lens);
            }
        }
        Ok(out.into_iter().map(Option::unwrap_or_default).collect())
    }

    /// The registries known locally, even if untrusted (for a fail-open answer).
    /// What is cached of each scope's registry, whatever its age (fail-open answers); `None`
    /// where nothing is: its lengths are not known here.
    pub async fn get_cached(&self, scopes: &[Scope]) -> Vec<Option<Arc<Vec<PrefixLen>>>> {
        let mut out = Vec::with_capacity(scopes.len());
        for s in scopes {
            out.push(self.entries.get(s).await);
        }
        out
    }

    pub async fn invalidate(&self, scopes: &[Scope]) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        for s in scopes {
            self.entries.invalidate(s).await;
        }
    }

    pub fn invalidate_all(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.entries.invalidate_all();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::{Deadline, FingerprintKey, Hashing, Layout, WriteBatch};

    /// Codes far in the future (2088 is u32::MAX seconds after 2020).
    const LATER: u32 = 4_000_000_000;

    fn settings(budget: u64, window: Duration) -> TierSettings {
        TierSettings {
            budget_bytes: budget,
            max_buckets: 1_000_000,
            ttl: Duration::from_secs(60),
            fetch_rate: 0,
            refresh_rate: 0,
            conflict_window: window,
        }
    }

    /// A pass over the buckets that found some due (here: dirty, so also queued) still
    /// sleeps until the first bucket not yet due falls due, looking at none meanwhile; a new
    /// generation ends the sleep. Without the sleep, writes kept the sweep spinning.
    #[test]
    fn a_pass_that_found_work_sleeps_until_the_next_bucket_falls_due() {
        let t0 = Instant::now();
        let refresh = Duration::from_secs(30);
        // Bucket 3 is dirty (due); the others were read at t0 + b seconds.
        let looked = std::cell::Cell::new(0);
        let state = |b: u32| {
            looked.set(looked.get() + 1);
            Some((t0 + Duration::from_secs(b.into()), b == 3))
        };
        let mut ring = Ring::default();
        let mut batch = Vec::new();
        let now = t0 + Duration::from_secs(10);
        let oldest = ring.scan(8, 1, now, refresh, &mut batch, state);
        assert_eq!(batch, vec![3]);
        assert_eq!(looked.get(), 8);
        assert_eq!(oldest, Some(Duration::from_secs(10)));
        // Bucket 0 falls due at t0 + 30 s: until then nothing is looked at.
        for at in [now, t0 + Duration::from_secs(29)] {
            let mut batch = Vec::new();
            assert_eq!(ring.scan(8, 1, at, refresh, &mut batch, state), None);
            assert!(batch.is_empty());
        }
        assert_eq!(looked.get(), 8);
        // A new generation looks again at once, and so does the next pass from t0 + 30 s.
        let mut batch = Vec::new();
        ring.scan(8, 2, now, refresh, &mut batch, state);
        assert_eq!((batch, looked.get()), (vec![3], 16));
        let mut batch = Vec::new();
        ring.scan(
            8,
            2,
            t0 + Duration::from_secs(30),
            refresh,
            &mut batch,
            state,
        );
        assert_eq!((batch, looked.get()), (vec![3], 24));

        // Buckets falling due one after another (reads spread over time): at most
        // `PASSES_PER_REFRESH` passes a refresh period, not one per bucket.
        let spread = |b: u32| Some((t0 + Duration::from_millis(u64::from(b)), false));
        let mut ring = Ring::default();
        let mut passes = 0;
        let mut now = t0 + refresh;
        while now < t0 + refresh * 2 {
            let mut batch = Vec::new();
            passes += usize::from(ring.scan(8, 1, now, refresh, &mut batch, spread).is_some());
            now += Duration::from_millis(1);
        }
        assert!(passes <= PASSES_PER_REFRESH as usize + 1, "{passes} passes");
    }

    /// A trusted tier in complete mode over 8 buckets, no worker running.
    fn tier(window: Duration) -> Arc<LocalTier> {
        let t = LocalTier::new(8, settings(64 << 20, window), true);
        t.resynced();
        t.mode.store(Mode::Complete as u8, Ordering::Relaxed);
        t.index_for(Mode::Complete);
        t
    }

    /// A trusted tier in partial mode over 8 buckets with filters (10 bits an entry for
    /// buckets of ~4 entries), no worker running.
    fn filtered_tier(window: Duration) -> Arc<LocalTier> {
        let t = LocalTier::new(8, settings(64 << 20, window), true);
        t.resynced();
        t.mode.store(Mode::Partial as u8, Ordering::Relaxed);
        t.filters_for(Mode::Partial, 4.0);
        assert!(t.filter_bytes() > 0);
        t
    }

    /// Reads bucket 1 for its filter only, as the partial sweep does.
    fn read_filter(t: &LocalTier, pairs: Vec<(i64, u32)>) {
        let read = t.begin_read(&[1], HashSet::from([1]));
        t.finish_read(read, Ok(vec![pairs])).unwrap();
    }

    fn key(field: i64) -> EntryKey {
        EntryKey { bucket: 1, field }
    }

    fn install(t: &LocalTier, pairs: Vec<(i64, u32)>) {
        let read = t.begin_read(&[1], HashSet::new());
        t.finish_read(read, Ok(vec![pairs])).unwrap();
    }

    /// The codes field `f` may show: from the write at `floor` on (the newest the instance must
    /// reflect), else its initial code or any write's.
    fn allowed_values(
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

    /// One event of an interleaving: a write lands in the store (its message pending), the
    /// oldest pending message is delivered, or the read starts / reads / is installed.
    #[derive(Debug, Clone, Copy)]
    enum Event {
        Write(i64, Option<u32>),
        Deliver,
    }

    fn events() -> impl Strategy<Value = Vec<Event>> {
        proptest::collection::vec(
            prop_oneof![
                (0i64..4, proptest::option::of(1u32..4))
                    .prop_map(|(f, c)| Event::Write(f, c.map(|c| LATER - c))),
                Just(Event::Deliver),
            ],
            0..24,
        )
    }

    proptest! {
        /// A bucket read while writes land, whatever the order of the read, the writes and
        /// their messages: once a write's message has arrived (and the read is installed), the
        /// answer for its field is never older than that write; once every message has
        /// arrived, the copy is exactly the store.
        #[test]
        fn a_read_racing_writes_never_installs_an_older_state(
            initial in proptest::collection::btree_map(0i64..4, 1u32..4, 0..4),
            held_before in any::<bool>(),
            filter_only in any::<bool>(),
            events in events(),
            marks in (0usize..=24, 0usize..=24, 0usize..=24),
        ) {
            // Complete mode with copies, or partial mode with a read for the filter only.
            let t = if filter_only { filtered_tier(Duration::ZERO) } else { tier(Duration::ZERO) };
            let mut store: BTreeMap<i64, u32> =
                initial.iter().map(|(f, c)| (*f, LATER - c)).collect();
            if held_before {
                install(&t, store.iter().map(|(f, c)| (*f, *c)).collect());
            }
            let n = events.len();
            let mut m = [marks.0.min(n), marks.1.min(n), marks.2.min(n)];
            m.sort_unstable();
            let (begin_at, read_at, install_at) = (m[0], m[1], m[2]);
            let mut writes: Vec<(i64, Option<u32>)> = Vec::new();
            let mut delivered = 0;
            let mut read = None;
            let mut snapshot = None;
            let mut installed = false;
            let check = |t: &LocalTier, store: &BTreeMap<i64, u32>, writes: &[(i64, Option<u32>)], delivered: usize| {
                for f in 0..4 {
                    let answer = match t.lookup(&key(f), Instant::now()) {
                        Lookup::Local(c) => c,
                        Lookup::Remote => store.get(&f).copied(),
                    };
                    // Values the field may show: the last delivered write's or any later one.
                    let last = writes[..delivered].iter().rposition(|(g, _)| *g == f);
                    let allowed = allowed_values(&initial, writes, f, last);
                    prop_assert!(allowed.contains(&answer), "field {f}: {answer:?} not in {allowed:?}");
                }
                Ok(())
            };
            for i in 0..=n {
                if i == begin_at {
                    let only = if filter_only { HashSet::from([1]) } else { HashSet::new() };
                    read = Some(t.begin_read(&[1], only));
                }
                if i == read_at {
                    snapshot = Some(store.iter().map(|(f, c)| (*f, *c)).collect::<Vec<_>>());
                }
                if i == install_at {
                    let r = read.take().expect("begun before");
                    t.finish_read(r, Ok(vec![snapshot.take().expect("read before")])).unwrap();
                    installed = true;
                }
                if installed {
                    check(&t, &store, &writes, delivered)?;
                }
                match events.get(i) {
                    Some(Event::Write(f, c)) => {
                        match c {
                            Some(c) => { store.insert(*f, *c); }
                            None => { store.remove(f); }
                        }
                        writes.push((*f, *c));
                    }
                    Some(Event::Deliver) if delivered < writes.len() => {
                        let (f, c) = writes[delivered];
                        t.apply(&[(key(f), c)], false);
                        delivered += 1;
                    }
                    _ => {}
                }
            }
            while delivered < writes.len() {
                let (f, c) = writes[delivered];
                t.apply(&[(key(f), c)], false);
                delivered += 1;
                check(&t, &store, &writes, delivered)?;
            }
            if filter_only && !held_before {
                prop_assert!(t.get(1).is_none(), "a filter-only read keeps no copy");
                let f = t.filters.load();
                let f = f.as_ref().unwrap();
                prop_assert!(f.stamp(1, t.generation()).is_some(), "usable");
                for field in store.keys() {
                    prop_assert!(f.may_hold(1, *field), "field {field} lost");
                }
            } else {
                let copy = t.get(1).expect("installed");
                prop_assert!(copy.dirty_since.is_none());
                prop_assert_eq!(copy.pairs().collect::<BTreeMap<_, _>>(), store);
            }
        }
    }

    #[test]
    fn an_acknowledged_upsert_is_applied_at_once_without_a_read() {
        let t = tier(Duration::from_secs(3));
        install(&t, vec![(5, LATER)]);
        let queued = |t: &LocalTier| t.queue.lock().unwrap().queued.contains(&1);
        // Acknowledged, nothing heard of the field meanwhile: local at once, nothing to read.
        let mark = t.write_mark();
        t.wrote_acked(&[(key(6), Some(LATER - 1))], mark);
        assert_eq!(
            t.lookup(&key(6), Instant::now()),
            Lookup::Local(Some(LATER - 1))
        );
        assert!(!queued(&t), "no read");
        // Its own message (the same code) changes nothing; another code (an older write's
        // message arriving late, or a later write) reads the bucket again.
        t.apply(&[(key(6), Some(LATER - 1))], true);
        assert!(t.get(1).unwrap().dirty_since.is_none() && !queued(&t));
        t.apply(&[(key(6), Some(LATER - 2))], true);
        assert_eq!(t.lookup(&key(6), Instant::now()), Lookup::Remote);
        assert!(queued(&t));
        install(&t, vec![(5, LATER), (6, LATER - 1)]);

        // A change of the field with another code heard between sending and the
        // acknowledgement: their order is unknown, so the bucket is read again.
        let mark = t.write_mark();
        t.apply(&[(key(7), Some(LATER - 2))], true);
        t.wrote_acked(&[(key(7), Some(LATER - 3))], mark);
        assert_eq!(t.lookup(&key(7), Instant::now()), Lookup::Remote);
        install(&t, vec![(5, LATER), (6, LATER - 1), (7, LATER - 3)]);

        // A new generation since the write was sent (messages may have been lost).
        let mark = t.write_mark();
        t.invalidate_all();
        install(&t, vec![(5, LATER)]);
        t.wrote_acked(&[(key(8), Some(LATER))], mark);
        assert_eq!(t.lookup(&key(8), Instant::now()), Lookup::Remote);
        // No conflict window to watch later messages in: read again as before.
        let t = tier(Duration::ZERO);
        install(&t, vec![(5, LATER)]);
        let mark = t.write_mark();
        t.wrote_acked(&[(key(6), Some(LATER))], mark);
        assert_eq!(t.lookup(&key(6), Instant::now()), Lookup::Remote);
    }

    /// One event of an interleaving with this instance writing too: another instance's
    /// write lands (its message pending), this instance's lands (the same, its mark taken
    /// before), the oldest unacknowledged own write is acknowledged, or the oldest pending
    /// message is delivered.
    #[derive(Debug, Clone, Copy)]
    enum Step {
        Other(i64, Option<u32>),
        Own(i64, u32),
        Ack,
        Deliver,
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        proptest::collection::vec(
            prop_oneof![
                (0i64..3, proptest::option::of(1u32..4))
                    .prop_map(|(f, c)| Step::Other(f, c.map(|c| LATER - c))),
                (0i64..3, 1u32..4).prop_map(|(f, c)| Step::Own(f, LATER - c)),
                Just(Step::Ack),
                Just(Step::Deliver),
            ],
            0..28,
        )
    }

    proptest! {
        /// This instance's acknowledged upserts are applied at once (`wrote_acked`): whatever
        /// the order of its writes, other instances' writes, the acknowledgements and the
        /// messages, and a read racing them, once an own write is acknowledged the field never
        /// shows an older state than that write (read-your-writes), nor than the last write
        /// whose message arrived; once everything arrived and what was marked dirty is read
        /// again, the copy is exactly the store.
        #[test]
        fn the_writer_sees_its_acknowledged_upserts_and_never_an_older_state(
            initial in proptest::collection::btree_map(0i64..3, 1u32..4, 0..3),
            steps in steps(),
            marks in (0usize..=28, 0usize..=28, 0usize..=28),
        ) {
            let t = tier(Duration::from_secs(3));
            let mut store: BTreeMap<i64, u32> =
                initial.iter().map(|(f, c)| (*f, LATER - c)).collect();
            install(&t, store.iter().map(|(f, c)| (*f, *c)).collect());
            let n = steps.len();
            let mut m = [marks.0.min(n), marks.1.min(n), marks.2.min(n)];
            m.sort_unstable();
            let (begin_at, read_at, install_at) = (m[0], m[1], m[2]);
            // Every write in the order it landed; own writes waiting for their
            // acknowledgement (index, field, code, mark); the newest acknowledged own write
            // of each field.
            let mut writes: Vec<(i64, Option<u32>)> = Vec::new();
            let mut unacked: VecDeque<(usize, i64, u32, WriteMark)> = VecDeque::new();
            let mut acked: HashMap<i64, usize> = HashMap::new();
            let mut delivered = 0;
            let (mut read, mut snapshot) = (None, None);
            let check = |t: &LocalTier, store: &BTreeMap<i64, u32>, writes: &[(i64, Option<u32>)], delivered: usize, acked: &HashMap<i64, usize>| {
                for f in 0..3 {
                    let answer = match t.lookup(&key(f), Instant::now()) {
                        Lookup::Local(c) => c,
                        Lookup::Remote => store.get(&f).copied(),
                    };
                    let heard = writes[..delivered].iter().rposition(|(g, _)| *g == f);
                    let floor = heard.max(acked.get(&f).copied());
                    let allowed = allowed_values(&initial, writes, f, floor);
                    prop_assert!(allowed.contains(&answer), "field {f}: {answer:?} not in {allowed:?}");
                }
                Ok(())
            };
            let deliver = |t: &LocalTier, (f, c): (i64, Option<u32>)| {
                // Upserts publish inside their transaction; a delete's message follows it.
                t.apply(&[(key(f), c)], c.is_some());
            };
            for i in 0..=n {
                if i == begin_at {
                    read = Some(t.begin_read(&[1], HashSet::new()));
                }
                if i == read_at {
                    snapshot = Some(store.iter().map(|(f, c)| (*f, *c)).collect::<Vec<_>>());
                }
                if i == install_at {
                    let r = read.take().expect("begun before");
                    t.finish_read(r, Ok(vec![snapshot.take().expect("read before")])).unwrap();
                }
                check(&t, &store, &writes, delivered, &acked)?;
                match steps.get(i) {
                    Some(Step::Other(f, c)) => {
                        match c {
                            Some(c) => { store.insert(*f, *c); }
                            None => { store.remove(f); }
                        }
                        writes.push((*f, *c));
                    }
                    Some(Step::Own(f, c)) => {
                        let mark = t.write_mark();
                        store.insert(*f, *c);
                        writes.push((*f, Some(*c)));
                        unacked.push_back((writes.len() - 1, *f, *c, mark));
                    }
                    Some(Step::Ack) => {
                        if let Some((j, f, c, mark)) = unacked.pop_front() {
                            t.wrote_acked(&[(key(f), Some(c))], mark);
                            let newest = acked.entry(f).or_insert(j);
                            *newest = (*newest).max(j);
                        }
                    }
                    Some(Step::Deliver) if delivered < writes.len() => {
                        deliver(&t, writes[delivered]);
                        delivered += 1;
                    }
                    _ => {}
                }
            }
            while let Some((j, f, c, mark)) = unacked.pop_front() {
                t.wrote_acked(&[(key(f), Some(c))], mark);
                acked.insert(f, acked.get(&f).copied().unwrap_or(j).max(j));
                check(&t, &store, &writes, delivered, &acked)?;
            }
            while delivered < writes.len() {
                deliver(&t, writes[delivered]);
                delivered += 1;
                check(&t, &store, &writes, delivered, &acked)?;
            }
            // What was marked dirty is read again, as the worker does.
            if t.get(1).expect("installed").dirty_since.is_some() {
                install(&t, store.iter().map(|(f, c)| (*f, *c)).collect());
            }
            let copy = t.get(1).expect("installed");
            prop_assert!(copy.dirty_since.is_none());
            prop_assert_eq!(copy.pairs().collect::<BTreeMap<_, _>>(), store);
        }
    }

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
            let q = t.queue.lock().unwrap();
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

    #[test]
    fn a_copy_wanted_while_its_filter_is_read_is_kept_by_that_read() {
        let t = filtered_tier(Duration::from_secs(3));
        // The sweep reads bucket 1 for its filter; meanwhile it turns hot and is read for a
        // copy, which finds that read in flight and is skipped.
        let sweep = t.begin_read(&[1], HashSet::from([1]));
        let hot = t.begin_read(&[1], HashSet::new());
        assert!(hot.buckets.is_empty(), "already being read");
        t.finish_read(sweep, Ok(vec![vec![(5, LATER)]])).unwrap();
        assert!(t.get(1).is_some(), "the filter's read keeps the copy");
        assert_eq!(
            t.lookup(&key(5), Instant::now()),
            Lookup::Local(Some(LATER))
        );

        // Another filter-only read in flight changes nothing of that.
        t.copies.as_ref().unwrap().invalidate_all();
        let sweep = t.begin_read(&[1], HashSet::from([1]));
        assert!(t.begin_read(&[1], HashSet::from([1])).buckets.is_empty());
        t.finish_read(sweep, Ok(vec![vec![(5, LATER)]])).unwrap();
        assert!(t.get(1).is_none(), "no copy wanted, none kept");
    }

    #[test]
    fn filters_take_their_room_out_of_the_copies_budget() {
        // 1,000 buckets of 200 entries (2.6 KB a copy): 150 KB holds ~55 copies, or filters
        // of every bucket at 4.8 bits an entry and ~5 copies.
        let budget = 150_000;
        let t = LocalTier::new(1_000, settings(budget, Duration::ZERO), true);
        t.resynced();
        t.mode.store(Mode::Partial as u8, Ordering::Relaxed);
        // Copies first, filling the whole budget; then filters: the copies held go rather
        // than stay weighed as if the filters took nothing.
        read_full_buckets(&t, 100);
        assert!(t.held_stats().0 > 0);
        t.filters_for(Mode::Partial, 200.0);
        // At once, not at the cache's next maintenance: none weighed at the old scale stays.
        assert_eq!(t.held.bytes.load(Ordering::Relaxed), 0);
        assert_eq!(t.copies.as_ref().unwrap().iter().count(), 0);
        let (held, bytes) = t.held_stats();
        assert!(
            bytes <= budget,
            "{bytes} bytes with {held} copies and the filters"
        );
        let fb = t.filter_bytes();
        assert!(fb > 0 && fb as f64 <= FILTER_SHARE * budget as f64, "{fb}");
        read_full_buckets(&t, 200);
        let (held, bytes) = t.held_stats();
        assert!(bytes <= budget, "{bytes} bytes with {held} copies");
        // Complete again: no filters, the whole budget for copies.
        t.filters_for(Mode::Complete, 0.0);
        assert_eq!(t.filter_bytes(), 0);
        assert_eq!(t.held.scale.load(Ordering::Relaxed), SCALE_ONE);
    }

    #[test]
    fn changes_of_unknown_value_and_conflicts_send_the_bucket_to_the_store() {
        let t = tier(Duration::from_secs(3));
        install(&t, vec![(5, LATER)]);
        assert_eq!(
            t.lookup(&key(5), Instant::now()),
            Lookup::Local(Some(LATER))
        );

        // One change: applied in place, still answered locally.
        t.apply(&[(key(6), Some(LATER - 1))], false);
        assert_eq!(
            t.lookup(&key(6), Instant::now()),
            Lookup::Local(Some(LATER - 1))
        );
        assert!(
            t.queue.lock().unwrap().queued.is_empty(),
            "nothing to read again"
        );

        // Again, atomically with its write: it cannot have overtaken another write.
        t.apply(&[(key(6), Some(LATER - 2))], true);
        assert_eq!(
            t.lookup(&key(6), Instant::now()),
            Lookup::Local(Some(LATER - 2))
        );
        assert!(t.queue.lock().unwrap().queued.is_empty());

        // The same field again within the window, not atomically: the two messages may be out
        // of order.
        t.apply(&[(key(6), None)], false);
        assert_eq!(t.lookup(&key(6), Instant::now()), Lookup::Remote);
        assert_eq!(
            t.lookup(&key(5), Instant::now()),
            Lookup::Remote,
            "the whole bucket"
        );
        assert!(
            t.queue.lock().unwrap().queued.contains(&1),
            "queued to be read again"
        );
        let (code, _) = t.held(&key(5), Instant::now()).expect("kept for fail-open");
        assert_eq!(code, Some(LATER));

        // Read again: current again.
        t.queue.lock().unwrap().queued.clear();
        install(&t, vec![(5, LATER)]);
        assert_eq!(t.lookup(&key(6), Instant::now()), Lookup::Local(None));

        // An older writer's message: which fields, not their values.
        t.changed_unknown(&[key(7)]);
        assert_eq!(t.lookup(&key(5), Instant::now()), Lookup::Remote);
        // A read in flight when it arrives installs its result dirty.
        t.queue.lock().unwrap().queued.clear();
        let read = t.begin_read(&[1], HashSet::new());
        t.changed_unknown(&[key(7)]);
        t.finish_read(read, Ok(vec![vec![(5, LATER)]])).unwrap();
        assert_eq!(t.lookup(&key(5), Instant::now()), Lookup::Remote);
        assert!(t.queue.lock().unwrap().queued.contains(&1));
    }

    #[test]
    fn a_lost_subscription_keeps_copies_for_fail_open_only() {
        let t = tier(Duration::ZERO);
        install(&t, vec![(5, 0)]);
        let now = Instant::now();
        assert_eq!(
            t.held(&key(5), now).map(|(_, at)| at),
            Some(now),
            "in sync now"
        );

        t.lost_sync();
        let broke = Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        let now = Instant::now();
        assert_eq!(t.lookup(&key(5), now), Lookup::Remote, "untrusted");
        let (code, at) = t.held(&key(5), now).unwrap();
        assert_eq!(code, Some(0));
        assert!(at <= broke && now.duration_since(at) >= Duration::from_millis(20));
        assert_eq!(t.synced(now), Some(at));

        // Back: a new generation; the old copy is stale until read again, and stays as stale
        // as when the subscription broke.
        t.resynced();
        let now = Instant::now();
        assert_eq!(t.lookup(&key(5), now), Lookup::Remote);
        assert_eq!(t.held(&key(5), now).map(|(_, a)| a), Some(at));
        assert_eq!(t.synced(now), Some(now));
        install(&t, vec![(5, 0)]);
        assert_eq!(t.lookup(&key(5), Instant::now()), Lookup::Local(Some(0)));
    }

    #[test]
    fn copies_older_than_the_ttl_are_not_used() {
        let t = LocalTier::new(8, settings(1 << 20, Duration::ZERO), true);
        t.resynced();
        install(&t, vec![(5, 0)]);
        let later = Instant::now() + Duration::from_secs(61);
        assert_eq!(t.lookup(&key(5), later), Lookup::Remote);
        assert!(t.due(
            1,
            t.get(1).as_deref(),
            Instant::now() + Duration::from_secs(30)
        ));
    }

    /// With proofs of delivery a copy answers past the TTL (the feed, not the age, keeps it in
    /// sync), and falls due for the safety net's re-read between one and two of its periods
    /// (`buckets / refresh_rate`, at least `ttl / 2`).
    #[test]
    fn with_proofs_of_delivery_copies_outlive_the_ttl_until_the_safety_net_reads_them() {
        let mut s = settings(1 << 20, Duration::ZERO);
        s.ttl = Duration::from_secs(1);
        s.refresh_rate = 2; // 8 buckets: a period of 4 s
        let t = LocalTier::new(8, s, true);
        let start = Instant::now();
        t.clock(true, start);
        t.resynced();
        install(&t, vec![(5, 0)]);
        assert_eq!(t.refresh_period(), Duration::from_secs(4));
        let later = Instant::now() + Duration::from_secs(3);
        t.proven(later);
        assert_eq!(t.lookup(&key(5), later), Lookup::Local(Some(0)));
        assert_eq!(t.lookup(&key(6), later), Lookup::Local(None));
        assert!(!t.due(1, t.get(1).as_deref(), later));
        let past = Instant::now() + Duration::from_secs(8);
        assert!(t.due(1, t.get(1).as_deref(), past));
        // A proof too old: not current, whatever the copy's age.
        assert_eq!(t.lookup(&key(5), later + LIVE_BOUND * 2), Lookup::Remote);
        // The share per bucket spreads the buckets over [period, 2 periods).
        let afters: Vec<Duration> = (0..8).map(|b| t.refresh_after(b)).collect();
        assert!(
            afters
                .iter()
                .all(|a| *a >= Duration::from_secs(4) && *a <= Duration::from_secs(8))
        );
        assert!(
            afters.iter().collect::<HashSet<_>>().len() > 4,
            "{afters:?}"
        );
    }

    /// Reads buckets `0..n`, 200 entries each (field `b * 1,000 + i`), through the tier.
    fn read_full_buckets(t: &LocalTier, n: u32) {
        for b in 0..n {
            let read = t.begin_read(&[b], HashSet::new());
            let pairs = (0..200)
                .map(|i| (i64::from(b) * 1_000 + i, LATER))
                .collect();
            t.finish_read(read, Ok(vec![pairs])).unwrap();
        }
    }

    #[test]
    fn memory_stays_within_the_budget() {
        let budget = 64 * 1024;
        let t = LocalTier::new(1_000, settings(budget, Duration::ZERO), true);
        t.resynced();
        read_full_buckets(&t, 200);
        let (held, bytes) = t.held_stats();
        let copies = t.copies.as_ref().unwrap();
        assert!(
            copies.weighted_size() <= budget,
            "{}",
            copies.weighted_size()
        );
        assert!(bytes <= budget, "{bytes} bytes held");
        assert!(held > 0 && held < 200, "{held} copies held");

        // A bucket cap makes every copy weigh at least budget / cap.
        let mut capped = settings(budget, Duration::ZERO);
        capped.max_buckets = 3;
        let t = LocalTier::new(1_000, capped, true);
        t.resynced();
        for b in 0..20u32 {
            let read = t.begin_read(&[b], HashSet::new());
            t.finish_read(read, Ok(vec![vec![(1, 0)]])).unwrap();
        }
        assert!(t.held_stats().0 <= 3);
    }

    /// Complete mode is chosen at the index's cost per copy, not the cache's: 100 buckets of
    /// 200 entries with 32-bit codes take 100 x (2,400 + 480) B in the index, 100 x (2,400 +
    /// 640) B in the cache.
    #[test]
    fn complete_mode_is_chosen_at_what_the_index_costs() {
        let mean = (2_400 + copy::COPY_OVERHEAD) as f64;
        for (budget, want) in [(330_000, Mode::Complete), (310_000, Mode::Partial)] {
            let t = LocalTier::new(100, settings(budget, Duration::ZERO), true);
            t.resynced();
            t.choose(mean, 200.0);
            assert_eq!(t.mode(), want, "budget {budget}");
        }
    }

    /// A copy is in the index (complete mode) or the cache (partial mode), never both, and
    /// the counts say exactly what each holds. Returns (indexed, cached).
    fn assert_copies_in_one_place(t: &LocalTier) -> (usize, usize) {
        let (index, copies) = (t.index.as_ref().unwrap(), t.copies.as_ref().unwrap());
        copies.run_pending_tasks();
        let indexed: Vec<Arc<BucketCopy>> = index
            .slots
            .iter()
            .filter_map(|slot| (*slot.load()).clone())
            .collect();
        let cached: Vec<Arc<BucketCopy>> = copies.iter().map(|(_, c)| c).collect();
        if index.is_on() {
            assert!(
                cached.is_empty(),
                "{} copies cached in complete mode",
                cached.len()
            );
        } else {
            assert!(
                indexed.is_empty(),
                "{} copies indexed in partial mode",
                indexed.len()
            );
        }
        let in_index: usize = indexed.iter().map(|c| c.indexed_bytes()).sum();
        let in_cache: usize = cached.iter().map(|c| c.bytes()).sum();
        assert_eq!(index.held.load(Ordering::Relaxed), indexed.len() as i64);
        assert_eq!(index.bytes.load(Ordering::Relaxed), in_index as i64);
        assert_eq!(
            t.held.bytes.load(Ordering::Relaxed),
            (in_index + in_cache) as i64
        );
        (indexed.len(), cached.len())
    }

    /// Reads of different buckets install their copies at once (the worker's batches, changes
    /// heard, the preload): together they never take the index past its budget.
    #[test]
    fn concurrent_installs_never_take_the_index_past_its_budget() {
        let budget = 160 * 1024;
        let t = LocalTier::new(200, settings(budget, Duration::ZERO), true);
        t.resynced();
        t.mode.store(Mode::Complete as u8, Ordering::Relaxed);
        t.index_for(Mode::Complete);
        let limit = t.copies_budget as i64;
        let index = t.index.as_ref().unwrap();
        let most = AtomicI64::new(0);
        std::thread::scope(|s| {
            for thread in 0..8u32 {
                let (t, most) = (&t, &most);
                s.spawn(move || {
                    for round in 0..40u32 {
                        // Each thread its own buckets, each read growing or shrinking.
                        for b in (thread..200).step_by(8) {
                            let entries = 50 + i64::from((round * 37 + b) % 300);
                            let pairs = (0..entries).map(|i| (i64::from(b) * 1_000 + i, LATER));
                            let read = t.begin_read(&[b], HashSet::new());
                            t.finish_read(read, Ok(vec![pairs.collect()])).unwrap();
                            most.fetch_max(index.bytes.load(Ordering::Relaxed), Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        let most = most.into_inner();
        assert!(most <= limit, "{most} bytes indexed, budget {limit}");
        assert!(
            t.overflowed.load(Ordering::Relaxed),
            "the reads did not all fit"
        );
        assert_copies_in_one_place(&t);
    }

    #[test]
    fn a_complete_tier_keeps_its_copies_in_the_index_alone_within_the_budget() {
        // 200 buckets could be complete (each weighs at least `COPY_OVERHEAD`), so there is an
        // index.
        let budget = 160 * 1024;
        let t = LocalTier::new(200, settings(budget, Duration::ZERO), true);
        t.resynced();
        t.mode.store(Mode::Complete as u8, Ordering::Relaxed);
        t.index_for(Mode::Complete);
        // Far more than the budget holds: what does not fit is not kept, and the worker is
        // told to turn partial.
        read_full_buckets(&t, 200);
        let (indexed, _) = assert_copies_in_one_place(&t);
        assert!(indexed > 0 && indexed < 200, "{indexed} indexed");
        assert!(t.overflowed.load(Ordering::Relaxed));
        // The index's own bytes come out of the copies' budget.
        let index_bytes = 200 * 8;
        let (_, bytes) = t.held_stats();
        assert!(bytes <= budget - index_bytes, "{bytes} bytes held");
        // A keyspace that could never be complete gets no index.
        assert!(
            LocalTier::new(1_000, settings(budget, Duration::ZERO), true)
                .index
                .is_none()
        );
        // A change replaces the indexed copy.
        let held = (0..200u32)
            .find(|b| t.get(*b).is_some())
            .expect("something held");
        let key = EntryKey {
            bucket: held,
            field: i64::from(held) * 1_000 + 7,
        };
        assert_eq!(t.lookup(&key, Instant::now()), Lookup::Local(Some(LATER)));
        t.apply(&[(key, None)], true);
        assert_eq!(t.lookup(&key, Instant::now()), Lookup::Local(None));
        assert_copies_in_one_place(&t);

        // Partial: the copies go to the cache (which keeps what its budget admits), and every
        // one it kept answers as it did.
        t.mode.store(Mode::Partial as u8, Ordering::Relaxed);
        t.index_for(Mode::Partial);
        let (_, cached) = assert_copies_in_one_place(&t);
        assert!(cached > 0);
        assert!(t.copies.as_ref().unwrap().weighted_size() <= budget - index_bytes);
        if t.get(held).is_some() {
            assert_eq!(t.lookup(&key, Instant::now()), Lookup::Local(None));
        }
        // A copy installed while partial is in the cache only; complete again, the cache is
        // emptied and the bucket read again into the index.
        let read = t.begin_read(&[held], HashSet::new());
        t.finish_read(read, Ok(vec![vec![(key.field, 0)]])).unwrap();
        assert_eq!(t.lookup(&key, Instant::now()), Lookup::Local(Some(0)));
        t.mode.store(Mode::Complete as u8, Ordering::Relaxed);
        t.index_for(Mode::Complete);
        // Released at once, not at the cache's next maintenance: until then the tier would
        // count itself loaded (`is_complete`) with an empty index.
        assert_eq!(t.held.bytes.load(Ordering::Relaxed), 0);
        assert_eq!(t.held.current(), 0);
        assert_eq!(assert_copies_in_one_place(&t), (0, 0));
        assert_eq!(t.lookup(&key, Instant::now()), Lookup::Remote);
        let read = t.begin_read(&[held], HashSet::new());
        t.finish_read(read, Ok(vec![vec![(key.field, 0)]])).unwrap();
        assert_eq!(assert_copies_in_one_place(&t), (1, 0));
        assert_eq!(t.lookup(&key, Instant::now()), Lookup::Local(Some(0)));
    }

    fn instrumented(store: &Arc<MemoryStore>) -> Instrumented<dyn EntryStore> {
        Instrumented::new(store.clone(), Arc::new(crate::metrics::Metrics::new()))
    }

    /// The tier's background worker over `store`, on the test's runtime.
    fn spawn_worker(t: &Arc<LocalTier>, store: &Arc<MemoryStore>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(
            t.clone()
                .run(instrumented(store), Arc::new(TierGauges::new())),
        )
    }

    fn memory_store() -> Arc<MemoryStore> {
        let key = FingerprintKey::generate("test").unwrap();
        Arc::new(MemoryStore::open(Layout::new("c:", 16, Hashing::Keyed(key)), 10, None).unwrap())
    }

    async fn fill(store: &MemoryStore, per_bucket: i64) {
        let entries = (0..16u32)
            .flat_map(|b| {
                (0..per_bucket).map(move |f| {
                    (
                        EntryKey {
                            bucket: b,
                            field: f,
                        },
                        0,
                    )
                })
            })
            .collect();
        store
            .write(
                WriteBatch {
                    entries,
                    ..WriteBatch::default()
                },
                Deadline::after(Duration::from_secs(5)),
            )
            .await
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_worker_loads_every_bucket_when_they_fit() {
        let store = memory_store();
        fill(&store, 50).await;
        let t = LocalTier::new(16, settings(1 << 20, Duration::ZERO), true);
        let worker = spawn_worker(&t, &store);
        t.resynced();
        assert!(t.wait_settled(Duration::from_secs(5)).await);
        assert_eq!(t.mode(), Mode::Complete);
        for b in 0..16 {
            let k = EntryKey {
                bucket: b,
                field: 49,
            };
            assert_eq!(t.lookup(&k, Instant::now()), Lookup::Local(Some(0)));
            let k = EntryKey {
                bucket: b,
                field: 50,
            };
            assert_eq!(t.lookup(&k, Instant::now()), Lookup::Local(None));
        }
        // A bulk write makes every copy stale; the worker reads them all again. (Stopped
        // meanwhile: over a memory store it would read bucket 3 before the lookup below.)
        worker.abort();
        let _ = worker.await;
        t.invalidate_all();
        assert_eq!(
            t.lookup(
                &EntryKey {
                    bucket: 3,
                    field: 1
                },
                Instant::now()
            ),
            Lookup::Remote
        );
        let worker = spawn_worker(&t, &store);
        assert!(t.wait_settled(Duration::from_secs(5)).await);
        worker.abort();
    }

    /// The keyspace grows past a complete tier's budget between two `reconsider`s: the
    /// copies that do not fit are not kept, the tier turns partial at once, and memory and
    /// answers stay right throughout.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_keyspace_outgrowing_a_complete_tier_turns_it_partial() {
        let store = memory_store();
        fill(&store, 50).await;
        // 16 buckets of 50 entries: 16 x (640 + 600) B = 19.8 KB, within 90 % of 24 KB.
        let budget = 24_000;
        let t = LocalTier::new(16, settings(budget, Duration::ZERO), true);
        let worker = spawn_worker(&t, &store);
        t.resynced();
        assert!(t.wait_settled(Duration::from_secs(5)).await);
        assert_eq!(t.mode(), Mode::Complete);
        // Ten times the entries, then a new generation (as a bulk import makes).
        fill(&store, 500).await;
        t.invalidate_all();
        let started = Instant::now();
        while t.mode() != Mode::Partial {
            assert!(started.elapsed() < Duration::from_secs(5), "still complete");
            let (_, bytes) = t.held_stats();
            assert!(bytes <= budget, "{bytes} bytes held");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (held, bytes) = t.held_stats();
        assert!(held > 0 && bytes <= budget, "{held} copies, {bytes} bytes");
        for b in 0..16 {
            let key = EntryKey {
                bucket: b,
                field: 499,
            };
            let got = t.lookup(&key, Instant::now());
            assert!(
                matches!(got, Lookup::Local(Some(0)) | Lookup::Remote),
                "{got:?}"
            );
        }
        worker.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_keyspace_larger_than_the_budget_is_held_in_part() {
        let store = memory_store();
        fill(&store, 100).await;
        // 16 buckets of ~1.4 KB: room for about 4.
        let t = LocalTier::new(16, settings(6_000, Duration::ZERO), true);
        let worker = spawn_worker(&t, &store);
        t.resynced();
        assert!(t.wait_settled(Duration::from_secs(5)).await);
        assert_eq!(t.mode(), Mode::Partial);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (held, bytes) = t.held_stats();
        assert!(
            (1..16).contains(&held) && bytes <= 6_000,
            "{held} copies, {bytes} bytes"
        );
        // Filters of every bucket: present fields are never "absent", most absent ones are.
        assert!(t.filter_bytes() > 0);
        let now = Instant::now();
        let mut answered = 0;
        for bucket in 0..16 {
            for field in 0..100 {
                let k = EntryKey { bucket, field };
                assert_ne!(t.lookup(&k, now), Lookup::Local(None), "{k:?}");
            }
            for field in 1_000..1_100 {
                let k = EntryKey { bucket, field };
                answered += usize::from(t.lookup(&k, now) == Lookup::Local(None));
            }
        }
        assert!(
            answered > 1_500,
            "{answered} of 1,600 absent fields answered locally"
        );
        worker.abort();
    }
}
