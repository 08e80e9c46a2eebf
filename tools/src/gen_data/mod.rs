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
//! Phone segments (`--segment-share` of the phone rows) live under `12`, which no generated
//! phone (all `1[3-9]…`) starts with: `12` and 2–6 more digits and a `*`, written with or
//! without `+86`; each length has its own sequence, so segments are distinct. E-mail addresses
//! sit at a fixed pool of real providers' domains (`qq.com`, `163.com`, `gmail.com`, ...), and
//! e-mail domain entries (`--domain-share` of the email rows) under the reserved `.example`
//! top-level domain (`@d17.example`, `@mx.d17.example`, `@a.mx.d17.example`), so no address,
//! member or not, is at or below a member domain, and no non-member phone is in a segment.
//!
//! Expiries are never shorter than one hour (from `--now-ms`), so tests never see a generated
//! entry expire under them.
//!
//! ## Modules
//! `perm.rs`: the keyed bijections and weighted choices; `values.rs`: the value spaces and
//! their realistic spellings; `generator.rs`: [`Generator`], rows from `--mix` and the other
//! flags; `output.rs`: CSV or JSON Lines, optionally gzip.

mod generator;
mod output;
mod perm;
#[cfg(test)]
mod tests;
mod values;

use std::fmt;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use indicatif::ProgressBar;
use namelist::domain::Dimension;

pub use generator::Generator;
pub use values::{id_card_check_char, luhn_check_digit};

use crate::{StdoutClosed, progress};
use output::RowWriter;

/// The seed used when `--seed` is not given.
pub const DEFAULT_SEED: u64 = 20_240_601;
/// The default `--mix`.
pub const DEFAULT_MIX: &str =
    "phone=30,device=20,uid=15,imei=10,ip=10,wifi_mac=5,id_card=5,merchant=5";
/// The header of both output files (CSV): `import::COLUMNS` joined (the header test holds them
/// equal).
pub const CSV_HEADER: &str = "list,dimension,value,sandbox,expires_at,ttl_seconds,reason";

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
/// IP ranges sit in 10.0.0.0/8 and 3fff::/20, phone segments under 12 (--segment-share), e-mail
/// domain entries under .example (--domain-share), and --non-members values are guaranteed to
/// be listed by no member (not even through a range, segment or domain), for false-positive
/// tests. Expiries are never shorter than one hour.
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
    /// Share of phone member rows that are segments (`12345*`, `+86 1234*`) (0..1).
    #[arg(long, default_value_t = 0.0)]
    pub segment_share: f64,
    /// Share of email member rows that are domain entries (`@d17.example`) (0..1).
    #[arg(long, default_value_t = 0.0)]
    pub domain_share: f64,
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
    /// Member rows that are phone segments.
    pub segments: u64,
    /// Member rows that are e-mail domain entries.
    pub domains: u64,
    pub seconds: f64,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = (self.rows + self.non_members) as f64;
        write!(
            f,
            "gen: {} rows ({} ip ranges, {} phone segments, {} email domains), {} non-members in {:.2} s ({:.0} rows/s)",
            self.rows,
            self.ranges,
            self.segments,
            self.domains,
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
        segments: generator.segments,
        domains: generator.domains,
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
        // `gen | head`: the reader has what it wanted. (gen writes to files and stdout
        // only, so a broken pipe here is its reader's.)
        Err(e) if is_broken_pipe(&e) => Err(StdoutClosed.into()),
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
