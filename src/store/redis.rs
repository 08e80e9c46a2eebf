//! The Redis store: the layout of `layout` on one Redis node or a Redis Cluster (`conn`).
//!
//! One multiplexed connection (per node) carries every command, and pub/sub uses its own.
//! Reads are batches of `HGET`s: one pipeline, one round trip (on a cluster, per-slot
//! pipelines sent together). An upsert on one node is one `MULTI`/`EXEC` (registry `SADD`s
//! first, so a range is never stored before a reader would probe it; then multi-field
//! `HSET`s per bucket, the audit `XADD`s and finally the `PUBLISH`), so it is taken whole or
//! not at all. A cluster has no transaction across slots: there the same steps run in that
//! order as three batches (registries; buckets; audit and publish), and an error at any step
//! fails the write (it may be partly applied; a retry is idempotent). Deletes and lazy expiry
//! are Lua scripts, one per bucket, called by SHA (loaded at start-up and again after a
//! `NOSCRIPT`).
//!
//! No call here has its own deadline beyond the connection's response timeout: the service
//! wraps every call in the deadline that fits it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use redis::{Client, Cmd, ErrorKind, RedisError, Script, ServerErrorKind};

use super::conn::{ConnectOptions, Keyed, RedisConn};

use super::layout::{FORMAT_VERSION, MAX_MEAN_FILL};
use super::{
    AuditRecord, AuditSummary, Deadline, DefinitionKind, EntryKey, Invalidation,
    InvalidationStream, Layout, MetricAnswer, MetricFamily, MetricOp, MetricReading, PrefixLen,
    Scope, Store, StoreError, StoreResult, StoredDefinition, WriteBatch,
};
use crate::domain::{EPOCH_2020_MS, now_ms};

/// Creates the meta hash if it is missing; returns (format, buckets, created?).
const OPEN_KEYSPACE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'format', ARGV[1], 'buckets', ARGV[2], 'created_ms', ARGV[3])
  return {ARGV[1], ARGV[2], 1}
end
local m = redis.call('HMGET', KEYS[1], 'format', 'buckets')
return {m[1], m[2], 0}
";

/// Deletes fields of one bucket; per field 1 if it was present and live at ARGV[1]
/// (milliseconds since 2020), else 0.
const REMOVE: &str = r"
local now = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV do
  local v = redis.call('HGET', KEYS[1], ARGV[i])
  local live = 0
  if v then
    redis.call('HDEL', KEYS[1], ARGV[i])
    local c = tonumber(v)
    if c == 0 or c * 1000 > now then live = 1 end
  end
  out[#out + 1] = live
end
return out
";

/// Compare-and-delete: deletes the field only if it still holds ARGV[2].
const REMOVE_IF_UNCHANGED: &str = r"
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
";

/// The start of every metric script. ARGV: 1 update sub-window (or ''), 2 value, 3 read_hi,
/// 4 slots, 5 trim_hi, 6 expire_at, 7 '1' to read the value back, 8 the event's hash (or ''),
/// 9 family-specific. KEYS[1] is the entity's key, KEYS[2] its set of applied events. An
/// event already applied to this entity is not applied again (`dup` = 1): checked and recorded
/// in the same atomic call as the update, so a retry after any failure or timeout applies each
/// update exactly once.
const METRIC_PREAMBLE: &str = r"
local function extend(k, at)
  local cur = redis.call('PEXPIRETIME', k)
  if cur < 0 or cur < at then redis.call('PEXPIREAT', k, at) end
end
local n = tonumber(ARGV[4])
local floor = tonumber(ARGV[5]) - n + 1
local at = tonumber(ARGV[6])
local hi = tonumber(ARGV[3])
local lo = hi - n + 1
local read = ARGV[7] == '1'
local update = ARGV[1] ~= ''
local dup = 0
if update and ARGV[8] ~= '' then
  if redis.call('ZSCORE', KEYS[2], ARGV[8]) then
    dup = 1
    update = false
  else
    redis.call('ZADD', KEYS[2], ARGV[1], ARGV[8])
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. floor)
    extend(KEYS[2], at)
  end
end
-- Field f of a hash holds sub-window floor(f / width). Once the hash holds more fields than
-- the window needs, drops those of sub-windows that left it.
local function trim(k, width)
  if redis.call('HLEN', k) > width * n then
    for _, f in ipairs(redis.call('HKEYS', k)) do
      if math.floor(tonumber(f) / width) < floor then redis.call('HDEL', k, f) end
    end
  end
end
-- Appends to out the values (and, with fields, each value's field first) of the read window.
local function read_window(k, width, out, fields)
  local all = redis.call('HGETALL', k)
  for i = 1, #all, 2 do
    local s = math.floor(tonumber(all[i]) / width)
    if s >= lo and s <= hi then
      if fields then out[#out + 1] = all[i] end
      out[#out + 1] = all[i + 1]
    end
  end
end
";

/// COUNT and SUM: a hash of sub-window → total. Returns {dup, totals read...} (exact i64
/// strings, summed by the caller).
const METRIC_SUM: &str = r"
local k = KEYS[1]
if update then
  redis.call('HINCRBY', k, ARGV[1], ARGV[2])
  trim(k, 1)
  extend(k, at)
end
local out = {dup}
if read then read_window(k, 1, out, false) end
return out
";

/// AVG: fields 2i (sum) and 2i+1 (count). Returns {dup, field, value, ...} of the window.
const METRIC_AVG: &str = r"
local k = KEYS[1]
if update then
  local f = tonumber(ARGV[1]) * 2
  redis.call('HINCRBY', k, f, ARGV[2])
  redis.call('HINCRBY', k, f + 1, 1)
  trim(k, 2)
  extend(k, at)
end
local out = {dup}
if read then read_window(k, 2, out, true) end
return out
";

/// MIN and MAX (ARGV[9] 'min' or 'max'): a hash of sub-window → extreme. Returns {dup,
/// per-sub-window extremes read...}.
const METRIC_EXTREME: &str = r"
local k = KEYS[1]
if update then
  local cur = redis.call('HGET', k, ARGV[1])
  local v = tonumber(ARGV[2])
  if not cur or (ARGV[9] == 'min' and v < tonumber(cur)) or (ARGV[9] == 'max' and v > tonumber(cur)) then
    redis.call('HSET', k, ARGV[1], ARGV[2])
  end
  trim(k, 1)
  extend(k, at)
end
local out = {dup}
if read then read_window(k, 1, out, false) end
return out
";

/// COUNT_DISTINCT: a sorted set of member (ARGV[2]) → last sub-window seen, capped at
/// ARGV[9]. Returns {dup, count, capped}.
const METRIC_DISTINCT: &str = r"
local k = KEYS[1]
local cap = tonumber(ARGV[9])
if update then
  redis.call('ZADD', k, 'GT', ARGV[1], ARGV[2])
  redis.call('ZREMRANGEBYSCORE', k, '-inf', '(' .. floor)
  local card = redis.call('ZCARD', k)
  if card > cap then redis.call('ZPOPMIN', k, card - cap) end
  extend(k, at)
end
if not read then return {dup} end
local capped = 0
if redis.call('ZCARD', k) >= cap then capped = 1 end
return {dup, redis.call('ZCOUNT', k, lo, hi), capped}
";

/// APPROX_COUNT_DISTINCT: one HyperLogLog per sub-window. KEYS[1] the updated sub-window's,
/// KEYS[2] the applied events, then those of every sub-window read, counted with one
/// multi-key PFCOUNT (no temporary key). Returns {dup, count}.
const METRIC_APPROX: &str = r"
if update then
  redis.call('PFADD', KEYS[1], ARGV[2])
  extend(KEYS[1], at)
end
if not read or #KEYS < 3 then return {dup, 0} end
return {dup, redis.call('PFCOUNT', unpack(KEYS, 3))}
";

/// Stores a definition. KEYS[1] the definitions hash; ARGV: id, fingerprint, body, channel,
/// message. Values are `<version>\n<fingerprint>\n<body>`. Returns the version.
const PUT_DEFINITION: &str = r"
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local ver, fp = 0, ''
if cur then
  local a = string.find(cur, '\n', 1, true)
  local b = string.find(cur, '\n', a + 1, true)
  ver = tonumber(string.sub(cur, 1, a - 1))
  fp = string.sub(cur, a + 1, b - 1)
end
if fp == '' or fp ~= ARGV[2] then ver = ver + 1 end
redis.call('HSET', KEYS[1], ARGV[1], ver .. '\n' .. ARGV[2] .. '\n' .. ARGV[3])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return ver
";

/// Deletes a definition, keeping its version as a tombstone. Returns 1 if it existed.
const DELETE_DEFINITION: &str = r"
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then return 0 end
local a = string.find(cur, '\n', 1, true)
local b = string.find(cur, '\n', a + 1, true)
if b == a + 1 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], string.sub(cur, 1, a - 1) .. '\n\n')
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
";

/// How to reach Redis and which keyspace to open.
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
}

/// What opening the keyspace found, for the start-up log.
#[derive(Debug, Clone)]
pub struct OpenReport {
    pub created: bool,
    pub buckets: u32,
    /// Problems worth a loud warning that do not stop the service.
    pub warnings: Vec<String>,
}

/// The Redis store.
pub struct RedisStore {
    /// One client per configured URL, for pub/sub (tried in turn).
    pubsub_clients: Vec<Client>,
    pubsub_next: AtomicUsize,
    conn: RedisConn,
    layout: Layout,
    audit_max_len: usize,
    remove: Script,
    remove_if_unchanged: Script,
    metric_scripts: MetricScripts,
    put_definition: Script,
    delete_definition: Script,
    pubsub_timeout: Duration,
    write_replicas: u32,
    /// How long a `WAIT` for replicas may take.
    replica_wait: Duration,
}

/// The metric scripts, one per family (MIN and MAX share one).
struct MetricScripts {
    sum: Script,
    avg: Script,
    extreme: Script,
    distinct: Script,
    approx: Script,
}

impl MetricScripts {
    fn new() -> Self {
        let with_extend = |body: &str| Script::new(&format!("{METRIC_PREAMBLE}{body}"));
        Self {
            sum: with_extend(METRIC_SUM),
            avg: with_extend(METRIC_AVG),
            extreme: with_extend(METRIC_EXTREME),
            distinct: with_extend(METRIC_DISTINCT),
            approx: with_extend(METRIC_APPROX),
        }
    }

    fn all(&self) -> [&Script; 5] {
        [
            &self.sum,
            &self.avg,
            &self.extreme,
            &self.distinct,
            &self.approx,
        ]
    }
}

fn unavailable(e: RedisError) -> StoreError {
    if e.kind() == ErrorKind::Parse || e.kind() == ErrorKind::UnexpectedReturnType {
        StoreError::Corrupt(e.to_string())
    } else {
        StoreError::Unavailable(e.to_string())
    }
}

fn is_noscript(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

fn ints(v: &redis::Value) -> StoreResult<Vec<i64>> {
    redis::from_redis_value_ref::<Vec<i64>>(v)
        .map_err(|e| StoreError::Corrupt(format!("metric reply: {e}")))
}

/// Interprets a metric script's reply: `{dup, ...}`.
fn answer(op: &MetricOp, v: &redis::Value) -> StoreResult<MetricAnswer> {
    let all = ints(v)?;
    let (dup, rest) = all
        .split_first()
        .ok_or_else(|| StoreError::Corrupt("empty metric reply".into()))?;
    let duplicate = *dup == 1;
    if !op.read {
        return Ok(MetricAnswer {
            duplicate,
            reading: None,
        });
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
    Ok(MetricAnswer {
        duplicate,
        reading: Some(reading),
    })
}

/// The smallest `hash-max-listpack-entries` that keeps buckets of this mean fill listpacks:
/// five standard deviations of a Poisson fill above the mean.
pub fn min_listpack_entries(mean_fill: f64) -> u64 {
    (mean_fill + 5.0 * mean_fill.sqrt()).ceil() as u64
}

impl RedisStore {
    /// Connects, opens (or creates) the keyspace and checks the server's listpack limit.
    pub async fn open(opts: RedisOptions) -> StoreResult<(Self, OpenReport)> {
        let cluster = !opts.cluster_nodes.is_empty();
        let urls = if cluster {
            opts.cluster_nodes.clone()
        } else {
            vec![opts.url.clone()]
        };
        let (mut conn, pubsub_clients) = RedisConn::connect(&ConnectOptions {
            urls,
            cluster,
            connect_timeout: opts.connect_timeout,
            response_timeout: opts.response_timeout,
        })
        .await
        .map_err(|e| match e.kind() {
            ErrorKind::InvalidClientConfig => {
                StoreError::Unavailable(format!("invalid Redis URL: {e}"))
            }
            _ => unavailable(e),
        })?;

        let wanted = Layout::buckets_for(
            opts.expected_entries
                .unwrap_or(opts.default_expected_entries),
        );
        let layout = Layout::new(opts.prefix.clone(), wanted);
        let (format, buckets, created): (Option<String>, Option<String>, i64) =
            Script::new(OPEN_KEYSPACE)
                .key(layout.meta_key())
                .arg(FORMAT_VERSION)
                .arg(wanted)
                .arg(now_ms())
                .invoke_async(&mut conn)
                .await
                .map_err(unavailable)?;
        let meta = layout.meta_key();
        let format: u32 = format
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| StoreError::Keyspace(format!("{meta} has no readable format field")))?;
        if format != FORMAT_VERSION {
            return Err(StoreError::Keyspace(format!(
                "{meta} records layout format {format}; this build knows format {FORMAT_VERSION} only: use a matching build or another key prefix"
            )));
        }
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
        let layout = Layout::new(opts.prefix, buckets);

        let mut warnings = Vec::new();
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

        let store = Self {
            pubsub_clients,
            pubsub_next: AtomicUsize::new(0),
            conn,
            layout,
            audit_max_len: opts.audit_max_len,
            remove: Script::new(REMOVE),
            remove_if_unchanged: Script::new(REMOVE_IF_UNCHANGED),
            metric_scripts: MetricScripts::new(),
            put_definition: Script::new(PUT_DEFINITION),
            delete_definition: Script::new(DELETE_DEFINITION),
            pubsub_timeout: opts.connect_timeout,
            write_replicas: opts.write_replicas,
            replica_wait: opts.response_timeout / 2,
        };
        store.load_scripts().await?;
        Ok((
            store,
            OpenReport {
                created: created == 1,
                buckets,
                warnings,
            },
        ))
    }

    async fn load_scripts(&self) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        for s in [&self.remove, &self.remove_if_unchanged]
            .into_iter()
            .chain(self.metric_scripts.all())
        {
            s.load_async(&mut conn).await.map_err(unavailable)?;
        }
        Ok(())
    }

    /// Appends one record to the capped audit stream (for tools that write in bulk).
    pub async fn append_audit(&self, record: &AuditRecord) -> StoreResult<()> {
        self.conn
            .run_all(vec![self.xadd(record)])
            .await
            .map(drop)
            .map_err(unavailable)
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
        self.conn
            .run_writes(vec![(k.clone(), del), (k, hset)], true, 0, Duration::ZERO)
            .await
            .map(drop)
            .map_err(unavailable)
    }

    /// The command connection, for tools that run their own commands.
    pub fn connection(&self) -> RedisConn {
        self.conn.clone()
    }

    fn xadd(&self, record: &AuditRecord) -> Keyed {
        let key = self.layout.audit_key();
        let mut cmd = redis::cmd("XADD");
        cmd.arg(&key)
            .arg("MAXLEN")
            .arg("~")
            .arg(self.audit_max_len)
            .arg("*");
        for (name, value) in &record.fields {
            cmd.arg(name).arg(value);
        }
        (key.into_bytes(), cmd)
    }

    /// `PUBLISH` (keyless: on a cluster any node broadcasts it).
    fn publish_cmd(&self, message: &Invalidation) -> Keyed {
        let channel = self.layout.channel();
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(&channel).arg(message.encode());
        (channel.into_bytes(), cmd)
    }

    /// One metric op's `EVALSHA` (see `METRIC_PREAMBLE` for the arguments).
    fn metric_cmd(&self, op: &MetricOp) -> Keyed {
        let scripts = &self.metric_scripts;
        let script = match op.family {
            MetricFamily::Sum => &scripts.sum,
            MetricFamily::Avg => &scripts.avg,
            MetricFamily::Min | MetricFamily::Max => &scripts.extreme,
            MetricFamily::Distinct => &scripts.distinct,
            MetricFamily::Approx => &scripts.approx,
        };
        let mut keys = Vec::with_capacity(3);
        if op.family == MetricFamily::Approx {
            let sub = op.update.map_or(op.read_hi, |(s, _)| s);
            keys.push(Layout::metric_sub_key(&op.key, sub));
            keys.push(Layout::metric_seen_key(&op.key));
            if op.read {
                let lo = op.read_hi - op.slots + 1;
                keys.extend((lo..=op.read_hi).map(|i| Layout::metric_sub_key(&op.key, i)));
            }
        } else {
            keys.push(op.key.clone());
            keys.push(Layout::metric_seen_key(&op.key));
        }
        let (sub, value) = match op.update {
            Some((sub, v)) => (sub.to_string(), v),
            None => (String::new(), 0),
        };
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(keys.len());
        for k in &keys {
            cmd.arg(k);
        }
        cmd.arg(sub)
            .arg(value)
            .arg(op.read_hi)
            .arg(op.slots)
            .arg(op.trim_hi)
            .arg(op.expire_at().unwrap_or(0))
            .arg(if op.read { "1" } else { "" })
            .arg(op.event.map_or(String::new(), |e| e.to_string()));
        match op.family {
            MetricFamily::Min => {
                cmd.arg("min");
            }
            MetricFamily::Max => {
                cmd.arg("max");
            }
            MetricFamily::Distinct => {
                cmd.arg(op.cap);
            }
            _ => {}
        }
        (op.key.clone().into_bytes(), cmd)
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

    /// A single-key command.
    fn keyed(key: String, build: impl FnOnce(&mut Cmd, &str)) -> Keyed {
        let mut cmd = Cmd::new();
        build(&mut cmd, &key);
        (key.into_bytes(), cmd)
    }
}

#[async_trait]
impl Store for RedisStore {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    async fn ping(&self) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        let _: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn get_many(&self, keys: &[EntryKey]) -> StoreResult<Vec<Option<u32>>> {
        let cmds = keys
            .iter()
            .map(|k| {
                Self::keyed(self.layout.bucket_key(k.bucket), |c, key| {
                    c.arg("HGET").arg(key).arg(k.field);
                })
            })
            .collect();
        self.conn
            .run_all(cmds)
            .await
            .map_err(unavailable)?
            .iter()
            .map(|v| {
                redis::from_redis_value_ref::<Option<u32>>(v)
                    .map_err(|e| StoreError::Corrupt(format!("bucket value: {e}")))
            })
            .collect()
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
        let raw = self.conn.run_all(cmds).await.map_err(unavailable)?;
        raw.iter()
            .map(|v| {
                let members: Vec<String> = redis::from_redis_value_ref(v)
                    .map_err(|e| StoreError::Corrupt(format!("registry: {e}")))?;
                let mut v: Vec<PrefixLen> = members
                    .iter()
                    .filter_map(|m| PrefixLen::parse_member(m))
                    .collect();
                v.sort();
                Ok(v)
            })
            .collect()
    }

    async fn write(&self, batch: WriteBatch, _deadline: Deadline) -> StoreResult<()> {
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
        let mut by_bucket: BTreeMap<u32, Vec<(i64, u32)>> = BTreeMap::new();
        for (k, code) in &batch.entries {
            by_bucket
                .entry(k.bucket)
                .or_default()
                .push((k.field, *code));
        }
        let buckets: Vec<Keyed> = by_bucket
            .iter()
            .map(|(bucket, pairs)| {
                Self::keyed(self.layout.bucket_key(*bucket), |c, key| {
                    c.arg("HSET").arg(key);
                    for (f, v) in pairs {
                        c.arg(f).arg(v);
                    }
                })
            })
            .collect();
        let mut last: Vec<Keyed> = batch.audit.iter().map(|r| self.xadd(r)).collect();
        if !scopes.is_empty() {
            scopes.sort();
            scopes.dedup();
            last.push(self.publish_cmd(&Invalidation::Scopes(scopes)));
        }
        let keys = batch.entries.iter().map(|(k, _)| *k).collect();
        last.push(self.publish_cmd(&Invalidation::Keys(keys)));
        let (r, w) = (self.write_replicas, self.replica_wait);
        if self.conn.is_cluster() {
            // No transaction across slots: the same order, step by step.
            for step in [registries, buckets, last] {
                self.conn
                    .run_writes(step, false, r, w)
                    .await
                    .map_err(unavailable)?;
            }
            return Ok(());
        }
        let all = registries.into_iter().chain(buckets).chain(last).collect();
        self.conn
            .run_writes(all, true, r, w)
            .await
            .map(drop)
            .map_err(unavailable)
    }

    async fn remove(
        &self,
        keys: &[EntryKey],
        now_ms: i64,
        audit: Vec<AuditRecord>,
        _deadline: Deadline,
    ) -> StoreResult<Vec<bool>> {
        let calls = self.removal_calls(keys);
        let now_rel = now_ms - EPOCH_2020_MS;
        let invalidation = Invalidation::Keys(keys.to_vec());
        let mut results = self
            .conn
            .run(self.removals(keys, &calls, now_rel))
            .await
            .map_err(unavailable)?;
        if results.iter().any(|r| r.as_ref().is_err_and(is_noscript)) {
            // The script cache was flushed (a restart): load and redo what did not run.
            self.load_scripts().await?;
            let again: Vec<usize> = (0..results.len())
                .filter(|&i| results[i].as_ref().is_err_and(is_noscript))
                .collect();
            let cmds = self.removals(keys, &calls, now_rel);
            let redo: Vec<Keyed> = cmds
                .into_iter()
                .enumerate()
                .filter(|(i, _)| again.contains(i))
                .map(|(_, c)| c)
                .collect();
            for (i, r) in again
                .into_iter()
                .zip(self.conn.run(redo).await.map_err(unavailable)?)
            {
                results[i] = r;
            }
        }
        let mut removed = vec![false; keys.len()];
        for ((_, idx), result) in calls.iter().zip(results) {
            let flags: Vec<i64> = result
                .and_then(|v| Ok(redis::from_redis_value(v)?))
                .map_err(unavailable)?;
            for (&i, flag) in idx.iter().zip(flags) {
                removed[i] |= flag == 1;
            }
        }
        // Audit and tell every instance, once the deletions are done (and replicated).
        let buckets: Vec<Vec<u8>> = calls
            .iter()
            .map(|(b, _)| self.layout.bucket_key(*b).into_bytes())
            .collect();
        self.conn
            .wait_for(&buckets, self.write_replicas, self.replica_wait)
            .await
            .map_err(unavailable)?;
        let mut last: Vec<Keyed> = audit.iter().map(|r| self.xadd(r)).collect();
        last.push(self.publish_cmd(&invalidation));
        self.conn
            .run_writes(last, false, self.write_replicas, self.replica_wait)
            .await
            .map_err(unavailable)?;
        Ok(removed)
    }

    async fn remove_if_unchanged(
        &self,
        key: EntryKey,
        code: u32,
        _deadline: Deadline,
    ) -> StoreResult<bool> {
        let mut conn = self.conn.clone();
        let n: i64 = self
            .remove_if_unchanged
            .key(self.layout.bucket_key(key.bucket))
            .arg(key.field)
            .arg(code)
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(n == 1)
    }

    async fn subscribe(&self) -> StoreResult<InvalidationStream> {
        // On a cluster any node delivers every PUBLISH: subscribe to the seeds in turn, so
        // a node that is down (or was failed over) is skipped next time.
        let i = self.pubsub_next.fetch_add(1, Ordering::Relaxed) % self.pubsub_clients.len();
        let client = self.pubsub_clients[i].clone();
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
        // A half-open connection delivers nothing and never errors: ping it, and end the
        // stream when a ping goes unanswered.
        let (mut dead_tx, dead_rx) = tokio::sync::oneshot::channel::<()>();
        let timeout = self.pubsub_timeout;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tokio::select! {
                    // The subscriber dropped the stream: stop pinging.
                    _ = dead_tx.closed() => return,
                    _ = tick.tick() => {}
                }
                // In subscribed mode PING answers ["pong", ""], not +PONG.
                let ping = tokio::time::timeout(timeout, sink.ping::<redis::Value>()).await;
                if !matches!(ping, Ok(Ok(_))) {
                    let _ = dead_tx.send(());
                    return;
                }
            }
        });
        Ok(stream
            .take_until(dead_rx)
            .filter_map(|msg| async move { Invalidation::decode(msg.get_payload_bytes()) })
            .boxed())
    }

    async fn publish(&self, message: &Invalidation) -> StoreResult<()> {
        self.conn
            .run_all(vec![self.publish_cmd(message)])
            .await
            .map(drop)
            .map_err(unavailable)
    }

    async fn audit_tail(&self, count: usize) -> StoreResult<Vec<AuditRecord>> {
        let mut conn = self.conn.clone();
        let raw: Vec<(String, Vec<String>)> = redis::cmd("XREVRANGE")
            .arg(self.layout.audit_key())
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(raw
            .into_iter()
            .rev()
            .map(|(_, kv)| AuditRecord {
                fields: kv
                    .chunks(2)
                    .filter_map(|p| Some((p.first()?.clone(), p.get(1)?.clone())))
                    .collect(),
            })
            .collect())
    }

    async fn audit_summary(&self) -> StoreResult<Option<AuditSummary>> {
        let mut conn = self.conn.clone();
        let fields: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
            .arg(self.layout.audit_summary_key())
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(AuditSummary::from_fields(&fields))
    }

    async fn metric_ops(
        &self,
        ops: &[MetricOp],
        _deadline: Deadline,
    ) -> StoreResult<Vec<MetricAnswer>> {
        let mut out: Vec<Option<MetricAnswer>> = vec![None; ops.len()];
        let mut pending: Vec<usize> = (0..ops.len()).collect();
        for attempt in 0..2 {
            if pending.is_empty() {
                break;
            }
            let cmds = pending.iter().map(|&i| self.metric_cmd(&ops[i])).collect();
            let replies = self.conn.run(cmds).await.map_err(unavailable)?;
            let mut again = Vec::new();
            for (&i, reply) in pending.iter().zip(replies) {
                match reply {
                    Ok(v) => out[i] = Some(answer(&ops[i], &v)?),
                    // Only ops that did not run are retried (and each records its event).
                    Err(e) if attempt == 0 && is_noscript(&e) => again.push(i),
                    Err(e) => return Err(unavailable(e)),
                }
            }
            if !again.is_empty() {
                self.load_scripts().await?;
            }
            pending = again;
        }
        let updated: Vec<Vec<u8>> = ops
            .iter()
            .filter(|op| op.update.is_some())
            .map(|op| op.key.clone().into_bytes())
            .collect();
        self.conn
            .wait_for(&updated, self.write_replicas, self.replica_wait)
            .await
            .map_err(unavailable)?;
        out.into_iter()
            .map(|r| r.ok_or_else(|| StoreError::Unavailable("metric scripts not loaded".into())))
            .collect()
    }

    async fn definitions(&self, kind: DefinitionKind) -> StoreResult<Vec<StoredDefinition>> {
        let mut conn = self.conn.clone();
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
                return Err(StoreError::Corrupt(format!("definition {id}: {value:?}")));
            };
            if fingerprint.is_empty() {
                continue; // deleted
            }
            let version = version.parse().map_err(|_| {
                StoreError::Corrupt(format!("definition {id}: version {version:?}"))
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
        _deadline: Deadline,
    ) -> StoreResult<u64> {
        let mut conn = self.conn.clone();
        self.put_definition
            .key(self.layout.definitions_key(kind.as_str()))
            .arg(id)
            .arg(fingerprint)
            .arg(body)
            .arg(self.layout.channel())
            .arg(Invalidation::Definitions.encode())
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)
    }

    async fn delete_definition(
        &self,
        kind: DefinitionKind,
        id: &str,
        _deadline: Deadline,
    ) -> StoreResult<bool> {
        let mut conn = self.conn.clone();
        let n: i64 = self
            .delete_definition
            .key(self.layout.definitions_key(kind.as_str()))
            .arg(id)
            .arg(self.layout.channel())
            .arg(Invalidation::Definitions.encode())
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(n == 1)
    }
}
