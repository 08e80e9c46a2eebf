//! Typed bulk operations of the Redis store, for the operator tools (`namelist-tools`): walk
//! the keyspace's buckets (of entries, and of remembered event ids) node by node with
//! resumable cursors, read a bucket's fields a step at a time, measure a bucket, and delete
//! expired fields with compare-and-delete.
//!
//! Invariant: the tools never name a Redis command or hold Lua; they speak in [`Bucket`]s
//! and cursors, and every key these operations touch is one `Layout` names (`parse_bucket_key`
//! and `is_event_bucket` keep out keys that merely look like buckets). Each method is one
//! command (one round trip), so a tool can pace its commands one by one; none waits for
//! replicas (bulk work is housekeeping; see each tool's help for what it costs against a live
//! store).

use std::borrow::Cow;
use std::collections::BTreeMap;

use redis::{FromRedisValue, RedisResult, ToRedisArgs, Value};
use serde::Serialize;

use super::RedisStore;
use super::conn::{Keyed, RedisConn, ScanTarget};
use super::dump::{DumpError, DumpFormat};
use super::scripts::{
    self, COMPARE_AND_DELETE, COMPARE_AND_DELETE_SCRIPT, COUNT_EXPIRED_LUA, COUNT_EXPIRED_SCRIPT,
};
use crate::domain::now_ms;
use crate::store::StoreBase;
use crate::store::expiry::ExpiryCode;
use crate::store::layout::{CLUSTER_SLOTS, Layout, PrefixLen, Scope, key_slot};

/// A hash of this keyspace whose fields are signed decimal i64 and whose values are expiry
/// codes: what the sweep reads a step at a time and deletes expired fields from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Bucket {
    /// The bucket of entries `Layout::bucket_key(n)`.
    Entries(u32),
    /// A bucket of remembered event ids.
    EventIds(EventBucket),
}

impl Bucket {
    /// The bucket's key.
    pub fn key(&self, layout: &Layout) -> Cow<'_, str> {
        match self {
            Bucket::Entries(n) => Cow::Owned(layout.bucket_key(*n)),
            Bucket::EventIds(e) => Cow::Borrowed(&e.key),
        }
    }
}

/// A bucket of remembered event ids of this keyspace, `<prefix>e{<tag>}<b>`: built only from
/// a key `Layout::is_event_bucket` accepts, so nothing that merely looks like one is touched.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EventBucket {
    key: String,
    index: u64,
}

impl EventBucket {
    /// The bucket whose key is exactly `key`, if it is a bucket of event ids of `layout`.
    pub fn parse(layout: &Layout, key: &[u8]) -> Option<Self> {
        if !layout.is_event_bucket(key) {
            return None;
        }
        // `is_event_bucket` checked the shape: the prefix, `e{`, a tag, `}`, a number.
        let key = String::from_utf8(key.to_vec()).ok()?;
        let (tag, b) = key[layout.prefix().len() + 2..].split_once('}')?;
        // Each slot has exactly one tag, so (slot, b) names the bucket.
        let slot = u64::from(key_slot(tag.as_bytes()));
        let index = slot * Self::per_slot(layout) + b.parse::<u64>().ok()?;
        Some(Self { key, index })
    }

    /// How many numbers [`index`](Self::index) spans for `layout`'s event buckets.
    pub fn count(layout: &Layout) -> u64 {
        u64::from(CLUSTER_SLOTS) * Self::per_slot(layout)
    }

    /// A number of this bucket, unique among `layout`'s event buckets, below
    /// [`count`](Self::count) (for a tool's bit set of buckets seen).
    pub fn index(&self) -> u64 {
        self.index
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    fn per_slot(layout: &Layout) -> u64 {
        u64::from(layout.event_buckets()).div_ceil(u64::from(CLUSTER_SLOTS))
    }
}

/// One `SCAN` step over the keys the sweep walks on one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BucketScan {
    /// The cursor to continue from; 0 once the node is done.
    pub next: u64,
    /// Buckets of this keyspace found, of entries or event ids, in `SCAN` order (`SCAN` may
    /// return one twice, across steps too).
    pub buckets: Vec<Bucket>,
    /// Keys matching the pattern ([`RedisStore::sweep_scan_pattern`]) that are neither.
    pub skipped: u64,
}

/// One `HSCAN` step over a bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldScan {
    /// The cursor to continue from; 0 once the bucket is done.
    pub next: u64,
    /// Raw (field, value) pairs, as stored (`Layout::parse_entry` says which are entries).
    pub pairs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// What compare-and-delete did to one bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CasOutcome {
    /// Fields deleted: they still held the expected value.
    pub deleted: u64,
    /// Fields left alone: present with another value.
    pub refreshed: u64,
}

/// Deletes each `(field, expected)` of bucket `key` only if the field still holds `expected`
/// (`scripts::COMPARE_AND_DELETE`, one `EVALSHA`, loading the script after a `NOSCRIPT`).
/// Fields already gone count in neither figure. Pass at most a few thousand pairs per call.
pub async fn compare_and_delete<C, K, F, V>(
    conn: &mut C,
    key: K,
    expected: &[(F, V)],
) -> RedisResult<CasOutcome>
where
    C: redis::aio::ConnectionLike,
    K: ToRedisArgs,
    F: ToRedisArgs,
    V: ToRedisArgs,
{
    if expected.is_empty() {
        return Ok(CasOutcome::default());
    }
    let mut call = COMPARE_AND_DELETE_SCRIPT.prepare_invoke();
    call.key(key);
    for (field, value) in expected {
        call.arg(field).arg(value);
    }
    let (deleted, refreshed): (u64, u64) = call.invoke_async(conn).await?;
    Ok(CasOutcome { deleted, refreshed })
}

impl RedisStore {
    /// The nodes a walk of the keyspace visits: the node, or every cluster primary.
    pub async fn scan_targets(&self) -> RedisResult<Vec<ScanTarget>> {
        self.connection().scan_targets().await
    }

    /// Whether the store is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.connection().is_cluster()
    }

    /// One `SCAN` step on `target`, from `cursor`, about `count` keys, for the buckets of
    /// entries and of event ids together ([`sweep_scan_pattern`](Self::sweep_scan_pattern)).
    pub async fn scan_buckets(
        &self,
        target: &ScanTarget,
        cursor: u64,
        count: u32,
    ) -> RedisResult<BucketScan> {
        let layout = self.layout();
        let (next, keys) = self
            .connection()
            .scan(target, cursor, &self.sweep_scan_pattern(), count)
            .await?;
        let mut out = BucketScan {
            next,
            ..BucketScan::default()
        };
        for key in keys {
            if let Some(n) = layout.parse_bucket_key(&key) {
                out.buckets.push(Bucket::Entries(n));
            } else if let Some(e) = EventBucket::parse(layout, &key) {
                out.buckets.push(Bucket::EventIds(e));
            } else {
                out.skipped += 1;
            }
        }
        Ok(out)
    }

    /// One `HSCAN` step over `bucket`, about `count` fields; `None` if the key holds something
    /// other than a hash (not ours: leave it alone). A missing bucket is an empty last step.
    pub async fn scan_fields(
        &self,
        bucket: &Bucket,
        cursor: u64,
        count: u32,
    ) -> RedisResult<Option<FieldScan>> {
        let mut cmd = redis::cmd("HSCAN");
        cmd.arg(bucket.key(self.layout()).as_ref())
            .arg(cursor)
            .arg("COUNT")
            .arg(count);
        let (next, flat): (u64, Vec<Vec<u8>>) = match self.query(&cmd).await {
            Err(e) if e.code() == Some("WRONGTYPE") => return Ok(None),
            r => r?,
        };
        let mut pairs = Vec::with_capacity(flat.len() / 2);
        let mut it = flat.into_iter();
        while let (Some(f), Some(v)) = (it.next(), it.next()) {
            pairs.push((f, v));
        }
        Ok(Some(FieldScan { next, pairs }))
    }

    /// What `bucket` takes in Redis memory (`MEMORY USAGE … SAMPLES 0`: exact, O(fields)); 0
    /// if it does not exist.
    pub async fn bucket_memory(&self, bucket: &Bucket) -> RedisResult<u64> {
        let mut cmd = redis::cmd("MEMORY");
        cmd.arg("USAGE")
            .arg(bucket.key(self.layout()).as_ref())
            .arg("SAMPLES")
            .arg(0);
        let bytes: Option<u64> = self.query(&cmd).await?;
        Ok(bytes.unwrap_or(0))
    }

    /// Deletes each `(field, expected code)` of `bucket` that still holds exactly the value
    /// read (an entry or id refreshed since survives): `compare_and_delete` on this keyspace.
    pub async fn delete_if_unchanged(
        &self,
        bucket: &Bucket,
        expected: &[(Vec<u8>, Vec<u8>)],
    ) -> RedisResult<CasOutcome> {
        let key = bucket.key(self.layout());
        compare_and_delete(&mut self.connection(), key.as_ref(), expected).await
    }

    /// Loads the compare-and-delete script on `target` (before a walk that deletes, so that
    /// the first call on each node does not pay a `NOSCRIPT`).
    pub async fn load_compare_and_delete(&self, target: &ScanTarget) -> RedisResult<()> {
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(COMPARE_AND_DELETE);
        let _sha: String = self.connection().on_target(target, &load).await?;
        Ok(())
    }

    /// The `run_id` of the Redis process on `target` (`None` if `INFO` is refused): a scan
    /// cursor means something only to the process that returned it.
    pub async fn run_id(&self, target: &ScanTarget) -> Option<String> {
        let info: String = self
            .connection()
            .on_target(target, redis::cmd("INFO").arg("server"))
            .await
            .ok()?;
        info.lines()
            .find_map(|l| l.strip_prefix("run_id:"))
            .map(|s| s.trim().to_owned())
    }

    async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> RedisResult<T> {
        let mut conn: RedisConn = self.connection();
        cmd.query_async(&mut conn).await
    }
}

/// One bucket's entries to import: (field, expiry code) pairs, fields distinct.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketWrite {
    pub bucket: u32,
    pub pairs: Vec<(i64, i64)>,
}

/// What `write_buckets` did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BucketWriteOutcome {
    /// Buckets created whole with `RESTORE` (they did not exist).
    pub restored: u64,
    /// Buckets written with `HSET` (they existed, or `RESTORE` is off).
    pub hset: u64,
    /// Entries written.
    pub entries: u64,
    /// Entries that created a field (every entry of a restored bucket; what `HSET` says).
    pub created: u64,
}

/// Why a bulk operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BulkError {
    #[error("{what}: {source}")]
    Redis {
        what: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("building a RESTORE payload: {0}")]
    Payload(#[from] DumpError),
    #[error("the restored probe bucket differs from its HSET twin: {0}")]
    ProbeDiffers(String),
    /// A reply of a shape the command never gives (a proxy in the way, a changed script).
    #[error("unexpected reply: {0}")]
    Reply(String),
}

fn redis_err(what: impl Into<String>) -> impl FnOnce(redis::RedisError) -> BulkError {
    let what = what.into();
    move |source| BulkError::Redis { what, source }
}

/// An `HSET` reply: the fields it created (0 for anything else).
fn new_fields(v: &redis::Value) -> u64 {
    redis::from_redis_value_ref::<u64>(v).unwrap_or(0)
}

fn hset(key: &str, pairs: &[(i64, i64)]) -> Keyed {
    let mut cmd = redis::cmd("HSET");
    cmd.arg(key);
    for (f, v) in pairs {
        cmd.arg(f).arg(v);
    }
    (key.as_bytes().to_vec(), cmd)
}

impl RedisStore {
    /// Adds prefix lengths to their scopes' registries (`SADD`), so that a range is
    /// registered before any of its entries is written. Idempotent.
    pub async fn register_prefix_lengths(
        &self,
        prefixes: &[(Scope, PrefixLen)],
    ) -> RedisResult<()> {
        let cmds = prefixes
            .iter()
            .map(|(Scope { list, sandbox }, len)| {
                let key = self.layout().registry_key(list, sandbox);
                let mut c = redis::cmd("SADD");
                c.arg(&key).arg(len.member());
                (key.into_bytes(), c)
            })
            .collect();
        self.connection().run_all(cmds).await.map(drop)
    }

    /// Writes one batch of buckets: with `format`, a bucket that does not exist is built
    /// whole and `RESTORE`d (a compact listpack in one command); every other bucket (or
    /// every one, without `format`) gets its fields with `HSET`. A bucket created by someone
    /// else between the check and the `RESTORE` (`BUSYKEY`) gets `HSET` too: nothing is lost.
    /// On a cluster the batch is split by slot and sent concurrently.
    pub async fn write_buckets(
        &self,
        format: Option<DumpFormat>,
        batch: &[BucketWrite],
    ) -> Result<BucketWriteOutcome, BulkError> {
        let conn = self.connection();
        let mut outcome = BucketWriteOutcome::default();
        let keys: Vec<String> = batch
            .iter()
            .map(|b| self.layout().bucket_key(b.bucket))
            .collect();
        let exists: Vec<bool> = match format {
            Some(_) => {
                let cmds = keys
                    .iter()
                    .map(|k| {
                        let mut c = redis::cmd("EXISTS");
                        c.arg(k);
                        (k.as_bytes().to_vec(), c)
                    })
                    .collect();
                conn.run_all(cmds)
                    .await
                    .map_err(redis_err("EXISTS"))?
                    .iter()
                    .map(|v| {
                        redis::from_redis_value_ref::<bool>(v)
                            .map_err(|e| redis_err("EXISTS reply")(e.into()))
                    })
                    .collect::<Result<_, _>>()?
            }
            None => vec![true; batch.len()],
        };
        let mut cmds = Vec::with_capacity(batch.len());
        let mut is_restore = Vec::with_capacity(batch.len());
        for (i, b) in batch.iter().enumerate() {
            outcome.entries += b.pairs.len() as u64;
            match format {
                Some(f) if !exists[i] => {
                    let mut c = redis::cmd("RESTORE");
                    c.arg(&keys[i]).arg(0).arg(f.hash_payload(&b.pairs)?);
                    cmds.push((keys[i].as_bytes().to_vec(), c));
                    is_restore.push(true);
                }
                _ => {
                    cmds.push(hset(&keys[i], &b.pairs));
                    is_restore.push(false);
                    outcome.hset += 1;
                }
            }
        }
        let results = conn.run(cmds).await.map_err(redis_err("writing buckets"))?;
        let mut fallback = Vec::new();
        for (i, r) in results.into_iter().enumerate() {
            match r {
                Ok(_) if is_restore[i] => {
                    outcome.restored += 1;
                    outcome.created += batch[i].pairs.len() as u64;
                }
                Ok(v) => outcome.created += new_fields(&v),
                Err(e) if is_restore[i] && e.to_string().contains("BUSYKEY") => fallback.push(i),
                Err(e) => return Err(redis_err(format!("writing {}", keys[i]))(e)),
            }
        }
        if !fallback.is_empty() {
            // Created by someone else since EXISTS: add our fields to it.
            let cmds = fallback
                .iter()
                .map(|&i| hset(&keys[i], &batch[i].pairs))
                .collect();
            let replies = conn
                .run_all(cmds)
                .await
                .map_err(redis_err("HSET fallback"))?;
            outcome.created += replies.iter().map(new_fields).sum::<u64>();
            outcome.hset += fallback.len() as u64;
        }
        Ok(outcome)
    }

    /// Learns the server's `DUMP` format and proves the `RESTORE` path on probe keys of this
    /// prefix (deleted afterwards): the restored content, encoding and `MEMORY USAGE` must
    /// equal an `HSET`-built twin's. An error means: write every bucket with `HSET`.
    pub async fn prove_restore(&self) -> Result<DumpFormat, BulkError> {
        let mut conn = self.connection();
        let conn = &mut conn;
        let prefix = self.layout().prefix();
        let pid = std::process::id();
        let (a, b, c) = (
            format!("{prefix}probe:{pid}:a"),
            format!("{prefix}probe:{pid}:b"),
            format!("{prefix}probe:{pid}:c"),
        );
        let pairs: Vec<(i64, i64)> = vec![
            (-6_917_529_027_641_081_856, 217_000_000),
            (5, 0),
            (-3000, 100),
            (30_000, 5_000_000),
            (i64::MAX, 8_000_000),
        ];
        let result: Result<DumpFormat, BulkError> = async {
            let e = redis_err;
            let _: () = redis::cmd("HSET")
                .arg(&a)
                .arg(1)
                .arg(2)
                .query_async(conn)
                .await
                .map_err(e("HSET probe"))?;
            let dump: Vec<u8> = redis::cmd("DUMP")
                .arg(&a)
                .query_async(conn)
                .await
                .map_err(e("DUMP probe"))?;
            let format = DumpFormat::learn(&dump)?;
            let _: () = redis::cmd("HSET")
                .arg(&b)
                .arg(&pairs)
                .query_async(conn)
                .await
                .map_err(e("HSET twin"))?;
            let _: () = redis::cmd("RESTORE")
                .arg(&c)
                .arg(0)
                .arg(format.hash_payload(&pairs)?)
                .query_async(conn)
                .await
                .map_err(e("RESTORE probe"))?;
            let twin: Vec<(i64, i64)> = redis::cmd("HGETALL")
                .arg(&b)
                .query_async(conn)
                .await
                .map_err(e("HGETALL twin"))?;
            let ours: Vec<(i64, i64)> = redis::cmd("HGETALL")
                .arg(&c)
                .query_async(conn)
                .await
                .map_err(e("HGETALL probe"))?;
            let enc: String = redis::cmd("OBJECT")
                .arg("ENCODING")
                .arg(&c)
                .query_async(conn)
                .await
                .map_err(e("OBJECT ENCODING"))?;
            let mem = |k: &String| {
                redis::cmd("MEMORY")
                    .arg("USAGE")
                    .arg(k)
                    .arg("SAMPLES")
                    .arg(0)
                    .clone()
            };
            let twin_mem: u64 = mem(&b).query_async(conn).await.map_err(e("MEMORY USAGE"))?;
            let our_mem: u64 = mem(&c).query_async(conn).await.map_err(e("MEMORY USAGE"))?;
            if twin != ours || enc != "listpack" || twin_mem != our_mem {
                return Err(BulkError::ProbeDiffers(format!(
                    "{ours:?} {enc} {our_mem} B vs {twin:?} {twin_mem} B"
                )));
            }
            Ok(format)
        }
        .await;
        // One key per DEL: on a cluster the probes live in different slots.
        for k in [&a, &b, &c] {
            let _: Result<(), _> = redis::cmd("DEL").arg(k).query_async(conn).await;
        }
        result
    }
}

/// Escapes the `SCAN MATCH` glob characters of a literal.
pub fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// What the audit learns of one bucket key in one round trip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketProbe {
    Stats(BucketStats),
    /// Deleted (or emptied) between the `SCAN` and the probe.
    Vanished,
    /// Not a hash (the server's error): not ours.
    NotHash(String),
}

/// One bucket's size, encoding and expiry counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketStats {
    /// `MEMORY USAGE … SAMPLES 0`: exact.
    pub bytes: u64,
    /// `listpack` or `hashtable` (`?` if the server did not say).
    pub encoding: String,
    pub fields: u64,
    /// Entries expired as of the probe.
    pub expired: u64,
    /// Entries that never expire.
    pub never: u64,
    /// Values that are not integers (not what the layout writes).
    pub unreadable: u64,
}

/// The four probe commands of one bucket key (`MEMORY USAGE`, `OBJECT ENCODING`, `HLEN` and
/// the expiry count); the script call last.
fn probe_cmds(key: &str, now: i64) -> [Keyed; 4] {
    let keyed = |build: &dyn Fn(&mut redis::Cmd)| {
        let mut cmd = redis::Cmd::new();
        build(&mut cmd);
        (key.as_bytes().to_vec(), cmd)
    };
    [
        keyed(&|c| {
            c.arg("MEMORY").arg("USAGE").arg(key).arg("SAMPLES").arg(0);
        }),
        keyed(&|c| {
            c.arg("OBJECT").arg("ENCODING").arg(key);
        }),
        keyed(&|c| {
            c.arg("HLEN").arg(key);
        }),
        count_expired(key, now),
    ]
}

/// The expiry-count script's call for `key` as of `now` (`ExpiryCode::script_now`).
fn count_expired(key: &str, now: i64) -> Keyed {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(COUNT_EXPIRED_SCRIPT.get_hash())
        .arg(1)
        .arg(key)
        .arg(now);
    (key.as_bytes().to_vec(), cmd)
}

fn int(v: &Value) -> Option<u64> {
    redis::from_redis_value_ref::<u64>(v).ok()
}

impl RedisStore {
    /// The `SCAN MATCH` pattern of bucket keys, the prefix's glob characters escaped.
    pub fn bucket_scan_pattern(&self) -> String {
        format!("{}b:*", glob_escape(self.layout().prefix()))
    }

    /// The `SCAN MATCH` pattern of the sweep, the prefix's glob characters escaped:
    /// `<prefix>[be][:{]*`, the buckets of entries (`b:`) and of event ids (`e{`) in one walk
    /// (plus `b{…` and `e:…`, which no layout writes: skipped like any foreign key).
    pub fn sweep_scan_pattern(&self) -> String {
        format!("{}[be][:{{]*", glob_escape(self.layout().prefix()))
    }

    /// One `SCAN` step for keys shaped like bucket keys on `target`, raw (the audit reports
    /// the ones that are not buckets of this keyspace; `Layout::bucket_number` tells them).
    pub async fn scan_bucket_keys(
        &self,
        target: &ScanTarget,
        cursor: u64,
        count: u32,
    ) -> RedisResult<(u64, Vec<Vec<u8>>)> {
        self.connection()
            .scan(target, cursor, &self.bucket_scan_pattern(), count)
            .await
    }

    /// `INFO <section>` of one node as (name, value) pairs; empty if refused.
    pub async fn node_info(&self, target: &ScanTarget, section: &str) -> BTreeMap<String, String> {
        let text: String = match self
            .connection()
            .on_target(target, redis::cmd("INFO").arg(section))
            .await
        {
            Ok(t) => t,
            Err(_) => return BTreeMap::new(),
        };
        text.lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect()
    }

    /// One node's `hash-max-listpack-entries` (or the pre-7 `hash-max-ziplist-entries`):
    /// the fill past which a bucket stops being a listpack; `None` if refused.
    pub async fn listpack_limit(&self, target: &ScanTarget) -> Option<u64> {
        let conn = self.connection();
        for name in ["hash-max-listpack-entries", "hash-max-ziplist-entries"] {
            let reply: RedisResult<Vec<String>> = conn
                .on_target(target, redis::cmd("CONFIG").arg("GET").arg(name))
                .await;
            if let Some(limit) = reply
                .ok()
                .and_then(|v| v.get(1).and_then(|s| s.parse().ok()))
            {
                return Some(limit);
            }
        }
        None
    }

    /// Loads the expiry-count script on the node, or on every primary of a cluster (the nodes
    /// its calls go to), one by one.
    pub async fn load_count_expired(&self) -> RedisResult<()> {
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(COUNT_EXPIRED_LUA.as_str());
        self.connection()
            .on_every_primary::<String>(&load)
            .await
            .map(drop)
    }

    /// Probes bucket keys in one round trip (one pipeline on a node, per-slot pipelines on a
    /// cluster): size, encoding, fill and expiry counts as of now; one answer per key, in
    /// order. Read-only. After a `NOSCRIPT` (a restarted node, a failover, a `SCRIPT FLUSH`)
    /// the script is loaded again and only the calls that failed are sent again.
    pub async fn bucket_stats(&self, keys: &[&str]) -> Result<Vec<BucketProbe>, BulkError> {
        const WHAT: &str = "probing buckets (MEMORY USAGE, OBJECT ENCODING, HLEN, EVALSHA)";
        let conn = self.connection();
        let now = ExpiryCode::script_now(now_ms());
        let cmds: Vec<Keyed> = keys.iter().flat_map(|k| probe_cmds(k, now)).collect();
        let mut replies = conn.run(cmds).await.map_err(redis_err(WHAT))?;
        if replies.len() != keys.len() * 4 {
            return Err(BulkError::Reply(format!(
                "probing buckets: {} replies to {} commands",
                replies.len(),
                keys.len() * 4
            )));
        }
        for attempt in 0.. {
            let again: Vec<usize> = (0..replies.len())
                .filter(|&i| replies[i].as_ref().is_err_and(scripts::is_noscript))
                .collect();
            if again.is_empty() {
                break;
            }
            if attempt == 2 {
                return Err(BulkError::Reply(
                    "NOSCRIPT three times in a row: is something flushing the script cache (SCRIPT FLUSH)?"
                        .to_owned(),
                ));
            }
            self.load_count_expired().await.map_err(redis_err(
                "reloading the expiry-count script (SCRIPT LOAD) after NOSCRIPT",
            ))?;
            let redo = again
                .iter()
                .map(|&i| count_expired(keys[i / 4], now))
                .collect();
            let redone = conn.run(redo).await.map_err(redis_err(WHAT))?;
            for (i, r) in again.into_iter().zip(redone) {
                replies[i] = r;
            }
        }
        let mut out = Vec::with_capacity(keys.len());
        let mut replies = replies.into_iter();
        for k in keys {
            let r: Vec<RedisResult<Value>> = replies.by_ref().take(4).collect();
            if let Some(e) = r.iter().find_map(|r| r.as_ref().err()) {
                if e.code() == Some("WRONGTYPE") {
                    out.push(BucketProbe::NotHash(e.to_string()));
                    continue;
                }
                return Err(BulkError::Reply(format!("probing {k}: {e}")));
            }
            let r: Vec<Value> = r.into_iter().map(|v| v.expect("no error")).collect();
            let (Some(bytes), Some(fields)) = (int(&r[0]), int(&r[2])) else {
                out.push(BucketProbe::Vanished);
                continue;
            };
            if fields == 0 {
                out.push(BucketProbe::Vanished);
                continue;
            }
            let encoding: String = redis::from_redis_value_ref::<Option<String>>(&r[1])
                .ok()
                .flatten()
                .unwrap_or_else(|| "?".to_owned());
            let counts: Vec<u64> = redis::from_redis_value_ref(&r[3]).map_err(|e| {
                BulkError::Reply(format!("the expiry-count script's reply for {k}: {e}"))
            })?;
            let [expired, never, unreadable] = counts[..] else {
                return Err(BulkError::Reply(format!(
                    "the expiry-count script returned {counts:?} for {k}"
                )));
            };
            out.push(BucketProbe::Stats(BucketStats {
                bytes,
                encoding,
                fields,
                expired,
                never,
                unreadable,
            }));
        }
        Ok(out)
    }
}

/// A scratch key's content (the audit's layout comparison): a plain integer or hash pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScratchValue {
    Plain(i64),
    Hash(Vec<(i64, i64)>),
}

/// Field/value pairs per scratch `HSET`.
const HSET_PAIRS: usize = 500;
/// Commands per scratch write pipeline.
const WRITE_COMMANDS: usize = 1000;

/// A command on one key (every scratch command touches exactly one key, so a cluster routes
/// each by its own slot).
fn on_key(key: &str, build: impl FnOnce(&mut redis::Cmd)) -> Keyed {
    let mut cmd = redis::Cmd::new();
    build(&mut cmd);
    (key.as_bytes().to_vec(), cmd)
}

// The audit's layout comparison: reads a sample of entries, writes them as scratch keys of
// other layouts, measures and deletes them. Keys are the caller's (its own scratch prefix).
impl RedisStore {
    /// Up to `n` (field, code) pairs from `keys` (HGETALL, a few buckets per round trip).
    pub async fn sample_entries(
        &self,
        keys: &[String],
        n: usize,
    ) -> Result<(Vec<(i64, u32)>, u64), BulkError> {
        let conn = self.connection();
        let mut pairs = Vec::with_capacity(n);
        let mut used = 0;
        for chunk in keys.chunks(20) {
            let cmds = chunk
                .iter()
                .map(|k| {
                    on_key(k, |c| {
                        c.arg("HGETALL").arg(k);
                    })
                })
                .collect();
            let replies: Vec<Value> = conn
                .run_all(cmds)
                .await
                .map_err(redis_err("reading the comparison sample (HGETALL)"))?;
            for reply in replies {
                let flat: Vec<(Value, Value)> = match reply {
                    Value::Map(m) => m,
                    Value::Array(items) => {
                        let mut it = items.into_iter();
                        std::iter::from_fn(|| Some((it.next()?, it.next()?))).collect()
                    }
                    _ => Vec::new(),
                };
                used += 1;
                for (f, v) in flat {
                    if let (Ok(f), Ok(v)) = (
                        redis::from_redis_value::<i64>(f),
                        redis::from_redis_value::<u32>(v),
                    ) {
                        pairs.push((f, v));
                    }
                }
                if pairs.len() >= n {
                    pairs.truncate(n);
                    return Ok((pairs, used));
                }
            }
        }
        Ok((pairs, used))
    }

    /// Writes the scratch keys: `SET` or multi-field `HSET`s, one key per command, about
    /// [`WRITE_COMMANDS`] commands per batch.
    pub async fn write_scratch(&self, keys: &[(String, ScratchValue)]) -> Result<(), BulkError> {
        let conn = self.connection();
        let mut cmds: Vec<Keyed> = Vec::new();
        let mut queued = 0;
        for (name, payload) in keys {
            match payload {
                ScratchValue::Plain(v) => {
                    cmds.push(on_key(name, |c| {
                        c.arg("SET").arg(name).arg(*v);
                    }));
                    queued += 1;
                }
                ScratchValue::Hash(pairs) => {
                    for chunk in pairs.chunks(HSET_PAIRS) {
                        cmds.push(on_key(name, |c| {
                            c.arg("HSET").arg(name);
                            for (f, v) in chunk {
                                c.arg(*f).arg(*v);
                            }
                        }));
                        queued += 1 + chunk.len() / 20;
                    }
                }
            }
            if queued >= WRITE_COMMANDS {
                conn.run_all(std::mem::take(&mut cmds))
                    .await
                    .map_err(redis_err("writing scratch keys"))?;
                queued = 0;
            }
        }
        if !cmds.is_empty() {
            conn.run_all(cmds)
                .await
                .map_err(redis_err("writing scratch keys"))?;
        }
        Ok(())
    }

    /// (bytes, hashtable keys) of the scratch keys.
    pub async fn measure_keys(
        &self,
        names: &[&str],
        batch: usize,
    ) -> Result<(u64, u64), BulkError> {
        let conn = self.connection();
        let (mut bytes, mut hashtables) = (0, 0);
        for chunk in names.chunks(batch.max(1)) {
            let cmds = chunk
                .iter()
                .flat_map(|k| {
                    [
                        on_key(k, |c| {
                            c.arg("MEMORY").arg("USAGE").arg(*k).arg("SAMPLES").arg(0);
                        }),
                        on_key(k, |c| {
                            c.arg("OBJECT").arg("ENCODING").arg(*k);
                        }),
                    ]
                })
                .collect();
            let replies = conn
                .run_all(cmds)
                .await
                .map_err(redis_err("measuring scratch keys"))?;
            for (k, r) in chunk.iter().zip(replies.chunks(2)) {
                let reply = |e: redis::ParsingError| BulkError::Reply(format!("{k}: {e}"));
                let size: Option<u64> = redis::from_redis_value_ref(&r[0]).map_err(reply)?;
                let encoding: Option<String> = redis::from_redis_value_ref(&r[1]).map_err(reply)?;
                let Some(size) = size else {
                    return Err(BulkError::Reply(format!(
                        "scratch key {k} vanished before it was measured (evicted?)"
                    )));
                };
                bytes += size;
                hashtables += u64::from(encoding.as_deref() == Some("hashtable"));
            }
        }
        Ok((bytes, hashtables))
    }

    /// Deletes the scratch keys (one `DEL` per key); how many are still there afterwards.
    /// Every key's `DEL` is sent even if some fail.
    pub async fn delete_keys(&self, names: &[&str]) -> Result<u64, BulkError> {
        let conn = self.connection();
        let mut failed: Option<BulkError> = None;
        for chunk in names.chunks(10_000) {
            let cmds = chunk
                .iter()
                .map(|k| {
                    on_key(k, |c| {
                        c.arg("DEL").arg(*k);
                    })
                })
                .collect();
            let replies = match conn.run(cmds).await {
                Ok(r) => r,
                Err(e) => {
                    failed.get_or_insert(redis_err("deleting scratch keys")(e));
                    continue;
                }
            };
            if let Some(Err(e)) = replies.into_iter().find(Result::is_err) {
                failed.get_or_insert(redis_err("deleting scratch keys")(e));
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        let mut left = 0;
        for chunk in names.chunks(10_000) {
            let cmds = chunk
                .iter()
                .map(|k| {
                    on_key(k, |c| {
                        c.arg("EXISTS").arg(*k);
                    })
                })
                .collect();
            let counts = conn
                .run_all(cmds)
                .await
                .map_err(redis_err("checking the scratch keys are gone"))?;
            for c in &counts {
                left += redis::from_redis_value_ref::<u64>(c)
                    .map_err(|e| BulkError::Reply(format!("EXISTS: {e}")))?;
            }
        }
        Ok(left)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::store::Hashing;

    #[test]
    fn event_buckets_parse_to_distinct_indices_below_the_count() {
        for n in [1u32, 3, 16_384, 16_385, 50_000] {
            let l = Layout::new("nl:", 1, Hashing::Unkeyed).with_velocity(2, n);
            let mut seen = HashSet::new();
            for h in (0..200_000i64).step_by(7).chain([i64::MIN, -1, i64::MAX]) {
                for slot in [None, Some(0), Some(9_999), Some(16_383)] {
                    let key = l.event_bucket_key(h, slot);
                    let e = EventBucket::parse(&l, key.as_bytes()).expect(&key);
                    assert_eq!(e.key(), key);
                    assert!(e.index() < EventBucket::count(&l), "{key} of {n}");
                    seen.insert((e.index(), key));
                }
            }
            let indices: HashSet<u64> = seen.iter().map(|(i, _)| *i).collect();
            assert_eq!(indices.len(), seen.len(), "one index per key ({n} buckets)");
        }
        let l = Layout::new("nl:", 1, Hashing::Unkeyed).with_velocity(2, 50_000);
        for foreign in ["nl:e{notatag}0", "nl:e{3560}9", "nl:b:0", "other:e{3560}0"] {
            assert_eq!(
                EventBucket::parse(&l, foreign.as_bytes()),
                None,
                "{foreign}"
            );
        }
    }
}
