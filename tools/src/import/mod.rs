//! `namelist-tools import`: bulk-load entries from CSV or JSON Lines.
//!
//! Three phases, each in a module of its own:
//! 1. **Read** (`input.rs`). Rows are parsed and normalised exactly as the API does
//!    (`domain`), turned into (bucket, field, expiry code) records of 16 bytes, and grouped
//!    into partitions of consecutive buckets (`partition.rs`); past `--memory-mb` the
//!    partitions spill to temporary files, so memory stays bounded whatever the input size.
//!    Bad rows go to the reject file.
//! 2. **Register** (`write.rs`). IP prefix lengths found in the file are added to their
//!    registries before any entry is written, so a check never misses a range.
//! 3. **Write** (`write.rs`), bucket by bucket in ascending order, a batch of buckets per
//!    pipeline with a bounded number of batches in flight. A bucket that does not exist yet is
//!    built here as a listpack and sent with `RESTORE` (no `REPLACE`: a bucket created
//!    meanwhile by the live service makes `RESTORE` fail with `BUSYKEY`, and that bucket falls
//!    back to `HSET`); an existing one gets one multi-field `HSET`. Within a bucket the last
//!    row for an entry wins, as with the API.
//!
//! Resume (`checkpoint.rs`): after every acknowledged batch, a checkpoint records the bucket
//! below which everything is written. `--resume` reads the file again (phase 1 is cheap) and
//! skips those buckets; buckets at or past the mark are written again whole, which is
//! idempotent, so the end state is what one clean run gives. The run's one audit record
//! (counts, not rows) and a `Bulk` invalidation (running services drop cached misses) are
//! written at the end; the invalidation is also published every 2 s during phase 3.
//!
//! Per-row `reason`s are validated but not stored: the layout keeps only expiries, and the
//! audit trail records the run, not its rows.

mod checkpoint;
mod input;

/// The columns of an import file, in the order `gen` writes them: the CSV header (any order
/// and a subset are read; an unknown column is refused) and the JSON Lines keys. `gen` and
/// `import` both use this one list.
pub const COLUMNS: [&str; 7] = [
    "list",
    "dimension",
    "value",
    "sandbox",
    "expires_at",
    "ttl_seconds",
    "reason",
];
mod partition;
mod write;
pub use write::{ATTEMPTS, PUBLISH_TIMEOUT, WRITE_TIMEOUT};

use std::path::{Path, PathBuf};
use std::time::Instant;

use namelist::store::redis::RedisStore;
use namelist::store::{FingerprintKey, Hashing, Layout, StoreBase};
use serde::Serialize;

use crate::Global;
use checkpoint::Resume;
use input::ReadOutcome;
use partition::group;

/// Bulk-load entries from CSV or JSON Lines (optionally gzip), from FILE or stdin.
///
/// Columns (CSV needs a header): list, dimension, value, sandbox, expires_at | ttl_seconds,
/// reason; --list and --sandbox fill missing ones. Rows are validated exactly like the API;
/// bad rows go to the reject file (line and reason) and the import goes on, unless --strict.
///
/// Cost: reading is local CPU (~0.4 µs per row: 10M CSV rows in ~4 s) and 16 bytes of memory
/// per row up to --memory-mb, then temporary files. Writing sends each bucket once: new
/// buckets are built here and RESTOREd (Redis spends almost nothing: ~6M fields/s), existing
/// ones get one multi-field HSET (Redis CPU scans the bucket per field: ~200k fields/s).
///
/// Safe against a live store: yes. RESTORE only ever creates buckets that do not exist
/// (never REPLACE), HSET only adds or refreshes fields, and running services are told to drop
/// cached misses. Use --max-rows-per-sec to leave Redis headroom for live traffic.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Input file (`-` or absent: stdin). Gzip is detected by its magic bytes.
    pub file: Option<PathBuf>,
    /// The regions of phones without a country code (the settings' `phone_default_region`
    /// and `sandbox_phone_regions`, as the service reads them), under the keyspace's rules.
    #[arg(skip)]
    pub phone_regions: namelist::domain::PhoneRegions,
    /// Input format; `auto` looks at the extension, then at the first byte (`{` = JSON Lines).
    #[arg(long, value_enum, default_value_t = InputFormat::Auto)]
    pub format: InputFormat,
    /// List for rows without a `list` column or value.
    #[arg(long)]
    pub list: Option<String>,
    /// Sandbox for rows without one (default `default`).
    #[arg(long)]
    pub sandbox: Option<String>,
    /// Where bad rows are reported (CSV: line,error). Default: `<FILE>.rejects.csv`, or
    /// `import.rejects.csv` for stdin.
    #[arg(long)]
    pub reject_file: Option<PathBuf>,
    /// Stop at the first bad row (non-zero exit, nothing written).
    #[arg(long)]
    pub strict: bool,
    /// Validate only: nothing is written, Redis is not contacted.
    #[arg(long)]
    pub dry_run: bool,
    /// Continue an interrupted run from its checkpoint (without one: from the start).
    #[arg(long)]
    pub resume: bool,
    /// Checkpoint file. Default: `<FILE>.checkpoint`.
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// Buckets per pipeline.
    #[arg(long, default_value_t = 256)]
    pub batch_buckets: usize,
    /// Pipelines in flight.
    #[arg(long, default_value_t = 4)]
    pub in_flight: usize,
    /// Pace writes to at most this many rows per second (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub max_rows_per_sec: u64,
    /// Memory for grouping rows before spilling to temporary files ($TMPDIR), in MiB
    /// (16 B a row). Default: a quarter of the machine's memory (or of the container's
    /// limit), between 256 MiB and 16 GiB.
    #[arg(long)]
    pub memory_mb: Option<u64>,
    /// Always use HSET, never RESTORE.
    #[arg(long)]
    pub no_restore: bool,
    /// Reason recorded in the run's audit record.
    #[arg(long)]
    pub reason: Option<String>,
    /// Who the audit record names.
    #[arg(long, default_value = "namelist-tools")]
    pub actor: String,
    /// Print the summary as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
}

impl Args {
    /// Defaults for importing `file` (for tests and embedding).
    pub fn for_file(file: impl Into<PathBuf>) -> Self {
        Self {
            file: Some(file.into()),
            phone_regions: namelist::domain::PhoneRegions::default(),
            format: InputFormat::Auto,
            list: None,
            sandbox: None,
            reject_file: None,
            strict: false,
            dry_run: false,
            resume: false,
            checkpoint: None,
            batch_buckets: 256,
            in_flight: 4,
            max_rows_per_sec: 0,
            memory_mb: None,
            no_restore: false,
            reason: None,
            actor: "namelist-tools".into(),
            json: false,
            quiet: true,
        }
    }

    /// The grouping budget in bytes: `--memory-mb`, or the default from the machine.
    fn memory_budget(&self) -> u64 {
        match self.memory_mb {
            Some(mb) => mb.saturating_mul(1 << 20),
            None => partition::default_budget(),
        }
    }

    /// The input file; `None` for stdin.
    fn input_path(&self) -> Option<&Path> {
        self.file.as_deref().filter(|p| p.as_os_str() != "-")
    }

    fn reject_path(&self) -> PathBuf {
        self.reject_file
            .clone()
            .unwrap_or_else(|| match self.input_path() {
                Some(p) => with_suffix(p, ".rejects.csv"),
                None => PathBuf::from("import.rejects.csv"),
            })
    }

    fn checkpoint_path(&self) -> Option<PathBuf> {
        self.checkpoint
            .clone()
            .or_else(|| self.input_path().map(|p| with_suffix(p, ".checkpoint")))
    }
}

/// `p` with `suffix` appended to its file name.
fn with_suffix(p: &Path, suffix: &str) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Input formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum InputFormat {
    Auto,
    Csv,
    Jsonl,
}

/// What an import did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ImportSummary {
    pub rows_read: u64,
    pub rows_rejected: u64,
    /// Accepted rows that repeated an entry seen earlier in the file (the last one won).
    pub rows_duplicate: u64,
    /// Distinct entries written.
    pub entries_written: u64,
    /// Entries written that created a field (the rest refreshed one).
    pub entries_created: u64,
    pub buckets_restored: u64,
    pub buckets_hset: u64,
    /// Buckets skipped because a resumed run's checkpoint had them done.
    pub buckets_skipped: u64,
    pub prefixes_registered: u64,
    pub read_seconds: f64,
    pub write_seconds: f64,
    pub seconds: f64,
    pub rows_per_sec: f64,
    pub resumed: bool,
    pub dry_run: bool,
    pub restore_used: bool,
    pub reject_file: Option<PathBuf>,
}

/// Runs an import against `store` (or, with `--dry-run`, against `layout` only).
pub async fn import(
    store: Option<&RedisStore>,
    layout: &Layout,
    args: &Args,
) -> anyhow::Result<ImportSummary> {
    let started = Instant::now();
    let resume = Resume::prepare(args, layout)?;
    let ReadOutcome {
        mut partitions,
        prefixes,
        rows_read,
        rows_rejected,
        rows_by_scope,
    } = input::read(args, layout, resume.now_ms).await?;
    let mut summary = ImportSummary {
        rows_read,
        rows_rejected,
        read_seconds: started.elapsed().as_secs_f64(),
        resumed: resume.resumed,
        dry_run: args.dry_run,
        reject_file: (rows_rejected > 0).then(|| args.reject_path()),
        ..Default::default()
    };
    let accepted = rows_read - rows_rejected;

    let Some(store) = store.filter(|_| !args.dry_run) else {
        // A dry run still groups, to count duplicates.
        let mut distinct = 0;
        for p in 0..partitions.len() {
            for b in group(partitions.take(p)?) {
                distinct += b.pairs.len() as u64;
            }
        }
        summary.rows_duplicate = accepted - distinct;
        return Ok(summary.finished(started));
    };
    summary.prefixes_registered = write::register_prefixes(store, &prefixes).await?;
    let distinct =
        write::write_partitions(store, layout, args, &mut partitions, &resume, &mut summary)
            .await?;
    summary.rows_duplicate = accepted - distinct;
    write::count_entries(store, &rows_by_scope, accepted, &summary).await;
    let summary = summary.finished(started);
    write::record_run(store, args, &summary).await?;
    resume.finish()?;
    Ok(summary)
}

impl ImportSummary {
    /// The summary with the run's total time and rate.
    fn finished(mut self, started: Instant) -> Self {
        self.seconds = started.elapsed().as_secs_f64();
        self.rows_per_sec = self.rows_read as f64 / self.seconds.max(1e-9);
        self
    }
}

/// The CLI entry point.
pub async fn run(global: &Global, mut args: Args) -> anyhow::Result<()> {
    args.phone_regions = global
        .settings()?
        .phone_regions()
        .map_err(anyhow::Error::msg)?;
    let (store, layout) = if args.dry_run {
        let settings = global.settings()?;
        let buckets = Layout::buckets_for(
            settings
                .expected_entries
                .unwrap_or(namelist::config::DEFAULT_EXPECTED_ENTRIES),
        );
        // Nothing is written: any key counts the same duplicates (the configured one is
        // still read, so a bad key file shows before the real run).
        let key = match settings.fingerprint_key()? {
            Some(k) => k,
            None => FingerprintKey::generate("generated for a dry run")?,
        };
        (
            None,
            Layout::new(settings.key_prefix, buckets, Hashing::Keyed(key)),
        )
    } else {
        let (store, _) = global.open().await?;
        let layout = store.layout().clone();
        (Some(store), layout)
    };
    let summary = import(store.as_ref(), &layout, &args).await?;
    eprintln!(
        "{}: {} rows read, {} written as {} entries ({} duplicate), {} rejected{}; {:.2} s, {:.0} rows/s \
         (read {:.2} s, write {:.2} s; buckets: {} restored, {} HSET, {} skipped)",
        if summary.dry_run { "dry run" } else { "import" },
        summary.rows_read,
        summary.rows_read - summary.rows_rejected,
        summary.entries_written,
        summary.rows_duplicate,
        summary.rows_rejected,
        summary
            .reject_file
            .as_ref()
            .map(|p| format!(" (see {})", p.display()))
            .unwrap_or_default(),
        summary.seconds,
        summary.rows_per_sec,
        summary.read_seconds,
        summary.write_seconds,
        summary.buckets_restored,
        summary.buckets_hset,
        summary.buckets_skipped,
    );
    if args.json {
        crate::out(serde_json::to_string(&summary)?)?;
    }
    Ok(())
}
