//! `namelist-tools audit`: what the keyspace costs in Redis memory, measured bucket by bucket,
//! and what the same entries would cost in the layouts of the service this one replaces.
//!
//! The walk (this module) SCANs `<prefix>b:*` and probes every bucket (or a reservoir sample of
//! them) with one pipeline of `MEMORY USAGE key SAMPLES 0`, `OBJECT ENCODING`, `HLEN` and an
//! `EVALSHA` of a read-only script counting expired fields, `--batch` buckets per round trip.
//! [`compare`] writes a scratch sample of real entries in each layout, measures and deletes it;
//! [`render`] turns the [`AuditReport`] into the text table and the HTML page.

mod compare;
pub mod render;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::store::conn::RedisConn;
use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use redis::{Script, ServerErrorKind, Value};
use serde::Serialize;

pub use compare::{Comparison, LayoutCost};

use super::Global;
use crate::domain::{EPOCH_2020_MS, now_ms};
use crate::store::Store;
use crate::store::layout::{Layout, MAX_MEAN_FILL};
use crate::store::redis::RedisStore;

/// Counts a bucket's expired fields, fields that never expire and values that are not integers.
/// ARGV[1] = now in milliseconds since 2020-01-01Z. Read-only; O(fields).
const COUNT_EXPIRED: &str = r"
local now = tonumber(ARGV[1])
local expired, never, unreadable = 0, 0, 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do
  local c = tonumber(v)
  if c == nil then
    unreadable = unreadable + 1
  elseif c == 0 then
    never = never + 1
  elseif c * 1000 <= now then
    expired = expired + 1
  end
end
return {expired, never, unreadable}
";

/// How many problem buckets the JSON lists by name (the counts are always exact).
pub const MAX_LISTED_BUCKETS: usize = 1000;
/// Bins of the fill histogram.
pub const HISTOGRAM_BINS: u64 = 20;

/// Measure the keyspace's Redis memory: bytes per entry, bucket fill, problem buckets.
///
/// Cost: one SCAN pass over the whole keyspace (`SCAN MATCH <prefix>b:* COUNT <batch>`), then
/// per bucket `MEMORY USAGE key SAMPLES 0`, `OBJECT ENCODING`, `HLEN` and one `EVALSHA` of a
/// read-only Lua script that counts expired fields (`HVALS`: O(fill) server time, tens of µs for
/// 400 fields), pipelined `--batch` buckets per round trip, one pipeline at a time: O(buckets /
/// batch) round trips. `--sample N` still SCANs every key name (reservoir sampling of bucket
/// names: unbiased, N names in memory) but probes only N buckets. The layout comparison reads
/// `--compare-sample` real entries (default 10,000; HGETALL of the first buckets walked), writes
/// them in each layout in turn under `<prefix>audit-scratch:<pid>:` (a few MB at the default;
/// replicated like any write), measures them with `MEMORY USAGE` and deletes them, also on
/// error (if the connection is lost, delete `<prefix>audit-scratch:*` by hand).
///
/// Safe against a live store: read-only on the keyspace apart from the scratch sample. Walk a
/// big keyspace gently with `--max-buckets-per-sec` and/or a smaller `--batch`; use
/// `--compare-sample 0` where no write at all is acceptable (a replica; the comparison is
/// skipped by itself when used_memory is within 10 % of maxmemory).
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Probe N buckets picked uniformly at random (reservoir over one SCAN) instead of all.
    #[arg(long, value_name = "N")]
    pub sample: Option<u64>,
    /// Project the measured bytes per entry to this many entries (0: no projection).
    #[arg(long, value_name = "ENTRIES", default_value_t = 50_000_000_000)]
    pub project: u64,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML report with charts to FILE.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Entries measured in each seed layout for the comparison (0: no comparison, no writes).
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub compare_sample: usize,
    /// Buckets per pipeline (and the SCAN COUNT hint).
    #[arg(long, value_name = "KEYS", default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub batch: u64,
    /// Probe at most this many buckets per second (default: as fast as one pipeline at a time goes).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_buckets_per_sec: Option<u64>,
}

impl Default for Args {
    /// The command-line defaults.
    fn default() -> Self {
        Self {
            sample: None,
            project: 50_000_000_000,
            json: false,
            html: None,
            compare_sample: 10_000,
            batch: 500,
            max_buckets_per_sec: None,
        }
    }
}

/// Fill statistics over the audited buckets (fields per bucket).
#[derive(Debug, Clone, Default, Serialize)]
pub struct FillStats {
    pub min: u64,
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
    pub mean: f64,
}

/// One bin of the fill histogram: buckets with `from <= fill < to`.
#[derive(Debug, Clone, Serialize)]
pub struct FillBin {
    pub from: u64,
    pub to: u64,
    pub buckets: u64,
    /// The last bin, wider than the others: every fill from `from` up.
    pub overflow: bool,
}

/// Totals of the buckets of one encoding.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EncodingStats {
    pub buckets: u64,
    pub entries: u64,
    pub bytes: u64,
}

/// A bucket over the listpack limit or converted to a hashtable.
#[derive(Debug, Clone, Serialize)]
pub struct ProblemBucket {
    pub key: String,
    pub fields: u64,
    pub encoding: String,
    pub bytes: u64,
    pub over_limit: bool,
}

/// What `INFO memory` says about the whole server.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ServerMemory {
    pub used_memory: Option<u64>,
    pub used_memory_rss: Option<u64>,
    pub mem_fragmentation_ratio: Option<f64>,
    pub allocator_frag_ratio: Option<f64>,
    pub mem_allocator: Option<String>,
    pub maxmemory: Option<u64>,
    pub maxmemory_policy: Option<String>,
}

/// One layout projected to `--project` entries.
#[derive(Debug, Clone, Serialize)]
pub struct ProjectedLayout {
    pub layout: String,
    pub bytes: f64,
}

/// The measured bytes per entry, scaled.
#[derive(Debug, Clone, Serialize)]
pub struct Projection {
    pub entries: u64,
    pub bytes: f64,
    pub gb: f64,
    pub tb: f64,
    /// Buckets needed at the layout's mean fill.
    pub buckets: u64,
    pub mean_fill: u64,
    /// Every measured layout of the comparison, at the same entry count.
    pub layouts: Vec<ProjectedLayout>,
}

/// Everything the audit measured.
#[derive(Debug, Clone, Serialize)]
pub struct AuditReport {
    pub prefix: String,
    pub redis_version: Option<String>,
    /// When the audit started, Unix ms.
    pub started_at_ms: i64,
    pub elapsed_seconds: f64,
    /// Whether only `--sample` buckets were probed.
    pub sampled: bool,
    /// Buckets recorded in `<prefix>meta` (empty buckets do not exist as keys).
    pub keyspace_buckets: u64,
    /// Bucket keys the SCAN found.
    pub buckets_found: u64,
    /// Buckets probed (and totalled below).
    pub buckets: u64,
    /// Fields of the probed buckets (sum of HLEN).
    pub entries: u64,
    /// Sum of `MEMORY USAGE key SAMPLES 0` of the probed buckets.
    pub bytes: u64,
    pub bytes_per_entry: f64,
    /// With `--sample`: the totals scaled to every bucket found.
    pub estimated_keyspace_entries: Option<u64>,
    pub estimated_keyspace_bytes: Option<u64>,
    /// Mean length of the probed bucket key names.
    pub key_name_bytes: f64,
    pub fill: FillStats,
    pub fill_histogram: Vec<FillBin>,
    /// The exact distribution, fill → buckets (not in the JSON: the histogram summarises it).
    #[serde(skip)]
    pub fill_counts: BTreeMap<u64, u64>,
    pub encodings: BTreeMap<String, EncodingStats>,
    /// `hash-max-listpack-entries`, if `CONFIG GET` answered.
    pub listpack_limit: Option<u64>,
    pub over_limit_bucket_count: u64,
    /// Buckets with more fields than the limit (the first 1000).
    pub over_limit_buckets: Vec<ProblemBucket>,
    pub hashtable_bucket_count: u64,
    /// Buckets encoded as hashtables (the first 1000).
    pub hashtable_buckets: Vec<ProblemBucket>,
    /// Buckets over the limit, or hashtables, or both.
    pub problem_bucket_count: u64,
    /// Fields whose expiry has passed but that are still stored (lazy expiry, not yet swept).
    pub expired_entries: u64,
    pub never_expiring_entries: u64,
    /// Values that are not integers (not written by this layout).
    pub unreadable_values: u64,
    pub memory: ServerMemory,
    pub projection: Option<Projection>,
    pub comparison: Option<Comparison>,
    pub warnings: Vec<String>,
}

/// One probed bucket.
struct Probe {
    key: String,
    bytes: u64,
    encoding: String,
    fields: u64,
    expired: u64,
    never: u64,
    unreadable: u64,
}

enum Outcome {
    Probed(Probe),
    /// Deleted between the SCAN and the probe.
    Vanished,
    /// Not a hash: (key, the error).
    NotHash(String, String),
}

/// Running totals of the walk.
#[derive(Default)]
struct Totals {
    buckets: u64,
    entries: u64,
    bytes: u64,
    key_name_bytes: u64,
    fills: BTreeMap<u64, u64>,
    encodings: BTreeMap<String, EncodingStats>,
    over_limit: (u64, Vec<ProblemBucket>),
    hashtable: (u64, Vec<ProblemBucket>),
    problems: u64,
    expired: u64,
    never: u64,
    unreadable: u64,
    vanished: u64,
    not_hash: Vec<String>,
    /// The first buckets probed, until they hold `--compare-sample` fields: the comparison's source.
    compare_keys: Vec<String>,
    compare_fields: u64,
}

impl Totals {
    fn add(&mut self, p: Probe, limit: Option<u64>, compare_sample: u64) {
        self.buckets += 1;
        self.entries += p.fields;
        self.bytes += p.bytes;
        self.key_name_bytes += p.key.len() as u64;
        *self.fills.entry(p.fields).or_default() += 1;
        let enc = self.encodings.entry(p.encoding.clone()).or_default();
        enc.buckets += 1;
        enc.entries += p.fields;
        enc.bytes += p.bytes;
        self.expired += p.expired;
        self.never += p.never;
        self.unreadable += p.unreadable;
        let over_limit = limit.is_some_and(|l| p.fields > l);
        let hashtable = p.encoding == "hashtable";
        if over_limit || hashtable {
            self.problems += 1;
            let problem = ProblemBucket {
                key: p.key.clone(),
                fields: p.fields,
                encoding: p.encoding.clone(),
                bytes: p.bytes,
                over_limit,
            };
            for (flag, (count, list)) in [
                (over_limit, &mut self.over_limit),
                (hashtable, &mut self.hashtable),
            ] {
                if flag {
                    *count += 1;
                    if list.len() < MAX_LISTED_BUCKETS {
                        list.push(problem.clone());
                    }
                }
            }
        }
        if self.compare_fields < compare_sample && p.fields > 0 {
            self.compare_fields += p.fields;
            self.compare_keys.push(p.key);
        }
    }
}

/// Which bucket keys the SCAN already returned (SCAN may return a key twice).
struct Seen {
    bits: Vec<u64>,
    others: HashSet<String>,
}

impl Seen {
    fn new(buckets: u32) -> Self {
        Self {
            bits: vec![0; (buckets as usize).div_ceil(64)],
            others: HashSet::new(),
        }
    }

    /// Whether this is the first time; `n` is the bucket number parsed from `key`.
    fn first(&mut self, n: u32, key: &str) -> bool {
        let (word, bit) = (n as usize / 64, n % 64);
        match self.bits.get_mut(word) {
            Some(w) => {
                let fresh = *w & (1 << bit) == 0;
                *w |= 1 << bit;
                fresh
            }
            _ => self.others.insert(key.to_owned()),
        }
    }
}

/// The bucket number of a key under `<prefix>b:`, if it is one this layout writes.
fn bucket_number(layout: &Layout, key: &str) -> Option<u32> {
    let digits = key.strip_prefix(layout.prefix())?.strip_prefix("b:")?;
    let n: u32 = digits.parse().ok()?;
    (n.to_string() == digits).then_some(n)
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

/// A splitmix64 stream (sampling and scratch names; no cryptographic use).
pub(crate) struct SplitMix(pub u64);

impl SplitMix {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Nearest-rank percentile of a fill → count histogram.
fn percentile(fills: &BTreeMap<u64, u64>, total: u64, p: f64) -> u64 {
    if total == 0 {
        return 0;
    }
    let rank = ((p * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (&fill, &count) in fills {
        seen += count;
        if seen >= rank {
            return fill;
        }
    }
    fills.keys().next_back().copied().unwrap_or(0)
}

/// Up to `HISTOGRAM_BINS` equal bins from the smallest fill to a little past the 99th
/// percentile (and past the listpack limit when it is at most twice the largest fill, so the
/// chart shows the headroom), then one overflow bin for anything larger: a single runaway
/// bucket does not flatten the chart.
fn histogram(fills: &BTreeMap<u64, u64>, limit: Option<u64>) -> Vec<FillBin> {
    let (Some(&min), Some(&max)) = (fills.keys().next(), fills.keys().next_back()) else {
        return Vec::new();
    };
    let total = fills.values().sum();
    let p99 = percentile(fills, total, 0.99);
    let mut lo = min;
    let mut hi = (p99 + (p99 - min) / 4 + 1).min(max + 1);
    if let Some(l) = limit
        && l <= max.saturating_mul(2)
    {
        hi = hi.max(l + 2);
        lo = lo.min(l);
    }
    let width = (hi - lo).div_ceil(HISTOGRAM_BINS).max(1);
    let bins = (hi - lo).div_ceil(width);
    let end = lo + bins * width;
    let mut out: Vec<FillBin> = (0..bins)
        .map(|i| FillBin {
            from: lo + i * width,
            to: lo + (i + 1) * width,
            buckets: 0,
            overflow: false,
        })
        .collect();
    if max >= end {
        out.push(FillBin {
            from: end,
            to: max + 1,
            buckets: 0,
            overflow: true,
        });
    }
    for (&fill, &count) in fills {
        let i = (((fill - lo) / width) as usize).min(out.len() - 1);
        out[i].buckets += count;
    }
    out
}

fn fill_stats(t: &Totals) -> FillStats {
    FillStats {
        min: t.fills.keys().next().copied().unwrap_or(0),
        p50: percentile(&t.fills, t.buckets, 0.50),
        p99: percentile(&t.fills, t.buckets, 0.99),
        max: t.fills.keys().next_back().copied().unwrap_or(0),
        mean: t.entries as f64 / t.buckets.max(1) as f64,
    }
}

fn server_code(v: &Value) -> Option<(&str, Option<ServerErrorKind>)> {
    match v {
        Value::ServerError(e) => Some((e.code(), e.kind())),
        _ => None,
    }
}

fn int(v: &Value) -> Option<u64> {
    redis::from_redis_value_ref::<u64>(v).ok()
}

/// Probes a batch of bucket keys in one pipeline; reloads the script after a NOSCRIPT.
async fn probe_batch(
    conn: &mut RedisConn,
    script: &Script,
    keys: &[String],
) -> anyhow::Result<Vec<Outcome>> {
    for _attempt in 0..3 {
        let now = now_ms() - EPOCH_2020_MS;
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for k in keys {
            pipe.cmd("MEMORY").arg("USAGE").arg(k).arg("SAMPLES").arg(0);
            pipe.cmd("OBJECT").arg("ENCODING").arg(k);
            pipe.cmd("HLEN").arg(k);
            pipe.cmd("EVALSHA")
                .arg(script.get_hash())
                .arg(1)
                .arg(k)
                .arg(now);
        }
        let replies: Vec<Value> = pipe
            .query_async(conn)
            .await
            .context("probing buckets (MEMORY USAGE, OBJECT ENCODING, HLEN, EVALSHA)")?;
        if replies.len() != keys.len() * 4 {
            bail!(
                "probing buckets: {} replies to {} commands",
                replies.len(),
                keys.len() * 4
            );
        }
        if replies
            .iter()
            .any(|r| matches!(server_code(r), Some((_, Some(ServerErrorKind::NoScript)))))
        {
            script
                .load_async(conn)
                .await
                .context("reloading the expiry-count script (SCRIPT LOAD) after NOSCRIPT")?;
            continue;
        }
        let mut out = Vec::with_capacity(keys.len());
        for (k, r) in keys.iter().zip(replies.chunks(4)) {
            if let Some((code, _)) = r.iter().find_map(server_code) {
                let message = match r.iter().find(|v| server_code(v).is_some()) {
                    Some(Value::ServerError(e)) => e.to_string(),
                    _ => code.to_owned(),
                };
                if code == "WRONGTYPE" {
                    out.push(Outcome::NotHash(k.clone(), message));
                    continue;
                }
                bail!("probing {k}: {message}");
            }
            let (Some(bytes), Some(fields)) = (int(&r[0]), int(&r[2])) else {
                out.push(Outcome::Vanished);
                continue;
            };
            if fields == 0 {
                out.push(Outcome::Vanished);
                continue;
            }
            let encoding: String = redis::from_redis_value_ref::<Option<String>>(&r[1])
                .ok()
                .flatten()
                .unwrap_or_else(|| "?".to_owned());
            let counts: Vec<u64> = redis::from_redis_value_ref(&r[3])
                .with_context(|| format!("the expiry-count script's reply for {k}"))?;
            let [expired, never, unreadable] = counts[..] else {
                bail!("the expiry-count script returned {counts:?} for {k}");
            };
            out.push(Outcome::Probed(Probe {
                key: k.clone(),
                bytes,
                encoding,
                fields,
                expired,
                never,
                unreadable,
            }));
        }
        return Ok(out);
    }
    bail!("NOSCRIPT three times in a row: is something flushing the script cache (SCRIPT FLUSH)?")
}

/// `INFO <section>` as (name, value) pairs; empty if refused.
async fn info(conn: &mut RedisConn, section: &str) -> BTreeMap<String, String> {
    let text: String = match redis::cmd("INFO").arg(section).query_async(conn).await {
        Ok(t) => t,
        Err(_) => return BTreeMap::new(),
    };
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

fn server_memory(info: &BTreeMap<String, String>) -> ServerMemory {
    let get = |k: &str| info.get(k).cloned();
    let num = |k: &str| info.get(k).and_then(|v| v.parse::<u64>().ok());
    let ratio = |k: &str| info.get(k).and_then(|v| v.parse::<f64>().ok());
    ServerMemory {
        used_memory: num("used_memory"),
        used_memory_rss: num("used_memory_rss"),
        mem_fragmentation_ratio: ratio("mem_fragmentation_ratio"),
        allocator_frag_ratio: ratio("allocator_frag_ratio"),
        mem_allocator: get("mem_allocator"),
        maxmemory: num("maxmemory"),
        maxmemory_policy: get("maxmemory_policy"),
    }
}

/// `hash-max-listpack-entries` (or the pre-7 `hash-max-ziplist-entries`); `None` if refused.
async fn listpack_limit(conn: &mut RedisConn) -> Option<u64> {
    for name in ["hash-max-listpack-entries", "hash-max-ziplist-entries"] {
        let reply: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
            .arg("GET")
            .arg(name)
            .query_async(conn)
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

/// Sleeps as needed to keep `done` probes since `started` under `rate` per second.
async fn pace(done: u64, started: Instant, rate: Option<u64>) {
    if let Some(rate) = rate {
        let due = Duration::from_secs_f64(done as f64 / rate as f64);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
}

/// The walk's state: totals plus what the probes found that is not a bucket.
struct Walk<'a> {
    conn: RedisConn,
    script: Script,
    opts: &'a Args,
    limit: Option<u64>,
    totals: Totals,
    started: Instant,
    progress: &'a ProgressBar,
}

impl Walk<'_> {
    async fn probe(&mut self, keys: &[String]) -> anyhow::Result<()> {
        let outcomes = probe_batch(&mut self.conn, &self.script, keys).await?;
        for o in outcomes {
            match o {
                Outcome::Probed(p) => {
                    self.totals
                        .add(p, self.limit, self.opts.compare_sample as u64)
                }
                Outcome::Vanished => self.totals.vanished += 1,
                Outcome::NotHash(k, e) => {
                    if self.totals.not_hash.len() < 20 {
                        self.totals.not_hash.push(format!("{k} ({e})"));
                    }
                }
            }
        }
        self.progress.inc(keys.len() as u64);
        let done = self.progress.position();
        pace(done, self.started, self.opts.max_buckets_per_sec).await;
        Ok(())
    }
}

/// Audits the store's keyspace (see [`Args`] for what it costs).
pub async fn audit(store: &RedisStore, opts: &Args) -> anyhow::Result<AuditReport> {
    audit_with_progress(store, opts, &ProgressBar::hidden()).await
}

/// [`audit`], reporting progress on `progress` (its length is set here).
pub async fn audit_with_progress(
    store: &RedisStore,
    opts: &Args,
    progress: &ProgressBar,
) -> anyhow::Result<AuditReport> {
    let started_at_ms = now_ms();
    let started = Instant::now();
    let layout = store.layout().clone();
    let mut conn = store.connection();
    let batch = opts.batch.max(1);
    let mut warnings = Vec::new();

    let server = info(&mut conn, "server").await;
    let limit = listpack_limit(&mut conn).await;
    if limit.is_none() {
        warnings.push(
            "CONFIG GET hash-max-listpack-entries was refused: buckets over the limit cannot be \
             told (hashtable buckets are still found by their encoding)"
                .to_owned(),
        );
    }
    let script = Script::new(COUNT_EXPIRED);
    script
        .load_async(&mut conn)
        .await
        .context("loading the expiry-count script (SCRIPT LOAD)")?;

    let mut walk = Walk {
        conn: conn.clone(),
        script,
        opts,
        limit,
        totals: Totals::default(),
        started,
        progress,
    };
    let pattern = format!("{}b:*", glob_escape(layout.prefix()));
    let mut seen = Seen::new(layout.buckets());
    let mut found: u64 = 0;
    let mut foreign: (u64, Vec<String>) = (0, Vec::new());
    let mut out_of_range: u64 = 0;
    let mut pending: Vec<String> = Vec::new();
    let mut reservoir: Vec<String> = Vec::new();
    let mut rng = SplitMix(started_at_ms as u64 ^ (u64::from(std::process::id()) << 32));
    match opts.sample {
        Some(_) => {
            progress.set_length(0);
            progress.set_message("scanning bucket names");
        }
        None => {
            progress.set_length(u64::from(layout.buckets()));
            progress.set_message("probing buckets");
        }
    }

    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(batch)
            .query_async(&mut conn)
            .await
            .context("SCAN")?;
        for k in keys {
            let Some(n) = bucket_number(&layout, &k) else {
                foreign.0 += 1;
                if foreign.1.len() < 10 {
                    foreign.1.push(k);
                }
                continue;
            };
            if !seen.first(n, &k) {
                continue;
            }
            found += 1;
            if n >= layout.buckets() {
                out_of_range += 1;
            }
            match opts.sample {
                // Algorithm R: after `found` keys each is kept with probability size/found.
                Some(size) => {
                    if (reservoir.len() as u64) < size {
                        reservoir.push(k);
                    } else {
                        let j = rng.next() % found;
                        if j < size {
                            reservoir[j as usize] = k;
                        }
                    }
                }
                None => pending.push(k),
            }
        }
        while pending.len() as u64 >= batch {
            let chunk: Vec<String> = pending.drain(..batch as usize).collect();
            walk.probe(&chunk).await?;
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    if opts.sample.is_some() {
        progress.set_length(reservoir.len() as u64);
        progress.set_message("probing sampled buckets");
        pending = reservoir;
    }
    for chunk in pending.chunks(batch as usize) {
        walk.probe(chunk).await?;
    }
    progress.finish_and_clear();
    let totals = walk.totals;

    if foreign.0 > 0 {
        warnings.push(format!(
            "{} keys match {pattern} but are not bucket names (ignored), e.g. {}",
            foreign.0,
            foreign.1.join(", ")
        ));
    }
    if out_of_range > 0 {
        warnings.push(format!(
            "{out_of_range} bucket keys have a number >= the {} buckets recorded in {}: no entry \
             hashes there (left from another sizing?)",
            layout.buckets(),
            layout.meta_key()
        ));
    }
    if !totals.not_hash.is_empty() {
        warnings.push(format!(
            "bucket keys that are not hashes (skipped): {}",
            totals.not_hash.join(", ")
        ));
    }
    if totals.vanished > 0 {
        warnings.push(format!(
            "{} buckets vanished between the SCAN and the probe (emptied by deletes)",
            totals.vanished
        ));
    }
    if totals.unreadable > 0 {
        warnings.push(format!(
            "{} field values are not integer expiry codes",
            totals.unreadable
        ));
    }

    let bytes_per_entry = totals.bytes as f64 / totals.entries.max(1) as f64;
    let sampled = opts.sample.is_some();
    let scale = |v: u64| (v as f64 * found as f64 / totals.buckets.max(1) as f64).round() as u64;
    let mem_info = info(&mut conn, "memory").await;
    let memory = server_memory(&mem_info);
    if mem_info.is_empty() {
        warnings.push("INFO memory was refused".to_owned());
    }

    let comparison = if opts.compare_sample == 0 {
        None
    } else if totals.entries == 0 {
        warnings.push("no entries: nothing to compare layouts with".to_owned());
        None
    } else if let (Some(max), Some(used)) =
        (memory.maxmemory.filter(|&m| m > 0), memory.used_memory)
        && used as f64 > 0.9 * max as f64
    {
        warnings.push(format!(
            "layout comparison skipped: used_memory {used} is within 10 % of maxmemory {max}"
        ));
        None
    } else {
        progress.set_message("layout comparison");
        let mean_fill = totals.entries as f64 / totals.buckets.max(1) as f64;
        match compare::compare(
            &mut conn,
            &layout,
            &totals.compare_keys,
            opts.compare_sample,
            mean_fill,
            batch as usize,
        )
        .await
        {
            Ok(mut c) => {
                c.layouts.insert(
                    0,
                    LayoutCost {
                        layout: "ours".to_owned(),
                        label: "ours: this keyspace, audited".to_owned(),
                        keys: totals.buckets,
                        entries: totals.entries,
                        bytes: totals.bytes,
                        bytes_per_entry,
                        key_name_bytes: totals.key_name_bytes as f64 / totals.buckets.max(1) as f64,
                        hashtable_keys: totals.hashtable.0,
                        seed_reported_bytes_per_entry: None,
                    },
                );
                Some(c)
            }
            Err(e) => {
                warnings.push(format!("layout comparison failed: {e:#}"));
                None
            }
        }
    };

    let projection = (opts.project > 0 && totals.entries > 0).then(|| {
        let bytes = bytes_per_entry * opts.project as f64;
        Projection {
            entries: opts.project,
            bytes,
            gb: bytes / 1e9,
            tb: bytes / 1e12,
            buckets: opts.project.div_ceil(MAX_MEAN_FILL),
            mean_fill: MAX_MEAN_FILL,
            layouts: comparison
                .iter()
                .flat_map(|c| &c.layouts)
                .map(|l| ProjectedLayout {
                    layout: l.layout.clone(),
                    bytes: l.bytes_per_entry * opts.project as f64,
                })
                .collect(),
        }
    });

    Ok(AuditReport {
        prefix: layout.prefix().to_owned(),
        redis_version: server.get("redis_version").cloned(),
        started_at_ms,
        elapsed_seconds: started.elapsed().as_secs_f64(),
        sampled,
        keyspace_buckets: u64::from(layout.buckets()),
        buckets_found: found,
        buckets: totals.buckets,
        entries: totals.entries,
        bytes: totals.bytes,
        bytes_per_entry,
        estimated_keyspace_entries: sampled.then(|| scale(totals.entries)),
        estimated_keyspace_bytes: sampled.then(|| scale(totals.bytes)),
        key_name_bytes: totals.key_name_bytes as f64 / totals.buckets.max(1) as f64,
        fill: fill_stats(&totals),
        fill_histogram: histogram(&totals.fills, limit),
        fill_counts: totals.fills,
        encodings: totals.encodings,
        listpack_limit: limit,
        over_limit_bucket_count: totals.over_limit.0,
        over_limit_buckets: totals.over_limit.1,
        hashtable_bucket_count: totals.hashtable.0,
        hashtable_buckets: totals.hashtable.1,
        problem_bucket_count: totals.problems,
        expired_entries: totals.expired,
        never_expiring_entries: totals.never,
        unreadable_values: totals.unreadable,
        memory,
        projection,
        comparison,
        warnings,
    })
}

/// Runs the audit: the table (or `--json`) on stdout, `--html` to a file.
pub async fn run(global: &Global, args: Args) -> anyhow::Result<()> {
    let (store, _settings) = global.open().await?;
    let progress = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("{msg} {bar:30} {pos}/{len} buckets, {per_sec}, eta {eta}")
            .expect("a valid progress template"),
    );
    let report = audit_with_progress(&store, &args, &progress).await?;
    if let Some(path) = &args.html {
        std::fs::write(path, render::html(&report))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render::table(&report));
        if let Some(path) = &args.html {
            println!("HTML report: {}", path.display());
        }
    }
    for w in &report.warnings {
        eprintln!("WARNING: {w}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn defaults_match_the_command_line() {
        let parsed = Cli::parse_from(["audit"]).args;
        let d = Args::default();
        assert_eq!(parsed.project, d.project);
        assert_eq!(parsed.compare_sample, d.compare_sample);
        assert_eq!(parsed.batch, d.batch);
        assert_eq!(parsed.sample, d.sample);
        assert_eq!(parsed.max_buckets_per_sec, d.max_buckets_per_sec);
        assert!(!parsed.json && parsed.html.is_none());
    }

    #[test]
    fn bucket_names() {
        let l = Layout::new("nl:", 10);
        assert_eq!(bucket_number(&l, "nl:b:7"), Some(7));
        assert_eq!(bucket_number(&l, "nl:b:12"), Some(12));
        assert_eq!(bucket_number(&l, "nl:b:007"), None);
        assert_eq!(bucket_number(&l, "nl:b:x:b:1"), None);
        assert_eq!(bucket_number(&l, "nl:meta"), None);
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }

    #[test]
    fn seen_dedups_in_and_out_of_range() {
        let mut s = Seen::new(100);
        assert!(s.first(5, "b:5"));
        assert!(!s.first(5, "b:5"));
        assert!(s.first(99, "b:99"));
        assert!(s.first(100_000, "b:100000"));
        assert!(!s.first(100_000, "b:100000"));
    }

    #[test]
    fn percentiles_and_histogram() {
        let fills: BTreeMap<u64, u64> = [(10, 50), (20, 49), (500, 1)].into_iter().collect();
        assert_eq!(percentile(&fills, 100, 0.5), 10);
        assert_eq!(percentile(&fills, 100, 0.51), 20);
        assert_eq!(percentile(&fills, 100, 0.99), 20);
        assert_eq!(percentile(&fills, 100, 1.0), 500);
        let h = histogram(&fills, Some(512));
        assert!(h.len() as u64 <= HISTOGRAM_BINS);
        assert_eq!(h.iter().map(|b| b.buckets).sum::<u64>(), 100);
        assert_eq!(h[0].from, 10);
        assert!(
            h.last().unwrap().to > 512,
            "the chart reaches past the limit"
        );
        assert!(histogram(&BTreeMap::new(), None).is_empty());
        let one: BTreeMap<u64, u64> = [(400, 3)].into_iter().collect();
        let h = histogram(&one, Some(100_000));
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].buckets, 3);
    }
}
