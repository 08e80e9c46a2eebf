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
//!
//! Where things are: this module holds the store itself (options, opening a keyspace, the
//! write path, `StoreBase`); one module per trait implementation beside it (`entries`,
//! `bus`, `velocity` for metrics and definitions, `audit` for the trail and its reports); and
//! the Redis plumbing they share: `conn` (read routing and the write pool), `worker_conn`,
//! `heal`, `replicas`, `scripts`, `shards` (the markers that tell a cluster's shard that lost
//! its data), `bulk` (the tools' bulk reads and writes), `dump`
//! (reading `DUMP` payloads) and `changelog` (catching up from the audit trail).

pub mod bulk;
pub mod changelog;
pub mod coalesce;
pub mod conn;
pub mod dump;
pub mod heal;
pub mod replicas;
pub mod scripts;
pub mod worker_conn;
pub mod write_pool;

mod audit;
mod bus;
mod entries;
mod shards;
mod velocity;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use redis::{Client, Cmd, ErrorKind, RedisError, RedisResult, Script, ServerErrorKind};

use self::conn::{ConnectOptions, Keyed, RedisConn};
use self::scripts::{
    AUDIT_APPEND_LUA, AUDIT_CATCH_UP_LUA, COUNT_CHANGES, COUNTS_PAGE, DEFINITION_GUARD,
    DELETE_DEFINITION, GUARDED_PUBLISH, MetricScripts, OPEN_KEYSPACE, PUT_DEFINITION,
    TAKE_OLD_COUNTS, is_lost, is_noscript,
};
use self::worker_conn::PerWorker;
pub use self::write_pool::DEFAULT_WRITE_CONNECTIONS;
use self::write_pool::{WritePool, WriteSession};

use self::replicas::{ReplicaMonitor, Topology, Watched};
use crate::domain::{ListName, Sandbox, now_ms};
use crate::store::expiry::ExpiryCode;
use crate::store::fingerprint::{self, FingerprintKey, RecordedHashing};
use crate::store::layout::{
    AUDIT_INDEX_ID_LEN, AUDIT_PARTS, COUNT_CHUNK, DEFAULT_EXPECTED_EVENT_IDS, MAX_MEAN_FILL,
    VELOCITY_LAYOUT, audit_index_id, audit_index_term, key_slot, parse_audit_index_id,
};
use crate::store::{
    AuditChunk, AuditPos, AuditRead, AuditRecord, AuditReports, AuditSummary, AuditTerm,
    CountChange, CountsPage, CountsQuery, Deadline, DefinitionKind, DefinitionStore, EntryKey,
    EntryStore, EventMark, Invalidation, InvalidationBus, InvalidationStream, KeyspaceHealth,
    Layout, ListCount, Liveness, LogMark, MetricAnswer, MetricFamily, MetricOp, MetricReading,
    MetricStore, NewDefinition, PrefixLen, Refusal, RemoveBatch, Removed, Replay, Scope, StoreBase,
    StoreError, StoreResult, StoredDefinition, WriteBatch,
};

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
    /// Connections of the write pool (`write_pool`).
    pub write_connections: usize,
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
    /// Shard markers written at open (a cluster: all 16,384 for a keyspace that had none,
    /// the lost slots' when `keyspace create --lost-for-good` accepts their loss).
    pub shards_marked: usize,
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

/// The Redis store.
pub struct RedisStore {
    /// One client per configured URL, for pub/sub (tried in turn).
    pubsub_clients: Vec<Client>,
    pubsub_next: AtomicUsize,
    /// Audit parts known to exist (bit `i`: part `i`), so that the change log's marks ask
    /// `XINFO STREAM` only of those (`bus`, `log_mark`).
    audit_parts_seen: AtomicU64,
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
    /// One node's queue of events waiting to share a metric script call (`coalesce`); none
    /// on a cluster.
    coalescer: Option<coalesce::Coalescer>,
    /// Ids a bucket of event ids holds before it drops its expired ones (`velocity::purge_from`).
    id_purge_from: u32,
    pubsub_timeout: Duration,
    write_replicas: u32,
    /// The server refused `DUMP` once (ACLs, renamed command): buckets are read with
    /// `HGETALL` from then on.
    dump_refused: AtomicBool,
    /// The keyspace's id as opened, and whether it is still there (`layout`, *The keyspace
    /// id*): set when a read, a write or `verify_keyspace` finds the meta hash without it.
    keyspace_id: String,
    lost: AtomicBool,
    /// Whether the lost marker is known to stand, and whether a try is under way.
    lost_marker: Arc<LostMarker>,
    health: tokio::sync::watch::Sender<KeyspaceHealth>,
    /// On a cluster, the slots whose shard markers were found missing (`shards`), and where
    /// `verify_keyspace`'s sweep of the markers is.
    lost_slots: std::sync::Mutex<std::collections::BTreeSet<u16>>,
    sweep: AtomicUsize,
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
            None => Err(self.gone("")),
        }
    }

    /// The meta hash is gone: the keyspace is lost (`mark_lost`); `more` ends the why.
    fn gone(&self, more: &str) -> StoreError {
        self.mark_lost(format!(
            "{} is gone (keyspace id {}): Redis restarted without its data, was flushed, or \
             failed over to an empty node{more}",
            self.layout.meta_key(),
            self.keyspace_id
        ))
    }

    /// The keyspace is lost (`KeyspaceHealth::Lost`): said once, loudly, with the marker left
    /// for instances that start meanwhile (`leave_lost_marker`: tried on every call until it
    /// stands). Returns the error to answer with.
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
        }
        if !self.lost_marker.left.load(Ordering::Acquire)
            && !self.lost_marker.trying.swap(true, Ordering::AcqRel)
        {
            tokio::spawn(leave_lost_marker(
                self.operator_reads(),
                Layout::lost_marker_key_of(self.layout.prefix()),
                self.keyspace_id.clone(),
                self.lost_marker.clone(),
            ));
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

/// The lost keyspace's marker, as far as this instance knows (`RedisStore::mark_lost`).
#[derive(Default)]
struct LostMarker {
    /// It stands (cleared when the keyspace is back, which deletes it).
    left: AtomicBool,
    /// A try is under way.
    trying: AtomicBool,
    /// A failed try was logged (once per loss).
    warned: AtomicBool,
}

/// One try at leaving the lost keyspace's marker (`SET NX` of its id). A failure is logged
/// once; the next `mark_lost` tries again, and while the keyspace stays lost the keyspace
/// watch calls it every second (`verify_keyspace`): the first try often meets the connection
/// the loss itself broke (Redis restarted), and without the marker an instance starting
/// meanwhile would make a new, empty keyspace over the lost one. A stopped instance's watch
/// has stopped, so it tries no more.
async fn leave_lost_marker(
    mut conn: RedisConn,
    marker: String,
    id: String,
    state: Arc<LostMarker>,
) {
    let set = redis::cmd("SET").arg(&marker).arg(&id).arg("NX").clone();
    let failed = match tokio::time::timeout(LOST_MARKER_TRY, set.query_async::<()>(&mut conn)).await
    {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some(format!("no answer within {LOST_MARKER_TRY:?}")),
    };
    match failed {
        None => {
            state.left.store(true, Ordering::Release);
            if state.warned.swap(false, Ordering::AcqRel) {
                tracing::info!("the lost keyspace's marker is left");
            }
        }
        Some(error) if !state.warned.swap(true, Ordering::AcqRel) => {
            tracing::warn!(
                error,
                "could not leave the lost keyspace's marker yet: tried again every second while it is lost"
            );
        }
        Some(_) => {}
    }
    state.trying.store(false, Ordering::Release);
}

/// How long one try of the lost keyspace's marker may take.
const LOST_MARKER_TRY: Duration = Duration::from_secs(2);

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

/// A reply's text, bulk or simple (RESP2 and RESP3 send the same field either way); `None`
/// for anything else or bytes that are not UTF-8.
fn reply_text(v: &redis::Value) -> Option<String> {
    match v {
        redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        redis::Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// A stream entry id, `<ms>-<seq>`, as numbers (ordered as Redis orders them).
pub(super) fn stream_id(id: &str) -> Option<(u64, u64)> {
    let (ms, seq) = id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

/// The smallest `hash-max-listpack-entries` that keeps buckets of this mean fill listpacks:
/// five standard deviations of a Poisson fill above the mean.
pub fn min_listpack_entries(mean_fill: f64) -> u64 {
    (mean_fill + 5.0 * mean_fill.sqrt()).ceil() as u64
}

/// Whether `RedisStore::open` may make a keyspace where the meta hash is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Create {
    /// Never (`create_keyspace = false`): an empty Redis is refused, never taken for a new one.
    Never,
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

    /// `open` if `create_keyspace`, else only an existing keyspace: a missing meta hash is
    /// refused (`create_keyspace = false`, for production: nothing in an emptied Redis tells
    /// it from a new one, so only `namelist-tools keyspace create` makes one).
    pub async fn open_configured(
        opts: RedisOptions,
        create_keyspace: bool,
    ) -> StoreResult<(Self, OpenReport)> {
        let create = if create_keyspace {
            Create::IfNew
        } else {
            Create::Never
        };
        Self::open_with(opts, create).await
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
            .arg(if create == Create::Never {
                String::new()
            } else {
                create_format
            })
            .arg(wanted)
            .arg(now_ms())
            .arg(create_key_id)
            .arg(&new_id)
            .arg(if create == Create::Anew { "1" } else { "0" })
            .arg(wanted_event_buckets)
            .arg(crate::domain::LATEST_RULES)
            .arg(VELOCITY_LAYOUT)
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        if created == -2 {
            return Err(StoreError::Keyspace(format!(
                "{meta} is missing, and an instance saw the keyspace there (id {}) vanish: Redis \
                 restarted without its data, was flushed, or failed over to an empty node. Restore \
                 its data (RDB or AOF) and start again, or make a new, empty keyspace explicitly \
                 with `namelist-tools keyspace create --lost-for-good` and load the lists into it",
                keyspace_id.as_deref().unwrap_or("?")
            )));
        }
        let keyspace_id = keyspace_id.unwrap_or(new_id);
        let (hashing, unkeyed) = match created {
            // Missing, and not created: only when there was nothing to create it with.
            -1 if create == Create::Never => {
                return Err(StoreError::Keyspace(format!(
                    "no keyspace at key prefix {} ({meta} is missing), and create_keyspace = \
                     false: nothing in Redis tells an emptied one from a new one. If Redis lost \
                     its data (restarted without it, flushed, failed over to an empty node), \
                     restore it (RDB or AOF) and start again; if this Redis is new, make the \
                     keyspace with `namelist-tools keyspace create`, then load the lists",
                    opts.prefix
                )));
            }
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
        let (Some(velocity @ 1..=VELOCITY_LAYOUT), Some(event_buckets @ 1..)) =
            (velocity, event_buckets)
        else {
            return Err(StoreError::Keyspace(format!(
                "{meta} has no velocity or event_buckets field this build can read (velocity \
                 layout 1 to {VELOCITY_LAYOUT}, event_buckets at least 1): a keyspace made by a \
                 newer build needs a build at least as new"
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
        let shards_marked = if cluster {
            shards::open_shard_markers(
                &conn,
                &layout,
                &keyspace_id,
                create == Create::Anew,
                created == 1,
            )
            .await?
        } else {
            0
        };

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

        let (writes, monitor) = Self::write_path(
            &connect,
            &pubsub_clients,
            opts.write_replicas,
            opts.write_connections,
        )
        .await?;
        let per_worker = PerWorker::new(&connect, &pubsub_clients, "reads (worker)");
        let store = Self {
            pubsub_clients,
            pubsub_next: AtomicUsize::new(0),
            audit_parts_seen: AtomicU64::new(0),
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
            coalescer: (!cluster).then(coalesce::Coalescer::default),
            id_purge_from: velocity::purge_from(opts.dedupe_expected_ids, event_buckets),
            pubsub_timeout: opts.connect_timeout,
            write_replicas: opts.write_replicas,
            dump_refused: AtomicBool::new(false),
            keyspace_id,
            lost: AtomicBool::new(false),
            lost_marker: Arc::default(),
            health: tokio::sync::watch::channel(KeyspaceHealth::Present).0,
            lost_slots: Default::default(),
            sweep: AtomicUsize::new(0),
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
                shards_marked,
            },
        ))
    }

    /// The write connections and the replica monitor, each on connections of its own.
    async fn write_path(
        connect: &ConnectOptions,
        clients: &[Client],
        write_replicas: u32,
        write_connections: usize,
    ) -> StoreResult<(WritePool, ReplicaMonitor)> {
        let writes = WritePool::connect(connect, write_connections, write_replicas > 0)
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

    /// A `session` for `cmds` (by their routing keys) that waits for `write_replicas`.
    async fn replicated_session<'k>(
        &self,
        topology: &Topology,
        cmds: impl IntoIterator<Item = &'k Keyed>,
        deadline: Deadline,
    ) -> StoreResult<WriteSession<'_>> {
        // Collected: a closure held across the await makes the callers' futures not `Send`
        // (rust-lang/rust#64552).
        let keys: Vec<&[u8]> = cmds.into_iter().map(|(k, _)| k.as_slice()).collect();
        self.session(topology, keys, self.write_replicas, deadline)
            .await
    }

    /// Notes a failed write: the monitor looks again at once, so the next writes to a
    /// primary that just went away are refused early.
    fn noted<T>(&self, r: StoreResult<T>) -> StoreResult<T> {
        if let Err(StoreError::Unavailable { .. } | StoreError::Timeout(_)) = &r {
            self.monitor.refresh_soon();
        }
        r
    }

    /// The read connection, for tools that run their own commands.
    pub fn connection(&self) -> RedisConn {
        self.conn.clone()
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
    /// On a cluster the shard markers of the slots seen lost are read too, and the next
    /// `shards::SWEEP` in turn.
    async fn verify_keyspace(&self) -> StoreResult<()> {
        let slots = self.slots_to_verify();
        let cmds = std::iter::once(self.keyspace_probe())
            .chain(slots.iter().map(|&s| self.shard_probe(s)))
            .collect();
        let replies = self
            .operator_reads()
            .run_spread(cmds)
            .await
            .map_err(unavailable)?;
        self.probed(replies.first())?;
        self.shards_probed(&slots, replies.get(1..).unwrap_or_default())?;
        if self.lost.swap(false, Ordering::AcqRel) {
            self.forget_lost_slots();
            tracing::warn!(
                keyspace_id = self.keyspace_id,
                "the keyspace is back (its data restored): writes are taken again"
            );
            self.health.send_replace(KeyspaceHealth::Present);
            self.lost_marker.left.store(false, Ordering::Release);
            let mut conn = self.operator_reads();
            let _: RedisResult<()> = redis::cmd("DEL")
                .arg(Layout::lost_marker_key_of(self.layout.prefix()))
                .query_async(&mut conn)
                .await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::audit::*;
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
