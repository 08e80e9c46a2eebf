//! `namelist-tools import`: bulk-load entries from CSV or JSON Lines.
//!
//! Three phases:
//! 1. **Read.** Rows are parsed and normalised exactly as the API does (`domain`), turned into
//!    (bucket, field, expiry code) records of 16 bytes, and grouped into partitions of
//!    consecutive buckets; past `--memory-mb` the partitions spill to temporary files, so
//!    memory stays bounded whatever the input size. Bad rows go to the reject file.
//! 2. **Register.** IP prefix lengths found in the file are added to their registries
//!    before any entry is written, so a check never misses a range.
//! 3. **Write**, bucket by bucket in ascending order, a batch of buckets per pipeline with a
//!    bounded number of batches in flight. A bucket that does not exist yet is built here as a
//!    listpack and sent with `RESTORE` (no `REPLACE`: a bucket created meanwhile by the live
//!    service makes `RESTORE` fail with `BUSYKEY`, and that bucket falls back to `HSET`); an
//!    existing one gets one multi-field `HSET`. Within a bucket the last row for an entry wins,
//!    as with the API.
//!
//! Resume: after every acknowledged batch, a checkpoint records the bucket below which
//! everything is written. `--resume` reads the file again (phase 1 is cheap) and skips those
//! buckets; buckets at or past the mark are written again whole, which is idempotent, so the
//! end state is what one clean run gives. The run's one audit record (counts, not rows) and a
//! `Bulk` invalidation (running services drop cached misses) are written at the end; the
//! invalidation is also published every 2 s during phase 3.
//!
//! Per-row `reason`s are validated but not stored: the layout keeps only expiries, and the
//! audit trail records the run, not its rows.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use indicatif::ProgressBar;
use namelist::store::bulk::BucketWrite;
use serde::{Deserialize, Serialize};

use crate::Global;
use crate::pace::Pace;
use crate::progress;
use namelist::domain::{
    Dimension, ErrorCode, Expiry, ListName, Sandbox, ValidationError, Value, now_ms,
};
use namelist::lists::MAX_REASON_LEN;
use namelist::store::layout::write_canonical;
use namelist::store::redis::RedisStore;
use namelist::store::{
    AuditRecord, FingerprintKey, Hashing, Invalidation, Layout, PrefixLen, Scope, Store,
};

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
    /// Memory for grouping rows before spilling to temporary files, in MiB.
    #[arg(long, default_value_t = 1024)]
    pub memory_mb: u64,
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
            memory_mb: 1024,
            no_restore: false,
            reason: None,
            actor: "namelist-tools".into(),
            json: false,
            quiet: true,
        }
    }

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

/// One accepted row: where it goes and its expiry code. 16 bytes, spilled as such.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rec {
    bucket: u32,
    code: u32,
    field: i64,
}

impl Rec {
    fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&self.bucket.to_le_bytes());
        b[4..8].copy_from_slice(&self.code.to_le_bytes());
        b[8..].copy_from_slice(&self.field.to_le_bytes());
        b
    }

    fn from_bytes(b: &[u8]) -> Self {
        Self {
            bucket: u32::from_le_bytes(b[..4].try_into().expect("4 bytes")),
            code: u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")),
            field: i64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
        }
    }
}

/// Records grouped by ranges of buckets, in memory up to a budget, then in temporary files.
struct Partitions {
    buckets_per: u32,
    buffers: Vec<Vec<Rec>>,
    files: Vec<Option<BufWriter<File>>>,
    dir: Option<tempfile::TempDir>,
    buffered: usize,
    budget: usize,
}

impl Partitions {
    fn new(buckets: u32, budget_bytes: u64) -> Self {
        // ~25,000 buckets ≈ 5M rows at the design fill of 200: one partition for most imports.
        let buckets_per = 25_000u32.min(buckets).max(1);
        let n = buckets.div_ceil(buckets_per) as usize;
        Self {
            buckets_per,
            buffers: vec![Vec::new(); n],
            files: (0..n).map(|_| None).collect(),
            dir: None,
            buffered: 0,
            budget: (budget_bytes / 16).max(1024) as usize,
        }
    }

    fn push(&mut self, rec: Rec) -> anyhow::Result<()> {
        self.buffers[(rec.bucket / self.buckets_per) as usize].push(rec);
        self.buffered += 1;
        if self.buffered >= self.budget {
            self.spill()?;
        }
        Ok(())
    }

    fn spill(&mut self) -> anyhow::Result<()> {
        if self.dir.is_none() {
            self.dir = Some(tempfile::tempdir().context("creating a spill directory")?);
        }
        let dir = self.dir.as_ref().expect("just created").path().to_owned();
        for (i, buf) in self.buffers.iter_mut().enumerate() {
            if buf.is_empty() {
                continue;
            }
            if self.files[i].is_none() {
                let f = File::create(dir.join(format!("p{i}")))?;
                self.files[i] = Some(BufWriter::new(f));
            }
            let w = self.files[i].as_mut().expect("just created");
            for r in buf.drain(..) {
                w.write_all(&r.to_bytes())?;
            }
            buf.shrink_to_fit();
        }
        self.buffered = 0;
        Ok(())
    }

    fn len(&self) -> usize {
        self.buffers.len()
    }

    /// Every record of partition `i`, in input order (spilled ones first: they are older).
    fn take(&mut self, i: usize) -> anyhow::Result<Vec<Rec>> {
        let mut out = Vec::new();
        if let Some(w) = self.files[i].take() {
            let mut f = w.into_inner().map_err(|e| e.into_error())?;
            f.rewind()?;
            let mut bytes = Vec::new();
            f.read_to_end(&mut bytes)?;
            out.extend(bytes.chunks_exact(16).map(Rec::from_bytes));
        }
        out.append(&mut self.buffers[i]);
        Ok(out)
    }
}

/// Counts bytes read from the raw input (for progress against the file size).
struct Counting<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// The raw input as a buffered reader (gzip-decoded when it starts with gzip's magic).
fn open_input(
    path: Option<&Path>,
    count: Arc<AtomicU64>,
) -> anyhow::Result<Box<dyn BufRead + Send>> {
    let raw: Box<dyn Read + Send> = match path {
        Some(p) => Box::new(File::open(p).with_context(|| format!("opening {}", p.display()))?),
        None => Box::new(std::io::stdin()),
    };
    let mut buffered = BufReader::with_capacity(1 << 20, Counting { inner: raw, count });
    let gzip = buffered.fill_buf()?.starts_with(&[0x1f, 0x8b]);
    Ok(if gzip {
        Box::new(BufReader::with_capacity(
            1 << 20,
            flate2::read::MultiGzDecoder::new(buffered),
        ))
    } else {
        Box::new(buffered)
    })
}

/// One input row before validation, whatever the format (borrowed from the input).
#[derive(Debug, Default)]
struct RawRow<'a> {
    list: Option<&'a str>,
    dimension: Option<&'a str>,
    value: Option<&'a str>,
    sandbox: Option<&'a str>,
    expires_at: Option<i64>,
    ttl_seconds: Option<u64>,
    reason: Option<&'a str>,
}

/// A JSON Lines row; strings without escapes are borrowed from the line.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRow<'a> {
    #[serde(borrow)]
    list: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    dimension: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    value: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    sandbox: Option<std::borrow::Cow<'a, str>>,
    expires_at: Option<i64>,
    ttl_seconds: Option<u64>,
    #[serde(borrow)]
    reason: Option<std::borrow::Cow<'a, str>>,
}

impl<'a> JsonRow<'a> {
    fn raw(&'a self) -> RawRow<'a> {
        RawRow {
            list: self.list.as_deref(),
            dimension: self.dimension.as_deref(),
            value: self.value.as_deref(),
            sandbox: self.sandbox.as_deref(),
            expires_at: self.expires_at,
            ttl_seconds: self.ttl_seconds,
            reason: self.reason.as_deref(),
        }
    }
}

const COLUMNS: [&str; 7] = [
    "list",
    "dimension",
    "value",
    "sandbox",
    "expires_at",
    "ttl_seconds",
    "reason",
];

/// Parsed names (lists, sandboxes, dimensions) by their raw text: a handful per file, so a
/// short vector searched linearly beats hashing every row.
struct Names<T> {
    items: Vec<(Box<str>, T)>,
}

impl<T> Names<T> {
    const CAP: usize = 64;

    fn new() -> Self {
        Self { items: Vec::new() }
    }

    /// The index of `raw`'s parsed form, parsing it on first sight. Past `CAP` names the last
    /// slot is reused, so memory stays bounded on a file of many distinct names.
    fn index(
        &mut self,
        raw: &str,
        parse: impl FnOnce(String) -> Result<T, ValidationError>,
    ) -> Result<usize, ValidationError> {
        if let Some(i) = self.items.iter().position(|(k, _)| &**k == raw) {
            return Ok(i);
        }
        let v = parse(raw.to_owned())?;
        if self.items.len() < Self::CAP {
            self.items.push((raw.into(), v));
        } else {
            self.items[Self::CAP - 1] = (raw.into(), v);
        }
        Ok(self.items.len() - 1)
    }

    fn get(&self, i: usize) -> &T {
        &self.items[i].1
    }
}

/// Validates rows into records.
struct Validator<'a> {
    layout: &'a Layout,
    now: i64,
    /// Index of the `--list` default in `lists`, if one was given.
    default_list: Option<usize>,
    lists: Names<ListName>,
    /// Slot 0 is the default sandbox.
    sandboxes: Names<Sandbox>,
    dimensions: Names<Dimension>,
    canonical: Vec<u8>,
}

/// What one valid row adds.
struct Accepted {
    rec: Rec,
    prefix: Option<(Scope, PrefixLen)>,
}

impl Validator<'_> {
    fn new(
        layout: &Layout,
        now: i64,
        list: Option<String>,
        sandbox: Option<String>,
    ) -> anyhow::Result<Validator<'_>> {
        let mut lists = Names::new();
        let default_list = list
            .map(|l| lists.index(&l, ListName::try_from))
            .transpose()
            .context("--list")?;
        let mut sandboxes = Names::new();
        let default_sandbox = Sandbox::parse_or_default(sandbox).context("--sandbox")?;
        sandboxes.index(default_sandbox.as_str(), Sandbox::try_from)?;
        Ok(Validator {
            layout,
            now,
            default_list,
            lists,
            sandboxes,
            dimensions: Names::new(),
            canonical: Vec::with_capacity(128),
        })
    }

    fn accept(&mut self, row: RawRow<'_>) -> Result<Accepted, ValidationError> {
        let li = match row.list.filter(|s| !s.is_empty()) {
            Some(l) => self
                .lists
                .index(l, ListName::try_from)
                .map_err(|e| e.at("list"))?,
            None => self.default_list.ok_or_else(|| {
                ValidationError::new(
                    ErrorCode::MissingList,
                    "no list: add a list column or pass --list",
                )
            })?,
        };
        let dimension = row.dimension.filter(|s| !s.is_empty()).ok_or_else(|| {
            ValidationError::new(ErrorCode::MissingDimension, "dimension is empty")
        })?;
        let di = self
            .dimensions
            .index(dimension, Dimension::try_from)
            .map_err(|e| e.at("dimension"))?;
        let si = match row.sandbox.filter(|s| !s.is_empty()) {
            Some(s) => self
                .sandboxes
                .index(s, Sandbox::try_from)
                .map_err(|e| e.at("sandbox"))?,
            None => 0,
        };
        let (list, dimension, sandbox) = (
            self.lists.get(li),
            self.dimensions.get(di),
            self.sandboxes.get(si),
        );
        let value = Value::parse_entry(dimension, row.value.unwrap_or_default())
            .map_err(|e| e.at("value"))?;
        let expiry = match (row.expires_at, row.ttl_seconds) {
            (Some(_), Some(_)) => {
                return Err(ValidationError::new(
                    ErrorCode::InvalidExpiry,
                    "give at most one of expires_at and ttl_seconds",
                ));
            }
            (Some(at), None) => Expiry::at_ms(at, self.now).map_err(|e| e.at("expires_at"))?,
            (None, Some(ttl)) => {
                Expiry::after_ttl(ttl, self.now).map_err(|e| e.at("ttl_seconds"))?
            }
            (None, None) => Expiry::Never,
        };
        if row.reason.is_some_and(|r| r.len() > MAX_REASON_LEN) {
            return Err(ValidationError::new(
                ErrorCode::InvalidReason,
                format!("reason is longer than {MAX_REASON_LEN} bytes"),
            ));
        }
        write_canonical(&mut self.canonical, list, dimension, sandbox, &value);
        let key = self.layout.key_of(&self.canonical);
        let prefix = value.as_ip().filter(|ip| ip.is_range()).map(|ip| {
            (
                (list.clone(), sandbox.clone()),
                PrefixLen {
                    family: ip.family(),
                    len: ip.prefix(),
                },
            )
        });
        Ok(Accepted {
            rec: Rec {
                bucket: key.bucket,
                code: expiry.code(),
                field: key.field,
            },
            prefix,
        })
    }
}

/// Everything phase 1 produced.
struct ReadOutcome {
    partitions: Partitions,
    prefixes: HashSet<(Scope, PrefixLen)>,
    rows_read: u64,
    rows_rejected: u64,
}

/// Reject file, created on the first bad row.
struct Rejects {
    path: PathBuf,
    writer: Option<csv::Writer<File>>,
}

impl Rejects {
    fn record(&mut self, line: u64, error: &str) -> anyhow::Result<()> {
        if self.writer.is_none() {
            let mut w = csv::Writer::from_path(&self.path)
                .with_context(|| format!("creating {}", self.path.display()))?;
            w.write_record(["line", "error"])?;
            self.writer = Some(w);
        }
        let w = self.writer.as_mut().expect("just created");
        w.write_record([line.to_string().as_str(), error])?;
        Ok(())
    }

    fn finish(&mut self) -> anyhow::Result<()> {
        if let Some(w) = self.writer.as_mut() {
            w.flush()?;
        }
        Ok(())
    }
}

fn detect_format(args: &Args, input: &mut dyn BufRead) -> anyhow::Result<InputFormat> {
    if args.format != InputFormat::Auto {
        return Ok(args.format);
    }
    if let Some(p) = args.input_path() {
        let name = p.to_string_lossy().to_ascii_lowercase();
        let name = name.strip_suffix(".gz").unwrap_or(&name);
        if name.ends_with(".jsonl") || name.ends_with(".ndjson") {
            return Ok(InputFormat::Jsonl);
        }
        if name.ends_with(".csv") {
            return Ok(InputFormat::Csv);
        }
    }
    let first = input
        .fill_buf()?
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .copied();
    Ok(if first == Some(b'{') {
        InputFormat::Jsonl
    } else {
        InputFormat::Csv
    })
}

/// Phase 1: read, validate and group every row.
fn read_rows(
    args: &Args,
    layout: &Layout,
    now: i64,
    progress: &ProgressBar,
    bytes_read: Arc<AtomicU64>,
) -> anyhow::Result<ReadOutcome> {
    let mut input = open_input(args.input_path(), bytes_read.clone())?;
    let format = detect_format(args, &mut input)?;
    let mut v = Validator::new(layout, now, args.list.clone(), args.sandbox.clone())?;
    let reject_path = args.reject_path();
    if reject_path.exists() {
        std::fs::remove_file(&reject_path)
            .with_context(|| format!("removing the old {}", reject_path.display()))?;
    }
    let mut rejects = Rejects {
        path: reject_path,
        writer: None,
    };
    let mut out = ReadOutcome {
        partitions: Partitions::new(layout.buckets(), args.memory_mb.saturating_mul(1 << 20)),
        prefixes: HashSet::new(),
        rows_read: 0,
        rows_rejected: 0,
    };
    let mut handle =
        |line: u64, row: Result<RawRow<'_>, String>, out: &mut ReadOutcome| -> anyhow::Result<()> {
            out.rows_read += 1;
            let accepted = row.and_then(|r| v.accept(r).map_err(|e| e.message));
            match accepted {
                Ok(a) => {
                    out.partitions.push(a.rec)?;
                    if let Some(p) = a.prefix {
                        out.prefixes.insert(p);
                    }
                }
                Err(reason) => {
                    out.rows_rejected += 1;
                    rejects.record(line, &reason)?;
                    if args.strict {
                        rejects.finish()?;
                        bail!("line {line}: {reason} (--strict: stopping, nothing written)");
                    }
                }
            }
            if out.rows_read.is_multiple_of(65_536) {
                progress.set_position(bytes_read.load(Ordering::Relaxed));
                progress.set_message(format!(
                    "{} rows, {} rejected",
                    out.rows_read, out.rows_rejected
                ));
            }
            Ok(())
        };

    let (source, index) = match format {
        InputFormat::Jsonl => (Source::Jsonl(input), [None; 7]),
        InputFormat::Csv | InputFormat::Auto => {
            let mut reader = csv::ReaderBuilder::new()
                .has_headers(true)
                .flexible(false)
                .from_reader(input);
            let headers = reader.headers().context("reading the CSV header")?.clone();
            let mut index = [None; 7];
            for (i, h) in headers.iter().enumerate() {
                let h = h.trim();
                let Some(c) = COLUMNS.iter().position(|c| *c == h) else {
                    bail!(
                        "unknown CSV column {h:?}; expected a header with {}",
                        COLUMNS.join(", ")
                    );
                };
                index[c] = Some(i);
            }
            if index[1].is_none() || index[2].is_none() {
                bail!("the CSV header needs at least the columns dimension and value");
            }
            (Source::Csv(Box::new(reader)), index)
        }
    };
    produce(source, |item| match item {
        Item::Csv(line, record) => handle(line, csv_row(record, &index), &mut out),
        Item::Json(line, bytes) => match serde_json::from_slice::<JsonRow>(bytes) {
            Ok(row) => handle(line, Ok(row.raw()), &mut out),
            Err(e) => handle(line, Err(format!("invalid JSON: {e}")), &mut out),
        },
        Item::Unreadable(line, why) => handle(line, Err(why), &mut out),
    })?;
    rejects.finish()?;
    progress.set_position(bytes_read.load(Ordering::Relaxed));
    Ok(out)
}

/// The input, to be split into rows.
enum Source {
    Csv(Box<csv::Reader<Box<dyn BufRead + Send>>>),
    Jsonl(Box<dyn BufRead + Send>),
}

/// One input row, with its line number.
enum Item<'a> {
    Csv(u64, &'a csv::StringRecord),
    Json(u64, &'a [u8]),
    Unreadable(u64, String),
}

/// Splits the input into rows and hands each to `f`, in order.
fn produce(
    source: Source,
    mut f: impl FnMut(Item<'_>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    match source {
        Source::Csv(mut reader) => {
            let mut record = csv::StringRecord::new();
            loop {
                let line = reader.position().line() + 1;
                match reader.read_record(&mut record) {
                    Ok(false) => break,
                    Ok(true) => {
                        let line = record.position().map_or(line, |p| p.line());
                        f(Item::Csv(line, &record))?;
                    }
                    Err(e) => {
                        let line = e.position().map_or(line, |p| p.line());
                        f(Item::Unreadable(line, format!("unreadable CSV row: {e}")))?;
                        if !matches!(
                            e.kind(),
                            csv::ErrorKind::UnequalLengths { .. } | csv::ErrorKind::Utf8 { .. }
                        ) {
                            break;
                        }
                    }
                }
            }
        }
        Source::Jsonl(mut input) => {
            let mut line = 0u64;
            let mut buf = Vec::new();
            loop {
                buf.clear();
                if input.read_until(b'\n', &mut buf)? == 0 {
                    break;
                }
                line += 1;
                if !buf.iter().all(u8::is_ascii_whitespace) {
                    f(Item::Json(line, &buf))?;
                }
            }
        }
    }
    Ok(())
}

fn csv_row<'a>(
    record: &'a csv::StringRecord,
    index: &[Option<usize>; 7],
) -> Result<RawRow<'a>, String> {
    let get = |c: usize| {
        index[c]
            .and_then(|i| record.get(i))
            .map(str::trim)
            .filter(|s| !s.is_empty())
    };
    let int = |c: usize| -> Result<Option<i64>, String> {
        get(c)
            .map(|s| {
                s.parse::<i64>()
                    .map_err(|_| format!("{}: not an integer", COLUMNS[c]))
            })
            .transpose()
    };
    let ttl = match int(5)? {
        Some(t) if t < 0 => return Err("ttl_seconds: must be at least 1".into()),
        t => t.map(|t| t as u64),
    };
    Ok(RawRow {
        list: get(0),
        dimension: get(1),
        // A value is trimmed by its dimension's rule; keep it raw here.
        value: index[2].and_then(|i| record.get(i)),
        sandbox: get(3),
        expires_at: int(4)?,
        ttl_seconds: ttl,
        reason: get(6),
    })
}

/// Identity of the input, so a checkpoint is never applied to another file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct InputId {
    path: PathBuf,
    size: u64,
    modified_ms: u128,
    /// The keyspace's keyed hash of the first MiB (`Hashing::import_input`): a small input is
    /// a few rows, which an unkeyed hash would give back. A checkpoint of an older build
    /// (`head_xxh3`) parses, and is then taken for another input.
    #[serde(alias = "head_xxh3")]
    head_hash: u64,
}

fn input_id(path: &Path, hashing: &Hashing) -> anyhow::Result<InputId> {
    let meta = std::fs::metadata(path)?;
    let mut head = vec![0u8; 1 << 20];
    let mut f = File::open(path)?;
    let mut n = 0;
    while n < head.len() {
        let k = f.read(&mut head[n..])?;
        if k == 0 {
            break;
        }
        n += k;
    }
    Ok(InputId {
        path: path.canonicalize()?,
        size: meta.len(),
        modified_ms: meta
            .modified()?
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0),
        head_hash: hashing.import_input(&head[..n]),
    })
}

/// What a checkpoint records.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Checkpoint {
    version: u32,
    input: InputId,
    prefix: String,
    buckets: u32,
    /// Every bucket below this one is written.
    done_below: u32,
    /// "Now" of the first run: `ttl_seconds` count from it, so both parts of a resumed run
    /// write the same expiries.
    now_ms: i64,
}

fn save_checkpoint(path: &Path, cp: &Checkpoint) -> anyhow::Result<()> {
    let tmp = with_suffix(path, ".tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(cp)?)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Runs an import against `store` (or, with `--dry-run`, against `layout` only).
pub async fn import(
    store: Option<&RedisStore>,
    layout: &Layout,
    args: &Args,
) -> anyhow::Result<ImportSummary> {
    let started = Instant::now();
    let mut summary = ImportSummary {
        dry_run: args.dry_run,
        ..Default::default()
    };
    if args.resume && args.input_path().is_none() {
        bail!("--resume needs an input FILE (stdin cannot be read again)");
    }
    let checkpoint_path = args.checkpoint_path().filter(|_| !args.dry_run);
    let input = args
        .input_path()
        .map(|p| input_id(p, layout.hashing()))
        .transpose()?;
    let mut done_below = 0u32;
    let mut now = now_ms();
    let resumable = checkpoint_path.as_ref().filter(|p| p.exists());
    summary.resumed = args.resume && resumable.is_some();
    if args.resume && resumable.is_none() {
        // Nothing to resume (the first attempt of a Job, say): a clean run.
        eprintln!("note: no checkpoint to resume from; importing from the start");
    }
    if let Some(path) = resumable.filter(|_| args.resume) {
        let cp: Checkpoint = serde_json::from_slice(
            &std::fs::read(path)
                .with_context(|| format!("reading checkpoint {}", path.display()))?,
        )
        .context("parsing the checkpoint")?;
        if Some(&cp.input) != input.as_ref() {
            bail!(
                "the checkpoint {} is for another input (or the file changed); run without --resume",
                path.display()
            );
        }
        if cp.prefix != layout.prefix() || cp.buckets != layout.buckets() {
            bail!(
                "the checkpoint is for keyspace {} with {} buckets, not {} with {}",
                cp.prefix,
                cp.buckets,
                layout.prefix(),
                layout.buckets()
            );
        }
        done_below = cp.done_below;
        now = cp.now_ms;
    } else if let Some(p) = checkpoint_path.as_ref().filter(|p| p.exists()) {
        eprintln!(
            "note: ignoring the checkpoint {} of an earlier run (pass --resume to use it)",
            p.display()
        );
    }

    // Phase 1: read.
    let total = args
        .input_path()
        .and_then(|p| std::fs::metadata(p).ok())
        .map_or(0, |m| m.len());
    let read_bar = progress::bar(
        args.quiet || total == 0,
        Some(total),
        "reading {bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {msg}",
    );
    let bytes_read = Arc::new(AtomicU64::new(0));
    let outcome = {
        let (args, layout, pb) = (args.clone(), layout.clone(), read_bar.clone());
        tokio::task::spawn_blocking(move || read_rows(&args, &layout, now, &pb, bytes_read))
            .await??
    };
    read_bar.finish_and_clear();
    let ReadOutcome {
        mut partitions,
        prefixes,
        rows_read,
        rows_rejected,
    } = outcome;
    summary.rows_read = rows_read;
    summary.rows_rejected = rows_rejected;
    summary.read_seconds = started.elapsed().as_secs_f64();
    if rows_rejected > 0 {
        summary.reject_file = Some(args.reject_path());
    }

    let Some(store) = store.filter(|_| !args.dry_run) else {
        // A dry run still groups, to count duplicates.
        for p in 0..partitions.len() {
            for b in group(partitions.take(p)?) {
                summary.entries_written += b.pairs.len() as u64;
            }
        }
        summary.rows_duplicate = rows_read - rows_rejected - summary.entries_written;
        summary.entries_written = 0;
        summary.seconds = started.elapsed().as_secs_f64();
        summary.rows_per_sec = rows_read as f64 / summary.seconds.max(1e-9);
        return Ok(summary);
    };

    // Phase 2: ranges are registered before any entry is written.
    if !prefixes.is_empty() {
        let registered: Vec<(Scope, PrefixLen)> = prefixes.iter().cloned().collect();
        let mut scopes: Vec<(String, String)> = registered
            .iter()
            .map(|((list, sandbox), _)| (list.to_string(), sandbox.to_string()))
            .collect();
        store
            .register_prefix_lengths(&registered)
            .await
            .context("registering prefix lengths")?;
        scopes.sort();
        scopes.dedup();
        store.publish(&Invalidation::Scopes(scopes)).await?;
        summary.prefixes_registered = prefixes.len() as u64;
    }

    // Phase 3: write.
    let format = if args.no_restore {
        None
    } else {
        match store.prove_restore().await {
            Ok(f) => Some(f),
            Err(e) => {
                eprintln!("WARNING: RESTORE path disabled, writing every bucket with HSET: {e:#}");
                None
            }
        }
    };
    summary.restore_used = format.is_some();
    let write_started = Instant::now();
    let write_bar = progress::bar(
        args.quiet,
        Some(u64::from(layout.buckets())),
        "writing {bar:30} {pos}/{len} buckets eta {eta} {msg}",
    );
    let accepted = rows_read - rows_rejected;
    let mut rows_done = 0u64;
    let mut last_publish = Instant::now();
    let mut last_checkpoint = Instant::now();
    let batch_buckets = args.batch_buckets.max(1);
    let pace = Pace::per_sec(args.max_rows_per_sec);
    for p in 0..partitions.len() {
        let buckets = group(partitions.take(p)?);
        rows_done += buckets.iter().map(|b| b.pairs.len() as u64).sum::<u64>();
        let (skip, todo): (Vec<BucketWrite>, Vec<BucketWrite>) =
            buckets.into_iter().partition(|b| b.bucket < done_below);
        summary.buckets_skipped += skip.len() as u64;
        summary.entries_written += skip.iter().map(|b| b.pairs.len() as u64).sum::<u64>();
        let mut batches = Vec::new();
        let mut it = todo.into_iter().peekable();
        while it.peek().is_some() {
            batches.push(it.by_ref().take(batch_buckets).collect::<Vec<_>>());
        }
        let mut writes = futures::stream::iter(batches.into_iter().map(|batch| {
            let pace = &pace;
            let last = batch.last().map_or(0, |b| b.bucket);
            let rows: u64 = batch.iter().map(|b| b.pairs.len() as u64).sum();
            async move {
                pace.take(rows).await;
                store.write_buckets(format, &batch).await.map(|o| (last, o))
            }
        }))
        .buffered(args.in_flight.max(1));
        while let Some(done) = writes.next().await {
            let (last, o) = done?;
            summary.buckets_restored += o.restored;
            summary.buckets_hset += o.hset;
            summary.entries_written += o.entries;
            write_bar.set_position(u64::from(last) + 1);
            write_bar.set_message(format!(
                "{} entries, {:.0}/s",
                summary.entries_written,
                summary.entries_written as f64 / write_started.elapsed().as_secs_f64().max(1e-9)
            ));
            // Batches complete in order: everything up to `last` is acknowledged.
            if let (Some(path), Some(input)) = (&checkpoint_path, &input)
                && last_checkpoint.elapsed() > Duration::from_millis(200)
            {
                save_checkpoint(
                    path,
                    &Checkpoint {
                        version: 1,
                        input: input.clone(),
                        prefix: layout.prefix().to_owned(),
                        buckets: layout.buckets(),
                        done_below: last + 1,
                        now_ms: now,
                    },
                )?;
                last_checkpoint = Instant::now();
            }
            if last_publish.elapsed() > Duration::from_secs(2) {
                store.publish(&Invalidation::Bulk).await?;
                last_publish = Instant::now();
            }
        }
    }
    write_bar.finish_and_clear();
    summary.rows_duplicate = accepted - rows_done;
    summary.write_seconds = write_started.elapsed().as_secs_f64();
    summary.seconds = started.elapsed().as_secs_f64();
    summary.rows_per_sec = rows_read as f64 / summary.seconds.max(1e-9);

    store.publish(&Invalidation::Bulk).await?;
    let mut fields = vec![
        ("at".to_owned(), now_ms().to_string()),
        ("who".to_owned(), args.actor.clone()),
        ("op".to_owned(), "import".to_owned()),
        (
            "source".to_owned(),
            args.input_path()
                .map_or("stdin".into(), |p| p.display().to_string()),
        ),
        ("rows_read".to_owned(), summary.rows_read.to_string()),
        (
            "rows_rejected".to_owned(),
            summary.rows_rejected.to_string(),
        ),
        (
            "entries_written".to_owned(),
            summary.entries_written.to_string(),
        ),
        (
            "buckets_restored".to_owned(),
            summary.buckets_restored.to_string(),
        ),
        ("buckets_hset".to_owned(), summary.buckets_hset.to_string()),
        ("resumed".to_owned(), summary.resumed.to_string()),
        ("seconds".to_owned(), format!("{:.3}", summary.seconds)),
    ];
    if let Some(r) = &args.reason {
        fields.push(("reason".to_owned(), r.clone()));
    }
    store
        .append_audit(&AuditRecord { fields })
        .await
        .context("writing the audit record")?;
    if let Some(p) = checkpoint_path.filter(|p| p.exists()) {
        std::fs::remove_file(p)?;
    }
    Ok(summary)
}

/// Groups records (input order) into buckets in ascending order; in each bucket the last
/// record for a field wins.
fn group(mut recs: Vec<Rec>) -> Vec<BucketWrite> {
    recs.sort_by_key(|r| r.bucket); // stable: input order kept within a bucket
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for run in recs.chunk_by(|a, b| a.bucket == b.bucket) {
        seen.clear();
        let mut pairs: Vec<(i64, i64)> = run
            .iter()
            .rev()
            .filter(|r| seen.insert(r.field))
            .map(|r| (r.field, i64::from(r.code)))
            .collect();
        pairs.reverse();
        out.push(BucketWrite {
            bucket: run[0].bucket,
            pairs,
        });
    }
    out
}

/// The CLI entry point.
pub async fn run(global: &Global, args: Args) -> anyhow::Result<()> {
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
        println!("{}", serde_json::to_string(&summary)?);
    }
    Ok(())
}
