//! What the worker reads next besides what is queued: passes over every bucket (complete
//! mode's copies, partial mode's filters: `Ring`), partial mode's preload and refresh of the
//! copies held, and when what is held falls due by age (the safety net's pace). Its progress
//! is kept under the `sweep` lock.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::copy::BucketCopy;
use super::{LocalTier, Mode};

/// Buckets read per round trip.
pub(super) const BATCH: usize = 64;

/// Passes over every bucket per refresh period, at most (see `Ring`).
pub(super) const PASSES_PER_REFRESH: u32 = 16;

/// Buckets the worker looks at per sweep step.
pub(super) const SCAN_STEP: u32 = 4096;

/// How often the answering gauge counts the filters in sync (a look at every bucket's stamp:
/// ~1 ms at 1M buckets).
const ANSWERING_EVERY: Duration = Duration::from_secs(2);

/// Partial mode preloads until this share of the budget is used.
pub(super) const PRELOAD_SHARE: f64 = 0.9;

/// Progress of the background sweep.
pub(super) struct Sweep {
    /// Partial mode's preload: the next bucket to look at.
    pub(super) cursor: u32,
    /// Held buckets due for a refresh (partial mode), gathered once per `ttl / 8`.
    pub(super) due: Vec<u32>,
    pub(super) gathered_at: Option<Instant>,
    pub(super) gathered_gen: u64,
    /// Oldest copy seen in the last full pass, for the gauge.
    pub(super) oldest: Duration,
    /// The answering gauge's last value and when it was counted (every `ANSWERING_EVERY`:
    /// a look at every filter's stamp).
    pub(super) answering: Option<(Instant, f64)>,
    /// Complete mode's passes over every copy.
    pub(super) copies: Ring,
    /// Partial mode's passes over every filter.
    pub(super) filters: Ring,
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
pub(super) struct Ring {
    pub(super) cursor: u32,
    /// This pass: the oldest read seen, and when the first bucket not yet due will be.
    pub(super) pass_oldest: Duration,
    pub(super) pass_due: Option<Instant>,
    /// After a pass: no scanning until then, in this generation.
    pub(super) idle_until: Option<Instant>,
    pub(super) idle_generation: u64,
}

impl Ring {
    /// Looks at up to `SCAN_STEP` buckets from the cursor and adds those due to `batch` (up to
    /// `BATCH`). `state(b)`: when what is held of `b` was read and whether it is due; `None`
    /// when nothing usable is held (due). Returns the oldest read seen when a pass ends.
    pub(super) fn scan(
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

impl LocalTier {
    /// The sweep's gauges, under its lock: the oldest copy of the last full pass, and the
    /// share of buckets answering locally (`loaded` in complete mode; partial mode's filters
    /// of this generation, counted every `ANSWERING_EVERY`).
    pub(super) fn sweep_gauges(&self, now: Instant, loaded: f64) -> (Duration, f64) {
        let mut sweep = self.sweep.lock();
        let answering = match (self.mode(), self.filters.load().as_ref()) {
            (Mode::Partial, Some(f)) if self.is_trusted() => match sweep.answering {
                Some((at, v)) if now.saturating_duration_since(at) < ANSWERING_EVERY => v,
                _ => {
                    let v =
                        f.of_generation(self.generation()) as f64 / f64::from(self.buckets.max(1));
                    sweep.answering = Some((now, v));
                    v
                }
            },
            (Mode::Complete, _) if self.is_trusted() => loaded,
            _ => 0.0,
        };
        (sweep.oldest, answering)
    }

    /// The mean period of the safety-net re-reads: `ttl / 2` without proofs of delivery (or
    /// with `refresh_rate` 0); with them, long enough that the age-driven re-reads of all
    /// buckets stay near `refresh_rate` a second, whatever the keyspace.
    pub(super) fn refresh_period(&self) -> Duration {
        let floor = self.settings.ttl / 2;
        if !self.paced() {
            return floor;
        }
        floor.max(Duration::from_secs_f64(
            f64::from(self.buckets) / self.settings.refresh_rate as f64,
        ))
    }

    /// Whether the safety net is paced by `refresh_rate` (proofs of delivery, a rate set).
    pub(super) fn paced(&self) -> bool {
        self.proven_feed() && self.settings.refresh_rate > 0
    }

    /// When what is held of `bucket` falls due by age: from `ttl / 2` without proofs; with
    /// them, between one and two `refresh_period`s, by a fixed share per bucket, so that a
    /// keyspace loaded at once is not re-read at once.
    pub(super) fn refresh_after(&self, bucket: u32) -> Duration {
        let period = self.refresh_period();
        if !self.paced() {
            return period;
        }
        let share = f64::from(bucket.wrapping_mul(0x9E37_79B9)) / f64::from(u32::MAX);
        period.mul_f64(1.0 + share)
    }

    /// Whether the held copy of `bucket` (if any) should be read again now.
    pub(super) fn due(&self, bucket: u32, copy: Option<&BucketCopy>, now: Instant) -> bool {
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
    pub(super) fn next_batch(&self, now: Instant) -> (Vec<u32>, HashSet<u32>) {
        let mut batch = Vec::with_capacity(BATCH);
        let mut filter_only = HashSet::new();
        self.queue.take(&mut batch, &mut filter_only);
        let Some(copies) = &self.copies else {
            return (batch, filter_only);
        };
        let mut sweep = self.sweep.lock();
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier::testing::*;
    use crate::tier::{LIVE_BOUND, Lookup};

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
}
