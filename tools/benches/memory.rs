//! The memory figure: what one entry costs in Redis in the bucketed listpack layout, against
//! the seed's one-string-key-per-entry layout.
//!
//! Starts its own `redis-server` (free port, no persistence, temporary directory), writes
//! `NAMELIST_BENCH_ENTRIES` (default 1,000,000) random entries with expiries spread over the
//! next 1-365 days through `Store::write` in batches of 10,000, then measures every bucket with
//! `namelist-tools audit`'s library function (SCAN, `MEMORY USAGE` summed; its table, with the
//! layout comparison of seed 004, is printed last). Then writes a 100,000-entry sample in the seed's layout
//! (`SET deviceHash-<list>-<64 hex>-<sandbox> <13-digit ms>`), measures it and deletes it.
//!
//! `cargo bench --bench memory` (needs `redis-server` on PATH or `$REDIS_SERVER`)

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[path = "../../tests/common/mod.rs"]
mod common;

use common::RedisServer;

use namelist::domain::{Dimension, Expiry, ListName, Sandbox, Value, now_ms};
use namelist::store::redis::{RedisOptions, RedisStore};
use namelist::store::{Deadline, EntryStore, Layout, StoreBase, WriteBatch};
use namelist_tools::audit;
use serde_json::json;

const PREFIX: &str = "mem:";
const DEFAULT_ENTRIES: u64 = 1_000_000;
const BATCH: usize = 10_000;
const SEED_SAMPLE: usize = 100_000;
const SEED_PATTERN: &str = "deviceHash-*";
const TARGET_BYTES_PER_ENTRY: f64 = 18.0;
const DAY_MS: u64 = 86_400_000;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// A deterministic splitmix64 stream.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn used_memory(conn: &mut redis::Connection) -> Res<u64> {
    let info: String = redis::cmd("INFO").arg("memory").query(conn)?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "INFO memory has no used_memory".into())
}

fn scan_keys(conn: &mut redis::Connection, pattern: &str) -> Res<Vec<String>> {
    let mut keys = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query(conn)?;
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    keys.sort();
    keys.dedup();
    Ok(keys)
}

/// `MEMORY USAGE key SAMPLES 0` of every key.
fn memory_usage(conn: &mut redis::Connection, keys: &[String]) -> Res<Vec<u64>> {
    let mut out = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(1000) {
        let mut pipe = redis::pipe();
        for k in chunk {
            pipe.cmd("MEMORY").arg("USAGE").arg(k).arg("SAMPLES").arg(0);
        }
        let sizes: Vec<Option<u64>> = pipe.query(conn)?;
        out.extend(sizes.into_iter().map(|s| s.unwrap_or(0)));
    }
    Ok(out)
}

/// jemalloc's size class for an allocation of `n` bytes (4 classes per doubling above 64 B).
fn jemalloc_class(n: u64) -> u64 {
    match n {
        0..=8 => 8,
        9..=64 => n.div_ceil(16) * 16,
        _ => {
            let spacing = (n - 1).next_power_of_two() / 8;
            n.div_ceil(spacing) * spacing
        }
    }
}

/// What the bucket layout should cost by construction: the listpack (7 B header and end
/// byte, 10 B per 64-bit field, 6 B per 32-bit expiry) rounded to its jemalloc class, plus the
/// robj (16 B), the key's sds (rounded) and the dict entry (24 B) `MEMORY USAGE` adds.
fn modelled_bucket_bytes(key: &str, fields: u64) -> (u64, u64, u64) {
    let payload = 7 + 16 * fields;
    let listpack = jemalloc_class(payload);
    // A key under 32 bytes is an sds with a 1-byte header (sdshdr5), else 3 (sdshdr8).
    let sds_header = if key.len() < 32 { 1 } else { 3 };
    let key_overhead = 16 + jemalloc_class(sds_header + key.len() as u64 + 1) + 24;
    (payload, listpack, key_overhead)
}

fn main() -> Res<()> {
    // `cargo bench` passes `--bench`; there is nothing to filter here.
    let n: u64 = match std::env::var("NAMELIST_BENCH_ENTRIES") {
        Ok(v) => v
            .trim()
            .replace('_', "")
            .parse()
            .map_err(|e| format!("NAMELIST_BENCH_ENTRIES={v:?}: {e}"))?,
        Err(_) => DEFAULT_ENTRIES,
    };
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = redis::Client::open(url.as_str())?.get_connection()?;
    let version: String = redis::cmd("INFO").arg("server").query(&mut conn)?;
    let version = version
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned();
    let allocator: String = redis::cmd("INFO").arg("memory").query(&mut conn)?;
    let allocator = allocator
        .lines()
        .find_map(|l| l.strip_prefix("mem_allocator:"))
        .unwrap_or("?")
        .trim()
        .to_owned();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let store = rt.block_on(RedisStore::open(RedisOptions {
        expected_entries: Some(n),
        default_expected_entries: n,
        response_timeout: Duration::from_secs(30),
        audit_max_len: 1,
        ..common::redis_options(url.clone(), PREFIX)
    }));
    let (store, report) = store?;
    for w in &report.warnings {
        eprintln!("WARNING: {w}");
    }
    let layout: Layout = store.layout().clone();
    let before = used_memory(&mut conn)?;

    // Write N random entries, expiring 1-365 days from now.
    let lists: [ListName; 2] = ["black".parse()?, "grey".parse()?];
    let sandboxes: [Sandbox; 2] = ["default".parse()?, "loan".parse()?];
    let dims = [Dimension::Phone, Dimension::Device, Dimension::Uid];
    let mut rng = Rng(0x5eed_0000_0000_0001);
    let now = now_ms();
    let started = Instant::now();
    let mut written: u64 = 0;
    while written < n {
        let size = (n - written).min(BATCH as u64) as usize;
        let mut entries = Vec::with_capacity(size);
        for _ in 0..size {
            let r = rng.next();
            let dim = &dims[(r % 3) as usize];
            let raw = match dim {
                Dimension::Phone => format!("1{}{:09}", 3 + (r >> 8) % 7, rng.below(1_000_000_000)),
                Dimension::Device => format!("dev-{:016x}", rng.next()),
                _ => format!("u{}", rng.next() >> 20),
            };
            let value = Value::parse_entry(dim, &raw)?;
            let list = &lists[((r >> 4) & 1) as usize];
            let sandbox = &sandboxes[((r >> 5) & 1) as usize];
            let expires = now + (DAY_MS + rng.below(364 * DAY_MS)) as i64;
            let code = Expiry::at_ms(expires, now)?.code();
            entries.push((layout.entry_key(list, dim, sandbox, &value), code));
        }
        rt.block_on(store.write(
            WriteBatch {
                entries,
                ..WriteBatch::default()
            },
            Deadline::after(Duration::from_secs(60)),
        ))?;
        written += size as u64;
    }
    let write_secs = started.elapsed().as_secs_f64();
    let _: i64 = redis::cmd("DEL").arg(layout.audit_key()).query(&mut conn)?;
    let after = used_memory(&mut conn)?;

    // Measure every bucket: `namelist-tools audit`'s walk (SCAN, then MEMORY USAGE, OBJECT
    // ENCODING, HLEN per bucket), with its layout comparison on a 10,000-entry sample.
    let audit_started = Instant::now();
    let report = rt.block_on(audit::audit(&store, &audit::Args::default()))?;
    let audit_secs = audit_started.elapsed().as_secs_f64();
    let encodings: BTreeMap<String, u64> = report
        .encodings
        .iter()
        .map(|(e, s)| (e.clone(), s.buckets))
        .collect();
    let entries = report.entries;
    let total = report.bytes;
    // Bucket keys differ in length by a few digits, all within one sds size class.
    let key = "x".repeat(report.key_name_bytes.round() as usize);
    let (mut payload, mut listpack, mut key_overhead) = (0u64, 0u64, 0u64);
    for (&f, &count) in &report.fill_counts {
        let (p, l, o) = modelled_bucket_bytes(&key, f);
        payload += p * count;
        listpack += l * count;
        key_overhead += o * count;
    }
    let modelled = listpack + key_overhead;
    let per = |b: u64| b as f64 / entries.max(1) as f64;
    let bytes_per_entry = per(total);

    // The seed's layout, for comparison: one string key per entry.
    let seed_before = used_memory(&mut conn)?;
    for start in (0..SEED_SAMPLE).step_by(BATCH) {
        let mut pipe = redis::pipe();
        for _ in start..(start + BATCH).min(SEED_SAMPLE) {
            let list = if rng.below(2) == 0 { "black" } else { "grey" };
            let sandbox = if rng.below(2) == 0 { "default" } else { "loan" };
            let hash = format!(
                "{:016x}{:016x}{:016x}{:016x}",
                rng.next(),
                rng.next(),
                rng.next(),
                rng.next()
            );
            let at = now as u64 + DAY_MS + rng.below(364 * DAY_MS);
            pipe.set(format!("deviceHash-{list}-{hash}-{sandbox}"), at)
                .ignore();
        }
        pipe.query::<()>(&mut conn)?;
    }
    let seed_after = used_memory(&mut conn)?;
    let seed_keys = scan_keys(&mut conn, SEED_PATTERN)?;
    let seed_total: u64 = memory_usage(&mut conn, &seed_keys)?.iter().sum();
    let seed_per = seed_total as f64 / seed_keys.len().max(1) as f64;
    for chunk in seed_keys.chunks(1000) {
        let _: i64 = redis::cmd("DEL").arg(chunk).query(&mut conn)?;
    }

    // Report.
    let enc_text = encodings
        .iter()
        .map(|(e, c)| format!("{e}={c}"))
        .collect::<Vec<_>>()
        .join(", ");
    let all_listpack = encodings.keys().all(|e| e == "listpack");
    println!();
    println!(
        "namelist memory benchmark (redis {version}, {allocator}, {write_secs:.1} s to write)"
    );
    println!("  {:<44} {:>14}", "entries written", n);
    println!("  {:<44} {:>14}", "entries stored (sum of HLEN)", entries);
    println!("  {:<44} {:>14}", "buckets", report.buckets);
    println!(
        "  {:<44} {:>14}",
        "bucket fill min / p50 / max",
        format!(
            "{} / {} / {}",
            report.fill.min, report.fill.p50, report.fill.max
        )
    );
    println!("  {:<44} {:>14}", "encodings", enc_text);
    println!("  {:<44} {:>14}", "MEMORY USAGE, all buckets (B)", total);
    println!(
        "  {:<44} {:>14.2}   (target <= {TARGET_BYTES_PER_ENTRY}: {})",
        "bytes per entry",
        bytes_per_entry,
        if bytes_per_entry <= TARGET_BYTES_PER_ENTRY {
            "met"
        } else {
            "MISSED"
        }
    );
    println!(
        "    {:<42} {:>14.2}",
        "of which listpack payload (16 B/entry + 7)",
        per(payload)
    );
    println!(
        "    {:<42} {:>14.2}",
        "of which jemalloc rounding (modelled)",
        per(listpack - payload)
    );
    println!(
        "    {:<42} {:>14.2}",
        "of which robj + key + dict entry (modelled)",
        per(key_overhead)
    );
    println!("    {:<42} {:>14.2}", "model total", per(modelled));
    println!(
        "  {:<44} {:>14}",
        "  measured - model (B)",
        total as i64 - modelled as i64
    );
    println!(
        "  {:<44} {:>14}",
        "used_memory before / after (B)",
        format!("{before} / {after}")
    );
    println!(
        "  {:<44} {:>14.2}",
        "used_memory delta per entry (B)",
        (after as f64 - before as f64) / entries.max(1) as f64
    );
    println!(
        "  seed layout, one string key per entry ({} keys):",
        seed_keys.len()
    );
    println!(
        "  {:<44} {:>14.2}",
        "  MEMORY USAGE bytes per entry", seed_per
    );
    println!(
        "  {:<44} {:>14.2}",
        "  used_memory delta per entry (B)",
        (seed_after as f64 - seed_before as f64) / seed_keys.len().max(1) as f64
    );
    println!(
        "  {:<44} {:>14.1}x",
        "  seed / bucketed",
        seed_per / bytes_per_entry
    );
    println!();
    println!(
        "{}",
        json!({
            "bench": "memory",
            "redis_version": version,
            "entries_written": n,
            "entries": entries,
            "buckets": report.buckets,
            "total_bytes": total,
            "bytes_per_entry": (bytes_per_entry * 100.0).round() / 100.0,
            "target_bytes_per_entry": TARGET_BYTES_PER_ENTRY,
            "fill_min": report.fill.min,
            "fill_p50": report.fill.p50,
            "fill_max": report.fill.max,
            "encodings": encodings,
            "all_listpack": all_listpack,
            "modelled_bytes": modelled,
            "used_memory_before": before,
            "used_memory_after": after,
            "seed_keys": seed_keys.len(),
            "seed_bytes_per_entry": (seed_per * 100.0).round() / 100.0,
            "write_seconds": (write_secs * 10.0).round() / 10.0,
            "audit_seconds": (audit_secs * 10.0).round() / 10.0,
        })
    );
    println!();
    println!("`namelist-tools audit` on this keyspace ({audit_secs:.1} s):");
    print!("{}", audit::render::table(&report));

    drop(store);
    drop(rt);
    drop(server);
    if !all_listpack {
        return Err(format!("not every bucket is a listpack: {enc_text}").into());
    }
    Ok(())
}
