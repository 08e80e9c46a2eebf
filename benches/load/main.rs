//! Load test of `POST /v1/check` on the real service over Redis: latency at fixed rates and the
//! maximum throughput, for a repeated-subject (hit) mix and a new-subject mix, with the local
//! tier complete (default settings), off, and at a budget 20x smaller than the keyspace,
//! next to a direct-Redis baseline (the same lookups as pipelined `HGET`s from a Rust client),
//! all in one run; plus Redis CPU per 1,000 checks, the tier's memory per entry and its
//! start-up load time.
//!
//! `cargo bench --bench load` (needs `redis-server` on PATH or `$REDIS_SERVER`). About 11
//! minutes after compiling with the defaults; the first run also installs `oha` (below).
//!
//! What it does:
//!
//! 1. Starts its own `redis-server` (free port, `--save "" --appendonly no`), has
//!    `namelist-tools` (built first by `cargo build --release -p namelist-tools`: it is the
//!    workspace's other package, so Cargo hands this bench no path to it) `gen` write `NAMELIST_LOAD_ENTRIES` (1,000,000) entries over the 7
//!    built-in dimensions (uid, phone, id_card, device, imei, wifi_mac, ip; 30 % of IPs are
//!    IPv6) in lists `black` and `grey`, sandbox `loan`, plus non-members (values listed
//!    nowhere), and loads them with `namelist-tools import`. Four IP ranges are then added
//!    through the API (`black`: a /16 and a /24; `grey`: a /24 and an IPv6 /48), so an IPv4
//!    subject costs 3 + 2 probes and an IPv6 one 1 + 2: a check is 17 (IPv4) or 15 (IPv6)
//!    lookups.
//! 2. Builds check bodies `{"sandbox": "loan", "lists": ["black", "grey"], "subjects": {7
//!    dimensions}}` from non-members, 10 % of them carrying one listed value (a member, or an
//!    address inside a listed range), so about one check in ten has hits.
//! 3. Starts the release `namelist` binary as a child process (`tests/common`'s
//!    `ServiceProcess`: only the variables below and `NAMELIST_LISTEN` in its environment):
//!    `NAMELIST_WORKERS` from `NAMELIST_LOAD_WORKERS` (2), `NAMELIST_CHECK_DEADLINE_MS=20`,
//!    `NAMELIST_LOG_FORMAT=json`, `RUST_LOG=warn`, everything else at its default, and waits
//!    for `/readyz`, the invalidation subscription and the local tier to finish loading (the
//!    time from spawning the process to a complete tier is the **start-up load time**; its
//!    resident memory once idle, against a tier-off instance's measured the same way (2 s
//!    after start-up, the least of 5 samples 200 ms apart), per entry, is the tier's **memory
//!    per entry**). Then, on that instance:
//!    * **hit mix**: 1,000 distinct subjects, each checked once first (every answer is
//!      verified: 200, `degraded: false`, hits exactly for the subjects carrying a listed
//!      value);
//!    * **new mix**: bodies drawn at random from 50,000 subjects never checked before (oha
//!      (`-Z`) picks a random line per request, so a subject may repeat within a run; with a
//!      complete tier a repeat costs exactly what a new subject costs: every lookup is a
//!      binary search in a bucket held locally, listed or not).
//!
//!    Then the new mix again on instances started with one knob changed each (printed in the
//!    mix's name): `new-off` (`NAMELIST_LOCAL_MEMORY_MB=0`: no tier, every lookup to Redis),
//!    `new-20x` (`NAMELIST_LOCAL_MEMORY_MB` = the complete tier's measured bytes / 20: a
//!    keyspace 20x larger than the budget, without loading 20M entries) and `new-cap1`
//!    (`NAMELIST_CACHE_CAPACITY=1`: the configuration that meant a one-entry cache before the
//!    tier; now a one-bucket tier).
//!
//!    Each mix runs at fixed rates (`oha -q R --latency-correction`, `NAMELIST_LOAD_SECS`
//!    (10) s each, after a 2 s warm-up), then at an unlimited rate (`-c 64`, 1.5 x as long):
//!    achieved checks/s, p50 / p99 / p99.9, errors (non-200 answers and transport errors),
//!    `degraded` answers (the service's own counter, so every answer is covered), the share
//!    of lookups answered locally (`namelist_cache_hits_total` against
//!    `namelist_cache_misses_total`), the CPU each process used, and **Redis CPU per 1,000
//!    checks** (`used_cpu_user + used_cpu_sys` from `INFO cpu` around the run, divided by
//!    the checks answered: the tier's background refresh is included). A sample of answers is
//!    verified after each mix. **Writes go on meanwhile**: during every run of the service,
//!    `NAMELIST_LOAD_WRITE_RATE` (50) upserts a second of 10 device entries each (never
//!    checked; sandbox `loan`, one-hour TTL) to list `grey` through the same service, as list operators do; each run's line
//!    is followed by what they got (acknowledged, refused, slowest).
//! 4. **direct-Redis baseline**, with the service stopped: the new mix's subjects turned into
//!    the exact keys a check reads (`Layout::entry_key` over 2 lists x 7 dimensions, plus one
//!    probe per registered prefix length of the address's family, read from the registries),
//!    each check one pipeline of `HGET`s on one multiplexed `ConnectionManager` (what the
//!    service uses), from 64 concurrent tasks (max), and open-loop at 5,000 checks/s.
//! 5. **Start-up load time at `NAMELIST_LOAD_STARTUP_ENTRIES`** (10,000,000; 0 skips): that
//!    many entries imported under another prefix, a service started on it with default
//!    settings, the time until its tier is complete, and its memory per entry (resident
//!    once idle, against a tier-off instance's on the same keyspace, as above). This is the
//!    headline memory figure when it is run: an instance's idle resident memory varies by
//!    ~2 MiB from start to start, ±2 B an entry at 1M entries but ±0.2 B at 10M.
//!
//! Before step 5, **velocity** (issue 27, the mix `velocity`): `benches/velocity_engine.sh`
//! with the same binary and `oha`, on its own `redis-server`: events/s and Redis CPU per
//! event with 5 metrics (from an empty keyspace, then a warm one) and 50, Redis's time per
//! command, `POST /v1/evaluate` max and p99 at 2,000/s, memory per (metric, entity) and per
//! event id at 1,000 events per entity; about 2.5 minutes. Its figures join the JSON line
//! (`velocity`) and the targets.
//!
//! Prints a table, the targets of issue 11 (met or not), then one JSON line.
//!
//! **The load generator shares the 2 cores** with the service and Redis (and the baseline's
//! client does too): oha runs with `NAMELIST_LOAD_GEN_THREADS` (1) worker thread and the
//! baseline's Tokio runtime with as many. The CPU columns show where the time went: the
//! service, Redis, and everything else (mostly the generator).
//!
//! The load generator is `oha` (crates.io): `$NAMELIST_LOAD_OHA`, else `oha` on PATH, else
//! `target/oha/bin/oha`, which is installed there (`cargo install oha --locked --root
//! target/oha`, ~10 minutes on 2 cores, once) when missing; it never touches `~/.cargo/bin`.
//! If that fails, `wrk` (Debian package) with `benches/load/wrk.lua` runs the unlimited-rate
//! runs only (wrk has no fixed-rate mode).
//!
//! Knobs: `NAMELIST_LOAD_SECS` (10), `NAMELIST_LOAD_ENTRIES` (1000000), `NAMELIST_LOAD_WORKERS`
//! (2; a list such as `1,2` runs every mix per count), `NAMELIST_LOAD_HIT_RATES`
//! (1000,5000,10000,20000), `NAMELIST_LOAD_NEW_RATES` (1000,2500,5000),
//! `NAMELIST_LOAD_BUDGET_FACTOR` (20), `NAMELIST_LOAD_STARTUP_ENTRIES` (10000000),
//! `NAMELIST_LOAD_WRITE_RATE` (50 upserts/s during every service run; 0: none),
//! `NAMELIST_LOAD_CONNECTIONS` (64), `NAMELIST_LOAD_GEN_THREADS` (1), `NAMELIST_LOAD_OHA`,
//! `NAMELIST_LOAD_MIXES` (all: `hit,new,new-off,new-20x,new-cap1,redis-direct,velocity`; a
//! subset runs only those, for a quicker look at one), `NAMELIST_LOAD_EXPECTED_ENTRIES` (= entries; sizes the keyspace: `ceil(n / 200)` buckets, so
//! a larger figure makes smaller buckets), `NAMELIST_LOAD_PERF=DIR` (`perf record -e cpu-clock
//! -g` of the service and of Redis during each run, into DIR; `perf report -i`).
//!
//! Where things are: `settings` (constants, knobs, small helpers), `data` (`gen` and
//! `import`, subjects, bodies), `service` (the service as a child process, answers verified),
//! `generator` (oha or wrk), `phase` (a mix's runs against one instance, writes meanwhile),
//! `cpu` (CPU accounting), `baseline` (the direct-Redis baseline), `report` (a row),
//! `velocity` (issue 27's figures, by `benches/velocity_engine.sh`); here,
//! `main` and the whole run (`bench`), the targets and the JSON line.

#[path = "../../tests/common/mod.rs"]
mod common;

mod baseline;
mod cpu;
mod data;
mod generator;
mod phase;
mod report;
mod service;
mod settings;
mod velocity;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::RedisServer;
use serde_json::{Value as Json, json};

use crate::baseline::{baseline, baseline_checks};
use crate::cpu::{CpuMark, clock_ticks, redis_cpu_seconds};
use crate::data::{load_keyspace, read_values, subjects, write_bodies};
use crate::generator::find_generator;
use crate::phase::Phase;
use crate::report::{Row, print_header};
use crate::service::{rss_without_tier, start_settled, verify};
use crate::settings::{
    BASELINE_RATE, DIMS, HIT_SUBJECTS, Knobs, LISTED_PCT, LISTS, NEW_SUBJECTS, PREFIX, RANGES, Rng,
    SAMPLE, SANDBOX,
};

fn main() {
    let knobs = Knobs::from_env();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(knobs.gen_threads)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(bench(knobs));
}

async fn bench(knobs: Knobs) {
    let generator = find_generator()
        .expect("no load generator: oha could not be installed and wrk is not on PATH");
    let tck = clock_ticks();
    let redis = RedisServer::start();
    let redis_url = redis.url();
    let redis_pid: u32 = {
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut redis.conn())
            .expect("INFO server");
        info.lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("redis process_id")
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("HTTP client");

    // Data: members into Redis, non-members for subjects.
    let setup = Instant::now();
    let outsiders_csv = dir.path().join("outsiders.csv");
    let outsider_rows = 8 * (HIT_SUBJECTS + NEW_SUBJECTS) as u64;
    let (members_csv, imported) = load_keyspace(
        &redis_url,
        dir.path(),
        knobs.entries,
        knobs.expected_entries,
        PREFIX,
        Some((&outsiders_csv, outsider_rows)),
    );
    let buckets: u64 = redis::cmd("HGET")
        .arg(format!("{PREFIX}meta"))
        .arg("buckets")
        .query(&mut redis.conn())
        .expect("the keyspace's bucket count");
    let members = read_values(&members_csv);
    let outsiders = read_values(&outsiders_csv);
    for d in DIMS {
        assert!(
            outsiders.get(d).is_some_and(|v| v.len() > 1_000) && members.contains_key(d),
            "gen wrote too few {d} values"
        );
    }
    let mut rng = Rng(7);
    let mut cursor = 0;
    let hit_subjects = subjects(HIT_SUBJECTS, &outsiders, &mut cursor, &members, &mut rng);
    let new_subjects = subjects(NEW_SUBJECTS, &outsiders, &mut cursor, &members, &mut rng);
    let hit_bodies = dir.path().join("hit.jsonl");
    let new_bodies = dir.path().join("new.jsonl");
    write_bodies(&hit_bodies, &hit_subjects);
    write_bodies(&new_bodies, &new_subjects);
    let body_bytes =
        std::fs::metadata(&new_bodies).map(|m| m.len()).unwrap_or(0) / NEW_SUBJECTS as u64;
    let entries = imported["entries_written"].as_u64().unwrap_or(0);

    println!();
    println!(
        "namelist load benchmark: {entries} entries imported ({} lists x 7 dimensions, sandbox {SANDBOX}; {buckets} buckets, \
         ~{} per bucket) + {} ranges; generator {} ({}), {} thread(s), -c {}; {} s per fixed rate, {} s unlimited; \
         writes meanwhile: {} upserts/s of 10 entries (NAMELIST_LOAD_WRITE_RATE); setup {:.1} s",
        LISTS.len(),
        knobs.entries / buckets.max(1),
        RANGES.len(),
        generator.name(),
        generator.version(),
        knobs.gen_threads,
        knobs.connections,
        knobs.secs,
        knobs.secs * 1.5,
        knobs.write_rate,
        setup.elapsed().as_secs_f64()
    );
    println!(
        "  bodies: {HIT_SUBJECTS} hit-mix subjects, {NEW_SUBJECTS} new-mix subjects (never checked before), ~{body_bytes} B each, \
         {LISTED_PCT} % carry a listed value; the generator shares the machine's {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    if !generator.fixed_rates() {
        println!("  (wrk: no fixed-rate mode, unlimited-rate runs only)");
    }

    let phase = Phase {
        knobs: &knobs,
        generator: &generator,
        http: &http,
        redis_pid,
        redis_url: &redis_url,
        tck,
    };
    let mut rows: Vec<Row> = Vec::new();
    let mut ranges_written = false;
    let mut sample_hits = Vec::new();
    let mut tier = json!({});
    for &workers in &knobs.workers {
        // Default settings: the tier holds the whole keyspace once loaded.
        let (service, load_secs, mode) =
            start_settled(&redis_url, workers, &[], dir.path(), &http).await;
        let rss_tier = service.idle_rss().await;
        let tier_bytes = service.metric(&http, "namelist_tier_bytes").await;
        println!(
            "  workers {workers}: default settings, tier {mode}, loaded {load_secs:.2} s after start, {tier_bytes:.0} B held \
             ({:.2} B/entry accounted), RSS {:.1} MiB",
            tier_bytes / entries.max(1) as f64,
            rss_tier as f64 / 1_048_576.0
        );
        let rss_off = rss_without_tier(&redis_url, workers, &[], dir.path(), &http).await;
        let rss_per_entry = resident_per_entry(rss_tier, rss_off, entries, tier_bytes);
        println!(
            "  resident memory once idle (2 s, least of 5 samples) with the tier {:.1} MiB, without {:.1} MiB: {} B per entry",
            rss_tier as f64 / 1_048_576.0,
            rss_off as f64 / 1_048_576.0,
            figure(rss_per_entry)
        );
        print_header();
        if !ranges_written {
            for (list, range) in RANGES {
                let res = http
                    .post(service.url(&format!("/v1/lists/{list}/entries")))
                    .json(&json!({"entries": [{"dimension": "ip", "value": range, "sandbox": SANDBOX}]}))
                    .send()
                    .await
                    .expect("writing a range");
                assert_eq!(res.status(), 200, "writing {range}");
            }
            ranges_written = true;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // Every hit-mix subject once: verified.
        let listed = verify(&http, &service, &hit_subjects, HIT_SUBJECTS).await;
        sample_hits.push(listed);
        let default_mixes = [
            ("hit", &hit_bodies, &hit_subjects, &knobs.hit_rates),
            ("new", &new_bodies, &new_subjects, &knobs.new_rates),
        ];
        for (mix, bodies, subjects, rates) in default_mixes {
            if knobs.runs(mix) {
                rows.extend(phase.mix(mix, workers, &service, bodies, rates).await);
                verify(&http, &service, subjects, SAMPLE).await;
            }
        }
        service.stop();

        // One knob changed each: no tier; a budget 20x smaller than the keyspace; the
        // configuration that was a one-entry cache.
        let budget_mb = tier_bytes / knobs.budget_factor / 1_048_576.0;
        let budget = format!("{budget_mb:.4}");
        let variants: [(&str, Vec<(&str, &str)>); 3] = [
            ("new-off", vec![("NAMELIST_LOCAL_MEMORY_MB", "0")]),
            (
                "new-20x",
                vec![("NAMELIST_LOCAL_MEMORY_MB", budget.as_str())],
            ),
            ("new-cap1", vec![("NAMELIST_CACHE_CAPACITY", "1")]),
        ];
        for (mix, extra) in variants.into_iter().filter(|(m, _)| knobs.runs(m)) {
            let (service, _, mode) =
                start_settled(&redis_url, workers, &extra, dir.path(), &http).await;
            let knob: Vec<String> = extra.iter().map(|(k, v)| format!("{k}={v}")).collect();
            println!("  {mix}: {} (tier {mode})", knob.join(" "));
            verify(&http, &service, &new_subjects, SAMPLE).await;
            rows.extend(
                phase
                    .mix(mix, workers, &service, &new_bodies, &knobs.new_rates)
                    .await,
            );
            verify(&http, &service, &new_subjects, SAMPLE).await;
            service.stop();
        }
        tier = json!({
            "load_secs_after_start": load_secs,
            "entries": entries,
            "bytes_accounted": tier_bytes,
            "bytes_per_entry_accounted": tier_bytes / entries.max(1) as f64,
            "rss_with_tier": rss_tier,
            "rss_without_tier": rss_off,
            "rss_bytes_per_entry": rss_per_entry,
            "budget_mb_20x": budget_mb,
        });
    }

    // Direct-Redis baseline, the service stopped.
    let checks = Arc::new(
        baseline_checks(&redis_url, &new_subjects)
            .await
            .expect("baseline keys"),
    );
    let lookups = checks.iter().map(Vec::len).sum::<usize>() as f64 / checks.len() as f64;
    let mut base_rows = Vec::new();
    let base_rates = if knobs.runs("redis-direct") {
        vec![Some(BASELINE_RATE), None]
    } else {
        Vec::new()
    };
    for rate in base_rates {
        let secs = if rate.is_some() {
            knobs.secs
        } else {
            knobs.secs * 1.5
        };
        let cpu = CpuMark::take(None, redis_pid);
        let redis_cpu = redis_cpu_seconds(&redis_url);
        let m = baseline(&redis_url, checks.clone(), rate, knobs.connections, secs)
            .await
            .expect("baseline run");
        let redis_cpu = redis_cpu_seconds(&redis_url) - redis_cpu;
        let row = Row {
            mix: "redis-direct".into(),
            workers: None,
            rate,
            redis_ms_per_1k: (m.ok > 0).then(|| redis_cpu * 1e6 / m.ok as f64),
            m,
            degraded: 0.0,
            refused: 0.0,
            cache_hit_pct: None,
            cpu: cpu.since(None, redis_pid, tck),
        };
        row.print();
        base_rows.push(row);
    }
    println!(
        "  (redis-direct: {lookups:.1} HGETs per check in one pipeline, one multiplexed connection, \
         {} tasks at max; its client is the 'gen' CPU)",
        knobs.connections
    );

    let velocity = if knobs.runs("velocity") {
        velocity::run(&generator, knobs.secs, dir.path())
    } else {
        Json::Null
    };

    // Start-up load time of a larger keyspace.
    let mut startup = Json::Null;
    if knobs.startup_entries > 0 {
        let big_prefix = "nlbig:";
        let started = Instant::now();
        let (_, big) = load_keyspace(
            &redis_url,
            dir.path(),
            knobs.startup_entries,
            knobs.startup_entries,
            big_prefix,
            None,
        );
        let setup_secs = started.elapsed().as_secs_f64();
        let big_entries = big["entries_written"].as_u64().unwrap_or(0);
        let (service, load_secs, mode) = start_settled(
            &redis_url,
            knobs.workers[0],
            &[("NAMELIST_KEY_PREFIX", big_prefix)],
            dir.path(),
            &http,
        )
        .await;
        let bytes = service.metric(&http, "namelist_tier_bytes").await;
        let rss = service.idle_rss().await;
        service.stop();
        let rss_off = rss_without_tier(
            &redis_url,
            knobs.workers[0],
            &[("NAMELIST_KEY_PREFIX", big_prefix)],
            dir.path(),
            &http,
        )
        .await;
        let rss_per_entry = resident_per_entry(rss, rss_off, big_entries, bytes);
        println!(
            "  start-up at {big_entries} entries (imported in {setup_secs:.1} s): tier {mode}, loaded {load_secs:.2} s after start, \
             {:.2} B/entry accounted; resident once idle {:.1} MiB, without the tier {:.1} MiB: {} B per entry",
            bytes / big_entries.max(1) as f64,
            rss as f64 / 1_048_576.0,
            rss_off as f64 / 1_048_576.0,
            figure(rss_per_entry)
        );
        startup = json!({"entries": big_entries, "mode": mode, "load_secs_after_start": load_secs,
                         "bytes_per_entry_accounted": bytes / big_entries.max(1) as f64, "rss": rss,
                         "rss_without_tier": rss_off, "rss_bytes_per_entry": rss_per_entry});
    }

    let base_max = base_rows.last().map(|r| r.m.rps).unwrap_or(0.0);
    let row_of = |mix: &str, rate: Option<u64>| {
        rows.iter()
            .filter(|r| r.mix == mix && r.rate == rate)
            .max_by(|a, b| a.m.rps.total_cmp(&b.m.rps))
    };
    // A mix not run has no maximum (0.0), and a target on it is "not measured".
    let max_of = |mix: &str| row_of(mix, None).map_or(0.0, |r| r.m.rps);
    let both = |a: f64, b: f64, ok: bool| (a > 0.0 && b > 0.0).then_some(ok);
    let p99_at = |mix: &str| row_of(mix, Some(5_000)).map(|r| r.m.p99_ms);
    let local_of = |mix: &str| row_of(mix, None).and_then(|r| r.cache_hit_pct);
    let redis_per_1k = |mix: &str| {
        rows.iter()
            .filter(|r| r.mix == mix)
            .filter_map(|r| r.redis_ms_per_1k.map(|v| (v, r.m.ok)))
            .fold((0.0, 0u64), |(s, n), (v, ok)| (s + v * ok as f64, n + ok))
    };
    let per_1k = |mix: &str| {
        let (sum, n) = redis_per_1k(mix);
        (n > 0).then(|| sum / n as f64)
    };
    let (hit_max, new_max) = (max_of("hit"), max_of("new"));
    let (off_max, small_max, cap1_max) = (max_of("new-off"), max_of("new-20x"), max_of("new-cap1"));
    let verdict = |ok: Option<bool>| match ok {
        Some(true) => "MET",
        Some(false) => "NOT MET",
        None => "not measured",
    };
    let t_new_p99 = p99_at("new").map(|p| p <= 1.0);
    let t_new_max = both(new_max, hit_max, new_max >= 0.8 * hit_max);
    let t_small_p99 = p99_at("new-20x").map(|p| p <= 2.0);
    let t_small_base = both(small_max, base_max, small_max >= base_max);
    let t_small_cap1 = both(small_max, cap1_max, small_max >= cap1_max);
    let (on_cpu, off_cpu) = (per_1k("new"), per_1k("new-off"));
    let cpu_ratio = match (on_cpu, off_cpu) {
        (Some(on), Some(off)) if on > 0.0 => Some(off / on),
        _ => None,
    };
    // The start-up run's figure when there is one: ten times the entries, a tenth the noise.
    let (bpe, bpe_at, accounted) = match startup["rss_bytes_per_entry"].as_f64() {
        Some(b) => (
            Some(b),
            startup["entries"].as_u64().unwrap_or(0),
            startup["bytes_per_entry_accounted"].as_f64(),
        ),
        None => (
            tier["rss_bytes_per_entry"].as_f64(),
            entries,
            tier["bytes_per_entry_accounted"].as_f64(),
        ),
    };
    println!();
    println!(
        "  maxima: hit {hit_max:.0}, new {new_max:.0} ({} hit), new-off {off_max:.0}, new-20x {small_max:.0} \
         ({} redis-direct, {} new-cap1), new-cap1 {cap1_max:.0}, redis-direct {base_max:.0}",
        ratio(new_max, hit_max),
        ratio(small_max, base_max),
        ratio(small_max, cap1_max)
    );
    println!(
        "  target new-subject p99 <= 1 ms at 5,000/s (complete tier): {} ({})",
        verdict(t_new_p99),
        p99_at("new")
            .map(|p| format!("{p:.3} ms"))
            .unwrap_or("-".into())
    );
    println!(
        "  target new-subject max >= 0.8x hit max: {} ({})",
        verdict(t_new_max),
        ratio(new_max, hit_max)
    );
    println!(
        "  target 20x budget: p99 <= 2 ms at 5,000/s: {} ({}); max >= 1.0x redis-direct: {} ({}); max >= new-cap1: {} ({})",
        verdict(t_small_p99),
        p99_at("new-20x")
            .map(|p| format!("{p:.3} ms"))
            .unwrap_or("-".into()),
        verdict(t_small_base),
        ratio(small_max, base_max),
        verdict(t_small_cap1),
        ratio(small_max, cap1_max)
    );
    // `NAMELIST_CACHE_CAPACITY=1` caps copies, not partial mode's filters, which its default
    // budget makes 10 bits an entry: what answered every lookup from Redis when the issue
    // set this target is `new-off` now.
    println!(
        "    (new-cap1 answers {} of lookups locally from filters in its default budget; against new-off, every lookup to Redis as the one-entry cache did: {})",
        local_of("new-cap1")
            .map(|p| format!("{p:.1} %"))
            .unwrap_or("-".into()),
        ratio(small_max, off_max)
    );
    println!(
        "  Redis CPU per 1,000 new-subject checks: tier off {} ms, complete tier {} ms: {} ({})",
        off_cpu.map(|v| format!("{v:.2}")).unwrap_or("-".into()),
        on_cpu.map(|v| format!("{v:.3}")).unwrap_or("-".into()),
        verdict(cpu_ratio.map(|r| r >= 10.0)),
        cpu_ratio
            .map(|r| format!("{r:.0}x less"))
            .unwrap_or("-".into())
    );
    println!(
        "  local memory per entry of the complete copy (resident, tier on - off, at {bpe_at} entries): {} ({} B; accounted {:.2} B)",
        verdict(bpe.map(|b| b <= 14.0)),
        figure(bpe),
        accounted.unwrap_or(0.0)
    );
    for (name, met, shown) in velocity::targets(&velocity) {
        println!("  target {name}: {} ({shown})", verdict(met));
    }
    println!(
        "{}",
        json!({
            "bench": "load",
            "generator": {"name": generator.name(), "version": generator.version(),
                          "threads": knobs.gen_threads, "connections": knobs.connections},
            "entries": entries,
            "buckets": buckets,
            "ranges": RANGES.len(),
            "secs_per_rate": knobs.secs,
            "lookups_per_check": lookups,
            "hit_subjects_verified_with_hits": sample_hits,
            "tier": tier,
            "startup": startup,
            "runs": rows.iter().map(Row::json).collect::<Vec<_>>(),
            "baseline": base_rows.iter().map(Row::json).collect::<Vec<_>>(),
            "redis_cpu_ms_per_1000": {"tier_off": off_cpu, "tier_complete": on_cpu, "ratio": cpu_ratio},
            "velocity": velocity,
            "targets": {
                "new_p99_le_1ms_at_5000": t_new_p99,
                "new_max_ge_0_8_hit_max": t_new_max,
                "budget_20x_p99_le_2ms_at_5000": t_small_p99,
                "budget_20x_max_ge_baseline": t_small_base,
                "budget_20x_max_ge_cap1": t_small_cap1,
                "redis_cpu_ratio_ge_10": cpu_ratio.map(|r| r >= 10.0),
                "bytes_per_entry_le_14": bpe.map(|b| b <= 14.0),
                "velocity": velocity::targets(&velocity).into_iter()
                    .map(|(name, met, _)| (name.to_owned(), json!(met)))
                    .collect::<serde_json::Map<_, _>>(),
            },
        })
    );
}

/// Least the tier must account for before its resident cost per entry is judged.
const RSS_MEASURABLE_BYTES: f64 = 8.0 * 1_048_576.0;

/// The tier's resident bytes per entry: the service's idle RSS with the tier less without,
/// over the entries. `None` when the tier accounts for under `RSS_MEASURABLE_BYTES` (idle
/// RSS moves by a few MiB between two starts of the same build, so below that the difference
/// is noise: at 1,000 entries it read 0 B, then 2,232 B, per entry), or when the two do not
/// differ: a target judged on such a figure would read "met" or "not met" for nothing
/// measured.
fn resident_per_entry(with_tier: u64, without: u64, entries: u64, accounted: f64) -> Option<f64> {
    (accounted >= RSS_MEASURABLE_BYTES && with_tier > without && entries > 0)
        .then(|| (with_tier - without) as f64 / entries as f64)
}

/// `a / b` as `1.23x`, or `-` when either mix did not run (its maximum is 0).
fn ratio(a: f64, b: f64) -> String {
    if a > 0.0 && b > 0.0 {
        format!("{:.2}x", a / b)
    } else {
        "-".into()
    }
}

/// A figure to two decimals, or `-` when there is none.
fn figure(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}"))
}
