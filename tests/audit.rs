//! `namelist-tools audit` against a real `redis-server`: its totals against an independent sum,
//! problem buckets by name, expired fields, the layout comparison (and its clean-up), and the
//! binary's `--json` and `--html` output.

mod common;

use std::process::Command;
use std::time::Duration;

use common::RedisServer;
use namelist::domain::{Expiry, now_ms};
use namelist::store::redis::{RedisOptions, RedisStore};
use namelist::store::{Store, WriteBatch};
use namelist::tools::audit::{self, Args, AuditReport};

const ENTRIES: u64 = 3000;
const EXPIRED: u64 = 100;

async fn open(server: &RedisServer, prefix: &str) -> RedisStore {
    let (store, _) = RedisStore::open(RedisOptions {
        url: server.url(),
        cluster_nodes: Vec::new(),
        prefix: prefix.into(),
        expected_entries: Some(4000),
        default_expected_entries: 4000,
        connect_timeout: Duration::from_secs(2),
        response_timeout: Duration::from_secs(30),
        audit_max_len: 10,
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
            .write(WriteBatch {
                entries: chunk.to_vec(),
                ..WriteBatch::default()
            })
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
    assert_eq!(p.buckets, 125_000_000);
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
