//! Per-bucket negative filters: what a partial tier knows of the buckets it does not hold.
//!
//! A keyspace larger than the budget cannot be held whole, but most lookups are for values on
//! no list, and "not in this bucket" needs far fewer bits than the bucket itself: a Bloom
//! filter of a bucket's fields at `b` bits an entry (8 to 12 bytes an entry for a copy) answers a
//! lookup of an absent field locally except with probability ~(1 − e^(−k/b))^k. At 20× the
//! budget there are ~5.1 bits an entry (~9 % of absent fields still go to the store); with
//! room, 10 bits (~1 %).
//!
//! One flat array: every bucket has `words` 64-bit words of bits and a stamp (no allocation
//! or cache entry per bucket: at ~120 bytes a bucket, a copy's fixed overhead alone is five
//! times that). The stamp says which read the bits come from: the tier's generation (its low
//! 24 bits) and when that read started, or 0 for "no usable filter" (never read, or dirty).
//!
//! Exactness: a filter may say "maybe" for an absent field, never "absent" for a present one,
//! provided every field the bucket gained since the read was added (`add`). The tier calls
//! `add` for every insert or refresh it hears, under the bucket's stripe lock, and `rebuild`
//! with the fields of a read (the changes logged meanwhile applied) under the same lock; a
//! deletion is not removed (it only costs a "maybe" until the next read). A reader racing a
//! rebuild sees old and new words mixed: a field present now is in both (it was added to the
//! old bits when it was written, or was there already), so any mix still holds it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Most bits an entry: ~1 % of absent fields still go to the store at 10.
pub const MAX_BITS_PER_ENTRY: f64 = 10.0;
/// Fewest bits an entry worth keeping a filter for: below 4, more than ~15 % of absent
/// fields go to the store anyway, and the refresh reads would cost more than they save.
pub const MIN_BITS_PER_ENTRY: f64 = 4.0;

const VALID: u64 = 1 << 63;
const GEN_BITS: u32 = 24;
const MS_BITS: u32 = 39;
const GEN_MASK: u64 = (1 << GEN_BITS) - 1;
const MS_MASK: u64 = (1 << MS_BITS) - 1;

pub struct Filters {
    /// Words of bits per bucket.
    words: usize,
    /// Probes per field.
    k: u32,
    bits: Box<[AtomicU64]>,
    /// Per bucket: `VALID | generation << 39 | ms since `epoch` the read started`, or 0.
    stamps: Box<[AtomicU64]>,
    epoch: Instant,
}

impl Filters {
    /// Filters for `buckets` buckets of `mean_entries` entries in at most `bytes` (bits and
    /// stamps together), at up to `MAX_BITS_PER_ENTRY`; `None` when fewer than
    /// `MIN_BITS_PER_ENTRY` fit.
    pub fn sized(buckets: u32, mean_entries: f64, bytes: u64, epoch: Instant) -> Option<Self> {
        let words = Self::plan(buckets, mean_entries, bytes)?;
        let bits_per_entry = (words * 64) as f64 / mean_entries.max(1.0);
        let k = (bits_per_entry * std::f64::consts::LN_2)
            .round()
            .clamp(1.0, 8.0) as u32;
        let n = buckets as usize;
        Some(Self {
            words,
            k,
            bits: (0..n * words).map(|_| AtomicU64::new(0)).collect(),
            stamps: (0..n).map(|_| AtomicU64::new(0)).collect(),
            epoch,
        })
    }

    /// Words a bucket gets for `buckets` buckets of `mean_entries` in `bytes`; `None` when
    /// fewer than `MIN_BITS_PER_ENTRY` fit.
    pub fn plan(buckets: u32, mean_entries: f64, bytes: u64) -> Option<usize> {
        if buckets == 0 {
            return None;
        }
        let per_bucket = bytes / u64::from(buckets);
        let fit = (per_bucket / 8).checked_sub(1)? as usize;
        let mean_entries = mean_entries.max(1.0);
        let want = (mean_entries * MAX_BITS_PER_ENTRY / 64.0).ceil() as usize;
        let words = fit.min(want);
        let bits_per_entry = (words * 64) as f64 / mean_entries;
        (words > 0 && bits_per_entry >= MIN_BITS_PER_ENTRY).then_some(words)
    }

    /// Words a bucket has.
    pub fn words(&self) -> usize {
        self.words
    }

    /// Bytes taken (bits and stamps).
    pub fn bytes(&self) -> u64 {
        ((self.bits.len() + self.stamps.len()) * 8) as u64
    }

    pub fn bits_per_entry(&self, mean_entries: f64) -> f64 {
        (self.words * 64) as f64 / mean_entries.max(1.0)
    }

    pub fn probes(&self) -> u32 {
        self.k
    }

    fn block(&self, bucket: u32) -> Option<&[AtomicU64]> {
        let start = bucket as usize * self.words;
        self.bits.get(start..start + self.words)
    }

    /// The bit positions of `field` within a block (double hashing over a bijective mix of
    /// the field: fields are keyed-hash outputs, the mix only spreads small test values).
    fn positions(&self, field: i64) -> impl Iterator<Item = usize> + use<> {
        let h = (field as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let (a, b) = (h as u32, ((h >> 32) as u32) | 1);
        let m = (self.words * 64) as u64;
        (0..self.k)
            .map(move |i| ((u64::from(a.wrapping_add(i.wrapping_mul(b))) * m) >> 32) as usize)
    }

    /// Whether `field` may be in `bucket` (false: certainly not, as of the bits' read and
    /// the changes added since).
    pub fn may_hold(&self, bucket: u32, field: i64) -> bool {
        let Some(block) = self.block(bucket) else {
            return true;
        };
        self.positions(field)
            .all(|p| block[p / 64].load(Ordering::Acquire) & (1 << (p % 64)) != 0)
    }

    /// A field written into `bucket` (the caller holds the bucket's stripe lock).
    pub fn add(&self, bucket: u32, field: i64) {
        if let Some(block) = self.block(bucket) {
            for p in self.positions(field) {
                block[p / 64].fetch_or(1 << (p % 64), Ordering::AcqRel);
            }
        }
    }

    /// The bits of a read of `bucket` (started at `started`, in `generation`), or just
    /// unusable when `stamp` is false (a dirty read). The caller holds the stripe lock.
    pub fn rebuild(
        &self,
        bucket: u32,
        fields: impl Iterator<Item = i64>,
        generation: u64,
        started: Instant,
        usable: bool,
    ) {
        let Some(block) = self.block(bucket) else {
            return;
        };
        let mut fresh = vec![0u64; self.words];
        for f in fields {
            for p in self.positions(f) {
                fresh[p / 64] |= 1 << (p % 64);
            }
        }
        for (w, v) in block.iter().zip(fresh) {
            w.store(v, Ordering::Release);
        }
        let stamp = if usable {
            let ms = started.saturating_duration_since(self.epoch).as_millis() as u64;
            VALID | (generation & GEN_MASK) << MS_BITS | ms.min(MS_MASK)
        } else {
            0
        };
        self.stamps[bucket as usize].store(stamp, Ordering::Release);
    }

    /// Buckets whose filter comes from a read of `generation`.
    pub fn of_generation(&self, generation: u64) -> usize {
        (0..self.stamps.len() as u32)
            .filter(|&b| {
                self.stamp(b, generation)
                    .is_some_and(|(g, _)| g == generation)
            })
            .count()
    }

    /// The filter of `bucket` no longer answers until it is read again.
    pub fn invalidate(&self, bucket: u32) {
        if let Some(s) = self.stamps.get(bucket as usize) {
            s.store(0, Ordering::Release);
        }
    }

    /// The generation (full, reconstructed from its low bits against `current`) and start of
    /// the read the bits of `bucket` come from; `None` when they are not usable.
    pub fn stamp(&self, bucket: u32, current: u64) -> Option<(u64, Instant)> {
        let s = self.stamps.get(bucket as usize)?.load(Ordering::Acquire);
        if s & VALID == 0 {
            return None;
        }
        let low = (s >> MS_BITS) & GEN_MASK;
        let generation = current - ((current & GEN_MASK).wrapping_sub(low) & GEN_MASK);
        let at = self.epoch + Duration::from_millis(s & MS_MASK);
        Some((generation, at))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn sizes_follow_the_budget() {
        let now = Instant::now();
        // Room for far more than 10 bits an entry: 10 (4 words of 64 for 25 entries).
        let f = Filters::sized(100, 25.0, 1 << 20, now).unwrap();
        assert_eq!(f.words, 4);
        assert_eq!(f.probes(), 7);
        assert_eq!(f.bytes(), 100 * (4 + 1) * 8);
        // ~125 B a bucket of 200 entries: 13 words, 4.2 bits.
        let f = Filters::sized(5_000, 200.0, 5_000 * 125 * 9 / 10, now).unwrap();
        assert_eq!(f.words, 13);
        assert_eq!(f.probes(), 3);
        assert!(f.bytes() <= 5_000 * 125 * 9 / 10);
        // Too little room.
        assert!(Filters::sized(5_000, 200.0, 5_000 * 80, now).is_none());
        assert!(Filters::sized(0, 200.0, 1 << 20, now).is_none());
    }

    #[test]
    fn stamps_say_which_read_and_when() {
        let epoch = Instant::now();
        let f = Filters::sized(4, 10.0, 1 << 10, epoch).unwrap();
        assert_eq!(f.stamp(1, 7), None, "never read");
        let started = epoch + Duration::from_millis(1234);
        f.rebuild(1, [5, 6].into_iter(), 7, started, true);
        assert_eq!(f.stamp(1, 7), Some((7, started)));
        assert_eq!(f.stamp(1, 9), Some((7, started)), "an older generation");
        // Generations past 2^24 keep their identity against the current one.
        let g = (1 << 24) + 3;
        f.rebuild(2, [5].into_iter(), g - 5, started, true);
        assert_eq!(f.stamp(2, g), Some((g - 5, started)));
        f.invalidate(1);
        assert_eq!(f.stamp(1, 7), None);
        f.rebuild(3, [5].into_iter(), 7, started, false);
        assert_eq!(f.stamp(3, 7), None, "a dirty read is not usable");
        assert!(f.may_hold(3, 5), "its bits are still there");
    }

    proptest! {
        /// No false negatives: every field of the read or added since is "maybe", whatever
        /// the sizes; and with 10 bits an entry most absent fields are "no".
        #[test]
        fn never_says_absent_for_a_present_field(
            read in proptest::collection::vec(any::<i64>(), 0..300),
            added in proptest::collection::vec(any::<i64>(), 0..50),
            bytes in 64u64..8_192,
        ) {
            let Some(f) = Filters::sized(4, 200.0, bytes * 4, Instant::now()) else {
                return Ok(());
            };
            f.rebuild(2, read.iter().copied(), 1, Instant::now(), true);
            for a in &added {
                f.add(2, *a);
            }
            for x in read.iter().chain(&added) {
                prop_assert!(f.may_hold(2, *x));
            }
        }
    }

    #[test]
    fn most_absent_fields_are_answered() {
        let f = Filters::sized(1, 200.0, 1 << 20, Instant::now()).unwrap();
        f.rebuild(0, (0..200).map(|i| i * 7919), 1, Instant::now(), true);
        let maybe = (1_000_000..1_100_000).filter(|x| f.may_hold(0, *x)).count();
        // 10 bits an entry, 7 probes: ~0.8 % false positives.
        assert!(maybe < 2_000, "{maybe} of 100,000 absent fields said maybe");
        // An empty block says no to everything.
        let g = Filters::sized(1, 200.0, 1 << 20, Instant::now()).unwrap();
        g.rebuild(0, std::iter::empty(), 1, Instant::now(), true);
        assert!(!g.may_hold(0, 42));
    }
}
