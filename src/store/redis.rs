//! The Redis store: the layout of `layout` on one Redis node or a Redis Cluster (`conn`).
//!
//! Reads and writes go over different connections (`conn`): the checks' reads (`HGET`
//! batches, registry `SMEMBERS`, feature reads) over one multiplexed connection per node (or
//! per HTTP worker, `worker_conn`), never behind anything that blocks; operators' reads (the
//! audit trail, list counts, definitions, and any read made on the operator lane, `lane`)
//! over one of their own, so that a late reply to one of them never sits in front of a
//! check's; writes over a pool of their own, followed by `WAIT` when
//! `write_replicas > 0`. Pub/sub uses its own connection too, and so does the replica monitor
//! (`replicas`), which lets a write whose primary cannot give the guarantee be refused before
//! anything is sent (`StoreError::Refused`).
//!
//! Reads are batches of `HGET`s: one pipeline, one round trip (on a cluster, per-slot
//! pipelines sent together). Whole buckets (for the local tier) are read with `DUMP` and
//! parsed here (`dump::read_hash_dump`: a third less Redis CPU than `HGETALL`, one string to
//! parse); a bucket that is not a listpack, or a server that refuses `DUMP` (ACLs), is read
//! with `HGETALL` instead. An upsert on one node is one `MULTI`/`EXEC` (registry `SADD`s
//! first, so a range is never stored before a reader would probe it; then `HSET`s per entry,
//! the audit appends (one `EVAL` per part written to: `XADD`s, their index, the trim; see
//! `layout`, *Audit trail*) and finally the `PUBLISH`) and its `WAIT`, in one pipeline, so
//! it is taken whole or not at all. A cluster has no transaction across slots:
//! there the same steps run in that order as three batches (registries; buckets; audit and
//! publish; each a `MULTI`/`EXEC` per slot), then one `WAIT` per primary written to, and an
//! error at any step fails the write (it may be partly applied; a retry is idempotent). The
//! audit records go to parts on the primaries of their entries (`layout`), and the `PUBLISH`
//! rides with them, so a write depends on no shard but its own entries'. Deletes and lazy
//! expiry are Lua scripts, one per bucket, called by SHA (loaded at start-up and again after a
//! `NOSCRIPT`); definitions and audit appends are scripts sent whole (`EVAL`), the appends
//! because they run inside a write's `MULTI`. The lists' counts are four keys on one hash tag
//! (`layout`, *The lists' counts*): a change is one script call per 1,000 pairs on the write
//! path (no replica waited for: bookkeeping), a page one read-only script call on the
//! operators' connection, O(log n + page). The service's start folds the counts of the older
//! 64-part layout into them (`fold_old_counts`), once per pair. At open, the audit streams' records that no
//! index holds yet are indexed (`layout`, *Audit trail*): once after an upgrade, then a round
//! trip that finds nothing. Audit reads through the index are plain commands: a `ZRANGE` of
//! each index, then an `XRANGE` of each record it names.
//!
//! Writes take the caller's deadline and never ask the server to wait past it; reads have no
//! deadline of their own beyond the connection's response timeout: the service wraps every
//! call in the deadline that fits it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use redis::{Client, Cmd, ErrorKind, RedisError, RedisResult, Script, ServerErrorKind};

use super::changelog;
use super::conn::{ConnectOptions, Keyed, RedisConn, WRITE_CONNECTIONS, WritePool, WriteSession};
use super::dump;
use super::scripts::{
    self, AUDIT_APPEND_LUA, AUDIT_CATCH_UP_LUA, COUNT_CHANGES, COUNTS_PAGE, DELETE_DEFINITION,
    GUARDED_PUBLISH, METRIC_OP_ARGS, MetricScripts, OPEN_KEYSPACE, PUT_DEFINITION, TAKE_OLD_COUNTS,
    is_noscript,
};
use super::worker_conn::PerWorker;

use super::expiry::ExpiryCode;
use super::fingerprint::{self, FingerprintKey, RecordedHashing};
use super::layout::{
    AUDIT_INDEX_ID_LEN, AUDIT_PARTS, COUNT_CHUNK, DEFAULT_EXPECTED_EVENT_IDS, MAX_MEAN_FILL,
    audit_index_id, audit_index_term, key_slot, parse_audit_index_id,
};
use super::replicas::{ReplicaMonitor, Topology, Watched};
use super::{
    AuditChunk, AuditPos, AuditRead, AuditRecord, AuditReports, AuditSummary, AuditTerm,
    CountChange, CountsPage, CountsQuery, Deadline, DefinitionKind, DefinitionStore, EntryKey,
    EntryStore, EventMark, Invalidation, InvalidationBus, InvalidationStream, KeyspaceHealth,
    Layout, ListCount, Liveness, LogMark, MetricAnswer, MetricFamily, MetricOp, MetricReading,
    MetricStore, PrefixLen, Refusal, Removed, Replay, Scope, StoreBase, StoreError, StoreResult,
    StoredDefinition, WriteBatch,
};
use crate::domain::{ListName, Sandbox, now_ms};

/// How to reach Redis and which keyspace to open. Built from the settings by
/// `RedisOptions::from_settings` (in `config`, which is above the store).
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// One Redis node (ignored when `cluster_nodes` is not empty).
    pub url: String,
    /// Seed URLs of a Redis Cluster.
    pub cluster_nodes: Vec<String>,
    pub prefix: String,
    /// Sizes a new keyspace; when set, must agree with an existing one.
    pub expected_entries: Option<u64>,
    /// Sizes a new keyspace when `expected_entries` is unset.
    pub default_expected_entries: u64,
    pub connect_timeout: Duration,
    /// Upper bound on any single response; callers apply tighter deadlines.
    pub response_timeout: Duration,
    pub audit_max_len: usize,
    /// Writes are acknowledged only once this many replicas have them (`WAIT`); 0: once the
    /// primary has them.
    pub write_replicas: u32,
    /// The fingerprint key (`fingerprint`): needed to create a keyspace and to open a keyed one.
    pub fingerprint_key: Option<FingerprintKey>,
    /// Without a key, create an unkeyed (format 1) keyspace instead of refusing.
    pub allow_unkeyed: bool,
    /// Sizes the buckets of remembered event ids when first recorded (`layout`, *Event ids*).
    pub dedupe_expected_ids: u64,
}

/// What opening the keyspace found, for the start-up log.
#[derive(Debug, Clone)]
pub struct OpenReport {
    pub created: bool,
    pub buckets: u32,
    /// The layout format (2 keyed, 1 unkeyed) and, keyed, the key's id.
    pub format: u32,
    pub key_id: Option<String>,
    /// Problems worth a loud warning that do not stop the service.
    pub warnings: Vec<String>,
    /// Set for an unkeyed keyspace: the line to log at ERROR at every start-up.
    pub unkeyed: Option<String>,
    /// Audit records indexed at open: those written before the index existed (or by an
    /// older build since); 0 once every stream is indexed.
    pub audit_indexed: u64,
}

/// What `RedisStore::fold_old_counts` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Folded {
    /// Pairs taken out of the older layout's parts and added to the counts (pairs at 0 or
    /// below included: added, they leave nothing).
    pub pairs: u64,
    /// Fields of the parts that are not pairs that layout wrote: left where they are.
    pub left_alone: u64,
}

/// Records an audit append indexes first, of those an older build left unindexed (a rolling
/// deploy): what catches a part up without waiting for the next start-up.
const AUDIT_CATCH_UP_PER_WRITE: usize = 100;

/// Records one catch-up call indexes at open (a few ms of Redis each, so that nothing else
/// waits long behind it).
const AUDIT_INDEX_CHUNK: usize = 1_000;

/// The Redis store.
pub struct RedisStore {
    /// One client per configured URL, for pub/sub (tried in turn).
    pubsub_clients: Vec<Client>,
    pubsub_next: AtomicUsize,
    /// Reads, and nothing that blocks on the server.
    conn: RedisConn,
    /// The checks' reads on an HTTP worker: a connection of the worker's own (one node).
    per_worker: Option<PerWorker>,
    /// The local tier's whole-bucket reads (`DUMP`/`HGETALL` of ~200-field buckets, 64 to a
    /// pipeline), on a connection of their own: Redis answers one connection's commands in
    /// order, so a reload of every bucket (start-up, a resubscription after a failover) on
    /// the checks' connection put each check's `HGET`s behind thousands of `DUMP`s, and
    /// checks missed their deadline for seconds (`tests/integration/failover.rs` with the tier on).
    bulk: RedisConn,
    /// The operator lane's reads (`lane`): list counts, lookups, the audit trail. Redis
    /// answers one connection's commands in order, and an operator's call that its caller
    /// stopped waiting for is still answered: on a connection of its own, that late reply
    /// sits in front of no check's.
    operator: RedisConn,
    /// The change log's reads (`changelog`): every instance reads every record, a few
    /// seconds behind, and all of a break's records at once after it. On a connection of its
    /// own: a long reply (or one whose caller gave up) queues in front of nobody else's.
    log: RedisConn,
    /// Writes and their `WAIT`s.
    writes: WritePool,
    monitor: ReplicaMonitor,
    layout: Layout,
    /// Cap of each audit part (`audit_max_len` over the parts).
    audit_part_len: usize,
    remove: Script,
    remove_if_unchanged: Script,
    count_changes: Script,
    counts_page: Script,
    metric_scripts: MetricScripts,
    pubsub_timeout: Duration,
    write_replicas: u32,
    /// The server refused `DUMP` once (ACLs, renamed command): buckets are read with
    /// `HGETALL` from then on.
    dump_refused: AtomicBool,
    /// The keyspace's id as opened, and whether it is still there (`layout`, *The keyspace
    /// id*): set when a read, a write or `verify_keyspace` finds the meta hash without it.
    keyspace_id: String,
    lost: AtomicBool,
    health: tokio::sync::watch::Sender<KeyspaceHealth>,
}

impl RedisStore {
    /// The connection for a read: the operator lane's own on the lane's thread, else the
    /// calling HTTP worker's own when it has one up (`worker_conn`), else the shared one.
    fn reads(&self) -> RedisConn {
        if crate::lane::on_operator_lane() {
            return self.operator.clone();
        }
        self.per_worker
            .as_ref()
            .and_then(PerWorker::get)
            .unwrap_or_else(|| self.conn.clone())
    }

    /// The connection for reads that only operators make (the audit trail, list counts,
    /// definitions): never the checks'.
    fn operator_reads(&self) -> RedisConn {
        self.operator.clone()
    }

    /// `HGET <meta> keyspace_id`: rides in every read pipeline of a check or of the tier, so
    /// that nothing read from a keyspace other than the one opened is ever used.
    fn keyspace_probe(&self) -> Keyed {
        Self::keyed(self.layout.meta_key(), |c, key| {
            c.arg("HGET").arg(key).arg("keyspace_id");
        })
    }

    /// What the probe answered: `Ok` if it is this keyspace's id; else the keyspace is lost
    /// (marked so) and whatever was read with it is not its state.
    fn probed(&self, reply: Option<&redis::Value>) -> StoreResult<()> {
        let id: Option<String> = match reply {
            Some(v) => redis::from_redis_value_ref(v)
                .map_err(|e| StoreError::corrupt(format!("keyspace id: {e}")))?,
            None => return Err(StoreError::corrupt("no reply to the keyspace probe".into())),
        };
        match id {
            Some(id) if id == self.keyspace_id => Ok(()),
            Some(other) => Err(self.mark_lost(format!(
                "{} holds another keyspace (id {other}, not {})",
                self.layout.meta_key(),
                self.keyspace_id
            ))),
            None => Err(self.mark_lost(format!(
                "{} is gone (keyspace id {}): Redis restarted without its data, was flushed, \
                 or failed over to an empty node",
                self.layout.meta_key(),
                self.keyspace_id
            ))),
        }
    }

    /// The keyspace is lost (`KeyspaceHealth::Lost`): said once, loudly, with the marker left
    /// for instances that start meanwhile. Returns the error to answer with.
    fn mark_lost(&self, why: String) -> StoreError {
        if !self.lost.swap(true, Ordering::AcqRel) {
            tracing::error!(
                keyspace_id = self.keyspace_id,
                why,
                "KEYSPACE LOST: writes are refused and checks answered from local copies until it is restored"
            );
            self.health.send_replace(KeyspaceHealth::Lost {
                since_ms: now_ms(),
                why: why.clone(),
            });
            let mut conn = self.operator_reads();
            let marker = Layout::lost_marker_key_of(self.layout.prefix());
            let id = self.keyspace_id.clone();
            tokio::spawn(async move {
                let r: RedisResult<()> = redis::cmd("SET")
                    .arg(&marker)
                    .arg(&id)
                    .arg("NX")
                    .query_async(&mut conn)
                    .await;
                if let Err(e) = r {
                    tracing::warn!(error = %e, "could not leave the lost keyspace's marker");
                }
            });
        }
        StoreError::Lost(why)
    }

    /// `Err` at once while the keyspace is lost: a read (`Lost`) or a write (refused unsent).
    fn unless_lost(&self, write: bool) -> StoreResult<()> {
        if !self.lost.load(Ordering::Acquire) {
            return Ok(());
        }
        Err(if write {
            StoreError::Refused(Refusal::KeyspaceLost)
        } else {
            StoreError::Lost("the keyspace is lost (see the log)".into())
        })
    }
}

fn unavailable(e: RedisError) -> StoreError {
    if e.kind() == ErrorKind::Parse || e.kind() == ErrorKind::UnexpectedReturnType {
        StoreError::corrupt_from(e)
    } else {
        StoreError::unavailable_from(e)
    }
}

fn ints(v: &redis::Value) -> StoreResult<Vec<i64>> {
    redis::from_redis_value_ref::<Vec<i64>>(v)
        .map_err(|e| StoreError::corrupt(format!("metric reply: {e}")))
}

/// Most ops in one metric script call without an event (id-less updates, reads): each call
/// holds Redis for a bounded time. An event's ops on one slot are one call, however many.
const METRIC_OPS_PER_CALL: usize = 64;

/// A bucket of event ids holding more than this many is warned about: past 512 Redis
/// converts it to a hashtable, several times the memory (`dedupe_expected_ids` too small).
const EVENT_BUCKET_WARN: i64 = 400;

/// One metric script call: which ops (in order), the event they share, if any.
struct MetricCall {
    ops: Vec<usize>,
    event: Option<EventMark>,
}

/// Groups ops into script calls: one per event and slot (one per event on a single node,
/// where a script may touch keys of any slot), and id-less ones per slot in chunks of
/// `METRIC_OPS_PER_CALL`.
fn metric_calls(ops: &[MetricOp], idx: &[usize], cluster: bool) -> Vec<MetricCall> {
    let mut calls: Vec<MetricCall> = Vec::new();
    // (the event's (seq, hash), the slot on a cluster) → its open call.
    type Group = (Option<(u32, i64)>, Option<u16>);
    let mut open: HashMap<Group, usize> = HashMap::new();
    for &i in idx {
        let op = &ops[i];
        let slot = cluster.then(|| key_slot(op.key.as_bytes()));
        let group = (op.event.map(|e| (e.seq, e.hash)), slot);
        match open.get(&group) {
            Some(&c) if op.event.is_some() || calls[c].ops.len() < METRIC_OPS_PER_CALL => {
                calls[c].ops.push(i);
            }
            _ => {
                open.insert(group, calls.len());
                calls.push(MetricCall {
                    ops: vec![i],
                    event: op.event,
                });
            }
        }
    }
    calls
}

/// The metric script's family code (`scripts::METRIC_BODY`).
fn family_code(f: MetricFamily) -> &'static str {
    match f {
        MetricFamily::Sum => "s",
        MetricFamily::Avg => "a",
        MetricFamily::Min => "n",
        MetricFamily::Max => "x",
        MetricFamily::Distinct => "d",
        MetricFamily::Approx => "p",
    }
}

/// Interprets a metric call's reply, `{dup, fill, per op: n, n values}`: one answer per op
/// of `idx`, and the event bucket's length.
fn answers(
    ops: &[MetricOp],
    idx: &[usize],
    v: &redis::Value,
) -> StoreResult<(Vec<MetricAnswer>, i64)> {
    let all = ints(v)?;
    let short = || StoreError::corrupt("short metric reply".into());
    let (&dup, rest) = all.split_first().ok_or_else(short)?;
    let (&fill, mut rest) = rest.split_first().ok_or_else(short)?;
    let mut out = Vec::with_capacity(idx.len());
    for op in idx.iter().map(|&i| &ops[i]) {
        let (&n, tail) = rest.split_first().ok_or_else(short)?;
        let n = usize::try_from(n).map_err(|_| short())?;
        let values = tail.get(..n).ok_or_else(short)?;
        rest = &tail[n..];
        out.push(answer(op, dup == 1, values));
    }
    Ok((out, fill))
}

/// One op's answer from the values it read.
fn answer(op: &MetricOp, duplicate: bool, rest: &[i64]) -> MetricAnswer {
    if !op.read {
        return MetricAnswer {
            duplicate,
            reading: None,
        };
    }
    let reading = match op.family {
        MetricFamily::Sum => {
            let total: i128 = rest.iter().copied().map(i128::from).sum();
            MetricReading::Sum(total.clamp(i64::MIN.into(), i64::MAX.into()) as i64)
        }
        MetricFamily::Avg => {
            let (mut sum, mut count) = (0i128, 0i64);
            for pair in rest.chunks(2) {
                if let [f, value] = pair {
                    if f % 2 == 0 {
                        sum += i128::from(*value);
                    } else {
                        count += value;
                    }
                }
            }
            MetricReading::Avg {
                sum: sum.clamp(i64::MIN.into(), i64::MAX.into()) as i64,
                count,
            }
        }
        MetricFamily::Min => MetricReading::Extreme(rest.iter().copied().min()),
        MetricFamily::Max => MetricReading::Extreme(rest.iter().copied().max()),
        MetricFamily::Distinct | MetricFamily::Approx => MetricReading::Distinct {
            count: rest.first().copied().unwrap_or(0),
            capped: rest.get(1) == Some(&1),
        },
    };
    MetricAnswer {
        duplicate,
        reading: Some(reading),
    }
}

/// Every command's result, or the first failure.
fn all_ok(results: Vec<RedisResult<redis::Value>>) -> StoreResult<Vec<redis::Value>> {
    results
        .into_iter()
        .map(|r| r.map_err(unavailable))
        .collect()
}

/// The one result of a one-command step.
fn first(results: Vec<RedisResult<redis::Value>>) -> StoreResult<RedisResult<redis::Value>> {
    results
        .into_iter()
        .next()
        .ok_or_else(|| StoreError::corrupt("no reply to a write".into()))
}

/// A stream entry id, `<ms>-<seq>`, as numbers (ordered as Redis orders them).
pub(super) fn stream_id(id: &str) -> Option<(u64, u64)> {
    let (ms, seq) = id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

/// One part's `XREVRANGE` reply: (id, record), newest first.
fn parse_stream(v: &redis::Value) -> StoreResult<Vec<((u64, u64), AuditRecord)>> {
    let raw: Vec<(String, Vec<String>)> = redis::from_redis_value_ref(v)
        .map_err(|e| StoreError::corrupt(format!("audit stream: {e}")))?;
    raw.into_iter()
        .map(|(id, kv)| {
            let id = stream_id(&id)
                .ok_or_else(|| StoreError::corrupt(format!("audit stream id {id:?}")))?;
            // Pairs moved out, not cloned; an odd field count keeps the whole pairs.
            let mut kv = kv.into_iter();
            let mut fields = Vec::with_capacity(kv.len() / 2);
            while let (Some(k), Some(v)) = (kv.next(), kv.next()) {
                fields.push((k, v));
            }
            Ok((id, AuditRecord { fields }))
        })
        .collect()
}

/// The ids an audit index range found (`RedisStore::audit_index_range`), newest first: each
/// member ends with `\0` and its stream id in 19 hex digits (`layout::audit_index_id`).
fn parse_index_range(v: &redis::Value) -> StoreResult<Vec<(u64, u64)>> {
    let members: Vec<Vec<u8>> = redis::from_redis_value_ref(v)
        .map_err(|e| StoreError::corrupt(format!("audit index range: {e}")))?;
    members
        .iter()
        .map(|m| {
            let split = m.len().checked_sub(AUDIT_INDEX_ID_LEN + 1);
            split
                .filter(|&at| m[at] == 0)
                .and_then(|at| std::str::from_utf8(&m[at + 1..]).ok())
                .and_then(parse_audit_index_id)
                .ok_or_else(|| {
                    StoreError::corrupt(format!(
                        "audit index member {:?}",
                        String::from_utf8_lossy(m)
                    ))
                })
        })
        .collect()
}

/// The `count` newest records of all parts, oldest first (by stream id: the time of the
/// primary that holds each part, then the sequence).
fn newest(parts: Vec<Vec<((u64, u64), AuditRecord)>>, count: usize) -> Vec<AuditRecord> {
    let mut all: Vec<((u64, u64), AuditRecord)> = parts.into_iter().flatten().collect();
    all.sort_by_key(|(id, _)| std::cmp::Reverse(*id));
    all.truncate(count);
    all.into_iter().rev().map(|(_, r)| r).collect()
}

/// The (list, sandbox) of a pair field of the older counts layout, `<list>|<sandbox>`, if
/// it is one.
fn old_pair(field: &str) -> Option<(ListName, Sandbox)> {
    let (list, sandbox) = field.split_once('|')?;
    Some((list.parse().ok()?, sandbox.parse().ok()?))
}

/// The smallest `hash-max-listpack-entries` that keeps buckets of this mean fill listpacks:
/// five standard deviations of a Poisson fill above the mean.
pub fn min_listpack_entries(mean_fill: f64) -> u64 {
    (mean_fill + 5.0 * mean_fill.sqrt()).ceil() as u64
}

/// Whether `RedisStore::open` may make a keyspace where the meta hash is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Create {
    /// Unless an instance saw one vanish there (the lost marker stands).
    IfNew,
    /// Even then (`namelist-tools keyspace create`): the marker is removed.
    Anew,
}

impl RedisStore {
    /// Connects, opens (or creates, unless a keyspace was lost there) the keyspace and checks
    /// the server's listpack limit.
    pub async fn open(opts: RedisOptions) -> StoreResult<(Self, OpenReport)> {
        Self::open_with(opts, Create::IfNew).await
    }

    /// `open`, making a new keyspace even where one was seen lost (the lost marker stands):
    /// what `namelist-tools keyspace create` does, and nothing else.
    pub async fn open_anew(opts: RedisOptions) -> StoreResult<(Self, OpenReport)> {
        Self::open_with(opts, Create::Anew).await
    }

    async fn open_with(opts: RedisOptions, create: Create) -> StoreResult<(Self, OpenReport)> {
        let cluster = !opts.cluster_nodes.is_empty();
        let urls = if cluster {
            opts.cluster_nodes.clone()
        } else {
            vec![opts.url.clone()]
        };
        let connect = ConnectOptions {
            urls,
            cluster,
            connect_timeout: opts.connect_timeout,
            response_timeout: opts.response_timeout,
        };
        let (mut conn, pubsub_clients) =
            RedisConn::connect(&connect, "reads")
                .await
                .map_err(|e| match e.kind() {
                    ErrorKind::InvalidClientConfig => {
                        StoreError::unavailable(format!("invalid Redis URL: {e}"))
                    }
                    _ => unavailable(e),
                })?;
        let (bulk, _) = RedisConn::connect(&connect, "bulk")
            .await
            .map_err(unavailable)?;
        let (operator, _) = RedisConn::connect(&connect, "operator")
            .await
            .map_err(unavailable)?;
        let (log, _) = RedisConn::connect(&connect, "change log")
            .await
            .map_err(unavailable)?;

        let wanted = Layout::buckets_for(
            opts.expected_entries
                .unwrap_or(opts.default_expected_entries),
        );
        let meta = Layout::meta_key_of(&opts.prefix);
        let marker = Layout::lost_marker_key_of(&opts.prefix);
        let place = format!("key prefix {}", opts.prefix);
        // What a new keyspace would be; the script creates it only if it is missing.
        let new = fingerprint::for_new_keyspace(
            opts.fingerprint_key.as_ref(),
            opts.allow_unkeyed,
            &place,
        );
        let (create_format, create_key_id) = match &new {
            Ok((h, _)) => (h.format().to_string(), h.key_id().unwrap_or("").to_owned()),
            Err(_) => (String::new(), String::new()),
        };
        let new_id = format!("{:032x}", rand::random::<u128>());
        let wanted_event_buckets = Layout::event_buckets_for(opts.dedupe_expected_ids);
        #[allow(clippy::type_complexity)]
        let (format, buckets, created, key_id, keyspace_id, velocity, event_buckets, rules): (
            Option<String>,
            Option<String>,
            i64,
            Option<String>,
            Option<String>,
            Option<u32>,
            Option<u32>,
            Option<u32>,
        ) = Script::new(OPEN_KEYSPACE)
            .key(&meta)
            .key(&marker)
            .arg(create_format)
            .arg(wanted)
            .arg(now_ms())
            .arg(create_key_id)
            .arg(&new_id)
            .arg(if create == Create::Anew { "1" } else { "0" })
            .arg(wanted_event_buckets)
            .arg(crate::domain::LATEST_RULES)
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        if created == -2 {
            return Err(StoreError::Keyspace(format!(
                "{meta} is missing, and an instance saw the keyspace there (id {}) vanish: Redis \
                 restarted without its data, was flushed, or failed over to an empty node. Restore \
                 its data (RDB or AOF) and start again, or make a new, empty keyspace explicitly \
                 with `namelist-tools keyspace create` and load the lists into it",
                keyspace_id.as_deref().unwrap_or("?")
            )));
        }
        let keyspace_id = keyspace_id.unwrap_or(new_id);
        let (hashing, unkeyed) = match created {
            // Missing, and not created: only when there was nothing to create it with.
            -1 => {
                return Err(StoreError::Keyspace(
                    new.err()
                        .unwrap_or_else(|| fingerprint::no_key_for_new(&place)),
                ));
            }
            1 => new.map_err(StoreError::Keyspace)?,
            _ => {
                let format: u32 = format.and_then(|f| f.parse().ok()).ok_or_else(|| {
                    StoreError::Keyspace(format!("{meta} has no readable format field"))
                })?;
                fingerprint::open_recorded(
                    &RecordedHashing { format, key_id },
                    opts.fingerprint_key.as_ref(),
                    &place,
                )
                .map_err(StoreError::Keyspace)?
            }
        };
        let buckets: u32 = buckets
            .and_then(|b| b.parse().ok())
            .filter(|&b| b > 0)
            .ok_or_else(|| StoreError::Keyspace(format!("{meta} has no readable buckets field")))?;
        if let Some(expected) = opts.expected_entries
            && buckets != wanted
        {
            return Err(StoreError::Keyspace(format!(
                "{meta} records {buckets} buckets but expected_entries = {expected} gives {wanted}: \
                 the bucket count is fixed when a keyspace is created. Unset NAMELIST_EXPECTED_ENTRIES \
                 to adopt the recorded count, or use a new key prefix and re-import"
            )));
        }
        let format = hashing.format();
        let key_id = hashing.key_id().map(str::to_owned);
        let (Some(velocity @ 1..=2), Some(event_buckets @ 1..)) = (velocity, event_buckets) else {
            return Err(StoreError::Keyspace(format!(
                "{meta} has no readable velocity or event_buckets field (velocity layout 1 or 2, \
                 event_buckets at least 1)"
            )));
        };
        let mut warnings = Vec::new();
        if event_buckets != wanted_event_buckets
            && opts.dedupe_expected_ids != DEFAULT_EXPECTED_EVENT_IDS
        {
            warnings.push(format!(
                "{meta} records {event_buckets} buckets of event ids, fixed when first recorded; \
                 dedupe_expected_ids = {} would give {wanted_event_buckets}: the recorded count is kept",
                opts.dedupe_expected_ids
            ));
        }
        let Some(rules @ 1..=crate::domain::LATEST_RULES) = rules else {
            return Err(StoreError::Keyspace(format!(
                "{meta} records normalisation rules this build does not know (it knows 1 to {}): \
                 use a build at least as new as the one that made the keyspace",
                crate::domain::LATEST_RULES
            )));
        };
        let layout = Layout::new(opts.prefix, buckets, hashing)
            .with_velocity(velocity, event_buckets)
            .with_rules(rules);

        let mean = opts
            .expected_entries
            .map_or(MAX_MEAN_FILL as f64, |e| e as f64 / f64::from(buckets));
        let needed = min_listpack_entries(mean);
        // Every primary must allow the fill (the smallest limit decides).
        let limit: redis::RedisResult<Vec<Vec<String>>> = conn
            .on_every_primary(
                redis::cmd("CONFIG")
                    .arg("GET")
                    .arg("hash-max-listpack-entries"),
            )
            .await;
        let limit = limit.ok().and_then(|replies| {
            replies
                .iter()
                .map(|v| v.get(1).and_then(|s| s.parse::<u64>().ok()))
                .collect::<Option<Vec<u64>>>()
                .and_then(|v| v.into_iter().min())
        });
        match limit {
            Some(limit) if limit < needed => warnings.push(format!(
                "hash-max-listpack-entries is {limit} but buckets of a mean fill of {mean:.0} need at least {needed}: \
                 full buckets will convert to hashtables and cost several times the memory. Raise it (CONFIG SET \
                 hash-max-listpack-entries 512) or size the keyspace for more buckets"
            )),
            Some(_) => {}
            None => warnings.push(
                "could not read hash-max-listpack-entries (CONFIG GET refused?): bucket encoding unverified; run `namelist-tools audit`".to_owned(),
            ),
        }

        let (writes, monitor) =
            Self::write_path(&connect, &pubsub_clients, opts.write_replicas).await?;
        let per_worker = PerWorker::new(&connect, &pubsub_clients);
        let store = Self {
            pubsub_clients,
            pubsub_next: AtomicUsize::new(0),
            conn,
            per_worker,
            bulk,
            operator,
            log,
            writes,
            monitor,
            layout,
            audit_part_len: opts.audit_max_len.div_ceil(AUDIT_PARTS).max(1),
            remove: scripts::remove(),
            remove_if_unchanged: scripts::COMPARE_AND_DELETE_SCRIPT.clone(),
            count_changes: Script::new(COUNT_CHANGES),
            counts_page: Script::new(COUNTS_PAGE),
            metric_scripts: MetricScripts::new(),
            pubsub_timeout: opts.connect_timeout,
            write_replicas: opts.write_replicas,
            dump_refused: AtomicBool::new(false),
            keyspace_id,
            lost: AtomicBool::new(false),
            health: tokio::sync::watch::channel(KeyspaceHealth::Present).0,
        };
        store.load_scripts().await?;
        let (audit_indexed, not_indexed) = store.index_audit_trail().await;
        warnings.extend(not_indexed);
        Ok((
            store,
            OpenReport {
                created: created == 1,
                buckets,
                format,
                key_id,
                warnings,
                unkeyed,
                audit_indexed,
            },
        ))
    }

    /// The write connections and the replica monitor, each on connections of its own.
    async fn write_path(
        connect: &ConnectOptions,
        clients: &[Client],
        write_replicas: u32,
    ) -> StoreResult<(WritePool, ReplicaMonitor)> {
        let writes = WritePool::connect(connect, WRITE_CONNECTIONS, write_replicas > 0)
            .await
            .map_err(unavailable)?;
        let infos: Vec<redis::ConnectionInfo> = clients
            .iter()
            .map(|c| c.get_connection_info().clone())
            .collect();
        let watched = match (connect.cluster, infos.first()) {
            (false, Some(info)) => Watched::Node(Box::new(info.clone())),
            _ => Watched::Cluster(infos),
        };
        Ok((writes, ReplicaMonitor::start(watched, write_replicas).await))
    }

    async fn load_scripts(&self) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        for s in [
            &self.remove,
            &self.remove_if_unchanged,
            &self.count_changes,
            &self.counts_page,
        ]
        .into_iter()
        .chain(self.metric_scripts.all())
        {
            s.load_async(&mut conn).await.map_err(unavailable)?;
        }
        Ok(())
    }

    /// A write session for `keys`, refused before anything is sent when a primary they live
    /// on cannot give the guarantee (`replicas` online replicas, or answering at all); it
    /// gives up in flight when the monitor sees one of their primaries go.
    async fn session<'k>(
        &self,
        topology: &Topology,
        keys: impl IntoIterator<Item = &'k [u8]>,
        replicas: u32,
        deadline: Deadline,
    ) -> StoreResult<WriteSession<'_>> {
        let mut slots: Vec<u16> = keys.into_iter().map(key_slot).collect();
        slots.sort_unstable();
        slots.dedup();
        topology
            .check(slots.iter().copied(), replicas, Instant::now())
            .map_err(StoreError::Refused)?;
        let mut session = self.writes.session(replicas, deadline).await?;
        session.watching(self.monitor.subscribe(), slots);
        Ok(session)
    }

    /// Notes a failed write: the monitor looks again at once, so the next writes to a
    /// primary that just went away are refused early.
    fn noted<T>(&self, r: StoreResult<T>) -> StoreResult<T> {
        if let Err(StoreError::Unavailable { .. } | StoreError::Timeout(_)) = &r {
            self.monitor.refresh_soon();
        }
        r
    }

    /// Indexes, in every audit stream, the records no index holds yet: all of them the first
    /// time (records written before the index existed), then those an older build wrote
    /// since (a rolling deploy); a stream whose index holds members of records gone (an
    /// older build trimmed them) is indexed again from scratch. `AUDIT_INDEX_CHUNK` records
    /// a call, every stream at once per round trip: on an indexed keyspace, one round trip
    /// that finds nothing to do. Returns the records indexed and, for each stream that could
    /// not be indexed, a warning (its older records are then not found by searches by who or
    /// list until a later start, or a write to it, catches it up).
    async fn index_audit_trail(&self) -> (u64, Vec<String>) {
        let keys = self.layout.audit_keys();
        let mut pending: Vec<usize> = (0..keys.len()).collect();
        let (mut indexed, mut first) = (0u64, true);
        let mut warnings = Vec::new();
        while !pending.is_empty() {
            let cmds: Vec<Keyed> = pending
                .iter()
                .map(|&i| {
                    let (ix, mark) = self.layout.audit_index_keys(i);
                    let mut cmd = redis::cmd("EVAL");
                    cmd.arg(AUDIT_CATCH_UP_LUA.as_str())
                        .arg(3)
                        .arg(&keys[i])
                        .arg(ix)
                        .arg(mark)
                        .arg(AUDIT_INDEX_CHUNK)
                        .arg(if first { "1" } else { "" });
                    (keys[i].clone().into_bytes(), cmd)
                })
                .collect();
            let replies = match self.conn.run(cmds).await {
                Ok(r) => r,
                Err(e) => {
                    warnings.push(format!(
                        "audit trail not indexed ({e}): searches by who or list may miss records \
                         written without the index until a later start (or a write to their \
                         part) indexes them"
                    ));
                    break;
                }
            };
            let mut next = Vec::new();
            for (&i, reply) in pending.iter().zip(replies) {
                match reply.and_then(|v| Ok(redis::from_redis_value::<(i64, u64, i64)>(v)?)) {
                    Ok((done, n, _)) => {
                        indexed += n;
                        if done == 0 {
                            next.push(i);
                        }
                    }
                    Err(e) => warnings.push(format!(
                        "audit stream {} not indexed ({e}): searches by who or list may miss its \
                         records written without the index until a later start (or a write to \
                         it) indexes them",
                        keys[i]
                    )),
                }
            }
            pending = next;
            first = false;
        }
        (indexed, warnings)
    }

    /// Appends one record to the audit trail (for tools that write in bulk), in a part on a
    /// primary that can take it, indexed and trimmed as a write's records are.
    pub async fn append_audit(&self, record: &AuditRecord) -> StoreResult<()> {
        let topology = self.monitor.topology();
        let now = Instant::now();
        let part = (0..AUDIT_PARTS)
            .find(|&p| {
                topology
                    .check(
                        [super::layout::Layout::audit_part_slot(p)],
                        self.write_replicas,
                        now,
                    )
                    .is_ok()
            })
            .unwrap_or(0);
        let cmd = self.audit_append(part, &[record]);
        let deadline = Deadline::after(Duration::from_secs(10));
        let mut session = self
            .session(&topology, [cmd.0.as_slice()], self.write_replicas, deadline)
            .await?;
        let r = session.commit(vec![cmd], false).await;
        all_ok(self.noted(r)?).map(drop)
    }

    /// Replaces the last audit's summary (`<prefix>audit:last`), read by every instance.
    pub async fn put_audit_summary(&self, summary: &AuditSummary) -> StoreResult<()> {
        let key = self.layout.audit_summary_key();
        let mut del = redis::cmd("DEL");
        del.arg(&key);
        let mut hset = redis::cmd("HSET");
        hset.arg(&key);
        for (k, v) in summary.to_fields() {
            hset.arg(k).arg(v);
        }
        let k = key.into_bytes();
        let mut session = self
            .writes
            .session(0, Deadline::after(Duration::from_secs(10)))
            .await?;
        let r = session
            .commit(vec![(k.clone(), del), (k, hset)], true)
            .await;
        all_ok(self.noted(r)?).map(drop)
    }

    /// The read connection, for tools that run their own commands.
    pub fn connection(&self) -> RedisConn {
        self.conn.clone()
    }

    /// Records appended to audit part `part`, indexed, the part trimmed past its cap
    /// (`scripts::AUDIT_APPEND`): one `EVAL`, sent whole, so that inside a write's `MULTI`
    /// it cannot fail for want of a cached script. Records without fields are skipped (a
    /// stream entry needs one).
    fn audit_append(&self, part: usize, records: &[&AuditRecord]) -> Keyed {
        let key = self.layout.audit_part_key(part);
        let (ix, mark) = self.layout.audit_index_keys(part);
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(AUDIT_APPEND_LUA.as_str())
            .arg(3)
            .arg(&key)
            .arg(ix)
            .arg(mark)
            .arg(self.audit_part_len)
            .arg(AUDIT_CATCH_UP_PER_WRITE);
        for r in records.iter().filter(|r| !r.fields.is_empty()) {
            cmd.arg(2 * r.fields.len());
            for (name, value) in &r.fields {
                cmd.arg(name).arg(value);
            }
        }
        (key.into_bytes(), cmd)
    }

    /// The appends of a write's audit records, one per part: record `i` goes to a part on
    /// the primary of the bucket of entry `i` (the last entry's past the end: records beyond
    /// the entries, such as a delete naming one entry twice, still land on a primary this
    /// write touches), in order within each part.
    fn audit_cmds(
        &self,
        topology: &Topology,
        records: &[AuditRecord],
        buckets: &[u32],
    ) -> Vec<Keyed> {
        let mut by_part: BTreeMap<usize, Vec<&AuditRecord>> = BTreeMap::new();
        for (i, r) in records.iter().enumerate() {
            let part = match buckets.get(i).or(buckets.last()) {
                Some(&b) => {
                    let slot = key_slot(self.layout.bucket_key(b).as_bytes());
                    topology.audit_part(slot, b)
                }
                None => i % AUDIT_PARTS,
            };
            by_part.entry(part).or_default().push(r);
        }
        by_part
            .into_iter()
            .map(|(part, records)| self.audit_append(part, &records))
            .collect()
    }

    /// The range of a read through audit stream `stream`'s index: `ZRANGE <ix> <hi> <lo>
    /// BYLEX REV LIMIT 0 <count>`, the members of `term` older than the read's bound, newest
    /// first (`layout`, *Audit trail*). The bound is written as a member ends: a position past
    /// what its width holds is above every stream id, so it is no bound at all (the sequence
    /// clamped: no id has more).
    fn audit_index_range(&self, stream: usize, term: &AuditTerm, read: &AuditRead) -> Keyed {
        let (ix, _) = self.layout.audit_index_keys(stream);
        let term = audit_index_term(term);
        let bound = read.before.and_then(|(ms, seq)| {
            let clamped = seq > u64::from(u32::MAX);
            audit_index_id(ms, seq.min(u64::from(u32::MAX)))
                .map(|id| (id, read.inclusive || clamped))
        });
        let hi = match &bound {
            None => [&b"("[..], &term, b"\x01"].concat(),
            Some((id, true)) => [&b"["[..], &term, b"\0", id.as_bytes()].concat(),
            Some((id, false)) => [&b"("[..], &term, b"\0", id.as_bytes()].concat(),
        };
        let lo = [&b"["[..], &term, b"\0"].concat();
        Self::keyed(ix, |c, key| {
            c.arg("ZRANGE")
                .arg(key)
                .arg(hi)
                .arg(lo)
                .arg("BYLEX")
                .arg("REV")
                .arg("LIMIT")
                .arg(0)
                .arg(read.count);
        })
    }

    /// A write's `PUBLISH` on one node, inside its `MULTI`: only while the keyspace id is
    /// this one (`GUARDED_PUBLISH`), so a write that reached a lost keyspace is announced to
    /// nobody.
    fn guarded_publish_cmd(&self, message: &Invalidation) -> Keyed {
        let meta = self.layout.meta_key();
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(GUARDED_PUBLISH)
            .arg(1)
            .arg(&meta)
            .arg(&self.keyspace_id)
            .arg(self.layout.channel())
            .arg(message.encode());
        (meta.into_bytes(), cmd)
    }

    /// `PUBLISH`. On a cluster any node broadcasts it to every subscriber, so it is routed
    /// by `route` (a key the same write touches: it then depends on no other shard); `None`
    /// routes by the channel's name.
    fn publish_cmd(&self, message: &Invalidation, route: Option<&[u8]>) -> Keyed {
        let channel = self.layout.channel();
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(&channel).arg(message.encode());
        let key = route.map_or_else(|| channel.into_bytes(), <[u8]>::to_vec);
        (key, cmd)
    }

    /// The metric ops at `idx` that update, in calls of `metric_calls`: refused early or
    /// written on the write path, then waited for. (index, answer) each.
    async fn metric_updates(
        &self,
        ops: &[MetricOp],
        idx: Vec<usize>,
        deadline: Deadline,
    ) -> StoreResult<Vec<(usize, MetricAnswer)>> {
        if idx.is_empty() {
            return Ok(Vec::new());
        }
        let topology = self.monitor.topology();
        let calls = metric_calls(ops, &idx, self.conn.is_cluster());
        let now = now_ms();
        let script = &self.metric_scripts.write;
        let cmd = |c: usize| self.metric_call_cmd(script, ops, &calls[c], now);
        let mut cmds: Vec<Keyed> = (0..calls.len()).map(cmd).collect();
        // The keys of a call share its slot (on a cluster), so its routing key stands for it.
        let mut session = self
            .session(
                &topology,
                cmds.iter().map(|(route, _)| route.as_slice()),
                self.write_replicas,
                deadline,
            )
            .await?;
        let r = async {
            let mut out = Vec::with_capacity(idx.len());
            let mut pending: Vec<usize> = (0..calls.len()).collect();
            for attempt in 0..2 {
                // Built once; only a retry after `NOSCRIPT` builds its calls again.
                let batch = std::mem::take(&mut cmds);
                let batch = if attempt == 0 {
                    batch
                } else {
                    pending.iter().map(|&c| cmd(c)).collect()
                };
                let replies = session.commit(batch, false).await?;
                let mut again = Vec::new();
                for (&c, reply) in pending.iter().zip(replies) {
                    match reply {
                        Ok(v) => out.extend(self.call_answers(ops, &calls[c], &v)?),
                        // Only calls that did not run are sent again (each records its event).
                        Err(e) if attempt == 0 && is_noscript(&e) => again.push(c),
                        Err(e) => return Err(unavailable(e)),
                    }
                }
                if again.is_empty() {
                    break;
                }
                self.load_scripts().await?;
                pending = again;
            }
            Ok(out)
        }
        .await;
        self.noted(r)
    }

    /// The metric ops at `idx` that only read, in calls of `metric_calls`, on the read path
    /// (with the read-only script unless the call counts a HyperLogLog). (index, answer) each.
    async fn metric_reads(
        &self,
        ops: &[MetricOp],
        idx: Vec<usize>,
    ) -> StoreResult<Vec<(usize, MetricAnswer)>> {
        let calls = metric_calls(ops, &idx, self.conn.is_cluster());
        let now = now_ms();
        let mut out = Vec::with_capacity(idx.len());
        let mut pending: Vec<usize> = (0..calls.len()).collect();
        for attempt in 0..2 {
            if pending.is_empty() {
                break;
            }
            let cmds = pending
                .iter()
                .map(|&c| {
                    // `PFCOUNT` is a write command (it caches the count in the HyperLogLog):
                    // no `no-writes` script may call it.
                    let approx = calls[c]
                        .ops
                        .iter()
                        .any(|&i| ops[i].family == MetricFamily::Approx);
                    let s = &self.metric_scripts;
                    let script = if approx { &s.write } else { &s.read };
                    self.metric_call_cmd(script, ops, &calls[c], now)
                })
                .collect();
            let replies = self.conn.run(cmds).await.map_err(unavailable)?;
            let mut again = Vec::new();
            for (&c, reply) in pending.iter().zip(replies) {
                match reply {
                    Ok(v) => out.extend(self.call_answers(ops, &calls[c], &v)?),
                    Err(e) if attempt == 0 && is_noscript(&e) => again.push(c),
                    Err(e) => return Err(unavailable(e)),
                }
            }
            if !again.is_empty() {
                self.load_scripts().await?;
            }
            pending = again;
        }
        Ok(out)
    }

    /// The answers of one call's reply, by op index; warns (at most once a minute) when the
    /// event's bucket is filling past what keeps it a listpack.
    fn call_answers(
        &self,
        ops: &[MetricOp],
        call: &MetricCall,
        v: &redis::Value,
    ) -> StoreResult<Vec<(usize, MetricAnswer)>> {
        let (answers, fill) = answers(ops, &call.ops, v)?;
        if fill > EVENT_BUCKET_WARN {
            static LAST: AtomicI64 = AtomicI64::new(0);
            let now = now_ms();
            let last = LAST.load(Ordering::Relaxed);
            if now - last > 60_000
                && LAST
                    .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                tracing::warn!(
                    fill,
                    buckets = self.layout.event_buckets(),
                    "a bucket of event ids holds more than {EVENT_BUCKET_WARN} live ids: past \
                     512 Redis keeps it as a hashtable, several times the memory. The keyspace \
                     was sized (dedupe_expected_ids) for fewer ids than it remembers"
                );
            }
        }
        Ok(call.ops.iter().copied().zip(answers).collect())
    }

    /// Runs a definition script (sent whole: rare, and immune to a flushed script cache) on
    /// the write path: `args`, then the channel and the `Definitions` message.
    async fn definition_call(
        &self,
        kind: DefinitionKind,
        script: &str,
        args: &[&str],
        deadline: Deadline,
    ) -> StoreResult<redis::Value> {
        let key = self.layout.definitions_key(kind.as_str());
        let topology = self.monitor.topology();
        let mut session = self
            .session(&topology, [key.as_bytes()], self.write_replicas, deadline)
            .await?;
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(script).arg(1).arg(&key);
        for a in args {
            cmd.arg(*a);
        }
        cmd.arg(self.layout.channel())
            .arg(Invalidation::Definitions.encode());
        let r = async {
            first(session.commit(vec![(key.into_bytes(), cmd)], false).await?)?.map_err(unavailable)
        }
        .await;
        self.noted(r)
    }

    /// One metric call's `EVALSHA` of `script` (see `scripts::METRIC_BODY` for the
    /// arguments), and the key it is routed by: the event's bucket, in the slot of the
    /// call's keys on a cluster.
    fn metric_call_cmd(
        &self,
        script: &Script,
        ops: &[MetricOp],
        call: &MetricCall,
        now_ms: i64,
    ) -> Keyed {
        let first = &ops[call.ops[0]].key;
        let cluster = self.conn.is_cluster();
        let route = match call.event {
            Some(e) => self
                .layout
                .event_bucket_key(e.hash, cluster.then(|| key_slot(first.as_bytes()))),
            None => first.clone(),
        };
        let mut keys: Vec<String> = vec![route];
        let mut args: Vec<String> = Vec::with_capacity(5 + call.ops.len() * METRIC_OP_ARGS);
        match call.event {
            Some(e) => {
                let until = ExpiryCode::encode(e.keep_until_ms).map_or(u32::MAX, ExpiryCode::get);
                args.push(e.hash.to_string());
                args.push(until.to_string());
            }
            None => args.extend([String::new(), String::new()]),
        }
        args.push(ExpiryCode::script_now(now_ms).to_string());
        args.push(call.ops.len().to_string());
        args.push((rand::random::<u8>() % 8).to_string());
        for &i in &call.ops {
            let op = &ops[i];
            let at = keys.len() + 1;
            if op.family == MetricFamily::Approx {
                let sub = op.update.map_or(op.read_hi, |(s, _)| s);
                keys.push(Layout::metric_sub_key(&op.key, sub));
                if op.read {
                    let lo = op.read_hi - op.slots + 1;
                    keys.extend((lo..=op.read_hi).map(|i| Layout::metric_sub_key(&op.key, i)));
                }
            } else {
                keys.push(op.key.clone());
            }
            let (sub, value) = match op.update {
                Some((sub, v)) => (sub.to_string(), v),
                None => (String::new(), 0),
            };
            args.extend([
                family_code(op.family).to_owned(),
                at.to_string(),
                (keys.len() + 1 - at).to_string(),
                sub,
                value.to_string(),
                op.read_hi.to_string(),
                op.slots.to_string(),
                op.trim_hi.to_string(),
                op.key_expire_at().unwrap_or(0).to_string(),
                if op.read { "1" } else { "" }.to_owned(),
                op.cap.to_string(),
            ]);
        }
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash())
            .arg(keys.len())
            .arg(&keys)
            .arg(&args);
        (keys.swap_remove(0).into_bytes(), cmd)
    }

    /// One `EVALSHA REMOVE` per bucket of `keys`; (bucket, the keys' positions in order).
    fn removal_calls(&self, keys: &[EntryKey]) -> Vec<(u32, Vec<usize>)> {
        let mut by_bucket: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (i, k) in keys.iter().enumerate() {
            by_bucket.entry(k.bucket).or_default().push(i);
        }
        by_bucket.into_iter().collect()
    }

    fn removals(
        &self,
        keys: &[EntryKey],
        calls: &[(u32, Vec<usize>)],
        now_rel_ms: i64,
    ) -> Vec<Keyed> {
        calls
            .iter()
            .map(|(bucket, idx)| {
                let key = self.layout.bucket_key(*bucket);
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(self.remove.get_hash())
                    .arg(1)
                    .arg(&key)
                    .arg(now_rel_ms);
                for &i in idx {
                    cmd.arg(keys[i].field);
                }
                (key.into_bytes(), cmd)
            })
            .collect()
    }

    /// `command <bucket key>` for each bucket.
    fn on_buckets(&self, command: &str, buckets: &[u32]) -> Vec<Keyed> {
        buckets
            .iter()
            .map(|b| {
                Self::keyed(self.layout.bucket_key(*b), |c, key| {
                    c.arg(command).arg(key);
                })
            })
            .collect()
    }

    /// Whole buckets by `HGETALL`.
    async fn hgetall_buckets(&self, buckets: &[u32]) -> StoreResult<Vec<Vec<(i64, u32)>>> {
        let mut cmds = self.on_buckets("HGETALL", buckets);
        cmds.push(self.keyspace_probe());
        let mut replies = self.bulk.run_all(cmds).await.map_err(unavailable)?;
        let probe = replies.pop();
        self.probed(probe.as_ref())?;
        replies
            .iter()
            .map(|v| {
                redis::from_redis_value_ref::<Vec<(i64, u32)>>(v)
                    .map_err(|e| StoreError::corrupt(format!("bucket: {e}")))
            })
            .collect()
    }

    /// `COUNT_CHANGES` over `pairs` (list, sandbox, delta, Unix ms): one call per
    /// `COUNT_CHUNK` pairs.
    fn count_calls(&self, pairs: &[(&str, &str, i64, i64)]) -> Vec<Keyed> {
        let keys = self.layout.counts_keys();
        pairs
            .chunks(COUNT_CHUNK)
            .map(|chunk| {
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(self.count_changes.get_hash()).arg(keys.len());
                for k in &keys {
                    cmd.arg(k);
                }
                for (list, sandbox, delta, at) in chunk {
                    cmd.arg(*list).arg(*sandbox).arg(*delta).arg(*at);
                }
                (keys[0].clone().into_bytes(), cmd)
            })
            .collect()
    }

    /// Folds the lists' counts of the older layout (64 parts `<prefix>lists:{<tag>}`) into
    /// the current keys (see `layout`, *The lists' counts*): what the service does at every
    /// start. Writes; safe against a live store and against other callers at the same time
    /// (each pair is taken by one of them). One round trip per primary when no part exists,
    /// else two script calls per chunk of `COUNT_CHUNK` pairs.
    pub async fn fold_old_counts(&self) -> StoreResult<Folded> {
        let parts: Vec<String> = (0..AUDIT_PARTS)
            .map(|p| self.layout.old_counts_key(p))
            .collect();
        let exists = self
            .conn
            .run_all(
                parts
                    .iter()
                    .map(|k| {
                        Self::keyed(k.clone(), |c, key| {
                            c.arg("EXISTS").arg(key);
                        })
                    })
                    .collect(),
            )
            .await
            .map_err(unavailable)?;
        let take = Script::new(TAKE_OLD_COUNTS);
        let mut moved = 0u64;
        let mut left_alone = 0u64;
        for (part, found) in parts.iter().zip(&exists) {
            if redis::from_redis_value_ref::<i64>(found).unwrap_or(0) == 0 {
                continue;
            }
            let mut conn = self.conn.clone();
            let mut cursor = 0u64;
            loop {
                let (next, fields): (u64, Vec<(String, String)>) = redis::cmd("HSCAN")
                    .arg(part)
                    .arg(cursor)
                    .arg("COUNT")
                    .arg(COUNT_CHUNK)
                    .query_async(&mut conn)
                    .await
                    .map_err(unavailable)?;
                // A pair's count and time are taken together, whichever of them the scan met.
                let mut pairs: Vec<String> = Vec::new();
                let mut seen = HashSet::new();
                for (field, _) in fields {
                    let pair = field.strip_suffix("|t").unwrap_or(&field);
                    if old_pair(pair).is_none() {
                        left_alone += 1;
                    } else if seen.insert(pair.to_owned()) {
                        pairs.push(pair.to_owned());
                    }
                }
                for chunk in pairs.chunks(COUNT_CHUNK) {
                    let taken: Vec<(Option<i64>, Option<i64>)> = take
                        .key(part)
                        .arg(chunk)
                        .invoke_async(&mut conn)
                        .await
                        .map_err(unavailable)?;
                    let changes: Vec<(&str, &str, i64, i64)> = chunk
                        .iter()
                        .zip(&taken)
                        .filter(|(_, (n, t))| n.is_some() || t.is_some())
                        .filter_map(|(pair, (n, t))| {
                            let (list, sandbox) = pair.split_once('|')?;
                            Some((list, sandbox, n.unwrap_or(0), t.unwrap_or(0)))
                        })
                        .collect();
                    if changes.is_empty() {
                        continue;
                    }
                    self.run_counts(
                        self.count_calls(&changes),
                        Deadline::after(Duration::from_secs(10)),
                    )
                    .await?;
                    moved += changes.len() as u64;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(Folded {
            pairs: moved,
            left_alone,
        })
    }

    /// Runs `COUNT_CHANGES` calls on the write path (no replica waited for: bookkeeping),
    /// loading the script again after a `NOSCRIPT` (only the calls that did not run are sent
    /// again).
    async fn run_counts(&self, calls: Vec<Keyed>, deadline: Deadline) -> StoreResult<()> {
        if calls.is_empty() {
            return Ok(());
        }
        let key = self.layout.counts_keys()[0].clone();
        let topology = self.monitor.topology();
        let mut session = self
            .session(&topology, [key.as_bytes()], 0, deadline)
            .await?;
        let r = async {
            let mut pending = calls;
            for attempt in 0..2 {
                let replies = session.commit(pending.clone(), false).await?;
                let mut again = Vec::new();
                for (call, reply) in pending.into_iter().zip(replies) {
                    match reply {
                        Ok(_) => {}
                        Err(e) if attempt == 0 && is_noscript(&e) => again.push(call),
                        Err(e) => return Err(unavailable(e)),
                    }
                }
                if again.is_empty() {
                    return Ok(());
                }
                self.load_scripts().await?;
                pending = again;
            }
            Err(StoreError::unavailable(
                "count script missing after loading it".into(),
            ))
        }
        .await;
        self.noted(r)
    }

    /// A single-key command.
    fn keyed(key: String, build: impl FnOnce(&mut Cmd, &str)) -> Keyed {
        let mut cmd = Cmd::new();
        build(&mut cmd, &key);
        (key.into_bytes(), cmd)
    }
}

#[async_trait]
impl StoreBase for RedisStore {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    /// On the connection the calling worker's checks use (its own, or the shared one).
    /// `PING`, and `Err(Lost)` while the keyspace is lost (`/readyz` then answers 503).
    async fn ping(&self) -> StoreResult<()> {
        let mut conn = self.reads();
        let _: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        self.unless_lost(false)
    }

    fn keyspace(&self) -> Option<tokio::sync::watch::Receiver<KeyspaceHealth>> {
        Some(self.health.subscribe())
    }

    /// Reads the keyspace id from the meta hash: missing or another → lost; this one again
    /// after a loss (its data restored) → present again, said at WARN, the marker removed.
    async fn verify_keyspace(&self) -> StoreResult<()> {
        let probe = self.keyspace_probe();
        let reply = self
            .operator_reads()
            .run_all(vec![probe])
            .await
            .map_err(unavailable)?;
        self.probed(reply.first())?;
        if self.lost.swap(false, Ordering::AcqRel) {
            tracing::warn!(
                keyspace_id = self.keyspace_id,
                "the keyspace is back (its data restored): writes are taken again"
            );
            self.health.send_replace(KeyspaceHealth::Present);
            let mut conn = self.operator_reads();
            let _: RedisResult<()> = redis::cmd("DEL")
                .arg(Layout::lost_marker_key_of(self.layout.prefix()))
                .query_async(&mut conn)
                .await;
        }
        Ok(())
    }
}

#[async_trait]
impl EntryStore for RedisStore {
    /// One node: `write` publishes inside its `MULTI`. A cluster has no transaction across
    /// slots, so there the message follows the write.
    fn atomic_messages(&self) -> bool {
        !self.conn.is_cluster()
    }

    async fn get_many(&self, keys: &[EntryKey]) -> StoreResult<Vec<Option<u32>>> {
        self.unless_lost(false)?;
        let mut cmds: Vec<Keyed> = keys
            .iter()
            .map(|k| {
                Self::keyed(self.layout.bucket_key(k.bucket), |c, key| {
                    c.arg("HGET").arg(key).arg(k.field);
                })
            })
            .collect();
        cmds.push(self.keyspace_probe());
        let mut replies = self.reads().run_all(cmds).await.map_err(unavailable)?;
        let probe = replies.pop();
        self.probed(probe.as_ref())?;
        replies
            .iter()
            .map(|v| {
                redis::from_redis_value_ref::<Option<u32>>(v)
                    .map_err(|e| StoreError::corrupt(format!("bucket value: {e}")))
            })
            .collect()
    }

    async fn get_buckets(&self, buckets: &[u32]) -> StoreResult<Vec<Vec<(i64, u32)>>> {
        self.unless_lost(false)?;
        if self.dump_refused.load(Ordering::Relaxed) {
            return self.hgetall_buckets(buckets).await;
        }
        let mut cmds = self.on_buckets("DUMP", buckets);
        cmds.push(self.keyspace_probe());
        let mut replies = self.bulk.run(cmds).await.map_err(unavailable)?;
        let probe = replies.pop().transpose().map_err(unavailable)?;
        self.probed(probe.as_ref())?;
        let mut out: Vec<Option<Vec<(i64, u32)>>> = Vec::with_capacity(buckets.len());
        let mut other = Vec::new();
        for (i, reply) in replies.into_iter().enumerate() {
            let pairs = match reply {
                Ok(redis::Value::Nil) => Some(Vec::new()),
                Ok(redis::Value::BulkString(payload)) => match dump::read_hash_dump(&payload) {
                    Ok(pairs) => Some(
                        pairs
                            .into_iter()
                            .map(|(f, v)| {
                                u32::try_from(v).map(|c| (f, c)).map_err(|_| {
                                    StoreError::corrupt(format!("bucket value {v} is not a code"))
                                })
                            })
                            .collect::<StoreResult<Vec<_>>>()?,
                    ),
                    // A hashtable-encoded bucket (past the listpack limit): read it whole.
                    Err(dump::DumpError::UnsupportedType(_)) => None,
                    Err(e) => {
                        return Err(StoreError::corrupt(format!("bucket {}: {e}", buckets[i])));
                    }
                },
                Ok(v) => return Err(StoreError::corrupt(format!("DUMP answered {v:?}"))),
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::Server(ServerErrorKind::NoPerm | ServerErrorKind::ResponseError)
                    ) =>
                {
                    if !self.dump_refused.swap(true, Ordering::Relaxed) {
                        tracing::warn!(error = %e, "DUMP refused: reading buckets with HGETALL");
                    }
                    None
                }
                Err(e) => return Err(unavailable(e)),
            };
            if pairs.is_none() {
                other.push(i);
            }
            out.push(pairs);
        }
        if !other.is_empty() {
            let read: Vec<u32> = other.iter().map(|&i| buckets[i]).collect();
            for (i, pairs) in other.into_iter().zip(self.hgetall_buckets(&read).await?) {
                out[i] = Some(pairs);
            }
        }
        Ok(out
            .into_iter()
            .map(|p| p.expect("every bucket read"))
            .collect())
    }

    async fn prefix_lengths(&self, scopes: &[Scope]) -> StoreResult<Vec<Vec<PrefixLen>>> {
        let cmds = scopes
            .iter()
            .map(|(list, sandbox)| {
                Self::keyed(self.layout.registry_key(list, sandbox), |c, key| {
                    c.arg("SMEMBERS").arg(key);
                })
            })
            .collect();
        self.unless_lost(false)?;
        let mut cmds: Vec<Keyed> = cmds;
        cmds.push(self.keyspace_probe());
        let mut raw = self.reads().run_all(cmds).await.map_err(unavailable)?;
        let probe = raw.pop();
        self.probed(probe.as_ref())?;
        raw.iter()
            .map(|v| {
                let members: Vec<String> = redis::from_redis_value_ref(v)
                    .map_err(|e| StoreError::corrupt(format!("registry: {e}")))?;
                let mut v: Vec<PrefixLen> = members
                    .iter()
                    .filter_map(|m| PrefixLen::parse_member(m))
                    .collect();
                v.sort();
                Ok(v)
            })
            .collect()
    }

    async fn write(&self, batch: WriteBatch, deadline: Deadline) -> StoreResult<Vec<bool>> {
        self.unless_lost(true)?;
        let mut registries = Vec::new();
        let mut scopes = Vec::new();
        for ((list, sandbox), len) in &batch.prefixes {
            registries.push(Self::keyed(
                self.layout.registry_key(list, sandbox),
                |c, key| {
                    c.arg("SADD").arg(key).arg(len.member());
                },
            ));
            scopes.push((list.to_string(), sandbox.to_string()));
        }
        // One HSET per entry (in order: for a key given twice the last one wins), so that
        // each reply says whether that entry created its field.
        let buckets: Vec<Keyed> = batch
            .entries
            .iter()
            .map(|(k, code)| {
                Self::keyed(self.layout.bucket_key(k.bucket), |c, key| {
                    c.arg("HSET").arg(key).arg(k.field).arg(code);
                })
            })
            .collect();
        let topology = self.monitor.topology();
        let entry_buckets: Vec<u32> = batch.entries.iter().map(|(k, _)| k.bucket).collect();
        let mut last = self.audit_cmds(&topology, &batch.audit, &entry_buckets);
        let route = last.first().or(buckets.first()).map(|(k, _)| k.clone());
        let atomic = !self.conn.is_cluster(); // one MULTI with the write on one node
        let publish = |message: &Invalidation| match atomic {
            true => self.guarded_publish_cmd(message),
            false => self.publish_cmd(message, route.as_deref()),
        };
        if !scopes.is_empty() {
            scopes.sort();
            scopes.dedup();
            last.push(publish(&Invalidation::Scopes(scopes)));
        }
        last.push(publish(&Invalidation::upserted(&batch.entries, atomic)));
        let touched = registries.iter().chain(&buckets).chain(&last);
        let mut session = self
            .session(
                &topology,
                touched.map(|(k, _)| k.as_slice()),
                self.write_replicas,
                deadline,
            )
            .await?;
        let n_registries = registries.len();
        let n_entries = buckets.len();
        let r = async {
            let replies = if self.conn.is_cluster() {
                // No transaction across slots: the same order, step by step, then the WAITs.
                all_ok(session.step(registries, true).await?)?;
                let replies = all_ok(session.step(buckets, true).await?)?;
                all_ok(session.commit(last, true).await?)?;
                replies
            } else {
                // The keyspace id first, in the same transaction: a write that reached a
                // keyspace lost meanwhile is never acknowledged (and announced to nobody).
                let all = std::iter::once(self.keyspace_probe())
                    .chain(registries)
                    .chain(buckets)
                    .chain(last)
                    .collect();
                let mut replies = all_ok(session.commit(all, true).await?)?;
                self.probed(replies.first())?;
                replies.truncate(1 + n_registries + n_entries);
                replies.split_off(1 + n_registries)
            };
            if replies.len() != n_entries {
                return Err(StoreError::corrupt(format!(
                    "{} replies to {n_entries} HSETs",
                    replies.len()
                )));
            }
            replies
                .iter()
                .map(|v| {
                    redis::from_redis_value_ref::<i64>(v)
                        .map(|n| n == 1)
                        .map_err(|e| StoreError::corrupt(format!("HSET reply: {e}")))
                })
                .collect()
        }
        .await;
        self.noted(r)
    }

    async fn remove(
        &self,
        keys: &[EntryKey],
        now_ms: i64,
        audit: Vec<AuditRecord>,
        deadline: Deadline,
    ) -> StoreResult<Vec<Removed>> {
        self.unless_lost(true)?;
        let calls = self.removal_calls(keys);
        let now_rel = ExpiryCode::script_now(now_ms);
        let topology = self.monitor.topology();
        let key_buckets: Vec<u32> = keys.iter().map(|k| k.bucket).collect();
        let mut last = self.audit_cmds(&topology, &audit, &key_buckets);
        let scripts = self.removals(keys, &calls, now_rel);
        let route = last.first().or(scripts.first()).map(|(k, _)| k.clone());
        last.push(self.publish_cmd(&Invalidation::removed(keys), route.as_deref()));
        let touched = scripts.iter().chain(&last);
        let mut session = self
            .session(
                &topology,
                touched.map(|(k, _)| k.as_slice()),
                self.write_replicas,
                deadline,
            )
            .await?;
        let r = async {
            // The keyspace id after the deletions, on their connection: deletions that reached
            // a keyspace lost meanwhile are neither audited, announced nor acknowledged.
            let mut results = session
                .step(
                    scripts.into_iter().chain([self.keyspace_probe()]).collect(),
                    false,
                )
                .await?;
            let probe = results.pop().transpose().map_err(unavailable)?;
            self.probed(probe.as_ref())?;
            if results.iter().any(|r| r.as_ref().is_err_and(is_noscript)) {
                // The script cache was flushed (a restart): load and redo what did not run.
                self.load_scripts().await?;
                let again: Vec<usize> = (0..results.len())
                    .filter(|&i| results[i].as_ref().is_err_and(is_noscript))
                    .collect();
                let redo: Vec<Keyed> = self
                    .removals(keys, &calls, now_rel)
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| again.contains(i))
                    .map(|(_, c)| c)
                    .collect();
                for (i, r) in again.into_iter().zip(session.step(redo, false).await?) {
                    if let Some(slot) = results.get_mut(i) {
                        *slot = r;
                    }
                }
            }
            if results.len() != calls.len() {
                return Err(StoreError::corrupt(format!(
                    "{} replies to {} deletions",
                    results.len(),
                    calls.len()
                )));
            }
            let mut removed = vec![Removed::Absent; keys.len()];
            for ((_, idx), result) in calls.iter().zip(results) {
                let flags: Vec<i64> = result
                    .and_then(|v| Ok(redis::from_redis_value(v)?))
                    .map_err(unavailable)?;
                if flags.len() != idx.len() {
                    return Err(StoreError::corrupt(format!(
                        "{} flags for {} deleted fields",
                        flags.len(),
                        idx.len()
                    )));
                }
                for (&i, flag) in idx.iter().zip(flags) {
                    if let Some(r) = removed.get_mut(i) {
                        match flag {
                            1 => *r = Removed::Live,
                            2 if *r == Removed::Absent => *r = Removed::Expired,
                            _ => {}
                        }
                    }
                }
            }
            // Audit and tell every instance once the deletions are done, then wait for the
            // replicas to have all of it.
            all_ok(session.commit(last, true).await?)?;
            Ok(removed)
        }
        .await;
        self.noted(r)
    }

    async fn remove_if_unchanged(
        &self,
        key: EntryKey,
        code: u32,
        deadline: Deadline,
    ) -> StoreResult<bool> {
        self.unless_lost(true)?;
        // Housekeeping: no replica is waited for (an expired entry deleted again after a
        // failover is harmless), but an unreachable primary is not tried.
        let bucket = self.layout.bucket_key(key.bucket);
        let topology = self.monitor.topology();
        let mut session = self
            .session(&topology, [bucket.as_bytes()], 0, deadline)
            .await?;
        let cmd = || {
            let mut c = redis::cmd("EVALSHA");
            c.arg(self.remove_if_unchanged.get_hash())
                .arg(1)
                .arg(&bucket)
                .arg(key.field)
                .arg(code);
            vec![(bucket.clone().into_bytes(), c)]
        };
        let r = async {
            let mut reply = first(session.commit(cmd(), false).await?)?;
            if reply.as_ref().is_err_and(is_noscript) {
                self.load_scripts().await?;
                reply = first(session.commit(cmd(), false).await?)?;
            }
            // {deleted, refreshed}: one field asked, so deleted is 0 or 1.
            let (deleted, _refreshed): (i64, i64) =
                redis::from_redis_value(reply.map_err(unavailable)?)
                    .map_err(|e| StoreError::corrupt(format!("compare-and-delete reply: {e}")))?;
            Ok(deleted == 1)
        }
        .await;
        self.noted(r)
    }

    async fn audit_tail(&self, count: usize) -> StoreResult<Vec<AuditRecord>> {
        let cmds: Vec<Keyed> = self
            .layout
            .audit_keys()
            .into_iter()
            .map(|key| {
                Self::keyed(key, |c, key| {
                    c.arg("XREVRANGE")
                        .arg(key)
                        .arg("+")
                        .arg("-")
                        .arg("COUNT")
                        .arg(count);
                })
            })
            .collect();
        let parts = self
            .operator_reads()
            .run_all(cmds)
            .await
            .map_err(unavailable)?
            .iter()
            .map(parse_stream)
            .collect::<StoreResult<Vec<_>>>()?;
        Ok(newest(parts, count))
    }

    fn audit_parts(&self) -> u16 {
        // The 64 parts and the single stream of earlier versions, last.
        (AUDIT_PARTS + 1) as u16
    }

    async fn audit_read(&self, reads: &[AuditRead]) -> StoreResult<Vec<AuditChunk>> {
        let keys = self.layout.audit_keys();
        let mut out = vec![AuditChunk::default(); reads.len()];
        // First round trip: an `XREVRANGE` per plain read, an index range per indexed one.
        // The reads sent, by index: a bound with nothing older is answered here (an
        // `XREVRANGE` to `(0-0` is refused: "invalid end ID").
        let mut cmds: Vec<Keyed> = Vec::with_capacity(reads.len());
        let mut sent = Vec::with_capacity(reads.len());
        for (i, read) in reads.iter().enumerate() {
            let stream = usize::from(read.part);
            let key = keys
                .get(stream)
                .ok_or_else(|| StoreError::corrupt(format!("no audit part {}", read.part)))?;
            if read.before_everything() {
                continue;
            }
            sent.push(i);
            if let Some(term) = &read.index {
                cmds.push(self.audit_index_range(stream, term, read));
                continue;
            }
            let end = match read.before {
                None => "+".to_owned(),
                Some((ms, seq)) if read.inclusive => format!("{ms}-{seq}"),
                Some((ms, seq)) => format!("({ms}-{seq}"),
            };
            cmds.push(Self::keyed(key.clone(), |c, key| {
                c.arg("XREVRANGE")
                    .arg(key)
                    .arg(&end)
                    .arg("-")
                    .arg("COUNT")
                    .arg(read.count);
            }));
        }
        // One reply per command (`RedisConn::run`), in order.
        let replies = self
            .operator_reads()
            .run_all(cmds)
            .await
            .map_err(unavailable)?;
        // Second round trip: each record the indexes named, by its id (an `XRANGE` in a
        // script would cost Redis ~10 times more a record: the reply made a Lua table and
        // back).
        let mut fetch: Vec<Keyed> = Vec::new();
        let mut named: Vec<(usize, (u64, u64))> = Vec::new();
        for (&i, v) in sent.iter().zip(&replies) {
            let read = &reads[i];
            let part = read.part;
            if read.index.is_none() {
                let records: Vec<(AuditPos, AuditRecord)> = parse_stream(v)?
                    .into_iter()
                    .map(|((ms, seq), r)| (AuditPos { ms, seq, part }, r))
                    .collect();
                out[i].next = records
                    .last()
                    .filter(|_| records.len() == read.count)
                    .map(|(p, _)| (p.ms, p.seq));
                out[i].records = records;
                continue;
            }
            let ids = parse_index_range(v)?;
            out[i].next = ids.last().copied().filter(|_| ids.len() == read.count);
            let key = &keys[usize::from(part)];
            for (ms, seq) in ids {
                let id = format!("{ms}-{seq}");
                fetch.push(Self::keyed(key.clone(), |c, key| {
                    c.arg("XRANGE").arg(key).arg(&id).arg(&id);
                }));
                named.push((i, (ms, seq)));
            }
        }
        if !fetch.is_empty() {
            let replies = self.conn.run_all(fetch).await.map_err(unavailable)?;
            for ((i, (ms, seq)), v) in named.into_iter().zip(&replies) {
                // A member whose record is gone (an older build trimmed it) finds nothing.
                if let Some((_, record)) = parse_stream(v)?.into_iter().next() {
                    let part = reads[i].part;
                    out[i].records.push((AuditPos { ms, seq, part }, record));
                }
            }
        }
        Ok(out)
    }

    async fn count_changes(
        &self,
        changes: &[CountChange],
        at_ms: i64,
        deadline: Deadline,
    ) -> StoreResult<()> {
        self.unless_lost(true)?;
        let pairs: Vec<(&str, &str, i64, i64)> = changes
            .iter()
            .map(|c| (c.scope.0.as_str(), c.scope.1.as_str(), c.delta, at_ms))
            .collect();
        self.run_counts(self.count_calls(&pairs), deadline).await
    }

    async fn list_counts(&self, query: &CountsQuery) -> StoreResult<CountsPage> {
        if query.limit == 0 {
            return Ok(CountsPage::default());
        }
        let range = Layout::count_range(query);
        let [counts, times, by_list, by_sandbox] = self.layout.counts_keys();
        let index = if range.by_sandbox {
            by_sandbox
        } else {
            by_list
        };
        let call = || {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(self.counts_page.get_hash())
                .arg(3)
                .arg(&counts)
                .arg(&times)
                .arg(&index)
                .arg(&range.min)
                .arg(&range.max)
                // One more than asked says whether there is more (Redis takes an i64).
                .arg(query.limit.min(i64::MAX as usize - 1) + 1)
                .arg(if range.by_sandbox { "1" } else { "0" });
            vec![(counts.clone().into_bytes(), cmd)]
        };
        let conn = self.operator_reads();
        let mut reply = first(conn.run(call()).await.map_err(unavailable)?)?;
        if reply.as_ref().is_err_and(is_noscript) {
            self.load_scripts().await?;
            reply = first(conn.run(call()).await.map_err(unavailable)?)?;
        }
        let flat: Vec<(Vec<u8>, Option<i64>, Option<i64>)> =
            redis::from_redis_value(reply.map_err(unavailable)?)
                .map_err(|e| StoreError::corrupt(format!("lists' counts page: {e}")))?;
        let more = flat.len() > query.limit;
        let mut page = CountsPage {
            counts: Vec::with_capacity(flat.len().min(query.limit)),
            more,
        };
        for (member, count, time) in flat.into_iter().take(query.limit) {
            let (list, sandbox) = Layout::parse_count_member(&member).ok_or_else(|| {
                StoreError::corrupt(format!(
                    "lists' counts member {:?}",
                    String::from_utf8_lossy(&member)
                ))
            })?;
            // Written together by one script: an index member without a count is not ours.
            let Some(entries) = count else { continue };
            page.counts.push(ListCount {
                list,
                sandbox,
                entries,
                last_change_ms: time.unwrap_or(0),
            });
        }
        Ok(page)
    }
}

#[async_trait]
impl InvalidationBus for RedisStore {
    async fn subscribe(&self) -> StoreResult<InvalidationStream> {
        Ok(self.subscribe_proven().await?.0)
    }

    async fn subscribe_proven(&self) -> StoreResult<(InvalidationStream, Option<Arc<Liveness>>)> {
        // On a cluster any node delivers every PUBLISH: subscribe to the seeds in turn, so
        // a node that is down (or was failed over) is skipped next time.
        let n = self.pubsub_clients.len().max(1);
        let i = self.pubsub_next.fetch_add(1, Ordering::Relaxed) % n;
        let client =
            self.pubsub_clients.get(i).cloned().ok_or_else(|| {
                StoreError::unavailable("no Redis URL to subscribe through".into())
            })?;
        let connect = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(self.layout.channel()).await?;
            Ok::<_, RedisError>(pubsub)
        };
        let pubsub = tokio::time::timeout(self.pubsub_timeout, connect)
            .await
            .map_err(|_| StoreError::Timeout(self.pubsub_timeout))?
            .map_err(unavailable)?;
        let (mut sink, stream) = pubsub.split();
        // A half-open connection (or a stopped node) delivers nothing and never errors: ping
        // it, leave each answered ping's send time as a proof of delivery (`Liveness`), and
        // end the stream when a ping goes unanswered.
        let (mut dead_tx, dead_rx) = tokio::sync::oneshot::channel::<()>();
        let timeout = self.pubsub_timeout;
        // (The first proof is the subscription itself: the listener starts its clock.)
        let live = Arc::new(Liveness::default());
        let proofs = live.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Liveness::PROOF_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tokio::select! {
                    // The subscriber dropped the stream: stop pinging.
                    _ = dead_tx.closed() => return,
                    _ = tick.tick() => {}
                }
                // In subscribed mode PING answers ["pong", ""], not +PONG.
                let sent = Instant::now();
                let ping = tokio::time::timeout(timeout, sink.ping::<redis::Value>()).await;
                if !matches!(ping, Ok(Ok(_))) {
                    let _ = dead_tx.send(());
                    return;
                }
                proofs.proved(sent);
            }
        });
        let stream = stream
            .take_until(dead_rx)
            .filter_map(|msg| async move { Invalidation::decode(msg.get_payload_bytes()) })
            .boxed();
        Ok((stream, Some(live)))
    }

    async fn publish(&self, message: &Invalidation) -> StoreResult<()> {
        self.conn
            .run_all(vec![self.publish_cmd(message, None)])
            .await
            .map(drop)
            .map_err(unavailable)
    }

    async fn log_mark(&self) -> StoreResult<Option<LogMark>> {
        // The nodes first: a restart after this shows in the next mark's ids.
        let mut nodes = Vec::new();
        let conn = &self.log;
        for target in conn.scan_targets().await.map_err(unavailable)? {
            let info: String = conn
                .on_target(&target, redis::cmd("INFO").arg("server"))
                .await
                .map_err(unavailable)?;
            nodes.push(changelog::run_id(&info)?);
        }
        nodes.sort();
        let cmds = (0..AUDIT_PARTS)
            .map(|i| {
                Self::keyed(self.layout.audit_part_key(i), |c, key| {
                    c.arg("XINFO").arg("STREAM").arg(key);
                })
            })
            .collect();
        let parts = conn
            .run(cmds)
            .await
            .map_err(unavailable)?
            .into_iter()
            .map(changelog::part_mark_of)
            .collect::<StoreResult<Vec<_>>>()?;
        Ok(Some(LogMark { parts, nodes }))
    }

    async fn log_read(&self, from: &LogMark, to: Option<&LogMark>) -> StoreResult<Replay> {
        let now = match to {
            Some(to) => to.clone(),
            None => match self.log_mark().await? {
                Some(now) => now,
                None => return Ok(Replay::Gap("no change log".into())),
            },
        };
        let reads = match changelog::replay_reads(from, &now) {
            Ok(r) => r,
            Err(why) => return Ok(Replay::Gap(why)),
        };
        // In rounds of at most `LOG_CHUNK` records over every part: no one reply is large
        // (a burst of writes, a long break), however many records there are.
        let mut records: Vec<Vec<((u64, u64), AuditRecord)>> = vec![Vec::new(); reads.len()];
        let mut next: Vec<Option<changelog::PartRead>> = reads.iter().copied().map(Some).collect();
        loop {
            let active: Vec<usize> = (0..next.len()).filter(|&i| next[i].is_some()).collect();
            if active.is_empty() {
                break;
            }
            let share = (changelog::LOG_CHUNK / active.len() as u64).max(16);
            let asked: Vec<(usize, u64)> = active
                .iter()
                .map(|&i| (i, next[i].map_or(0, |r| r.count.min(share))))
                .collect();
            let cmds = asked
                .iter()
                .map(|&(i, count)| {
                    let read = next[i].expect("active");
                    let (from, to) = read.bounds();
                    Self::keyed(self.layout.audit_part_key(read.part), |c, key| {
                        c.arg("XRANGE")
                            .arg(key)
                            .arg(&from)
                            .arg(&to)
                            .arg("COUNT")
                            .arg(count);
                    })
                })
                .collect();
            let replies = self.log.run_all(cmds).await.map_err(unavailable)?;
            for (&(i, count), reply) in asked.iter().zip(&replies) {
                let got = parse_stream(reply)?;
                let read = next[i].as_mut().expect("active");
                let n = got.len() as u64;
                // A short page: the part holds no more up to the mark (trimmed, if fewer than
                // were added: `replay` sees it).
                let done = n < count || n >= read.count;
                if let Some(((ms, seq), _)) = got.last() {
                    read.from = (*ms, *seq);
                }
                read.count = read.count.saturating_sub(n);
                records[i].extend(got);
                if done {
                    next[i] = None;
                }
            }
        }
        Ok(changelog::replay(&reads, &records, self.layout.buckets()))
    }
}

#[async_trait]
impl MetricStore for RedisStore {
    async fn metric_ops(
        &self,
        ops: &[MetricOp],
        deadline: Deadline,
    ) -> StoreResult<Vec<MetricAnswer>> {
        // A lost keyspace has no counts to read and keeps none written.
        self.unless_lost(ops.iter().any(|o| o.update.is_some()))?;
        // Updates are writes (their own connections, refusal, WAIT); reads stay on the read
        // path. Both go at once.
        let (updates, reads): (Vec<usize>, Vec<usize>) =
            (0..ops.len()).partition(|&i| ops[i].update.is_some());
        let (written, read) = futures::join!(
            self.metric_updates(ops, updates, deadline),
            self.metric_reads(ops, reads)
        );
        let mut out: Vec<Option<MetricAnswer>> = vec![None; ops.len()];
        for (i, a) in written?.into_iter().chain(read?) {
            if let Some(o) = out.get_mut(i) {
                *o = Some(a);
            }
        }
        out.into_iter()
            .map(|r| r.ok_or_else(|| StoreError::unavailable("metric scripts not loaded".into())))
            .collect()
    }
}

#[async_trait]
impl DefinitionStore for RedisStore {
    async fn definitions(&self, kind: DefinitionKind) -> StoreResult<Vec<StoredDefinition>> {
        let mut conn = self.operator_reads();
        let all: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(self.layout.definitions_key(kind.as_str()))
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let mut out = Vec::new();
        for (id, value) in all {
            let mut parts = value.splitn(3, '\n');
            let (Some(version), Some(fingerprint), Some(body)) =
                (parts.next(), parts.next(), parts.next())
            else {
                return Err(StoreError::corrupt(format!("definition {id}: {value:?}")));
            };
            if fingerprint.is_empty() {
                continue; // deleted
            }
            let version = version.parse().map_err(|_| {
                StoreError::corrupt(format!("definition {id}: version {version:?}"))
            })?;
            out.push(StoredDefinition {
                id,
                version,
                body: body.to_owned(),
            });
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    async fn put_definition(
        &self,
        kind: DefinitionKind,
        id: &str,
        fingerprint: &str,
        body: &str,
        deadline: Deadline,
    ) -> StoreResult<u64> {
        self.unless_lost(true)?;
        let v = self
            .definition_call(kind, PUT_DEFINITION, &[id, fingerprint, body], deadline)
            .await?;
        redis::from_redis_value(v)
            .map_err(|e| StoreError::corrupt(format!("definition version: {e}")))
    }

    async fn delete_definition(
        &self,
        kind: DefinitionKind,
        id: &str,
        deadline: Deadline,
    ) -> StoreResult<bool> {
        self.unless_lost(true)?;
        let v = self
            .definition_call(kind, DELETE_DEFINITION, &[id], deadline)
            .await?;
        let n: i64 = redis::from_redis_value(v)
            .map_err(|e| StoreError::corrupt(format!("definition delete: {e}")))?;
        Ok(n == 1)
    }
}

#[async_trait]
impl AuditReports for RedisStore {
    async fn audit_summary(&self) -> StoreResult<Option<AuditSummary>> {
        let mut conn = self.operator_reads();
        let fields: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
            .arg(self.layout.audit_summary_key())
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(AuditSummary::from_fields(&fields))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn entry(id: &str, at: &str) -> Value {
        Value::Array(vec![
            bulk(id),
            Value::Array(vec![bulk("at"), bulk(at), bulk("op"), bulk("upsert")]),
        ])
    }

    #[test]
    fn audit_parts_merge_newest_first_by_stream_id() {
        let a = parse_stream(&Value::Array(vec![entry("20-0", "a3"), entry("5-1", "a1")])).unwrap();
        let b = parse_stream(&Value::Array(vec![
            entry("20-1", "b4"),
            entry("10-0", "b2"),
            entry("5-0", "b0"),
        ]))
        .unwrap();
        let legacy = parse_stream(&Value::Array(vec![])).unwrap();
        let at = |records: Vec<AuditRecord>| -> Vec<String> {
            records
                .iter()
                .map(|r| r.get("at").unwrap().to_owned())
                .collect()
        };
        assert_eq!(
            at(newest(vec![a.clone(), b.clone(), legacy.clone()], 3)),
            ["b2", "a3", "b4"],
            "the 3 newest, oldest first"
        );
        assert_eq!(
            at(newest(vec![a, b, legacy], 100)),
            ["b0", "a1", "b2", "a3", "b4"],
            "10-0 sorts before 5-1 as numbers, not text"
        );
    }

    #[test]
    fn odd_stream_replies_are_corrupt_not_panics() {
        assert_eq!(stream_id("1700000000000-3"), Some((1_700_000_000_000, 3)));
        for bad in ["", "12", "a-1", "1-b", "-"] {
            assert_eq!(stream_id(bad), None, "{bad:?}");
        }
        for bad in [
            Value::Int(3),
            Value::Array(vec![entry("x-1", "a")]),
            Value::Array(vec![Value::Array(vec![bulk("1-1")])]),
        ] {
            assert!(
                matches!(parse_stream(&bad), Err(StoreError::Corrupt { .. })),
                "{bad:?}"
            );
        }
        // An odd field count keeps the whole pairs.
        let odd = Value::Array(vec![Value::Array(vec![
            bulk("1-1"),
            Value::Array(vec![bulk("at"), bulk("1"), bulk("dangling")]),
        ])]);
        assert_eq!(parse_stream(&odd).unwrap()[0].1.fields.len(), 1);
    }

    #[test]
    fn odd_index_members_are_corrupt_not_panics() {
        let member = |b: &[u8]| Value::BulkString(b.to_vec());
        let ok = Value::Array(vec![
            member(b"w:alice\x0018bcfe5684d00000003"),
            member(b"v:00000000000000ab\x000000000000000000001"),
        ]);
        assert_eq!(
            parse_index_range(&ok).unwrap(),
            [(1_700_000_000_077, 3), (0, 1)]
        );
        for bad in [
            &b"w:alice\x0018bcfe5684d0000000"[..],
            b"w:alice18bcfe5684d00000003",
            b"\x0018bcfe5684d0000000X",
            b"0018bcfe5684d00000003",
            b"",
        ] {
            let v = Value::Array(vec![member(bad)]);
            assert!(
                matches!(parse_index_range(&v), Err(StoreError::Corrupt { .. })),
                "{bad:?}"
            );
        }
        assert!(parse_index_range(&Value::Int(1)).is_err());
    }

    #[test]
    fn one_reply_steps() {
        assert!(matches!(first(vec![]), Err(StoreError::Corrupt { .. })));
        assert!(matches!(
            first(vec![Ok(Value::Int(1))]),
            Ok(Ok(Value::Int(1)))
        ));
        assert!(
            all_ok(vec![
                Ok(Value::Int(1)),
                Err(RedisError::from((ErrorKind::Io, "x")))
            ])
            .is_err()
        );
    }
}
