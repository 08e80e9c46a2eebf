//! The sweep on a local Redis Cluster: every primary walked, resumed across primaries
//! (checkpoint and `--cursor HOST:PORT/CURSOR`), a checkpoint of another topology restarting
//! the walk.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{RedisCluster, RedisServer};
use namelist::domain::now_ms;
use namelist::store::StoreBase;
use namelist::store::redis::bulk::compare_and_delete;
use namelist::store::redis::{RedisOptions, RedisStore};
use namelist_tools::sweep::{self, Args, Position, SweepReport};

use super::{
    Snapshot, args_at, forget_expired, id_buckets, mix, remember_ids, snapshot_matching,
    sweep_time, tools, write,
};

async fn open_cluster(cluster: &RedisCluster, prefix: &str, expected: u64) -> RedisStore {
    let (store, _) = RedisStore::open(RedisOptions {
        cluster_nodes: cluster.urls(),
        expected_entries: Some(expected),
        default_expected_entries: expected,
        connect_timeout: Duration::from_secs(2),
        response_timeout: Duration::from_secs(30),
        audit_max_len: 100,
        ..common::redis_options(String::new(), prefix)
    })
    .await
    .expect("opening the keyspace on the cluster");
    store
}

/// Everything on every primary, read from each primary directly.
fn cluster_snapshot(cluster: &RedisCluster) -> Snapshot {
    cluster_snapshot_matching(cluster, "*")
}

fn cluster_snapshot_matching(cluster: &RedisCluster, pattern: &str) -> Snapshot {
    let mut out = Snapshot::new();
    for node in cluster.primaries() {
        let part = snapshot_matching(node, pattern);
        for k in part.keys() {
            assert!(!out.contains_key(k), "a key on two primaries");
        }
        out.extend(part);
    }
    out
}

/// The buckets of keyspace `prefix` by bucket number (prefix-independent, so two keyspaces
/// of the same entries compare equal).
fn cluster_buckets(
    cluster: &RedisCluster,
    prefix: &str,
) -> BTreeMap<String, BTreeMap<Vec<u8>, Vec<u8>>> {
    cluster_snapshot_matching(cluster, &format!("{prefix}b:*"))
        .into_iter()
        .filter_map(|(k, (_, fields))| {
            let rest = k.strip_prefix(prefix.as_bytes())?.strip_prefix(b"b:")?;
            Some((String::from_utf8(rest.to_vec()).unwrap(), fields))
        })
        .collect()
}

fn primaries_digest(cluster: &RedisCluster) -> String {
    cluster
        .primaries()
        .into_iter()
        .map(RedisServer::digest)
        .collect::<Vec<_>>()
        .join(",")
}

fn totals(r: &SweepReport) -> (u64, u64, u64, u64, i64) {
    (
        r.buckets_scanned,
        r.fields_scanned,
        r.expired_found,
        r.fields_reclaimed,
        r.bytes_freed,
    )
}

/// Every cluster scenario on one local 6-node cluster (3 primaries, 3 replicas).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster() {
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    let urls = cluster.urls().join(",");
    let names: Vec<String> = cluster
        .primaries()
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    assert_eq!(names.len(), 3);
    let now = now_ms();
    let t = sweep_time(now);

    // Exactly the expired fields go, on every primary, and nothing else.
    let prefix = "s:";
    let store = open_cluster(&cluster, prefix, 2_000).await;
    let layout = store.layout().clone();
    let (entries, expired) = mix(&layout, 2_100, t, now);
    let (entries, expired): (Vec<_>, Vec<_>) = entries
        .into_iter()
        .zip(expired)
        .filter(|((k, _), _)| k.bucket != 9)
        .unzip();
    write(&store, &entries).await;
    let mut conn = cluster.conn();
    let _: () = redis::cmd("HSET")
        .arg(layout.bucket_key(3))
        .arg("123456")
        .arg("soon")
        .arg("not-a-field")
        .arg(1)
        .arg("777")
        .arg("01")
        .query(&mut conn)
        .unwrap();
    for key in [format!("{prefix}b:99"), format!("{prefix}b:x")] {
        let _: () = redis::cmd("HSET")
            .arg(key)
            .arg("1")
            .arg("1")
            .query(&mut conn)
            .unwrap();
    }
    let _: () = redis::cmd("SET")
        .arg(layout.bucket_key(9))
        .arg("not a hash")
        .query(&mut conn)
        .unwrap();
    let other = open_cluster(&cluster, &format!("{prefix}b:"), 400).await;
    write(&other, &[(other.layout().key_of(b"other"), 1)]).await;
    // Remembered event ids, in the buckets of the slots a cluster puts them in.
    let ids = remember_ids(&mut conn, &layout, t, now, |h| {
        layout.event_bucket_key(h, Some(h.rem_euclid(16_384) as u16))
    });

    let before = cluster_snapshot(&cluster);
    let mut homes: Vec<usize> = (0..10)
        .map(|b| {
            let key = layout.bucket_key(b);
            cluster
                .primaries()
                .iter()
                .position(|n| {
                    // Another primary answers MOVED.
                    redis::cmd("EXISTS")
                        .arg(&key)
                        .query::<bool>(&mut n.conn())
                        .unwrap_or(false)
                })
                .unwrap()
        })
        .collect();
    homes.sort_unstable();
    homes.dedup();
    assert!(homes.len() >= 2, "the buckets spread over the primaries");
    let mut expected = before.clone();
    for ((k, _), gone) in entries.iter().zip(&expired) {
        if *gone {
            let key = layout.bucket_key(k.bucket).into_bytes();
            let fields = &mut expected.get_mut(&key).unwrap().1;
            assert!(fields.remove(k.field.to_string().as_bytes()).is_some());
        }
    }
    let ids_expired = forget_expired(&mut expected, &ids);
    let n_expired = expired.iter().filter(|&&g| g).count() as u64;
    let report = sweep::sweep(&store, &args_at(t)).await.unwrap();
    assert!(
        cluster_snapshot(&cluster) == expected,
        "the sweep removed exactly the expired fields and ids"
    );
    assert_eq!(
        (report.event_buckets_scanned, report.event_ids_deleted),
        (id_buckets(&ids), ids_expired),
        "every primary's buckets of event ids swept"
    );
    assert!(report.done);
    assert_eq!(report.primaries, names);
    assert_eq!(report.primaries_done, 3);
    assert_eq!(
        (report.next_cursor, report.next_position.as_str()),
        (0, "0")
    );
    assert_eq!(report.next_node, None);
    assert_eq!(report.buckets_scanned, 9);
    // 5, and the 16,384 shard markers of the keyspace at `s:b:` (`s:b:{…}shard`), whose
    // names match the sweep's pattern.
    assert_eq!(report.keys_skipped, 5 + 16_384);
    assert_eq!(report.fields_scanned, entries.len() as u64 + 3);
    assert_eq!(report.unparseable, 3);
    assert_eq!(
        (report.expired_found, report.fields_reclaimed),
        (n_expired, n_expired)
    );
    assert!(report.bytes_freed > 0);
    assert!(report.scan_batches >= 3, "one SCAN per primary at least");
    let digest = primaries_digest(&cluster);
    let again = sweep::sweep(&store, &args_at(t)).await.unwrap();
    assert_eq!((again.expired_found, again.fields_reclaimed), (0, 0));
    assert_eq!(primaries_digest(&cluster), digest);

    // A dry run changes nothing.
    let dry_store = open_cluster(&cluster, "d:", 4_000).await;
    let (dry_entries, dry_expired) = mix(dry_store.layout(), 1_400, t, now);
    write(&dry_store, &dry_entries).await;
    let digest = primaries_digest(&cluster);
    let dry = sweep::sweep(
        &dry_store,
        &Args {
            dry_run: true,
            ..args_at(t)
        },
    )
    .await
    .unwrap();
    assert_eq!(primaries_digest(&cluster), digest);
    assert!(dry.done);
    assert_eq!(
        dry.expired_found,
        dry_expired.iter().filter(|&&g| g).count() as u64
    );
    assert_eq!(dry.fields_reclaimed, 0);

    // Resumed from its checkpoint, across primaries: the end state of one full sweep.
    let fill = |prefix: &'static str| {
        let cluster = &cluster;
        async move {
            let store = open_cluster(cluster, prefix, 20_000).await;
            let (entries, _) = mix(store.layout(), 12_000, t, now);
            write(&store, &entries).await;
            store
        }
    };
    let full = fill("rf:").await;
    let stepped = fill("rs:").await;
    assert!(cluster_buckets(&cluster, "rf:") == cluster_buckets(&cluster, "rs:"));
    let one = sweep::sweep(&full, &args_at(t)).await.unwrap();
    assert!(one.done && one.fields_reclaimed > 5_000);
    assert_eq!(one.buckets_scanned, 100);

    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("sweep.json");
    // Each keyspace on a cluster holds 16,384 shard markers, which SCAN walks past: batches
    // of 1,000 keys still take each primary in several runs.
    let args = Args {
        scan_count: 1_000,
        max_batches: Some(2),
        checkpoint: Some(checkpoint.clone()),
        resume: true,
        ..args_at(t)
    };
    let mut last: Option<SweepReport> = None;
    let mut seen_nodes = Vec::new();
    let mut runs = 0;
    while !last.as_ref().is_some_and(|r| r.done) {
        let r = sweep::sweep(&stepped, &args).await.unwrap();
        runs += 1;
        assert!(runs < 200, "the resumed sweep never finished");
        if let Some(prev) = &last {
            assert!(r.primaries_done >= prev.primaries_done);
            assert!(r.scan_batches <= prev.scan_batches + 2);
        }
        if !r.done {
            let saved: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&checkpoint).unwrap()).unwrap();
            assert_eq!(saved["targets"].as_array().unwrap().len(), 3);
            assert_eq!(saved["report"]["next_position"], r.next_position.as_str());
            let node = r
                .next_node
                .clone()
                .expect("a cluster position names its node");
            assert_eq!(r.next_position, format!("{node}/{}", r.next_cursor));
            assert_eq!(saved["target_index"], r.primaries_done);
            if seen_nodes.last() != Some(&node) {
                seen_nodes.push(node);
            }
        }
        last = Some(r);
    }
    assert_eq!(
        seen_nodes, names,
        "the walk went through every primary in turn"
    );
    assert!(!checkpoint.exists());
    let last = last.unwrap();
    assert_eq!(totals(&last), totals(&one));
    assert!(cluster_buckets(&cluster, "rf:") == cluster_buckets(&cluster, "rs:"));

    // By hand: --cursor HOST:PORT/CURSOR continues where a stopped run said.
    let full = fill("hf:").await;
    let stepped = fill("hs:").await;
    sweep::sweep(&full, &args_at(t)).await.unwrap();
    let mut cursor: Option<Position> = None;
    let mut positions = Vec::new();
    loop {
        let r = sweep::sweep(
            &stepped,
            &Args {
                cursor: cursor.clone(),
                scan_count: 1_000,
                max_batches: Some(3),
                ..args_at(t)
            },
        )
        .await
        .unwrap();
        if r.done {
            break;
        }
        positions.push(r.next_position.clone());
        cursor = Some(r.next_position.parse().unwrap());
        assert!(positions.len() < 200);
    }
    assert!(
        names
            .iter()
            .all(|n| positions.iter().any(|p| p.starts_with(&format!("{n}/")))),
        "{positions:?}"
    );
    assert!(cluster_buckets(&cluster, "hf:") == cluster_buckets(&cluster, "hs:"));
    // A bare cursor means nothing on a cluster; an address that is not a primary neither.
    let err = sweep::sweep(
        &stepped,
        &Args {
            cursor: Some(Position::Cursor(5)),
            ..args_at(t)
        },
    )
    .await
    .unwrap_err();
    assert!(format!("{err:#}").contains("HOST:PORT/CURSOR"), "{err:#}");
    let err = sweep::sweep(
        &stepped,
        &Args {
            cursor: Some("127.0.0.1:1/5".parse().unwrap()),
            ..args_at(t)
        },
    )
    .await
    .unwrap_err();
    assert!(format!("{err:#}").contains("not a primary"), "{err:#}");

    // A checkpoint of another topology starts the walk over, keeping its totals (binary).
    let full = fill("tf:").await;
    fill("ts:").await;
    sweep::sweep(&full, &args_at(t)).await.unwrap();
    let run = |extra: &[&str]| {
        let out = tools()
            .args(["sweep", "--cluster-nodes", &urls, "--prefix", "ts:"])
            .args(["--max-ops-per-sec", "0", "--now-ms", &t.to_string()])
            .args(["--checkpoint", checkpoint.to_str().unwrap(), "--resume"])
            .args(["--scan-count", "1000"])
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        let report: serde_json::Value =
            serde_json::from_str(String::from_utf8(out.stdout).unwrap().trim()).unwrap();
        (report, stderr)
    };
    // Stop somewhere on the second primary.
    loop {
        let (report, _) = run(&["--max-batches", "3"]);
        assert_eq!(report["done"], false, "{report}");
        if report["primaries_done"].as_u64().unwrap() >= 1 {
            break;
        }
    }
    let mut saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&checkpoint).unwrap()).unwrap();
    let scanned_before = saved["report"]["buckets_scanned"].as_u64().unwrap();
    assert!(scanned_before > 0);
    saved["targets"][0] = serde_json::json!({"Primary": {"host": "127.0.0.1", "port": 1}});
    std::fs::write(&checkpoint, saved.to_string()).unwrap();
    let (report, stderr) = run(&[]);
    assert!(stderr.contains("another topology"), "{stderr}");
    assert_eq!(report["done"], true);
    assert_eq!(
        report["buckets_scanned"].as_u64().unwrap(),
        scanned_before + 100,
        "the whole walk again, on top of the checkpoint's totals"
    );
    assert!(cluster_buckets(&cluster, "tf:") == cluster_buckets(&cluster, "ts:"));
    let help = tools().args(["sweep", "--help"]).output().unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    assert!(help.contains("HOST:PORT/CURSOR"), "{help}");
    assert!(help.contains("Redis Cluster"), "{help}");

    // compare-and-delete reloads its script on every primary after a SCRIPT FLUSH.
    for n in &cluster.nodes {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query(&mut n.conn())
            .unwrap();
    }
    let mut conn = store.connection();
    for b in 0..9 {
        let key = layout.bucket_key(b);
        let _: () = redis::cmd("HSET")
            .arg(&key)
            .arg("5")
            .arg("1")
            .query(&mut cluster.conn())
            .unwrap();
        let out = compare_and_delete(&mut conn, &key, &[("5", "1")])
            .await
            .unwrap();
        assert_eq!((out.deleted, out.refreshed), (1, 0), "{key}");
    }
}
