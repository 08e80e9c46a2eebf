//! Two instances on one Redis: definitions reach every instance within 100 ms (pub/sub).

use crate::common;

use std::time::{Duration, Instant};

use common::{RedisServer, TestApp, redis_settings, spawn_app};
use serde_json::{Value, json};

use super::{events, expect_error, features, ok, put_metric, put_rule, relaxed, send};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definitions_reach_every_instance_within_100_ms() {
    let redis = RedisServer::start();
    let settings = relaxed(redis_settings(&redis));
    let a = spawn_app(settings.clone()).await;
    let b = spawn_app(settings).await;

    /// Polls `app` until `check` holds, at most `limit`; how long it took.
    async fn until(
        app: &TestApp,
        limit: Duration,
        path: &str,
        check: impl Fn(u16, &Value) -> bool,
    ) -> Option<Duration> {
        let started = Instant::now();
        loop {
            let res = app.get(path).await;
            let status = res.status().as_u16();
            let body: Value = res.json().await.unwrap_or(Value::Null);
            if check(status, &body) {
                return Some(started.elapsed());
            }
            if started.elapsed() > limit {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    // Warm-up: B's subscription is up once it sees a first definition.
    put_metric(&a, "warm", "COUNT(1h, tx) BY d", None).await;
    until(&b, Duration::from_secs(5), "/v1/metrics/warm", |s, _| {
        s == 200
    })
    .await
    .expect("instance B never saw the warm-up definition");

    let limit = Duration::from_millis(100);
    let def = put_metric(&a, "dev_1h", "COUNT(1h, tx) BY device_id", None).await;
    let took = until(&b, limit, "/v1/metrics/dev_1h", |s, body| {
        s == 200 && body["version"] == def["version"]
    })
    .await
    .expect("a definition made on A is on B within 100 ms");
    eprintln!("definition reached B after {took:?}");
    // Usable on B: events there, features on A and B.
    let res = events(&b, &json!({"type": "tx", "fields": {"device_id": "d1"}})).await;
    assert_eq!(res, json!({"applied": 1, "duplicates": 0, "late": 0}));
    for app in [&a, &b] {
        assert_eq!(
            features(app, &["dev_1h"], json!({"device_id": "d1"}), None).await,
            json!({"dev_1h": 1})
        );
    }

    // A change on A: B reads the new version (no old counts) within 100 ms.
    let changed = put_metric(&a, "dev_1h", "COUNT(1h, tx) BY device_id", Some("1m")).await;
    assert_eq!(changed["version"], 2);
    until(&b, limit, "/v1/metrics/dev_1h", |s, body| {
        s == 200 && body["version"] == 2
    })
    .await
    .expect("a redefinition on A is on B within 100 ms");
    assert_eq!(
        features(&b, &["dev_1h"], json!({"device_id": "d1"}), None).await,
        json!({"dev_1h": 0})
    );

    // A rule defined on B over it; a delete on B reaches A.
    put_rule(&b, "busy", "dev_1h >= 1").await;
    until(&a, limit, "/v1/rules/busy", |s, _| s == 200)
        .await
        .expect("a rule made on B is on A within 100 ms");
    ok(
        send(&b, "DELETE", "/v1/rules/busy", None).await,
        "DELETE rule",
    )
    .await;
    ok(
        send(&b, "DELETE", "/v1/metrics/dev_1h", None).await,
        "DELETE metric",
    )
    .await;
    until(&a, limit, "/v1/metrics/dev_1h", |s, _| s == 404)
        .await
        .expect("a delete on B is on A within 100 ms");
    expect_error(
        a.post(
            "/v1/features",
            &json!({"metrics": ["dev_1h"], "fields": {"device_id": "d1"}}),
        )
        .await,
        400,
        "unknown_metric",
    )
    .await;
}
