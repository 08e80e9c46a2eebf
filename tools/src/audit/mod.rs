//! `namelist-tools audit`: what the keyspace costs in Redis memory, measured bucket by bucket,
//! and what the same entries would cost in the layouts of the service this one replaces.
//!
//! An audit reads, in this order ([`audit_with_progress`]): every node's version and
//! `hash-max-listpack-entries` (the node, or each primary of a Redis Cluster); the walk
//! (`walk.rs`), which SCANs `<prefix>b:*` on every node and probes every bucket (or a
//! reservoir sample of them, over all the nodes) with one batch of `MEMORY USAGE key SAMPLES
//! 0`, `OBJECT ENCODING`, `HLEN` and an `EVALSHA` of a read-only script counting expired
//! fields, `--batch` buckets per round trip (`RedisConn::run`: one pipeline on a node, per-slot
//! pipelines sent together on a cluster); every node's `INFO memory`; then the layout
//! comparison (`compare.rs`), which writes a scratch sample of real entries in each layout,
//! measures and deletes it. The report sums the nodes (the lowest limit; the arithmetic is
//! `stats.rs`) and keeps per-node lines; [`render`] turns it into the text table and the HTML
//! page.

mod compare;
pub mod render;
mod stats;
mod walk;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use indicatif::ProgressBar;
use namelist::domain::now_ms;
use namelist::store::layout::{AuditSummary, MAX_MEAN_FILL};
use namelist::store::redis::RedisStore;
use namelist::store::redis::conn::ScanTarget;
use namelist::store::{Layout, StoreBase};
use serde::Serialize;

pub use compare::{Comparison, LayoutCost};
pub use stats::combined_memory;

use crate::Global;
use crate::progress;
use walk::{Totals, Walked};

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
            fill_histogram: self
                .fill_histogram
                .iter()
                .map(|b| (b.from, b.to, scale(b.buckets)))
                .collect(),
        }
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

/// [`audit`], reporting progress on `progress` (its length is set here): the nodes, the walk,
/// the servers' memory, the layout comparison, then the report.
pub async fn audit_with_progress(
    store: &RedisStore,
    opts: &Args,
    progress: &ProgressBar,
) -> anyhow::Result<AuditReport> {
    let started_at_ms = now_ms();
    let started = Instant::now();
    let layout = store.layout().clone();
    let mut warnings = Vec::new();
    let nodes = read_nodes(store, &mut warnings).await?;
    store
        .load_count_expired()
        .await
        .context("loading the expiry-count script (SCRIPT LOAD)")?;
    let targets: Vec<ScanTarget> = nodes.iter().map(|n| n.target.clone()).collect();
    let limits = nodes.iter().map(|n| n.limit).collect();
    let seed = started_at_ms as u64 ^ (u64::from(std::process::id()) << 32);
    let walked = walk::walk(store, &layout, opts, &targets, limits, seed, progress).await?;
    warnings.extend(walked.warnings(store, &layout));
    let node_memory = read_memory(store, &targets, &mut warnings).await;
    let comparison = compare_layouts(
        store,
        &layout,
        opts,
        &walked.totals,
        &targets,
        &node_memory,
        &mut warnings,
        progress,
    )
    .await;
    Ok(Measured {
        started_at_ms,
        started,
        layout,
        cluster: store.is_cluster(),
        nodes,
        walked,
        node_memory,
        comparison,
        warnings,
    }
    .report(opts))
}

/// Every scan target with its version and listpack limit; a warning when a limit is refused.
async fn read_nodes(
    store: &RedisStore,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Vec<NodeInfo>> {
    let targets = store
        .scan_targets()
        .await
        .context("listing the nodes to SCAN (CLUSTER NODES)")?;
    if targets.is_empty() {
        bail!("the cluster reports no primary serving slots: nothing to SCAN");
    }
    let mut nodes = Vec::with_capacity(targets.len());
    for t in targets {
        let server = store.node_info(&t, "server").await;
        nodes.push(NodeInfo {
            redis_version: server.get("redis_version").cloned(),
            limit: store.listpack_limit(&t).await,
            target: t,
        });
    }
    let refused: Vec<String> = nodes
        .iter()
        .filter(|n| n.limit.is_none())
        .map(|n| n.target.to_string())
        .collect();
    if !refused.is_empty() {
        warnings.push(format!(
            "CONFIG GET hash-max-listpack-entries was refused{}: buckets over the limit cannot be \
             told (hashtable buckets are still found by their encoding)",
            if store.is_cluster() {
                format!(" by {}", refused.join(", "))
            } else {
                String::new()
            }
        ));
    }
    Ok(nodes)
}

/// `INFO memory` of every target (empty figures, and a warning, where it is refused).
async fn read_memory(
    store: &RedisStore,
    targets: &[ScanTarget],
    warnings: &mut Vec<String>,
) -> Vec<ServerMemory> {
    let mut node_memory = Vec::with_capacity(targets.len());
    let mut no_info = Vec::new();
    for t in targets {
        let mem_info = store.node_info(t, "memory").await;
        if mem_info.is_empty() {
            no_info.push(t.to_string());
        }
        node_memory.push(stats::server_memory(&mem_info));
    }
    if !no_info.is_empty() {
        warnings.push(if store.is_cluster() {
            format!("INFO memory was refused by {}", no_info.join(", "))
        } else {
            "INFO memory was refused".to_owned()
        });
    }
    node_memory
}

/// The layout comparison (`compare`), with this keyspace's own figures as its first row; `None`
/// (with a warning saying why, when it is not simply off) when it is off, there is nothing to
/// compare, a node is near its maxmemory, or it failed.
#[allow(clippy::too_many_arguments)]
async fn compare_layouts(
    store: &RedisStore,
    layout: &Layout,
    opts: &Args,
    totals: &Totals,
    targets: &[ScanTarget],
    node_memory: &[ServerMemory],
    warnings: &mut Vec<String>,
    progress: &ProgressBar,
) -> Option<Comparison> {
    if opts.compare_sample == 0 {
        return None;
    }
    if totals.entries == 0 {
        warnings.push("no entries: nothing to compare layouts with".to_owned());
        return None;
    }
    // The scratch sample lands on every node: any node near its maxmemory stops it.
    let crowded: Vec<String> = targets
        .iter()
        .zip(node_memory)
        .filter_map(|(t, m)| {
            let (max, used) = (m.maxmemory.filter(|&m| m > 0)?, m.used_memory?);
            (used as f64 > 0.9 * max as f64).then(|| {
                if store.is_cluster() {
                    format!("used_memory {used} of {t} is within 10 % of its maxmemory {max}")
                } else {
                    format!("used_memory {used} is within 10 % of maxmemory {max}")
                }
            })
        })
        .collect();
    if !crowded.is_empty() {
        warnings.push(format!("layout comparison skipped: {}", crowded.join("; ")));
        return None;
    }
    progress.set_message("layout comparison");
    let mean_fill = totals.entries as f64 / totals.buckets.max(1) as f64;
    let batch = opts.batch.max(1) as usize;
    match compare::compare(
        store,
        layout,
        &totals.compare_keys,
        opts.compare_sample,
        mean_fill,
        batch,
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
                    bytes_per_entry: totals.bytes as f64 / totals.entries.max(1) as f64,
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
}

/// Everything the audit read, before it is summed up into an [`AuditReport`].
struct Measured {
    started_at_ms: i64,
    started: Instant,
    layout: Layout,
    cluster: bool,
    nodes: Vec<NodeInfo>,
    walked: Walked,
    node_memory: Vec<ServerMemory>,
    comparison: Option<Comparison>,
    warnings: Vec<String>,
}

impl Measured {
    /// The report: totals, the per-node lines, the projection to `--project` entries.
    fn report(self, opts: &Args) -> AuditReport {
        let Measured {
            started_at_ms,
            started,
            layout,
            cluster,
            nodes,
            walked,
            node_memory,
            comparison,
            warnings,
        } = self;
        let Walked {
            totals,
            found,
            found_on,
            ..
        } = walked;
        let limit = nodes.iter().filter_map(|n| n.limit).min();
        let bytes_per_entry = totals.bytes as f64 / totals.entries.max(1) as f64;
        let sampled = opts.sample.is_some();
        let scale =
            |v: u64| (v as f64 * found as f64 / totals.buckets.max(1) as f64).round() as u64;
        let memory = stats::combined_memory(&node_memory);
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

        let near_limit_bucket_count = stats::near_limit(&totals.fills, limit);
        AuditReport {
            prefix: layout.prefix().to_owned(),
            redis_version: stats::distinct(nodes.iter().map(|n| n.redis_version.clone())),
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
            fill: stats::fill_stats(&totals),
            fill_histogram: stats::histogram(&totals.fills, limit),
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
        }
    }
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
        crate::out(serde_json::to_string_pretty(&report)?)?;
    } else {
        crate::out(render::table(&report).trim_end_matches('\n'))?;
        if let Some(path) = &args.html {
            crate::out(format_args!("HTML report: {}", path.display()))?;
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
            namelist::store::redis::bulk::glob_escape("a*b?[c]\\"),
            "a\\*b\\?\\[c\\]\\\\"
        );
    }
}
