//! Randomness and bijections: distinct values without memory. Every value space is numbered
//! `0..size` and walked through a keyed bijection of that range ([`Perm`]), so the `i`-th value
//! taken is distinct from every other, members and non-members alike, with O(1) memory. Each
//! permutation's key comes from the seed and the space's name only, so changing `--mix` does
//! not reshuffle a dimension's values.

use anyhow::bail;
use rand::Rng;
use rand::rngs::Xoshiro256PlusPlus;

pub(super) type Prng = Xoshiro256PlusPlus;

/// Uniform in `0..n` (n > 0), by widening multiply (bias below 2^-40 for our n).
pub(super) fn below(rng: &mut Prng, n: u64) -> u64 {
    ((u128::from(rng.next_u64()) * u128::from(n)) >> 64) as u64
}

/// True with probability `p`.
pub(super) fn chance(rng: &mut Prng, p: f64) -> bool {
    ((rng.next_u64() >> 11) as f64) * (1.0 / (1u64 << 53) as f64) < p
}

pub(super) fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A key for the permutation named `name` under `seed`: independent of the other dimensions,
/// so changing `--mix` does not reshuffle a dimension's values.
pub(super) fn key_for(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let mut s = seed ^ h.rotate_left(29);
    splitmix(&mut s)
}

pub(super) const ROUNDS: usize = 3;

/// A keyed bijection of `0..size`: rounds of xor, odd multiply and xorshift on the smallest
/// power-of-two domain holding `size`, cycle-walked back into range (under two steps on
/// average).
#[derive(Debug, Clone)]
pub(super) struct Perm {
    pub(super) size: u64,
    pub(super) mask: u64,
    pub(super) shift: u32,
    pub(super) keys: [u64; ROUNDS],
    pub(super) mults: [u64; ROUNDS],
}

impl Perm {
    pub(super) fn new(size: u64, key: u64) -> Self {
        assert!(size > 0, "empty value space");
        let bits = 64 - (size - 1).leading_zeros();
        let mask = if bits == 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        let mut s = key;
        Self {
            size,
            mask,
            shift: (bits / 2).max(1),
            keys: std::array::from_fn(|_| splitmix(&mut s)),
            mults: std::array::from_fn(|_| splitmix(&mut s) | 1),
        }
    }

    #[inline]
    pub(super) fn round(&self, mut x: u64) -> u64 {
        for r in 0..ROUNDS {
            x = (x ^ self.keys[r]) & self.mask;
            x = x.wrapping_mul(self.mults[r]) & self.mask;
            x ^= x >> self.shift;
        }
        x
    }

    #[inline]
    pub(super) fn apply(&self, i: u64) -> u64 {
        debug_assert!(i < self.size);
        let mut x = self.round(i);
        while x >= self.size {
            x = self.round(x);
        }
        x
    }
}

/// The next indices of one value space, in permuted order.
#[derive(Debug, Clone)]
pub(super) struct Seq {
    pub(super) perm: Perm,
    pub(super) next: u64,
}

impl Seq {
    pub(super) fn new(size: u64, seed: u64, name: &str) -> Self {
        Self {
            perm: Perm::new(size, key_for(seed, name)),
            next: 0,
        }
    }

    pub(super) fn has_next(&self) -> bool {
        self.next < self.perm.size
    }

    pub(super) fn take(&mut self, what: &str) -> anyhow::Result<u64> {
        if !self.has_next() {
            bail!(
                "the {what} value space ({} values) is exhausted: ask for fewer rows or give {what} less weight",
                self.perm.size
            );
        }
        let v = self.perm.apply(self.next);
        self.next += 1;
        Ok(v)
    }
}

/// Weighted choice by cumulative weights.
#[derive(Debug, Clone)]
pub(super) struct Picker {
    pub(super) cum: Vec<u64>,
}

impl Picker {
    pub(super) fn new(weights: impl IntoIterator<Item = u64>) -> Self {
        let mut total = 0u64;
        let cum = weights
            .into_iter()
            .map(|w| {
                total += w;
                total
            })
            .collect();
        Self { cum }
    }

    pub(super) fn total(&self) -> u64 {
        self.cum.last().copied().unwrap_or(0)
    }

    pub(super) fn pick(&self, rng: &mut Prng) -> usize {
        let r = below(rng, self.total());
        self.cum.partition_point(|&c| c <= r)
    }
}
