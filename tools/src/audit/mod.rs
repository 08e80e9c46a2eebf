//! `namelist-tools audit`: what the keyspace costs in Redis memory, measured bucket by bucket,
//! and what the same entries would cost in the layouts of the service this one replaces.
//!
//! The walk (this module) SCANs `<prefix>b:*` on every scan target (the node, or each primary
//! of a Redis Cluster in turn: `SCAN` only sees the keys of the node it runs on) and probes
//! every bucket (or a reservoir sample of them, over all the nodes) with one batch of
//! `MEMORY USAGE key SAMPLES 0`, `OBJECT ENCODING`, `HLEN` and an `EVALSHA` of a read-only
//! script counting expired fields, `--batch` buckets per round trip (`RedisConn::run`: one
//! pipeline on a node, per-slot pipelines sent together on a cluster). `INFO` and the listpack
//! limit are read per node; the report sums them (the lowest limit) and keeps per-node lines.
//! [`compare`] writes a scratch sample of real entries in each layout, measures and deletes it;
//! [`render`] turns the [`AuditReport`] into the text table and the HTML page.

mod compare;
pub mod render;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use indicatif::ProgressBar;
use namelist::store::conn::ScanTarget;
use serde::Serialize;

pub use compare::{Comparison, LayoutCost};

use crate::Global;
use crate::pace::Pace;
use crate::progress;
use namelist::domain::now_ms;
use namelist::store::Store;
use namelist::store::bulk::BucketProbe;
use namelist::store::layout::{AuditSummary, MAX_MEAN_FILL};
use namelist::store::redis::RedisStore;

/// How many problem buckets the JSON lists by name (the counts are always exact).
pub const MAX_LISTED_BUCKETS: usize = 1000;
/// Bins of the fill histogram.
pub const HISTOGRAM_BINS: u64 = 20;
/// A bucket is *near the limit* from this percentage of `hash-max-listpack-entries` on (and
/// not over it): the next few hundred writes to it may turn it into a hashtable.
pub const NEAR_LIMIT_PERCENT: u64 = 90;

/// Measure the keyspace's Redis memory: bytes per entry, bucket fill, problem buckets.
///
/// Cost: one SCAN pass over the whole keyspace (`SCAN MATCH <prefix>b:* COUNT <batch>`), then
/// per bucket `MEMORY USAGE key SAMPLES 0`, `OBJECT ENCODING`, `HLEN` and one `EVALSHA` of a
/// read-only Lua script that counts expired fields (`HVALS`: O(fill) server time, tens of µs for
/// 200 fields), pipelined `--batch` buckets per round trip, one pipeline at a time: O(buckets /
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
///
/// On a Redis Cluster (`--cluster-nodes`): every primary is SCANned in turn (the sample is
/// drawn over all of them), probes go by key, and `INFO memory` and the listpack limit are
/// read on each primary: the report sums the memory, takes the lowest limit (a bucket is over
/// the limit of its own node) and adds one line per primary.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Probe N buckets picked uniformly at random (reservoir over one SCAN of every node) instead of all.
    #[arg(long, value_name = "N")]
    pub sample: Option<u64>,
    /// Project the measured bytes per entry to this many entries (0: no projection).
    #[arg(long, value_name = "ENTRIES", default_value_t = 50_000_000_000)]
    pub project: u64,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Do not leave the summary in `<prefix>audit:last` (the service's audit gauges); with
    /// `--compare-sample 0` the audit then writes nothing at all.
    #[arg(long)]
    pub no_summary: bool,
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
            no_summary: false,
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

/// One node's share of the keyspace: the only node, or one primary of a cluster.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NodeReport {
    /// `host:port` of a cluster primary; `the node` for a single node.
    pub node: String,
    pub redis_version: Option<String>,
    /// This node's `hash-max-listpack-entries`, if `CONFIG GET` answered.
    pub listpack_limit: Option<u64>,
    /// Bucket keys the SCAN of this node found.
    pub buckets_found: u64,
    /// Buckets of this node probed (and totalled below).
    pub buckets: u64,
    pub entries: u64,
    /// Sum of `MEMORY USAGE key SAMPLES 0` of this node's probed buckets.
    pub bytes: u64,
    /// Buckets over this node's limit.
    pub over_limit_bucket_count: u64,
    pub hashtable_bucket_count: u64,
    /// This node's `INFO memory`.
    pub memory: ServerMemory,
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
    /// The nodes' version (every distinct one, comma-separated, if they differ).
    pub redis_version: Option<String>,
    /// Whether the store is a Redis Cluster (then `nodes` has one line per primary).
    pub cluster: bool,
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
    /// `hash-max-listpack-entries`, if `CONFIG GET` answered (on a cluster: the lowest over
    /// the primaries that answered).
    pub listpack_limit: Option<u64>,
    /// Buckets at [`NEAR_LIMIT_PERCENT`] of the limit or more, but not over it.
    pub near_limit_bucket_count: u64,
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
    /// `INFO memory`; on a cluster summed over the primaries (see [`combined_memory`]).
    pub memory: ServerMemory,
    /// Per node: the only node, or every primary of the cluster.
    pub nodes: Vec<NodeReport>,
    pub projection: Option<Projection>,
    pub comparison: Option<Comparison>,
    pub warnings: Vec<String>,
}

/// One probed bucket.
struct Probe {
    /// Index of the scan target the key was found on.
    node: usize,
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

/// Running totals of one node.
#[derive(Default, Clone)]
struct NodeTotals {
    buckets: u64,
    entries: u64,
    bytes: u64,
    over_limit: u64,
    hashtable: u64,
}

/// Running totals of the walk.
#[derive(Default)]
struct Totals {
    /// Per scan target, in the order of `scan_targets`.
    nodes: Vec<NodeTotals>,
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
    /// `limit` is the listpack limit of the bucket's own node.
    fn add(&mut self, p: Probe, limit: Option<u64>, compare_sample: u64) {
        if self.nodes.len() <= p.node {
            self.nodes.resize(p.node + 1, NodeTotals::default());
        }
        let node = &mut self.nodes[p.node];
        node.buckets += 1;
        node.entries += p.fields;
        node.bytes += p.bytes;
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
        node.over_limit += u64::from(over_limit);
        node.hashtable += u64::from(hashtable);
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

/// Buckets from [`NEAR_LIMIT_PERCENT`] of the limit up to the limit (none when it is unknown).
fn near_limit(fills: &BTreeMap<u64, u64>, limit: Option<u64>) -> u64 {
    limit.map_or(0, |l| {
        fills
            .range((l * NEAR_LIMIT_PERCENT).div_ceil(100)..=l)
            .map(|(_, n)| n)
            .sum()
    })
}

impl AuditReport {
    /// The summary the service exports as gauges; with `--sample`, bucket counts are scaled
    /// to every bucket found.
    pub fn summary(&self) -> AuditSummary {
        let scale = |n: u64| {
            if self.sampled && self.buckets > 0 {
                (n as f64 * self.buckets_found as f64 / self.buckets as f64).round() as u64
            } else {
                n
            }
        };
        AuditSummary {
            at_ms: self.started_at_ms,
            sampled: self.sampled,
            buckets: self.buckets_found,
            entries: scale(self.entries),
            bytes_per_entry: self.bytes_per_entry,
            listpack_limit: self.listpack_limit,
            near_limit: scale(self.near_limit_bucket_count),
            over_limit: scale(self.over_limit_bucket_count),
            hashtable: scale(self.hashtable_bucket_count),
            expired: scale(self.expired_entries),
        }
    }
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

/// Probes a batch of bucket keys (node index, key) in one round trip (`RedisStore::bucket_stats`).
async fn probe_batch(store: &RedisStore, keys: &[(usize, String)]) -> anyhow::Result<Vec<Outcome>> {
    let names: Vec<&str> = keys.iter().map(|(_, k)| k.as_str()).collect();
    let probes = store.bucket_stats(&names).await?;
    Ok(keys
        .iter()
        .zip(probes)
        .map(|((node, k), p)| match p {
            BucketProbe::Stats(st) => Outcome::Probed(Probe {
                node: *node,
                key: k.clone(),
                bytes: st.bytes,
                encoding: st.encoding,
                fields: st.fields,
                expired: st.expired,
                never: st.never,
                unreadable: st.unreadable,
            }),
            BucketProbe::Vanished => Outcome::Vanished,
            BucketProbe::NotHash(e) => Outcome::NotHash(k.clone(), e),
        })
        .collect())
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

/// Every distinct value, comma-separated (`None` if there is none).
fn distinct(values: impl IntoIterator<Item = Option<String>>) -> Option<String> {
    let mut seen: Vec<String> = Vec::new();
    for v in values.into_iter().flatten() {
        if !seen.contains(&v) {
            seen.push(v);
        }
    }
    (!seen.is_empty()).then(|| seen.join(", "))
}

/// The memory of several nodes as one: the node itself when there is one; else used_memory,
/// used_memory_rss and maxmemory summed (each `None` unless every node answered; maxmemory 0,
/// no limit, if any node has none), the fragmentation ratio of the sums (rss / used), the
/// worst allocator fragmentation, every distinct allocator and policy.
pub fn combined_memory(nodes: &[ServerMemory]) -> ServerMemory {
    if let [one] = nodes {
        return one.clone();
    }
    let sum = |f: fn(&ServerMemory) -> Option<u64>| -> Option<u64> {
        if nodes.is_empty() {
            return None;
        }
        nodes.iter().map(f).sum()
    };
    let used = sum(|m| m.used_memory);
    let rss = sum(|m| m.used_memory_rss);
    let maxmemory = sum(|m| m.maxmemory).map(|total| {
        if nodes.iter().any(|m| m.maxmemory == Some(0)) {
            0
        } else {
            total
        }
    });
    ServerMemory {
        used_memory: used,
        used_memory_rss: rss,
        mem_fragmentation_ratio: match (rss, used) {
            (Some(r), Some(u)) if u > 0 => Some(((r as f64 / u as f64) * 100.0).round() / 100.0),
            _ => None,
        },
        allocator_frag_ratio: nodes
            .iter()
            .filter_map(|m| m.allocator_frag_ratio)
            .reduce(f64::max),
        mem_allocator: distinct(nodes.iter().map(|m| m.mem_allocator.clone())),
        maxmemory,
        maxmemory_policy: distinct(nodes.iter().map(|m| m.maxmemory_policy.clone())),
    }
}

/// The walk's state: totals plus what the probes found that is not a bucket.
struct Walk<'a> {
    store: &'a RedisStore,
    opts: &'a Args,
    /// Per scan target.
    limits: Vec<Option<u64>>,
    totals: Totals,
    /// `--max-buckets-per-sec`.
    pace: Pace,
    progress: &'a ProgressBar,
}

impl Walk<'_> {
    async fn probe(&mut self, keys: &[(usize, String)]) -> anyhow::Result<()> {
        self.pace.take(keys.len() as u64).await;
        let outcomes = probe_batch(self.store, keys).await?;
        for o in outcomes {
            match o {
                Outcome::Probed(p) => {
                    let limit = self.limits.get(p.node).copied().flatten();
                    self.totals.add(p, limit, self.opts.compare_sample as u64)
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
        Ok(())
    }
}

/// What one node says about itself before the walk.
struct NodeInfo {
    target: ScanTarget,
    redis_version: Option<String>,
    limit: Option<u64>,
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
    let cluster = store.is_cluster();
    let batch = opts.batch.max(1);
    let mut warnings = Vec::new();

    let targets = store
        .scan_targets()
        .await
        .context("listing the nodes to SCAN (CLUSTER NODES)")?;
    if targets.is_empty() {
        bail!("the cluster reports no primary serving slots: nothing to SCAN");
    }
    let mut nodes = Vec::with_capacity(targets.len());
    for t in &targets {
        let server = store.node_info(t, "server").await;
        nodes.push(NodeInfo {
            target: t.clone(),
            redis_version: server.get("redis_version").cloned(),
            limit: store.listpack_limit(t).await,
        });
    }
    let limits: Vec<Option<u64>> = nodes.iter().map(|n| n.limit).collect();
    let limit = limits.iter().flatten().copied().min();
    let refused: Vec<String> = nodes
        .iter()
        .filter(|n| n.limit.is_none())
        .map(|n| n.target.to_string())
        .collect();
    if !refused.is_empty() {
        warnings.push(format!(
            "CONFIG GET hash-max-listpack-entries was refused{}: buckets over the limit cannot be \
             told (hashtable buckets are still found by their encoding)",
            if cluster {
                format!(" by {}", refused.join(", "))
            } else {
                String::new()
            }
        ));
    }
    store
        .load_count_expired()
        .await
        .context("loading the expiry-count script (SCRIPT LOAD)")?;

    let mut walk = Walk {
        store,
        opts,
        limits,
        totals: Totals {
            nodes: vec![NodeTotals::default(); targets.len()],
            ..Totals::default()
        },
        pace: Pace::per_sec(opts.max_buckets_per_sec.unwrap_or(0)),
        progress,
    };
    let mut seen = Seen::new(layout.buckets());
    let mut found: u64 = 0;
    let mut found_on: Vec<u64> = vec![0; targets.len()];
    let mut foreign: (u64, Vec<String>) = (0, Vec::new());
    let mut out_of_range: u64 = 0;
    let mut pending: Vec<(usize, String)> = Vec::new();
    let mut reservoir: Vec<(usize, String)> = Vec::new();
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

    let count = u32::try_from(batch).unwrap_or(u32::MAX);
    for (node, target) in targets.iter().enumerate() {
        let mut cursor: u64 = 0;
        loop {
            let (next, keys) = store
                .scan_bucket_keys(target, cursor, count)
                .await
                .with_context(|| {
                    if cluster {
                        format!("SCAN on {target}")
                    } else {
                        "SCAN".to_owned()
                    }
                })?;
            for k in keys {
                let k = match String::from_utf8(k) {
                    Ok(k) => k,
                    Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
                };
                let Some(n) = layout.bucket_number(k.as_bytes()) else {
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
                found_on[node] += 1;
                if n >= layout.buckets() {
                    out_of_range += 1;
                }
                match opts.sample {
                    // Algorithm R: after `found` keys each is kept with probability size/found.
                    Some(size) => {
                        if (reservoir.len() as u64) < size {
                            reservoir.push((node, k));
                        } else {
                            let j = rng.next() % found;
                            if j < size {
                                reservoir[j as usize] = (node, k);
                            }
                        }
                    }
                    None => pending.push((node, k)),
                }
            }
            while pending.len() as u64 >= batch {
                let chunk: Vec<(usize, String)> = pending.drain(..batch as usize).collect();
                walk.probe(&chunk).await?;
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
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
            "{} keys match {} but are not bucket names (ignored), e.g. {}",
            foreign.0,
            store.bucket_scan_pattern(),
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
    let mut node_memory = Vec::with_capacity(targets.len());
    let mut no_info = Vec::new();
    for t in &targets {
        let mem_info = store.node_info(t, "memory").await;
        if mem_info.is_empty() {
            no_info.push(t.to_string());
        }
        node_memory.push(server_memory(&mem_info));
    }
    let memory = combined_memory(&node_memory);
    if !no_info.is_empty() {
        warnings.push(if cluster {
            format!("INFO memory was refused by {}", no_info.join(", "))
        } else {
            "INFO memory was refused".to_owned()
        });
    }
    // The scratch sample lands on every node: any node near its maxmemory stops it.
    let crowded: Vec<String> = targets
        .iter()
        .zip(&node_memory)
        .filter_map(|(t, m)| {
            let (max, used) = (m.maxmemory.filter(|&m| m > 0)?, m.used_memory?);
            (used as f64 > 0.9 * max as f64).then(|| {
                if cluster {
                    format!("used_memory {used} of {t} is within 10 % of its maxmemory {max}")
                } else {
                    format!("used_memory {used} is within 10 % of maxmemory {max}")
                }
            })
        })
        .collect();

    let comparison = if opts.compare_sample == 0 {
        None
    } else if totals.entries == 0 {
        warnings.push("no entries: nothing to compare layouts with".to_owned());
        None
    } else if !crowded.is_empty() {
        warnings.push(format!("layout comparison skipped: {}", crowded.join("; ")));
        None
    } else {
        progress.set_message("layout comparison");
        let mean_fill = totals.entries as f64 / totals.buckets.max(1) as f64;
        match compare::compare(
            store,
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

    let node_reports: Vec<NodeReport> = nodes
        .iter()
        .zip(node_memory)
        .zip(&totals.nodes)
        .zip(&found_on)
        .map(|(((n, memory), t), &found)| NodeReport {
            node: n.target.to_string(),
            redis_version: n.redis_version.clone(),
            listpack_limit: n.limit,
            buckets_found: found,
            buckets: t.buckets,
            entries: t.entries,
            bytes: t.bytes,
            over_limit_bucket_count: t.over_limit,
            hashtable_bucket_count: t.hashtable,
            memory,
        })
        .collect();

    let near_limit_bucket_count = near_limit(&totals.fills, limit);
    Ok(AuditReport {
        prefix: layout.prefix().to_owned(),
        redis_version: distinct(nodes.iter().map(|n| n.redis_version.clone())),
        cluster,
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
        near_limit_bucket_count,
        over_limit_bucket_count: totals.over_limit.0,
        over_limit_buckets: totals.over_limit.1,
        hashtable_bucket_count: totals.hashtable.0,
        hashtable_buckets: totals.hashtable.1,
        problem_bucket_count: totals.problems,
        expired_entries: totals.expired,
        never_expiring_entries: totals.never,
        unreadable_values: totals.unreadable,
        memory,
        nodes: node_reports,
        projection,
        comparison,
        warnings,
    })
}

/// Runs the audit: the table (or `--json`) on stdout, `--html` to a file.
pub async fn run(global: &Global, args: Args) -> anyhow::Result<()> {
    let (store, _settings) = global.open().await?;
    let progress = progress::bar(
        false,
        None,
        "{msg} {bar:30} {pos}/{len} buckets, {per_sec}, eta {eta}",
    );
    let report = audit_with_progress(&store, &args, &progress).await?;
    if !args.no_summary {
        store
            .put_audit_summary(&report.summary())
            .await
            .context("writing the summary to <prefix>audit:last (--no-summary skips it)")?;
    }
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
    fn glob_escaping() {
        assert_eq!(
            namelist::store::bulk::glob_escape("a*b?[c]\\"),
            "a\\*b\\?\\[c\\]\\\\"
        );
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
    fn memory_of_several_nodes() {
        let node = |used, rss, max, frag| ServerMemory {
            used_memory: Some(used),
            used_memory_rss: Some(rss),
            mem_fragmentation_ratio: Some(rss as f64 / used as f64),
            allocator_frag_ratio: Some(frag),
            mem_allocator: Some("jemalloc-5.3.0".to_owned()),
            maxmemory: Some(max),
            maxmemory_policy: Some("noeviction".to_owned()),
        };
        let one = node(100, 200, 0, 1.1);
        let same = combined_memory(std::slice::from_ref(&one));
        assert_eq!(same.used_memory, Some(100));
        assert_eq!(same.mem_fragmentation_ratio, Some(2.0));
        let both = combined_memory(&[node(100, 200, 1000, 1.1), node(300, 300, 3000, 1.3)]);
        assert_eq!(both.used_memory, Some(400));
        assert_eq!(both.used_memory_rss, Some(500));
        assert_eq!(both.mem_fragmentation_ratio, Some(1.25));
        assert_eq!(both.allocator_frag_ratio, Some(1.3), "the worst node");
        assert_eq!(both.maxmemory, Some(4000));
        assert_eq!(both.mem_allocator.as_deref(), Some("jemalloc-5.3.0"));
        let unlimited = combined_memory(&[node(100, 200, 1000, 1.1), node(300, 300, 0, 1.3)]);
        assert_eq!(unlimited.maxmemory, Some(0), "one node without a limit");
        let refused = combined_memory(&[node(100, 200, 1000, 1.1), ServerMemory::default()]);
        assert_eq!(refused.used_memory, None, "a node did not answer");
        assert_eq!(
            distinct([
                Some("a".to_owned()),
                None,
                Some("b".to_owned()),
                Some("a".to_owned())
            ]),
            Some("a, b".to_owned())
        );
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
