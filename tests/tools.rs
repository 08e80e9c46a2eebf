//! The operator tools end to end: `gen` → `import` → every generated row answers listed
//! through the running service (no false negatives) and none of the generated non-members
//! does (no false positives); then `audit` and `sweep` on the same keyspace.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::process::Command;

use common::{RedisServer, TestApp, redis_settings, spawn_app};
use namelist::domain::{Dimension, Value};
use serde_json::{Value as Json, json};

const TOOLS: &str = env!("CARGO_BIN_EXE_namelist-tools");

fn tools(redis: &RedisServer, prefix: &str, args: &[&str]) -> String {
    let out = Command::new(TOOLS)
        .args(["--redis-url", &redis.url(), "--prefix", prefix])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// (list, sandbox, dimension, raw value, what a hit must show).
type Row = (String, String, String, String, String);

/// Every row of a gen file.
fn read_rows(path: &Path) -> Vec<Row> {
    let mut r = csv::Reader::from_path(path).unwrap();
    r.records()
        .map(|rec| {
            let rec = rec.unwrap();
            let (list, dim, value, sandbox) = (&rec[0], &rec[1], &rec[2], &rec[3]);
            let d: Dimension = dim.parse().unwrap();
            let shown = Value::parse_entry(&d, value).unwrap().to_string();
            // A range is checked through its first address.
            let probe = match shown.split_once('/') {
                Some((net, _)) if d == Dimension::Ip => net.to_owned(),
                _ => value.to_owned(),
            };
            let sandbox = if sandbox.is_empty() {
                "default"
            } else {
                sandbox
            };
            (list.into(), sandbox.into(), dim.into(), probe, shown)
        })
        .collect()
}

/// Checks every row (64 values per request, grouped by list and sandbox); returns the rows
/// whose expected value was not among the hits, and every hit seen.
async fn check_all(app: &TestApp, rows: &[Row]) -> (Vec<String>, Vec<Json>) {
    let mut groups: BTreeMap<(&str, &str), Vec<&Row>> = BTreeMap::new();
    for r in rows {
        groups.entry((&r.0, &r.1)).or_default().push(r);
    }
    let (mut missing, mut all_hits) = (Vec::new(), Vec::new());
    for ((list, sandbox), rows) in groups {
        for chunk in rows.chunks(64) {
            let mut subjects: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
            for r in chunk {
                subjects.entry(&r.2).or_default().push(&r.3);
            }
            let body = app
                .check(&json!({"sandbox": sandbox, "lists": [list], "subjects": subjects}))
                .await;
            assert_eq!(body["degraded"], false);
            let hits = body["hits"].as_array().unwrap();
            let seen: HashSet<(&str, &str)> = hits
                .iter()
                .map(|h| {
                    (
                        h["dimension"].as_str().unwrap(),
                        h["value"].as_str().unwrap(),
                    )
                })
                .collect();
            for r in chunk {
                if !seen.contains(&(r.2.as_str(), r.4.as_str())) {
                    missing.push(format!("{list}/{sandbox}/{}={}", r.2, r.4));
                }
            }
            all_hits.extend(hits.iter().cloned());
        }
    }
    (missing, all_hits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gen_import_check_no_false_negatives_or_positives() {
    let redis = RedisServer::start_with(&["--sanitize-dump-payload", "yes"]);
    let settings = redis_settings(&redis);
    let prefix = settings.key_prefix.clone();
    let dir = tempfile::tempdir().unwrap();
    let (members, non_members) = (dir.path().join("m.csv"), dir.path().join("n.csv"));
    let out = Command::new(TOOLS)
        .args([
            "gen",
            "--rows",
            "60000",
            "--non-member-rows",
            "100000",
            "--quiet",
        ])
        .arg("--out")
        .arg(&members)
        .arg("--non-members")
        .arg(&non_members)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let summary: Json = serde_json::from_str(&tools(
        &redis,
        &prefix,
        &[
            "--expected-entries",
            "60000",
            "import",
            members.to_str().unwrap(),
            "--quiet",
            "--json",
        ],
    ))
    .unwrap();
    assert_eq!(summary["rows_rejected"], 0, "{summary}");
    assert_eq!(summary["entries_written"], 60_000, "{summary}");
    assert!(summary["buckets_restored"].as_u64().unwrap() > 0);

    let app = spawn_app(settings).await;
    let rows = read_rows(&members);
    assert_eq!(rows.len(), 60_000);
    assert!(
        rows.iter().any(|r| r.4.contains('/')),
        "the file has ranges"
    );
    let (missing, _) = check_all(&app, &rows).await;
    assert!(
        missing.is_empty(),
        "{} false negatives, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );

    let outsiders = read_rows(&non_members);
    assert_eq!(outsiders.len(), 100_000);
    let (_, hits) = check_all(&app, &outsiders).await;
    assert!(
        hits.is_empty(),
        "{} false positives, e.g. {:?}",
        hits.len(),
        hits.first()
    );

    // The audit sees exactly the import.
    let audit: Json = serde_json::from_str(&tools(
        &redis,
        &prefix,
        &["audit", "--json", "--compare-sample", "2000"],
    ))
    .unwrap();
    assert_eq!(audit["entries"], 60_000);
    assert_eq!(audit["buckets"], 150);
    assert_eq!(audit["hashtable_buckets"].as_array().map_or(0, Vec::len), 0);
    let bpe = audit["bytes_per_entry"].as_f64().unwrap();
    assert!(bpe > 16.0 && bpe < 18.5, "bytes per entry {bpe}");

    // Nothing generated has expired: a sweep reclaims nothing and changes nothing.
    let before = redis.digest();
    let sweep = tools(&redis, &prefix, &["sweep", "--max-ops-per-sec", "0"]);
    let report: Json = serde_json::from_str(sweep.lines().last().unwrap()).unwrap();
    assert_eq!(report["fields_reclaimed"], 0, "{report}");
    assert_eq!(redis.digest(), before);
}
