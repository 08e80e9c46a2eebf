//! Writes that wait for replicas, on real primaries and replicas:
//!
//! * a write blocked in `WAIT` for seconds (its replica frozen with SIGSTOP: the primary still
//!   counts it connected, so nothing refuses the write early) does not delay checks on the
//!   same node: they answer within their deadline, exact, on one node and on a cluster;
//! * a primary with fewer online replicas than `write_replicas` refuses every write at once,
//!   entries, events and definitions alike (`503 replicas_unavailable` + `Retry-After`, the
//!   guarantee named, nothing written), while reads answer; once a replica is online, writes
//!   are acknowledged again, without a restart;
//! * a write names its connection (`CLIENT INFO`, which `WAIT` needs) only when it waits for
//!   replicas: without, Redis is not asked for it (it cost 4–6 µs of Redis a write).

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{RedisCluster, RedisServer, TestApp, cluster_settings, redis_settings, spawn_app};
use namelist::config::Settings;
use namelist::domain::{Dimension, Value as Entry};
use namelist::store::Layout;
use namelist::store::layout::key_slot;
use serde_json::{Value, json};

const CHECK_DEADLINE_MS: u64 = 400;
const WRITE_DEADLINE_MS: u64 = 3_000;

fn slot(layout: &Layout, uid: &str) -> u16 {
    let dim: Dimension = "uid".parse().unwrap();
    let value = Entry::parse_entry(&dim, uid).unwrap();
    let k = layout.entry_key(
        &"black".parse().unwrap(),
        &dim,
        &"default".parse().unwrap(),
        &value,
    );
    key_slot(layout.bucket_key(k.bucket).as_bytes())
}

fn settings(mut s: Settings) -> Settings {
    s.write_replicas = 1;
    s.check_deadline_ms = CHECK_DEADLINE_MS;
    s.write_deadline_ms = WRITE_DEADLINE_MS;
    s
}

async fn upsert(app: &TestApp, uids: &[String]) -> (u16, Value, bool) {
    let entries: Vec<Value> = uids
        .iter()
        .map(|u| json!({"dimension": "uid", "value": u}))
        .collect();
    let res = app
        .post("/v1/lists/black/entries", &json!({ "entries": entries }))
        .await;
    let status = res.status().as_u16();
    let retry_after = res.headers().contains_key("retry-after");
    (status, res.json().await.unwrap_or(Value::Null), retry_after)
}

/// Checks `seeds` (listed) and fresh probes (never listed, so they reach Redis) every few ms
/// until `stop`; (took, exact) per answer.
async fn check_stream(
    app: Arc<TestApp>,
    seeds: Vec<String>,
    probes: Vec<String>,
    stop: Arc<AtomicBool>,
) -> Vec<(Duration, bool)> {
    let mut out = Vec::new();
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let seed = &seeds[i % seeds.len()];
        let values = vec![
            seed.clone(),
            probes[i % probes.len()].clone(),
            format!("never-{i}"),
        ];
        let started = Instant::now();
        let res = app
            .post(
                "/v1/check",
                &json!({"lists": ["black"], "subjects": {"uid": values}}),
            )
            .await;
        let took = started.elapsed();
        let ok = res.status() == 200;
        let body: Value = res.json().await.unwrap_or(Value::Null);
        let hits: Vec<&str> = body["hits"]
            .as_array()
            .map(|h| h.iter().filter_map(|x| x["value"].as_str()).collect())
            .unwrap_or_default();
        out.push((
            took,
            ok && body["degraded"] == false && hits == [seed.as_str()],
        ));
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    out
}

/// With the replica of the node holding `blocked` frozen: three writes to it wait in `WAIT`
/// while checks of that node's entries keep flowing. Returns how long the writes took.
async fn writes_blocked_checks_flow(
    app: Arc<TestApp>,
    blocked: Vec<String>,
    seeds: Vec<String>,
    probes: Vec<String>,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let checks = tokio::spawn(check_stream(app.clone(), seeds, probes, stop.clone()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let writers: Vec<_> = blocked
        .into_iter()
        .map(|uid| {
            let app = app.clone();
            tokio::spawn(async move {
                let (status, body, _) = upsert(&app, &[uid]).await;
                (status, body, Instant::now())
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for w in writers {
        outcomes.push(w.await.unwrap());
    }
    let blocked_for = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let answers = checks.await.unwrap();
    let during = answers.len();
    let slowest = answers.iter().map(|a| a.0).max().unwrap_or_default();
    eprintln!(
        "writes blocked in WAIT for {blocked_for:?}; {during} checks meanwhile, slowest {slowest:?}"
    );
    for (status, body, _) in &outcomes {
        assert_eq!(
            *status, 503,
            "a write whose replica acknowledges nothing is not acknowledged: {body}"
        );
        assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
    }
    assert!(
        blocked_for > Duration::from_millis(WRITE_DEADLINE_MS / 2),
        "the writes really waited (WAIT, not an early refusal): {blocked_for:?}"
    );
    assert!(
        blocked_for < Duration::from_millis(WRITE_DEADLINE_MS + 500),
        "and no longer than their deadline: {blocked_for:?}"
    );
    assert!(during > 50, "checks kept flowing: {during}");
    for (took, exact) in &answers {
        assert!(*exact, "a check during the blocked writes was not exact");
        assert!(
            *took < Duration::from_millis(CHECK_DEADLINE_MS),
            "a check took {took:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_blocked_in_wait_does_not_delay_checks_on_one_node() {
    let primary = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
    let replica = RedisServer::start_replica_of(&primary, &[]);
    assert!(tokio::task::block_in_place(
        || primary.wait_online_replicas(1, Duration::from_secs(10))
    ));
    let app = Arc::new(spawn_app(settings(redis_settings(&primary))).await);
    let seeds: Vec<String> = (0..50).map(|i| format!("seed-{i}")).collect();
    assert_eq!(
        upsert(&app, &seeds).await.0,
        200,
        "acknowledged with a replica"
    );
    let probes: Vec<String> = (0..50).map(|i| format!("probe-{i}")).collect();

    replica.pause();
    let blocked: Vec<String> = (0..3).map(|i| format!("blocked-{i}")).collect();
    writes_blocked_checks_flow(app.clone(), blocked, seeds, probes).await;
    // Every WAIT was given less than the caller's deadline: none outlives its write.
    let info: String = redis::cmd("INFO")
        .arg("clients")
        .query(&mut primary.conn())
        .unwrap();
    assert!(
        info.contains("blocked_clients:0"),
        "a WAIT is still blocked on the server after its write's deadline: {info}"
    );
    replica.resume();
    assert!(tokio::task::block_in_place(
        || primary.wait_online_replicas(1, Duration::from_secs(10))
    ));
    assert_eq!(
        upsert(&app, &["after".to_owned()]).await.0,
        200,
        "acknowledged again once the replica runs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_blocked_in_wait_does_not_delay_checks_on_a_cluster() {
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    assert!(tokio::task::block_in_place(
        || cluster.wait_replicas_online(Duration::from_secs(30))
    ));
    let app = Arc::new(spawn_app(settings(cluster_settings(&cluster))).await);
    let layout = app.lists.store().layout().clone();
    // Everything on the primary of slot 0: its replica will be frozen.
    let primary = tokio::task::block_in_place(|| cluster.primary_of_slot(0));
    let on_it = |prefix: &str, n: usize| -> Vec<String> {
        let map = cluster.slot_map();
        let port = cluster.nodes[primary].port;
        (0..)
            .map(|i| format!("{prefix}-{i}"))
            .filter(|u| {
                let s = slot(&layout, u);
                map.iter()
                    .any(|(a, b, p)| *p == port && (*a..=*b).contains(&s))
            })
            .take(n)
            .collect()
    };
    let (seeds, probes, blocked) = tokio::task::block_in_place(|| {
        (on_it("seed", 30), on_it("probe", 30), on_it("blocked", 3))
    });
    assert_eq!(
        upsert(&app, &seeds).await.0,
        200,
        "acknowledged with replicas"
    );
    let replica = tokio::task::block_in_place(|| cluster.replica_of(primary)).expect("a replica");

    cluster.nodes[replica].pause();
    writes_blocked_checks_flow(app.clone(), blocked, seeds, probes).await;
    cluster.nodes[replica].resume();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_few_replicas_refuse_every_write_at_once_until_one_joins() {
    let primary = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
    let app = spawn_app(settings(redis_settings(&primary))).await;

    // Entries.
    let started = Instant::now();
    let (status, body, retry_after) = upsert(&app, &["refused".to_owned()]).await;
    let took = started.elapsed();
    assert_eq!(status, 503, "{body}");
    assert!(retry_after, "503 carries Retry-After");
    assert_eq!(body["error"]["code"], "replicas_unavailable", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("1 replica")
            && message.contains("0-16383")
            && message.contains("0 online"),
        "the message names the guarantee: {message}"
    );
    assert!(
        message.contains("nothing was written"),
        "and what happened: {message}"
    );
    assert!(
        took < Duration::from_millis(100),
        "refused at once, not after the write deadline: {took:?}"
    );
    let res = app
        .delete(
            "/v1/lists/black/entries",
            &json!({"entries": [{"dimension": "uid", "value": "refused"}]}),
        )
        .await;
    assert_eq!(res.status(), 503);
    let body: Value = res.json().await.unwrap();
    assert_eq!(
        body["error"]["code"], "replicas_unavailable",
        "a delete too"
    );

    // Velocity: definitions and events are writes; feature reads are not.
    let define = |app: &TestApp, expr: &str| {
        app.client
            .put(app.url("/v1/metrics/logins_1h"))
            .json(&json!({ "expr": expr }))
            .send()
    };
    let res = define(&app, "COUNT(1h, login) BY uid").await.unwrap();
    assert_eq!(res.status(), 503);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["error"]["code"], "replicas_unavailable", "{body}");
    // An instance that does not wait for replicas defines the metric; ours loads it.
    let lax = spawn_app(Settings {
        key_prefix: app.lists.store().layout().prefix().to_owned(),
        ..redis_settings(&primary)
    })
    .await;
    assert_eq!(
        define(&lax, "COUNT(1h, login) BY uid")
            .await
            .unwrap()
            .status(),
        200
    );
    let loaded = Instant::now();
    while app.get("/v1/metrics/logins_1h").await.status() != 200 {
        assert!(
            loaded.elapsed() < Duration::from_secs(5),
            "the definition reached us"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    let res = app
        .post(
            "/v1/events",
            &json!({"type": "login", "fields": {"uid": "u1"}}),
        )
        .await;
    assert_eq!(res.status(), 503);
    assert!(started.elapsed() < Duration::from_millis(100), "at once");
    let body: Value = res.json().await.unwrap();
    assert_eq!(
        body["error"]["code"], "replicas_unavailable",
        "an event: {body}"
    );
    let res = app
        .post(
            "/v1/features",
            &json!({"metrics": ["logins_1h"], "fields": {"uid": "u1"}}),
        )
        .await;
    assert_eq!(res.status(), 200, "a feature read is no write");
    let body: Value = res.json().await.unwrap();
    assert_eq!(
        body["values"]["logins_1h"], 0,
        "the event was not applied: {body}"
    );

    // Reads answer, and nothing was written.
    let body = app
        .check(&json!({"lists": ["black"], "subjects": {"uid": "refused"}}))
        .await;
    assert_eq!(body["degraded"], false);
    assert_eq!(body["hits"], json!([]));
    let mut conn = primary.conn();
    let buckets: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}b:*", app.lists.store().layout().prefix()))
        .query(&mut conn)
        .unwrap();
    assert!(buckets.is_empty(), "nothing was written: {buckets:?}");
    let refusals = app
        .metric("namelist_write_refusals_total{reason=\"replicas\"}")
        .await
        .unwrap_or(0.0);
    assert!(refusals >= 4.0, "refusals are counted: {refusals}");

    // A replica joins: writes are acknowledged again, without a restart.
    let joined_at = Instant::now();
    let _replica = RedisServer::start_replica_of(&primary, &[]);
    let acknowledged = loop {
        let (status, _, _) = upsert(&app, &["after-join".to_owned()]).await;
        if status == 200 {
            break joined_at.elapsed();
        }
        assert!(
            joined_at.elapsed() < Duration::from_secs(10),
            "writes never came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("a replica started: writes acknowledged again after {acknowledged:?}");
    let res = define(&app, "COUNT(2h, login) BY uid").await.unwrap();
    assert_eq!(res.status(), 200, "a definition too");
    let res = app
        .post(
            "/v1/events",
            &json!({"type": "login", "fields": {"uid": "u1"}}),
        )
        .await;
    assert_eq!(res.status(), 200, "and an event");
    let res = app
        .post(
            "/v1/features",
            &json!({"metrics": ["logins_1h"], "fields": {"uid": "u1"}}),
        )
        .await;
    assert_eq!(res.status(), 200);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["values"]["logins_1h"], 1, "{body}");
    assert!(
        primary.command_stat("client|info", "calls") > 0,
        "writes that wait for a replica name their connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_that_wait_for_no_replica_do_not_name_their_connection() {
    let redis = RedisServer::start();
    let app = spawn_app(redis_settings(&redis)).await;
    let (status, body, _) = upsert(&app, &["a".to_owned(), "b".to_owned()]).await;
    assert_eq!(status, 200, "{body}");
    let res = app
        .client
        .put(app.url("/v1/metrics/logins_1h"))
        .json(&json!({"expr": "COUNT(1h, login) BY uid"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let res = app
        .post(
            "/v1/events",
            &json!({"id": "e1", "type": "login", "fields": {"uid": "u1"}}),
        )
        .await;
    assert_eq!(res.status(), 200);
    let res = app
        .delete(
            "/v1/lists/black/entries",
            &json!({"entries": [{"dimension": "uid", "value": "a"}]}),
        )
        .await;
    assert_eq!(res.status(), 200);
    // The writes reached Redis: "b" is listed, "a" deleted, the event counted.
    let body = app
        .check(&json!({"lists": ["black"], "subjects": {"uid": ["a", "b"]}}))
        .await;
    assert_eq!(body["hits"].as_array().map(Vec::len), Some(1), "{body}");
    let res = app
        .post(
            "/v1/features",
            &json!({"metrics": ["logins_1h"], "fields": {"uid": "u1"}}),
        )
        .await;
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["values"]["logins_1h"], 1, "{body}");
    assert_eq!(
        redis.command_stat("client|info", "calls"),
        0,
        "no write asked Redis to name its connection"
    );
}
