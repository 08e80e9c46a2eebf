//! The load generator: `oha` (found, or installed under `target/oha` once), else `wrk` with
//! `benches/load/wrk.lua` (unlimited-rate runs only); one run of either, and what it measured.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value as Json;

use crate::settings::{run, target_dir};

const WRK_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/load/wrk.lua");

pub(crate) enum Generator {
    Oha(PathBuf),
    Wrk(PathBuf),
}

/// What one generator run measured.
#[derive(Default, Clone)]
pub(crate) struct Measured {
    pub(crate) rps: f64,
    pub(crate) ok: u64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) p999_ms: f64,
    pub(crate) errors: u64,
    pub(crate) statuses: BTreeMap<String, u64>,
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

pub(crate) fn find_generator() -> Option<Generator> {
    if let Some(p) = std::env::var_os("NAMELIST_LOAD_OHA") {
        return Some(Generator::Oha(PathBuf::from(p)));
    }
    if let Some(p) = on_path("oha") {
        return Some(Generator::Oha(p));
    }
    let root = target_dir().join("oha");
    let local = root.join("bin").join("oha");
    if local.is_file() {
        return Some(Generator::Oha(local));
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!(
        "oha not found: installing it with `{cargo} install oha --locked --root {}` (once; ~10 minutes on 2 cores)",
        root.display()
    );
    let installed = Command::new(&cargo)
        .args(["install", "oha", "--locked", "--root"])
        .arg(&root)
        .status()
        .is_ok_and(|s| s.success());
    if installed && local.is_file() {
        return Some(Generator::Oha(local));
    }
    eprintln!("installing oha failed; falling back to wrk (unlimited-rate runs only)");
    on_path("wrk").map(Generator::Wrk)
}

impl Generator {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Generator::Oha(_) => "oha",
            Generator::Wrk(_) => "wrk",
        }
    }

    pub(crate) fn version(&self) -> String {
        let (bin, arg) = match self {
            Generator::Oha(p) => (p, "--version"),
            Generator::Wrk(p) => (p, "-v"),
        };
        Command::new(bin)
            .arg(arg)
            .output()
            .ok()
            .map(|o| {
                let mut s = String::from_utf8_lossy(&o.stdout).to_string();
                s.push_str(&String::from_utf8_lossy(&o.stderr));
                let first = s.lines().next().unwrap_or("");
                first
                    .split(" Copyright")
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_owned()
            })
            .unwrap_or_default()
    }

    pub(crate) fn fixed_rates(&self) -> bool {
        matches!(self, Generator::Oha(_))
    }

    /// POSTs random lines of `bodies` to `url` for `secs`, at `rate` checks/s or unlimited.
    pub(crate) fn run(
        &self,
        url: &str,
        bodies: &Path,
        rate: Option<u64>,
        secs: f64,
        connections: usize,
        threads: usize,
    ) -> Measured {
        match self {
            Generator::Oha(bin) => {
                let mut cmd = Command::new(bin);
                cmd.args(["--no-tui", "--output-format", "json", "-w"])
                    .arg("-z")
                    .arg(format!("{}ms", (secs * 1e3) as u64))
                    .arg("-c")
                    .arg(connections.to_string())
                    .arg("--worker-threads")
                    .arg(threads.to_string())
                    .args(["-m", "POST", "-H", "content-type: application/json", "-Z"])
                    .arg(bodies);
                if let Some(r) = rate {
                    cmd.arg("-q").arg(r.to_string()).arg("--latency-correction");
                }
                cmd.arg(url);
                let out: Json = serde_json::from_str(&run(&mut cmd)).expect("oha JSON output");
                let statuses: BTreeMap<String, u64> = out["statusCodeDistribution"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
                            .collect()
                    })
                    .unwrap_or_default();
                let transport: u64 = out["errorDistribution"]
                    .as_object()
                    .map(|m| m.values().filter_map(Json::as_u64).sum())
                    .unwrap_or(0);
                let ok = statuses.get("200").copied().unwrap_or(0);
                let non_ok: u64 = statuses
                    .iter()
                    .filter(|(k, _)| *k != "200")
                    .map(|(_, v)| v)
                    .sum();
                let total = out["summary"]["total"].as_f64().unwrap_or(secs);
                let p = |k: &str| out["latencyPercentiles"][k].as_f64().unwrap_or(0.0) * 1e3;
                Measured {
                    rps: ok as f64 / total,
                    ok,
                    p50_ms: p("p50"),
                    p99_ms: p("p99"),
                    p999_ms: p("p99.9"),
                    errors: non_ok + transport,
                    statuses,
                }
            }
            Generator::Wrk(bin) => {
                assert!(rate.is_none(), "wrk has no fixed-rate mode");
                let mut cmd = Command::new(bin);
                cmd.arg("-t")
                    .arg(threads.to_string())
                    .arg("-c")
                    .arg(connections.max(threads).to_string())
                    .arg("-d")
                    .arg(format!("{}s", secs.ceil() as u64))
                    .arg("-s")
                    .arg(WRK_SCRIPT)
                    .arg(url)
                    .arg("--")
                    .arg(bodies);
                let stdout = run(&mut cmd);
                let line = stdout
                    .lines()
                    .rev()
                    .find(|l| l.starts_with('{'))
                    .unwrap_or_else(|| panic!("no JSON line from wrk: {stdout}"));
                let out: Json = serde_json::from_str(line).expect("wrk script JSON");
                let n = |k: &str| out[k].as_u64().unwrap_or(0);
                let total = n("duration_us") as f64 / 1e6;
                let ok = n("requests").saturating_sub(n("non2xx"));
                Measured {
                    rps: ok as f64 / total.max(1e-3),
                    ok,
                    p50_ms: n("p50_us") as f64 / 1e3,
                    p99_ms: n("p99_us") as f64 / 1e3,
                    p999_ms: n("p999_us") as f64 / 1e3,
                    errors: n("non2xx") + n("errors"),
                    statuses: BTreeMap::new(),
                }
            }
        }
    }
}
