//! Where the Redis store's writes go: a pool of connections of their own, never shared with
//! reads (`conn`).
//!
//! Reads and writes never share a connection. `WAIT` blocks the connection it is sent on, on
//! the server, until the replicas acknowledge or its timeout passes, and every command sent
//! after it on that connection waits too: on a connection shared with reads, one primary
//! without replicas would stall every check. So [`RedisConn`] carries reads (and nothing that
//! blocks), and writes go through a [`WritePool`] of connections of their own:
//!
//! * A write is a [`WriteSession`]: its steps (pipelines; on a cluster one per slot, each a
//!   `MULTI`/`EXEC` when atomic) end, when it waits for replicas, with `CLIENT INFO`, which
//!   names the server-side connection that carried them (`laddr`, `id`). Without replicas to
//!   wait for nothing needs the name and the pipeline carries no `CLIENT INFO` (it cost Redis
//!   4–6 µs on every write: 5–10 % of a velocity event). `WAIT` counts the replication offset of the connection
//!   that wrote, so the session then sends one `WAIT` per connection written on, and checks
//!   (by `CLIENT INFO` again, in the same pipeline) that it runs on that very connection: a
//!   reconnect in between fails the write instead of acknowledging it unreplicated. On one
//!   node the `WAIT` rides in the last step's pipeline (one round trip); on a cluster it
//!   follows it (one more round trip, all primaries at once).
//! * `WAIT`'s server-side timeout is the session's remaining deadline less a margin (never 0,
//!   which would block forever), so nothing outlives the request.
//! * With `write_replicas > 0` a pool member carries one write at a time (a lease): a write
//!   never queues behind another write's `WAIT` on the server. A write that finds every member
//!   busy until its deadline is refused unsent. Without replicas nothing blocks on the server
//!   and members are shared round robin.
//! * Without replicas, on one node, a write made on an HTTP worker goes over that worker's own
//!   write connection (`worker_conn`, a second set beside the reads'), driven by the worker's
//!   runtime, while it is up; the shared members serve until then and everywhere else. On a
//!   member the round trip hops threads twice (the worker hands the pipeline to the
//!   connection's task on the multi-thread runtime, whose reply wakes the worker again), as
//!   the reads' did before they got theirs. With replicas every write keeps its lease: the
//!   pool is what bounds the `WAIT`s in flight.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use redis::aio::ConnectionLike;
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Pipeline, RedisError, RedisResult, Value};
use tokio::sync::{Semaphore, SemaphorePermit, watch};

use super::replicas::Topology;
use crate::store::layout::key_slot;
use crate::store::{Deadline, Refusal, StoreError, StoreResult};

use super::conn::{ConnectOptions, Keyed, RedisConn, clients, missing, server_error};
use super::worker_conn::PerWorker;

/// The pool's members by default (`write_connections`): writes in flight at once when they
/// wait for replicas (see the module docs); without replicas the members are shared.
pub const DEFAULT_WRITE_CONNECTIONS: usize = 8;

/// Least time kept back from a `WAIT`'s timeout for the reply to travel and be read.
const MIN_WAIT_MARGIN: Duration = Duration::from_millis(5);

/// The server-side connection a pipeline ran on, from `CLIENT INFO`: the server's own
/// address (`laddr`) and the connection's id on that server.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConnToken {
    pub laddr: String,
    pub id: u64,
}

/// Reads `CLIENT INFO`'s `id=… addr=… laddr=… …` line.
pub fn parse_client_info(v: &Value) -> Result<ConnToken, String> {
    let text = match v {
        Value::BulkString(b) => std::str::from_utf8(b).map_err(|e| e.to_string())?,
        Value::SimpleString(s) => s.as_str(),
        Value::VerbatimString { text, .. } => text.as_str(),
        other => return Err(format!("CLIENT INFO answered {other:?}")),
    };
    let field = |name: &str| {
        text.split_ascii_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
    };
    let id = field("id")
        .and_then(|i| i.parse().ok())
        .ok_or_else(|| format!("CLIENT INFO without an id: {text:?}"))?;
    let laddr = field("laddr")
        .filter(|a| !a.is_empty())
        .ok_or_else(|| format!("CLIENT INFO without laddr: {text:?}"))?
        .to_owned();
    Ok(ConnToken { laddr, id })
}

/// What one write pipeline answered: a result per command, the connection it ran on (when it
/// asked), and `WAIT`'s count if it carried one.
#[derive(Debug)]
pub struct StepReplies {
    pub results: Vec<RedisResult<Value>>,
    pub token: Option<ConnToken>,
    pub acked: Option<u32>,
}

fn corrupt(what: String) -> StoreError {
    StoreError::corrupt(format!("write reply: {what}"))
}

/// Splits the replies of a write pipeline of `n` commands: `[MULTI, QUEUED…, EXEC]` when
/// `atomic`, else the `n` replies; then `CLIENT INFO`'s when `named`; then `WAIT`'s when
/// `wait`. Any other shape is `Corrupt`, never a panic.
pub fn split_replies(
    mut replies: Vec<Value>,
    n: usize,
    atomic: bool,
    named: bool,
    wait: bool,
) -> StoreResult<StepReplies> {
    let body = if atomic { n + 2 } else { n };
    let expected = body + usize::from(named) + usize::from(wait);
    if replies.len() != expected {
        return Err(corrupt(format!(
            "{} replies to a pipeline of {expected} commands",
            replies.len()
        )));
    }
    let acked = if wait {
        match replies.pop() {
            Some(Value::Int(k)) => Some(u32::try_from(k).unwrap_or(0)),
            Some(Value::ServerError(e)) => {
                return Err(StoreError::unavailable(format!(
                    "WAIT refused: {}",
                    RedisError::from(e)
                )));
            }
            other => return Err(corrupt(format!("WAIT answered {other:?}"))),
        }
    } else {
        None
    };
    let token = match named.then(|| replies.pop()) {
        None => None,
        Some(Some(Value::ServerError(e))) => {
            return Err(StoreError::unavailable(format!(
                "CLIENT INFO refused ({}): writes need Redis >= 6.2 with CLIENT INFO allowed",
                RedisError::from(e)
            )));
        }
        Some(Some(v)) => Some(parse_client_info(&v).map_err(corrupt)?),
        Some(None) => return Err(corrupt("no CLIENT INFO reply".into())),
    };
    let results = if atomic {
        let exec = replies.pop().unwrap_or(Value::Nil);
        // replies: MULTI's OK, then one QUEUED (or a queueing error) per command.
        let queued: Vec<Value> = replies.into_iter().skip(1).collect();
        match exec {
            Value::Array(v) if v.len() == n => v.into_iter().map(server_error).collect(),
            Value::Array(v) => {
                return Err(corrupt(format!("EXEC answered {} of {n} replies", v.len())));
            }
            Value::Nil => (0..n)
                .map(|_| {
                    Err(RedisError::from((
                        redis::ErrorKind::Io,
                        "transaction aborted",
                    )))
                })
                .collect(),
            Value::ServerError(e) => {
                // EXECABORT: a command failed to queue; it carries its own error.
                let abort = RedisError::from(e);
                queued
                    .into_iter()
                    .map(|q| match q {
                        Value::ServerError(e) => Err(e.into()),
                        _ => Err(abort.clone()),
                    })
                    .collect()
            }
            other => return Err(corrupt(format!("EXEC answered {other:?}"))),
        }
    } else {
        replies.into_iter().map(server_error).collect()
    };
    Ok(StepReplies {
        results,
        token,
        acked,
    })
}

/// The connections writes go over (see the module docs).
pub struct WritePool {
    members: Vec<RedisConn>,
    /// One write per member at a time (writes wait for replicas).
    exclusive: bool,
    leases: Semaphore,
    /// Members not leased; as many as `leases` has permits.
    free: Mutex<Vec<usize>>,
    next: AtomicUsize,
    /// The HTTP workers' own write connections, when members are shared (see the module docs).
    per_worker: Option<PerWorker>,
}

/// A member held by one write; given back when dropped.
struct Lease<'a> {
    pool: &'a WritePool,
    member: usize,
    _permit: SemaphorePermit<'a>,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        // Runs before the permit is released, so a permit always finds a free member.
        self.pool
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.member);
    }
}

impl WritePool {
    /// Opens `size` connections (connection sets on a cluster) of their own.
    pub async fn connect(opts: &ConnectOptions, size: usize, exclusive: bool) -> RedisResult<Self> {
        let clients = clients(opts)?;
        let size = size.max(1);
        let members = join_all((0..size).map(|_| RedisConn::open(opts, &clients, true, "writes")))
            .await
            .into_iter()
            .collect::<RedisResult<Vec<_>>>()?;
        let per_worker = if exclusive {
            None
        } else {
            PerWorker::new(opts, &clients, "writes (worker)")
        };
        Ok(Self {
            members,
            exclusive,
            leases: Semaphore::new(size),
            free: Mutex::new((0..size).rev().collect()),
            next: AtomicUsize::new(0),
            per_worker,
        })
    }

    /// A session for one write that waits for `replicas` replicas (0: none) within
    /// `deadline`. With too little time left, or every member busy until the deadline, the
    /// write is refused unsent.
    pub async fn session(
        &self,
        replicas: u32,
        deadline: Deadline,
    ) -> StoreResult<WriteSession<'_>> {
        if replicas > 0 && deadline.remaining() < MIN_WAIT_MARGIN * 3 {
            return Err(StoreError::Refused(Refusal::NoTime {
                left: deadline.remaining(),
            }));
        }
        let (member, lease) = if self.exclusive {
            let permit = tokio::time::timeout_at(deadline.instant(), self.leases.acquire())
                .await
                .map_err(|_| {
                    StoreError::Refused(Refusal::Busy {
                        connections: self.members.len(),
                    })
                })?
                .map_err(|_| StoreError::unavailable("the write pool is closed".into()))?;
            let member = self
                .free
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop()
                .ok_or_else(|| StoreError::unavailable("no free write connection".into()))?;
            let lease = Lease {
                pool: self,
                member,
                _permit: permit,
            };
            (member, Some(lease))
        } else if let Some(own) = self.per_worker.as_ref().and_then(PerWorker::get) {
            return Ok(WriteSession::new(own, None, replicas, deadline));
        } else {
            let member = self.next.fetch_add(1, Ordering::Relaxed) % self.members.len();
            (member, None)
        };
        let conn = self
            .members
            .get(member)
            .cloned()
            .ok_or_else(|| StoreError::unavailable("no such write connection".into()))?;
        Ok(WriteSession::new(conn, lease, replicas, deadline))
    }
}

/// One write's use of a pool member (see the module docs).
pub struct WriteSession<'a> {
    conn: RedisConn,
    _lease: Option<Lease<'a>>,
    replicas: u32,
    deadline: Deadline,
    /// Every connection written on so far, with a slot that routes to it.
    written: Vec<(ConnToken, u16)>,
    /// New pictures of the replica monitor, and the slots this write touches.
    watch: Option<(watch::Receiver<Arc<Topology>>, Vec<u16>)>,
}

/// Why waiting for replicas failed after something was written.
fn not_replicated(acked: u32, replicas: u32, waited: Duration) -> StoreError {
    StoreError::unavailable(format!(
        "{acked} of {replicas} replica(s) acknowledged within {waited:?}: the write reached its primary but is not known to survive its loss"
    ))
}

impl<'a> WriteSession<'a> {
    fn new(conn: RedisConn, lease: Option<Lease<'a>>, replicas: u32, deadline: Deadline) -> Self {
        Self {
            conn,
            _lease: lease,
            replicas,
            deadline,
            written: Vec::new(),
            watch: None,
        }
    }

    /// Gives up on anything in flight as soon as a new picture says a primary of `slots` can
    /// no longer give the guarantee (gone, or too few replicas for the `WAIT`): a write sent
    /// to a primary that then died would otherwise wait for the client's reconnects, or for
    /// a `WAIT` that cannot succeed, until its deadline.
    pub fn watching(&mut self, pictures: watch::Receiver<Arc<Topology>>, slots: Vec<u16>) {
        self.watch = Some((pictures, slots));
    }

    /// Runs `fut` unless the monitor sees the write's guarantee go first.
    async fn guarded<T>(&self, fut: impl Future<Output = StoreResult<T>>) -> StoreResult<T> {
        let Some((pictures, slots)) = &self.watch else {
            return fut.await;
        };
        let mut pictures = pictures.clone();
        let replicas = self.replicas;
        let gone = async move {
            while pictures.changed().await.is_ok() {
                let t = pictures.borrow_and_update().clone();
                if let Err(r) = t.check(slots.iter().copied(), replicas, Instant::now()) {
                    return r;
                }
            }
            std::future::pending().await
        };
        tokio::select! {
            r = fut => r,
            r = gone => Err(StoreError::unavailable(format!(
                "{r}; given up in flight: the write may have landed"
            ))),
        }
    }

    /// Sends one step and does not wait: one result per command, in order.
    pub async fn step(
        &mut self,
        cmds: Vec<Keyed>,
        atomic: bool,
    ) -> StoreResult<Vec<RedisResult<Value>>> {
        self.send(cmds, atomic, false).await
    }

    /// Sends `cmds` (may be empty), then waits until the replicas have everything this
    /// session wrote (no wait without replicas). One result per command, in order.
    pub async fn commit(
        &mut self,
        cmds: Vec<Keyed>,
        atomic: bool,
    ) -> StoreResult<Vec<RedisResult<Value>>> {
        if self.replicas == 0 {
            return self.send(cmds, atomic, false).await;
        }
        if matches!(self.conn, RedisConn::Single(_)) {
            return self.send(cmds, atomic, true).await;
        }
        let results = self.send(cmds, atomic, false).await?;
        self.wait_all().await?;
        Ok(results)
    }

    /// The `WAIT` timeout: what is left of the deadline less a margin (a tenth, at least
    /// 5 ms). `None` when nothing is left: `WAIT 0` would block forever.
    fn wait_budget(&self) -> Option<Duration> {
        let left = self.deadline.remaining();
        let budget = left.saturating_sub(MIN_WAIT_MARGIN.max(left / 10));
        (budget >= Duration::from_millis(1)).then_some(budget)
    }

    /// Whether its pipelines name their connection (`CLIENT INFO`): only `WAIT` needs it.
    fn named(&self) -> bool {
        self.replicas > 0
    }

    fn wait_cmd(&self, budget: Duration) -> Cmd {
        let mut w = redis::cmd("WAIT");
        w.arg(self.replicas).arg(budget.as_millis() as u64);
        w
    }

    fn pipeline(&self, cmds: Vec<Cmd>, atomic: bool, wait: Option<Duration>) -> Pipeline {
        let mut pipe = redis::pipe();
        if atomic {
            pipe.cmd("MULTI");
        }
        for cmd in cmds {
            pipe.add_command(cmd);
        }
        if atomic {
            pipe.cmd("EXEC");
        }
        if self.named() {
            pipe.cmd("CLIENT").arg("INFO");
        }
        if let Some(budget) = wait {
            pipe.add_command(self.wait_cmd(budget));
        }
        pipe
    }

    async fn send(
        &mut self,
        cmds: Vec<Keyed>,
        atomic: bool,
        wait: bool,
    ) -> StoreResult<Vec<RedisResult<Value>>> {
        if cmds.is_empty() && !wait {
            return Ok(Vec::new());
        }
        let cluster = match &self.conn {
            RedisConn::Single(c) => {
                let budget = if wait {
                    match self.wait_budget() {
                        Some(b) => Some(b),
                        None if self.written.is_empty() => {
                            return Err(StoreError::Refused(Refusal::NoTime {
                                left: self.deadline.remaining(),
                            }));
                        }
                        None => return Err(no_time_to_wait()),
                    }
                } else {
                    None
                };
                let n = cmds.len();
                let pipe =
                    self.pipeline(cmds.into_iter().map(|(_, c)| c).collect(), atomic, budget);
                let replies = self
                    .guarded(async {
                        let mut r = c.clone().req_packed_commands(&pipe, 0, pipe.len()).await;
                        if r.as_ref().is_err_and(RedisError::is_connection_refusal) {
                            // A refused connection sent nothing: the member's last reconnect
                            // failed (Redis was down) and this call started another; try once
                            // more on it.
                            r = c.clone().req_packed_commands(&pipe, 0, pipe.len()).await;
                        }
                        r.map_err(StoreError::unavailable_from)
                    })
                    .await?;
                let split = split_replies(replies, n, atomic, self.named(), wait)?;
                if let Some(token) = split.token {
                    if let Some((t, _)) = self.written.iter().find(|(t, _)| *t != token) {
                        return Err(changed(t, &token));
                    }
                    self.written.push((token, 0));
                }
                if let (Some(acked), Some(budget)) = (split.acked, budget)
                    && acked < self.replicas
                {
                    return Err(not_replicated(acked, self.replicas, budget));
                }
                return Ok(split.results);
            }
            RedisConn::Cluster(c) => c.clone(),
        };
        let n = cmds.len();
        let named = self.named();
        let mut groups: HashMap<u16, (Vec<usize>, Vec<Cmd>)> = HashMap::new();
        for (i, (key, cmd)) in cmds.into_iter().enumerate() {
            let g = groups.entry(key_slot(&key)).or_default();
            g.0.push(i);
            g.1.push(cmd);
        }
        let sent = self
            .guarded(async {
                Ok(join_all(groups.into_iter().map(|(slot, (idx, cmds))| {
                    let conn = cluster.clone();
                    let len = cmds.len();
                    let pipe = self.pipeline(cmds, atomic, None);
                    // Routed by slot explicitly: a `PUBLISH` riding along names a channel, not a key
                    // of the slot, and the client would otherwise refuse the pipeline.
                    let route =
                        SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                    async move {
                        let replies = conn
                            .route_pipeline(pipe.clone(), 0, pipe.len(), route)
                            .await
                            .map_err(StoreError::unavailable_from)?;
                        let split = split_replies(replies, len, atomic, named, false)?;
                        Ok::<_, StoreError>((slot, idx, split))
                    }
                }))
                .await)
            })
            .await?;
        let mut out: Vec<RedisResult<Value>> = (0..n).map(|_| missing()).collect();
        for r in sent {
            let (slot, idx, split) = r?;
            for (i, v) in idx.into_iter().zip(split.results) {
                if let Some(o) = out.get_mut(i) {
                    *o = v;
                }
            }
            if let Some(token) = split.token
                && !self.written.iter().any(|(t, _)| *t == token)
            {
                self.written.push((token, slot));
            }
        }
        Ok(out)
    }

    /// On a cluster: one `WAIT` per connection written on, all at once, each checked to run
    /// on that connection.
    async fn wait_all(&mut self) -> StoreResult<()> {
        let RedisConn::Cluster(cluster) = &self.conn else {
            return Ok(());
        };
        for (i, (a, _)) in self.written.iter().enumerate() {
            if let Some((b, _)) = self.written[i + 1..]
                .iter()
                .find(|(b, _)| b.laddr == a.laddr)
            {
                return Err(changed(a, b));
            }
        }
        let budget = self.wait_budget().ok_or_else(no_time_to_wait)?;
        let waits = self
            .guarded(async {
                Ok(join_all(self.written.iter().map(|(token, slot)| {
                    let conn = cluster.clone();
                    let mut pipe = redis::pipe();
                    pipe.cmd("CLIENT").arg("INFO");
                    pipe.add_command(self.wait_cmd(budget));
                    let route =
                        SingleNodeRoutingInfo::SpecificNode(Route::new(*slot, SlotAddr::Master));
                    async move {
                        let replies = conn
                            .route_pipeline(pipe, 0, 2, route)
                            .await
                            .map_err(StoreError::unavailable_from)?;
                        let split = split_replies(replies, 0, false, true, true)?;
                        if let Some(now) = &split.token
                            && now != token
                        {
                            return Err(changed(token, now));
                        }
                        Ok::<_, StoreError>(split.acked.unwrap_or(0))
                    }
                }))
                .await)
            })
            .await?;
        for acked in waits {
            let acked = acked?;
            if acked < self.replicas {
                return Err(not_replicated(acked, self.replicas, budget));
            }
        }
        Ok(())
    }
}

fn no_time_to_wait() -> StoreError {
    StoreError::unavailable(
        "no time left to wait for replicas: the write may have landed unreplicated".into(),
    )
}

/// The connection to a node was replaced in the middle of a write: a `WAIT` on the new one
/// would not cover what the old one wrote.
fn changed(before: &ConnToken, after: &ConnToken) -> StoreError {
    StoreError::unavailable(format!(
        "the connection to {} changed during the write (id {} then {} on {}): the write may have landed unreplicated",
        before.laddr, before.id, after.id, after.laddr
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn ok() -> Value {
        Value::Okay
    }

    fn info(id: u64) -> Value {
        bulk(&format!(
            "id={id} addr=127.0.0.1:51234 laddr=127.0.0.1:7001 fd=9 name= age=0 idle=0 flags=N db=0 cmd=client|info\n"
        ))
    }

    fn err(code: &str) -> Value {
        let v = redis::parse_redis_value(format!("-{code} something\r\n").as_bytes()).unwrap();
        assert!(matches!(v, Value::ServerError(_)));
        v
    }

    #[test]
    fn client_info_names_the_connection() {
        assert_eq!(
            parse_client_info(&info(42)),
            Ok(ConnToken {
                laddr: "127.0.0.1:7001".into(),
                id: 42
            })
        );
        let verbatim = Value::VerbatimString {
            format: redis::VerbatimFormat::Text,
            text: "id=7 addr=a:1 laddr=b:2 fd=1".into(),
        };
        assert_eq!(parse_client_info(&verbatim).unwrap().id, 7);
        for bad in [
            Value::Nil,
            Value::Int(3),
            bulk("addr=a:1 laddr=b:2"),
            bulk("id=x laddr=b:2"),
            bulk("id=3 addr=a:1"),
            bulk("id=3 laddr="),
        ] {
            assert!(parse_client_info(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn plain_and_atomic_replies_are_split() {
        let plain = split_replies(
            vec![Value::Int(1), info(5), Value::Int(1)],
            1,
            false,
            true,
            true,
        )
        .unwrap();
        assert_eq!(plain.results.len(), 1);
        assert_eq!(plain.token.as_ref().map(|t| t.id), Some(5));
        assert_eq!(plain.acked, Some(1));

        let atomic = split_replies(
            vec![
                ok(),
                Value::SimpleString("QUEUED".into()),
                Value::SimpleString("QUEUED".into()),
                Value::Array(vec![Value::Int(2), Value::Int(0)]),
                info(6),
            ],
            2,
            true,
            true,
            false,
        )
        .unwrap();
        assert!(matches!(
            atomic.results[..],
            [Ok(Value::Int(2)), Ok(Value::Int(0))]
        ));
        assert_eq!(atomic.acked, None);

        let only_wait = split_replies(vec![info(8), Value::Int(0)], 0, false, true, true).unwrap();
        assert!(only_wait.results.is_empty());
        assert_eq!(only_wait.acked, Some(0));
    }

    #[test]
    fn unnamed_replies_carry_no_client_info() {
        let r = split_replies(vec![Value::Int(1), Value::Int(2)], 2, false, false, false).unwrap();
        assert!(r.token.is_none());
        assert!(matches!(
            r.results[..],
            [Ok(Value::Int(1)), Ok(Value::Int(2))]
        ));
        let r = split_replies(
            vec![
                ok(),
                Value::SimpleString("QUEUED".into()),
                Value::Array(vec![Value::Int(7)]),
            ],
            1,
            true,
            false,
            false,
        )
        .unwrap();
        assert!(matches!(r.results[..], [Ok(Value::Int(7))]));
        // A CLIENT INFO reply where none was asked for is a shape error, not a result.
        assert!(split_replies(vec![Value::Int(1), info(1)], 1, false, false, false).is_err());
    }

    #[test]
    fn command_errors_stay_per_command() {
        let r = split_replies(
            vec![err("NOSCRIPT"), Value::Int(1), info(1)],
            2,
            false,
            true,
            false,
        )
        .unwrap();
        assert!(r.results[0].is_err());
        assert!(r.results[1].is_ok());
        // A transaction aborted at queueing: the culprit keeps its error, the rest abort.
        let r = split_replies(
            vec![
                ok(),
                err("WRONGTYPE"),
                Value::SimpleString("QUEUED".into()),
                err("EXECABORT"),
                info(1),
            ],
            2,
            true,
            true,
            false,
        )
        .unwrap();
        assert!(r.results.iter().all(Result::is_err));
        let r = split_replies(
            vec![
                ok(),
                Value::SimpleString("QUEUED".into()),
                Value::Nil,
                info(1),
            ],
            1,
            true,
            true,
            false,
        )
        .unwrap();
        assert!(r.results[0].is_err(), "an aborted transaction");
    }

    #[test]
    fn odd_shapes_are_errors_not_panics() {
        let cases: Vec<(Vec<Value>, usize, bool, bool)> = vec![
            // CLIENT INFO asked for and missing; or there and not asked for.
            (vec![Value::Int(1)], 1, false, false),
            (vec![], 0, false, true),
            (vec![info(1)], 1, false, false),
            (vec![Value::Int(1), info(1)], 1, false, true),
            (vec![Value::Int(1), info(1), bulk("x")], 1, false, true),
            (vec![Value::Int(1), Value::Nil], 1, false, false),
            (
                vec![
                    ok(),
                    Value::SimpleString("QUEUED".into()),
                    Value::Array(vec![]),
                    info(1),
                ],
                1,
                true,
                false,
            ),
            (
                vec![
                    ok(),
                    Value::SimpleString("QUEUED".into()),
                    Value::Int(3),
                    info(1),
                ],
                1,
                true,
                false,
            ),
            (vec![info(1), err("NOPERM")], 0, false, true),
            (vec![Value::Int(1), err("NOPERM")], 1, false, false),
        ];
        for (replies, n, atomic, wait) in cases {
            let shown = format!("{replies:?}");
            assert!(
                split_replies(replies, n, atomic, true, wait).is_err(),
                "{shown} for n={n} atomic={atomic} wait={wait}"
            );
        }
    }
}
