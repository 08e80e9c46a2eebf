//! How the tier holds the keyspace (`Mode`): sized up from a sample of buckets, complete when
//! every bucket fits the budget, else partial, with filters of every bucket (`filter`) and hot
//! buckets read whole (`sketch`, the `hot_reads` lock); reconsidered as the keyspace grows or
//! shrinks.
//!
//! **Modes.** At start-up the worker reads a sample of buckets to measure their mean size.
//! If all N buckets fit the budget, the tier is *complete*: the worker loads every bucket in
//! the background (pipelined, paced at `fetch_rate` buckets/s, resumed where it stopped
//! after a store error) and then answers every lookup locally. Otherwise it is *partial*: it
//! keeps a Bloom filter of every bucket's fields (`filter`, 4-10 bits an entry, up to
//! `FILTER_SHARE` of the budget; the cache's weigher charges copies for that room), read by
//! the worker like a copy (every bucket, again by the safety net below, not kept as a copy), so a
//! lookup of a value on no list is answered locally whatever its bucket (87-99 % of them).
//! In the rest of the budget it preloads copies until 90 % full, then fetches a bucket only
//! when the sketch (`sketch`) says it is touched far more than the average bucket (at most
//! once per `ttl / 2` each), and moka's TinyLFU keeps the hottest. Every other lookup (the
//! listed values, and the filters' false positives) goes to the store per key (`HGET`), on
//! the caller's path as before; a whole bucket is never fetched on a caller's path. Why: a
//! bucket read costs Redis ~9 `HGET`s (`dump`), and with uniform traffic a bucket fetched
//! into a tier holding a fraction c of the keyspace serves c/(1-c) lookups before it is
//! evicted: at 20x the budget, 0.05; a filter read every `ttl / 2` serves every absent
//! lookup in its bucket meanwhile. (docs/design/tier.md and docs/performance.md have the measurements.)

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::copy::{self, BucketCopy};
use super::holding::SCALE_ONE;
use super::lock::{Rank, Ranked};
use super::{LocalTier, Mode, filter};
use crate::instrumented::Instrumented;
use crate::store::{EntryStore, StoreError};

/// Buckets read to measure their mean size before choosing the mode.
pub(super) const SAMPLE: u32 = 64;

/// Complete mode needs the projected size within this share of the budget (room to grow).
pub(super) const COMPLETE_SHARE: f64 = 0.9;

/// Partial mode's filters take at most this share of the budget (at most
/// `filter::MAX_BITS_PER_ENTRY`); the copies get the rest.
pub(super) const FILTER_SHARE: f64 = 0.9;

/// Hot buckets read lately, and when (under the `hot` lock; see `LocalTier::heat_due`).
pub(super) struct HotReads(Ranked<HashMap<u32, Instant>>);

impl HotReads {
    pub(super) fn new() -> Self {
        Self(Ranked::new(Rank::HotReads, HashMap::new()))
    }

    /// Whether `bucket` was not read as hot within `cooldown`; if so, it is from `now`.
    fn due(&self, bucket: u32, now: Instant, cooldown: Duration) -> bool {
        let mut hot = self.0.lock();
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
}

impl LocalTier {
    /// Whether a hot bucket may be read now: at most once per `ttl / 2` each, so that one
    /// the cache declines to admit (the budget full of hotter ones) is not read over and over.
    pub(super) fn heat_due(&self, bucket: u32, now: Instant) -> bool {
        self.hot_reads.due(bucket, now, self.settings.ttl / 2)
    }

    /// Reads a sample of buckets, installs them, and chooses complete or partial mode from
    /// their mean size.
    pub(super) async fn size_up(
        &self,
        store: &Instrumented<dyn EntryStore>,
    ) -> Result<(), StoreError> {
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
    pub(super) fn choose(&self, mean: f64, entries: f64) {
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
    pub(super) fn set_mode(&self, mode: Mode, mean: f64, entries: f64, projected: f64) {
        let s = &self.settings;
        // Complete is published only once the copies are in the index (below): `is_complete`
        // (and so `wait_settled`) must never count copies on their way there as loaded. Any
        // other mode at once, as the index stops taking copies before they leave it.
        let previous = if mode == Mode::Complete {
            self.mode()
        } else {
            Mode::from_u8(self.mode.swap(mode as u8, Ordering::AcqRel))
        };
        if previous != mode || (mode == Mode::Partial && self.filters_outgrown(entries)) {
            // Filters first: copies the index hands to the cache are then weighed with the
            // filters' room already charged.
            self.filters_for(mode, entries);
            if previous != mode {
                self.index_for(mode);
            }
            if mode == Mode::Complete {
                self.mode.store(mode as u8, Ordering::Release);
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

    /// Entries a bucket of `mean_bytes` holds at least (a copy's bytes less its overhead, at
    /// most 12 an entry): where only bytes are known.
    pub(super) fn entries_in(mean_bytes: f64) -> f64 {
        (mean_bytes - copy::COPY_OVERHEAD as f64) / 12.0
    }

    /// Whether buckets of `entries` want filters a quarter larger or smaller than those
    /// held (the keyspace grew or shrank since they were sized), or some where there are none.
    pub(super) fn filters_outgrown(&self, entries: f64) -> bool {
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
    pub(super) fn filters_for(&self, mode: Mode, entries: f64) {
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
        let _stripes = self.stripes.lock_all();
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

    /// Re-evaluates the mode from the buckets read since last time, or else the copies held
    /// (once enough are read or held to say).
    pub(super) fn reconsider(&self) {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier::testing::*;
    use std::time::Duration;

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
}
