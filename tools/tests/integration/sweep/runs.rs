//! How a sweep runs: resumed from its checkpoint (or `--cursor`) to the same end as one full
//! sweep, a dry run changing nothing, `--max-ops-per-sec` pacing its commands, the binary
//! printing one JSON line, and a timing of a million entries (ignored: run by hand).

use crate::common;

use std::time::Instant;

use common::RedisServer;
use namelist::domain::now_ms;
use namelist::store::StoreBase;
use namelist::store::expiry::EPOCH_2020_MS;
use namelist_tools::sweep::{self, Args, SweepReport};

use super::{
    DAY_MS, args_at, buckets, code_at, event_buckets, mix, open, remember_ids, sweep_time, tools,
    write,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_sweep_ends_where_one_full_sweep_does() {
    let now = now_ms();
    let t = sweep_time(now);
    let (full, stepped) = (RedisServer::start(), RedisServer::start());
    let mut stores = Vec::new();
    for redis in [&full, &stepped] {
        let store = open(redis, "r:", 20_000).await;
        let (entries, _) = mix(store.layout(), 12_000, t, now);
        write(&store, &entries).await;
        let layout = store.layout();
        remember_ids(&mut redis.conn(), layout, t, now, |h| {
            layout.event_bucket_key(h, None)
        });
        stores.push(store);
    }
    assert!(buckets(&full) == buckets(&stepped));
    assert!(event_buckets(&full) == event_buckets(&stepped));
    let one = sweep::sweep(&stores[0], &args_at(t)).await.unwrap();
    assert!(one.done && one.fields_reclaimed > 5_000);
    assert!(one.event_ids_deleted > 100);

    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("sweep.json");
    let args = Args {
        scan_count: 10,
        max_batches: Some(2),
        checkpoint: Some(checkpoint.clone()),
        // No checkpoint yet: a new sweep starts.
        resume: true,
        ..args_at(t)
    };
    let first = sweep::sweep(&stores[1], &args).await.unwrap();
    assert!(!first.done);
    assert_ne!(first.next_cursor, 0);
    assert_eq!(first.scan_batches, 2);
    assert!(first.fields_reclaimed < one.fields_reclaimed);
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&checkpoint).unwrap()).unwrap();
    assert_eq!(saved["report"]["next_cursor"], first.next_cursor);
    assert_eq!(saved["report"]["fields_reclaimed"], first.fields_reclaimed);

    // A checkpoint of another keyspace is refused, and left as it was.
    let other = open(&stepped, "zz:", 400).await;
    let err = sweep::sweep(&other, &args).await.unwrap_err();
    assert!(format!("{err:#}").contains("key prefix"), "{err:#}");
    let err = sweep::sweep(
        &stores[1],
        &Args {
            dry_run: true,
            ..args.clone()
        },
    )
    .await
    .unwrap_err();
    assert!(format!("{err:#}").contains("dry-run"), "{err:#}");
    let again: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&checkpoint).unwrap()).unwrap();
    assert_eq!(again, saved);

    let mut last = first;
    let mut runs = 1;
    while !last.done {
        let next = sweep::sweep(&stores[1], &args).await.unwrap();
        assert!(next.scan_batches <= last.scan_batches + 2);
        assert!(next.fields_reclaimed >= last.fields_reclaimed);
        last = next;
        runs += 1;
        assert!(runs < 100, "the resumed sweep never finished");
    }
    assert!(runs >= 3, "{runs} runs");
    assert!(
        !checkpoint.exists(),
        "a finished sweep removes its checkpoint"
    );
    assert!(buckets(&full) == buckets(&stepped));
    assert!(event_buckets(&full) == event_buckets(&stepped));
    let totals = |r: &SweepReport| {
        (
            r.buckets_scanned,
            r.fields_scanned,
            r.expired_found,
            r.fields_reclaimed,
            r.bytes_freed,
        )
    };
    assert_eq!(totals(&last), totals(&one));
    assert_eq!(event_totals(&last), event_totals(&one));

    // By hand: --cursor continues where a stopped run said. On new keyspaces: a store
    // never writes into one flushed under it (it is a lost keyspace).
    drop(stores);
    let mut stores = Vec::new();
    for redis in [&full, &stepped] {
        let _: () = redis::cmd("FLUSHALL").query(&mut redis.conn()).unwrap();
        stores.push(open(redis, "r:", 20_000).await);
    }
    for store in &stores {
        let (entries, _) = mix(store.layout(), 12_000, t, now);
        write(store, &entries).await;
    }
    sweep::sweep(&stores[0], &args_at(t)).await.unwrap();
    let mut cursor = None;
    loop {
        let r = sweep::sweep(
            &stores[1],
            &Args {
                cursor,
                scan_count: 10,
                max_batches: Some(3),
                ..args_at(t)
            },
        )
        .await
        .unwrap();
        if r.done {
            break;
        }
        cursor = Some(r.next_position.parse().unwrap());
    }
    assert!(buckets(&full) == buckets(&stepped));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_changes_nothing() {
    let redis = RedisServer::start();
    let store = open(&redis, "d:", 4_000).await;
    let now = now_ms();
    let t = sweep_time(now);
    let (entries, expired) = mix(store.layout(), 1_400, t, now);
    write(&store, &entries).await;
    let digest = redis.digest();
    let dry = Args {
        dry_run: true,
        ..args_at(t)
    };
    let report = sweep::sweep(&store, &dry).await.unwrap();
    assert_eq!(redis.digest(), digest);
    assert!(report.dry_run && report.done);
    assert_eq!(
        report.expired_found,
        expired.iter().filter(|&&g| g).count() as u64
    );
    assert_eq!((report.fields_reclaimed, report.bytes_freed), (0, 0));
    assert!(report.bytes_before > 0);
    assert_eq!(report.bytes_after, report.bytes_before);

    // A future --now-ms forecasts in a dry run, and is refused otherwise.
    let future = Args {
        now_ms: Some(now + 2 * DAY_MS),
        ..dry.clone()
    };
    let forecast = sweep::sweep(&store, &future).await.unwrap();
    assert_eq!(
        forecast.expired_found,
        entries.iter().filter(|(_, c)| *c != 0).count() as u64
    );
    let err = sweep::sweep(
        &store,
        &Args {
            dry_run: false,
            ..future
        },
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("in the future"), "{err}");
    assert_eq!(redis.digest(), digest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_ops_per_sec_paces_the_commands() {
    let redis = RedisServer::start();
    let store = open(&redis, "p:", 4_000).await;
    let now = now_ms();
    let t = sweep_time(now);
    let (entries, _) = mix(store.layout(), 700, t, now);
    write(&store, &entries).await;
    let rate = 40;
    let started = Instant::now();
    let report = sweep::sweep(
        &store,
        &Args {
            max_ops_per_sec: rate,
            ..args_at(t)
        },
    )
    .await
    .unwrap();
    let elapsed = started.elapsed().as_secs_f64();
    // 10 buckets with expired fields: 4 commands each, plus INFO, SCRIPT LOAD and SCANs.
    assert!(report.ops >= 42, "{}", report.ops);
    let floor = (report.ops - 1) as f64 / f64::from(rate);
    assert!(
        elapsed >= floor,
        "{} commands in {elapsed:.3} s: faster than {rate}/s",
        report.ops
    );
    assert!(
        elapsed < floor + 5.0,
        "{elapsed:.3} s for {floor:.3} s of pacing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_sweeps_and_prints_one_json_line() {
    let redis = RedisServer::start();
    let prefix = "bin:";
    let store = open(&redis, prefix, 4_000).await;
    let now = now_ms();
    let (entries, _) = mix(store.layout(), 1_400, sweep_time(now), now);
    write(&store, &entries).await;
    let expected = entries
        .iter()
        .filter(|(_, c)| *c != 0 && EPOCH_2020_MS + i64::from(*c) * 1000 <= now)
        .count() as u64;

    let out = tools()
        .args(["sweep", "--redis-url", &redis.url(), "--prefix", prefix])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["prefix"], prefix);
    assert_eq!(report["done"], true);
    assert_eq!(report["next_cursor"], 0);
    assert_eq!(report["fields_reclaimed"], expected);
    assert_eq!(report["expired_found"], expected);
    assert!(report["bytes_freed"].as_i64().unwrap() > 0);
    assert_eq!(report["event_ids_deleted"], 0, "no event ids: {report}");
    assert!(stderr.contains("fields reclaimed"), "{stderr}");
    assert!(stderr.contains("event ids deleted"), "{stderr}");

    let help = tools().args(["sweep", "--help"]).output().unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    for needle in ["Safe against a live store", "--max-ops-per-sec", "--resume"] {
        assert!(help.contains(needle), "{needle} not in {help}");
    }

    // CronJob semantics: no Redis, no report, a non-zero exit.
    let mut gone = RedisServer::start();
    let url = gone.url();
    tokio::task::block_in_place(|| gone.kill());
    let out = tools()
        .args(["sweep", "--redis-url", &url, "--prefix", prefix])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
}

/// A timing, not a check: `cargo test --release -p namelist-tools --test integration -- --ignored --nocapture sweep::runs::timing`.
/// 1,000,000 entries (5,000 buckets), 10% expired, swept unpaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn timing_a_million_entries() {
    let n: usize = std::env::var("NAMELIST_SWEEP_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let redis = RedisServer::start();
    let store = open(&redis, "big:", n as u64).await;
    let layout = store.layout().clone();
    let now = now_ms();
    let started = Instant::now();
    let mut expired = 0u64;
    let mut batch = Vec::with_capacity(10_000);
    for i in 0..n {
        // A splitmix-ish spread: 10% expired 1-30 days ago, the rest live for 1-365 days.
        let h = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
        let code = if h.is_multiple_of(10) {
            expired += 1;
            code_at(now - DAY_MS * (1 + (h / 10 % 30) as i64))
        } else {
            code_at(now + DAY_MS * (1 + (h / 10 % 365) as i64))
        };
        batch.push((layout.key_of(format!("bench {i}").as_bytes()), code));
        if batch.len() == 10_000 || i + 1 == n {
            write(&store, &batch).await;
            batch.clear();
        }
    }
    let write_secs = started.elapsed().as_secs_f64();
    let used = |redis: &RedisServer| -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query(&mut redis.conn())
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap()
    };
    let used_before = used(&redis);
    let report = sweep::sweep(
        &store,
        &Args {
            max_ops_per_sec: 0,
            ..Args::default()
        },
    )
    .await
    .unwrap();
    let used_after = used(&redis);
    assert_eq!(report.fields_reclaimed, expired);
    println!(
        "wrote {n} entries in {write_secs:.1} s; swept {} buckets / {} fields, {} expired reclaimed in {:.2} s ({} commands, {:.0} buckets/s); bytes freed {} (MEMORY USAGE), used_memory {} -> {}",
        report.buckets_scanned,
        report.fields_scanned,
        report.fields_reclaimed,
        report.seconds,
        report.ops,
        report.buckets_scanned as f64 / report.seconds,
        report.bytes_freed,
        used_before,
        used_after
    );
    println!("{}", report.table());
}

fn event_totals(r: &SweepReport) -> (u64, u64, u64, u64, i64) {
    (
        r.event_buckets_scanned,
        r.event_ids_scanned,
        r.event_ids_expired_found,
        r.event_ids_deleted,
        r.event_bytes_freed,
    )
}
