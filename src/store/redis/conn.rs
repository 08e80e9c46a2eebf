//! Where the Redis store's commands go: one Redis node, or a Redis Cluster.
//!
//! * One node: a `ConnectionManager` (one multiplexed connection that reconnects by itself);
//!   a batch of commands is one pipeline, one round trip.
//! * A cluster: the async cluster client (a multiplexed connection per node, slot map refreshed
//!   on `MOVED`/`ASK` and after failures). It refuses a pipeline whose commands span slots, so a
//!   batch is grouped by slot and the groups are sent concurrently: the whole batch still costs
//!   one network round trip of latency, whatever the number of nodes.
//!
//! Reads and writes never share a connection: [`RedisConn`] carries reads (and nothing that
//! blocks), and writes go through the [`WritePool`](super::write_pool::WritePool) of
//! connections of their own (`write_pool`: why, and how a write waits for replicas).
//!
//! `SCAN` walks one node's keys, so on a cluster the tools scan every primary in turn
//! (`scan_targets`, found with `CLUSTER NODES`), each by its address.

use std::collections::HashMap;
use std::time::Duration;

use futures::future::join_all;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{
    Client, Cmd, IntoConnectionInfo, Pipeline, RedisError, RedisFuture, RedisResult, Value,
};

use super::heal::HealingCluster;
use crate::store::layout::key_slot;

/// Installs rustls's crypto provider once per process (for `rediss://`).
fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A command and the key that routes it (the key it touches, or any key of its slot).
pub type Keyed = (Vec<u8>, Cmd);

/// A node to `SCAN`: the only one, or a cluster primary by address.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ScanTarget {
    Only,
    Primary { host: String, port: u16 },
}

impl std::fmt::Display for ScanTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScanTarget::Only => f.write_str("the node"),
            ScanTarget::Primary { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

/// The command connection of a Redis store.
#[derive(Clone)]
pub enum RedisConn {
    Single(ConnectionManager),
    Cluster(HealingCluster),
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Single(c) => c.req_packed_commands(cmd, offset, count),
            RedisConn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// A reply that is a server's error, as the error.
pub(super) fn server_error(v: Value) -> RedisResult<Value> {
    match v {
        Value::ServerError(e) => Err(e.into()),
        v => Ok(v),
    }
}

/// The result of a command the server did not answer (a short pipeline reply).
pub(super) fn missing() -> RedisResult<Value> {
    Err(RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "no reply for this command in the pipeline's answer",
    )))
}

/// A client per URL (TLS set up first), its connections without Nagle's delay (`tcp`).
pub(super) fn clients(opts: &ConnectOptions) -> RedisResult<Vec<Client>> {
    install_tls_provider();
    opts.urls
        .iter()
        .map(|u| Client::open(u.as_str().into_connection_info()?.set_tcp_settings(tcp())))
        .collect()
}

/// Every connection to Redis sets `TCP_NODELAY`, which the client leaves off by default:
/// with Nagle's algorithm a command written while an earlier one on the same multiplexed
/// connection is still unacknowledged waits for that acknowledgement. Measured on this
/// machine at 2,000 single-event requests a second: `POST /v1/events` p95 5.1–6.5 ms with
/// Nagle, 2.1–2.6 ms without (docs/performance.md; the p99 tail is another matter).
pub(super) fn tcp() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

/// How to connect.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// One URL for a node; several seed URLs for a cluster.
    pub urls: Vec<String>,
    pub cluster: bool,
    pub connect_timeout: Duration,
    pub response_timeout: Duration,
}

impl RedisConn {
    /// Connects; also returns a client per URL for pub/sub (which needs its own connection).
    /// `role` names the connection in logs (`reads`, `bulk`, `writes`).
    pub async fn connect(
        opts: &ConnectOptions,
        role: &'static str,
    ) -> RedisResult<(Self, Vec<Client>)> {
        let clients = clients(opts)?;
        Ok((Self::open(opts, &clients, false, role).await?, clients))
    }

    /// One more connection (a node) or connection set (a cluster) to the same Redis. With
    /// `resp3` a node's connection notices a disconnection at once and reconnects in the
    /// background, used or not (the write pool's members are often idle when Redis restarts
    /// or drops them).
    pub(super) async fn open(
        opts: &ConnectOptions,
        clients: &[Client],
        resp3: bool,
        role: &'static str,
    ) -> RedisResult<Self> {
        if opts.cluster {
            // The client's default wait before a retry is 1.28 s or more: a request that meets
            // a `CLUSTERDOWN` or a dead node during a failover would sit out most of a write's
            // deadline and all of a check's. Retry sooner; the caller's deadline bounds it all.
            let mut builder = ClusterClient::builder(opts.urls.clone())
                .tcp_settings(tcp())
                .connection_timeout(opts.connect_timeout)
                .response_timeout(opts.response_timeout)
                .retries(2)
                .min_retry_wait(10)
                .max_retry_wait(100);
            if resp3 {
                builder = builder.use_protocol(redis::ProtocolVersion::RESP3);
            }
            let cluster = builder.build()?;
            return Ok(RedisConn::Cluster(
                HealingCluster::connect(cluster, role).await?,
            ));
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(opts.connect_timeout))
            .set_response_timeout(Some(opts.response_timeout))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(500));
        let mut client = clients.first().cloned().ok_or_else(|| {
            RedisError::from((redis::ErrorKind::InvalidClientConfig, "no Redis URL"))
        })?;
        if resp3 {
            let info = client.get_connection_info().clone();
            let settings = info
                .redis_settings()
                .clone()
                .set_protocol(redis::ProtocolVersion::RESP3);
            client = Client::open(info.set_redis_settings(settings))?;
        }
        let conn = ConnectionManager::new_with_config(client, config).await?;
        Ok(RedisConn::Single(conn))
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisConn::Cluster(_))
    }

    /// Runs independent commands; one result per command, in order. One pipeline on a node;
    /// per-slot pipelines sent concurrently on a cluster.
    pub async fn run(&self, cmds: Vec<Keyed>) -> RedisResult<Vec<RedisResult<Value>>> {
        if cmds.is_empty() {
            return Ok(Vec::new());
        }
        match self {
            RedisConn::Single(c) => {
                let n = cmds.len();
                let mut pipe = redis::pipe();
                pipe.ignore_errors();
                for (_, cmd) in cmds {
                    pipe.add_command(cmd);
                }
                let mut out: Vec<RedisResult<Value>> = pipe.query_async(&mut c.clone()).await?;
                // A short reply is an error per missing command, never a shorter answer.
                out.resize_with(n, missing);
                Ok(out)
            }
            RedisConn::Cluster(c) => {
                let n = cmds.len();
                let mut groups: HashMap<Slot, (Vec<usize>, Pipeline)> = HashMap::new();
                for (i, (key, cmd)) in cmds.into_iter().enumerate() {
                    let g = groups.entry(Slot::for_key(&key)).or_insert_with(|| {
                        let mut p = redis::pipe();
                        p.ignore_errors();
                        (Vec::new(), p)
                    });
                    g.0.push(i);
                    g.1.add_command(cmd);
                }
                let replies = join_all(groups.into_values().map(|(idx, pipe)| {
                    let mut conn = c.clone();
                    async move {
                        let r: RedisResult<Vec<RedisResult<Value>>> =
                            pipe.query_async(&mut conn).await;
                        (idx, r)
                    }
                }))
                .await;
                let mut out: Vec<Option<RedisResult<Value>>> = (0..n).map(|_| None).collect();
                for (idx, r) in replies {
                    match r {
                        Ok(values) => {
                            for (i, v) in idx.into_iter().zip(values) {
                                out[i] = Some(v);
                            }
                        }
                        Err(e) => {
                            for i in idx {
                                out[i] = Some(Err(e.clone()));
                            }
                        }
                    }
                }
                Ok(out.into_iter().map(|v| v.unwrap_or_else(missing)).collect())
            }
        }
    }

    /// Like `run`, but every command must succeed.
    pub async fn run_all(&self, cmds: Vec<Keyed>) -> RedisResult<Vec<Value>> {
        self.run(cmds).await?.into_iter().collect()
    }

    /// `run_all` in one round trip per slot range of the cluster (`CLUSTER SLOTS`: one per
    /// primary unless slots were moved), for many keys over many slots at once (the 16,384
    /// shard markers at open; `run` sends a pipeline a slot). A range's pipeline that fails
    /// (a slot moved meanwhile: the client refuses a pipeline with a `MOVED` in it) is sent
    /// again by `run_all`. One pipeline on a node.
    pub async fn run_spread(&self, cmds: Vec<Keyed>) -> RedisResult<Vec<Value>> {
        let RedisConn::Cluster(c) = self else {
            return self.run_all(cmds).await;
        };
        let slots = c
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await?;
        let ranges: Vec<(u16, u16)> = match slots {
            Value::Array(ranges) => ranges
                .iter()
                .filter_map(|r| match r {
                    Value::Array(r) => match (r.first(), r.get(1)) {
                        (Some(Value::Int(a)), Some(Value::Int(b))) => {
                            Some((u16::try_from(*a).ok()?, u16::try_from(*b).ok()?))
                        }
                        _ => None,
                    },
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        let mut groups: Vec<Vec<usize>> = vec![Vec::new(); ranges.len()];
        let mut again = Vec::new();
        for (i, (key, _)) in cmds.iter().enumerate() {
            let slot = key_slot(key);
            match ranges.iter().position(|&(a, b)| (a..=b).contains(&slot)) {
                Some(g) => groups[g].push(i),
                None => again.push(i),
            }
        }
        let sent = join_all(
            groups
                .into_iter()
                .zip(&ranges)
                .filter(|(idx, _)| !idx.is_empty())
                .map(|(idx, &(start, _))| {
                    let mut pipe = redis::pipe();
                    for &i in &idx {
                        pipe.add_command(cmds[i].1.clone());
                    }
                    let route = Route::new(start, SlotAddr::Master);
                    let route = SingleNodeRoutingInfo::SpecificNode(route);
                    async move { (c.route_pipeline(pipe, 0, idx.len(), route).await, idx) }
                }),
        )
        .await;
        let mut out: Vec<Option<Value>> = vec![None; cmds.len()];
        for (replies, idx) in sent {
            match replies {
                Ok(replies) => {
                    for (i, v) in idx.into_iter().zip(replies) {
                        out[i] = Some(server_error(v)?);
                    }
                }
                Err(_) => again.extend(idx),
            }
        }
        if !again.is_empty() {
            let cmds_again = again.iter().map(|&i| cmds[i].clone()).collect();
            for (i, v) in again.into_iter().zip(self.run_all(cmds_again).await?) {
                out[i] = Some(v);
            }
        }
        out.into_iter()
            .map(|v| v.map_or_else(missing, Ok))
            .collect()
    }

    /// The nodes to `SCAN` for every key: the node, or every cluster primary.
    pub async fn scan_targets(&self) -> RedisResult<Vec<ScanTarget>> {
        let RedisConn::Cluster(c) = self else {
            return Ok(vec![ScanTarget::Only]);
        };
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut c.clone())
            .await?;
        let mut out: Vec<ScanTarget> = nodes
            .lines()
            .filter_map(|line| {
                let parts: Vec<&str> = line.split_whitespace().collect();
                let flags = parts.get(2)?;
                if !flags.contains("master") || flags.contains("fail") || parts.get(8).is_none() {
                    return None; // replicas, failed nodes, primaries without slots
                }
                let addr = parts.get(1)?.split('@').next()?;
                let (host, port) = addr.rsplit_once(':')?;
                Some(ScanTarget::Primary {
                    host: host.to_owned(),
                    port: port.parse().ok()?,
                })
            })
            .collect();
        out.sort_by_key(|t| t.to_string());
        Ok(out)
    }

    /// Runs one command on one scan target (`SCAN`, `INFO`, `CONFIG GET`).
    pub async fn on_target<T: redis::FromRedisValue>(
        &self,
        target: &ScanTarget,
        cmd: &Cmd,
    ) -> RedisResult<T> {
        match (self, target) {
            (RedisConn::Cluster(c), ScanTarget::Primary { host, port }) => {
                let v = c
                    .route_command(
                        cmd.clone(),
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: host.clone(),
                            port: *port,
                        }),
                    )
                    .await?;
                Ok(redis::from_redis_value(v)?)
            }
            _ => cmd.query_async(&mut self.clone()).await,
        }
    }

    /// One `SCAN` step on a target: (next cursor, keys).
    pub async fn scan(
        &self,
        target: &ScanTarget,
        cursor: u64,
        pattern: &str,
        count: u32,
    ) -> RedisResult<(u64, Vec<Vec<u8>>)> {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count);
        self.on_target(target, &cmd).await
    }

    /// Runs a command on every primary (or the node); one reply each.
    pub async fn on_every_primary<T: redis::FromRedisValue>(
        &self,
        cmd: &Cmd,
    ) -> RedisResult<Vec<T>> {
        let targets = self.scan_targets().await?;
        let mut out = Vec::with_capacity(targets.len());
        for t in &targets {
            out.push(self.on_target(t, cmd).await?);
        }
        Ok(out)
    }
}
