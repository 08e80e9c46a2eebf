//! `namelist-tools audit` against a real `redis-server`: its totals against an independent sum,
//! problem buckets by name, expired fields, the layout comparison (and its clean-up), and the
//! binary's `--json` and `--html` output, and the summary it leaves read by a running service
//! as gauges on `/metrics`; then the same on a local Redis Cluster (every primary scanned,
//! per-primary lines, a limit lowered on one primary only).

// The root's test helpers (redis-server on free ports, local clusters, the app on port 0),
// shared by path rather than copied.
use crate::common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{RedisCluster, RedisServer, redis_settings, spawn_app};
use namelist::domain::{Expiry, now_ms};
use namelist::store::redis::{RedisOptions, RedisStore};
use namelist::store::{Deadline, EntryStore, StoreBase, WriteBatch};
use namelist_tools::audit::{self, Args, AuditReport};
use serde_json::{Value, json};

const ENTRIES: u64 = 3000;
const EXPIRED: u64 = 100;

async fn open(server: &RedisServer, prefix: &str) -> RedisStore {
    let (store, _) = RedisStore::open(RedisOptions {
        expected_entries: Some(2000),
        default_expected_entries: 2000,
        connect_timeout: Duration::from_secs(2),
        response_timeout: Duration::from_secs(30),
        audit_max_len: 10,
        ..common::redis_options(server.url(), prefix)
    })
    .await
    .expect("store opens");
    store
}

/// `ENTRIES` live entries expiring within a year (a tenth never) and `EXPIRED` with code 1
/// (one second after 2020-01-01: long expired).
async fn fill(store: &RedisStore) {
    let now = now_ms();
    let layout = store.layout().clone();
    let mut entries = Vec::new();
    for i in 0..ENTRIES + EXPIRED {
        let key = layout.key_of(format!("black\nuid\ndefault\nu{i}").as_bytes());
        let code = if i >= ENTRIES {
            1
        } else if i % 10 == 0 {
            0
        } else {
            Expiry::at_ms(now + 86_400_000 * (1 + i as i64 % 365), now)
                .unwrap()
                .code()
        };
        entries.push((key, code));
    }
    for chunk in entries.chunks(1000) {
        store
            .write(
                WriteBatch {
                    entries: chunk.to_vec(),
                    ..WriteBatch::default()
                },
                Deadline::after(Duration::from_secs(10)),
            )
            .await
            .expect("write");
    }
}

/// (keys, sum of MEMORY USAGE, sum of HLEN) over `SCAN MATCH <prefix>b:*`, computed here.
fn independent_totals(conn: &mut redis::Connection, prefix: &str) -> (Vec<String>, u64, u64) {
    let mut keys: Vec<String> = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}b:*"))
            .arg("COUNT")
            .arg(100)
            .query(conn)
            .unwrap();
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    keys.sort();
    keys.dedup();
    let (mut bytes, mut fields) = (0, 0);
    for k in &keys {
        let b: u64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(k)
            .arg("SAMPLES")
            .arg(0)
            .query(conn)
            .unwrap();
        let f: u64 = redis::cmd("HLEN").arg(k).query(conn).unwrap();
        bytes += b;
        fields += f;
    }
    (keys, bytes, fields)
}

fn no_comparison() -> Args {
    Args {
        compare_sample: 0,
        ..Args::default()
    }
}

fn scratch_keys(conn: &mut redis::Connection) -> Vec<String> {
    redis::cmd("KEYS")
        .arg("*audit-scratch*")
        .query(conn)
        .unwrap()
}

#[tokio::test]
async fn totals_equal_an_independent_sum_and_expired_fields_are_counted() {
    let server = RedisServer::start();
    let store = open(&server, "au1:").await;
    fill(&store).await;

    let report: AuditReport = audit::audit(
        &store,
        &Args {
            batch: 3, // several pipelines and SCAN calls
            ..no_comparison()
        },
    )
    .await
    .expect("audit");

    let (keys, bytes, fields) = independent_totals(&mut server.conn(), "au1:");
    assert_eq!(report.bytes, bytes, "sum of MEMORY USAGE");
    assert_eq!(report.entries, fields, "sum of HLEN");
    assert_eq!(report.entries, ENTRIES + EXPIRED);
    assert_eq!(report.buckets, keys.len() as u64);
    assert_eq!(report.buckets_found, keys.len() as u64);
    assert_eq!(report.keyspace_buckets, 10);
    assert!(!report.sampled);
    assert_eq!(report.expired_entries, EXPIRED);
    assert_eq!(report.never_expiring_entries, ENTRIES / 10);
    assert_eq!(report.unreadable_values, 0);
    assert_eq!(report.listpack_limit, Some(512));
    assert_eq!(report.hashtable_bucket_count, 0);
    assert_eq!(report.over_limit_bucket_count, 0);
    assert!(report.bytes_per_entry > 15.0 && report.bytes_per_entry < 25.0);
    assert!(report.fill.min <= report.fill.p50 && report.fill.p50 <= report.fill.max);
    assert_eq!(
        report.fill_histogram.iter().map(|b| b.buckets).sum::<u64>(),
        report.buckets
    );
    assert_eq!(report.encodings["listpack"].buckets, report.buckets);
    assert!(report.memory.used_memory.unwrap() > 0);
    let p = report.projection.as_ref().expect("projection");
    assert_eq!(p.entries, 50_000_000_000);
    assert_eq!(p.buckets, 250_000_000, "200 entries per bucket");
    assert!((p.bytes - report.bytes_per_entry * 5e10).abs() < 1.0);

    // A sample probes exactly that many distinct buckets.
    let sample = audit::audit(
        &store,
        &Args {
            sample: Some(3),
            ..no_comparison()
        },
    )
    .await
    .expect("sampled audit");
    assert!(sample.sampled);
    assert_eq!(sample.buckets, 3);
    assert_eq!(sample.buckets_found, keys.len() as u64);
    assert!(sample.estimated_keyspace_entries.unwrap() > 0);
}

#[tokio::test]
async fn a_bucket_forced_over_the_listpack_limit_is_reported_by_name() {
    let server = RedisServer::start();
    let store = open(&server, "au2:").await;
    fill(&store).await;
    let mut conn = server.conn();
    let victim = "au2:b:3";
    let mut cmd = redis::cmd("HSET");
    cmd.arg(victim);
    for i in 0..600i64 {
        cmd.arg(-1_000_000 - i).arg(0);
    }
    let _: u64 = cmd.query(&mut conn).unwrap();
    let enc: String = redis::cmd("OBJECT")
        .arg("ENCODING")
        .arg(victim)
        .query(&mut conn)
        .unwrap();
    assert_eq!(enc, "hashtable");

    let report = audit::audit(&store, &no_comparison()).await.expect("audit");
    let (_, bytes, fields) = independent_totals(&mut conn, "au2:");
    assert_eq!((report.bytes, report.entries), (bytes, fields));
    assert_eq!(report.hashtable_bucket_count, 1);
    assert_eq!(report.over_limit_bucket_count, 1);
    assert_eq!(report.problem_bucket_count, 1);
    let listed = &report.hashtable_buckets[0];
    assert_eq!(listed.key, victim);
    assert_eq!(listed.encoding, "hashtable");
    assert!(listed.over_limit && listed.fields > 600);
    assert_eq!(report.over_limit_buckets[0].key, victim);
    assert_eq!(report.encodings["hashtable"].buckets, 1);
    assert!(audit::render::table(&report).contains(victim));
}

#[tokio::test]
async fn a_server_with_a_low_listpack_limit_has_every_bucket_reported() {
    let server = RedisServer::start_with(&["--hash-max-listpack-entries", "64"]);
    let store = open(&server, "au5:").await;
    fill(&store).await;
    let report = audit::audit(&store, &no_comparison()).await.expect("audit");
    assert_eq!(report.listpack_limit, Some(64));
    assert_eq!(report.buckets, 10);
    assert_eq!(report.over_limit_bucket_count, 10);
    assert_eq!(report.hashtable_bucket_count, 10);
    let mut names: Vec<&str> = report
        .hashtable_buckets
        .iter()
        .map(|b| b.key.as_str())
        .collect();
    names.sort_unstable();
    let mut expected: Vec<String> = (0..10).map(|b| format!("au5:b:{b}")).collect();
    expected.sort_unstable();
    assert_eq!(names, expected);
    assert!(
        report.bytes_per_entry > 40.0,
        "hashtables cost more: {}",
        report.bytes_per_entry
    );
}

#[tokio::test]
async fn the_layout_comparison_measures_and_leaves_nothing_behind() {
    let server = RedisServer::start();
    let store = open(&server, "au3:").await;
    fill(&store).await;
    let mut conn = server.conn();
    let before: u64 = redis::cmd("DBSIZE").query(&mut conn).unwrap();

    let report = audit::audit(
        &store,
        &Args {
            compare_sample: 2000,
            ..Args::default()
        },
    )
    .await
    .expect("audit");
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);

    let after: u64 = redis::cmd("DBSIZE").query(&mut conn).unwrap();
    assert_eq!(before, after, "the scratch sample is deleted");
    assert!(scratch_keys(&mut conn).is_empty());

    let c = report.comparison.as_ref().expect("comparison");
    assert_eq!(c.entries, 2000);
    assert_eq!(c.scratch_keys_left, 0);
    let bpe = |name: &str| {
        c.layouts
            .iter()
            .find(|l| l.layout == name)
            .unwrap_or_else(|| panic!("layout {name}"))
            .bytes_per_entry
    };
    let (ours, rebuilt) = (bpe("ours"), bpe("ours_rebuilt"));
    let (plain, identity, seed) = (
        bpe("seed_plain_key"),
        bpe("seed_identity_hash"),
        bpe("seed_bucket_ms"),
    );
    assert_eq!(ours, report.bytes_per_entry);
    assert!(plain > identity, "plain {plain} > identity hash {identity}");
    assert!(identity > ours, "identity hash {identity} > ours {ours}");
    assert!(
        identity > rebuilt,
        "identity hash {identity} > rebuilt {rebuilt}"
    );
    // The seed's bucket holds 16 B of listpack per entry too (a 32-bit field, a 64-bit value):
    // only when its fill of 512 tips buckets into hashtables does it cost more.
    assert!(seed > 10.0, "the seed's bucket: {seed}");
    assert!(plain > 100.0, "a key per entry costs over 100 B: {plain}");
    for l in &c.layouts {
        assert!(l.bytes > 0 && l.keys > 0, "{l:?}");
    }
    let p = report.projection.as_ref().unwrap();
    assert_eq!(p.layouts.len(), c.layouts.len());
}

#[test]
fn the_binary_prints_json_and_writes_html() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = open(&server, "au4:").await;
        fill(&store).await;
    });
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("report.html");
    let out = Command::new(env!("CARGO_BIN_EXE_namelist-tools"))
        .env("NAMELIST_FINGERPRINT_KEY_FILE", common::key_file())
        .args(["--redis-url", &server.url(), "--prefix", "au4:", "audit"])
        .args(["--json", "--compare-sample", "500", "--html"])
        .arg(&html)
        .env_remove("NAMELIST_CONFIG")
        .env_remove("NAMELIST_EXPECTED_ENTRIES")
        .output()
        .expect("namelist-tools runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    for key in [
        "entries",
        "bytes",
        "bytes_per_entry",
        "buckets",
        "hashtable_buckets",
        "comparison",
        "fill",
        "projection",
        "memory",
    ] {
        assert!(json.get(key).is_some(), "missing {key}: {json}");
    }
    assert_eq!(json["entries"], ENTRIES + EXPIRED);
    assert!(json["hashtable_buckets"].as_array().unwrap().is_empty());
    let layouts = json["comparison"]["layouts"].as_array().unwrap();
    assert_eq!(layouts.len(), 5);
    assert!(
        layouts
            .iter()
            .all(|l| l["bytes_per_entry"].as_f64().unwrap() > 0.0)
    );

    let page = std::fs::read_to_string(&html).expect("HTML written");
    assert!(page.starts_with("<!DOCTYPE html>"));
    assert!(page.matches("<svg").count() >= 2, "two charts");
    assert!(page.contains("listpack limit 512"));
    assert!(
        !page.contains("<link") && !page.contains("src="),
        "no external assets"
    );
    assert!(scratch_keys(&mut server.conn()).is_empty());

    // And the table, by default.
    let out = Command::new(env!("CARGO_BIN_EXE_namelist-tools"))
        .env("NAMELIST_FINGERPRINT_KEY_FILE", common::key_file())
        .args(["--redis-url", &server.url(), "--prefix", "au4:", "audit"])
        .args(["--compare-sample", "0"])
        .env_remove("NAMELIST_CONFIG")
        .env_remove("NAMELIST_EXPECTED_ENTRIES")
        .output()
        .expect("namelist-tools runs");
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("bytes per entry"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_audit_is_exported_as_gauges() {
    let redis = RedisServer::start();
    let mut settings = redis_settings(&redis);
    // One bucket: 470 entries put it at 92 % of the default listpack limit of 512.
    settings.expected_entries = Some(200);
    settings.audit_refresh_secs = 1;
    let prefix = settings.key_prefix.clone();
    let app = spawn_app(settings).await;
    assert_eq!(
        app.metric("namelist_audit_last_run_timestamp_seconds")
            .await,
        Some(0.0),
        "no audit yet"
    );
    let entries: Vec<Value> = (0..470)
        .map(|i| json!({"dimension": "uid", "value": format!("u{i}")}))
        .collect();
    let res = app
        .post("/v1/lists/black/entries", &json!({"entries": entries}))
        .await;
    assert_eq!(res.status(), 200);

    let before = namelist::domain::now_ms() as f64 / 1000.0;
    let out = Command::new(env!("CARGO_BIN_EXE_namelist-tools"))
        .env("NAMELIST_FINGERPRINT_KEY_FILE", common::key_file())
        .args(["--redis-url", &redis.url(), "--prefix", &prefix, "audit"])
        .args(["--compare-sample", "0", "--project", "0"])
        .env_remove("NAMELIST_CONFIG")
        .env_remove("NAMELIST_EXPECTED_ENTRIES")
        .output()
        .expect("namelist-tools runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("buckets near the limit"), "{table}");

    let started = Instant::now();
    loop {
        let at = app
            .metric("namelist_audit_last_run_timestamp_seconds")
            .await
            .unwrap();
        if at > 0.0 {
            assert!(at >= before - 1.0, "{at} {before}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the gauges never showed the audit"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (series, want) in [
        ("namelist_audit_buckets{state=\"all\"}", 1.0),
        ("namelist_audit_buckets{state=\"near_limit\"}", 1.0),
        ("namelist_audit_buckets{state=\"over_limit\"}", 0.0),
        ("namelist_audit_buckets{state=\"hashtable\"}", 0.0),
        ("namelist_audit_entries", 470.0),
        ("namelist_audit_expired_entries", 0.0),
    ] {
        assert_eq!(app.metric(series).await, Some(want), "{series}");
    }
    let bpe = app.metric("namelist_audit_bytes_per_entry").await.unwrap();
    assert!((10.0..40.0).contains(&bpe), "{bpe}");
}

async fn open_cluster(cluster: &RedisCluster, prefix: &str) -> RedisStore {
    let (store, _) = RedisStore::open(RedisOptions {
        cluster_nodes: cluster.urls(),
        expected_entries: Some(2000),
        default_expected_entries: 2000,
        connect_timeout: Duration::from_secs(2),
        response_timeout: Duration::from_secs(30),
        audit_max_len: 10,
        ..common::redis_options(String::new(), prefix)
    })
    .await
    .expect("store opens on the cluster");
    store
}

/// Per primary (`127.0.0.1:port`): its bucket keys with (MEMORY USAGE, HLEN), computed here
/// on a plain connection to each primary, independently of the store's connection.
fn cluster_buckets(
    cluster: &RedisCluster,
    prefix: &str,
) -> BTreeMap<String, BTreeMap<String, (u64, u64)>> {
    cluster
        .primaries()
        .into_iter()
        .map(|node| {
            let mut conn = node.conn();
            let (keys, _, _) = independent_totals(&mut conn, prefix);
            let buckets = keys
                .into_iter()
                .map(|k| {
                    let b: u64 = redis::cmd("MEMORY")
                        .arg("USAGE")
                        .arg(&k)
                        .arg("SAMPLES")
                        .arg(0)
                        .query(&mut conn)
                        .unwrap();
                    let f: u64 = redis::cmd("HLEN").arg(&k).query(&mut conn).unwrap();
                    (k, (b, f))
                })
                .collect();
            (format!("127.0.0.1:{}", node.port), buckets)
        })
        .collect()
}

fn scratch_keys_on(cluster: &RedisCluster) -> usize {
    cluster
        .primaries()
        .into_iter()
        .map(|n| scratch_keys(&mut n.conn()).len())
        .sum()
}

fn keys_on(cluster: &RedisCluster) -> u64 {
    cluster
        .primaries()
        .into_iter()
        .map(|n| redis::cmd("DBSIZE").query::<u64>(&mut n.conn()).unwrap())
        .sum()
}

/// Every scenario on one local 6-node cluster (3 primaries, 3 replicas).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster() {
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    let prefix = "cau:";
    let store = open_cluster(&cluster, prefix).await;
    fill(&store).await;

    // Totals: an independent sum over every bucket key of every primary.
    let by_node = cluster_buckets(&cluster, prefix);
    assert_eq!(by_node.len(), 3, "three primaries");
    assert!(
        by_node.values().filter(|b| !b.is_empty()).count() >= 2,
        "the buckets spread over the primaries: {by_node:?}"
    );
    let all = || by_node.values().flat_map(|b| b.values());
    let (bytes, fields) = all().fold((0, 0), |(b, f), (mb, mf)| (b + mb, f + mf));
    let buckets = all().count() as u64;
    let report = audit::audit(
        &store,
        &Args {
            batch: 3, // several batches and SCAN calls per primary
            ..no_comparison()
        },
    )
    .await
    .expect("audit on the cluster");
    assert!(report.cluster);
    assert_eq!(
        report.bytes, bytes,
        "sum of MEMORY USAGE over every primary"
    );
    assert_eq!(report.entries, fields, "sum of HLEN over every primary");
    assert_eq!(report.entries, ENTRIES + EXPIRED);
    assert_eq!((report.buckets, report.buckets_found), (buckets, buckets));
    assert_eq!(report.keyspace_buckets, 10);
    assert_eq!(report.expired_entries, EXPIRED);
    assert_eq!(report.never_expiring_entries, ENTRIES / 10);
    assert_eq!(report.listpack_limit, Some(512));
    assert_eq!(report.hashtable_bucket_count, 0);
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    let names: Vec<&str> = report.nodes.iter().map(|n| n.node.as_str()).collect();
    assert_eq!(
        names,
        by_node.keys().map(String::as_str).collect::<Vec<_>>(),
        "one line per primary, in address order"
    );
    for n in &report.nodes {
        let mine = &by_node[&n.node];
        assert_eq!(n.buckets, mine.len() as u64, "{}", n.node);
        assert_eq!(n.buckets_found, mine.len() as u64, "{}", n.node);
        assert_eq!(
            n.bytes,
            mine.values().map(|v| v.0).sum::<u64>(),
            "{}",
            n.node
        );
        assert_eq!(
            n.entries,
            mine.values().map(|v| v.1).sum::<u64>(),
            "{}",
            n.node
        );
        assert_eq!(n.listpack_limit, Some(512));
        assert!(n.memory.used_memory.unwrap() > 0);
        assert!(n.redis_version.is_some());
    }
    let used: u64 = report
        .nodes
        .iter()
        .map(|n| n.memory.used_memory.unwrap())
        .sum();
    assert_eq!(
        report.memory.used_memory,
        Some(used),
        "summed over primaries"
    );
    let table = audit::render::table(&report);
    assert!(table.contains("per primary"), "{table}");
    for name in by_node.keys() {
        assert!(table.contains(name.as_str()), "{name} in {table}");
    }
    let page = audit::render::html(&report);
    assert!(page.contains("Per primary"));

    // A sample over all the primaries probes exactly that many distinct buckets.
    let sample = audit::audit(
        &store,
        &Args {
            sample: Some(3),
            ..no_comparison()
        },
    )
    .await
    .expect("sampled audit");
    assert!(sample.sampled);
    assert_eq!(sample.buckets, 3);
    assert_eq!(sample.buckets_found, buckets);

    // A bucket forced over the listpack limit is reported by name, on its primary's line.
    let victim = format!("{prefix}b:3");
    let mut conn = cluster.conn();
    let mut cmd = redis::cmd("HSET");
    cmd.arg(&victim);
    for i in 0..600i64 {
        cmd.arg(-1_000_000 - i).arg(0);
    }
    let _: u64 = cmd.query(&mut conn).unwrap();
    let report = audit::audit(&store, &no_comparison()).await.expect("audit");
    let by_node = cluster_buckets(&cluster, prefix);
    let bytes: u64 = by_node.values().flat_map(|b| b.values()).map(|v| v.0).sum();
    assert_eq!(report.bytes, bytes);
    assert_eq!(report.entries, ENTRIES + EXPIRED + 600);
    assert_eq!(
        (
            report.hashtable_bucket_count,
            report.over_limit_bucket_count,
            report.problem_bucket_count
        ),
        (1, 1, 1)
    );
    assert_eq!(report.hashtable_buckets[0].key, victim);
    assert_eq!(report.over_limit_buckets[0].key, victim);
    let home = by_node
        .iter()
        .find(|(_, b)| b.contains_key(&victim))
        .map(|(n, _)| n.clone())
        .expect("the victim's primary");
    for n in &report.nodes {
        let expected = u64::from(n.node == home);
        assert_eq!(n.hashtable_bucket_count, expected, "{}", n.node);
    }
    assert!(audit::render::table(&report).contains(&victim));

    // The script cache flushed on every node mid-walk (a restart, SCRIPT FLUSH): NOSCRIPT,
    // the script is loaded again on every primary and the failed calls are redone.
    let cached_scripts = |node: &RedisServer| -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query(&mut node.conn())
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("number_of_cached_scripts:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap()
    };
    let urls = cluster.urls();
    let flusher = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        for url in urls {
            let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
            let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn).unwrap();
        }
        std::time::Instant::now()
    });
    let report = audit::audit(
        &store,
        &Args {
            batch: 1,
            max_buckets_per_sec: Some(10), // about a second for the ten buckets
            ..no_comparison()
        },
    )
    .await
    .expect("audit across a SCRIPT FLUSH");
    let finished = std::time::Instant::now();
    assert!(
        flusher.join().unwrap() < finished,
        "flushed during the walk"
    );
    assert_eq!(report.expired_entries, EXPIRED);
    assert_eq!(report.entries, ENTRIES + EXPIRED + 600);
    for node in cluster.primaries() {
        assert!(cached_scripts(node) >= 1, "reloaded on {}", node.port);
    }

    // One primary with a lower limit: its buckets are over it, the others' are not.
    let low = cluster.primaries()[0];
    let low_name = format!("127.0.0.1:{}", low.port);
    let set_limit = |n: u64| {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("hash-max-listpack-entries")
            .arg(n)
            .query(&mut low.conn())
            .unwrap();
    };
    set_limit(64);
    let report = audit::audit(&store, &no_comparison()).await.expect("audit");
    set_limit(512);
    assert_eq!(report.listpack_limit, Some(64), "the lowest limit");
    let expected_over: u64 = by_node
        .iter()
        .flat_map(|(n, b)| {
            let limit = if *n == low_name { 64 } else { 512 };
            b.values().filter(move |v| v.1 > limit)
        })
        .count() as u64;
    assert!(expected_over >= 2, "{expected_over}");
    assert_eq!(report.over_limit_bucket_count, expected_over);
    for n in &report.nodes {
        let (limit, over) = if n.node == low_name {
            (64, by_node[&n.node].len() as u64)
        } else {
            (512, u64::from(n.node == home))
        };
        assert_eq!(n.listpack_limit, Some(limit), "{}", n.node);
        assert_eq!(n.over_limit_bucket_count, over, "{}", n.node);
    }
    assert!(
        audit::render::table(&report).contains("per primary: "),
        "the differing limits are listed"
    );

    // The layout comparison writes, measures and deletes on every primary.
    let before = keys_on(&cluster);
    let report = audit::audit(
        &store,
        &Args {
            compare_sample: 2000,
            ..Args::default()
        },
    )
    .await
    .expect("audit with the comparison");
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    assert_eq!(keys_on(&cluster), before, "the scratch sample is deleted");
    assert_eq!(scratch_keys_on(&cluster), 0);
    let c = report.comparison.as_ref().expect("comparison");
    assert_eq!((c.entries, c.scratch_keys_left), (2000, 0));
    assert_eq!(c.layouts.len(), 5);
    for l in &c.layouts {
        assert!(l.bytes > 0 && l.keys > 0, "{l:?}");
    }
    let bpe = |name: &str| {
        c.layouts
            .iter()
            .find(|l| l.layout == name)
            .unwrap()
            .bytes_per_entry
    };
    assert!(bpe("seed_plain_key") > bpe("seed_identity_hash"));
    assert!(bpe("seed_identity_hash") > bpe("ours_rebuilt"));
}
