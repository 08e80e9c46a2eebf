//! The background worker: sizes the keyspace up, loads, refreshes and reads again what is
//! queued (urgent reads under the `queue` lock) or due (`sweep`), paced at `fetch_rate`,
//! never on a caller's path, and exports the gauges.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::lock::{Rank, Ranked};
use super::sweep::BATCH;
use super::{LocalTier, Mode};
use crate::instrumented::Instrumented;
use crate::metrics::{StoreOp, TierGauges};
use crate::store::{Deadline, EntryStore, StoreError, one_each};

/// How long one background read may take.
pub(super) const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// The worker's queue: buckets to read before the sweep's (under the `queue` lock), whether
/// the worker holds a batch taken from it, and what wakes the worker.
pub(super) struct Queue {
    pending: Ranked<Pending>,
    /// Set (under the queue lock) while the worker holds a batch taken from it.
    busy: AtomicBool,
    wake: tokio::sync::Notify,
}

/// What the `queue` lock guards.
#[derive(Default)]
pub(super) struct Pending {
    pub(super) urgent: VecDeque<u32>,
    pub(super) queued: HashSet<u32>,
    /// Queued for their filter only (partial mode): the read is not kept as a copy.
    pub(super) filter_only: HashSet<u32>,
}

impl Queue {
    pub(super) fn new() -> Self {
        Self {
            pending: Ranked::new(Rank::Queue, Pending::default()),
            busy: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
        }
    }

    pub(super) fn push(&self, bucket: u32) {
        let mut q = self.pending.lock();
        q.filter_only.remove(&bucket);
        if q.queued.insert(bucket) {
            q.urgent.push_back(bucket);
            drop(q);
            self.wake.notify_one();
        }
    }

    /// Queues `bucket` to be read for its filter (not kept as a copy unless one is held).
    pub(super) fn push_filter(&self, bucket: u32) {
        let mut q = self.pending.lock();
        if q.queued.insert(bucket) {
            q.filter_only.insert(bucket);
            q.urgent.push_back(bucket);
            drop(q);
            self.wake.notify_one();
        }
    }

    /// Takes queued buckets into `batch` (up to `BATCH`), those queued for their filter only
    /// into `filter_only` too; the worker is busy with them from now on.
    pub(super) fn take(&self, batch: &mut Vec<u32>, filter_only: &mut HashSet<u32>) {
        let mut q = self.pending.lock();
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

    /// Puts a failed `batch` back first, as it was queued, and the worker is no longer busy.
    pub(super) fn put_back(&self, batch: &[u32], filter_only: &HashSet<u32>) {
        let mut q = self.pending.lock();
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

    /// The worker is done with the batch it took.
    pub(super) fn done(&self) {
        self.busy.store(false, Ordering::Release);
    }

    /// Whether something is queued or the worker holds a batch.
    pub(super) fn is_busy(&self) -> bool {
        let q = self.pending.lock();
        !q.urgent.is_empty() || self.busy.load(Ordering::Acquire)
    }

    /// Wakes the worker.
    pub(super) fn wake(&self) {
        self.wake.notify_one();
    }

    /// Waits for a wake-up.
    pub(super) async fn woken(&self) {
        self.wake.notified().await;
    }

    /// The queue itself (tests).
    #[cfg(test)]
    pub(super) fn lock(&self) -> super::lock::Guard<'_, Pending> {
        self.pending.lock()
    }
}

impl LocalTier {
    /// Reads `buckets` from the store and installs them (with the changes heard meanwhile).
    /// Buckets already being read are skipped.
    pub(super) async fn fetch(
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
                |s| async move { one_each("buckets", wanted.len(), s.get_buckets(wanted).await?) },
            )
            .await;
        self.finish_read(read, pairs)
    }

    /// Exports the tier's state.
    pub(super) fn export(&self, gauges: &TierGauges) {
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
        let (oldest, answering) = self.sweep_gauges(now, loaded);
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
                let _ = tokio::time::timeout(Duration::from_millis(100), self.queue.woken()).await;
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
                self.queue.done();
                let _ = tokio::time::timeout(Duration::from_millis(100), self.queue.woken()).await;
                continue;
            }
            let started = Instant::now();
            let fetched = self.fetch(&store, &batch, filter_only.clone()).await;
            if fetched.is_ok() {
                self.queue.done();
            }
            match fetched {
                Ok(()) => backoff = MIN_BACKOFF,
                Err(e) => {
                    tracing::debug!(error = %e, buckets = batch.len(), "local tier read failed; retrying");
                    // Resume where it stopped: the failed buckets go first next time.
                    self.queue.put_back(&batch, &filter_only);
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
            let queued = self.queue.is_busy();
            let reading = self.stripes.reading();
            if !queued && !reading {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::{Deadline, EntryKey, FingerprintKey, Hashing, Layout, WriteBatch};
    use crate::tier::Lookup;
    use crate::tier::testing::*;

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
