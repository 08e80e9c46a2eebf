//! A Redis Cluster connection that replaces itself when it stops answering.
//!
//! The async cluster client keeps one multiplexed connection per node and repairs them in the
//! background. In about one failover test run in four, after a killed primary came back as a
//! replica, a client stopped answering on every shard, while fresh connections to the same
//! nodes (the replica monitor's, the write pool's) answered at once: its internal state, not the
//! cluster, was stuck. Its own log (`FAILOVER_LOG=redis=debug`) shows why: a slot refresh
//! begins and never completes, and the client answers no request while a refresh runs. The
//! likeliest cause we found reading redis-rs 1.8.1 (2.0.0-rc.2 has the same code), not proven:
//! the refresh waits for the write half of the client's connection-map lock, which a
//! node-repair future, parked on that lock and no longer polled during a refresh, can hold up
//! for good (tokio's lock queues fairly). Nothing the
//! client exposes tells that state apart from a slow cluster, so [`HealingCluster`] judges by
//! outcomes:
//!
//! * Every request records that it was sent and, when it gets a reply (`Ok`, or an error reply
//!   from a server), that the connection answered. A request dropped by its caller's deadline,
//!   an I/O error or a timeout counts as unanswered.
//! * When at least [`STREAK`] requests have gone unanswered with no answer in between, and the
//!   first of them was sent [`STALL`] or more ago, a rebuild starts in the background: a new
//!   client connection (bounded by [`REBUILD_TIMEOUT`]) that replaces the old one for every
//!   later request. Requests in flight finish (or fail) on the old one. A failed rebuild is
//!   tried again after another [`STALL`]. Busy or sparse traffic alike: under checks a silence
//!   is caught a second after it began; two audit reads 2 s apart that both time out, at the
//!   second.
//! * Only a total silence counts: during an ordinary failover the healthy shards keep
//!   answering, which resets the watch, so the client's own repair is never second-guessed.
//!
//! A rebuild during a real outage is harmless: it fails to connect and is retried later, and
//! the old connection keeps serving meanwhile.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// Time since the first unanswered request of a streak (with no answer since) after which
/// the connection is rebuilt.
pub const STALL: Duration = Duration::from_secs(1);

/// Unanswered requests a streak needs before it counts: one slow command that times out is
/// not a dead connection, a second one with no answer in between is.
pub const STREAK: u32 = 2;

/// Longest a rebuild may take to connect before it is given up (and tried again later).
pub const REBUILD_TIMEOUT: Duration = Duration::from_secs(2);

static REBUILDS: AtomicU64 = AtomicU64::new(0);

/// Cluster connections replaced by a rebuild since the process started (every store).
pub fn rebuilds() -> u64 {
    REBUILDS.load(Ordering::Relaxed)
}

/// What the watch has seen since the last answer: a pure state machine over a clock, so the
/// decision is unit-tested without a cluster.
#[derive(Debug, Default)]
struct Watch {
    /// Since the last answer: when the earliest unanswered request was sent, and how many
    /// requests went unanswered.
    streak: Option<(Instant, u32)>,
    /// The latest rebuild started (successful or not).
    last_rebuild: Option<Instant>,
    rebuilding: bool,
}

impl Watch {
    /// A reply came back (any reply: the connection works).
    fn answered(&mut self) {
        self.streak = None;
    }

    /// A request sent at `sent` ended at `now` without a reply (an I/O error, a timeout, or
    /// its caller gave up on it); true when this should start a rebuild.
    fn unanswered(&mut self, sent: Instant, now: Instant) -> bool {
        let (since, count) = match self.streak {
            Some((since, count)) => (since.min(sent), count + 1),
            None => (sent, 1),
        };
        self.streak = Some((since, count));
        let stalled = count >= STREAK && now.saturating_duration_since(since) >= STALL;
        let due = self
            .last_rebuild
            .is_none_or(|t| now.saturating_duration_since(t) >= STALL);
        if stalled && due && !self.rebuilding {
            self.rebuilding = true;
            self.last_rebuild = Some(now);
            return true;
        }
        false
    }

    /// The rebuild started by `unanswered` ended; `replaced`: a new connection is in place.
    fn rebuilt(&mut self, replaced: bool) {
        self.rebuilding = false;
        if replaced {
            self.streak = None;
        }
    }
}

/// Notes a request's outcome; a request dropped before it ended (its caller's deadline) is
/// noted as unanswered when the guard drops.
struct Outcome<'a> {
    conn: &'a HealingCluster,
    sent: Instant,
    ended: bool,
}

impl Outcome<'_> {
    fn end(&mut self, answered: bool) {
        self.ended = true;
        if answered {
            self.conn.watch().answered();
        } else {
            self.conn.note_unanswered(self.sent);
        }
    }
}

impl Drop for Outcome<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.conn.note_unanswered(self.sent);
        }
    }
}

struct Inner {
    role: &'static str,
    current: RwLock<ClusterConnection>,
    client: ClusterClient,
    watch: Mutex<Watch>,
}

/// A cluster connection (cheap to clone, shared) that rebuilds itself after a total silence.
#[derive(Clone)]
pub struct HealingCluster {
    inner: Arc<Inner>,
}

impl HealingCluster {
    /// Connects with `client`, which is kept to build replacements.
    /// `role` names the connection in the rebuild's log line.
    pub async fn connect(client: ClusterClient, role: &'static str) -> RedisResult<Self> {
        let conn = client.get_async_connection().await?;
        Ok(Self {
            inner: Arc::new(Inner {
                role,
                current: RwLock::new(conn),
                client,
                watch: Mutex::new(Watch::default()),
            }),
        })
    }

    /// The connection to send on now.
    fn current(&self) -> ClusterConnection {
        self.inner
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn watch(&self) -> std::sync::MutexGuard<'_, Watch> {
        self.inner.watch.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request sent at `sent` got no reply; starts a rebuild in the background when due.
    fn note_unanswered(&self, sent: Instant) {
        if !self.watch().unanswered(sent, Instant::now()) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let inner = self.inner.clone();
                rt.spawn(async move { rebuild_now(inner).await });
            }
            Err(_) => self.watch().rebuilt(false),
        }
    }

    /// Runs one request on the current connection, noting whether it was answered. An error
    /// reply from a server (`CLUSTERDOWN` while a failover runs, `MOVED`, a script error) is
    /// an answer too: the node spoke. Replies that never came (I/O errors, timeouts, requests
    /// dropped by their caller) count towards a silence.
    async fn observe<T, F>(&self, request: impl FnOnce(ClusterConnection) -> F) -> RedisResult<T>
    where
        F: Future<Output = RedisResult<T>>,
    {
        let mut outcome = Outcome {
            conn: self,
            sent: Instant::now(),
            ended: false,
        };
        let r = request(self.current()).await;
        outcome.end(r.as_ref().map_or_else(is_server_reply, |_| true));
        r
    }

    /// `ClusterConnection::route_command`, watched.
    pub async fn route_command(&self, cmd: Cmd, routing: RoutingInfo) -> RedisResult<Value> {
        self.observe(|mut c| async move { c.route_command(cmd, routing).await })
            .await
    }

    /// `ClusterConnection::route_pipeline`, watched.
    pub async fn route_pipeline(
        &self,
        pipe: Pipeline,
        offset: usize,
        count: usize,
        route: SingleNodeRoutingInfo,
    ) -> RedisResult<Vec<Value>> {
        self.observe(|mut c| async move { c.route_pipeline(pipe, offset, count, route).await })
            .await
    }
}

/// Whether an error is a reply a server sent (so the connection works), not a failure to get one.
fn is_server_reply(e: &redis::RedisError) -> bool {
    matches!(e.kind(), redis::ErrorKind::Server(_))
}

async fn rebuild_now(inner: Arc<Inner>) {
    let started = Instant::now();
    let fresh = tokio::time::timeout(REBUILD_TIMEOUT, inner.client.get_async_connection()).await;
    let replaced = match fresh {
        Ok(Ok(conn)) => {
            *inner.current.write().unwrap_or_else(|p| p.into_inner()) = conn;
            REBUILDS.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                connection = inner.role,
                took_ms = started.elapsed().as_millis() as u64,
                "cluster connection rebuilt: no answer on any shard for {} ms",
                STALL.as_millis()
            );
            true
        }
        Ok(Err(e)) => {
            tracing::warn!(connection = inner.role, error = %e, "cluster connection silent; rebuilding it failed");
            false
        }
        Err(_) => {
            tracing::warn!(
                connection = inner.role,
                "cluster connection silent; rebuilding it timed out"
            );
            false
        }
    };
    inner
        .watch
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .rebuilt(replaced);
}

impl ConnectionLike for HealingCluster {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            self.observe(|mut c| async move { c.req_packed_command(cmd).await })
                .await
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            self.observe(|mut c| async move { c.req_packed_commands(cmd, offset, count).await })
                .await
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    /// `STALL` in ms, and a request every tenth of it.
    fn stall_and_step() -> (u64, u64) {
        let stall = STALL.as_millis() as u64;
        (stall, stall / 10)
    }

    #[test]
    fn answers_keep_the_connection() {
        let (_, step) = stall_and_step();
        let t0 = Instant::now();
        let mut w = Watch::default();
        for i in 0..100 {
            // one request in two unanswered, the other answered: never a silence
            assert!(!w.unanswered(at(t0, i * step), at(t0, i * step + 50)));
            w.answered();
        }
    }

    #[test]
    fn a_silence_under_traffic_rebuilds_after_a_stall_then_again_if_the_rebuild_failed() {
        let (stall, step) = stall_and_step();
        let t0 = Instant::now();
        let mut w = Watch::default();
        let mut rebuilds = Vec::new();
        for i in 0..=35 {
            // each request dropped by its caller 50 ms after it was sent
            let ended = i * step + 50;
            if w.unanswered(at(t0, i * step), at(t0, ended)) {
                rebuilds.push(ended);
                w.rebuilt(false); // the rebuild failed: the silence goes on
            }
        }
        assert_eq!(
            rebuilds,
            vec![stall + 50, 2 * stall + 50, 3 * stall + 50],
            "the first unanswered request was sent at 0"
        );
    }

    #[test]
    fn no_second_rebuild_while_one_runs_and_a_replacement_starts_afresh() {
        let (stall, step) = stall_and_step();
        let t0 = Instant::now();
        let mut w = Watch::default();
        let fired = (0..=25)
            .filter(|i| w.unanswered(at(t0, i * step), at(t0, i * step + 50)))
            .count();
        assert_eq!(fired, 1, "the first rebuild still runs at 2.5 stalls");
        w.rebuilt(true);
        // the new connection's first unanswered requests start a new streak
        assert!(!w.unanswered(at(t0, 26 * step), at(t0, 26 * step + 50)));
        assert!(!w.unanswered(at(t0, 27 * step), at(t0, 26 * step + stall - step)));
        assert!(
            w.unanswered(at(t0, 28 * step), at(t0, 26 * step + stall)),
            "a stall of the new connection"
        );
    }

    #[test]
    fn sparse_requests_that_each_time_out_rebuild_on_the_second() {
        let t0 = Instant::now();
        let mut w = Watch::default();
        // a request every 2.2 s, each given up after a 2 s response timeout
        assert!(
            !w.unanswered(t0, at(t0, 2_000)),
            "one slow command that timed out is not a dead connection"
        );
        assert!(w.unanswered(at(t0, 2_200), at(t0, 4_200)));
    }

    #[test]
    fn one_answer_in_between_resets_the_streak() {
        let t0 = Instant::now();
        let mut w = Watch::default();
        assert!(!w.unanswered(t0, at(t0, 2_000)));
        w.answered();
        assert!(!w.unanswered(at(t0, 2_200), at(t0, 4_200)));
    }
}
