//! The replica monitor: which primary serves which slots, and how many replicas each has
//! online, so a write that cannot be given its guarantee is refused before anything is sent.
//!
//! `WAIT n` counts the replicas a primary sees online (`INFO replication`:
//! `slaveN:…,state=online,…`). A write whose keys live on a primary with fewer than
//! `write_replicas` of them could only wait out its whole deadline and fail, so it is refused at
//! once ([`Refusal::Replicas`](crate::store::Refusal::Replicas), HTTP `503 replicas_unavailable`). A primary that does not
//! answer (killed, cut off, not yet replaced by its replica) is refused at once too
//! ([`Refusal::Unreachable`](crate::store::Refusal::Unreachable), `503 store_unavailable`) rather than letting the write burn its
//! deadline on reconnects. Writes that touch only healthy primaries go through.
//!
//! The monitor runs on connections of its own (one per node, never the service's read or
//! write connections): every 250 ms, every 100 ms while some primary is unhealthy (so a
//! rejoined replica is noticed quickly), and at once when a write fails
//! ([`ReplicaMonitor::refresh_soon`]). On a cluster it reads the slot map (`CLUSTER SLOTS`)
//! from the first node that answers, then `INFO replication` from every primary, each probe
//! bounded by a short timeout.
//!
//! Invariant: a refusal is only ever based on a fresh picture. A snapshot older than
//! [`STALE_AFTER`], a slot the map does not cover, or a primary whose state could not be read
//! for a reason other than unreachability (e.g. `INFO` refused by an ACL) never refuses: the
//! write is sent and its `WAIT` is bounded by the caller's deadline, as without a monitor.
//!
//! Here: the monitor's task and its prober (connections, probe rounds, the pace); the
//! picture a round takes and every decision made from it (parsing `INFO replication` and
//! `CLUSTER SLOTS`, which primary serves a slot, refusals, audit-part placement) is
//! `topology`, which does no I/O.

mod topology;

pub use topology::{
    PrimaryState, ReplicationInfo, STALE_AFTER, SlotRange, Topology, parse_cluster_slots,
    parse_replication_info,
};

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, RedisError, Value};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::store::layout::CLUSTER_SLOTS;

/// Probe period while every primary is healthy.
pub const HEALTHY_PERIOD: Duration = Duration::from_millis(250);
/// Probe period while some primary is not: a replica that rejoins is seen within this.
pub const UNHEALTHY_PERIOD: Duration = Duration::from_millis(100);
/// Longest wait for one probe (connect or command).
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// Where the monitor looks.
#[derive(Debug, Clone)]
pub enum Watched {
    /// One node: it serves every slot.
    Node(Box<ConnectionInfo>),
    /// A cluster, found through these seeds (their TLS and credentials are used for every
    /// node).
    Cluster(Vec<ConnectionInfo>),
}

/// Probes nodes on connections of its own.
struct Prober {
    watched: Watched,
    conns: HashMap<String, MultiplexedConnection>,
    /// Nodes to ask for the slot map, the last one that answered first.
    candidates: Vec<String>,
    last: Option<Arc<Topology>>,
}

/// Is this error a sign that the node is not serving (rather than refusing one command)?
fn is_unreachable(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(e.code(), Some("LOADING" | "MASTERDOWN" | "CLUSTERDOWN"))
}

fn addr_text(info: &ConnectionInfo) -> String {
    match info.addr() {
        ConnectionAddr::Tcp(h, p)
        | ConnectionAddr::TcpTls {
            host: h, port: p, ..
        } => {
            format!("{h}:{p}")
        }
        ConnectionAddr::Unix(path) => path.display().to_string(),
        other => format!("{other:?}"),
    }
}

impl Prober {
    fn new(watched: Watched) -> Self {
        let candidates = match &watched {
            Watched::Node(info) => vec![addr_text(info)],
            Watched::Cluster(seeds) => seeds.iter().map(addr_text).collect(),
        };
        Self {
            watched,
            conns: HashMap::new(),
            candidates,
            last: None,
        }
    }

    /// The connection info for `addr` (`host:port`): the template's TLS and credentials.
    fn info_for(&self, addr: &str) -> Option<ConnectionInfo> {
        let template = match &self.watched {
            Watched::Node(info) => return Some((**info).clone()),
            Watched::Cluster(seeds) => seeds.first()?.clone(),
        };
        let (host, port) = addr.rsplit_once(':')?;
        let port: u16 = port.parse().ok()?;
        let host = host.to_owned();
        let addr = match template.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host,
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host, port),
        };
        Some(template.set_addr(addr))
    }

    /// Runs `cmd` on the node at `addr`, connecting first if needed; a connection that
    /// failed is dropped (reconnected next time).
    async fn query(&mut self, addr: &str, cmd: &redis::Cmd) -> Result<Value, PrimaryState> {
        let info = self
            .info_for(addr)
            .ok_or_else(|| PrimaryState::Unknown(format!("bad address {addr}")))?;
        let (conn, r) = probe_node(self.conns.get(addr).cloned(), info, cmd).await;
        match conn {
            Some(c) => self.conns.insert(addr.to_owned(), c),
            None => self.conns.remove(addr),
        };
        r
    }

    /// One probe round.
    async fn probe(&mut self) -> Topology {
        let ranges = match self.watched {
            Watched::Node(_) => vec![SlotRange {
                start: 0,
                end: CLUSTER_SLOTS - 1,
                primary: self.candidates[0].clone(),
            }],
            Watched::Cluster(_) => match self.slot_map().await {
                Some(r) => r,
                None => return self.nobody_answers(),
            },
        };
        let mut addrs: Vec<String> = ranges.iter().map(|r| r.primary.clone()).collect();
        addrs.sort();
        addrs.dedup();
        // Connect what is missing, then ask every primary at once.
        let mut info = redis::cmd("INFO");
        info.arg("replication");
        let mut probes = Vec::with_capacity(addrs.len());
        for a in &addrs {
            let conn = self.conns.get(a).cloned();
            let target = self.info_for(a);
            let info = info.clone();
            probes.push(async move {
                match target {
                    Some(t) => probe_node(conn, t, &info).await,
                    None => (None, Err(PrimaryState::Unknown("bad address".into()))),
                }
            });
        }
        let replies = join_all(probes).await;
        let mut states = HashMap::new();
        for (a, (conn, r)) in addrs.into_iter().zip(replies) {
            match conn {
                Some(c) => self.conns.insert(a.clone(), c),
                None => self.conns.remove(&a),
            };
            let state = match r {
                Ok(v) => {
                    match redis::from_redis_value::<String>(v)
                        .map_err(|e| e.to_string())
                        .and_then(|t| parse_replication_info(&t))
                    {
                        Ok(i) if i.primary => PrimaryState::Up {
                            online_replicas: i.online_replicas,
                        },
                        Ok(_) => PrimaryState::NotPrimary,
                        Err(e) => PrimaryState::Unknown(e),
                    }
                }
                Err(s) => s,
            };
            states.insert(a, state);
        }
        Topology::new(Instant::now(), &ranges, &states)
    }

    /// The slot map from the first node that answers (the last good one first), or `None`.
    async fn slot_map(&mut self) -> Option<Vec<SlotRange>> {
        let cmd = redis::cmd("CLUSTER").arg("SLOTS").to_owned();
        for i in 0..self.candidates.len() {
            let addr = self.candidates[i].clone();
            let Ok(v) = self.query(&addr, &cmd).await else {
                continue;
            };
            let host = addr.rsplit_once(':').map_or("", |(h, _)| h);
            match parse_cluster_slots(&v, host) {
                Ok(ranges) if !ranges.is_empty() => {
                    // Ask this one first next time; learn every primary as a candidate.
                    self.candidates.swap(0, i);
                    for r in &ranges {
                        if !self.candidates.contains(&r.primary) {
                            self.candidates.push(r.primary.clone());
                        }
                    }
                    return Some(ranges);
                }
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(node = addr, error = e, "unreadable CLUSTER SLOTS reply");
                    continue;
                }
            }
        }
        None
    }

    /// No node gave a slot map: the last map, every primary unreachable.
    fn nobody_answers(&self) -> Topology {
        let Some(last) = &self.last else {
            return Topology::unknown();
        };
        let ranges: Vec<SlotRange> = last
            .ranges
            .iter()
            .map(|(s, e, p)| SlotRange {
                start: *s,
                end: *e,
                primary: last.primaries[*p].0.clone(),
            })
            .collect();
        let states = last
            .primaries
            .iter()
            .map(|(a, _)| {
                (
                    a.clone(),
                    PrimaryState::Unreachable("no cluster node answers".into()),
                )
            })
            .collect();
        Topology::new(Instant::now(), &ranges, &states)
    }
}

async fn connect(info: ConnectionInfo) -> Result<MultiplexedConnection, PrimaryState> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(PROBE_TIMEOUT))
        .set_response_timeout(Some(PROBE_TIMEOUT));
    let client = Client::open(info).map_err(|e| PrimaryState::Unknown(e.to_string()))?;
    match tokio::time::timeout(
        PROBE_TIMEOUT,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) if is_unreachable(&e) => Err(PrimaryState::Unreachable(e.to_string())),
        Ok(Err(e)) => Err(PrimaryState::Unknown(e.to_string())),
        Err(_) => Err(PrimaryState::Unreachable(format!(
            "no connection within {PROBE_TIMEOUT:?}"
        ))),
    }
}

/// Runs `cmd` on a node: on `conn` if there is one, else on a new connection. A connection
/// that fails as if the node were gone is replaced and the command tried once more on a new
/// one, so a connection dropped on its own (`CLIENT KILL`, an idle timeout) is not taken for
/// a dead node. Returns the connection to keep (if any) and the outcome.
async fn probe_node(
    conn: Option<MultiplexedConnection>,
    info: ConnectionInfo,
    cmd: &redis::Cmd,
) -> (Option<MultiplexedConnection>, Result<Value, PrimaryState>) {
    if let Some(c) = conn {
        match run_probe(c.clone(), cmd).await {
            Err(PrimaryState::Unreachable(_)) => {}
            r => return (Some(c), r),
        }
    }
    let c = match connect(info).await {
        Ok(c) => c,
        Err(s) => return (None, Err(s)),
    };
    match run_probe(c.clone(), cmd).await {
        Err(s @ PrimaryState::Unreachable(_)) => (None, Err(s)),
        r => (Some(c), r),
    }
}

async fn run_probe(
    mut conn: MultiplexedConnection,
    cmd: &redis::Cmd,
) -> Result<Value, PrimaryState> {
    match tokio::time::timeout(PROBE_TIMEOUT, cmd.query_async::<Value>(&mut conn)).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) if is_unreachable(&e) => Err(PrimaryState::Unreachable(e.to_string())),
        Ok(Err(e)) => Err(PrimaryState::Unknown(e.to_string())),
        Err(_) => Err(PrimaryState::Unreachable(format!(
            "no answer within {PROBE_TIMEOUT:?}"
        ))),
    }
}

struct Shared {
    topology: watch::Sender<Arc<Topology>>,
    wake: Notify,
}

/// The running monitor; its task stops when it is dropped.
pub struct ReplicaMonitor {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Drop for ReplicaMonitor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ReplicaMonitor {
    /// Takes a first picture, then keeps it fresh in the background. `needed` (the
    /// `write_replicas` setting) only sets the pace: a picture short of it is retaken every
    /// 100 ms.
    pub async fn start(watched: Watched, needed: u32) -> Self {
        let mut prober = Prober::new(watched);
        let first = Arc::new(prober.probe().await);
        prober.last = Some(first.clone());
        for (addr, state) in first.primaries() {
            if let PrimaryState::Unknown(why) = state {
                tracing::warn!(
                    node = addr,
                    why,
                    "cannot read this primary's replicas: its writes are never refused early, only bounded by their deadline"
                );
            }
        }
        let shared = Arc::new(Shared {
            topology: watch::Sender::new(first),
            wake: Notify::new(),
        });
        let task = tokio::spawn(run(prober, shared.clone(), needed));
        Self { shared, task }
    }

    /// The latest picture.
    pub fn topology(&self) -> Arc<Topology> {
        self.shared.topology.borrow().clone()
    }

    /// Every new picture from now on (a write in flight gives up when its primary goes).
    pub fn subscribe(&self) -> watch::Receiver<Arc<Topology>> {
        let mut rx = self.shared.topology.subscribe();
        rx.mark_unchanged();
        rx
    }

    /// Asks for a new picture now (a write just failed).
    pub fn refresh_soon(&self) {
        self.shared.wake.notify_one();
    }
}

async fn run(mut prober: Prober, shared: Arc<Shared>, needed: u32) {
    loop {
        let healthy = prober.last.as_ref().is_some_and(|t| t.all_healthy(needed));
        let period = if healthy {
            HEALTHY_PERIOD
        } else {
            UNHEALTHY_PERIOD
        };
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = shared.wake.notified() => {}
        }
        let t = Arc::new(prober.probe().await);
        if let Some(last) = &prober.last {
            log_changes(last, &t, needed);
        }
        prober.last = Some(t.clone());
        shared.topology.send_replace(t);
    }
}

/// Logs a primary whose health changed (once per change, not per probe).
fn log_changes(before: &Topology, now: &Topology, needed: u32) {
    let old: HashMap<&str, &PrimaryState> = before.primaries().collect();
    for (addr, state) in now.primaries() {
        if old.get(addr) == Some(&state) {
            continue;
        }
        match state {
            PrimaryState::Up { online_replicas } if *online_replicas >= needed => {
                tracing::info!(node = addr, online_replicas, "primary healthy")
            }
            PrimaryState::Up { online_replicas } => tracing::warn!(
                node = addr,
                online_replicas,
                needed,
                "primary has too few replicas online: its writes are refused"
            ),
            PrimaryState::Unreachable(why) => {
                tracing::warn!(
                    node = addr,
                    why,
                    "primary unreachable: its writes are refused"
                )
            }
            PrimaryState::NotPrimary => tracing::warn!(node = addr, "node is no longer a primary"),
            PrimaryState::Unknown(why) => tracing::warn!(node = addr, why, "primary state unknown"),
        }
    }
}
