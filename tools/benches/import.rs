//! The import rates: a 10,000,000-row CSV into a fresh keyspace (RESTORE path) and 1,000,000
//! more rows into its existing buckets (HSET path), next to `redis-benchmark`'s pipelined
//! multi-field HSET rate measured on the same server in the same run.
//!
//! `cargo bench --bench import` (needs `redis-server` and `redis-benchmark` on PATH).
//! `NAMELIST_BENCH_ROWS=n` changes the size of the first file (the second is a tenth of it);
//! `NAMELIST_BENCH_SANITIZE=yes` runs Redis with `--sanitize-dump-payload yes`.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use common::RedisServer;
use serde_json::{Value, json};

const TOOLS: &str = env!("CARGO_BIN_EXE_namelist-tools");

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("spawning a tool");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

fn gen_rows(rows: u64, seed: u64, out: &Path) -> f64 {
    let started = Instant::now();
    run(Command::new(TOOLS).args([
        "gen",
        "--rows",
        &rows.to_string(),
        "--seed",
        &seed.to_string(),
        "--quiet",
        "--out",
        out.to_str().unwrap(),
    ]));
    started.elapsed().as_secs_f64()
}

fn import(redis: &RedisServer, file: &Path, expected: u64) -> Value {
    let stdout = run(Command::new(TOOLS).args([
        "--redis-url",
        &redis.url(),
        "--fingerprint-key-file",
        common::key_file().to_str().unwrap(),
        "--prefix",
        "imp:",
        "--expected-entries",
        &expected.to_string(),
        "import",
        file.to_str().unwrap(),
        "--quiet",
        "--json",
    ]));
    serde_json::from_str(stdout.trim()).expect("import summary JSON")
}

/// `redis-benchmark` with 64-deep pipelines of `HSET <one of buckets keys> f v ×10`:
/// fields per second.
fn redis_benchmark(redis: &RedisServer, buckets: u64) -> f64 {
    let mut args: Vec<String> = [
        "-p",
        &redis.port.to_string(),
        "-n",
        "300000",
        "-P",
        "64",
        "-c",
        "4",
        "-r",
        &buckets.to_string(),
        "--csv",
        "HSET",
        "rb:b:__rand_int__",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for i in 0..10 {
        args.push("__rand_int__".into());
        args.push(format!("{}", 217_000_000 + i));
    }
    let out = run(Command::new("redis-benchmark").args(&args));
    // CSV: "test","rps",...
    let line = out.lines().last().expect("a result line");
    let rps: f64 = line
        .split(',')
        .nth(1)
        .map(|s| s.trim_matches('"'))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("unexpected redis-benchmark output: {out}"));
    rps * 10.0
}

fn main() {
    let rows: u64 = std::env::var("NAMELIST_BENCH_ROWS")
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(10_000_000);
    let sanitize = std::env::var("NAMELIST_BENCH_SANITIZE").is_ok_and(|v| v == "yes");
    let redis = if sanitize {
        RedisServer::start_with(&["--sanitize-dump-payload", "yes"])
    } else {
        RedisServer::start()
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let first = dir.path().join("first.csv");
    let second = dir.path().join("second.csv");
    let gen_secs = gen_rows(rows, 1, &first);
    gen_rows(rows / 10, 2, &second);
    let size = std::fs::metadata(&first).map(|m| m.len()).unwrap_or(0);

    let fresh = import(&redis, &first, rows);
    let incremental = import(&redis, &second, rows);
    let buckets = u64::from(namelist::store::Layout::buckets_for(rows));
    let bench_fields = redis_benchmark(&redis, buckets);

    let rate = |v: &Value| v["rows_per_sec"].as_f64().unwrap_or(0.0);
    let write_rate = |v: &Value| {
        v["entries_written"].as_f64().unwrap_or(0.0) / v["write_seconds"].as_f64().unwrap_or(1.0)
    };
    println!();
    println!(
        "namelist import benchmark: {rows} rows ({:.0} MB CSV, generated in {gen_secs:.1} s), sanitize-dump-payload {}",
        size as f64 / 1e6,
        if sanitize { "yes" } else { "no" }
    );
    println!(
        "  {:<46} {:>12} {:>12} {:>10} {:>10}",
        "path", "rows/s", "write f/s", "read s", "write s"
    );
    for (name, v) in [
        ("fresh keyspace (RESTORE new buckets)", &fresh),
        ("existing buckets (multi-field HSET)", &incremental),
    ] {
        println!(
            "  {:<46} {:>12.0} {:>12.0} {:>10.2} {:>10.2}",
            name,
            rate(v),
            write_rate(v),
            v["read_seconds"].as_f64().unwrap_or(0.0),
            v["write_seconds"].as_f64().unwrap_or(0.0)
        );
    }
    println!(
        "  {:<46} {:>12} {:>12.0}",
        "redis-benchmark HSET x10 fields, -P 64 -c 4", "", bench_fields
    );
    println!(
        "  ratio to redis-benchmark (write fields/s): RESTORE {:.1}x, HSET {:.2}x",
        write_rate(&fresh) / bench_fields,
        write_rate(&incremental) / bench_fields
    );
    println!(
        "{}",
        json!({
            "bench": "import",
            "rows": rows,
            "csv_bytes": size,
            "sanitize_dump_payload": sanitize,
            "fresh": fresh,
            "incremental": incremental,
            "redis_benchmark_hset_fields_per_sec": bench_fields,
            "restore_write_ratio": write_rate(&fresh) / bench_fields,
            "hset_write_ratio": write_rate(&incremental) / bench_fields,
        })
    );
}
