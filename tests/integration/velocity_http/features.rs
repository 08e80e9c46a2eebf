//! `POST /v1/features` per aggregation as API.md says (integers, 0 and null when nothing was
//! seen, `at`), on Redis and embedded; a COUNT_DISTINCT at its member cap says so (`capped`).

use crate::common;

use common::{RedisServer, TestApp, redis_settings, spawn_app};
use namelist::domain::now_ms;
use serde_json::{Value, json};

use super::{
    HOUR, app_on, embedded_app, events, expect_error, features, is_integer, ok, put_metric, relaxed,
};

/// Values of every aggregation, on whichever store the app runs on.
async fn aggregations_read_as_api_md_says(app: &TestApp) {
    for (id, expr) in [
        ("c", "COUNT(1h, pay) BY userid"),
        ("s", "SUM(1h, pay, amount) BY userid"),
        ("a", "AVG(1h, pay, amount) BY userid"),
        ("mn", "MIN(1h, pay, amount) BY userid"),
        ("mx", "MAX(1h, pay, amount) BY userid"),
        ("cd", "COUNT_DISTINCT(1h, pay, device_id) BY userid"),
        ("ap", "APPROX_COUNT_DISTINCT(1h, pay, device_id) BY userid"),
        ("hourly", "COUNT(1d, pay) BY userid"),
    ] {
        put_metric(app, id, expr, None).await;
    }
    let all = ["c", "s", "a", "mn", "mx", "cd", "ap"];

    // Nothing seen.
    let v = features(app, &all, json!({"userid": "nobody"}), None).await;
    assert_eq!(
        v,
        json!({"c": 0, "s": 0, "a": null, "mn": null, "mx": null, "cd": 0, "ap": 0})
    );
    for k in ["c", "s", "cd", "ap"] {
        assert!(is_integer(&v[k]), "{k} is the integer 0: {v}");
    }

    // Three payments on two devices; the group-by value sent as a number and as a string is
    // one entity.
    let res = events(
        app,
        &json!({"events": [
            {"type": "pay", "fields": {"userid": 12345, "device_id": "d1", "amount": 10}},
            {"type": "pay", "fields": {"userid": "12345", "device_id": "d2", "amount": 20.5}},
            {"type": "pay", "fields": {"userid": 12345, "device_id": "d1", "amount": "-3.25"}},
        ]}),
    )
    .await;
    assert_eq!(
        res["applied"],
        3 * 8,
        "every metric of `pay`, three times: {res}"
    );
    let v = features(app, &all, json!({"userid": "12345"}), None).await;
    assert_eq!(v["c"], 3);
    assert_eq!(v["s"], json!(27.25));
    assert!((v["a"].as_f64().unwrap() - 27.25 / 3.0).abs() < 1e-9, "{v}");
    assert_eq!(v["mn"], json!(-3.25));
    assert_eq!(v["mx"], json!(20.5));
    assert_eq!(v["cd"], 2);
    assert_eq!(v["ap"], 2);
    for k in ["c", "cd", "ap"] {
        assert!(is_integer(&v[k]), "{k} is an integer: {v}");
    }
    assert_eq!(
        features(app, &["c"], json!({"userid": 12345}), None).await,
        json!({"c": 3}),
        "asked with a number"
    );
    // Whole amounts are integers in the JSON; others exact decimals.
    events(
        app,
        &json!({"type": "pay", "fields": {"userid": "whole", "device_id": "d1", "amount": 2.5}}),
    )
    .await;
    events(
        app,
        &json!({"type": "pay", "fields": {"userid": "whole", "device_id": "d1", "amount": 0.5}}),
    )
    .await;
    let v = features(app, &["s", "a", "mx"], json!({"userid": "whole"}), None).await;
    assert_eq!(v, json!({"s": 3, "a": 1.5, "mx": 2.5}));
    assert!(is_integer(&v["s"]), "{v}");

    // `at` in the past: the window ending then.
    let now = now_ms();
    events(
        app,
        &json!({"events": [
            {"type": "pay", "ts": now - 3 * HOUR, "fields": {"userid": "past", "amount": 1}},
            {"type": "pay", "ts": now - 3 * HOUR, "fields": {"userid": "past", "amount": 1}},
            {"type": "pay", "ts": now, "fields": {"userid": "past", "amount": 1}},
        ]}),
    )
    .await;
    let at = |t: i64| features(app, &["hourly"], json!({"userid": "past"}), Some(t));
    assert_eq!(at(now).await, json!({"hourly": 3}));
    assert_eq!(at(now - 2 * HOUR).await, json!({"hourly": 2}));
    assert_eq!(at(now - 4 * HOUR).await, json!({"hourly": 0}));
    assert_eq!(
        features(app, &["hourly", "c"], json!({"userid": "past"}), None).await,
        json!({"hourly": 3, "c": 1})
    );

    // Errors.
    for (body, code, says) in [
        (
            json!({"metrics": ["c", "cd"], "fields": {"device_id": "d1"}}),
            "missing_field",
            "fields.userid",
        ),
        (
            json!({"metrics": ["c", "nope"], "fields": {"userid": "u"}}),
            "unknown_metric",
            "nope",
        ),
        (
            json!({"metrics": ["c", "No"], "fields": {"userid": "u"}}),
            "invalid_metric_id",
            "metrics[1]",
        ),
        (
            json!({"metrics": ["c"], "fields": {"userid": {"id": 1}}}),
            "invalid_field",
            "fields.userid",
        ),
        (
            json!({"fields": {"userid": "u"}}),
            "invalid_body",
            "metrics",
        ),
    ] {
        let msg = expect_error(app.post("/v1/features", &body).await, 400, code).await;
        assert!(msg.contains(says), "{code}: {msg:?} should name {says:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn features_per_aggregation_on_redis() {
    let redis = RedisServer::start();
    let app = app_on(&redis).await;
    aggregations_read_as_api_md_says(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn features_per_aggregation_embedded() {
    let app = embedded_app().await;
    aggregations_read_as_api_md_says(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_distinct_count_at_its_cap_is_reported() {
    let redis = RedisServer::start();
    let mut settings = relaxed(redis_settings(&redis));
    settings.distinct_cap = 3;
    let app = spawn_app(settings).await;
    put_metric(
        &app,
        "users",
        "COUNT_DISTINCT(1h, login, userid) BY device_id",
        None,
    )
    .await;
    put_metric(&app, "logins", "COUNT(1h, login) BY device_id", None).await;
    let logins: Vec<Value> = ["u1", "u2", "u2"]
        .iter()
        .map(|u| json!({"type": "login", "fields": {"device_id": "d1", "userid": u}}))
        .collect();
    events(&app, &json!({ "events": logins })).await;
    let ask = json!({"metrics": ["users", "logins"], "fields": {"device_id": "d1"}});
    let res = ok(app.post("/v1/features", &ask).await, "features").await;
    assert_eq!(
        res,
        json!({"values": {"users": 2, "logins": 3}}),
        "under the cap"
    );
    let more: Vec<Value> = ["u3", "u4", "u5"]
        .iter()
        .map(|u| json!({"type": "login", "fields": {"device_id": "d1", "userid": u}}))
        .collect();
    events(&app, &json!({ "events": more })).await;
    let res = ok(app.post("/v1/features", &ask).await, "features").await;
    assert_eq!(
        res,
        json!({"values": {"users": 3, "logins": 6}, "capped": ["users"]}),
        "at the cap: the count is a lower bound, and says so"
    );
    let res = ok(app.post("/v1/evaluate", &ask).await, "evaluate").await;
    assert_eq!(res["capped"], json!(["users"]), "{res}");
}

/// Feature reads on an HTTP worker go over that worker's own read connection once it is up
/// (`store::redis::worker_conn`, as checks do), not the shared one, whose round trip hops
/// threads twice: after 40 reads a connection speaking RESP3 (the worker's own; the shared
/// read connection speaks RESP2, and the write pool carries nothing here: no events) has
/// run the metric script last. Over the shared connection alone, none would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn features_ride_the_workers_own_read_connection() {
    let redis = RedisServer::start();
    let app = app_on(&redis).await;
    put_metric(&app, "cnt", "COUNT(1h, tx) BY device_id", None).await;
    for i in 0..40 {
        let read = features(&app, &["cnt"], json!({"device_id": format!("r-{i}")}), None).await;
        assert_eq!(read["cnt"], 0, "{read}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let list = redis.client_list();
    let own = list
        .lines()
        .filter(|l| {
            let mut fields = l.split_whitespace();
            l.contains(" cmd=evalsha ") && fields.any(|f| f == "resp=3")
        })
        .count();
    assert_eq!(
        own, 1,
        "connections speaking RESP3 whose last command ran the metric script:\n{list}"
    );
}
