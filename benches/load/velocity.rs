//! Velocity at the engine's rate (issue 27), in the same run: `benches/velocity_engine.sh`
//! against the same release binary with the same `oha`, on its own `redis-server` (its
//! figures need an instance with its metrics defined and nothing else running). Its report
//! is printed as it goes; its figures (`VELOCITY_JSON`) go into the JSON line and the
//! targets. The mix `velocity` of `NAMELIST_LOAD_MIXES`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value as Json;

use crate::common::{redis_server_bin, service_bin};
use crate::data::tools_bin;
use crate::generator::Generator;

/// Runs the velocity bench for `secs` a run; its figures, or `Null` when it could not run.
pub(crate) fn run(generator: &Generator, secs: f64, dir: &Path) -> Json {
    let Generator::Oha(oha) = generator else {
        println!("  velocity: not measured (its runs at 2,000/s need oha)");
        return Json::Null;
    };
    println!();
    println!("velocity (benches/velocity_engine.sh, its own redis-server, the same binary):");
    let figures = dir.join("velocity.json");
    // The script runs `redis-server` and `redis-cli` from PATH: the ones this bench uses
    // (`$REDIS_SERVER`'s directory) come first.
    // (A bare `redis-server` has an empty parent, which in PATH would mean ".": left out.)
    let mut path: Vec<PathBuf> = redis_server_bin()
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .into_iter()
        .collect();
    path.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let path = std::env::join_paths(path).expect("PATH entries");
    let status = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/benches/velocity_engine.sh"
        ))
        .env("PATH", path)
        .env("OHA", oha)
        .env("BIN", service_bin())
        .env("TOOLS", tools_bin())
        .env("SECS", format!("{}", secs.round().max(1.0)))
        .env("VELOCITY_JSON", &figures)
        .status();
    let read = || -> Option<Json> { serde_json::from_slice(&std::fs::read(&figures).ok()?).ok() };
    match status {
        Ok(s) if s.success() => read().unwrap_or_else(|| {
            println!("  velocity: the bench wrote no figures");
            Json::Null
        }),
        other => {
            println!("  velocity: the bench failed ({other:?})");
            Json::Null
        }
    }
}

/// The targets of issue 27 on the figures: (name, met, the figure as printed).
pub(crate) fn targets(v: &Json) -> Vec<(&'static str, Option<bool>, String)> {
    // Judged in service (the warm run: entities seen, event-id buckets at their designed
    // fill), which costs more than the empty keyspace of the first run; both are shown.
    let cold = v["events"]["5-metrics"]["redis_us_per_event"].as_f64();
    let redis = v["events"]["5-metrics-warm"]["redis_us_per_event"]
        .as_f64()
        .or(cold);
    let ratio = v["events_over_check"].as_f64();
    let p99 = v["runs"]["evaluate-2000qps"]["p99_ms"].as_f64();
    let id = v["id_bytes"].as_f64();
    let show = |x: Option<f64>, unit: &str| x.map_or("-".into(), |x| format!("{x:.2}{unit}"));
    vec![
        (
            "velocity: Redis CPU per event, 5 metrics <= 30 us",
            redis.map(|x| x <= 30.0),
            format!(
                "{} in service; {} from an empty keyspace",
                show(redis, " us"),
                show(cold, " us")
            ),
        ),
        (
            "velocity: events max >= 0.6x check max",
            ratio.map(|x| x >= 0.6),
            show(ratio, "x"),
        ),
        (
            "velocity: evaluate p99 <= 1.5 ms at 2,000/s",
            p99.map(|x| x <= 1.5),
            show(p99, " ms"),
        ),
        (
            "velocity: memory per event id <= 24 B",
            id.map(|x| x <= 24.0),
            show(id, " B"),
        ),
    ]
}
