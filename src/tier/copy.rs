//! One bucket held locally: its fields sorted, their expiry codes beside them, in one
//! allocation, so a lookup is a binary search and a bucket of ~200 entries costs ~2.4 KB at
//! most plus a fixed overhead.
//!
//! A field takes 8 bytes. A code takes only the bits the bucket's codes need: each is stored
//! as its distance from the bucket's earliest expiry, plus one (0 stays 0, "never"), in as
//! many bits as the largest distance needs. Expiries spread over a year need 25 bits (a
//! bucket of 200 such entries: 2,232 B rather than 2,400); a list that never expires needs 0
//! bits, 8 bytes an entry; no bucket needs more than 32.
//!
//! A copy is immutable once built: a change makes a new copy (`with_changes`), swapped in
//! whole, so a reader never sees half an update and needs no lock.

use std::time::Instant;

use crate::store::ExpiryCode;

/// What holding one copy costs besides its entries: the `Arc` and this struct, the cache's
/// own bookkeeping of the key (hash-table slot, entry info, deque nodes: ~250 B), and the
/// allocator's size classes (a 2,400 B copy of 200 entries takes a 2,560 B block). Measured:
/// 50,000 copies of 300 words in a moka cache under mimalloc took 620 B of resident memory
/// each beyond their words; the service's idle resident memory at 10M entries is ~780 B a
/// bucket beyond 12 B an entry (docs/performance.md, *Load*). It was 224 until 2026-11-25, which let the
/// tier take ~20 % more memory than its budget.
pub const COPY_OVERHEAD: usize = 640;

/// The same for a copy a complete tier holds in its index rather than the cache: no cache
/// bookkeeping. Measured at 10M entries (50,000 buckets, service idle, resident memory with
/// the tier less without, two starts): 456 and 494 B a bucket beyond the copies' words.
pub const INDEXED_OVERHEAD: usize = 480;

/// A bucket as it was read, with the changes heard since applied.
#[derive(Debug)]
pub struct BucketCopy {
    /// `len` sorted fields, then the codes, `bits` each, packed from the low bit of the
    /// first word on (a code may straddle two words).
    words: Box<[i64]>,
    len: usize,
    /// Each code is stored as 0 ("never") or its distance from `base` plus one.
    base: u32,
    bits: u32,
    /// When the read this copy comes from started: it is at least this fresh.
    pub fetched_at: Instant,
    /// The tier's generation when that read started (see `tier`).
    pub generation: u64,
    /// Set when a change of unknown value reached this bucket: from then on the copy may be
    /// wrong and is used only for fail-open answers, until it is read again.
    pub dirty_since: Option<Instant>,
}

impl BucketCopy {
    /// A copy of what a read returned. Entries already expired at `now_ms` are left out
    /// (they answer "not listed" either way); a field given twice keeps its last code.
    pub fn from_pairs(
        mut pairs: Vec<(i64, u32)>,
        now_ms: i64,
        fetched_at: Instant,
        generation: u64,
    ) -> Self {
        pairs.retain(|(_, c)| ExpiryCode::new(*c).is_live(now_ms));
        // Stable: of equal fields the last stays last, and dedup keeps the first, so reverse.
        pairs.reverse();
        pairs.sort_by_key(|(f, _)| *f);
        pairs.dedup_by_key(|(f, _)| *f);
        Self::packed(&pairs, fetched_at, generation, None)
    }

    fn packed(
        sorted: &[(i64, u32)],
        fetched_at: Instant,
        generation: u64,
        dirty_since: Option<Instant>,
    ) -> Self {
        let len = sorted.len();
        let expiring = sorted.iter().map(|(_, c)| *c).filter(|c| *c != 0);
        let base = expiring.clone().min().unwrap_or(0);
        let top = expiring.max().map_or(0, |c| u64::from(c - base) + 1);
        let bits = u64::BITS - top.leading_zeros();
        let mut words = vec![0i64; len + (len * bits as usize).div_ceil(64)];
        for (i, (f, c)) in sorted.iter().enumerate() {
            words[i] = *f;
            if bits == 0 {
                continue;
            }
            let stored = if *c == 0 { 0 } else { u64::from(c - base) + 1 };
            let at = i * bits as usize;
            let (w, o) = (len + at / 64, (at % 64) as u32);
            words[w] |= (stored << o) as i64;
            if o + bits > 64 {
                words[w + 1] |= (stored >> (64 - o)) as i64;
            }
        }
        Self {
            words: words.into_boxed_slice(),
            len,
            base,
            bits,
            fetched_at,
            generation,
            dirty_since,
        }
    }

    fn code_at(&self, i: usize) -> u32 {
        if self.bits == 0 {
            return 0;
        }
        let at = i * self.bits as usize;
        let (w, o) = (self.len + at / 64, (at % 64) as u32);
        let mut stored = self.words[w] as u64 >> o;
        if o + self.bits > 64 {
            stored |= (self.words[w + 1] as u64) << (64 - o);
        }
        let stored = stored & ((1u64 << self.bits) - 1);
        if stored == 0 {
            0
        } else {
            (u64::from(self.base) + stored - 1) as u32
        }
    }

    /// The raw code stored for `field`, if the copy holds it.
    ///
    /// Fields are keyed-hash outputs, uniform over `i64`, so the search starts where a
    /// uniform field would sit (`n · (field − i64::MIN) / 2^64`) and gallops outwards: about
    /// `√n / 2` places off for `n` entries, so one or two cache lines are touched rather than
    /// the ~8 scattered ones of a binary search over the bucket (the copies of a complete
    /// tier are far larger than the CPU's caches, so each line is a miss). Any order of
    /// fields is still found exactly, at worst in twice a binary search's steps.
    pub fn get(&self, field: i64) -> Option<u32> {
        let fields = &self.words[..self.len];
        let n = fields.len();
        if n == 0 {
            return None;
        }
        let offset = (i128::from(field) - i128::from(i64::MIN)) as u128;
        let guess = ((offset * n as u128) >> 64) as usize;
        let (lo, hi) = if fields[guess] < field {
            // After `guess`: widen upwards until a field not below it.
            let (mut lo, mut step) = (guess + 1, 1);
            loop {
                let probe = guess + step;
                if probe >= n {
                    break (lo, n);
                }
                if fields[probe] >= field {
                    break (lo, probe + 1);
                }
                lo = probe + 1;
                step *= 2;
            }
        } else {
            // At or before `guess`: widen downwards until a field below it.
            let (mut hi, mut step) = (guess + 1, 1);
            loop {
                if step > guess {
                    break (0, hi);
                }
                let probe = guess - step;
                if fields[probe] < field {
                    break (probe + 1, hi);
                }
                hi = probe + 1;
                step *= 2;
            }
        };
        fields[lo..hi]
            .binary_search(&field)
            .ok()
            .map(|i| self.code_at(lo + i))
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// (field, code) pairs, sorted by field.
    pub fn pairs(&self) -> impl Iterator<Item = (i64, u32)> + '_ {
        (0..self.len).map(|i| (self.words[i], self.code_at(i)))
    }

    /// What holding this copy in the cache costs, in bytes (the tier's budget counts this).
    pub fn bytes(&self) -> usize {
        self.words.len() * std::mem::size_of::<i64>() + COPY_OVERHEAD
    }

    /// What holding it in a complete tier's index costs.
    pub fn indexed_bytes(&self) -> usize {
        self.words.len() * std::mem::size_of::<i64>() + INDEXED_OVERHEAD
    }

    /// A new copy with `changes` applied in order (`None`: removed), entries expired at
    /// `now_ms` dropped, and the same freshness.
    pub fn with_changes(&self, changes: &[(i64, Option<u32>)], now_ms: i64) -> Self {
        let mut pairs: Vec<(i64, u32)> = self.pairs().collect();
        for (field, code) in changes {
            match (pairs.binary_search_by_key(field, |(f, _)| *f), code) {
                (Ok(i), Some(c)) => pairs[i].1 = *c,
                (Ok(i), None) => {
                    pairs.remove(i);
                }
                (Err(i), Some(c)) => pairs.insert(i, (*field, *c)),
                (Err(_), None) => {}
            }
        }
        pairs.retain(|(_, c)| ExpiryCode::new(*c).is_live(now_ms));
        Self::packed(&pairs, self.fetched_at, self.generation, self.dirty_since)
    }

    /// The same entries, marked out of date since `at` (kept for fail-open answers).
    pub fn dirtied(&self, at: Instant) -> Self {
        Self {
            words: self.words.clone(),
            dirty_since: Some(self.dirty_since.map_or(at, |d| d.min(at))),
            ..*self
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::domain::now_ms;
    use crate::store::expiry::EPOCH_2020_MS;

    /// A code far in the future (2088 is u32::MAX seconds since 2020).
    const LATER: u32 = 4_000_000_000;

    #[test]
    fn lookups_find_exactly_what_was_read() {
        let pairs = vec![(5, LATER), (-9, 0), (i64::MIN, LATER - 1), (i64::MAX, 7)];
        let now = EPOCH_2020_MS; // code 7 (7 s after 2020) is still live then
        let c = BucketCopy::from_pairs(pairs, now, Instant::now(), 1);
        assert_eq!(c.len(), 4);
        assert_eq!(c.get(5), Some(LATER));
        assert_eq!(c.get(-9), Some(0));
        assert_eq!(c.get(i64::MIN), Some(LATER - 1));
        assert_eq!(c.get(i64::MAX), Some(7));
        assert_eq!(c.get(6), None);
        // Codes 7 to LATER need 32 bits: 12 bytes an entry.
        assert_eq!(c.bytes(), (4 + 2) * 8 + COPY_OVERHEAD, "12 bytes an entry");
    }

    #[test]
    fn expired_entries_are_not_kept_and_the_last_of_a_field_wins() {
        let past = 1; // one second after 2020: long gone
        let c = BucketCopy::from_pairs(
            vec![(1, past), (2, LATER), (2, 0), (3, LATER)],
            now_ms(),
            Instant::now(),
            1,
        );
        assert_eq!(c.pairs().collect::<Vec<_>>(), vec![(2, 0), (3, LATER)]);
    }

    #[test]
    fn codes_take_the_bits_their_spread_needs() {
        let now = EPOCH_2020_MS;
        let fields = |n: i64| (0..n).map(|i| i * 7_919);
        // Never: no bits at all, 8 bytes an entry.
        let c = BucketCopy::from_pairs(
            fields(200).map(|f| (f, 0)).collect(),
            now,
            Instant::now(),
            1,
        );
        assert_eq!(c.bytes(), 200 * 8 + COPY_OVERHEAD);
        assert!(c.pairs().all(|(_, code)| code == 0));
        // Spread over a year (31.5M seconds: 25 bits), some never: 200 x 8 + 79 words.
        let year: u64 = 365 * 86_400;
        let pairs: Vec<(i64, u32)> = fields(200)
            .map(|f| {
                (
                    f,
                    if f % 5 == 0 {
                        0
                    } else {
                        220_000_000 + ((f as u64 * 7_717) % year) as u32
                    },
                )
            })
            .collect();
        let c = BucketCopy::from_pairs(pairs.clone(), now, Instant::now(), 1);
        assert_eq!(c.bits, 25);
        assert_eq!(c.bytes(), 200 * 8 + 79 * 8 + COPY_OVERHEAD);
        for (f, code) in &pairs {
            assert_eq!(c.get(*f), Some(*code));
        }
        // Marked dirty, the same entries in the same bits, dirty from the first time on.
        let first = Instant::now();
        let d = c
            .dirtied(first)
            .dirtied(first + std::time::Duration::from_secs(1));
        assert_eq!(d.pairs().collect::<Vec<_>>(), pairs);
        assert_eq!(
            (d.bits, d.bytes(), d.dirty_since),
            (25, c.bytes(), Some(first))
        );
        // One code, whatever its value: 1 bit.
        let c = BucketCopy::from_pairs(
            fields(64).map(|f| (f, LATER)).collect(),
            now,
            Instant::now(),
            1,
        );
        assert_eq!((c.bits, c.bytes()), (1, 65 * 8 + COPY_OVERHEAD));
        assert!(c.pairs().all(|(_, code)| code == LATER));
    }

    proptest! {
        /// The galloping search finds exactly what a binary search finds, for clustered
        /// fields as well as uniform ones, at the ends of the range too.
        #[test]
        fn get_agrees_with_a_binary_search(
            fields in proptest::collection::btree_set(
                prop_oneof![any::<i64>(), -300i64..300, Just(i64::MIN), Just(i64::MAX)], 0..300),
            probes in proptest::collection::vec(
                prop_oneof![any::<i64>(), -300i64..300, Just(i64::MIN), Just(i64::MAX)], 0..100),
        ) {
            let sorted: Vec<i64> = fields.iter().copied().collect();
            // Never expiring, or far in the future: both live.
            let code = |i: usize| if i.is_multiple_of(2) { 0 } else { LATER };
            let copy = BucketCopy::from_pairs(
                sorted.iter().enumerate().map(|(i, f)| (*f, code(i))).collect(),
                now_ms(),
                Instant::now(),
                1,
            );
            for f in probes.iter().chain(&sorted) {
                let want = sorted.binary_search(f).ok().map(code);
                prop_assert_eq!(copy.get(*f), want, "field {}", f);
            }
        }

        /// Whatever the codes (never, one value, a narrow or the widest spread), a copy
        /// gives back exactly what it was built from, in the bits the spread needs.
        #[test]
        fn codes_survive_packing(
            entries in proptest::collection::btree_map(
                any::<i64>(),
                prop_oneof![Just(0u32), 1u32.., 1_000u32..1_010, Just(1u32), Just(u32::MAX)],
                0..300),
        ) {
            // At 2020-01-01 every code from 1 s on is live.
            let c = BucketCopy::from_pairs(
                entries.iter().map(|(f, c)| (*f, *c)).collect(),
                EPOCH_2020_MS,
                Instant::now(),
                1,
            );
            prop_assert_eq!(
                c.pairs().collect::<Vec<_>>(),
                entries.iter().map(|(f, c)| (*f, *c)).collect::<Vec<_>>()
            );
            for (f, code) in &entries {
                prop_assert_eq!(c.get(*f), Some(*code));
            }
            let expiring: Vec<u64> =
                entries.values().filter(|c| **c != 0).map(|c| u64::from(*c)).collect();
            let spread = match (expiring.iter().min(), expiring.iter().max()) {
                (Some(lo), Some(hi)) => hi - lo + 1,
                _ => 0,
            };
            prop_assert_eq!(c.bits, u64::BITS - spread.leading_zeros());
            prop_assert!(c.bits <= 32);
        }

        /// Changes applied to a copy give what applying them to a map gives.
        #[test]
        fn changes_agree_with_a_map(
            start in proptest::collection::btree_map(-50i64..50, 0u32..3, 0..40),
            changes in proptest::collection::vec((-60i64..60, proptest::option::of(0u32..3)), 0..40),
        ) {
            // Codes 0 (never), 1 and 2 (far future once scaled) are all live.
            let code = |c: u32| if c == 0 { 0 } else { LATER - c };
            let mut oracle: BTreeMap<i64, u32> =
                start.iter().map(|(f, c)| (*f, code(*c))).collect();
            let copy = BucketCopy::from_pairs(
                oracle.iter().map(|(f, c)| (*f, *c)).collect(),
                now_ms(),
                Instant::now(),
                3,
            );
            let changes: Vec<(i64, Option<u32>)> =
                changes.into_iter().map(|(f, c)| (f, c.map(code))).collect();
            for (f, c) in &changes {
                match c {
                    Some(c) => { oracle.insert(*f, *c); }
                    None => { oracle.remove(f); }
                }
            }
            let changed = copy.with_changes(&changes, now_ms());
            prop_assert_eq!(changed.pairs().collect::<Vec<_>>(), oracle.into_iter().collect::<Vec<_>>());
            prop_assert_eq!(changed.generation, 3);
            for f in -60..60 {
                prop_assert_eq!(changed.get(f), changed.pairs().find(|(g, _)| *g == f).map(|(_, c)| c));
            }
        }
    }
}
