//! The operator tools end to end: `gen` → `import` → every generated row answers listed
//! through the running service (no false negatives) and none of the generated non-members
//! does (no false positives); then `audit` and `sweep` on the same keyspace. The same chain
//! on a local Redis Cluster: `import` then `audit --json` against an independent sum over
//! every primary, and the service on the cluster answering the imported rows.

// The root's test helpers (redis-server on free ports, local clusters, the app on port 0),
// shared by path rather than copied.
use crate::common;
use crate::shared::{Probe, check_all, generate, tools, tools_outcome, tools_with};

use std::path::Path;

use common::{RedisCluster, RedisServer, cluster_settings, redis_settings, spawn_app};
use namelist::domain::{Dimension, Value};
use serde_json::Value as Json;

/// A row of a gen file: where it is listed, the value to check, what a hit must show.
type Row = Probe;

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
            Probe {
                list: list.into(),
                sandbox: sandbox.into(),
                dimension: dim.into(),
                check: probe,
                shown,
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gen_import_check_no_false_negatives_or_positives() {
    let redis = RedisServer::start_with(&["--sanitize-dump-payload", "yes"]);
    let settings = redis_settings(&redis);
    let prefix = settings.key_prefix.clone();
    let dir = tempfile::tempdir().unwrap();
    let (members, non_members) = (dir.path().join("m.csv"), dir.path().join("n.csv"));
    generate(
        &["--rows", "60000", "--non-member-rows", "100000"],
        &members,
        &non_members,
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
        rows.iter().any(|r| r.shown.contains('/')),
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
    assert_eq!(audit["buckets"], 300, "60,000 entries, 200 per bucket");
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

/// (bucket keys, sum of MEMORY USAGE, sum of HLEN) of `prefix` over every primary of the
/// cluster, each primary asked directly (`ROLE`, `SCAN`, `MEMORY USAGE`, `HLEN`).
fn cluster_totals(cluster: &RedisCluster, prefix: &str) -> (u64, u64, u64, usize) {
    let (mut keys, mut bytes, mut fields, mut primaries) = (0, 0, 0, 0);
    for node in &cluster.nodes {
        let mut conn = node.conn();
        let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut conn).unwrap();
        if !matches!(&role[0], redis::Value::BulkString(b) if b == b"master") {
            continue;
        }
        primaries += 1;
        let mut cursor = 0u64;
        let mut found: Vec<String> = Vec::new();
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{prefix}b:*"))
                .arg("COUNT")
                .arg(1000)
                .query(&mut conn)
                .unwrap();
            found.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
        found.sort();
        found.dedup();
        for k in &found {
            let b: u64 = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(k)
                .arg("SAMPLES")
                .arg(0)
                .query(&mut conn)
                .unwrap();
            let f: u64 = redis::cmd("HLEN").arg(k).query(&mut conn).unwrap();
            bytes += b;
            fields += f;
        }
        keys += found.len() as u64;
    }
    (keys, bytes, fields, primaries)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_and_audit_on_a_cluster() {
    const ROWS: usize = 40_000;
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    let urls = cluster.urls().join(",");
    let prefix = "p:";
    let dir = tempfile::tempdir().unwrap();
    let (members, non_members) = (dir.path().join("m.csv"), dir.path().join("n.csv"));
    let rows = ROWS.to_string();
    tools_with(&[
        "gen",
        "--rows",
        &rows,
        "--non-member-rows",
        "3000",
        "--quiet",
        "--out",
        members.to_str().unwrap(),
        "--non-members",
        non_members.to_str().unwrap(),
    ]);
    let global = ["--cluster-nodes", &urls, "--prefix", prefix];

    let summary: Json = serde_json::from_str(&tools_with(
        &[
            &global[..],
            &[
                "--expected-entries",
                &rows,
                "import",
                members.to_str().unwrap(),
                "--quiet",
                "--json",
            ],
        ]
        .concat(),
    ))
    .unwrap();
    assert_eq!(summary["rows_rejected"], 0, "{summary}");
    assert_eq!(summary["entries_written"], ROWS, "{summary}");

    // The audit sees exactly the import, on every primary.
    let audit: Json = serde_json::from_str(&tools_with(
        &[
            &global[..],
            &["audit", "--json", "--compare-sample", "2000"],
        ]
        .concat(),
    ))
    .unwrap();
    let (keys, bytes, fields, primaries) =
        tokio::task::block_in_place(|| cluster_totals(&cluster, prefix));
    assert_eq!(primaries, 3);
    assert_eq!(fields, ROWS as u64, "the independent sum of HLEN");
    assert_eq!(audit["entries"], ROWS, "{audit}");
    assert_eq!(
        audit["bytes"], bytes,
        "the sum of MEMORY USAGE over every primary"
    );
    assert_eq!(audit["buckets"], keys);
    assert_eq!(audit["buckets_found"], keys);
    assert_eq!(
        audit["keyspace_buckets"],
        ROWS as u64 / 200,
        "200 entries per bucket"
    );
    assert_eq!(audit["cluster"], true);
    let nodes = audit["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3);
    assert_eq!(
        nodes
            .iter()
            .map(|n| n["bytes"].as_u64().unwrap())
            .sum::<u64>(),
        bytes
    );
    assert!(nodes.iter().all(|n| n["buckets"].as_u64().unwrap() > 0));
    assert_eq!(audit["hashtable_buckets"].as_array().map_or(0, Vec::len), 0);
    let bpe = audit["bytes_per_entry"].as_f64().unwrap();
    assert!(bpe > 16.0 && bpe < 18.5, "bytes per entry {bpe}");
    assert_eq!(audit["comparison"]["scratch_keys_left"], 0, "{audit}");
    assert_eq!(audit["comparison"]["layouts"].as_array().unwrap().len(), 5);

    // The table and the page carry a line per primary.
    let html = dir.path().join("audit.html");
    let table = tools_with(
        &[
            &global[..],
            &[
                "audit",
                "--compare-sample",
                "0",
                "--html",
                html.to_str().unwrap(),
            ],
        ]
        .concat(),
    );
    assert!(table.contains("per primary"), "{table}");
    for n in nodes {
        assert!(table.contains(n["node"].as_str().unwrap()), "{table}");
    }
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("Per primary"));

    // The service on the cluster answers the imported rows as listed (a sample of them), and
    // none of the non-members.
    let mut settings = cluster_settings(&cluster);
    settings.key_prefix = prefix.to_owned();
    let app = spawn_app(settings).await;
    let all = read_rows(&members);
    assert_eq!(all.len(), ROWS);
    let sample: Vec<Row> = all.iter().step_by(ROWS / 4000).cloned().collect();
    assert!(sample.len() >= 4000);
    let (missing, _) = check_all(&app, &sample).await;
    assert!(
        missing.is_empty(),
        "{} false negatives, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    let (_, hits) = check_all(&app, &read_rows(&non_members)).await;
    assert!(hits.is_empty(), "{} false positives", hits.len());
    app.stop().await;

    // A primary that does not hold the meta hash loses its data: the tools refuse the
    // keyspace, naming the slots, until `keyspace create --lost-for-good` accepts the loss
    // (those slots marked again, empty), and then take it as it is.
    let meta = namelist::store::Layout::meta_key_of(prefix);
    let meta_node = cluster.primary_of_slot(namelist::store::layout::key_slot(meta.as_bytes()));
    let lost = cluster
        .primaries()
        .into_iter()
        .find(|n| n.port != cluster.nodes[meta_node].port)
        .expect("another primary");
    let () = redis::cmd("FLUSHALL").query(&mut lost.conn()).unwrap();
    let run = |args: &[&str]| tools_outcome(&[], &[&global[..], args].concat());
    let (ok, _, err) = run(&["audit", "--compare-sample", "0"]);
    assert!(!ok && err.contains("hash slot"), "{err}");
    let (ok, _, err) = run(&["keyspace", "create"]);
    assert!(!ok && err.contains("--lost-for-good"), "{err}");
    let (ok, out, err) = run(&["keyspace", "create", "--lost-for-good"]);
    assert!(ok, "{err}");
    assert!(out.contains("marked again"), "{out}");
    let audit: Json = serde_json::from_str(&tools_with(
        &[&global[..], &["audit", "--json", "--compare-sample", "0"]].concat(),
    ))
    .unwrap();
    let left = audit["entries"].as_u64().unwrap();
    assert!(
        left > 0 && left < ROWS as u64,
        "the other primaries' entries kept: {audit}"
    );
}

/// With `create_keyspace = false` (production's setting, shared by the service and the tools)
/// `import` never makes a keyspace on an empty Redis (a daily delta imported into a Redis
/// that restarted empty would otherwise become the whole list); `keyspace create` makes one
/// explicitly, says so once, and then does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_create_keyspace_only_keyspace_create_makes_one() {
    let redis = RedisServer::start();
    let url = redis.url();
    let global = ["--redis-url", url.as_str(), "--prefix", "nk:"];
    let env = [("NAMELIST_CREATE_KEYSPACE", "false")];
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("delta.csv");
    std::fs::write(&csv, "list,dimension,value\nblack,uid,u1\n").unwrap();
    let import = [&global[..], &["import", csv.to_str().unwrap(), "--quiet"]].concat();

    let (ok, _, err) = tools_outcome(&env, &import);
    assert!(!ok && err.contains("create_keyspace = false"), "{err}");
    let keys: i64 = redis::cmd("DBSIZE").query(&mut redis.conn()).unwrap();
    assert_eq!(keys, 0, "nothing written");

    let create = [&global[..], &["keyspace", "create"]].concat();
    let (ok, out, err) = tools_outcome(&env, &create);
    assert!(ok && out.contains("made a new keyspace"), "{out}{err}");
    let (ok, out, err) = tools_outcome(&env, &create);
    assert!(ok && out.contains("nothing done"), "{out}{err}");
    let (ok, _, err) = tools_outcome(&env, &import);
    assert!(ok, "{err}");

    let mut settings = redis_settings(&redis);
    settings.key_prefix = "nk:".into();
    settings.create_keyspace = false;
    let app = spawn_app(settings).await;
    let body = app
        .check(&serde_json::json!({"lists": ["black"], "subjects": {"uid": "u1"}}))
        .await;
    assert_eq!(body["hits"][0]["value"], "u1", "{body}");
    app.stop().await;
}
