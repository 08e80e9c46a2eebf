//! Events of concurrent requests in shared metric script calls, on one node (issue 27).
//!
//! The engine sends one event a request (`POST /v1/events`, `POST /v1/evaluate`), and each
//! was one script call of its own: one call's dispatch, MessagePack argument and keyspace
//! guard in Redis per event, and one command to send and read per event here. Events of one
//! batch already share calls (`velocity::metric_calls`); this does the same for events of
//! different requests that arrive together.
//!
//! * At most [`SENDERS`] coalesced calls are in flight at once. A request that may wait
//!   (below) queues its updates, then either gets a sender's turn (a permit) or waits for its
//!   answer. A request with a turn takes the queued requests' updates, oldest first (its own
//!   among them if still queued), up to `METRIC_OPS_PER_CALL` ops, sends them as one write
//!   (through the same path as any batch: its session, `NOSCRIPT` reload, keyspace guard) and
//!   hands each request its answers. Nobody waits for a call to fill: when fewer than
//!   `SENDERS` calls are in flight an event goes at once, alone; under load events queue
//!   while calls are in flight and the next call takes them all.
//! * The queue is first in, first out, and bounded by the requests in flight
//!   (`max_in_flight_writes` for `POST /v1/events`, `max_in_flight_requests` for
//!   `POST /v1/evaluate`), each of at most half a call: a client that floods events delays
//!   another's by what was queued before it, as Redis's own queue did when each event was
//!   a call.
//! * Only updates of events with ids are coalesced, and only requests of at most half a
//!   call (`METRIC_OPS_PER_CALL / 2` ops: an event of up to 32 metrics), which another can
//!   join. A call is sent by a request, and a request that runs out of time drops its
//!   call's future: the requests it carried then find their answers gone and send their
//!   own updates again, alone, and their ids make them count once (answered as duplicates
//!   if the dropped call had applied them). Id-less events (no way to tell) and larger
//!   requests go alone as before (a batch's events already share calls).
//! * A request that gave up while queued (its deadline passed) is skipped, never sent.
//!
//! On a cluster nothing is coalesced: a script's keys share one slot, and events of
//! different requests rarely do.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{Semaphore, oneshot};

use super::RedisStore;
use super::velocity::{METRIC_OPS_PER_CALL, in_order};
use crate::store::{Deadline, MetricAnswer, MetricOp, StoreError, StoreResult};

/// Coalesced calls in flight at once: enough to keep one Redis busy while the service
/// builds and reads the next; few enough that events queue, and share calls, under load.
pub const SENDERS: usize = 4;

static RESENT: AtomicU64 = AtomicU64::new(0);

/// Requests that found the shared call carrying their updates dropped (its sender ran out
/// of time) and sent them again alone, since the process started (every store).
pub fn resent() -> u64 {
    RESENT.load(Ordering::Relaxed)
}

/// One request's updates, waiting to be sent.
struct Job {
    ops: Vec<MetricOp>,
    answer: oneshot::Sender<StoreResult<Vec<MetricAnswer>>>,
}

/// The queue of updates waiting for a call, and the senders' turns.
pub(super) struct Coalescer {
    queue: Mutex<VecDeque<Job>>,
    senders: Semaphore,
}

impl Default for Coalescer {
    fn default() -> Self {
        Self {
            queue: Mutex::new(VecDeque::new()),
            senders: Semaphore::new(SENDERS),
        }
    }
}

impl Coalescer {
    /// Whether updates `ops` may wait to share a call: each of an event with an id, and
    /// together at most half a call. A request of more could share a call with no other
    /// like it, and would only queue: events of 50 metrics went 11 % slower through the
    /// queue (`benches/velocity_engine.sh`, 2,503 against 2,829 events/s).
    pub(super) fn takes<'a>(mut ops: impl ExactSizeIterator<Item = &'a MetricOp>) -> bool {
        ops.len() > 0 && ops.len() * 2 <= METRIC_OPS_PER_CALL && ops.all(|o| o.event.is_some())
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Job>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The queued jobs whose requests still wait, oldest first, up to `METRIC_OPS_PER_CALL`
    /// ops together (at least one job).
    fn take(&self) -> Vec<Job> {
        let mut queue = self.queue();
        let mut out = Vec::new();
        let mut weight = 0;
        while let Some(job) = queue.front() {
            if job.answer.is_closed() {
                queue.pop_front();
                continue;
            }
            if !out.is_empty() && weight + job.ops.len() > METRIC_OPS_PER_CALL {
                break;
            }
            weight += job.ops.len();
            out.extend(queue.pop_front());
        }
        out
    }
}

/// The ops of `jobs`, moved out of them, as one request's: each job's events numbered after
/// the previous job's (`EventMark::seq` tells a request's events apart, and two requests'
/// first events must not read as one event), and where each job's ops are in it.
fn joined(jobs: &mut [Job]) -> (Vec<MetricOp>, Vec<std::ops::Range<usize>>) {
    let mut all = Vec::with_capacity(jobs.iter().map(|j| j.ops.len()).sum());
    let mut ranges = Vec::with_capacity(jobs.len());
    let mut base = 0u32;
    for job in jobs {
        let start = all.len();
        let mut next = base;
        for mut op in std::mem::take(&mut job.ops) {
            if let Some(e) = op.event.as_mut() {
                e.seq = base.saturating_add(e.seq);
                next = next.max(e.seq.saturating_add(1));
            }
            all.push(op);
        }
        base = next;
        ranges.push(start..all.len());
    }
    (all, ranges)
}

impl Coalescer {
    /// Updates `ops` (see `Coalescer::takes`), sent with other requests' in a shared call
    /// (see the module docs) by `send`, which sends the updates it is given as one request's
    /// and answers them in order: an answer per op, in order. `again` makes `ops` once more,
    /// for the rare resend alone (a dropped call), so that the common path moves them.
    pub(super) async fn run<F, Fut>(
        &self,
        ops: Vec<MetricOp>,
        send: F,
        again: impl FnOnce() -> Vec<MetricOp>,
    ) -> StoreResult<Vec<MetricAnswer>>
    where
        F: Fn(Vec<MetricOp>) -> Fut,
        Fut: Future<Output = StoreResult<Vec<MetricAnswer>>>,
    {
        let (answer, mut rx) = oneshot::channel();
        self.queue().push_back(Job { ops, answer });
        loop {
            tokio::select! {
                biased;
                r = &mut rx => return match r {
                    Ok(r) => r,
                    // Its call was dropped with the request that sent it: sent again, alone.
                    Err(_) => Self::resend(&send, again).await,
                },
                permit = self.senders.acquire() => {
                    let _permit = permit.map_err(|_| StoreError::unavailable("closed".into()))?;
                    let jobs = self.take();
                    if jobs.is_empty() {
                        // Ours is in another sender's call: its answer comes there.
                        break;
                    }
                    Self::send_jobs(jobs, &send).await;
                }
            }
        }
        match rx.await {
            Ok(r) => r,
            Err(_) => Self::resend(&send, again).await,
        }
    }

    /// A request's updates sent again alone, after the call carrying them was dropped.
    async fn resend<F, Fut>(
        send: &F,
        again: impl FnOnce() -> Vec<MetricOp>,
    ) -> StoreResult<Vec<MetricAnswer>>
    where
        F: Fn(Vec<MetricOp>) -> Fut,
        Fut: Future<Output = StoreResult<Vec<MetricAnswer>>>,
    {
        RESENT.fetch_add(1, Ordering::Relaxed);
        send(again()).await
    }

    /// Sends the updates of `jobs` as one request's and hands each job its answers (or the
    /// call's error).
    async fn send_jobs<F, Fut>(mut jobs: Vec<Job>, send: &F)
    where
        F: Fn(Vec<MetricOp>) -> Fut,
        Fut: Future<Output = StoreResult<Vec<MetricAnswer>>>,
    {
        let (all, ranges) = joined(&mut jobs);
        match send(all).await {
            Ok(answers) => {
                let mut answers = answers.into_iter();
                for (job, range) in jobs.into_iter().zip(ranges) {
                    let mine = answers.by_ref().take(range.len()).collect();
                    // A request that gave up meanwhile wants no answer.
                    let _ = job.answer.send(Ok(mine));
                }
            }
            Err(e) => {
                for job in jobs {
                    let _ = job.answer.send(Err(e.clone()));
                }
            }
        }
    }
}

impl RedisStore {
    /// The updates at `idx` of `ops` (see `Coalescer::takes`) in a call shared with other
    /// requests' (`Coalescer::run`) on the write path: an answer per op of `idx`, in order.
    pub(super) async fn coalesced_updates(
        &self,
        co: &Coalescer,
        ops: &[MetricOp],
        idx: &[usize],
        deadline: Deadline,
    ) -> StoreResult<Vec<MetricAnswer>> {
        let mine = || idx.iter().map(|&i| ops[i].clone()).collect();
        let send = |ops: Vec<MetricOp>| async move {
            let idx = (0..ops.len()).collect();
            let answers = self.metric_updates_direct(&ops, idx, deadline).await?;
            in_order(answers, ops.len())
        };
        co.run(mine(), send, mine).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::velocity::sum_update;
    use super::*;

    fn update(seq: u32, hash: i64) -> MetricOp {
        sum_update(format!("k{hash}"), seq, hash)
    }

    fn job(ops: Vec<MetricOp>) -> (Job, oneshot::Receiver<StoreResult<Vec<MetricAnswer>>>) {
        let (answer, rx) = oneshot::channel();
        (Job { ops, answer }, rx)
    }

    /// Two requests' first events (both `seq` 0, even of the same id: a replay racing its
    /// original) stay two events once joined; a request's own events keep their order.
    #[test]
    fn joined_requests_keep_their_events_apart() {
        let (a, _ra) = job(vec![update(0, 7), update(0, 7), update(1, 8)]);
        let (b, _rb) = job(vec![update(0, 7)]);
        let (c, _rc) = job(vec![update(0, 9), update(0, 9)]);
        let (all, ranges) = joined(&mut [a, b, c]);
        let seqs: Vec<u32> = all.iter().map(|o| o.event.unwrap().seq).collect();
        assert_eq!(seqs, [0, 0, 1, 2, 3, 3]);
        assert_eq!(ranges, [0..3, 3..4, 4..6]);
    }

    /// A take stops before the call would pass `METRIC_OPS_PER_CALL` ops, skips requests
    /// that gave up, and always takes at least one job.
    #[test]
    fn a_take_fills_one_call_and_skips_who_left() {
        let co = Coalescer::default();
        let mut keep = Vec::new();
        for n in [30, 30, 10] {
            let (j, rx) = job((0..n).map(|i| update(0, i)).collect());
            co.queue().push_back(j);
            keep.push(rx);
        }
        let (gone, rx) = job(vec![update(0, 1)]);
        co.queue().push_front(gone);
        drop(rx);
        let sizes = |jobs: Vec<Job>| jobs.iter().map(|j| j.ops.len()).collect::<Vec<_>>();
        assert_eq!(
            sizes(co.take()),
            [30, 30],
            "the one that left skipped; 70 > 64"
        );
        assert_eq!(sizes(co.take()), [10]);
        assert!(co.take().is_empty());
        let (big, _rx) = job((0..100).map(|i| update(0, i)).collect());
        co.queue().push_back(big);
        assert_eq!(sizes(co.take()), [100], "one job always goes");
    }

    fn keyed(prefix: &str, n: i64) -> Vec<MetricOp> {
        (0..n)
            .map(|i| {
                let mut op = update(0, i);
                op.key = format!("{prefix}{i}");
                op
            })
            .collect()
    }

    /// A request that sends a shared call and runs out of time drops the call: the requests
    /// it carried send their own updates again, alone, and get their answers; nobody is
    /// left without one. Four blockers hold every turn; S (which gives up after 100 ms) and
    /// then L1–L3 queue; once one blocker is through, S sends all four requests' updates in
    /// one call that never answers (Redis stalled), and gives up.
    #[tokio::test]
    async fn a_dropped_call_is_sent_again_by_the_requests_it_carried() {
        use std::sync::Mutex as StdMutex;
        use std::time::Duration;
        use tokio::sync::Notify;

        let resent_before = resent();
        let co = Arc::new(Coalescer::default());
        let release = Arc::new(Notify::new());
        let shared_sent = Arc::new(Notify::new());
        let sent: Arc<StdMutex<Vec<String>>> = Arc::default();
        let send = {
            let (release, shared_sent, sent) = (release.clone(), shared_sent.clone(), sent.clone());
            move |ops: Vec<MetricOp>| {
                let (release, shared_sent, sent) =
                    (release.clone(), shared_sent.clone(), sent.clone());
                async move {
                    let keys: Vec<&str> = ops.iter().map(|o| &o.key[..1]).collect();
                    let label = keys.concat();
                    sent.lock().unwrap().push(label.clone());
                    if label.starts_with('b') {
                        release.notified().await;
                    } else if label.starts_with('s') {
                        shared_sent.notify_one();
                        std::future::pending::<()>().await;
                    }
                    Ok(vec![
                        MetricAnswer {
                            duplicate: false,
                            reading: None,
                        };
                        ops.len()
                    ])
                }
            }
        };
        let run = |prefix: &'static str, n: i64| {
            let (co, send) = (co.clone(), send.clone());
            tokio::spawn(async move { co.run(keyed(prefix, n), send, || keyed(prefix, n)).await })
        };
        let blockers: Vec<_> = (0..SENDERS).map(|_| run("b", 1)).collect();
        while sent.lock().unwrap().len() < SENDERS {
            tokio::task::yield_now().await;
        }
        let short = {
            let (co, send) = (co.clone(), send.clone());
            tokio::spawn(async move {
                tokio::time::timeout(
                    Duration::from_millis(100),
                    co.run(keyed("s", 1), send, || keyed("s", 1)),
                )
                .await
            })
        };
        tokio::task::yield_now().await;
        let longs: Vec<_> = [2, 3, 1].into_iter().map(|n| run("l", n)).collect();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        release.notify_one();
        shared_sent.notified().await;
        release.notify_waiters();
        for b in blockers {
            b.await.unwrap().unwrap();
        }
        assert!(short.await.unwrap().is_err(), "S gave up");
        for (l, n) in longs.into_iter().zip([2, 3, 1]) {
            assert_eq!(l.await.unwrap().unwrap().len(), n, "an answer per op");
        }
        let mut sent = sent.lock().unwrap().clone();
        assert_eq!(sent.drain(..SENDERS).collect::<Vec<_>>(), ["b"; SENDERS]);
        assert_eq!(sent[0], "sllllll", "S carried every queued request");
        sent[1..].sort();
        assert_eq!(sent[1..], ["l", "ll", "lll"], "each sent again, alone");
        assert_eq!(resent() - resent_before, 3, "the resends are counted");
    }

    #[test]
    fn only_events_with_ids_of_at_most_half_a_call_wait() {
        assert!(Coalescer::takes([update(0, 1)].iter()));
        let mut idless = update(0, 1);
        idless.event = None;
        assert!(!Coalescer::takes([update(0, 1), idless].iter()));
        assert!(!Coalescer::takes([].iter()));
        let half: Vec<MetricOp> = (0..32).map(|i| update(0, i)).collect();
        assert!(Coalescer::takes(half.iter()));
        let wide: Vec<MetricOp> = (0..33).map(|i| update(0, i)).collect();
        assert!(
            !Coalescer::takes(wide.iter()),
            "no other like it would fit its call"
        );
    }
}
