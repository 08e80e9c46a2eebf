//! Phase 1, reading: the input (a file or stdin, gzip detected by its magic bytes) split into
//! rows (CSV with a header, or JSON Lines), each validated and normalised exactly as the API
//! does (`namelist::domain`) and turned into a [`Rec`] of its partition; IP ranges found are
//! collected for phase 2; bad rows go to the reject file (`line,error`), created on the first
//! one. Runs on a blocking thread: it is all local CPU and file I/O.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, bail};
use indicatif::ProgressBar;
use namelist::domain::{Dimension, ErrorCode, Expiry, ListName, Sandbox, ValidationError, Value};
use namelist::lists::MAX_REASON_LEN;
use namelist::store::layout::write_canonical;
use namelist::store::{Layout, PrefixLen, Scope};
use serde::Deserialize;

use super::partition::{Partitions, Rec};
use super::{Args, InputFormat};
use crate::progress;

/// Phase 1 on a blocking thread, with a progress bar against the file's size.
pub(super) async fn read(args: &Args, layout: &Layout, now: i64) -> anyhow::Result<ReadOutcome> {
    let total = args
        .input_path()
        .and_then(|p| std::fs::metadata(p).ok())
        .map_or(0, |m| m.len());
    let bar = progress::bar(
        args.quiet || total == 0,
        Some(total),
        "reading {bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {msg}",
    );
    let bytes_read = Arc::new(AtomicU64::new(0));
    let outcome = {
        let (args, layout, bar) = (args.clone(), layout.clone(), bar.clone());
        tokio::task::spawn_blocking(move || read_rows(&args, &layout, now, &bar, bytes_read))
            .await??
    };
    bar.finish_and_clear();
    Ok(outcome)
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

use super::COLUMNS;

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
    /// The keyspace's rules and the phone regions.
    rules: namelist::domain::Rules,
    now: i64,
    /// Index of the `--list` default in `lists`, if one was given.
    default_list: Option<usize>,
    lists: Names<ListName>,
    /// Slot 0 is the default sandbox.
    sandboxes: Names<Sandbox>,
    dimensions: Names<Dimension>,
    canonical: Vec<u8>,
    /// Accepted rows per list and sandbox (what the lists' counts are apportioned by).
    per_scope: HashMap<ListName, HashMap<Sandbox, u64>>,
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
        regions: namelist::domain::PhoneRegions,
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
            rules: namelist::domain::Rules {
                version: layout.rules(),
                regions,
            },
            now,
            default_list,
            lists,
            sandboxes,
            dimensions: Names::new(),
            canonical: Vec::with_capacity(128),
            per_scope: HashMap::new(),
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
        let norm = self.rules.norm(sandbox);
        let value = Value::parse_entry_with(dimension, row.value.unwrap_or_default(), norm)
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
        let prefix = PrefixLen::of(&value).map(|len| (Scope::new(list, sandbox), len));
        match self
            .per_scope
            .get_mut(list)
            .and_then(|m| m.get_mut(sandbox))
        {
            Some(n) => *n += 1,
            None => {
                self.per_scope
                    .entry(list.clone())
                    .or_default()
                    .insert(sandbox.clone(), 1);
            }
        }
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
pub(super) struct ReadOutcome {
    pub(super) partitions: Partitions,
    pub(super) prefixes: HashSet<(Scope, PrefixLen)>,
    pub(super) rows_read: u64,
    pub(super) rows_rejected: u64,
    /// Accepted rows per (list, sandbox).
    pub(super) rows_by_scope: Vec<(Scope, u64)>,
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
    let mut v = Validator::new(
        layout,
        now,
        args.list.clone(),
        args.sandbox.clone(),
        args.phone_regions.clone(),
    )?;
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
        partitions: Partitions::new(layout.buckets(), args.memory_budget()),
        prefixes: HashSet::new(),
        rows_read: 0,
        rows_rejected: 0,
        rows_by_scope: Vec::new(),
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
    out.rows_by_scope = v
        .per_scope
        .into_iter()
        .flat_map(|(list, m)| {
            m.into_iter()
                .map(move |(sandbox, n)| (Scope::new(&list, &sandbox), n))
        })
        .collect();
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
