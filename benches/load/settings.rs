//! The harness's settings: the workload's constants (dimensions, lists, ranges, subject
//! counts), the knobs read from the environment (`NAMELIST_LOAD_*`, `Knobs`), and the small
//! helpers every part uses (a deterministic RNG, running a tool, percentiles, the target
//! directory).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub(crate) const DIMS: [&str; 7] = [
    "uid", "phone", "id_card", "device", "imei", "wifi_mac", "ip",
];
pub(crate) const LISTS: [&str; 2] = ["black", "grey"];
pub(crate) const SANDBOX: &str = "loan";
pub(crate) const PREFIX: &str = "nl:";
/// IP ranges added through the API: (list, range).
pub(crate) const RANGES: [(&str, &str); 4] = [
    ("black", "10.1.0.0/16"),
    ("black", "10.2.2.0/24"),
    ("grey", "10.3.3.0/24"),
    ("grey", "3fff:1:2::/48"),
];
pub(crate) const HIT_SUBJECTS: usize = 1_000;
pub(crate) const NEW_SUBJECTS: usize = 50_000;
/// Share of subjects carrying one listed value, in percent.
pub(crate) const LISTED_PCT: u64 = 10;
pub(crate) const WARMUP_SECS: f64 = 2.0;
pub(crate) const BASELINE_RATE: u64 = 5_000;
pub(crate) const SAMPLE: usize = 200;

pub(crate) type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

pub(crate) struct Knobs {
    pub(crate) secs: f64,
    pub(crate) entries: u64,
    pub(crate) expected_entries: u64,
    pub(crate) workers: Vec<usize>,
    pub(crate) hit_rates: Vec<u64>,
    pub(crate) new_rates: Vec<u64>,
    pub(crate) budget_factor: f64,
    pub(crate) startup_entries: u64,
    /// Upserts a second during every service run (`NAMELIST_LOAD_WRITE_RATE`).
    pub(crate) write_rate: u64,
    pub(crate) connections: usize,
    pub(crate) gen_threads: usize,
    pub(crate) perf_dir: Option<PathBuf>,
    /// Mixes to run (`NAMELIST_LOAD_MIXES`); the others are skipped and their targets "not
    /// measured".
    pub(crate) mixes: Vec<String>,
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

fn env_list(name: &str, default: &str) -> Vec<u64> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_owned())
        .split(',')
        .filter_map(|s| s.trim().replace('_', "").parse().ok())
        .collect()
}

impl Knobs {
    pub(crate) fn from_env() -> Self {
        let entries = env_u64("NAMELIST_LOAD_ENTRIES", 1_000_000).max(1_000);
        Self {
            secs: env_u64("NAMELIST_LOAD_SECS", 10).max(1) as f64,
            entries,
            expected_entries: env_u64("NAMELIST_LOAD_EXPECTED_ENTRIES", entries).max(1),
            workers: env_list("NAMELIST_LOAD_WORKERS", "2")
                .into_iter()
                .map(|w| w.max(1) as usize)
                .collect(),
            hit_rates: env_list("NAMELIST_LOAD_HIT_RATES", "1000,5000,10000,20000"),
            new_rates: env_list("NAMELIST_LOAD_NEW_RATES", "1000,2500,5000"),
            budget_factor: env_u64("NAMELIST_LOAD_BUDGET_FACTOR", 20).max(1) as f64,
            startup_entries: env_u64("NAMELIST_LOAD_STARTUP_ENTRIES", 10_000_000),
            write_rate: env_u64("NAMELIST_LOAD_WRITE_RATE", 50),
            connections: env_u64("NAMELIST_LOAD_CONNECTIONS", 64).max(1) as usize,
            gen_threads: env_u64("NAMELIST_LOAD_GEN_THREADS", 1).max(1) as usize,
            perf_dir: std::env::var_os("NAMELIST_LOAD_PERF").map(PathBuf::from),
            mixes: std::env::var("NAMELIST_LOAD_MIXES")
                .unwrap_or_else(|_| MIXES.join(","))
                .split(',')
                .map(|m| m.trim().to_owned())
                .filter(|m| !m.is_empty())
                .collect(),
        }
    }

    pub(crate) fn runs(&self, mix: &str) -> bool {
        self.mixes.iter().any(|m| m == mix)
    }
}

/// Every mix, in the order they run.
const MIXES: [&str; 7] = [
    "hit",
    "new",
    "new-off",
    "new-20x",
    "new-cap1",
    "redis-direct",
    "velocity",
];

/// A deterministic splitmix64 stream.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub(crate) fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("spawning a tool");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// Percentile of sorted durations, in milliseconds.
pub(crate) fn pct_ms(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

/// The target directory this bench was built in.
pub(crate) fn target_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            // target/<profile>/deps/load-<hash>
            let deps = exe.parent()?;
            (deps.file_name()? == "deps").then(|| deps.parent()?.parent().map(Path::to_path_buf))?
        })
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}
