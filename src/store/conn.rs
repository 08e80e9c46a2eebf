//! Where the Redis store's commands go: one Redis node, or a Redis Cluster.
//!
//! * One node: a `ConnectionManager` (one multiplexed connection that reconnects by itself);
//!   a batch of commands is one pipeline, one round trip.
//! * A cluster: the async cluster client (a multiplexed connection per node, slot map refreshed
//!   on `MOVED`/`ASK` and after failures). It refuses a pipeline whose commands span slots, so a
//!   batch is grouped by slot and the groups are sent concurrently: the whole batch still costs
//!   one network round trip of latency, whatever the number of nodes.
//!
//! `SCAN` walks one node's keys, so on a cluster the tools scan every primary in turn
//! (`scan_targets`, found with `CLUSTER NODES`), each by its address.

use std::collections::HashMap;
use std::time::Duration;

use futures::future::join_all;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{Client, Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};

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
    Cluster(ClusterConnection),
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
    pub async fn connect(opts: &ConnectOptions) -> RedisResult<(Self, Vec<Client>)> {
        install_tls_provider();
        let clients = opts
            .urls
            .iter()
            .map(|u| Client::open(u.as_str()))
            .collect::<RedisResult<Vec<_>>>()?;
        if opts.cluster {
            let cluster = ClusterClient::builder(opts.urls.clone())
                .connection_timeout(opts.connect_timeout)
                .response_timeout(opts.response_timeout)
                .retries(2)
                .build()?;
            let conn = cluster.get_async_connection().await?;
            return Ok((RedisConn::Cluster(conn), clients));
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(opts.connect_timeout))
            .set_response_timeout(Some(opts.response_timeout))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(500));
        let client = clients.first().cloned().ok_or_else(|| {
            RedisError::from((redis::ErrorKind::InvalidClientConfig, "no Redis URL"))
        })?;
        let conn = ConnectionManager::new_with_config(client, config).await?;
        Ok((RedisConn::Single(conn), clients))
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
                let mut pipe = redis::pipe();
                pipe.ignore_errors();
                for (_, cmd) in cmds {
                    pipe.add_command(cmd);
                }
                pipe.query_async(&mut c.clone()).await
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
                Ok(out
                    .into_iter()
                    .map(|v| v.expect("every command has a reply"))
                    .collect())
            }
        }
    }

    /// Like `run`, but every command must succeed.
    pub async fn run_all(&self, cmds: Vec<Keyed>) -> RedisResult<Vec<Value>> {
        self.run(cmds).await?.into_iter().collect()
    }

    /// Runs writes and, with `replicas > 0`, waits (`WAIT`) until that many replicas of every
    /// node written to have them: a write acknowledged then survives the loss of its primary.
    /// `atomic` makes it one `MULTI`/`EXEC` on a node (all or nothing); a cluster has no
    /// transaction across slots, so there it only keeps each slot's commands together.
    pub async fn run_writes(
        &self,
        cmds: Vec<Keyed>,
        atomic: bool,
        replicas: u32,
        wait: Duration,
    ) -> RedisResult<Vec<Value>> {
        if cmds.is_empty() {
            return Ok(Vec::new());
        }
        let wait_cmd = || {
            let mut w = redis::cmd("WAIT");
            w.arg(replicas).arg(wait.as_millis() as u64);
            w
        };
        let check_wait = |v: &Value| -> RedisResult<()> {
            let acked: u32 = redis::from_redis_value_ref(v)?;
            if acked < replicas {
                return Err(RedisError::from((
                    redis::ErrorKind::Io,
                    "write not replicated in time",
                    format!("{acked} of {replicas} replicas acknowledged within {wait:?}"),
                )));
            }
            Ok(())
        };
        match self {
            RedisConn::Single(c) => {
                let mut pipe = redis::pipe();
                let n = cmds.len();
                if atomic {
                    pipe.cmd("MULTI");
                }
                for (_, cmd) in cmds {
                    pipe.add_command(cmd);
                }
                if atomic {
                    pipe.cmd("EXEC");
                }
                if replicas > 0 {
                    pipe.add_command(wait_cmd());
                }
                let mut replies: Vec<Value> = pipe.query_async(&mut c.clone()).await?;
                if replicas > 0 {
                    check_wait(&replies.pop().expect("the WAIT reply"))?;
                }
                if atomic {
                    // MULTI, n QUEUED, then EXEC's array of the real replies.
                    let exec = replies.pop().expect("the EXEC reply");
                    return match exec {
                        Value::Array(v) => v
                            .into_iter()
                            .map(|v| match v {
                                Value::ServerError(e) => Err(e.into()),
                                v => Ok(v),
                            })
                            .collect(),
                        Value::Nil => Err(RedisError::from((
                            redis::ErrorKind::Io,
                            "transaction aborted",
                        ))),
                        other => Ok(vec![other; n]),
                    };
                }
                Ok(replies)
            }
            RedisConn::Cluster(c) => {
                let n = cmds.len();
                let mut groups: HashMap<Slot, (Vec<usize>, Pipeline)> = HashMap::new();
                for (i, (key, cmd)) in cmds.into_iter().enumerate() {
                    let g = groups
                        .entry(Slot::for_key(&key))
                        .or_insert_with(|| (Vec::new(), redis::pipe()));
                    g.0.push(i);
                    g.1.add_command(cmd);
                }
                let replies = join_all(groups.into_values().map(|(idx, mut pipe)| {
                    let mut conn = c.clone();
                    if replicas > 0 {
                        // Keyless: it follows the pipeline to the node of its slot.
                        pipe.add_command(wait_cmd());
                    }
                    async move {
                        let mut r: Vec<Value> = pipe.query_async(&mut conn).await?;
                        if replicas > 0 {
                            check_wait(&r.pop().expect("the WAIT reply"))?;
                        }
                        Ok::<_, RedisError>((idx, r))
                    }
                }))
                .await;
                let mut out: Vec<Value> = vec![Value::Nil; n];
                for r in replies {
                    let (idx, values) = r?;
                    for (i, v) in idx.into_iter().zip(values) {
                        out[i] = v;
                    }
                }
                Ok(out)
            }
        }
    }

    /// Waits (`WAIT`) until `replicas` replicas of the primaries owning `keys` have every
    /// write sent so far; an error if fewer acknowledge within `timeout`.
    pub async fn wait_for(
        &self,
        keys: &[Vec<u8>],
        replicas: u32,
        timeout: Duration,
    ) -> RedisResult<()> {
        if replicas == 0 || keys.is_empty() {
            return Ok(());
        }
        let mut w = redis::cmd("WAIT");
        w.arg(replicas).arg(timeout.as_millis() as u64);
        let acks: Vec<u32> = match self {
            RedisConn::Single(c) => vec![w.query_async(&mut c.clone()).await?],
            RedisConn::Cluster(c) => {
                let mut slots: Vec<Slot> = keys.iter().map(Slot::for_key).collect();
                slots.sort_by_key(|s| format!("{s:?}"));
                slots.dedup();
                let replies = join_all(slots.into_iter().map(|slot| {
                    let mut conn = c.clone();
                    let w = w.clone();
                    async move {
                        let route = Route::with_slot(slot, SlotAddr::Master);
                        let v = conn
                            .route_command(
                                w,
                                RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                            )
                            .await?;
                        redis::from_redis_value::<u32>(v).map_err(RedisError::from)
                    }
                }))
                .await;
                replies.into_iter().collect::<RedisResult<_>>()?
            }
        };
        match acks.into_iter().min() {
            Some(a) if a < replicas => Err(RedisError::from((
                redis::ErrorKind::Io,
                "write not replicated in time",
                format!("{a} of {replicas} replicas acknowledged within {timeout:?}"),
            ))),
            _ => Ok(()),
        }
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
                    .clone()
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
