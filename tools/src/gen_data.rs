//! `namelist-tools gen`: realistic synthetic name-list entries for tests, benches and demos,
//! written in the format `namelist-tools import` reads, plus an optional file of
//! *non-members* (values listed by no generated row) for false-positive tests.
//!
//! ## Output
//! CSV with the header `list,dimension,value,sandbox,expires_at,ttl_seconds,reason` (an empty
//! cell is an absent field; at most one of `expires_at` (Unix ms) / `ttl_seconds` per row), or
//! JSON Lines with the same keys, absent ones omitted. The non-member file has the same shape
//! with the expiry and reason cells empty.
//!
//! ## Distinct values without memory
//! Every value space (11-digit mobile numbers, IMEI bodies, MACs under a set of OUIs, ...) is
//! numbered `0..size`, and the generator walks it through a keyed bijection of that range (a
//! few rounds of xor / odd multiply / xorshift on the smallest power-of-two domain, cycle-walked
//! back into `0..size`). Members take indices `0..N` of their dimension, non-members continue
//! at `N..N+M`: members are therefore distinct per dimension (whatever their list and sandbox)
//! and no non-member ever equals a member, with O(1) memory. Formatting variants (`+86 138-…`,
//! `AA-BB-…`, upper-case IPv6...) never change which index a normalised value comes from.
//!
//! IP ranges live in dedicated blocks that single addresses (members or not) never use:
//! `10.0.0.0/8` (ranges /16–/28) and `3fff::/20` (the RFC 9637 documentation block, ranges
//! /32–/64). Each prefix length has its own sequence over the networks of that length inside
//! the block, so ranges are distinct too. Single IPv4 addresses avoid `0/8`, `10/8`, `127/8` and
//! `224/3`; single IPv6 addresses sit under four Chinese ISP /20s.
//!
//! Expiries are never shorter than one hour (from `--now-ms`), so tests never see a generated
//! entry expire under them.

use std::fmt::{self, Write as _};
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::net::Ipv6Addr;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail, ensure};
use flate2::Compression;
use flate2::write::GzEncoder;
use indicatif::ProgressBar;
use rand::rngs::Xoshiro256PlusPlus;
use rand::{Rng, SeedableRng};

use namelist::domain::{Dimension, ListName, Sandbox, now_ms};

use crate::progress;

/// The seed used when `--seed` is not given.
pub const DEFAULT_SEED: u64 = 20_240_601;
/// The default `--mix`.
pub const DEFAULT_MIX: &str =
    "phone=30,device=20,uid=15,imei=10,ip=10,wifi_mac=5,id_card=5,merchant=5";
/// The header of both output files (CSV).
pub const CSV_HEADER: &str = "list,dimension,value,sandbox,expires_at,ttl_seconds,reason";
const HEADER: [&str; 7] = [
    "list",
    "dimension",
    "value",
    "sandbox",
    "expires_at",
    "ttl_seconds",
    "reason",
];

/// Shortest generated expiry: one hour.
pub const MIN_EXPIRY_SECS: u64 = 3_600;
/// Longest generated expiry: 365 days.
pub const MAX_EXPIRY_SECS: u64 = 365 * 86_400;

/// Show a progress bar from this many rows on (and only on a terminal).
const PROGRESS_FROM: u64 = 1_000_000;
const PROGRESS_EVERY: u64 = 1 << 16;

/// Generate realistic synthetic name-list entries (and non-members) for tests and benches.
///
/// Touches no store: it never connects to Redis (the global --redis-url/--config are ignored),
/// so it is safe anywhere. Cost: one CPU core and constant memory, about 3.5 M rows/s to a
/// plain file (10 M rows: ~3 s and ~490 MB of CSV, JSON Lines ~2.2x larger; --gzip writes
/// ~2.3x smaller files at about half the speed). Output is what `import` reads
/// (CSV header list,dimension,value,sandbox,expires_at,ttl_seconds,reason, or JSON Lines),
/// byte-identical for the same --seed, --now-ms and flags. Members are distinct per dimension,
/// IP ranges sit in 10.0.0.0/8 and 3fff::/20, and --non-members values are guaranteed to be
/// listed by no member (not even through a range), for false-positive tests. Expiries are
/// never shorter than one hour.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Member rows to write.
    #[arg(long, default_value_t = 1000)]
    pub rows: u64,
    /// Seed of the generator: the same seed, --now-ms and flags give the same bytes.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// Lists the rows are spread over (uniformly), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "black,grey")]
    pub lists: Vec<String>,
    /// Sandboxes the rows are spread over (uniformly), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "default,loan,pay")]
    pub sandboxes: Vec<String>,
    /// Weight of each dimension, `name=weight,...`; any name that is not built in (e.g.
    /// `merchant`) is a custom dimension with Chinese-character values.
    #[arg(long, default_value = DEFAULT_MIX)]
    pub mix: String,
    /// Share of ip member rows that are CIDR ranges (0..1).
    #[arg(long, default_value_t = 0.1)]
    pub cidr_share: f64,
    /// Share of ip rows that are IPv6 (0..1).
    #[arg(long, default_value_t = 0.3)]
    pub ipv6_share: f64,
    /// Weights of `never` (no expiry), `ttl` (ttl_seconds, 1 h..365 d) and `at` (expires_at,
    /// 1 h..365 d after --now-ms).
    #[arg(long, default_value = "never=20,ttl=60,at=20")]
    pub expiry_mix: String,
    /// Share of member rows with a `reason` (0..1).
    #[arg(long, default_value_t = 0.3)]
    pub reason_share: f64,
    /// Unix ms that `expires_at` values count from (default: now). Fix it for reproducible
    /// files; import the file within an hour of this time or early `expires_at` rows are past.
    #[arg(long)]
    pub now_ms: Option<i64>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Csv)]
    pub format: Format,
    /// Member file (default or `-`: stdout).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Gzip both output files.
    #[arg(long)]
    pub gzip: bool,
    /// Also write this file of values that no member lists (same format, no expiries).
    #[arg(long)]
    pub non_members: Option<PathBuf>,
    /// Rows of the --non-members file.
    #[arg(long, default_value_t = 100_000)]
    pub non_member_rows: u64,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

impl Default for Args {
    /// The command line's defaults (`namelist-tools gen` with no flags).
    fn default() -> Self {
        let cmd = <Args as clap::Args>::augment_args(clap::Command::new("gen"));
        let matches = cmd
            .try_get_matches_from(["gen"])
            .expect("gen's defaults parse");
        <Args as clap::FromArgMatches>::from_arg_matches(&matches).expect("gen's defaults parse")
    }
}

/// Output format of `gen` (and input format of `import`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// CSV with a header row.
    Csv,
    /// One JSON object per line.
    Jsonl,
}

/// What a run wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub rows: u64,
    pub non_members: u64,
    /// Member rows per dimension, in `--mix` order.
    pub per_dimension: Vec<(String, u64)>,
    /// Member rows that are IP ranges.
    pub ranges: u64,
    pub seconds: f64,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = (self.rows + self.non_members) as f64;
        write!(
            f,
            "gen: {} rows ({} ip ranges), {} non-members in {:.2} s ({:.0} rows/s)",
            self.rows,
            self.ranges,
            self.non_members,
            self.seconds,
            total / self.seconds.max(1e-9)
        )
    }
}

/// Expiry of a generated row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowExpiry {
    Never,
    TtlSeconds(u64),
    ExpiresAtMs(i64),
}

/// One generated row; borrows the generator until the next row.
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    pub list: &'a str,
    pub dimension: &'a Dimension,
    /// As written (not normalised): `+86 138-0000-0000`, `AA-BB-...`, `10.1.2.77/24`...
    pub value: &'a str,
    pub sandbox: &'a str,
    pub expiry: RowExpiry,
    pub reason: Option<&'static str>,
}

/// Writes the member file to `out` and, if given, the non-member file to `non_members`, as
/// `opts` says (`rows`, `format`, `gzip`, ...; `out`, `non_members` paths and `quiet` are the
/// CLI's business and ignored here, except that a progress bar is drawn on a terminal for
/// large runs unless `quiet`). Each writer is flushed at the end.
pub fn generate(
    opts: &Args,
    out: impl Write,
    non_members: Option<&mut dyn Write>,
) -> anyhow::Result<Summary> {
    let started = Instant::now();
    let mut generator = Generator::new(opts)?;
    let nm_rows = if non_members.is_some() {
        opts.non_member_rows
    } else {
        0
    };
    let progress = progress_bar(opts, opts.rows + nm_rows);

    let mut writer = RowWriter::new(out, opts.format, opts.gzip).context("writing the header")?;
    for i in 0..opts.rows {
        let row = generator.member()?;
        writer.row(&row).context("writing a row")?;
        if (i + 1) % PROGRESS_EVERY == 0 {
            progress.inc(PROGRESS_EVERY);
        }
    }
    writer.finish().context("finishing the member file")?;
    progress.set_position(opts.rows);

    if let Some(nm) = non_members {
        let mut writer =
            RowWriter::new(nm, opts.format, opts.gzip).context("writing the header")?;
        for i in 0..nm_rows {
            let row = generator.non_member()?;
            writer.row(&row).context("writing a non-member row")?;
            if (i + 1) % PROGRESS_EVERY == 0 {
                progress.inc(PROGRESS_EVERY);
            }
        }
        writer.finish().context("finishing the non-member file")?;
    }
    progress.finish_and_clear();

    Ok(Summary {
        rows: opts.rows,
        non_members: nm_rows,
        per_dimension: generator
            .dims
            .iter()
            .map(|d| (d.dimension.to_string(), d.members))
            .collect(),
        ranges: generator.ranges,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// `namelist-tools gen`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let out: Box<dyn Write> = match &args.out {
        Some(p) if p.as_os_str() != "-" => Box::new(BufWriter::with_capacity(
            1 << 20,
            File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        _ => Box::new(BufWriter::with_capacity(1 << 20, io::stdout().lock())),
    };
    let mut non_members = match &args.non_members {
        Some(p) => Some(BufWriter::with_capacity(
            1 << 20,
            File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => None,
    };
    let result = generate(
        &args,
        out,
        non_members.as_mut().map(|w| w as &mut dyn Write),
    );
    match result {
        Ok(summary) => {
            eprintln!("{summary}");
            Ok(())
        }
        // `gen | head`: the reader has what it wanted.
        Err(e) if is_broken_pipe(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
    })
}

fn progress_bar(opts: &Args, total: u64) -> ProgressBar {
    progress::bar(
        opts.quiet || total < PROGRESS_FROM,
        Some(total),
        "gen [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} rows ({per_sec}, eta {eta})",
    )
}

// ---------------------------------------------------------------------------------------------
// Writing rows

enum Encoder<W: Write> {
    Plain(W),
    Gzip(GzEncoder<W>),
}

impl<W: Write> Encoder<W> {
    fn new(w: W, gzip: bool) -> Self {
        if gzip {
            Encoder::Gzip(GzEncoder::new(w, Compression::fast()))
        } else {
            Encoder::Plain(w)
        }
    }

    fn finish(self) -> io::Result<()> {
        match self {
            Encoder::Plain(mut w) => w.flush(),
            Encoder::Gzip(g) => g.finish()?.flush(),
        }
    }
}

impl<W: Write> Write for Encoder<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Encoder::Plain(w) => w.write(buf),
            Encoder::Gzip(g) => g.write(buf),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Encoder::Plain(w) => w.write_all(buf),
            Encoder::Gzip(g) => g.write_all(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Encoder::Plain(w) => w.flush(),
            Encoder::Gzip(g) => g.flush(),
        }
    }
}

enum RowWriter<W: Write> {
    Csv(Box<csv::Writer<Encoder<W>>>),
    Jsonl(BufWriter<Encoder<W>>),
}

fn csv_io(e: csv::Error) -> io::Error {
    if let csv::ErrorKind::Io(_) = e.kind()
        && let csv::ErrorKind::Io(io) = e.into_kind()
    {
        return io;
    }
    // Only I/O errors can happen when writing fixed-width records.
    io::Error::other("CSV writer error")
}

impl<W: Write> RowWriter<W> {
    fn new(w: W, format: Format, gzip: bool) -> io::Result<Self> {
        let enc = Encoder::new(w, gzip);
        match format {
            Format::Csv => {
                let mut csv = csv::WriterBuilder::new()
                    .buffer_capacity(1 << 16)
                    .from_writer(enc);
                csv.write_record(HEADER).map_err(csv_io)?;
                Ok(RowWriter::Csv(Box::new(csv)))
            }
            Format::Jsonl => Ok(RowWriter::Jsonl(BufWriter::with_capacity(1 << 16, enc))),
        }
    }

    fn row(&mut self, row: &Row<'_>) -> io::Result<()> {
        let mut at_buf = [0u8; 20];
        let mut ttl_buf = [0u8; 20];
        let (at, ttl): (&[u8], &[u8]) = match row.expiry {
            RowExpiry::Never => (b"", b""),
            RowExpiry::TtlSeconds(s) => (b"", fmt_u64(s, &mut ttl_buf)),
            RowExpiry::ExpiresAtMs(ms) => (fmt_u64(ms.max(0) as u64, &mut at_buf), b""),
        };
        match self {
            RowWriter::Csv(w) => w
                .write_record([
                    row.list.as_bytes(),
                    row.dimension.as_str().as_bytes(),
                    row.value.as_bytes(),
                    row.sandbox.as_bytes(),
                    at,
                    ttl,
                    row.reason.unwrap_or("").as_bytes(),
                ])
                .map_err(csv_io),
            RowWriter::Jsonl(w) => {
                w.write_all(b"{\"list\":")?;
                json_str(w, row.list)?;
                w.write_all(b",\"dimension\":")?;
                json_str(w, row.dimension.as_str())?;
                w.write_all(b",\"value\":")?;
                json_str(w, row.value)?;
                w.write_all(b",\"sandbox\":")?;
                json_str(w, row.sandbox)?;
                if !at.is_empty() {
                    w.write_all(b",\"expires_at\":")?;
                    w.write_all(at)?;
                }
                if !ttl.is_empty() {
                    w.write_all(b",\"ttl_seconds\":")?;
                    w.write_all(ttl)?;
                }
                if let Some(reason) = row.reason {
                    w.write_all(b",\"reason\":")?;
                    json_str(w, reason)?;
                }
                w.write_all(b"}\n")
            }
        }
    }

    fn finish(self) -> io::Result<()> {
        let enc = match self {
            RowWriter::Csv(w) => w.into_inner().map_err(|e| e.into_error())?,
            RowWriter::Jsonl(w) => w.into_inner().map_err(|e| e.into_error())?,
        };
        enc.finish()
    }
}

/// Decimal digits of `n`, in the tail of `buf`.
fn fmt_u64(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// A JSON string literal.
fn json_str(w: &mut impl Write, s: &str) -> io::Result<()> {
    w.write_all(b"\"")?;
    if !s.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
        w.write_all(s.as_bytes())?;
    } else {
        for c in s.chars() {
            match c {
                '"' => w.write_all(b"\\\"")?,
                '\\' => w.write_all(b"\\\\")?,
                c if (c as u32) < 0x20 => write!(w, "\\u{:04x}", c as u32)?,
                c => {
                    let mut b = [0u8; 4];
                    w.write_all(c.encode_utf8(&mut b).as_bytes())?;
                }
            }
        }
    }
    w.write_all(b"\"")
}

// ---------------------------------------------------------------------------------------------
// Randomness and bijections

type Prng = Xoshiro256PlusPlus;

/// Uniform in `0..n` (n > 0), by widening multiply (bias below 2^-40 for our n).
fn below(rng: &mut Prng, n: u64) -> u64 {
    ((u128::from(rng.next_u64()) * u128::from(n)) >> 64) as u64
}

/// True with probability `p`.
fn chance(rng: &mut Prng, p: f64) -> bool {
    ((rng.next_u64() >> 11) as f64) * (1.0 / (1u64 << 53) as f64) < p
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A key for the permutation named `name` under `seed`: independent of the other dimensions,
/// so changing `--mix` does not reshuffle a dimension's values.
fn key_for(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let mut s = seed ^ h.rotate_left(29);
    splitmix(&mut s)
}

const ROUNDS: usize = 3;

/// A keyed bijection of `0..size`: rounds of xor, odd multiply and xorshift on the smallest
/// power-of-two domain holding `size`, cycle-walked back into range (under two steps on
/// average).
#[derive(Debug, Clone)]
struct Perm {
    size: u64,
    mask: u64,
    shift: u32,
    keys: [u64; ROUNDS],
    mults: [u64; ROUNDS],
}

impl Perm {
    fn new(size: u64, key: u64) -> Self {
        assert!(size > 0, "empty value space");
        let bits = 64 - (size - 1).leading_zeros();
        let mask = if bits == 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        let mut s = key;
        Self {
            size,
            mask,
            shift: (bits / 2).max(1),
            keys: std::array::from_fn(|_| splitmix(&mut s)),
            mults: std::array::from_fn(|_| splitmix(&mut s) | 1),
        }
    }

    #[inline]
    fn round(&self, mut x: u64) -> u64 {
        for r in 0..ROUNDS {
            x = (x ^ self.keys[r]) & self.mask;
            x = x.wrapping_mul(self.mults[r]) & self.mask;
            x ^= x >> self.shift;
        }
        x
    }

    #[inline]
    fn apply(&self, i: u64) -> u64 {
        debug_assert!(i < self.size);
        let mut x = self.round(i);
        while x >= self.size {
            x = self.round(x);
        }
        x
    }
}

/// The next indices of one value space, in permuted order.
#[derive(Debug, Clone)]
struct Seq {
    perm: Perm,
    next: u64,
}

impl Seq {
    fn new(size: u64, seed: u64, name: &str) -> Self {
        Self {
            perm: Perm::new(size, key_for(seed, name)),
            next: 0,
        }
    }

    fn has_next(&self) -> bool {
        self.next < self.perm.size
    }

    fn take(&mut self, what: &str) -> anyhow::Result<u64> {
        if !self.has_next() {
            bail!(
                "the {what} value space ({} values) is exhausted: ask for fewer rows or give {what} less weight",
                self.perm.size
            );
        }
        let v = self.perm.apply(self.next);
        self.next += 1;
        Ok(v)
    }
}

/// Weighted choice by cumulative weights.
#[derive(Debug, Clone)]
struct Picker {
    cum: Vec<u64>,
}

impl Picker {
    fn new(weights: impl IntoIterator<Item = u64>) -> Self {
        let mut total = 0u64;
        let cum = weights
            .into_iter()
            .map(|w| {
                total += w;
                total
            })
            .collect();
        Self { cum }
    }

    fn total(&self) -> u64 {
        self.cum.last().copied().unwrap_or(0)
    }

    fn pick(&self, rng: &mut Prng) -> usize {
        let r = below(rng, self.total());
        self.cum.partition_point(|&c| c <= r)
    }
}

// ---------------------------------------------------------------------------------------------
// Value spaces and their realistic spellings

const PHONE_SPACE: u64 = 7_000_000_000; // 1[3-9] + 9 digits
const IMEI_PREFIXES: [u64; 4] = [35, 86, 1, 49]; // reporting-body digits of real TACs
const IMEI_PER_PREFIX: u64 = 1_000_000_000_000; // 12 more digits before the Luhn digit
const MAC_OUIS: [[u8; 3]; 16] = [
    [0x00, 0xE0, 0xFC], // Huawei
    [0x48, 0x46, 0xFB], // Huawei
    [0x64, 0x09, 0x80], // Xiaomi
    [0x28, 0x6C, 0x07], // Xiaomi
    [0xF0, 0x18, 0x98], // Apple
    [0x3C, 0x07, 0x54], // Apple
    [0xA4, 0x5E, 0x60], // Apple
    [0x5C, 0x0A, 0x5B], // Samsung
    [0x00, 0x16, 0x32], // Samsung
    [0x50, 0xC7, 0xBF], // TP-Link
    [0xEC, 0x08, 0x6B], // TP-Link
    [0x2C, 0x5B, 0xB8], // OPPO
    [0x88, 0x6A, 0xB1], // vivo
    [0xD8, 0x63, 0x75], // Xiaomi
    [0xDA, 0xA1, 0x19], // randomised (locally administered)
    [0x9E, 0x3B, 0x2F], // randomised (locally administered)
];
const ID_REGIONS: [u32; 16] = [
    110101, 110105, 120101, 310101, 310115, 320102, 330106, 350203, 370202, 420106, 440103, 440106,
    440305, 500103, 510107, 610113,
];
/// 1950-01-01, in days since 1970-01-01.
const ID_FIRST_DAY: i64 = -7305;
/// Birth dates 1950-01-01 ..= 2007-12-31.
const ID_DAYS: u64 = 21_184;
const ID_WEIGHTS: [u32; 17] = [7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2];
const UID_SPACE: u64 = 9_000_000_000; // 10-digit numeric ids
const DEVICE_SPACE: u64 = u64::MAX;
const CUSTOM_SPACE: u64 = 10_000_000_000; // 10-digit unique suffix
/// Single IPv6 addresses: under these /20s (China Telecom, Unicom, Mobile, CERNET2).
const V6_SINGLE_PREFIXES: [u128; 4] = [0x240e0, 0x24088, 0x24098, 0x2402f];
/// IPv6 ranges: inside 3fff::/20.
const V6_RANGE_BLOCK: u128 = 0x3fff0;
/// IPv4 ranges: inside 10.0.0.0/8.
const V4_RANGE_BLOCK: u32 = 10;
const V4_RANGE_PREFIXES: [(u8, u64); 13] = [
    (16, 3),
    (17, 1),
    (18, 1),
    (19, 2),
    (20, 4),
    (21, 3),
    (22, 8),
    (23, 5),
    (24, 45),
    (25, 5),
    (26, 7),
    (27, 6),
    (28, 10),
];
const V6_RANGE_PREFIXES: [(u8, u64); 9] = [
    (32, 4),
    (36, 3),
    (40, 5),
    (44, 6),
    (48, 35),
    (52, 5),
    (56, 20),
    (60, 7),
    (64, 15),
];
const MERCHANT_BRANDS: &str =
    "华鑫达盛源泰恒信诚德福瑞祥隆兴安康乐美佳新金宏丰永汇嘉创天宇博通明阳光辉海云星";
const MERCHANT_TRADES: [&str; 16] = [
    "超市",
    "餐饮",
    "科技",
    "贸易",
    "便利店",
    "药房",
    "数码",
    "服饰",
    "物流",
    "网络",
    "文化",
    "传媒",
    "建材",
    "家居",
    "电器",
    "汽修",
];
const CJK_COMMON: &str = "张王李赵刘陈杨黄周吴徐孙马朱胡郭何林罗高北京上海广州深圳杭州成都南京武汉西安重庆天津苏州长沙郑州东南西中山水火木金土花园小大明华文";
const REASONS: [&str; 12] = [
    "chargeback",
    "欺诈交易",
    "盗卡",
    "账户盗用",
    "营销作弊 (薅羊毛)",
    "信用卡套现",
    "风控人工复核",
    "多头借贷",
    "设备农场",
    "代理IP",
    "manual review",
    "police notice",
];

const HEX_LOWER: &[u8; 16] = b"0123456789abcdef";
const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// Writes `n` as exactly `dst.len()` zero-padded decimal digits.
fn put_digits(dst: &mut [u8], mut n: u64) {
    for d in dst.iter_mut().rev() {
        *d = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

fn push_ascii(buf: &mut String, bytes: &[u8]) {
    buf.push_str(std::str::from_utf8(bytes).expect("ASCII"));
}

fn push_u64(buf: &mut String, n: u64) {
    let mut b = [0u8; 20];
    push_ascii(buf, fmt_u64(n, &mut b));
}

/// The Luhn check digit of `body` (ASCII digits), as used by IMEIs.
pub fn luhn_check_digit(body: &[u8]) -> u8 {
    let sum: u32 = body
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &c)| {
            let d = u32::from(c - b'0');
            if i % 2 == 0 {
                let d2 = d * 2;
                if d2 > 9 { d2 - 9 } else { d2 }
            } else {
                d
            }
        })
        .sum();
    b'0' + ((10 - sum % 10) % 10) as u8
}

/// The check character of a mainland resident id card (GB 11643) for its first 17 digits.
pub fn id_card_check_char(body: &[u8]) -> u8 {
    let sum: u32 = body
        .iter()
        .zip(ID_WEIGHTS)
        .map(|(&c, w)| u32::from(c - b'0') * w)
        .sum();
    b"10X98765432"[(sum % 11) as usize]
}

/// (year, month, day) of a day number since 1970-01-01 (proleptic Gregorian).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn write_phone(buf: &mut String, rng: &mut Prng, v: u64) {
    let mut d = [0u8; 11];
    d[0] = b'1';
    d[1] = b'3' + (v / 1_000_000_000) as u8;
    put_digits(&mut d[2..], v % 1_000_000_000);
    let (a, b, c) = (&d[..3], &d[3..7], &d[7..]);
    // plain, +86 3-4-4, 3 4 4, +86plain, +86 3 4 4, (+86) 3-4-4, 3-4-4
    const STYLES: [u64; 7] = [60, 12, 10, 10, 4, 2, 2];
    let mut r = below(rng, 100);
    let mut style = 0;
    while r >= STYLES[style] {
        r -= STYLES[style];
        style += 1;
    }
    let (prefix, sep) = match style {
        0 => ("", ""),
        1 => ("+86 ", "-"),
        2 => ("", " "),
        3 => ("+86", ""),
        4 => ("+86 ", " "),
        5 => ("(+86) ", "-"),
        _ => ("", "-"),
    };
    buf.push_str(prefix);
    push_ascii(buf, a);
    buf.push_str(sep);
    push_ascii(buf, b);
    buf.push_str(sep);
    push_ascii(buf, c);
}

fn write_imei(buf: &mut String, rng: &mut Prng, v: u64) {
    let mut d = [0u8; 15];
    put_digits(&mut d[..2], IMEI_PREFIXES[(v / IMEI_PER_PREFIX) as usize]);
    put_digits(&mut d[2..14], v % IMEI_PER_PREFIX);
    d[14] = luhn_check_digit(&d[..14]);
    if chance(rng, 0.1) {
        // The 2-6-6-1 grouping printed on boxes: 35-209900-176148-1.
        push_ascii(buf, &d[..2]);
        buf.push('-');
        push_ascii(buf, &d[2..8]);
        buf.push('-');
        push_ascii(buf, &d[8..14]);
        buf.push('-');
        push_ascii(buf, &d[14..]);
    } else {
        push_ascii(buf, &d);
    }
}

fn write_mac(buf: &mut String, rng: &mut Prng, v: u64) {
    let oui = MAC_OUIS[(v >> 24) as usize];
    let bytes = [
        oui[0],
        oui[1],
        oui[2],
        (v >> 16) as u8,
        (v >> 8) as u8,
        v as u8,
    ];
    let style = below(rng, 100);
    let (sep, group, hex) = match style {
        0..35 => (':', 1, HEX_LOWER),
        35..70 => ('-', 1, HEX_UPPER),
        70..85 => ('.', 2, HEX_LOWER),
        85..95 => (':', 1, HEX_UPPER),
        _ => ('\0', 6, HEX_UPPER),
    };
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 && i % group == 0 {
            buf.push(sep);
        }
        buf.push(hex[usize::from(b >> 4)] as char);
        buf.push(hex[usize::from(b & 15)] as char);
    }
}

fn write_id_card(buf: &mut String, rng: &mut Prng, v: u64) {
    let per_region = ID_DAYS * 1000;
    let region = ID_REGIONS[(v / per_region) as usize];
    let rem = v % per_region;
    let (y, m, day) = civil_from_days(ID_FIRST_DAY + (rem / 1000) as i64);
    let mut d = [0u8; 18];
    put_digits(&mut d[..6], u64::from(region));
    put_digits(&mut d[6..10], y as u64);
    put_digits(&mut d[10..12], u64::from(m));
    put_digits(&mut d[12..14], u64::from(day));
    put_digits(&mut d[14..17], rem % 1000);
    d[17] = id_card_check_char(&d[..17]);
    if d[17] == b'X' && chance(rng, 0.2) {
        d[17] = b'x';
    }
    push_ascii(buf, &d);
}

fn write_uid(buf: &mut String, v: u64) {
    push_u64(buf, 1_000_000_000 + v);
}

fn write_device(buf: &mut String, rng: &mut Prng, v: u64) {
    let nib = |x: u64, i: u32| ((x >> (60 - 4 * i)) & 15) as usize;
    if chance(rng, 0.55) {
        // Android ID: 16 lower-case hex digits.
        for i in 0..16 {
            buf.push(HEX_LOWER[nib(v, i)] as char);
        }
    } else {
        // IDFV-style upper-case UUID v4: the index's 16 nibbles at fixed places, random rest.
        let r = rng.next_u64();
        let mut h = [0u8; 32];
        for i in 0..12 {
            h[i as usize] = HEX_UPPER[nib(v, i)];
        }
        h[12] = b'4';
        for i in 0..3 {
            h[13 + i as usize] = HEX_UPPER[nib(r, i)];
        }
        h[16] = b"89AB"[nib(r, 3) & 3];
        for i in 0..3 {
            h[17 + i as usize] = HEX_UPPER[nib(r, 4 + i)];
        }
        for i in 0..4 {
            h[20 + i as usize] = HEX_UPPER[nib(v, 12 + i)];
        }
        for i in 0..8 {
            h[24 + i as usize] = HEX_UPPER[nib(r, 7 + i)];
        }
        push_ascii(buf, &h[..8]);
        buf.push('-');
        push_ascii(buf, &h[8..12]);
        buf.push('-');
        push_ascii(buf, &h[12..16]);
        buf.push('-');
        push_ascii(buf, &h[16..20]);
        buf.push('-');
        push_ascii(buf, &h[20..]);
    }
}

fn write_custom(buf: &mut String, rng: &mut Prng, v: u64, merchant: bool, cjk: &CjkPools) {
    if merchant {
        buf.push_str("商户-");
        for _ in 0..2 {
            buf.push(cjk.brands[below(rng, cjk.brands.len() as u64) as usize]);
        }
        buf.push_str(MERCHANT_TRADES[below(rng, MERCHANT_TRADES.len() as u64) as usize]);
    } else {
        for _ in 0..2 + below(rng, 3) {
            buf.push(cjk.common[below(rng, cjk.common.len() as u64) as usize]);
        }
    }
    // The unique part: no CJK character above is a digit or `-`, so it is unambiguous.
    buf.push('-');
    let mut d = [0u8; 10];
    put_digits(&mut d, v);
    push_ascii(buf, &d);
}

fn push_v4(buf: &mut String, a: u32) {
    for (i, o) in a.to_be_bytes().iter().enumerate() {
        if i > 0 {
            buf.push('.');
        }
        push_u64(buf, u64::from(*o));
    }
}

fn write_v4_single(buf: &mut String, rng: &mut Prng, v: u64, octets: &[u8]) {
    let a = (u32::from(octets[(v >> 24) as usize]) << 24) | (v as u32 & 0x00FF_FFFF);
    if chance(rng, 0.03) {
        buf.push_str("::ffff:");
    }
    push_v4(buf, a);
}

fn write_v6_single(buf: &mut String, rng: &mut Prng, v: u64) {
    let prefix = V6_SINGLE_PREFIXES[(v >> 60) as usize];
    let low = u128::from(v & ((1 << 60) - 1));
    let r = u128::from(rng.next_u64());
    let bits = (prefix << 108)
        | ((low >> 32) << 80) // 28 bits of the index under the /20
        | ((r & 0xFFFF) << 64) // random subnet
        | ((r >> 32) << 32) // random upper half of the interface id
        | (low & 0xFFFF_FFFF);
    let start = buf.len();
    write!(buf, "{}", Ipv6Addr::from(bits)).expect("writing to a String");
    if chance(rng, 0.15) {
        buf[start..].make_ascii_uppercase();
    }
}

/// Networks of one prefix length inside a range block.
#[derive(Debug, Clone)]
struct RangeClass {
    prefix: u8,
    seq: Seq,
}

#[derive(Debug, Clone)]
struct IpGen {
    v4_octets: Vec<u8>,
    v4: Seq,
    v6: Seq,
    v4_ranges: Vec<RangeClass>,
    v6_ranges: Vec<RangeClass>,
    v4_pick: Picker,
    v6_pick: Picker,
}

impl IpGen {
    fn new(seed: u64) -> Self {
        let v4_octets: Vec<u8> = (1..=223u8).filter(|&o| o != 10 && o != 127).collect();
        let classes = |block_bits: u8, table: &[(u8, u64)], fam: &str| -> Vec<RangeClass> {
            table
                .iter()
                .map(|&(prefix, _)| RangeClass {
                    prefix,
                    seq: Seq::new(
                        1u64 << (prefix - block_bits),
                        seed,
                        &format!("ip/{fam}/{prefix}"),
                    ),
                })
                .collect()
        };
        Self {
            v4: Seq::new((v4_octets.len() as u64) << 24, seed, "ip/v4"),
            v6: Seq::new((V6_SINGLE_PREFIXES.len() as u64) << 60, seed, "ip/v6"),
            v4_octets,
            v4_ranges: classes(8, &V4_RANGE_PREFIXES, "v4"),
            v6_ranges: classes(20, &V6_RANGE_PREFIXES, "v6"),
            v4_pick: Picker::new(V4_RANGE_PREFIXES.iter().map(|p| p.1)),
            v6_pick: Picker::new(V6_RANGE_PREFIXES.iter().map(|p| p.1)),
        }
    }

    fn single(&mut self, buf: &mut String, rng: &mut Prng, v6: bool) -> anyhow::Result<()> {
        if v6 {
            let v = self.v6.take("IPv6 address")?;
            write_v6_single(buf, rng, v);
        } else {
            let v = self.v4.take("IPv4 address")?;
            write_v4_single(buf, rng, v, &self.v4_octets);
        }
        Ok(())
    }

    /// A range, or `false` when every prefix length of the family is used up.
    fn range(&mut self, buf: &mut String, rng: &mut Prng, v6: bool) -> anyhow::Result<bool> {
        let (classes, pick) = if v6 {
            (&mut self.v6_ranges, &self.v6_pick)
        } else {
            (&mut self.v4_ranges, &self.v4_pick)
        };
        let first = pick.pick(rng);
        let n = classes.len();
        let Some(c) = (0..n)
            .map(|k| (first + k) % n)
            .find(|&c| classes[c].seq.has_next())
        else {
            return Ok(false);
        };
        let class = &mut classes[c];
        let prefix = class.prefix;
        let net = class.seq.take("IP range")?;
        let host_bits = chance(rng, 0.2);
        if v6 {
            let host_len = 128 - u32::from(prefix);
            let mut bits = (V6_RANGE_BLOCK << 108) | (u128::from(net) << host_len);
            if host_bits {
                let r = (u128::from(rng.next_u64()) << 64) | u128::from(rng.next_u64());
                bits |= r & ((1u128 << host_len) - 1);
            }
            write!(buf, "{}/{prefix}", Ipv6Addr::from(bits)).expect("writing to a String");
        } else {
            let host_len = 32 - u32::from(prefix);
            let mut bits = (V4_RANGE_BLOCK << 24) | ((net as u32) << host_len);
            if host_bits {
                bits |= rng.next_u32() & ((1u32 << host_len) - 1);
            }
            push_v4(buf, bits);
            buf.push('/');
            push_u64(buf, u64::from(prefix));
        }
        Ok(true)
    }
}

#[derive(Debug, Clone)]
enum Kind {
    Phone,
    IdCard,
    Imei,
    WifiMac,
    Uid,
    Device,
    Ip(Box<IpGen>),
    Custom { merchant: bool },
}

#[derive(Debug, Clone)]
struct DimGen {
    dimension: Dimension,
    kind: Kind,
    /// The value space of every kind but `Ip` (which keeps its own).
    seq: Seq,
    members: u64,
}

#[derive(Debug, Clone)]
struct CjkPools {
    brands: Vec<char>,
    common: Vec<char>,
}

fn parse_weights(flag: &str, spec: &str) -> anyhow::Result<Vec<(String, u64)>> {
    let mut out: Vec<(String, u64)> = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((name, weight)) = part.split_once('=') else {
            bail!("--{flag}: expected name=weight, got {part:?}");
        };
        let name = name.trim();
        let weight: u64 = weight
            .trim()
            .parse()
            .with_context(|| format!("--{flag}: bad weight in {part:?}"))?;
        ensure!(
            !out.iter().any(|(n, _)| n == name),
            "--{flag}: {name:?} appears twice"
        );
        out.push((name.to_owned(), weight));
    }
    ensure!(
        out.iter().any(|(_, w)| *w > 0),
        "--{flag}: at least one weight must be positive"
    );
    Ok(out)
}

fn check_share(flag: &str, v: f64) -> anyhow::Result<()> {
    ensure!(
        (0.0..=1.0).contains(&v),
        "--{flag} must be between 0 and 1, got {v}"
    );
    Ok(())
}

/// The row generator behind `generate`: all members first, then non-members.
pub struct Generator {
    rng: Prng,
    lists: Vec<String>,
    sandboxes: Vec<String>,
    dims: Vec<DimGen>,
    dim_pick: Picker,
    expiry_pick: Picker,
    cidr_share: f64,
    ipv6_share: f64,
    reason_share: f64,
    now_ms: i64,
    cjk: CjkPools,
    value: String,
    ranges: u64,
    in_non_members: bool,
}

impl Generator {
    pub fn new(opts: &Args) -> anyhow::Result<Self> {
        ensure!(!opts.lists.is_empty(), "--lists: give at least one list");
        ensure!(
            !opts.sandboxes.is_empty(),
            "--sandboxes: give at least one sandbox"
        );
        let lists = opts
            .lists
            .iter()
            .map(|l| ListName::try_from(l.trim().to_owned()).map(String::from))
            .collect::<Result<Vec<_>, _>>()
            .context("--lists")?;
        let sandboxes = opts
            .sandboxes
            .iter()
            .map(|s| Sandbox::try_from(s.trim().to_owned()).map(String::from))
            .collect::<Result<Vec<_>, _>>()
            .context("--sandboxes")?;
        check_share("cidr-share", opts.cidr_share)?;
        check_share("ipv6-share", opts.ipv6_share)?;
        check_share("reason-share", opts.reason_share)?;

        let mut dims = Vec::new();
        let mut weights = Vec::new();
        for (name, weight) in parse_weights("mix", &opts.mix)? {
            let dimension: Dimension = name.parse().context("--mix")?;
            if weight == 0 {
                continue;
            }
            let (kind, size) = match &dimension {
                Dimension::Phone => (Kind::Phone, PHONE_SPACE),
                Dimension::IdCard => (Kind::IdCard, ID_REGIONS.len() as u64 * ID_DAYS * 1000),
                Dimension::Imei => (Kind::Imei, IMEI_PREFIXES.len() as u64 * IMEI_PER_PREFIX),
                Dimension::WifiMac => (Kind::WifiMac, (MAC_OUIS.len() as u64) << 24),
                Dimension::Uid => (Kind::Uid, UID_SPACE),
                Dimension::Device => (Kind::Device, DEVICE_SPACE),
                Dimension::Ip => (Kind::Ip(Box::new(IpGen::new(opts.seed))), 1),
                Dimension::Custom(n) => (
                    Kind::Custom {
                        merchant: n.starts_with("merchant"),
                    },
                    CUSTOM_SPACE,
                ),
            };
            dims.push(DimGen {
                seq: Seq::new(size, opts.seed, dimension.as_str()),
                dimension,
                kind,
                members: 0,
            });
            weights.push(weight);
        }

        let mut expiry = [0u64; 3];
        for (name, weight) in parse_weights("expiry-mix", &opts.expiry_mix)? {
            let i = match name.as_str() {
                "never" => 0,
                "ttl" => 1,
                "at" => 2,
                other => bail!("--expiry-mix: unknown kind {other:?} (expected never, ttl, at)"),
            };
            expiry[i] = weight;
        }

        Ok(Self {
            rng: Prng::seed_from_u64(opts.seed),
            lists,
            sandboxes,
            dims,
            dim_pick: Picker::new(weights),
            expiry_pick: Picker::new(expiry),
            cidr_share: opts.cidr_share,
            ipv6_share: opts.ipv6_share,
            reason_share: opts.reason_share,
            now_ms: opts.now_ms.unwrap_or_else(now_ms),
            cjk: CjkPools {
                brands: MERCHANT_BRANDS.chars().collect(),
                common: CJK_COMMON.chars().collect(),
            },
            value: String::with_capacity(128),
            ranges: 0,
            in_non_members: false,
        })
    }

    /// The next member row.
    pub fn member(&mut self) -> anyhow::Result<Row<'_>> {
        ensure!(
            !self.in_non_members,
            "members must all be generated before the first non-member"
        );
        let (l, s, d) = self.place();
        self.value.clear();
        let rng = &mut self.rng;
        let dim = &mut self.dims[d];
        match &mut dim.kind {
            Kind::Ip(ip) => {
                let v6 = chance(rng, self.ipv6_share);
                let ranged = chance(rng, self.cidr_share) && ip.range(&mut self.value, rng, v6)?;
                if ranged {
                    self.ranges += 1;
                } else {
                    ip.single(&mut self.value, rng, v6)?;
                }
            }
            _ => {
                let v = dim.seq.take(dim.dimension.as_str())?;
                write_value(&mut self.value, rng, &dim.kind, v, &self.cjk);
            }
        }
        dim.members += 1;
        let expiry = match self.expiry_pick.pick(rng) {
            0 => RowExpiry::Never,
            1 => RowExpiry::TtlSeconds(
                MIN_EXPIRY_SECS + below(rng, MAX_EXPIRY_SECS - MIN_EXPIRY_SECS + 1),
            ),
            _ => RowExpiry::ExpiresAtMs(
                self.now_ms
                    + (MIN_EXPIRY_SECS * 1000
                        + below(rng, (MAX_EXPIRY_SECS - MIN_EXPIRY_SECS) * 1000 + 1))
                        as i64,
            ),
        };
        let reason = chance(rng, self.reason_share)
            .then(|| REASONS[below(rng, REASONS.len() as u64) as usize]);
        Ok(Row {
            list: &self.lists[l],
            dimension: &self.dims[d].dimension,
            value: &self.value,
            sandbox: &self.sandboxes[s],
            expiry,
            reason,
        })
    }

    /// The next non-member row: a single value (never a range) of a mixed-in dimension that no
    /// member row lists, in any list or sandbox, exactly or through a range.
    pub fn non_member(&mut self) -> anyhow::Result<Row<'_>> {
        self.in_non_members = true;
        let (l, s, d) = self.place();
        self.value.clear();
        let rng = &mut self.rng;
        let dim = &mut self.dims[d];
        match &mut dim.kind {
            Kind::Ip(ip) => {
                let v6 = chance(rng, self.ipv6_share);
                ip.single(&mut self.value, rng, v6)?;
            }
            _ => {
                let v = dim.seq.take(dim.dimension.as_str())?;
                write_value(&mut self.value, rng, &dim.kind, v, &self.cjk);
            }
        }
        Ok(Row {
            list: &self.lists[l],
            dimension: &self.dims[d].dimension,
            value: &self.value,
            sandbox: &self.sandboxes[s],
            expiry: RowExpiry::Never,
            reason: None,
        })
    }

    /// (list, sandbox, dimension) indices of the next row.
    fn place(&mut self) -> (usize, usize, usize) {
        let rng = &mut self.rng;
        let l = below(rng, self.lists.len() as u64) as usize;
        let s = below(rng, self.sandboxes.len() as u64) as usize;
        let d = self.dim_pick.pick(rng);
        (l, s, d)
    }
}

fn write_value(buf: &mut String, rng: &mut Prng, kind: &Kind, v: u64, cjk: &CjkPools) {
    match kind {
        Kind::Phone => write_phone(buf, rng, v),
        Kind::IdCard => write_id_card(buf, rng, v),
        Kind::Imei => write_imei(buf, rng, v),
        Kind::WifiMac => write_mac(buf, rng, v),
        Kind::Uid => write_uid(buf, v),
        Kind::Device => write_device(buf, rng, v),
        Kind::Custom { merchant } => write_custom(buf, rng, v, *merchant, cjk),
        Kind::Ip(_) => unreachable!("ip values are written by IpGen"),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};
    use std::io::Read;

    use super::*;
    use namelist::domain::{IpValue, Value};

    const NOW: i64 = 1_780_000_000_000;

    fn opts(rows: u64) -> Args {
        Args {
            rows,
            now_ms: Some(NOW),
            quiet: true,
            ..Args::default()
        }
    }

    fn members(opts: &Args) -> Vec<(String, Dimension, String, String, RowExpiry)> {
        let mut g = Generator::new(opts).unwrap();
        (0..opts.rows)
            .map(|_| {
                let r = g.member().unwrap();
                (
                    r.list.to_owned(),
                    r.dimension.clone(),
                    r.value.to_owned(),
                    r.sandbox.to_owned(),
                    r.expiry,
                )
            })
            .collect()
    }

    #[test]
    fn defaults_match_the_cli() {
        let a = Args::default();
        assert_eq!(a.rows, 1000);
        assert_eq!(a.seed, DEFAULT_SEED);
        assert_eq!(a.lists, ["black", "grey"]);
        assert_eq!(a.sandboxes, ["default", "loan", "pay"]);
        assert_eq!(a.mix, DEFAULT_MIX);
        assert_eq!(a.non_member_rows, 100_000);
        assert_eq!(a.format, Format::Csv);
    }

    #[test]
    fn luhn_and_id_card_check_digits() {
        assert_eq!(luhn_check_digit(b"49015420323751"), b'8');
        assert_eq!(luhn_check_digit(b"35209900176148"), b'1');
        assert_eq!(luhn_check_digit(b"0000000000000"), b'0');
        assert_eq!(id_card_check_char(b"11010519491231002"), b'X');
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(ID_FIRST_DAY), (1950, 1, 1));
        assert_eq!(civil_from_days(ID_FIRST_DAY + ID_DAYS as i64), (2008, 1, 1));
    }

    #[test]
    fn perm_is_a_bijection() {
        for size in [1u64, 2, 3, 7, 64, 100, 1000, 4097] {
            let p = Perm::new(size, key_for(7, "x"));
            let seen: HashSet<u64> = (0..size).map(|i| p.apply(i)).collect();
            assert_eq!(seen.len() as u64, size);
            assert!(seen.iter().all(|&v| v < size));
        }
    }

    #[test]
    fn every_value_normalises_and_looks_real() {
        let o = Args {
            mix: "phone=1,device=1,uid=1,imei=1,ip=3,wifi_mac=1,id_card=1,merchant=1,shop=1".into(),
            cidr_share: 0.3,
            ..opts(30_000)
        };
        let mut g = Generator::new(&o).unwrap();
        let mut seen = HashSet::new();
        let mut check = |d: &Dimension, raw: &str, member: bool| {
            let v = if member {
                Value::parse_entry(d, raw)
            } else {
                Value::parse_check(d, raw)
            }
            .unwrap_or_else(|e| panic!("{d} {raw:?}: {e}"));
            let n = v.to_string();
            match d {
                Dimension::Phone => {
                    let digits = n.strip_prefix("+86").unwrap_or(&n);
                    assert_eq!(digits.len(), 11, "{raw}");
                    assert!(
                        digits.starts_with('1') && (b'3'..=b'9').contains(&digits.as_bytes()[1])
                    );
                }
                Dimension::Imei => {
                    assert_eq!(n.len(), 15, "{raw}");
                    assert_eq!(luhn_check_digit(&n.as_bytes()[..14]), n.as_bytes()[14]);
                }
                Dimension::IdCard => {
                    assert_eq!(n.len(), 18, "{raw}");
                    assert_eq!(id_card_check_char(&n.as_bytes()[..17]), n.as_bytes()[17]);
                }
                Dimension::WifiMac => assert_eq!(n.len(), 17),
                Dimension::Ip => {
                    let ip = v.as_ip().unwrap();
                    if ip.is_range() {
                        let p = ip.prefix();
                        match ip.family() {
                            namelist::domain::IpFamily::V4 => assert!((16..=28).contains(&p)),
                            namelist::domain::IpFamily::V6 => assert!((32..=64).contains(&p)),
                        }
                    }
                }
                Dimension::Custom(_) => assert!(!n.is_ascii(), "{raw}"),
                _ => {}
            }
            seen.insert(d.clone());
        };
        for _ in 0..o.rows {
            let r = g.member().unwrap();
            check(r.dimension, r.value, true);
        }
        for _ in 0..10_000 {
            let r = g.non_member().unwrap();
            check(r.dimension, r.value, false);
        }
        // Every dimension came up.
        assert_eq!(seen.len(), 9);
    }

    #[test]
    fn members_are_distinct() {
        let o = Args {
            cidr_share: 0.5,
            ..opts(200_000)
        };
        let rows = members(&o);
        let mut distinct = HashSet::with_capacity(rows.len());
        for (_, d, raw, _, _) in &rows {
            let v = Value::parse_entry(d, raw).unwrap();
            // Distinct per dimension, whatever the list and sandbox.
            assert!(distinct.insert((d.clone(), v)), "{d} {raw:?} repeated");
        }
        assert_eq!(distinct.len(), 200_000);
    }

    #[test]
    fn non_members_are_never_listed() {
        let o = Args {
            mix: "ip=60,phone=10,imei=10,wifi_mac=10,merchant=10".into(),
            cidr_share: 0.5,
            non_member_rows: 60_000,
            ..opts(60_000)
        };
        let mut g = Generator::new(&o).unwrap();
        let mut listed = HashSet::new();
        let mut ranges: HashSet<IpValue> = HashSet::new();
        let mut singles = Vec::new();
        for _ in 0..o.rows {
            let r = g.member().unwrap();
            let v = Value::parse_entry(r.dimension, r.value).unwrap();
            if let Some(ip) = v.as_ip() {
                if ip.is_range() {
                    ranges.insert(*ip);
                } else {
                    singles.push(*ip);
                }
            }
            listed.insert((r.dimension.clone(), v));
        }
        assert!(ranges.len() > 10_000, "{}", ranges.len());
        let prefixes: HashSet<_> = ranges.iter().map(|r| (r.family(), r.prefix())).collect();
        let in_range = |ip: &IpValue| {
            prefixes
                .iter()
                .any(|&(f, p)| f == ip.family() && ranges.contains(&ip.within(p)))
        };
        // Single-address members stay out of the range blocks too.
        assert!(!singles.iter().any(in_range));
        for _ in 0..o.non_member_rows {
            let r = g.non_member().unwrap();
            let v = Value::parse_check(r.dimension, r.value).unwrap();
            assert!(
                !listed.contains(&(r.dimension.clone(), v.clone())),
                "{} {:?} is a member",
                r.dimension,
                r.value
            );
            if let Some(ip) = v.as_ip() {
                assert!(!in_range(ip), "{} is inside a member range", r.value);
            }
        }
        assert!(g.member().is_err(), "members after non-members");
    }

    #[test]
    fn expiries_are_at_least_an_hour() {
        let rows = members(&opts(50_000));
        let mut kinds = HashMap::new();
        for (.., e) in &rows {
            match *e {
                RowExpiry::Never => {}
                RowExpiry::TtlSeconds(s) => {
                    assert!((MIN_EXPIRY_SECS..=MAX_EXPIRY_SECS).contains(&s))
                }
                RowExpiry::ExpiresAtMs(at) => {
                    let after = (at - NOW) as u64;
                    assert!((MIN_EXPIRY_SECS * 1000..=MAX_EXPIRY_SECS * 1000).contains(&after))
                }
            }
            *kinds.entry(std::mem::discriminant(e)).or_insert(0u32) += 1;
        }
        assert_eq!(kinds.len(), 3);
    }

    fn run_to_vecs(o: &Args) -> (Vec<u8>, Vec<u8>, Summary) {
        let mut out = Vec::new();
        let mut nm = Vec::new();
        let s = generate(o, &mut out, Some(&mut nm)).unwrap();
        (out, nm, s)
    }

    #[test]
    fn deterministic_for_a_seed() {
        let o = Args {
            non_member_rows: 2_000,
            ..opts(5_000)
        };
        let (a, an, _) = run_to_vecs(&o);
        let (b, bn, _) = run_to_vecs(&o);
        assert_eq!(a, b);
        assert_eq!(an, bn);
        let (c, _, _) = run_to_vecs(&Args { seed: 1, ..o });
        assert_ne!(a, c);
    }

    #[test]
    fn csv_shape() {
        let o = Args {
            non_member_rows: 500,
            ..opts(2_000)
        };
        let (out, nm, summary) = run_to_vecs(&o);
        assert_eq!(summary.rows, 2_000);
        assert_eq!(summary.non_members, 500);
        assert_eq!(
            summary.per_dimension.iter().map(|d| d.1).sum::<u64>(),
            2_000
        );
        for (bytes, n, member) in [(&out, 2_000, true), (&nm, 500, false)] {
            let text = std::str::from_utf8(bytes).unwrap();
            assert_eq!(text.lines().next().unwrap(), CSV_HEADER);
            let mut rdr = csv::Reader::from_reader(bytes.as_slice());
            let mut count = 0;
            for rec in rdr.records() {
                let rec = rec.unwrap();
                assert_eq!(rec.len(), 7);
                ListName::try_from(rec[0].to_owned()).unwrap();
                Sandbox::try_from(rec[3].to_owned()).unwrap();
                let d: Dimension = rec[1].parse().unwrap();
                Value::parse_entry(&d, &rec[2]).unwrap();
                assert!(rec[4].is_empty() || rec[5].is_empty());
                if !member {
                    assert!(rec[4].is_empty() && rec[5].is_empty() && rec[6].is_empty());
                }
                count += 1;
            }
            assert_eq!(count, n);
        }
    }

    #[test]
    fn jsonl_and_gzip() {
        let o = Args {
            format: Format::Jsonl,
            gzip: true,
            non_member_rows: 300,
            ..opts(1_000)
        };
        let (out, nm, _) = run_to_vecs(&o);
        let plain = run_to_vecs(&Args {
            gzip: false,
            ..o.clone()
        });
        for (gz, plain, n) in [(out, plain.0, 1_000), (nm, plain.1, 300)] {
            let mut text = String::new();
            flate2::read::GzDecoder::new(gz.as_slice())
                .read_to_string(&mut text)
                .unwrap();
            assert_eq!(text.as_bytes(), plain.as_slice());
            assert_eq!(text.lines().count(), n);
            for line in text.lines() {
                let v: serde_json::Map<String, serde_json::Value> =
                    serde_json::from_str(line).unwrap();
                for k in v.keys() {
                    assert!(HEADER.contains(&k.as_str()), "{k}");
                }
                assert!(!(v.contains_key("expires_at") && v.contains_key("ttl_seconds")));
                let d: Dimension = v["dimension"].as_str().unwrap().parse().unwrap();
                Value::parse_entry(&d, v["value"].as_str().unwrap()).unwrap();
            }
        }
    }

    #[test]
    fn bad_flags_are_refused() {
        for o in [
            Args {
                mix: "phone=x".into(),
                ..opts(1)
            },
            Args {
                mix: "Phone=1".into(),
                ..opts(1)
            },
            Args {
                mix: "phone=0".into(),
                ..opts(1)
            },
            Args {
                mix: "phone=1,phone=2".into(),
                ..opts(1)
            },
            Args {
                expiry_mix: "soon=1".into(),
                ..opts(1)
            },
            Args {
                lists: vec!["Black".into()],
                ..opts(1)
            },
            Args {
                sandboxes: vec!["a b".into()],
                ..opts(1)
            },
            Args {
                cidr_share: 1.5,
                ..opts(1)
            },
        ] {
            assert!(Generator::new(&o).is_err(), "{o:?}");
        }
    }
}
