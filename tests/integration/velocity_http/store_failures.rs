//! When the store fails: a killed Redis (events refused with 503, evaluate degraded when
//! fail-open, 503 when fail-closed), and ingestion across store timeouts (an event refused with
//! 503 is applied by its retry, events of a shared call dropped by its sender count once, an
//! update answered after the deadline is not applied twice).

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{RedisServer, redis_settings, spawn_app};
use namelist::domain::now_ms;
use namelist::lists::FailMode;
use namelist::metrics::Metrics;
use namelist::startup::open_store;
use namelist::store::{Deadline, MetricAnswer, MetricOp, MetricStore, StoreResult};
use namelist::velocity::{
    EventInput, FieldValue, Fields, Velocity, VelocityError, VelocitySettings,
};
use serde_json::{Value, json};

use super::{MINUTE, evaluate, events, expect_error, features, ok, put_metric, put_rule, relaxed};

// ---- a killed Redis ----

async fn redis_killed(mode: FailMode) {
    let mut redis = RedisServer::start();
    let mut settings = redis_settings(&redis);
    settings.fail_mode = mode;
    settings.check_deadline_ms = 200;
    settings.write_deadline_ms = 300;
    settings.connect_timeout_ms = 200;
    let app = spawn_app(settings).await;
    put_metric(&app, "logins_1h", "COUNT(1h, login) BY user_id", None).await;
    put_rule(&app, "too_many_logins", "logins_1h > 3").await;
    let login = |id: &str| json!({"id": id, "type": "login", "fields": {"user_id": "u1"}});
    let res = events(
        &app,
        &json!({"events": [login("a"), login("b"), login("c"), login("d")]}),
    )
    .await;
    assert_eq!(res["applied"], 4);
    let ask = json!({"lists": ["black"], "subjects": {"uid": "u1"},
                     "event": login("e"), "metrics": ["logins_1h"], "rules": ["too_many_logins"]});
    let res = evaluate(&app, &ask).await;
    assert_eq!(res["rules"], json!({"too_many_logins": true}), "{res}");
    assert_eq!(res["features"], json!({"logins_1h": 5}));

    tokio::task::block_in_place(|| redis.kill());

    // Events: refused, never falsely acknowledged (with and without ids).
    for body in [
        login("f"),
        json!({"type": "login", "fields": {"user_id": "u2"}}),
    ] {
        let started = Instant::now();
        let res = app.post("/v1/events", &body).await;
        expect_error(res, 503, "store_unavailable").await;
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "refused promptly: {:?}",
            started.elapsed()
        );
    }
    expect_error(
        app.post(
            "/v1/features",
            &json!({"metrics": ["logins_1h"], "fields": {"user_id": "u1"}}),
        )
        .await,
        503,
        "store_unavailable",
    )
    .await;
    let res = app.post("/v1/evaluate", &ask).await;
    match mode {
        FailMode::Open => {
            assert_eq!(res.status(), 200);
            let mut body: Value = res.json().await.unwrap();
            // The list part came from the local tier alone: how long since it was in sync.
            let stale = body.as_object_mut().unwrap().remove("stale_ms");
            assert!(
                stale.as_ref().is_some_and(Value::is_u64),
                "stale_ms: {stale:?}"
            );
            assert_eq!(
                body,
                json!({"hits": [], "features": {"logins_1h": null},
                       "rules": {"too_many_logins": false}, "degraded": true}),
                "fail-open: no features, no rule fires, flagged degraded"
            );
        }
        FailMode::Closed => {
            expect_error(res, 503, "store_unavailable").await;
        }
    }
    // Without lists too: the metric work alone decides.
    let no_lists =
        json!({"event": login("g"), "metrics": ["logins_1h"], "rules": ["too_many_logins"]});
    let res = app.post("/v1/evaluate", &no_lists).await;
    match mode {
        FailMode::Open => {
            let body = ok(res, "fail-open evaluate").await;
            assert_eq!(body["degraded"], true, "{body}");
            assert_eq!(body["features"], json!({"logins_1h": null}));
            assert_eq!(body["rules"], json!({"too_many_logins": false}));
        }
        FailMode::Closed => {
            expect_error(res, 503, "store_unavailable").await;
        }
    }
    // Bad requests are still 400, not 503.
    expect_error(
        app.post(
            "/v1/events",
            &json!({"type": "login", "ts": now_ms() + 10 * MINUTE}),
        )
        .await,
        400,
        "event_in_future",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_fail_open() {
    redis_killed(FailMode::Open).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_fail_closed() {
    redis_killed(FailMode::Closed).await;
}

// ---- ingestion across store timeouts (API.md: a 503 is never a false success) ----

/// Redis pauses (`DEBUG SLEEP`, as in a slow fork or a failover) past the write deadline
/// while an event is being applied: the caller gets 503 and retries as told. Whether the
/// update landed after the deadline or not, the event counts exactly once: the retry applies
/// it if it did not land, and is a duplicate if it did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_refused_with_503_is_applied_by_its_retry() {
    let redis = RedisServer::start();
    let mut settings = relaxed(redis_settings(&redis));
    settings.write_deadline_ms = 100;
    let app = spawn_app(settings).await;
    put_metric(&app, "cnt", "COUNT(1h, tx) BY device_id", None).await;
    // Loads the scripts, so that the only slow thing below is the pause.
    events(
        &app,
        &json!({"id": "warm", "type": "tx", "fields": {"device_id": "w"}}),
    )
    .await;

    let sleeper = redis.debug_sleep(0.4);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let event = json!({"id": "e1", "type": "tx", "fields": {"device_id": "d1"}});
    expect_error(
        app.post("/v1/events", &event).await,
        503,
        "store_unavailable",
    )
    .await;
    tokio::task::block_in_place(|| sleeper.join().unwrap());

    let retry = events(&app, &event).await;
    let count = features(&app, &["cnt"], json!({"device_id": "d1"}), None).await;
    assert_eq!(count, json!({"cnt": 1}), "applied exactly once ({retry})");
    assert!(
        retry == json!({"applied": 1, "duplicates": 0, "late": 0})
            || retry == json!({"applied": 0, "duplicates": 1, "late": 0}),
        "the retry applies it, or finds it applied: {retry}"
    );
}

/// Redis pauses past the write deadline while one-event requests keep arriving, so that
/// they queue behind the calls in flight and share calls (one node:
/// `store::redis::coalesce`), and a shared call's sender runs out of time with the call
/// unanswered. The requests it carried send their own updates again, alone; every caller
/// that got 503 retries the same id. Whatever landed when, each event counts exactly once
/// and every request ends answered as applied or as a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_of_a_dropped_shared_call_count_once() {
    const EVENTS: usize = 60;
    let redis = RedisServer::start();
    let mut settings = relaxed(redis_settings(&redis));
    settings.write_deadline_ms = 150;
    let app = Arc::new(spawn_app(settings).await);
    put_metric(&app, "cnt", "COUNT(1h, tx) BY device_id", None).await;
    events(
        &app,
        &json!({"id": "warm", "type": "tx", "fields": {"device_id": "w"}}),
    )
    .await;
    let resent_before = namelist::store::redis::coalesce::resent();

    let sleeper = redis.debug_sleep(0.3);
    tokio::time::sleep(Duration::from_millis(20)).await;
    // One event every 4 ms across the pause; each caller retries its 503s with the same id.
    let callers: Vec<_> = (0..EVENTS)
        .map(|i| {
            let app = app.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(4 * i as u64)).await;
                let event = json!({"id": format!("e{i}"), "type": "tx",
                                   "fields": {"device_id": format!("d{i}")}});
                let mut answers = Vec::new();
                for _ in 0..100 {
                    let res = app.post("/v1/events", &event).await;
                    let status = res.status().as_u16();
                    let body: Value = res.json().await.unwrap();
                    answers.push((status, body.clone()));
                    match status {
                        200 => return answers,
                        503 => tokio::time::sleep(Duration::from_millis(25)).await,
                        _ => panic!("event e{i}: {status} {body}"),
                    }
                }
                panic!("event e{i} never answered 200: {answers:?}");
            })
        })
        .collect();
    let mut refused = 0;
    for (i, caller) in callers.into_iter().enumerate() {
        let answers = caller.await.unwrap();
        refused += answers.len() - 1;
        let (_, last) = answers.last().unwrap();
        assert!(
            *last == json!({"applied": 1, "duplicates": 0, "late": 0})
                || *last == json!({"applied": 0, "duplicates": 1, "late": 0}),
            "event e{i} ends applied or found applied: {answers:?}"
        );
        for (status, body) in &answers[..answers.len() - 1] {
            assert_eq!(*status, 503, "only 503s are retried: {body}");
        }
    }
    tokio::task::block_in_place(|| sleeper.join().unwrap());
    for i in 0..EVENTS {
        let count = features(&app, &["cnt"], json!({"device_id": format!("d{i}")}), None).await;
        assert_eq!(count, json!({"cnt": 1}), "event e{i} counted exactly once");
    }
    let resent = namelist::store::redis::coalesce::resent() - resent_before;
    eprintln!(
        "{refused} requests refused with 503, {resent} sent again after their shared call was dropped"
    );
    assert!(
        refused > 0 && resent > 0,
        "the window was not reached: {refused} requests refused, {resent} sent again after \
         their shared call was dropped"
    );
    // Operators see the resends.
    let exposition = app.get("/metrics").await.text().await.unwrap();
    let scraped = exposition
        .lines()
        .find_map(|l| l.strip_prefix("namelist_velocity_updates_resent_total "))
        .and_then(|v| v.parse::<u64>().ok());
    assert_eq!(
        scraped,
        Some(namelist::store::redis::coalesce::resent()),
        "the resends in /metrics"
    );
}

/// The real Redis store's metric state, except that the answer to a metric update arrives
/// late (after Redis applied it) while `late` is set: a network stall or a slow Redis as the
/// service sees it. Definitions and the bus are the real store's, untouched.
struct LateAnswers {
    inner: Arc<dyn MetricStore>,
    late: AtomicBool,
    delay: Duration,
}

common::store_base_from_inner!(LateAnswers);

#[async_trait::async_trait]
impl MetricStore for LateAnswers {
    async fn metric_ops(
        &self,
        ops: &[MetricOp],
        deadline: Deadline,
    ) -> StoreResult<Vec<MetricAnswer>> {
        let answer = self.inner.metric_ops(ops, deadline).await;
        if self.late.load(Ordering::Relaxed) && ops.iter().any(|op| op.update.is_some()) {
            tokio::time::sleep(self.delay).await;
        }
        answer
    }
}

/// An update that Redis applied but answered after the write deadline: the caller got
/// 503 (`Unavailable`) and retries the same event id, as told. The event must be counted
/// once (service.rs: "at-most-once, never twice"); it must not be applied again because
/// its marker was removed while its update had landed. (Driven through the library, with
/// the answers delayed on purpose, because over HTTP the timing is not deterministic.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_answered_after_the_deadline_is_not_applied_twice() {
    let redis = RedisServer::start();
    let opened = open_store(&redis_settings(&redis))
        .await
        .expect("store opens");
    let store = Arc::new(LateAnswers {
        inner: opened.store.clone(),
        late: AtomicBool::new(false),
        delay: Duration::from_millis(300),
    });
    let velocity = Velocity::new(
        store.clone(),
        opened.store.clone(),
        opened.store,
        VelocitySettings {
            read_deadline: Duration::from_secs(2),
            write_deadline: Duration::from_millis(100),
            fail_mode: FailMode::Open,
            distinct_cap: 10_000,
            dedupe_window: std::time::Duration::from_secs(86_400),
            limits: namelist::velocity::DefinitionLimits::default(),
        },
        Arc::new(Metrics::new()),
    )
    .await
    .expect("velocity starts");
    velocity
        .put_metric("cnt".parse().unwrap(), "COUNT(1h, tx) BY device_id", None)
        .await
        .unwrap();
    let mut fields = Fields::new();
    fields.insert("device_id".into(), FieldValue::Text("d1".into()));
    let event = EventInput {
        id: Some("e1".into()),
        event_type: "tx".parse().unwrap(),
        ts: None,
        fields: fields.clone(),
    };

    store.late.store(true, Ordering::Relaxed);
    let first = velocity.ingest(std::slice::from_ref(&event)).await;
    assert!(
        matches!(first, Err(VelocityError::Unavailable(_))),
        "the late answer is a timeout (503): {first:?}"
    );
    store.late.store(false, Ordering::Relaxed);
    let retry = velocity
        .ingest(std::slice::from_ref(&event))
        .await
        .expect("the retry is answered");
    let read = velocity
        .features(&["cnt".parse().unwrap()], &fields, None)
        .await
        .unwrap();
    assert_eq!(
        read.values.values().next(),
        Some(&json!(1)),
        "event e1 counted more than once: the first attempt answered 503 but its update \
         landed, its marker was removed, and the retry answered {retry:?} and applied it again"
    );
}
