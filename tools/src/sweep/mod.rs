//! `namelist-tools sweep`: deletes expired entries and expired remembered event ids from the
//! Redis keyspace.
//!
//! The service already treats an expired entry as absent and deletes the ones reads find
//! (lazy expiry); the sweep reclaims the memory of those nobody reads. Likewise a remembered
//! event id whose code has passed counts as absent, and a bucket of event ids drops its
//! expired ones only as it is written (past 1.28× the ids it is sized for); the sweep reclaims
//! those of the buckets nobody writes. It changes no answer, so, like lazy expiry, it writes no audit record and
//! publishes no invalidation.
//!
//! # What
//! Two kinds of hash, swept alike: the buckets of entries, `<prefix>b:<n>`, and the buckets
//! of remembered event ids, `<prefix>e{<tag>}<b>` (`store::layout`, *Event ids*). Both have
//! signed decimal i64 fields and expiry codes as values (`0` = never), so one per-bucket
//! sweep serves both; the report counts them apart (`buckets_scanned`, `fields_reclaimed`
//! … for entries; `event_buckets_scanned`, `event_ids_deleted` … for event ids).
//!
//! # How
//! `SCAN <cursor> MATCH <prefix>[be][:{]* COUNT <n>` walks the keyspace once for both kinds
//! (never `KEYS`); on a Redis Cluster, where `SCAN` sees only the node it runs on, every
//! primary is walked in turn, in address order (`RedisConn::scan_targets`). A key is swept
//! only if it is exactly `layout.bucket_key(n)` for a bucket `n` of this keyspace, or a
//! bucket of event ids this keyspace may write (`Layout::is_event_bucket`: the right tag
//! for its slot, a bucket number in range); anything else matching (`<prefix>b:x`,
//! `<prefix>e{notatag}0`, a bucket of a keyspace whose prefix starts with ours) is skipped
//! and counted. For each bucket: `HSCAN <key> <c> COUNT 1000` until the cursor is back to 0
//! (a listpack bucket answers whole in one call), keeping the fields whose value is an
//! expiry code passed at the sweep's time. A field or value that is not what the layout
//! writes (a canonical decimal i64 field, a canonical decimal u32 value) is counted as
//! unparseable and left alone. If something expired: `MEMORY USAGE <key>
//! SAMPLES 0`, one compare-and-delete script call (`store::redis::scripts::COMPARE_AND_DELETE`:
//! `HDEL` a field only if it still holds the value the scan saw, so an entry or id refreshed
//! in between survives), and `MEMORY USAGE` again (a bucket emptied entirely is gone: its
//! whole size is freed). The script is loaded with `SCRIPT LOAD` at the start (on a cluster,
//! on every primary) and called by `EVALSHA`, reloaded after a `NOSCRIPT` (on a cluster the
//! client sends that `SCRIPT LOAD` to every node). Every per-bucket command names its bucket,
//! so a cluster routes it to the bucket's primary.
//!
//! # Cost and pacing
//! One command for a bucket with nothing expired, four for a bucket with expired fields, plus
//! one `SCAN` per batch; each is O(one bucket): ~200 fields, well under a millisecond. A
//! pacing limiter spaces commands at least `1 / --max-ops-per-sec` apart (no bursts).
//!
//! # Resuming
//! The position of a sweep is (node, cursor): the node is the only one, or a cluster primary
//! (the primaries before it in address order are done). After every SCAN batch the
//! checkpoint file (if any) is rewritten atomically (temporary file, then rename) with the
//! list of nodes, the position and the running totals; it is removed when the last node's
//! SCAN completes. SCAN guarantees that every key present for the whole iteration is
//! returned at least once (possibly more, which is harmless: a swept bucket has nothing left
//! to delete), however long the pause between batches, so a resumed sweep misses nothing.
//! A cursor means nothing to another server process (a restart or failover reseeds the
//! dict): the checkpoint records the `run_id` of the node the cursor belongs to, and a sweep
//! resumed on another process starts that node over at cursor 0, keeping its totals. A
//! checkpoint of another topology (other primaries: a failover, a resharding, another
//! cluster) starts the whole walk over at the first node, keeping its totals, with a warning.
//! By hand, `--cursor` takes what a stopped run printed: `CURSOR` on a single node,
//! `HOST:PORT/CURSOR` on a cluster. A checkpoint of a build that swept only `<prefix>b:*`
//! resumes too (its event-id totals start at 0; the event buckets its walk had passed wait
//! for the next sweep).
//!
//! # Report
//! Progress on stderr (a bar on a terminal, else a line every 10 s, always with the next
//! position), then a table on stderr and exactly one JSON line on stdout: the
//! [`SweepReport`]. Exit code 0 when the sweep completed or stopped at `--max-batches`,
//! non-zero on any error or when stopped by SIGTERM/SIGINT (after finishing the current
//! batch and writing the checkpoint).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use namelist::store::redis::conn::ScanTarget;
use serde::{Deserialize, Serialize};

use crate::Global;
use crate::pace::Pace;
use crate::progress;
use namelist::domain::now_ms;
use namelist::store::redis::RedisStore;
use namelist::store::redis::bulk::{Bucket, BucketScan, CasOutcome, EventBucket};
use namelist::store::{Layout, StoreBase};

mod report;
mod resume;
mod walk;

use report::Progress;
pub use report::SweepReport;
pub use resume::Position;
use resume::{Checkpoint, Visited};
use walk::Walk;

/// Default of `--max-ops-per-sec`.
pub const DEFAULT_MAX_OPS_PER_SEC: u32 = 1000;
/// Default of `--scan-count`.
pub const DEFAULT_SCAN_COUNT: u32 = 100;
/// The `COUNT` hint of every `HSCAN`.
const HSCAN_COUNT: u32 = 1000;
/// Most fields per script call: a bucket far above the mean fill (a hashtable) is deleted in
/// several calls, so no single call blocks the server for long.
const MAX_FIELDS_PER_CALL: usize = 1000;
/// Version of the checkpoint file format (2 added the nodes and the node index; a version 1
/// file, of a single node, is still read).
const CHECKPOINT_VERSION: u32 = 2;
/// How often progress is printed when stderr is not a terminal.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// Deletes expired entries and expired remembered event ids from the Redis keyspace; paced
/// and resumable, safe while live.
///
/// SCANs the keyspace once (never KEYS) for the buckets of entries and the buckets of
/// remembered event ids, HSCANs each and deletes its expired fields with a
/// compare-and-delete script: a field is deleted only if it still holds the expired
/// value the scan saw, so an entry or id refreshed meanwhile survives. Keys that only look
/// like buckets are skipped. Safe against a live store: the service already treats expired
/// entries and ids as absent, so no answer changes. The report counts entries and event ids
/// apart (fields_reclaimed, event_ids_deleted).
///
/// Cost: one Redis command per bucket with nothing expired, four per bucket with expired
/// fields (HSCAN, MEMORY USAGE, EVALSHA, MEMORY USAGE), plus one SCAN per batch; each is
/// O(one bucket), ~200 fields. With N/200 buckets for N entries, a 1,000,000-entry keyspace
/// (5,000 buckets) takes ~5 s at the default 1000 commands/s; 10,000,000 remembered event
/// ids (50,000 buckets) add ~50 s or more; 0 = unpaced.
///
/// Resumable: SCAN returns every key present for the whole run at least once (possibly
/// twice, harmlessly), so a sweep resumed at a printed position (--cursor) or from its
/// --checkpoint (--resume) misses nothing. Progress and a table go to stderr, one JSON
/// report line to stdout. Exit 0 when done or stopped at --max-batches; non-zero on an
/// error or SIGTERM (the checkpoint then holds the position to resume at). For a Kubernetes
/// CronJob: `sweep --checkpoint /state/sweep.json --resume`.
///
/// On a Redis Cluster (--cluster-nodes) every primary is SCANned in turn, in address order;
/// a position is HOST:PORT/CURSOR (that primary's SCAN cursor; the primaries before it are
/// done). A checkpoint taken on other primaries (failover, resharding) restarts the walk at
/// the first primary, with a warning.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Args {
    /// Redis commands per second at most (SCAN, HSCAN, MEMORY USAGE, EVALSHA each count
    /// as one); 0 = unpaced.
    #[arg(long, default_value_t = DEFAULT_MAX_OPS_PER_SEC)]
    pub max_ops_per_sec: u32,
    /// Start the key SCAN at this position, as printed by an earlier, interrupted run: on a
    /// single node its SCAN cursor; on a Redis Cluster HOST:PORT/CURSOR, a primary and its
    /// SCAN cursor (the primaries are walked in address order: those before it are taken as
    /// done). A bare cursor other than 0 is refused on a cluster, as is HOST:PORT/CURSOR on
    /// a single node.
    #[arg(
        long,
        conflicts_with = "resume",
        value_name = "CURSOR|HOST:PORT/CURSOR"
    )]
    pub cursor: Option<Position>,
    /// Checkpoint file, rewritten (temporary file + rename) after every SCAN batch with the
    /// nodes, the next position and the running totals; removed when the sweep completes.
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// Continue from --checkpoint: its position, totals and sweep time. Without the file, a
    /// new sweep starts, so a CronJob can always pass it.
    #[arg(long, requires = "checkpoint")]
    pub resume: bool,
    /// Count what would be reclaimed; delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Sweep as of this time (Unix ms) instead of now: delete what had expired by then
    /// (tests, cautious backfills). A time in the future needs --dry-run: it would delete
    /// live entries.
    #[arg(long)]
    pub now_ms: Option<i64>,
    /// Keys per SCAN batch (its COUNT hint).
    #[arg(long, default_value_t = DEFAULT_SCAN_COUNT)]
    pub scan_count: u32,
    /// Stop after this many SCAN batches, exit 0 and report the position to continue at:
    /// spreads one sweep over several runs.
    #[arg(long)]
    pub max_batches: Option<u64>,
}

impl Default for Args {
    /// The same as no flags on the command line.
    fn default() -> Self {
        Self {
            max_ops_per_sec: DEFAULT_MAX_OPS_PER_SEC,
            cursor: None,
            checkpoint: None,
            resume: false,
            dry_run: false,
            now_ms: None,
            scan_count: DEFAULT_SCAN_COUNT,
            max_batches: None,
        }
    }
}

/// What sweeping one bucket found and did.
#[derive(Debug, Clone, Default)]
struct BucketOutcome {
    fields_scanned: u64,
    expired_found: u64,
    unparseable: u64,
    cas: CasOutcome,
    already_gone: u64,
    bytes_before: u64,
    bytes_after: u64,
}

/// The store, the pacer and the command count of one run.
struct Sweeper<'a> {
    store: &'a RedisStore,
    pace: Pace,
    ops: u64,
}

impl Sweeper<'_> {
    /// Waits for the next command's slot and counts it.
    async fn pace(&mut self) {
        self.pace.take(1).await;
        self.ops += 1;
    }

    async fn memory_usage(&mut self, bucket: &Bucket) -> anyhow::Result<u64> {
        self.pace().await;
        self.store
            .bucket_memory(bucket)
            .await
            .context("MEMORY USAGE")
    }

    /// The `run_id` of the node `target` (`None` if `INFO` is refused).
    async fn run_id(&mut self, target: &ScanTarget) -> Option<String> {
        self.pace().await;
        self.store.run_id(target).await
    }

    /// One `SCAN` step on `target`, for buckets of both kinds.
    async fn scan(
        &mut self,
        target: &ScanTarget,
        cursor: u64,
        count: u32,
    ) -> anyhow::Result<BucketScan> {
        self.pace().await;
        Ok(self.store.scan_buckets(target, cursor, count).await?)
    }

    /// Sweeps one bucket (of entries or of event ids: the same fields and codes); `None` if
    /// the key is not a hash.
    async fn bucket(
        &mut self,
        bucket: &Bucket,
        now_ms: i64,
        dry_run: bool,
    ) -> anyhow::Result<Option<BucketOutcome>> {
        // HSCAN may return a field twice (a rehashing hashtable): keep one.
        let mut fields: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        let mut cursor: u64 = 0;
        loop {
            self.pace().await;
            let Some(step) = self
                .store
                .scan_fields(bucket, cursor, HSCAN_COUNT)
                .await
                .context("HSCAN")?
            else {
                return Ok(None);
            };
            fields.extend(step.pairs);
            if step.next == 0 {
                break;
            }
            cursor = step.next;
        }

        let mut out = BucketOutcome {
            fields_scanned: fields.len() as u64,
            ..BucketOutcome::default()
        };
        let mut expired = Vec::new();
        for (field, value) in fields {
            match Layout::parse_entry(&field, &value) {
                None => out.unparseable += 1,
                Some((_, code)) if !code.is_live(now_ms) => expired.push((field, value)),
                Some(_) => {}
            }
        }
        out.expired_found = expired.len() as u64;
        if expired.is_empty() {
            return Ok(Some(out));
        }
        out.bytes_before = self.memory_usage(bucket).await?;
        if dry_run {
            out.bytes_after = out.bytes_before;
            return Ok(Some(out));
        }
        for chunk in expired.chunks(MAX_FIELDS_PER_CALL) {
            self.pace().await;
            let cas = self
                .store
                .delete_if_unchanged(bucket, chunk)
                .await
                .context("compare-and-delete (EVALSHA)")?;
            out.cas.deleted += cas.deleted;
            out.cas.refreshed += cas.refreshed;
        }
        out.already_gone = out.expired_found - out.cas.deleted - out.cas.refreshed;
        out.bytes_after = self.memory_usage(bucket).await?;
        Ok(Some(out))
    }
}

/// Runs a sweep of `store`'s keyspace as `opts` say and reports it. Writes nothing to stdout;
/// may print warnings on stderr.
pub async fn sweep(store: &RedisStore, opts: &Args) -> anyhow::Result<SweepReport> {
    sweep_with(store, opts, &AtomicBool::new(false), &mut |_| {}).await
}

/// [`sweep`], stopping at the next batch boundary once `stop` is set, calling `progress`
/// after every SCAN batch.
async fn sweep_with(
    store: &RedisStore,
    opts: &Args,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(&SweepReport),
) -> anyhow::Result<SweepReport> {
    let layout = store.layout().clone();
    let real_now = now_ms();
    let mut sw = Sweeper {
        store,
        pace: Pace::per_sec(u64::from(opts.max_ops_per_sec)),
        ops: 0,
    };
    let targets = store
        .scan_targets()
        .await
        .context("listing the nodes to SCAN (CLUSTER NODES)")?;
    if targets.is_empty() {
        bail!("the cluster reports no primary serving slots: nothing to SCAN");
    }
    let mut walk = Walk {
        targets,
        cluster: store.is_cluster(),
        index: 0,
        cursor: 0,
        run_id: None,
    };
    let resumed = match (&opts.checkpoint, opts.resume) {
        (Some(path), true) => Checkpoint::read(path)?
            .filter(|cp| !cp.report.done)
            .map(|cp| (path.as_path(), cp)),
        _ => None,
    };
    let mut report = match resumed {
        Some((path, cp)) => walk.resume(path, cp, opts, &layout, &mut sw).await?,
        None => {
            walk.start(opts.cursor.as_ref(), &mut sw).await?;
            SweepReport {
                prefix: layout.prefix().to_owned(),
                dry_run: opts.dry_run,
                now_ms: opts.now_ms.unwrap_or(real_now),
                ..SweepReport::default()
            }
        }
    };
    if report.now_ms > real_now && !opts.dry_run {
        bail!(
            "--now-ms {} is in the future: sweeping as of then would delete live entries (use --dry-run to forecast)",
            report.now_ms
        );
    }
    report.primaries = if walk.cluster {
        walk.targets.iter().map(ToString::to_string).collect()
    } else {
        Vec::new()
    };
    walk.place(&mut report);
    let (prior_ops, prior_secs) = (report.ops, report.seconds);
    let started = Instant::now();
    if !opts.dry_run {
        walk.load_scripts(&mut sw).await?;
    }

    let mut visited = Visited::new(&layout);
    let mut batches: u64 = 0;
    loop {
        if stop.load(Ordering::Relaxed) || opts.max_batches.is_some_and(|m| batches >= m) {
            break;
        }
        let next = sweep_batch(&mut sw, &walk, opts, &layout, &mut visited, &mut report).await?;
        batches += 1;
        report.scan_batches += 1;
        walk.advance(next, &mut sw).await;
        walk.place(&mut report);
        report.ops = prior_ops + sw.ops;
        report.seconds = prior_secs + started.elapsed().as_secs_f64();
        if let Some(path) = &opts.checkpoint {
            walk.save(path, &report)?;
        }
        progress(&report);
        if report.done {
            break;
        }
    }
    report.ops = prior_ops + sw.ops;
    report.seconds = prior_secs + started.elapsed().as_secs_f64();
    Ok(report)
}

/// One SCAN batch on the walk's current node: every bucket key it returns, of entries or of
/// event ids (once per run), swept; the cursor SCAN returned.
async fn sweep_batch(
    sw: &mut Sweeper<'_>,
    walk: &Walk,
    opts: &Args,
    layout: &Layout,
    visited: &mut Visited,
    report: &mut SweepReport,
) -> anyhow::Result<u64> {
    let (target, cursor) = (&walk.targets[walk.index], walk.cursor);
    let batch = async {
        let step = sw
            .scan(target, cursor, opts.scan_count.max(1))
            .await
            .context("SCAN")?;
        report.keys_skipped += step.skipped;
        for bucket in step.buckets {
            if !visited.insert(&bucket) {
                continue;
            }
            let outcome = sw
                .bucket(&bucket, report.now_ms, opts.dry_run)
                .await
                .with_context(|| format!("bucket {}", bucket.key(layout)))?;
            match outcome {
                Some(b) => report.add(&bucket, &b),
                None => report.keys_skipped += 1,
            }
        }
        anyhow::Ok(step.next)
    };
    batch.await.with_context(|| {
        let at = Position::at(target, cursor);
        if walk.cluster {
            format!(
                "sweeping from SCAN cursor {cursor} of {target} (resume there with --cursor {at})"
            )
        } else {
            format!("sweeping from SCAN cursor {cursor} (resume there with --cursor {at})")
        }
    })
}

/// Sets `stop` on SIGINT or SIGTERM (what Kubernetes sends before killing a pod).
fn stop_on_signal(stop: Arc<AtomicBool>) {
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let Ok(mut term) = signal(SignalKind::terminate()) else {
                return;
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        {
            if tokio::signal::ctrl_c().await.is_err() {
                return;
            }
        }
        eprintln!("sweep: signal received, stopping after this SCAN batch");
        stop.store(true, Ordering::Relaxed);
    });
}

/// `namelist-tools sweep`: sweeps, prints the table on stderr and the JSON report on stdout.
pub async fn run(global: &Global, args: Args) -> anyhow::Result<()> {
    let (store, _settings) = global.open().await?;
    let stop = Arc::new(AtomicBool::new(false));
    stop_on_signal(stop.clone());
    let mut progress = Progress::new(store.layout().buckets());
    let result = sweep_with(&store, &args, &stop, &mut |r| progress.update(r)).await;
    progress.finish();
    let report = result?;
    eprint!(
        "sweep of key prefix {:?}{}:\n{}",
        report.prefix,
        if report.dry_run { " (dry run)" } else { "" },
        report.table()
    );
    crate::out(serde_json::to_string(&report)?)?;
    if !report.done && stop.load(Ordering::Relaxed) {
        bail!(
            "stopped by a signal; continue with --cursor {}{}",
            report.next_position,
            if args.checkpoint.is_some() {
                " or --resume"
            } else {
                ""
            }
        );
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
    fn default_is_no_flags() {
        assert_eq!(Cli::parse_from(["sweep"]).args, Args::default());
    }

    #[test]
    fn resume_needs_a_checkpoint_and_excludes_a_cursor() {
        assert!(Cli::try_parse_from(["sweep", "--resume"]).is_err());
        assert!(
            Cli::try_parse_from(["sweep", "--resume", "--checkpoint", "c", "--cursor", "5"])
                .is_err()
        );
        let a = Cli::parse_from(["sweep", "--resume", "--checkpoint", "c"]).args;
        assert!(a.resume);
    }

    #[test]
    fn positions_parse_and_print() {
        let at = |s: &str| s.parse::<Position>();
        assert_eq!(at("0"), Ok(Position::Cursor(0)));
        assert_eq!(at("1234"), Ok(Position::Cursor(1234)));
        let node = Position::Node {
            host: "127.0.0.1".into(),
            port: 7001,
            cursor: 56,
        };
        assert_eq!(at("127.0.0.1:7001/56"), Ok(node.clone()));
        assert_eq!(node.to_string(), "127.0.0.1:7001/56");
        assert_eq!(
            at("::1:7001/5"),
            Ok(Position::Node {
                host: "::1".into(),
                port: 7001,
                cursor: 5
            })
        );
        for bad in [
            "", "x", "-1", "host/5", ":7001/5", "h:p/5", "h:7001/", "h:7001/x",
        ] {
            assert!(at(bad).is_err(), "{bad}");
        }
        let a = Cli::parse_from(["sweep", "--cursor", "10.0.0.1:6379/99"]).args;
        assert_eq!(a.cursor.unwrap().to_string(), "10.0.0.1:6379/99");
        assert!(Cli::try_parse_from(["sweep", "--cursor", "nope"]).is_err());
        assert_eq!(
            Position::at(&ScanTarget::Only, 7),
            Position::Cursor(7),
            "a single node's position is its cursor"
        );
    }

    #[test]
    fn a_version_1_checkpoint_still_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cp.json");
        let v1 = serde_json::json!({
            "version": 1,
            "server_run_id": "abc",
            "report": serde_json::to_value(SweepReport {
                prefix: "nl:".into(),
                next_cursor: 42,
                ..SweepReport::default()
            })
            .unwrap(),
        });
        let mut v1 = v1;
        for k in ["primaries", "primaries_done", "next_node", "next_position"]
            .into_iter()
            .chain(EVENT_FIELDS)
        {
            v1["report"].as_object_mut().unwrap().remove(k);
        }
        std::fs::write(&path, v1.to_string()).unwrap();
        let cp = Checkpoint::read(&path).unwrap().unwrap();
        assert!(cp.targets.is_empty() && cp.target_index == 0);
        assert_eq!(cp.report.next_cursor, 42);
    }

    /// The report's event-id fields: absent from a checkpoint of an older build.
    const EVENT_FIELDS: [&str; 8] = [
        "event_buckets_scanned",
        "event_ids_scanned",
        "event_ids_expired_found",
        "event_ids_deleted",
        "event_ids_skipped_refreshed",
        "event_ids_already_gone",
        "event_ids_unparseable",
        "event_bytes_freed",
    ];

    #[test]
    fn a_checkpoint_without_event_ids_still_reads() {
        let mut report = serde_json::to_value(SweepReport {
            prefix: "nl:".into(),
            next_cursor: 42,
            fields_reclaimed: 7,
            ..SweepReport::default()
        })
        .unwrap();
        for k in EVENT_FIELDS {
            assert!(
                report.as_object_mut().unwrap().remove(k).is_some(),
                "{k} is a field"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cp.json");
        let cp = serde_json::json!({
            "version": CHECKPOINT_VERSION,
            "server_run_id": "abc",
            "targets": ["Only"],
            "target_index": 0,
            "report": report,
        });
        std::fs::write(&path, cp.to_string()).unwrap();
        let cp = Checkpoint::read(&path).unwrap().unwrap();
        assert_eq!((cp.report.next_cursor, cp.report.fields_reclaimed), (42, 7));
        assert_eq!(cp.report.event_ids_deleted, 0);
    }

    #[test]
    fn visited_tells_the_kinds_apart() {
        let layout =
            Layout::new("nl:", 10, namelist::store::Hashing::Unkeyed).with_velocity(2, 100);
        let key = layout.event_bucket_key(0, None);
        let event = Bucket::EventIds(EventBucket::parse(&layout, key.as_bytes()).unwrap());
        let mut v = Visited::new(&layout);
        assert!(v.insert(&Bucket::Entries(0)));
        assert!(
            v.insert(&event),
            "event bucket 0 is not bucket of entries 0"
        );
        assert!(!v.insert(&event));
        assert!(!v.insert(&Bucket::Entries(0)));
    }
}
