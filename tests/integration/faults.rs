//! Sabotage: Redis killed (SIGKILL) or paused (`DEBUG SLEEP`) under a stream of checks.
//! Every answer must come within the check deadline (plus the HTTP round trip), fail-open
//! as `degraded: true` with `stale_ms`, fail-closed as 503 + `Retry-After`; writes are
//! refused, never falsely acknowledged; and the service recovers when Redis is back,
//! without a restart of its own. With a complete local tier (the default for a keyspace that
//! fits) a fail-open answer is exact, values never seen included, and `stale_ms` is the time
//! since Redis went away; with the tier off there is nothing local to answer from.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{RedisServer, TestApp, redis_settings, spawn_app};
use namelist::lists::FailMode;
use serde_json::{Value, json};

const DEADLINE_MS: u64 = 20;
/// Allowance for the HTTP round trip and scheduling on a busy 2-core CI machine.
const SLACK_MS: u64 = 60;

#[derive(Debug, Clone)]
struct Answer {
    at: Instant,
    took: Duration,
    status: u16,
    degraded: Option<bool>,
    listed_hit: bool,
    /// Hits other than `d-hit` (none is listed).
    other_hits: usize,
    /// `stale_ms`: absent (`None`), null (`Some(None)`) or a number.
    stale_ms: Option<Option<u64>>,
    retry_after: bool,
}

/// Sends checks back to back until `stop`, recording every answer.
async fn stream_checks(app: Arc<TestApp>, stop: Arc<AtomicBool>) -> Vec<Answer> {
    let mut out = Vec::new();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        // One cached hit, one cached miss, one value never seen (needs the store).
        let body = json!({"lists": ["black"], "subjects": {"device": ["d-hit", "d-miss", format!("fresh-{i}")]}});
        let started = Instant::now();
        let res = app.post("/v1/check", &body).await;
        let took = started.elapsed();
        let status = res.status().as_u16();
        let retry_after = res.headers().contains_key("retry-after");
        let body: Value = res.json().await.unwrap_or(Value::Null);
        let hits = body["hits"].as_array().cloned().unwrap_or_default();
        out.push(Answer {
            at: started,
            took,
            status,
            degraded: body["degraded"].as_bool(),
            listed_hit: hits.iter().any(|h| h["value"] == "d-hit"),
            other_hits: hits.iter().filter(|h| h["value"] != "d-hit").count(),
            stale_ms: body.get("stale_ms").map(Value::as_u64),
            retry_after,
        });
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    out
}

/// Whether the instance has its local tier (complete: the test keyspace fits) or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    Complete,
    /// A budget far below the keyspace: partial mode, filters of every bucket.
    Filters,
    Off,
}

async fn setup(mode: FailMode, tier: Tier) -> (RedisServer, Arc<TestApp>) {
    // Persistent, as in production: a Redis restarted without its data is a lost keyspace,
    // which the service refuses to take as empty lists (tests/integration/keyspace_lost.rs).
    let redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut settings = redis_settings(&redis);
    settings.fail_mode = mode;
    match tier {
        Tier::Off => settings.local_memory_mb = 0.0,
        // 5,000 buckets would take 3.2 MB as copies.
        Tier::Filters => settings.local_memory_mb = 1.0,
        Tier::Complete => {}
    }
    settings.check_deadline_ms = DEADLINE_MS;
    settings.write_deadline_ms = 300;
    settings.connect_timeout_ms = 200;
    let app = Arc::new(spawn_app(settings).await);
    assert_eq!(app.lists.cache().is_complete(), tier == Tier::Complete);
    let res = app
        .post(
            "/v1/lists/black/entries",
            &json!({"entries": [{"dimension": "device", "value": "d-hit"}]}),
        )
        .await;
    assert_eq!(res.status(), 200);
    let body = app
        .check(&json!({"lists": ["black"], "subjects": {"device": ["d-hit", "d-miss"]}}))
        .await;
    assert_eq!(body["hits"].as_array().unwrap().len(), 1);
    // The write's bucket has been read again: the copy is complete and current.
    assert!(app.lists.cache().wait_idle(Duration::from_secs(5)).await);
    if tier == Tier::Filters {
        assert!(
            app.lists.cache().filter_bytes() > 0,
            "partial mode keeps filters"
        );
        // Every bucket's filter read: a value never seen is answered without Redis.
        let started = Instant::now();
        let mut n = 0;
        loop {
            n += 1;
            let sent = app
                .metric("namelist_cache_misses_total")
                .await
                .unwrap_or(0.0);
            let body = app
                .check(&json!({"lists": ["black"], "subjects": {"device": format!("warm-{n}")}}))
                .await;
            assert!(body["hits"].as_array().unwrap().is_empty());
            if app
                .metric("namelist_cache_misses_total")
                .await
                .unwrap_or(0.0)
                == sent
            {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "filters not read"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    (redis, app)
}

async fn write_status(app: &TestApp, value: &str) -> (u16, Duration) {
    let started = Instant::now();
    let res = app
        .post(
            "/v1/lists/black/entries",
            &json!({"entries": [{"dimension": "device", "value": value}]}),
        )
        .await;
    (res.status().as_u16(), started.elapsed())
}

async fn outage(mode: FailMode, tier: Tier) {
    let (mut redis, app) = setup(mode, tier).await;
    let stop = Arc::new(AtomicBool::new(false));
    let checks = tokio::spawn(stream_checks(app.clone(), stop.clone()));

    tokio::time::sleep(Duration::from_millis(200)).await;
    let killed_at = Instant::now();
    // Process management blocks: keep it off the runtime's worker (and the app's tasks).
    tokio::task::block_in_place(|| redis.kill());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, took) = write_status(&app, "written-while-down").await;
    assert_eq!(status, 503, "a write while Redis is down is refused");
    assert!(
        took < Duration::from_millis(300 + SLACK_MS),
        "refused within the write deadline: {took:?}"
    );
    // Not ready while the store is unreachable (Kubernetes stops routing to the pod); the
    // probe answers within its own 1 s bound, never hangs.
    let started = Instant::now();
    let res = app.get("/readyz").await;
    assert_eq!(res.status(), 503, "/readyz while Redis is down");
    assert!(
        started.elapsed() < Duration::from_millis(1_000 + SLACK_MS),
        "/readyz answered in {:?}",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let restarted_at = Instant::now();
    tokio::task::block_in_place(|| redis.restart());

    // Recovery: answers are whole again, without restarting the service.
    let mut recovered_at = None;
    while restarted_at.elapsed() < Duration::from_secs(10) {
        let body = app
            .post(
                "/v1/check",
                &json!({"lists": ["black"], "subjects": {"device": "probe"}}),
            )
            .await;
        if body.status() == 200 && body.json::<Value>().await.unwrap()["degraded"] == false {
            recovered_at = Some(Instant::now());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let recovered_at = recovered_at.expect("the service recovers once Redis is back");
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let answers = checks.await.unwrap();

    let (status, _) = write_status(&app, "written-after").await;
    assert_eq!(status, 200, "writes succeed again");
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status(), 200, "ready again");
    // Redis's persistence is its own configuration's: `/readyz` does not claim it.
    let ready: Value = ready.json().await.unwrap();
    assert_eq!(ready, json!({"status": "ready", "store": "redis"}));
    let body = app
        .check(&json!({"lists": ["black"], "subjects": {"device": "written-after"}}))
        .await;
    assert_eq!(
        body["hits"].as_array().unwrap().len(),
        1,
        "and are read back"
    );
    let mut conn = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    assert!(
        !keys.is_empty(),
        "the write after recovery is in the restarted Redis"
    );

    let during: Vec<&Answer> = answers
        .iter()
        // Answered wholly while Redis was down (an answer racing the restart may be whole).
        .filter(|a| a.at > killed_at + Duration::from_millis(50) && a.at + a.took < restarted_at)
        .collect();
    assert!(
        during.len() > 20,
        "the stream kept going during the outage: {}",
        during.len()
    );
    let slowest = answers.iter().map(|a| a.took).max().unwrap();
    eprintln!(
        "{mode:?}: {} answers, {} during the outage, slowest {slowest:?}, recovered {:?} after restart",
        answers.len(),
        during.len(),
        recovered_at - restarted_at
    );
    for a in answers
        .iter()
        .filter(|a| a.took > Duration::from_millis(DEADLINE_MS + SLACK_MS))
    {
        eprintln!(
            "slow: {:?} after kill: {:?} status {}",
            a.took,
            a.at.checked_duration_since(killed_at),
            a.status
        );
    }
    for a in &answers {
        assert!(
            a.took < Duration::from_millis(DEADLINE_MS + SLACK_MS),
            "an answer took {:?} (status {})",
            a.took,
            a.status
        );
        assert!(a.status == 200 || a.status == 503, "status {}", a.status);
    }
    for a in &during {
        match mode {
            FailMode::Open => {
                assert_eq!(a.status, 200);
                assert_eq!(
                    a.degraded,
                    Some(true),
                    "fail-open answers are flagged degraded"
                );
                assert_eq!(a.other_hits, 0, "no false hit");
                match tier {
                    Tier::Off => {
                        assert!(!a.listed_hit, "nothing local to answer from");
                        assert_eq!(a.stale_ms, Some(None), "stale_ms null: no local copy");
                    }
                    Tier::Complete | Tier::Filters => {
                        // With filters, the listed value is answered if its bucket is held as
                        // a copy (it is hot), else missed; the values on no list come from
                        // their buckets' filters. (Which lookups a filter answered is not
                        // visible here: `tier::tests` checks that one does.)
                        if tier == Tier::Complete {
                            assert!(a.listed_hit, "the complete copy still reports the hit");
                        }
                        // Stale since the subscription last proved it delivered: its last
                        // answered ping, at most one proof period (25 ms) before the kill.
                        let since_kill = a.at.duration_since(killed_at).as_millis() as u64;
                        let stale = a.stale_ms.flatten().expect("stale_ms in a degraded answer");
                        assert!(
                            stale <= since_kill + a.took.as_millis() as u64 + 45
                                && stale + 200 >= since_kill,
                            "stale_ms {stale} for an answer {since_kill} ms after the kill"
                        );
                    }
                }
            }
            FailMode::Closed => {
                assert_eq!(a.status, 503, "fail-closed refuses");
                assert!(a.retry_after, "503 carries Retry-After");
            }
        }
    }
    let before: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.at + a.took < killed_at)
        .collect();
    assert!(!before.is_empty());
    assert!(before.iter().all(|a| a.status == 200
        && a.degraded == Some(false)
        && a.stale_ms.is_none()
        && a.listed_hit
        && a.other_hits == 0));
    let after: Vec<&Answer> = answers.iter().filter(|a| a.at > recovered_at).collect();
    assert!(!after.is_empty());
    assert!(
        after
            .iter()
            .all(|a| a.status == 200 && a.degraded == Some(false))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_fail_open_with_a_complete_copy() {
    outage(FailMode::Open, Tier::Complete).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_fail_open_with_filters() {
    outage(FailMode::Open, Tier::Filters).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_fail_open_without_a_tier() {
    outage(FailMode::Open, Tier::Off).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_fail_closed() {
    outage(FailMode::Closed, Tier::Complete).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_paused_answers_within_the_deadline() {
    let (redis, app) = setup(FailMode::Open, Tier::Complete).await;
    let stop = Arc::new(AtomicBool::new(false));
    let checks = tokio::spawn(stream_checks(app.clone(), stop.clone()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let paused_at = Instant::now();
    let sleeper = redis.debug_sleep(0.5);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, _) = write_status(&app, "written-while-paused").await;
    sleeper.join().unwrap();
    let resumed_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let answers = checks.await.unwrap();

    // The pause (500 ms) outlasts the write deadline (300 ms): the write was refused and
    // must not be claimed; it may still land once Redis wakes up (not acknowledged ≠ not
    // applied), so the caller retries an idempotent upsert.
    assert_eq!(
        status, 503,
        "a write that missed its deadline is not acknowledged"
    );
    let during: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.at > paused_at + Duration::from_millis(20) && a.at + a.took < resumed_at)
        .collect();
    assert!(
        during.len() > 10,
        "checks kept flowing during the pause: {}",
        during.len()
    );
    for a in &answers {
        assert!(
            a.took < Duration::from_millis(DEADLINE_MS + SLACK_MS),
            "an answer took {:?}",
            a.took
        );
    }
    // A paused Redis takes no writes: until the subscription's ping notices, the complete
    // copy is in sync and answers normally; after, answers are degraded. Exact either way.
    for a in &during {
        assert!(a.listed_hit, "the hit is reported");
        assert_eq!(a.other_hits, 0, "no false hit");
        match a.degraded {
            Some(true) => assert!(a.stale_ms.flatten().is_some(), "stale_ms when degraded"),
            _ => assert_eq!(a.stale_ms, None),
        }
    }
    let last = answers.last().unwrap();
    assert_eq!(
        last.degraded,
        Some(false),
        "answers are whole again after the pause"
    );
}

/// Checks on an HTTP worker read over that worker's own connection once it is up
/// (`store::redis::worker_conn`), not only the shared one: after a few checks, more than one
/// connection has `HGET` as its last command. (With the per-worker path broken, only the
/// shared connection would.) The outage tests above then cover its reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_ride_the_workers_own_connections() {
    let (redis, app) = setup(FailMode::Open, Tier::Off).await;
    for i in 0..40 {
        let body = app
            .check(&json!({"lists": ["black"], "subjects": {"device": format!("w-{i}")}}))
            .await;
        assert_eq!(body["degraded"], false);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let list = redis.client_list();
    let reading = list.lines().filter(|l| l.contains(" cmd=hget ")).count();
    assert!(
        reading >= 2,
        "connections whose last command was HGET:\n{list}"
    );
}
