//! Failover on a local Redis Cluster: a primary is killed (SIGKILL) under a stream of checks
//! and writes. Once its replica is promoted the service answers whole again without a restart
//! of its own; no write it acknowledged is lost (writes wait for one replica, `WAIT 1`); the
//! test reports how long answers were degraded.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{RedisCluster, TestApp, cluster_settings, spawn_app};
use serde_json::{Value, json};

const DEADLINE_MS: u64 = 50;

#[derive(Debug, Clone, Copy)]
struct Answer {
    at: Instant,
    took: Duration,
    ok: bool,
    degraded: bool,
}

async fn checks(app: Arc<TestApp>, stop: Arc<AtomicBool>) -> Vec<Answer> {
    let mut out = Vec::new();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let started = Instant::now();
        let res = app
            .post(
                "/v1/check",
                &json!({"lists": ["black"], "subjects": {"uid": ["seed-0", format!("probe-{i}")]}}),
            )
            .await;
        let took = started.elapsed();
        let ok = res.status() == 200;
        let body: Value = res.json().await.unwrap_or(Value::Null);
        out.push(Answer {
            at: started,
            took,
            ok,
            degraded: body["degraded"] != false,
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    out
}

/// Writes `w-<i>` one at a time; returns the acknowledged ones.
async fn writes(app: Arc<TestApp>, stop: Arc<AtomicBool>, refused: Arc<Mutex<u64>>) -> Vec<String> {
    let mut acked = Vec::new();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let uid = format!("w-{i}");
        let res = app
            .post(
                "/v1/lists/black/entries",
                &json!({"entries": [{"dimension": "uid", "value": uid}]}),
            )
            .await;
        if res.status() == 200 {
            acked.push(uid);
        } else {
            assert_eq!(
                res.status(),
                503,
                "a write is acknowledged or refused, nothing else"
            );
            *refused.lock().unwrap() += 1;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_under_load_loses_no_acknowledged_write() {
    let mut cluster = tokio::task::block_in_place(RedisCluster::start);
    assert!(tokio::task::block_in_place(
        || cluster.wait_replicas_online(Duration::from_secs(30))
    ));
    let mut settings = cluster_settings(&cluster);
    settings.write_replicas = 1;
    settings.check_deadline_ms = DEADLINE_MS;
    settings.write_deadline_ms = 2_000;
    settings.connect_timeout_ms = 300;
    let app = Arc::new(spawn_app(settings).await);
    let seeded: Vec<Value> = (0..200)
        .map(|i| json!({"dimension": "uid", "value": format!("seed-{i}")}))
        .collect();
    let res = app
        .post("/v1/lists/black/entries", &json!({ "entries": seeded }))
        .await;
    assert_eq!(res.status(), 200);

    let stop = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(Mutex::new(0));
    let check_task = tokio::spawn(checks(app.clone(), stop.clone()));
    let write_task = tokio::spawn(writes(app.clone(), stop.clone(), refused.clone()));
    tokio::time::sleep(Duration::from_millis(800)).await;

    let victim = tokio::task::block_in_place(|| cluster.primary());
    let killed_at = Instant::now();
    tokio::task::block_in_place(|| cluster.nodes[victim].kill());
    assert!(
        tokio::task::block_in_place(|| cluster.wait_failover(Duration::from_secs(30))),
        "the replica was promoted"
    );
    let promoted_after = killed_at.elapsed();
    // The old primary comes back (as Kubernetes would restart it) and rejoins as a replica,
    // so writes to its slots can be replicated again.
    tokio::task::block_in_place(|| cluster.nodes[victim].restart());
    assert!(tokio::task::block_in_place(
        || cluster.wait_ok(Duration::from_secs(30))
    ));

    // Wait for answers to be whole again: 50 in a row, without restarting the service.
    let recovered = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let res = app
            .post(
                "/v1/lists/black/entries",
                &json!({"entries": [{"dimension": "uid", "value": "after-failover"}]}),
            )
            .await;
        let mut whole = res.status() == 200;
        for _ in 0..50 {
            let body = app
                .check(&json!({"lists": ["black"], "subjects": {"uid": "seed-1"}}))
                .await;
            whole &= body["degraded"] == false && body["hits"].as_array().unwrap().len() == 1;
        }
        if whole {
            break killed_at.elapsed();
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(60),
            "the service did not recover"
        );
    };
    stop.store(true, Ordering::Relaxed);
    let answers = check_task.await.unwrap();
    let acked = write_task.await.unwrap();

    let degraded: Vec<&Answer> = answers.iter().filter(|a| a.degraded || !a.ok).collect();
    let window = match (degraded.first(), degraded.last()) {
        (Some(a), Some(b)) => b.at + b.took - a.at,
        _ => Duration::ZERO,
    };
    eprintln!(
        "failover: promoted {promoted_after:?} after the kill, whole again after {recovered:?}; \
         {} of {} checks degraded over {window:?}; {} writes acknowledged, {} refused; slowest check {:?}",
        degraded.len(),
        answers.len(),
        acked.len(),
        refused.lock().unwrap(),
        answers.iter().map(|a| a.took).max().unwrap_or_default()
    );
    for a in &answers {
        assert!(a.ok, "fail-open checks never fail");
        assert!(
            a.took < Duration::from_millis(DEADLINE_MS + 400),
            "a check took {:?}",
            a.took
        );
    }
    assert!(acked.len() > 20, "writes went on: {}", acked.len());

    // Every acknowledged write is there, read from the store itself.
    for uid in &acked {
        let body: Value = app
            .get(&format!("/v1/lists/black/entries/uid/{uid}"))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(body["listed"], true, "acknowledged write {uid} was lost");
    }
}
