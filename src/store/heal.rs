//! A Redis Cluster connection that replaces itself when it stops answering.
//!
//! The async cluster client keeps one multiplexed connection per node and repairs them in the
//! background. In about one failover test run in eight, after a killed primary came back as a
//! replica, a client stopped answering on every shard for good, while fresh connections to the
//! same nodes (the replica monitor's, the write pool's) answered at once: its internal state,
//! not the cluster, was stuck (README, "Writes, replicas and failover"). Nothing the
//! client exposes tells that state apart from a slow cluster, so [`HealingCluster`] judges by
//! outcomes:
//!
//! * Every request records that it was sent and, when it gets a reply (`Ok`), that the
//!   connection answered. A request dropped by its caller's deadline counts as unanswered.
//! * When requests have gone on being sent for [`STALL`] without a single answer, the next
//!   request starts a rebuild in the background: a new client connection (bounded by
//!   [`REBUILD_TIMEOUT`]) that replaces the old one for every later request. Requests in
//!   flight finish (or fail) on the old one. A failed rebuild is tried again after another
//!   [`STALL`].
//! * Only a total silence counts: during an ordinary failover the healthy shards keep
//!   answering, which resets the watch, so the client's own repair is never second-guessed.
//!   A traffic gap does not count either: a streak whose previous request is older than
//!   [`STALL`] starts again, so the first request after an idle night does not rebuild.
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

/// Time with requests sent and none answered after which the connection is rebuilt.
pub const STALL: Duration = Duration::from_secs(3);

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
    /// First request sent since the last answer.
    unanswered_since: Option<Instant>,
    /// The latest request sent.
    last_sent: Option<Instant>,
    /// The latest rebuild started (successful or not).
    last_rebuild: Option<Instant>,
    rebuilding: bool,
}

impl Watch {
    /// A request is being sent at `now`; true when it should start a rebuild.
    fn sent(&mut self, now: Instant) -> bool {
        let idle = self
            .last_sent
            .is_none_or(|t| now.saturating_duration_since(t) >= STALL);
        self.last_sent = Some(now);
        match self.unanswered_since {
            Some(since) if !idle => {
                let stalled = now.saturating_duration_since(since) >= STALL;
                let due = self
                    .last_rebuild
                    .is_none_or(|t| now.saturating_duration_since(t) >= STALL);
                if stalled && due && !self.rebuilding {
                    self.rebuilding = true;
                    self.last_rebuild = Some(now);
                    return true;
                }
            }
            _ => self.unanswered_since = Some(now),
        }
        false
    }

    /// A reply came back.
    fn answered(&mut self) {
        self.unanswered_since = None;
    }

    /// The rebuild started by `sent` ended; `replaced`: a new connection is in place.
    fn rebuilt(&mut self, replaced: bool) {
        self.rebuilding = false;
        if replaced {
            self.unanswered_since = None;
        }
    }
}

struct Inner {
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
    pub async fn connect(client: ClusterClient) -> RedisResult<Self> {
        let conn = client.get_async_connection().await?;
        Ok(Self {
            inner: Arc::new(Inner {
                current: RwLock::new(conn),
                client,
                watch: Mutex::new(Watch::default()),
            }),
        })
    }

    /// The connection to send on now; notes the send and starts a rebuild when due.
    fn sending(&self) -> ClusterConnection {
        let rebuild = self
            .inner
            .watch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .sent(Instant::now());
        if rebuild && let Ok(rt) = tokio::runtime::Handle::try_current() {
            let inner = self.inner.clone();
            rt.spawn(async move { rebuild_now(inner).await });
        } else if rebuild {
            self.watch().rebuilt(false);
        }
        self.inner
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn watch(&self) -> std::sync::MutexGuard<'_, Watch> {
        self.inner.watch.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs one request, noting whether it was answered. An error reply from a server
    /// (`CLUSTERDOWN` while a failover runs, `MOVED`, a script error) is an answer too: the
    /// node spoke. Only replies that never came (I/O errors, timeouts, requests dropped by
    /// their caller) count towards a silence.
    async fn observe<T>(&self, request: impl Future<Output = RedisResult<T>>) -> RedisResult<T> {
        let r = request.await;
        if r.as_ref().map_or_else(is_server_reply, |_| true) {
            self.watch().answered();
        }
        r
    }

    /// `ClusterConnection::route_command`, watched.
    pub async fn route_command(&self, cmd: Cmd, routing: RoutingInfo) -> RedisResult<Value> {
        let mut conn = self.sending();
        self.observe(conn.route_command(cmd, routing)).await
    }

    /// `ClusterConnection::route_pipeline`, watched.
    pub async fn route_pipeline(
        &self,
        pipe: Pipeline,
        offset: usize,
        count: usize,
        route: SingleNodeRoutingInfo,
    ) -> RedisResult<Vec<Value>> {
        let mut conn = self.sending();
        self.observe(conn.route_pipeline(pipe, offset, count, route))
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
                took_ms = started.elapsed().as_millis() as u64,
                "cluster connection rebuilt: no answer on any shard for {} s",
                STALL.as_secs()
            );
            true
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cluster connection silent; rebuilding it failed");
            false
        }
        Err(_) => {
            tracing::warn!("cluster connection silent; rebuilding it timed out");
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
            let mut conn = self.sending();
            self.observe(conn.req_packed_command(cmd)).await
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut conn = self.sending();
            self.observe(conn.req_packed_commands(cmd, offset, count))
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

    #[test]
    fn answers_keep_the_connection() {
        let t0 = Instant::now();
        let mut w = Watch::default();
        for i in 0..100 {
            assert!(!w.sent(at(t0, i * 100)));
            w.answered();
        }
    }

    #[test]
    fn a_silence_under_traffic_rebuilds_once_then_again_after_another_stall() {
        let t0 = Instant::now();
        let mut w = Watch::default();
        let mut rebuilds = Vec::new();
        for i in 0..=100 {
            if w.sent(at(t0, i * 100)) {
                rebuilds.push(i * 100);
                w.rebuilt(false); // the rebuild failed: the silence goes on
            }
        }
        assert_eq!(rebuilds, vec![3_000, 6_000, 9_000]);
    }

    #[test]
    fn no_second_rebuild_while_one_runs_and_a_success_resets() {
        let t0 = Instant::now();
        let mut w = Watch::default();
        let mut fired = 0;
        for i in 0..=50 {
            fired += usize::from(w.sent(at(t0, i * 100)));
        }
        assert_eq!(fired, 1, "the first rebuild still runs at 5 s");
        w.rebuilt(true);
        assert!(!w.sent(at(t0, 5_100)));
        w.answered();
        assert!(!w.sent(at(t0, 8_200)), "answered since: no stall");
    }

    #[test]
    fn an_idle_gap_is_not_a_silence() {
        let t0 = Instant::now();
        let mut w = Watch::default();
        assert!(!w.sent(t0)); // dropped by its caller, never answered
        assert!(
            !w.sent(at(t0, 60_000)),
            "first request after an idle minute"
        );
        assert!(!w.sent(at(t0, 60_100)));
        w.answered();
    }
}
