//! What is held and where: copies of whole buckets (`copy`) in a moka cache weighted by their
//! bytes (partial mode) or in the complete tier's `Index`, within the memory budget, and the
//! counters of what they take (`Held`). No lock of its own: an install holds the bucket's
//! stripe lock (`coherence`), a move between cache and index every stripe lock.
//!
//! **Unit.** A bucket (~200 entries) is read whole (`EntryStore::get_buckets`) and kept as a
//! sorted copy (`copy`, 8 to 12 bytes an entry): every lookup that falls in it, hit or miss, is a
//! binary search. Copies live in an index by bucket number (complete mode, below) or a moka
//! cache weighted by their bytes (partial mode), capped at the memory budget (and at
//! `max_buckets` copies: each weighs at least `budget / max_buckets`), so memory stays
//! within the budget whatever the keyspace.
//!
//! **A complete tier keeps its copies in an index** by bucket number (`Index`), not in the
//! cache: a lookup loads one pointer, where a cache read also records itself for the
//! eviction policy (in a profile of the new-subject mix, moka's `get` and its bookkeeping
//! were ~15 % of the service's CPU), and a copy costs ~190 B less without the cache's
//! bookkeeping (`INDEXED_OVERHEAD`; 14.3 B against 15.7 B an entry resident at 10M
//! entries). Nothing is evicted from a complete tier, so it needs no policy; a copy that
//! would take it past the budget (the keyspace grew) is not kept and the worker turns the
//! tier partial at once (a copy's growth is reserved atomically, so copies installed at
//! once cannot pass the budget together). A partial tier keeps its copies in the cache, the index off and
//! empty; a mode change moves them under every stripe lock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use arc_swap::ArcSwapOption;

use super::copy::{self, BucketCopy};
use super::{LocalTier, Mode};

/// Fixed-point one for `Held::scale`.
pub(super) const SCALE_ONE: u64 = 1 << 16;

/// Counters shared with the cache's eviction listener.
#[derive(Default)]
pub(super) struct Held {
    /// Bytes of the copies held (`BucketCopy::bytes` in the cache, `indexed_bytes` in the
    /// index).
    pub(super) bytes: AtomicI64,
    /// Copies of the current generation held: the generation's low 32 bits (`Held::tag`),
    /// then the count, in one word, so that a copy counted as current just as its generation
    /// ends is wiped with it: `LocalTier::new_generation` resets the word before it publishes
    /// the new generation, and a copy of the old one no longer matches the tag.
    pub(super) current: AtomicU64,
    pub(super) generation: AtomicU64,
    /// What the weigher charges a copy per byte, in 1/65,536ths: above one while filters
    /// take part of the budget, so the cache (built before the filters are sized) holds
    /// copies of at most `budget − filter bytes`.
    pub(super) scale: AtomicU64,
    /// Buckets read and the entries they held, since the mode was last reconsidered.
    pub(super) read_buckets: AtomicU64,
    pub(super) read_entries: AtomicU64,
    /// And what their copies took (`BucketCopy::bytes`).
    pub(super) read_bytes: AtomicU64,
}

impl Held {
    const COUNT: u64 = 0xFFFF_FFFF;

    /// What the cache charges a copy of `bytes` (at least `min_weight`) under `scale`:
    /// rounded up, so that the copies held never take more than the cache's capacity over
    /// the scale. Rounded down, each copy could count up to a byte light and a few dozen
    /// copies passed the budget by as many bytes.
    pub(super) fn weight(bytes: u64, min_weight: u64, scale: u64) -> u32 {
        (u128::from(bytes.max(min_weight)) * u128::from(scale))
            .div_ceil(u128::from(SCALE_ONE))
            .min(u128::from(u32::MAX)) as u32
    }

    /// `current`'s word for `generation` with no copy counted.
    pub(super) fn tag(generation: u64) -> u64 {
        (generation & Self::COUNT) << 32
    }

    /// Copies of the current generation held.
    pub(super) fn current(&self) -> u64 {
        self.current.load(Ordering::Acquire) & Self::COUNT
    }

    /// Counts `copy` in (`up`) or out of `current` if it is of the generation counted.
    pub(super) fn count(&self, copy: &BucketCopy, up: bool) {
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
    pub(super) fn holding(&self, copy: &BucketCopy, bytes: usize) {
        self.bytes.fetch_add(bytes as i64, Ordering::Relaxed);
        self.count(copy, true);
    }

    /// A copy weighing `bytes` is no longer held.
    pub(super) fn released(&self, copy: &BucketCopy, bytes: usize) {
        self.bytes.fetch_sub(bytes as i64, Ordering::Relaxed);
        self.count(copy, false);
    }
}

/// Where a complete tier keeps its copies: a slot per bucket (8 bytes a bucket, taken from
/// the copies' budget; made only when the keyspace could be held complete, so at most
/// 8 / `INDEXED_OVERHEAD` = 1.7 % of the budget). On in complete mode, when the cache holds
/// nothing; off and empty in partial mode. A copy is in one of the two, never both.
pub(super) struct Index {
    pub(super) on: AtomicBool,
    pub(super) slots: Box<[ArcSwapOption<BucketCopy>]>,
    /// Slots set, and the bytes (`BucketCopy::indexed_bytes`) of their copies.
    pub(super) held: AtomicI64,
    pub(super) bytes: AtomicI64,
}

impl Index {
    pub(super) fn get(&self, bucket: u32) -> Option<arc_swap::Guard<Option<Arc<BucketCopy>>>> {
        if !self.is_on() {
            return None;
        }
        self.slots.get(bucket as usize).map(ArcSwapOption::load)
    }

    pub(super) fn is_on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// Sets `bucket`'s slot (`None` empties it) and returns what it held; the caller holds
    /// the bucket's stripe lock.
    pub(super) fn swap(
        &self,
        bucket: u32,
        copy: Option<Arc<BucketCopy>>,
    ) -> Option<Arc<BucketCopy>> {
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
    pub(super) fn put_within(
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

impl LocalTier {
    /// The index while it is on (complete mode).
    pub(super) fn index_on(&self) -> Option<&Index> {
        self.index.as_ref().filter(|i| i.is_on())
    }

    /// The copy held of `bucket`, wherever the mode keeps it.
    pub(super) fn get(&self, bucket: u32) -> Option<Arc<BucketCopy>> {
        match self.index_on() {
            Some(index) => index.get(bucket).and_then(|slot| (*slot).clone()),
            None => self.copies.as_ref()?.get(&bucket),
        }
    }

    /// Installs a copy (the caller holds the bucket's stripe lock).
    pub(super) fn put(&self, bucket: u32, copy: BucketCopy) {
        self.put_arc(bucket, Arc::new(copy));
    }

    /// Installs a copy: in the index in complete mode, else in the cache. A copy that would
    /// take the index past the copies' budget (the keyspace outgrew a complete copy) is not
    /// kept, nor is the older one it replaces: that bucket is answered by the store until the
    /// worker turns the tier partial (`overflowed`). The caller holds the bucket's stripe
    /// lock, or every stripe lock.
    pub(super) fn put_arc(&self, bucket: u32, copy: Arc<BucketCopy>) {
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
                self.queue.wake();
                index.swap(bucket, None)
            }
        };
        if let Some(old) = old {
            self.held.released(&old, old.indexed_bytes());
        }
    }

    /// Copies held, in the cache and the index.
    pub(super) fn count(&self) -> u64 {
        let Some(copies) = &self.copies else { return 0 };
        let indexed = self
            .index
            .as_ref()
            .map_or(0, |i| i.held.load(Ordering::Relaxed).max(0) as u64);
        copies.entry_count() + indexed
    }

    /// Moves the copies where `mode` keeps them, under every stripe lock (so no `put`, which
    /// holds one, sees the flag and the copies disagree). Complete: the index turns on and
    /// the cache's copies move into it. Partial: the index turns off
    /// and its copies go to the cache, which keeps what its budget admits. Meanwhile a
    /// lookup finding nothing goes to the store.
    pub(super) fn index_for(&self, mode: Mode) {
        let (Some(index), Some(copies)) = (&self.index, &self.copies) else {
            return;
        };
        let on = mode == Mode::Complete;
        if index.is_on() == on {
            return;
        }
        let _stripes = self.stripes.lock_all();
        index.on.store(on, Ordering::Release);
        if on {
            // Moved, not dropped: the copies read to size the tier answer at once (dropped,
            // `is_complete` counted them until the listener ran, and the worker read them
            // all again). One by one: the listener runs at once for each (`invalidate_all`
            // would leave the counts to the cache's next maintenance).
            let held: Vec<(u32, Arc<BucketCopy>)> =
                copies.iter().map(|(b, copy)| (*b, copy)).collect();
            for (b, copy) in held {
                copies.invalidate(&b);
                self.put_arc(b, copy);
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

    /// The mean copy held, as the cache weighs it (`BucketCopy::bytes`), once `at_least`
    /// (and one) are.
    pub(super) fn mean_held(&self, at_least: u64) -> Option<f64> {
        let count = self.count();
        (count >= at_least.max(1)).then(|| {
            let bytes = self.held.bytes.load(Ordering::Relaxed).max(0) as f64 / count as f64;
            match self.index_on() {
                Some(_) => bytes - copy::INDEXED_OVERHEAD as f64 + copy::COPY_OVERHEAD as f64,
                None => bytes,
            }
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::EntryKey;
    use crate::tier::Lookup;
    use crate::tier::testing::*;
    use std::collections::HashSet;
    use std::time::{Duration, Instant};

    /// Copies weighed under a scale above one take at most the capacity over the scale:
    /// with the budget's `rest` for copies, held bytes stay within it whatever their sizes.
    #[test]
    fn weights_round_up_so_copies_never_pass_their_share() {
        let (budget, rest) = (52_428u64, 30_001u64);
        let scale = (u128::from(SCALE_ONE) * u128::from(budget)).div_ceil(u128::from(rest)) as u64;
        // Small copies, many of them: rounded down, these sizes pass `rest` by 3 to 48 bytes.
        for size in [313u64, 330, 341, 353, 411, 1_003, 1_999] {
            // As many copies as the capacity admits by their weights.
            let (mut weighed, mut bytes) = (0u64, 0u64);
            while weighed + u64::from(Held::weight(size, 0, scale)) <= budget {
                weighed += u64::from(Held::weight(size, 0, scale));
                bytes += size;
            }
            assert!(
                bytes <= rest,
                "{bytes} bytes of copies of {size} for {rest}"
            );
        }
        assert_eq!(Held::weight(10, 100, SCALE_ONE), 100);
        assert_eq!(Held::weight(u64::MAX / 2, 0, SCALE_ONE * 4), u32::MAX);
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

    /// A complete tier of 200 buckets within `budget` bytes: 200 buckets could be complete
    /// (each weighs at least `COPY_OVERHEAD`), so there is an index.
    fn complete_tier(budget: u64) -> Arc<LocalTier> {
        crate::tier::testing::complete_tier(200, budget, Duration::ZERO)
    }

    /// Reads of different buckets install their copies at once (the worker's batches, changes
    /// heard, the preload): together they never take the index past its budget.
    #[test]
    fn concurrent_installs_never_take_the_index_past_its_budget() {
        let budget = 160 * 1024;
        let t = complete_tier(budget);
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
        let budget = 160 * 1024;
        let t = complete_tier(budget);
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
        // A copy installed while partial is in the cache only; complete again, the cache's
        // copies move into the index, counted there at once (not at the cache's next
        // maintenance), and answer as they did.
        let read = t.begin_read(&[held], HashSet::new());
        t.finish_read(read, Ok(vec![vec![(key.field, 0)]])).unwrap();
        assert_eq!(t.lookup(&key, Instant::now()), Lookup::Local(Some(0)));
        let (_, before) = assert_copies_in_one_place(&t);
        turn_complete(&t);
        let (indexed, cached) = assert_copies_in_one_place(&t);
        assert_eq!((indexed, cached), (before, 0), "every copy moved");
        assert_eq!(t.held.current(), before as u64);
        assert!(t.held.bytes.load(Ordering::Relaxed) <= (budget - index_bytes) as i64);
        assert_eq!(t.lookup(&key, Instant::now()), Lookup::Local(Some(0)));
    }
}
