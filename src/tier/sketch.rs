//! Which buckets are hot: a count-min sketch of bucket touches, halved as it fills, so that a
//! bucket touched far more often than the average one is worth fetching whole (partial mode,
//! see `tier`). Counts are approximate by design (racing increments may be lost, the sketch
//! only overestimates by collisions): the answer is a heuristic, never a correctness matter.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

const ROWS: usize = 4;
/// A bucket is hot when touched this many times more than the average counter...
const HOT_FACTOR: u64 = 4;
/// ...and at least this many times since the counts were last halved.
const HOT_MIN: u64 = 16;

/// Approximate touch counts per bucket.
pub struct Sketch {
    counters: Box<[AtomicU8]>,
    /// Counters per row (a power of two).
    width: usize,
    /// Distinct columns touched in practice: `min(width, buckets)`.
    spread: u64,
    /// Touches counted, halved with the counters.
    mass: AtomicU64,
}

fn mix(mut z: u64) -> u64 {
    // splitmix64's finaliser: a different, well-spread column per row.
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Sketch {
    /// A sketch for a keyspace of `buckets` buckets: 4 rows of up to 64K one-byte counters.
    pub fn new(buckets: u32) -> Self {
        let width = (buckets as usize).next_power_of_two().clamp(1024, 1 << 16);
        Self {
            counters: (0..ROWS * width).map(|_| AtomicU8::new(0)).collect(),
            width,
            spread: (width as u64).min(u64::from(buckets).max(1)),
            mass: AtomicU64::new(0),
        }
    }

    fn slots(&self, bucket: u32) -> impl Iterator<Item = usize> + '_ {
        (0..ROWS).map(move |r| {
            let h = mix(u64::from(bucket) ^ ((r as u64 + 1) << 40));
            r * self.width + (h as usize & (self.width - 1))
        })
    }

    /// Counts a touch of `bucket`; whether it is now hot.
    pub fn touch(&self, bucket: u32) -> bool {
        let mut estimate = u64::MAX;
        for i in self.slots(bucket) {
            let c = &self.counters[i];
            let v = c.load(Ordering::Relaxed).saturating_add(1);
            c.store(v, Ordering::Relaxed);
            estimate = estimate.min(u64::from(v));
        }
        let mass = self.mass.fetch_add(1, Ordering::Relaxed) + 1;
        estimate >= HOT_MIN.max(HOT_FACTOR * mass / self.spread)
    }

    /// Halves every count once the sketch has seen 8 touches per counter, so it tracks
    /// what is hot now. Called off the request path (the tier's worker).
    pub fn age(&self) {
        if self.mass.load(Ordering::Relaxed) < 8 * self.width as u64 {
            return;
        }
        for c in self.counters.iter() {
            c.store(c.load(Ordering::Relaxed) / 2, Ordering::Relaxed);
        }
        let m = self.mass.load(Ordering::Relaxed);
        self.mass.store(m / 2, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uniform_stream_has_no_hot_bucket_and_a_repeated_one_is_hot() {
        let s = Sketch::new(5_000);
        let mut hot = 0;
        let mut x = 1u64;
        for i in 0..400_000u64 {
            x = mix(x + i);
            hot += usize::from(s.touch((x % 5_000) as u32));
            s.age();
        }
        assert_eq!(hot, 0, "uniform touches: no bucket stands out");
        let mut turned = None;
        for i in 0..10_000 {
            x = mix(x + i);
            s.touch((x % 5_000) as u32);
            if i % 10 == 0 && s.touch(77) && turned.is_none() {
                turned = Some(i);
            }
            s.age();
        }
        // Bucket 77 gets ~11 touches per 100 while the average bucket gets 0.02.
        assert!(turned.is_some_and(|i| i < 2_000), "{turned:?}");
    }
}
