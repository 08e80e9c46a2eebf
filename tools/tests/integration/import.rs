//! `namelist-tools import` against real `redis-server`s that sanitise every RESTORE payload
//! (`--sanitize-dump-payload yes`): the RESTORE path builds exactly what HSET would, incremental
//! imports, bad rows, dry runs, kill -9 and --resume, and running services seeing the import.

// The root's test helpers (redis-server on free ports, local clusters, the app on port 0),
// shared by path rather than copied.
use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{RedisServer, redis_settings, spawn_app};
use namelist::domain::{Dimension, Expiry, ListName, Sandbox, Value, now_ms};
use namelist::store::Layout;
use namelist_tools::import::{Args, import};
use serde_json::json;

const TOOLS: &str = env!("CARGO_BIN_EXE_namelist-tools");

fn sanitising() -> RedisServer {
    RedisServer::start_with(&["--sanitize-dump-payload", "yes"])
}

async fn open(
    redis: &RedisServer,
    prefix: &str,
    expected: u64,
) -> namelist::store::redis::RedisStore {
    let (store, _) =
        namelist::store::redis::RedisStore::open(namelist::store::redis::RedisOptions {
            expected_entries: Some(expected),
            default_expected_entries: expected,
            response_timeout: Duration::from_secs(30),
            ..common::redis_options(redis.url(), prefix)
        })
        .await
        .unwrap();
    store
}

/// Rows of a test file: (list, dimension, value, sandbox, ttl_seconds). Different salts give
/// different values.
fn rows(n: usize, salt: &str) -> Vec<(String, String, String, String, Option<u64>)> {
    let s = u64::from(salt.as_bytes()[0]);
    (0..n)
        .map(|i| {
            let list = if i % 3 == 0 { "grey" } else { "black" };
            let sandbox = if i % 2 == 0 { "default" } else { "loan" };
            let (dim, value) = match i % 4 {
                0 => ("uid", format!("u-{salt}-{i}")),
                1 => ("device", format!("d-{salt}-{i:08x}")),
                2 => (
                    "phone",
                    format!(
                        "+86 1{:02}-{:04}-{:04}",
                        30 + s % 70,
                        i / 10_000,
                        i % 10_000
                    ),
                ),
                _ => (
                    "ip",
                    format!(
                        "{}.{}.{}.{}",
                        11 + s % 100,
                        (i >> 16) & 255,
                        (i >> 8) & 255,
                        i & 255
                    ),
                ),
            };
            let ttl = (i % 5 != 0).then_some(3600 + (i as u64 % 1000) * 60);
            (list.into(), dim.into(), value, sandbox.into(), ttl)
        })
        .collect()
}

fn write_csv(path: &Path, rows: &[(String, String, String, String, Option<u64>)]) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    writeln!(f, "list,dimension,value,sandbox,ttl_seconds,reason").unwrap();
    for (l, d, v, s, t) in rows {
        writeln!(
            f,
            "{l},{d},\"{v}\",{s},{},bulk",
            t.map(|t| t.to_string()).unwrap_or_default()
        )
        .unwrap();
    }
}

/// The same rows with absolute expiries (`expires_at`), so two runs at different times write
/// the same codes.
fn write_csv_absolute(path: &Path, rows: &[(String, String, String, String, Option<u64>)]) {
    let base = now_ms();
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    writeln!(f, "list,dimension,value,sandbox,expires_at").unwrap();
    for (l, d, v, s, t) in rows {
        let at = t
            .map(|t| (base + t as i64 * 1000).to_string())
            .unwrap_or_default();
        writeln!(f, "{l},{d},\"{v}\",{s},{at}").unwrap();
    }
}

/// Asserts two keyspaces hold the same buckets, without printing them whole.
fn assert_same_buckets(
    a: &BTreeMap<u32, BTreeMap<i64, u32>>,
    b: &BTreeMap<u32, BTreeMap<i64, u32>>,
    what: &str,
) {
    let differing: Vec<&u32> = a
        .keys()
        .chain(b.keys())
        .filter(|k| a.get(k) != b.get(k))
        .collect();
    assert!(
        differing.is_empty(),
        "{what}: {} buckets differ, e.g. {:?}",
        differing.len(),
        &differing[..differing.len().min(5)]
    );
}

/// Every field of every bucket under `prefix`, by bucket number.
fn dump_buckets(redis: &RedisServer, prefix: &str) -> BTreeMap<u32, BTreeMap<i64, u32>> {
    let mut conn = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}b:*"))
        .query(&mut conn)
        .unwrap();
    keys.into_iter()
        .map(|k| {
            let n: u32 = k.rsplit(':').next().unwrap().parse().unwrap();
            let all: HashMap<i64, u32> = redis::cmd("HGETALL").arg(&k).query(&mut conn).unwrap();
            (n, all.into_iter().collect())
        })
        .collect()
}

fn encodings(redis: &RedisServer, prefix: &str) -> BTreeMap<String, usize> {
    let mut conn = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}b:*"))
        .query(&mut conn)
        .unwrap();
    let mut out = BTreeMap::new();
    for k in keys {
        let e: String = redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg(&k)
            .query(&mut conn)
            .unwrap();
        *out.entry(e).or_default() += 1;
    }
    out
}

fn key_of(layout: &Layout, list: &str, dim: &str, value: &str, sandbox: &str) -> (u32, i64) {
    let d: Dimension = dim.parse().unwrap();
    let v = Value::parse_entry(&d, value).unwrap();
    let l: ListName = list.parse().unwrap();
    let s: Sandbox = sandbox.parse().unwrap();
    let k = layout.entry_key(&l, &d, &s, &v);
    (k.bucket, k.field)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_builds_what_hset_would() {
    let redis = sanitising();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rows.csv");
    let rows = rows(20_000, "r");
    write_csv_absolute(&file, &rows);

    let restored = open(&redis, "r:", 10_000).await;
    let a = import(
        Some(&restored),
        restored_layout(&restored),
        &Args::for_file(&file),
    )
    .await
    .unwrap();
    assert!(
        a.restore_used,
        "the RESTORE path proved itself on this server"
    );
    assert_eq!(
        (a.rows_read, a.rows_rejected, a.entries_written),
        (20_000, 0, 20_000)
    );
    assert_eq!(a.buckets_restored, 50, "every bucket was new: all RESTOREd");
    assert_eq!(a.buckets_hset, 0);

    let hset = open(&redis, "h:", 10_000).await;
    let mut args = Args::for_file(&file);
    args.no_restore = true;
    let b = import(Some(&hset), restored_layout(&hset), &args)
        .await
        .unwrap();
    assert_eq!((b.buckets_restored, b.buckets_hset), (0, 50));

    // Same content, same encoding, same memory, bucket for bucket.
    let ra = dump_buckets(&redis, "r:");
    assert_same_buckets(&ra, &dump_buckets(&redis, "h:"), "RESTORE vs HSET");
    assert_eq!(ra.values().map(BTreeMap::len).sum::<usize>(), 20_000);
    assert_eq!(
        encodings(&redis, "r:"),
        BTreeMap::from([("listpack".to_owned(), 50)])
    );
    let mut conn = redis.conn();
    for bucket in ra.keys() {
        let mem = |p: &str| -> u64 {
            redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(format!("{p}b:{bucket}"))
                .arg("SAMPLES")
                .arg(0)
                .query(&mut redis.conn())
                .unwrap()
        };
        assert_eq!(
            mem("r:"),
            mem("h:"),
            "bucket {bucket} costs what HSET would"
        );
    }

    // Spot checks: values are the rows' expiry codes.
    let layout = restored_layout(&restored);
    let now = now_ms();
    for (l, d, v, s, ttl) in rows.iter().step_by(997) {
        let (bucket, field) = key_of(layout, l, d, v, s);
        let code: u32 = redis::cmd("HGET")
            .arg(format!("r:b:{bucket}"))
            .arg(field)
            .query(&mut conn)
            .unwrap();
        match ttl {
            None => assert_eq!(code, 0),
            Some(t) => {
                let at = Expiry::from_code(code).expires_at_ms().unwrap();
                assert!(
                    (at - now - *t as i64 * 1000).abs() < 60_000,
                    "{v}: expiry {at}"
                );
            }
        }
    }

    // One audit record for the run, with its counts; the ranges' registry is untouched
    // (no CIDR rows here).
    let tail = {
        use namelist::store::EntryStore;
        restored.audit_tail(10).await.unwrap()
    };
    assert_eq!(tail.len(), 1);
    let fields: HashMap<&str, &str> = tail[0]
        .fields
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(fields["op"], "import");
    assert_eq!(fields["rows_read"], "20000");
    assert_eq!(fields["entries_written"], "20000");
}

/// Past `--memory-mb` the rows spill to temporary files and are read back: the same
/// buckets as an import that held everything in memory (an 80M-row import once failed there
/// with EBADF: the spill files were opened write-only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_past_its_memory_budget_spills_and_writes_the_same() {
    let redis = sanitising();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rows.csv");
    // More rows than the smallest budget holds (1,024 records), in buckets of 3 partitions.
    let rows = rows(30_000, "s");
    write_csv_absolute(&file, &rows);

    let held = open(&redis, "m:", 150_000).await;
    let a = import(Some(&held), restored_layout(&held), &Args::for_file(&file))
        .await
        .unwrap();
    let spilled = open(&redis, "s:", 150_000).await;
    let mut args = Args::for_file(&file);
    args.memory_mb = Some(0);
    let b = import(Some(&spilled), restored_layout(&spilled), &args)
        .await
        .unwrap();
    assert_eq!(
        (b.rows_read, b.rows_rejected, b.entries_written),
        (30_000, 0, 30_000)
    );
    assert_eq!(a.entries_written, b.entries_written);
    let m = dump_buckets(&redis, "m:");
    assert_eq!(m.values().map(BTreeMap::len).sum::<usize>(), 30_000);
    assert_same_buckets(&m, &dump_buckets(&redis, "s:"), "in memory vs spilled");
}

/// The lists' approximate counts (`GET /v1/lists`), sorted.
async fn counts(store: &namelist::store::redis::RedisStore) -> Vec<(String, String, i64)> {
    use namelist::store::{CountsQuery, EntryStore};
    // A few pairs: one page holds them all, in (list, sandbox) order.
    let page = store.list_counts(&CountsQuery::first(1_000)).await.unwrap();
    assert!(!page.more);
    page.counts
        .into_iter()
        .map(|c| (c.list, c.sandbox, c.entries))
        .collect()
}

fn restored_layout(store: &namelist::store::redis::RedisStore) -> &Layout {
    use namelist::store::StoreBase;
    store.layout()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incremental_import_refreshes_and_adds() {
    let redis = sanitising();
    let dir = tempfile::tempdir().unwrap();
    let store = open(&redis, "i:", 8_000).await;
    let layout = restored_layout(&store).clone();

    let first = rows(4_000, "x");
    let f1 = dir.path().join("first.csv");
    write_csv(&f1, &first);
    import(Some(&store), &layout, &Args::for_file(&f1))
        .await
        .unwrap();
    // The lists' counts (GET /v1/lists): every row of a fresh keyspace created its entry,
    // each of the 4 (list, sandbox) pairs its own rows.
    let expected_first = |list: &str, sandbox: &str| {
        first
            .iter()
            .filter(|r| r.0 == list && r.3 == sandbox)
            .count() as i64
    };
    assert_eq!(
        counts(&store).await,
        [
            (
                "black".into(),
                "default".into(),
                expected_first("black", "default")
            ),
            (
                "black".into(),
                "loan".into(),
                expected_first("black", "loan")
            ),
            (
                "grey".into(),
                "default".into(),
                expected_first("grey", "default")
            ),
            ("grey".into(), "loan".into(), expected_first("grey", "loan")),
        ]
    );

    // The second file: every other row of the first made never-expiring, plus new rows, and
    // one entry twice (the last row wins).
    let mut second: Vec<_> = first
        .iter()
        .step_by(2)
        .map(|(l, d, v, s, _)| (l.clone(), d.clone(), v.clone(), s.clone(), None))
        .collect();
    second.extend(rows(2_000, "y"));
    let dup = second[0].clone();
    second.push((dup.0, dup.1, dup.2, dup.3, Some(7200)));
    let f2 = dir.path().join("second.csv");
    write_csv(&f2, &second);
    let s = import(Some(&store), &layout, &Args::for_file(&f2))
        .await
        .unwrap();
    assert_eq!(s.rows_duplicate, 1);
    assert_eq!(s.buckets_restored, 0, "every bucket existed");
    assert_eq!(s.entries_written, 4_000);
    assert_eq!(s.entries_created, 2_000, "2,000 new, 2,000 refreshed");
    // The 2,000 new entries are shared out by rows per (list, sandbox): the total is exact to
    // the rounding of 4 shares.
    let total: i64 = counts(&store).await.iter().map(|c| c.2).sum();
    assert!((5_998..=6_002).contains(&total), "{total}");

    let buckets = dump_buckets(&redis, "i:");
    assert_eq!(buckets.values().map(BTreeMap::len).sum::<usize>(), 6_000);
    let get = |row: &(String, String, String, String, Option<u64>)| {
        let (b, f) = key_of(&layout, &row.0, &row.1, &row.2, &row.3);
        buckets[&b][&f]
    };
    assert_ne!(get(&second[0]), 0, "the later duplicate row (ttl 7200) won");
    assert_eq!(get(&second[1]), 0, "refreshed to never");
    assert_ne!(get(&first[1]), 0, "untouched by the second file");
    assert_eq!(
        encodings(&redis, "i:").keys().collect::<Vec<_>>(),
        vec!["listpack"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_rows_are_rejected_by_line_and_the_rest_goes_in() {
    let redis = sanitising();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mixed.csv");
    std::fs::write(
        &file,
        "list,dimension,value,sandbox,expires_at,ttl_seconds,reason\n\
         black,uid,good-1,,,,\n\
         black,phone,12ab,,,,\n\
         black,Phone!,1,,,,\n\
         Black,uid,x,,,,\n\
         black,uid,good-2,loan,,3600,\n\
         black,uid,y,,1,,\n\
         black,uid,z,,,5,\n\
         black,uid,w,,,-1,\n\
         black,ip,10.0.0.0/8,,,,\n\
         black,uid,,,,,\n\
         black,uid,\"quoted, with comma\",,,,\n\
         black,uid,short\n",
    )
    .unwrap();
    let store = open(&redis, "b:", 4_000).await;
    let layout = restored_layout(&store).clone();
    let s = import(Some(&store), &layout, &Args::for_file(&file))
        .await
        .unwrap();
    assert_eq!((s.rows_read, s.rows_rejected), (12, 7));
    let rejects = std::fs::read_to_string(s.reject_file.unwrap()).unwrap();
    let lines: Vec<&str> = rejects.lines().collect();
    assert_eq!(lines[0], "line,error");
    let by_line: Vec<(u64, &str)> = lines[1..]
        .iter()
        .map(|l| {
            let (n, why) = l.split_once(',').unwrap();
            (n.parse().unwrap(), why)
        })
        .collect();
    let wanted: [(u64, &str); 7] = [
        (3, "invalid phone"),
        (4, "unknown dimension"),
        (5, "list"),
        (7, "expires_at"),
        (9, "ttl_seconds"),
        (11, "uid"),
        (13, "unreadable CSV row"),
    ];
    assert_eq!(by_line.len(), wanted.len(), "{rejects}");
    for ((line, why), (want_line, want)) in by_line.iter().zip(wanted) {
        assert_eq!(*line, want_line, "{rejects}");
        assert!(
            why.contains(want),
            "line {line}: {why:?} should mention {want:?}"
        );
    }
    let buckets = dump_buckets(&redis, "b:");
    assert_eq!(
        buckets.values().map(BTreeMap::len).sum::<usize>(),
        5,
        "the good rows are in"
    );
    let members: Vec<String> = redis::cmd("SMEMBERS")
        .arg("b:p:black:default")
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(members, vec!["4/8"], "the range is registered");

    // --strict stops at the first bad row and writes nothing; --dry-run writes nothing.
    let before = redis.digest();
    let mut strict = Args::for_file(&file);
    strict.strict = true;
    let err = import(Some(&store), &layout, &strict).await.unwrap_err();
    assert!(err.to_string().contains("line 3"), "{err}");
    let mut dry = Args::for_file(&file);
    dry.dry_run = true;
    let s = import(Some(&store), &layout, &dry).await.unwrap();
    assert_eq!(
        (s.rows_read, s.rows_rejected, s.entries_written),
        (12, 7, 0)
    );
    assert_eq!(redis.digest(), before, "neither wrote anything");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_lines_gzip_and_stdin() {
    let redis = sanitising();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rows.jsonl.gz");
    let mut gz = flate2::write::GzEncoder::new(
        std::fs::File::create(&file).unwrap(),
        flate2::Compression::fast(),
    );
    for i in 0..500 {
        writeln!(gz, "{}", json!({"dimension": "device", "value": format!("jd{i}"), "expires_at": now_ms() + 86_400_000})).unwrap();
    }
    writeln!(
        gz,
        "{{\"dimension\": \"device\", \"value\": \"x\", \"colour\": \"red\"}}"
    )
    .unwrap();
    gz.finish().unwrap();
    let store = open(&redis, "j:", 4_000).await;
    let layout = restored_layout(&store).clone();
    let mut args = Args::for_file(&file);
    args.list = Some("fraud_device".into());
    let s = import(Some(&store), &layout, &args).await.unwrap();
    assert_eq!(
        (s.rows_read, s.rows_rejected, s.entries_written),
        (501, 1, 500)
    );
    let rejects = std::fs::read_to_string(s.reject_file.unwrap()).unwrap();
    assert!(
        rejects.contains("501,") && rejects.contains("colour"),
        "{rejects}"
    );

    // The binary, reading CSV from stdin.
    let mut child = Command::new(TOOLS)
        .env("NAMELIST_FINGERPRINT_KEY_FILE", common::key_file())
        .args([
            "--redis-url",
            &redis.url(),
            "--prefix",
            "j:",
            "import",
            "--list",
            "black",
            "--json",
        ])
        .current_dir(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"dimension,value\nuid,from-stdin\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["entries_written"], 1);
}

fn checkpoint_progress(path: &Path) -> u64 {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["done_below"].as_u64())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_then_resume_equals_a_clean_run() {
    let redis = sanitising();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big.csv");
    let rows = rows(120_000, "k");
    write_csv_absolute(&file, &rows);
    let tools = |prefix: &str, extra: &[&str]| {
        let mut c = Command::new(TOOLS);
        c.env("NAMELIST_FINGERPRINT_KEY_FILE", common::key_file());
        c.args([
            "--redis-url",
            &redis.url(),
            "--prefix",
            prefix,
            "--expected-entries",
            "120000",
            "import",
        ])
        .arg(&file)
        .args(["--batch-buckets", "4", "--quiet"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        c
    };

    // A clean run into one keyspace.
    let out = tools("clean:", &[]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A paced run into another, killed -9 midway.
    let checkpoint: PathBuf = PathBuf::from(format!("{}.checkpoint", file.display()));
    let mut child = tools("killed:", &["--max-rows-per-sec", "60000"])
        .spawn()
        .unwrap();
    let started = Instant::now();
    while checkpoint_progress(&checkpoint) < 60 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the import made no progress"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the import ended before it was killed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let partial = dump_buckets(&redis, "killed:");
    let done = checkpoint_progress(&checkpoint);
    assert!(done < 300, "killed before the end ({done} of 300 buckets)");
    assert!(
        !partial.is_empty() && partial.len() < 300,
        "a partial state: {} buckets",
        partial.len()
    );

    let out = tools("killed:", &["--resume", "--json"])
        .stdout(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        summary["buckets_skipped"].as_u64().unwrap() >= done.min(1),
        "{summary}"
    );
    assert_eq!(summary["resumed"], true);
    assert!(!checkpoint.exists(), "the checkpoint is removed once done");

    let clean = dump_buckets(&redis, "clean:");
    let resumed = dump_buckets(&redis, "killed:");
    assert_eq!(clean.values().map(BTreeMap::len).sum::<usize>(), 120_000);
    assert_same_buckets(&resumed, &clean, "resumed vs clean");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_service_sees_imported_entries() {
    let redis = sanitising();
    let mut settings = redis_settings(&redis);
    settings.cache_ttl_ms = 600_000;
    let app = spawn_app(settings.clone()).await;
    let check = json!({"lists": ["black"], "subjects": {"uid": "imported-late"}});
    assert!(
        app.check(&check).await["hits"]
            .as_array()
            .unwrap()
            .is_empty(),
        "a cached miss"
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("late.csv");
    std::fs::write(
        &file,
        "list,dimension,value\nblack,uid,imported-late\nblack,ip,192.168.0.0/16\n",
    )
    .unwrap();
    let store = open(&redis, &settings.key_prefix, 1_000_000).await;
    let layout = restored_layout(&store).clone();
    import(Some(&store), &layout, &Args::for_file(&file))
        .await
        .unwrap();

    let started = Instant::now();
    loop {
        let body = app.check(&json!({"lists": ["black"], "subjects": {"uid": "imported-late", "ip": "192.168.3.4"}})).await;
        if body["hits"].as_array().unwrap().len() == 2 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "the service still answers {body}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Redis stops answering in the middle of the write phase (SIGSTOP, longer than a pipeline's
/// time limit): the run does not fail; the pipelines in flight are tried again once it is back,
/// and the keyspace ends up exactly as an undisturbed run's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silence_mid_write_is_waited_out_and_written_the_same() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rows.csv");
    write_csv_absolute(&file, &rows(60_000, "s"));
    let import = |prefix: &str, paced: bool| {
        let mut c = common::without_namelist_env(TOOLS);
        c.env("NAMELIST_FINGERPRINT_KEY_FILE", common::key_file())
            .args(["--redis-url", &redis.url(), "--prefix", prefix, "import"])
            .arg(&file)
            .arg("--quiet")
            .current_dir(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if paced {
            // ~10 s of writing, so that the silence falls inside it.
            c.args(["--max-rows-per-sec", "6000"]);
        }
        c.spawn().unwrap()
    };
    let clean = import("c:", false).wait_with_output().unwrap();
    assert!(clean.status.success());

    let child = import("p:", true);
    let started = Instant::now();
    loop {
        let written: Vec<String> = redis::cmd("KEYS")
            .arg("p:b:*")
            .query(&mut redis.conn())
            .unwrap();
        if !written.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no bucket written"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    redis.pause();
    tokio::time::sleep(namelist_tools::import::WRITE_TIMEOUT + Duration::from_secs(2)).await;
    redis.resume();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("try 1 of 4 failed"), "{stderr}");
    assert_same_buckets(
        &dump_buckets(&redis, "c:"),
        &dump_buckets(&redis, "p:"),
        "a run through a silence against an undisturbed one",
    );
}
