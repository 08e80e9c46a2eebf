//! The HTTP contract of the velocity endpoints (API.md, "Velocity metrics" and "Rules and the
//! one-call decision input") on the real application (port 0) and a real `redis-server`, and
//! where it is cheap on the embedded store too:
//!
//! * definitions: the exact response shape, versions (kept, bumped, never reused after a
//!   delete), list / get / delete, `metric_in_use`, `unknown_metric`;
//! * every bad definition, event, features and evaluate request is a 4xx with the exact
//!   error shape, a message that says where, and `DEBUG DIGEST` unchanged;
//! * events: single and batch forms, duplicates, late and future events;
//! * features per aggregation (integers, 0 and null when nothing was seen, `at`);
//! * the seeds' examples and the "logins in the last hour > 3" rule through `/v1/evaluate`;
//! * two instances on one Redis (definitions propagate by pub/sub within 100 ms);
//! * a killed Redis: events refused with 503, evaluate degraded (open) or 503 (closed);
//! * a COUNT_DISTINCT at its member cap says so (`capped`);
//! * ingestion across store timeouts: an event refused with 503 is applied by its retry, and
//!   never twice (the last of these drives the library over a store whose answers come
//!   late on purpose, because over HTTP that timing is not deterministic).
//!
//! `evaluate_names_the_event_as_sent`, `an_event_refused_with_503_is_applied_by_its_retry` and
//! `an_update_answered_after_the_deadline_is_not_applied_twice` were written against bugs (see
//! their docs) and guard their fixes.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{RedisServer, TestApp, redis_settings, spawn_app, test_settings};
use namelist::config::Settings;
use namelist::domain::now_ms;
use namelist::lists::FailMode;
use namelist::metrics::Metrics;
use namelist::startup::open_store;
use namelist::store::{
    Deadline, Layout, MetricAnswer, MetricOp, MetricStore, StoreBase, StoreResult,
};
use namelist::velocity::{
    EventInput, FieldValue, Fields, Velocity, VelocityError, VelocitySettings,
};
use serde_json::{Value, json};

const MINUTE: i64 = 60_000;
const HOUR: i64 = 3_600_000;
const DAY: i64 = 86_400_000;

/// Functional tests, not latency tests: a debug build on a busy 2-core machine must not turn
/// the 20 ms production read deadline into flaky 503s (deadlines are tested in faults.rs).
fn relaxed(mut settings: Settings) -> Settings {
    settings.check_deadline_ms = 2_000;
    settings
}

async fn app_on(redis: &RedisServer) -> TestApp {
    spawn_app(relaxed(redis_settings(redis))).await
}

async fn embedded_app() -> TestApp {
    spawn_app(relaxed(test_settings())).await
}

/// Asserts the exact error shape of API.md and returns the message.
async fn expect_error(res: reqwest::Response, status: u16, code: &str) -> String {
    let got = res.status().as_u16();
    let retry_after = res.headers().get("retry-after").cloned();
    let text = res.text().await.expect("error body");
    assert_eq!(got, status, "status for {code}: {text}");
    let body: Value = serde_json::from_str(&text).expect("error body is JSON");
    let obj = body.as_object().expect("error body is an object");
    assert_eq!(obj.len(), 1, "only `error` in {body}");
    let err = obj["error"].as_object().expect("`error` is an object");
    assert_eq!(err.len(), 2, "only code and message in {body}");
    assert_eq!(err["code"], code, "code in {body}");
    if status == 503 {
        assert_eq!(
            retry_after.as_ref().map(|v| v.to_str().unwrap()),
            Some("1"),
            "503 carries Retry-After"
        );
    }
    err["message"]
        .as_str()
        .expect("message is a string")
        .to_owned()
}

async fn send(app: &TestApp, method: &str, path: &str, body: Option<&[u8]>) -> reqwest::Response {
    let url = app.url(path);
    let req = match method {
        "GET" => app.client.get(url),
        "POST" => app.client.post(url),
        "PUT" => app.client.put(url),
        "DELETE" => app.client.delete(url),
        m => panic!("method {m}"),
    };
    let req = match body {
        Some(b) => req
            .header("content-type", "application/json")
            .body(b.to_vec()),
        None => req,
    };
    req.send().await.expect("request")
}

/// Expects a 200 and returns the body.
async fn ok(res: reqwest::Response, what: &str) -> Value {
    let status = res.status();
    let text = res.text().await.expect("body");
    assert_eq!(status, 200, "{what}: {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: {e}: {text}"))
}

async fn put_json(app: &TestApp, path: &str, body: &Value) -> reqwest::Response {
    send(app, "PUT", path, Some(&serde_json::to_vec(body).unwrap())).await
}

async fn put_metric(app: &TestApp, id: &str, expr: &str, resolution: Option<&str>) -> Value {
    let mut body = json!({ "expr": expr });
    if let Some(r) = resolution {
        body["resolution"] = json!(r);
    }
    ok(
        put_json(app, &format!("/v1/metrics/{id}"), &body).await,
        &format!("PUT metric {id}"),
    )
    .await
}

async fn put_rule(app: &TestApp, id: &str, expr: &str) -> Value {
    ok(
        put_json(app, &format!("/v1/rules/{id}"), &json!({ "expr": expr })).await,
        &format!("PUT rule {id}"),
    )
    .await
}

async fn events(app: &TestApp, body: &Value) -> Value {
    ok(app.post("/v1/events", body).await, "POST /v1/events").await
}

/// `POST /v1/features`, returning `values` (and checking that is all there is).
async fn features(app: &TestApp, metrics: &[&str], fields: Value, at: Option<i64>) -> Value {
    let mut body = json!({ "metrics": metrics, "fields": fields });
    if let Some(at) = at {
        body["at"] = json!(at);
    }
    let res = ok(app.post("/v1/features", &body).await, "POST /v1/features").await;
    assert_eq!(res.as_object().unwrap().len(), 1, "only `values` in {res}");
    res["values"].clone()
}

async fn evaluate(app: &TestApp, body: &Value) -> Value {
    let res = ok(app.post("/v1/evaluate", body).await, "POST /v1/evaluate").await;
    let mut keys: Vec<&str> = res
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["degraded", "features", "hits", "rules"],
        "the keys of evaluate's answer: {res}"
    );
    res
}

/// A bad call: method, path, body, code, and what the message must say.
type BadCall = (
    &'static str,
    String,
    Option<Vec<u8>>,
    &'static str,
    &'static [&'static str],
);

fn is_integer(v: &Value) -> bool {
    v.as_i64().is_some() && !v.is_f64()
}

// ---- definitions ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_definitions_and_their_versions() {
    let redis = RedisServer::start();
    let app = app_on(&redis).await;
    let dev = json!({"device_id": "d000001"});

    let def = put_metric(
        &app,
        "dev_tx_7d",
        "COUNT(7d, transaction, device_id)",
        Some("1d"),
    )
    .await;
    assert_eq!(
        def,
        json!({"id": "dev_tx_7d", "version": 1, "expr": "COUNT(7d, transaction, device_id)",
               "aggregation": "count", "event": "transaction", "field": null,
               "group_by": ["device_id"], "window_ms": 604_800_000, "resolution_ms": 86_400_000}),
        "API.md's response shape, exactly"
    );
    let res = events(
        &app,
        &json!({"type": "transaction", "fields": {"device_id": "d000001"}}),
    )
    .await;
    assert_eq!(res, json!({"applied": 1, "duplicates": 0, "late": 0}));
    assert_eq!(
        features(&app, &["dev_tx_7d"], dev.clone(), None).await,
        json!({"dev_tx_7d": 1})
    );

    // The same definition (however spelled) keeps its version and its counts.
    let same = put_metric(
        &app,
        "dev_tx_7d",
        "COUNT(7d, transaction, device_id)",
        Some("1d"),
    )
    .await;
    assert_eq!(same["version"], 1, "same definition, same version: {same}");
    let respelled = put_metric(
        &app,
        "dev_tx_7d",
        "count(7d, transaction) by device_id",
        Some("24h"),
    )
    .await;
    assert_eq!(
        respelled["version"], 1,
        "spelling is not a change: {respelled}"
    );
    assert_eq!(
        features(&app, &["dev_tx_7d"], dev.clone(), None).await,
        json!({"dev_tx_7d": 1}),
        "counts kept under the kept version"
    );

    // A change bumps it, and the old counts are not read again, not even when the old
    // definition comes back.
    let changed = put_metric(&app, "dev_tx_7d", "COUNT(7d, transaction, device_id)", None).await;
    assert_eq!(changed["version"], 2, "{changed}");
    assert_eq!(
        changed["resolution_ms"],
        6 * HOUR,
        "default resolution of 7d"
    );
    assert_eq!(
        features(&app, &["dev_tx_7d"], dev.clone(), None).await,
        json!({"dev_tx_7d": 0})
    );
    let back = put_metric(
        &app,
        "dev_tx_7d",
        "COUNT(7d, transaction, device_id)",
        Some("1d"),
    )
    .await;
    assert_eq!(back["version"], 3, "a version is never reused: {back}");
    assert_eq!(
        features(&app, &["dev_tx_7d"], dev.clone(), None).await,
        json!({"dev_tx_7d": 0})
    );

    // GET one, GET all.
    let got = ok(app.get("/v1/metrics/dev_tx_7d").await, "GET metric").await;
    assert_eq!(got, back);
    put_metric(
        &app,
        "user_amt_1d",
        "SUM(1d, transaction, amount, userid)",
        None,
    )
    .await;
    let all = ok(app.get("/v1/metrics").await, "GET metrics").await;
    let ids: Vec<&str> = all["metrics"]
        .as_array()
        .expect("{\"metrics\": [...]}")
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["dev_tx_7d", "user_amt_1d"], "{all}");
    assert_eq!(all["metrics"][0], back);

    // A metric read by a rule cannot be deleted.
    put_rule(&app, "busy_device", "dev_tx_7d > 3").await;
    let msg = expect_error(
        send(&app, "DELETE", "/v1/metrics/dev_tx_7d", None).await,
        409,
        "metric_in_use",
    )
    .await;
    assert!(msg.contains("busy_device"), "names the rule: {msg}");
    assert_eq!(
        ok(app.get("/v1/metrics/dev_tx_7d").await, "still there").await,
        back
    );
    ok(
        send(&app, "DELETE", "/v1/rules/busy_device", None).await,
        "DELETE rule",
    )
    .await;

    // Delete, then re-create: a new version, the old counts never come back.
    events(
        &app,
        &json!({"type": "transaction", "fields": {"device_id": "d000001"}}),
    )
    .await;
    assert_eq!(
        features(&app, &["dev_tx_7d"], dev.clone(), None).await,
        json!({"dev_tx_7d": 1})
    );
    let res = ok(
        send(&app, "DELETE", "/v1/metrics/dev_tx_7d", None).await,
        "DELETE metric",
    )
    .await;
    assert_eq!(res, json!({"deleted": "dev_tx_7d"}));
    expect_error(
        app.get("/v1/metrics/dev_tx_7d").await,
        404,
        "unknown_metric",
    )
    .await;
    expect_error(
        send(&app, "DELETE", "/v1/metrics/dev_tx_7d", None).await,
        404,
        "unknown_metric",
    )
    .await;
    let msg = expect_error(
        app.post(
            "/v1/features",
            &json!({"metrics": ["dev_tx_7d"], "fields": dev}),
        )
        .await,
        400,
        "unknown_metric",
    )
    .await;
    assert!(msg.contains("dev_tx_7d"), "{msg}");
    let again = put_metric(
        &app,
        "dev_tx_7d",
        "COUNT(7d, transaction, device_id)",
        Some("1d"),
    )
    .await;
    assert_eq!(again["version"], 4, "re-created: a new version: {again}");
    assert_eq!(
        features(&app, &["dev_tx_7d"], dev.clone(), None).await,
        json!({"dev_tx_7d": 0}),
        "the deleted metric's counts are not read"
    );
    let old_keys: Vec<String> = redis::cmd("KEYS")
        .arg("*v{*")
        .query(&mut redis.conn())
        .unwrap();
    assert!(
        !old_keys.is_empty(),
        "the old counts are still in Redis (they expire on their own), just never read"
    );

    // Unknown ids.
    expect_error(
        app.get("/v1/metrics/never_defined").await,
        404,
        "unknown_metric",
    )
    .await;
    expect_error(
        app.get("/v1/rules/never_defined").await,
        404,
        "unknown_rule",
    )
    .await;
    expect_error(
        send(&app, "DELETE", "/v1/rules/never_defined", None).await,
        404,
        "unknown_rule",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_with_and_or_and_parentheses() {
    let redis = RedisServer::start();
    let app = app_on(&redis).await;
    put_metric(&app, "cnt", "COUNT(1h, pay) BY userid", None).await;
    put_metric(&app, "amt", "SUM(1h, pay, amount) BY userid", None).await;
    put_metric(&app, "top", "MAX(1h, pay, amount) BY userid", None).await;

    let rule = put_rule(&app, "big", " cnt >= 2 AND (amt > 100 OR top >= 80) ").await;
    assert_eq!(
        rule,
        json!({"id": "big", "version": 1, "expr": "cnt >= 2 AND (amt > 100 OR top >= 80)",
               "metrics": ["amt", "cnt", "top"]})
    );
    put_rule(&app, "small", "cnt < 2 or amt <= 10").await;
    put_rule(&app, "flipped", "100 < amt").await;
    assert_eq!(
        put_rule(&app, "flipped", "100 < amt").await["version"],
        1,
        "same rule, same version"
    );
    assert_eq!(
        put_rule(&app, "flipped", "100 <= amt").await["version"],
        2,
        "changed rule, new version"
    );
    let got = ok(app.get("/v1/rules/big").await, "GET rule").await;
    assert_eq!(got, rule);
    let all = ok(app.get("/v1/rules").await, "GET rules").await;
    let ids: Vec<&str> = all["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["big", "flipped", "small"]);

    let rules = json!(["big", "small", "flipped"]);
    let pay = |user: &str, id: &str, amount: f64| {
        json!({"event": {"id": id, "type": "pay", "fields": {"userid": user, "amount": amount}},
               "rules": rules})
    };
    // (event, expected big, small, flipped)
    for (body, big, small, flipped, why) in [
        (
            pay("u1", "p1", 90.0),
            false,
            true,
            false,
            "one payment: cnt < 2",
        ),
        (
            pay("u1", "p2", 5.0),
            true,
            false,
            false,
            "cnt 2, top 90 >= 80",
        ),
        (pay("u2", "p3", 30.0), false, true, false, "u2: one payment"),
        (
            pay("u2", "p4", 40.0),
            false,
            false,
            false,
            "cnt 2, amt 70, top 40",
        ),
        (
            pay("u2", "p5", 30.0),
            false,
            false,
            true,
            "amt 100 is not > 100, but 100 <= amt",
        ),
        (pay("u2", "p6", 0.5), true, false, true, "amt 100.5 > 100"),
    ] {
        let res = evaluate(&app, &body).await;
        assert_eq!(
            res["rules"],
            json!({"big": big, "small": small, "flipped": flipped}),
            "{why}: {res}"
        );
        assert_eq!(res["features"], json!({}), "no metrics asked for");
    }
    let msg = expect_error(
        app.post(
            "/v1/evaluate",
            &json!({"rules": ["nope"], "fields": {"userid": "u1"}}),
        )
        .await,
        400,
        "unknown_rule",
    )
    .await;
    assert!(msg.contains("nope"), "{msg}");
    let res = ok(
        send(&app, "DELETE", "/v1/rules/small", None).await,
        "DELETE rule",
    )
    .await;
    assert_eq!(res, json!({"deleted": "small"}));
    expect_error(app.get("/v1/rules/small").await, 404, "unknown_rule").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_definitions_are_400_with_a_column_and_change_nothing() {
    let redis = RedisServer::start();
    let app = app_on(&redis).await;
    put_metric(&app, "m_ok", "COUNT(1h, tx) BY d", None).await;
    let before = redis.digest();
    let long_id = "a".repeat(65);

    // (expr, column, what the message says)
    let exprs: &[(&str, usize, &str)] = &[
        ("COUNTS(7d, tx) BY d", 1, "unknown aggregation"),
        ("COUNT 7d, tx) BY d", 7, "expected '('"),
        ("COUNT(7x, tx) BY d", 7, "duration"),
        ("COUNT(0d, tx) BY d", 7, "positive"),
        ("COUNT(7d tx) BY d", 10, "expected ','"),
        ("COUNT(7d, tx, amount) BY d", 15, "takes no field"),
        ("SUM(7d, tx) BY d", 11, "exactly one field"),
        ("SUM(1d, tx, amount)", 19, "group-by"),
        ("COUNT(7d, tx)", 13, "group-by"),
        ("COUNT(7d, tx) BY d extra", 20, "unexpected"),
        ("COUNT(7d, tx) BY d, d", 21, "twice"),
        ("MAX(1h, tx, amount) BY amount", 24, "both"),
        ("COUNT(7d, 交易) BY d", 11, "unexpected character"),
        ("COUNT(7d, tx) BY 设备", 18, "unexpected character"),
        ("", 1, "expected an aggregation"),
    ];
    for (expr, col, what) in exprs {
        let msg = expect_error(
            put_json(&app, "/v1/metrics/m_new", &json!({ "expr": expr })).await,
            400,
            "invalid_expr",
        )
        .await;
        assert!(
            msg.contains(&format!("column {col}:")) && msg.contains(what),
            "{expr:?}: expected column {col} and {what:?} in {msg:?}"
        );
        assert_eq!(redis.digest(), before, "{expr:?} changed the store");
    }
    let msg = expect_error(
        put_json(
            &app,
            "/v1/metrics/m_new",
            &json!({"expr": "COUNT(401d, tx) BY d"}),
        )
        .await,
        400,
        "invalid_expr",
    )
    .await;
    assert!(msg.contains("400 days"), "{msg}");

    // (window, resolution, what the message says)
    for (expr, resolution, what) in [
        ("COUNT(7d, tx) BY d", "5d", "multiple"),
        ("COUNT(1d, tx) BY d", "1m", "1440"),
        ("COUNT(1d, tx) BY d", "1x", "duration"),
        ("COUNT(1d, tx) BY d", "0s", "positive"),
        ("COUNT(1h, tx) BY d", "2h", "multiple"),
    ] {
        let msg = expect_error(
            put_json(
                &app,
                "/v1/metrics/m_new",
                &json!({"expr": expr, "resolution": resolution}),
            )
            .await,
            400,
            "invalid_resolution",
        )
        .await;
        assert!(msg.contains(what), "{expr} at {resolution}: {msg}");
    }

    // Ids and bodies.
    let cases: Vec<BadCall> = vec![
        (
            "PUT",
            "/v1/metrics/Dev_Tx".into(),
            Some(br#"{"expr": "COUNT(1h, tx) BY d"}"#.to_vec()),
            "invalid_metric_id",
            &["path", "Dev_Tx"],
        ),
        (
            "PUT",
            format!("/v1/metrics/{long_id}"),
            Some(br#"{"expr": "COUNT(1h, tx) BY d"}"#.to_vec()),
            "invalid_metric_id",
            &["path"],
        ),
        (
            "PUT",
            "/v1/metrics/dev-tx".into(),
            Some(br#"{"expr": "COUNT(1h, tx) BY d"}"#.to_vec()),
            "invalid_metric_id",
            &["path"],
        ),
        (
            "GET",
            "/v1/metrics/BAD".into(),
            None,
            "invalid_metric_id",
            &["path"],
        ),
        (
            "DELETE",
            "/v1/metrics/BAD".into(),
            None,
            "invalid_metric_id",
            &["path"],
        ),
        (
            "PUT",
            "/v1/metrics/m_new".into(),
            Some(br#"{"expr": "COUNT(1h, tx) BY d", "window": 5}"#.to_vec()),
            "invalid_body",
            &["window"],
        ),
        (
            "PUT",
            "/v1/metrics/m_new".into(),
            Some(br#"{"resolution": "1m"}"#.to_vec()),
            "invalid_body",
            &["expr"],
        ),
        (
            "PUT",
            "/v1/metrics/m_new".into(),
            Some(br#"{"expr": "COUNT(1h, tx) BY d""#.to_vec()),
            "invalid_json",
            &[],
        ),
        (
            "PUT",
            "/v1/rules/Bad".into(),
            Some(br#"{"expr": "m_ok > 1"}"#.to_vec()),
            "invalid_rule_id",
            &["path"],
        ),
        (
            "PUT",
            "/v1/rules/r".into(),
            Some(br#"{"expr": "nope > 3 AND m_ok > 1"}"#.to_vec()),
            "unknown_metric",
            &["nope"],
        ),
        (
            "PUT",
            "/v1/rules/r".into(),
            Some(br#"{"expr": "m_ok >"}"#.to_vec()),
            "invalid_rule",
            &["column 7:", "expected a number"],
        ),
        (
            "PUT",
            "/v1/rules/r".into(),
            Some(br#"{"expr": "m_ok > 3 m_ok < 2"}"#.to_vec()),
            "invalid_rule",
            &["column 10:", "AND / OR"],
        ),
        (
            "PUT",
            "/v1/rules/r".into(),
            Some(br#"{"expr": "(m_ok > 3"}"#.to_vec()),
            "invalid_rule",
            &["column 10:", "')'"],
        ),
        (
            "PUT",
            "/v1/rules/r".into(),
            Some(br#"{"expr": "m_ok = 3"}"#.to_vec()),
            "invalid_rule",
            &["column 6:", "=="],
        ),
        (
            "PUT",
            "/v1/rules/r".into(),
            Some(br#"{"expr": "(m_ok > 1 OR m_ok < 0) AND AND"}"#.to_vec()),
            "invalid_rule",
            &["column 28:"],
        ),
        (
            "PUT",
            "/v1/rules/r".into(),
            Some(br#"{"expr": ""}"#.to_vec()),
            "invalid_rule",
            &["column 1:"],
        ),
        (
            "PUT",
            "/v1/rules/r".into(),
            Some(br#"{"expr": "M_ok > 1"}"#.to_vec()),
            "invalid_rule",
            &["column 1:", "metric id"],
        ),
        (
            "POST",
            "/v1/metrics/m_ok".into(),
            Some(br#"{"expr": "COUNT(1h, tx) BY d"}"#.to_vec()),
            "method_not_allowed",
            &[],
        ),
    ];
    for (method, path, body, code, says) in cases {
        let status = if code == "method_not_allowed" {
            405
        } else {
            400
        };
        let msg = expect_error(
            send(&app, method, &path, body.as_deref()).await,
            status,
            code,
        )
        .await;
        for piece in says {
            assert!(
                msg.contains(piece),
                "{method} {path}: {msg:?} should say {piece:?}"
            );
        }
        assert_eq!(
            redis.digest(),
            before,
            "{method} {path} ({code}) changed the store"
        );
    }
    expect_error(app.get("/v1/metrics/m_new").await, 404, "unknown_metric").await;
    expect_error(app.get("/v1/rules/r").await, 404, "unknown_rule").await;
}

// ---- events ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_single_batch_duplicates_late_and_future() {
    let redis = RedisServer::start();
    let app = app_on(&redis).await;
    put_metric(&app, "cnt", "COUNT(1h, tx) BY device_id", None).await;
    put_metric(&app, "amt", "SUM(1d, tx, amount) BY userid", None).await;
    put_metric(&app, "bulk_cnt", "COUNT(1h, bulk) BY device_id", None).await;
    let ent = json!({"device_id": "d1", "userid": "u1"});
    let read = || features(&app, &["cnt", "amt"], ent.clone(), None);
    let tx = |id: &str, amount: Value| json!({"id": id, "type": "tx", "fields": {"device_id": "d1", "userid": "u1", "amount": amount}});

    // Single form.
    let res = events(&app, &tx("e1", json!(10))).await;
    assert_eq!(
        res,
        json!({"applied": 2, "duplicates": 0, "late": 0}),
        "exactly these keys"
    );
    assert_eq!(read().await, json!({"cnt": 1, "amt": 10}));

    // Batch form: a full event, one without the amount (only COUNT), one of a type no
    // metric reads, one without an id, one with ts given.
    let now = now_ms();
    let batch = json!({"events": [
        tx("e2", json!("2.5")),
        {"id": "e3", "type": "tx", "fields": {"device_id": "d1", "userid": "u1"}},
        {"id": "e4", "type": "other", "fields": {"device_id": "d1"}},
        {"type": "tx", "ts": now - MINUTE, "fields": {"device_id": "d1"}},
        {"id": "e5", "type": "tx", "ts": now - 1000, "fields": {"device_id": "d1", "userid": "u1", "amount": 0.25}},
    ]});
    let res = events(&app, &batch).await;
    assert_eq!(
        res,
        json!({"applied": 2 + 1 + 1 + 2, "duplicates": 0, "late": 0})
    );
    assert_eq!(read().await, json!({"cnt": 5, "amt": 12.75}));

    // Up to 5 minutes ahead is accepted (it counts once its sub-window is the present).
    let res = events(
        &app,
        &json!({"type": "bulk", "ts": now + 4 * MINUTE, "fields": {"device_id": "ahead"}}),
    )
    .await;
    assert_eq!(res, json!({"applied": 1, "duplicates": 0, "late": 0}));

    // Replays: events with ids are duplicates (the id-less one is applied again, as it must
    // be: nothing says it is the same event; `other` has nothing to apply).
    let digest = redis.digest();
    let res = events(&app, &tx("e1", json!(10))).await;
    assert_eq!(res, json!({"applied": 0, "duplicates": 1, "late": 0}));
    assert_eq!(redis.digest(), digest, "a duplicate changes nothing");
    let batch = json!({"events": [tx("e2", json!("2.5")), {"id": "e3", "type": "tx", "fields": {"device_id": "d1", "userid": "u1"}}]});
    let res = events(&app, &batch).await;
    assert_eq!(res, json!({"applied": 0, "duplicates": 2, "late": 0}));
    assert_eq!(
        read().await,
        json!({"cnt": 5, "amt": 12.75}),
        "features unchanged"
    );
    assert_eq!(redis.digest(), digest);
    // The same id twice in one batch: applied once. The same id on another type: another event.
    let res = events(
        &app,
        &json!({"events": [tx("e6", json!(1)), tx("e6", json!(1))]}),
    )
    .await;
    assert_eq!(res, json!({"applied": 2, "duplicates": 1, "late": 0}));
    let res = events(
        &app,
        &json!({"id": "e6", "type": "bulk", "fields": {"device_id": "d1"}}),
    )
    .await;
    assert_eq!(res, json!({"applied": 1, "duplicates": 0, "late": 0}));
    assert_eq!(read().await, json!({"cnt": 6, "amt": 13.75}));

    // Late: too old for every metric of the type is `late`; too old for one is not.
    let res = events(
        &app,
        &json!({"events": [
            {"id": "old", "type": "tx", "ts": now - 2 * DAY, "fields": {"device_id": "d1", "userid": "u1", "amount": 100}},
            {"id": "older", "type": "tx", "ts": now - 30 * DAY, "fields": {"device_id": "d1"}},
            {"id": "2h", "type": "tx", "ts": now - 2 * HOUR, "fields": {"device_id": "d1", "userid": "u1", "amount": 1}},
        ]}),
    )
    .await;
    assert_eq!(
        res,
        json!({"applied": 1, "duplicates": 0, "late": 2}),
        "the 2-hour-old event is late for the 1h COUNT only"
    );
    assert_eq!(read().await, json!({"cnt": 6, "amt": 14.75}));

    // Exactly 1,000 events in one request are fine.
    let thousand: Vec<Value> = (0..1000)
        .map(|i| json!({"type": "bulk", "fields": {"device_id": format!("bulk-{i}")}}))
        .collect();
    let res = events(&app, &json!({ "events": thousand })).await;
    assert_eq!(res, json!({"applied": 1000, "duplicates": 0, "late": 0}));
    assert_eq!(
        features(&app, &["bulk_cnt"], json!({"device_id": "bulk-999"}), None).await,
        json!({"bulk_cnt": 1})
    );

    // Bad batches: 400, nothing applied (not even the good events before the bad one), the
    // store unchanged, and the good event's id not burnt.
    let before = redis.digest();
    let good = tx("fresh", json!(1000));
    let future = now_ms() + 6 * MINUTE;
    let too_many: Vec<Value> = (0..1001)
        .map(|i| json!({"type": "bulk", "fields": {"device_id": format!("x-{i}")}}))
        .collect();
    let long = "x".repeat(257);
    let cases: Vec<(Vec<u8>, &str, Vec<&str>)> = vec![
        (
            json!({"events": [good, {"id": "f", "type": "tx", "ts": future, "fields": {"device_id": "d1"}}]}).to_string().into_bytes(),
            "event_in_future",
            vec!["events[1].ts"],
        ),
        (
            json!({"type": "tx", "ts": future, "fields": {"device_id": "d1"}}).to_string().into_bytes(),
            "event_in_future",
            vec!["ts"],
        ),
        (
            json!({"events": [good, {"type": "tx", "fields": {"userid": "u1", "amount": "abc"}}]}).to_string().into_bytes(),
            "invalid_amount",
            vec!["events[1].fields.amount"],
        ),
        (
            json!({"events": [good, good, {"type": "tx", "fields": {"userid": "u1", "amount": 1.00001}}]}).to_string().into_bytes(),
            "invalid_amount",
            vec!["events[2].fields.amount"],
        ),
        (
            json!({"events": [good, {"type": "tx", "fields": {"userid": "u1", "amount": true}}]}).to_string().into_bytes(),
            "invalid_field",
            vec!["events[1].fields.amount"],
        ),
        (
            json!({"events": [{"type": "tx", "fields": {"device_id": {"a": 1}}}]}).to_string().into_bytes(),
            "invalid_field",
            vec!["events[0].fields.device_id"],
        ),
        (
            json!({"events": [good, {"type": "tx", "fields": {"device_id": ["d1"]}}]}).to_string().into_bytes(),
            "invalid_field",
            vec!["events[1].fields.device_id"],
        ),
        (
            json!({"type": "tx", "fields": {"device_id": false}}).to_string().into_bytes(),
            "invalid_field",
            vec!["fields.device_id"],
        ),
        (
            json!({"type": "tx", "fields": {"device_id": long}}).to_string().into_bytes(),
            "invalid_field",
            vec!["fields.device_id", "256"],
        ),
        (
            json!({ "events": too_many }).to_string().into_bytes(),
            "too_many_events",
            vec!["1001"],
        ),
        (b"{\"events\": [".to_vec(), "invalid_json", vec![]),
        (b"{\"type\": \"tx\",}".to_vec(), "invalid_json", vec![]),
        (b"".to_vec(), "invalid_json", vec![]),
        (b"[]".to_vec(), "invalid_body", vec![]),
        (
            json!({"events": [good], "type": "tx"}).to_string().into_bytes(),
            "invalid_body",
            vec![],
        ),
        (
            json!({"events": [good, {"fields": {}}]}).to_string().into_bytes(),
            "invalid_body",
            vec!["events[1]", "type"],
        ),
        (
            json!({"events": [good, {"type": "tx", "colour": "red"}]}).to_string().into_bytes(),
            "invalid_body",
            vec!["events[1]", "colour"],
        ),
        (
            json!({"events": [good, {"type": "tx", "ts": "soon"}]}).to_string().into_bytes(),
            "invalid_body",
            vec!["events[1].ts"],
        ),
        (
            json!({"events": [good, {"type": "a b"}]}).to_string().into_bytes(),
            "invalid_event_type",
            vec!["events[1].type"],
        ),
        (
            json!({"events": [good, {"id": "", "type": "tx"}]}).to_string().into_bytes(),
            "invalid_event_id",
            vec!["events[1].id"],
        ),
        (
            json!({"events": [good, {"type": "tx", "ts": -1}]}).to_string().into_bytes(),
            "invalid_ts",
            vec!["events[1].ts"],
        ),
    ];
    for (body, code, says) in cases {
        let msg = expect_error(
            send(&app, "POST", "/v1/events", Some(&body)).await,
            400,
            code,
        )
        .await;
        for piece in &says {
            assert!(msg.contains(piece), "{code}: {msg:?} should name {piece:?}");
        }
        assert_eq!(
            redis.digest(),
            before,
            "a bad batch ({code}) changed the store"
        );
        assert_eq!(
            read().await,
            json!({"cnt": 6, "amt": 14.75}),
            "{code}: nothing applied"
        );
    }
    let res = events(&app, &good).await;
    assert_eq!(
        res,
        json!({"applied": 2, "duplicates": 0, "late": 0}),
        "the refused batch's good event was not marked seen"
    );
    assert_eq!(read().await, json!({"cnt": 7, "amt": 1014.75}));
}

// ---- features ----

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

// ---- the seeds' examples and evaluate ----

async fn the_seeds_examples(app: &TestApp) {
    let dev = put_metric(
        app,
        "dev_tx_7d",
        "COUNT(7d, transaction, device_id)",
        Some("1d"),
    )
    .await;
    assert_eq!(
        (&dev["field"], &dev["group_by"], &dev["resolution_ms"]),
        (&json!(null), &json!(["device_id"]), &json!(DAY))
    );
    let amt = put_metric(
        app,
        "user_amt_1d",
        "SUM(1d, transaction, amount, userid)",
        None,
    )
    .await;
    assert_eq!(
        (&amt["aggregation"], &amt["field"], &amt["group_by"]),
        (&json!("sum"), &json!("amount"), &json!(["userid"]))
    );
    let users = put_metric(
        app,
        "dev_users_30d",
        "COUNT_DISTINCT(30d, login, device_id, userid)",
        None,
    )
    .await;
    assert_eq!(
        (&users["aggregation"], &users["field"], &users["group_by"]),
        (
            &json!("count_distinct"),
            &json!("userid"),
            &json!(["device_id"])
        ),
        "the counted field comes last"
    );
    assert_eq!(users["window_ms"], 30 * DAY);

    // Seed 000's transaction.
    let res = events(
        app,
        &json!({"id": "evt-123", "type": "transaction",
                "fields": {"device_id": "d000001", "userid": "ud000001", "amount": 166.6}}),
    )
    .await;
    assert_eq!(res, json!({"applied": 2, "duplicates": 0, "late": 0}));
    let res = app
        .post(
            "/v1/features",
            &json!({"metrics": ["dev_tx_7d", "user_amt_1d"],
                    "fields": {"device_id": "d000001", "userid": "ud000001"}}),
        )
        .await;
    assert_eq!(res.status(), 200);
    let text = res.text().await.unwrap();
    assert!(
        text.contains("\"user_amt_1d\":166.6") && !text.contains("166.60"),
        "exactly 166.6 in the JSON: {text}"
    );
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        body,
        json!({"values": {"dev_tx_7d": 1, "user_amt_1d": 166.6}})
    );
    // Seven days of transactions on the device, one a day: all counted; the eighth day not.
    let now = now_ms();
    let week: Vec<Value> = (1..8)
        .map(|d| json!({"type": "transaction", "ts": now - d * DAY, "fields": {"device_id": "d000001"}}))
        .collect();
    let res = events(app, &json!({ "events": week })).await;
    assert_eq!(
        res,
        json!({"applied": 6, "duplicates": 0, "late": 1}),
        "days 1-6 back are in the 7-day window, day 7 back is not"
    );
    assert_eq!(
        features(app, &["dev_tx_7d"], json!({"device_id": "d000001"}), None).await,
        json!({"dev_tx_7d": 7})
    );

    // Logins: distinct users per device over 30 days, and "logins in the last hour > 3".
    put_metric(app, "logins_1h", "COUNT(1h, login) BY user_id", None).await;
    put_rule(app, "too_many_logins", "logins_1h > 3").await;
    let r = ok(
        app.post(
            "/v1/lists/black/entries",
            &json!({"entries": [{"dimension": "phone", "value": "13800000000", "sandbox": "loan"}]}),
        )
        .await,
        "list entry",
    )
    .await;
    assert_eq!(r, json!({"written": 1}));
    for (i, (user, device)) in [("u1", "d1"), ("u2", "d1"), ("u1", "d2")]
        .iter()
        .enumerate()
    {
        let res = events(
            app,
            &json!({"id": format!("evt-{i}"), "type": "login",
                    "fields": {"user_id": user, "userid": user, "device_id": device}}),
        )
        .await;
        assert_eq!(res["applied"], 2, "{res}");
    }
    assert_eq!(
        features(app, &["dev_users_30d"], json!({"device_id": "d1"}), None).await,
        json!({"dev_users_30d": 2})
    );
    let res = events(
        app,
        &json!({"id": "evt-3", "type": "login", "fields": {"user_id": "u1"}}),
    )
    .await;
    assert_eq!(res["applied"], 1);
    // Three logins for u1 (evt-0, evt-2, evt-3): the rule is false.
    let ask = json!({"sandbox": "loan", "lists": ["black"], "subjects": {"phone": "13800000000"},
                     "fields": {"user_id": "u1"},
                     "metrics": ["logins_1h"], "rules": ["too_many_logins"]});
    let res = evaluate(app, &ask).await;
    assert_eq!(res["features"], json!({"logins_1h": 3}), "{res}");
    assert_eq!(res["rules"], json!({"too_many_logins": false}));
    assert_eq!(res["degraded"], false);

    // API.md's example body: the 4th login is applied first, so the features include it.
    let example = json!({"sandbox": "loan", "lists": ["black"], "subjects": {"phone": "13800000000"},
                         "event": {"id": "evt-9", "type": "login", "fields": {"user_id": "u1"}},
                         "metrics": ["logins_1h"], "rules": ["too_many_logins"]});
    let res = evaluate(app, &example).await;
    assert_eq!(
        res,
        json!({"hits": [{"list": "black", "dimension": "phone", "value": "+8613800000000",
                         "expires_at": null}],
               "features": {"logins_1h": 4}, "rules": {"too_many_logins": true},
               "degraded": false})
    );
    // Replayed: not applied twice.
    let res = evaluate(app, &example).await;
    assert_eq!(res["features"], json!({"logins_1h": 4}), "{res}");
    assert_eq!(res["rules"], json!({"too_many_logins": true}));
    assert_eq!(
        features(app, &["logins_1h"], json!({"user_id": "u1"}), None).await,
        json!({"logins_1h": 4})
    );
    // An evaluate without lists or metrics still applies its event, once.
    let res = evaluate(
        app,
        &json!({"event": {"id": "evt-10", "type": "login", "fields": {"user_id": "u9"}}}),
    )
    .await;
    assert_eq!(
        res,
        json!({"hits": [], "features": {}, "rules": {}, "degraded": false})
    );
    assert_eq!(
        features(app, &["logins_1h"], json!({"user_id": "u9"}), None).await,
        json!({"logins_1h": 1})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_examples_on_redis() {
    let redis = RedisServer::start();
    let app = app_on(&redis).await;
    the_seeds_examples(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_examples_embedded() {
    let app = embedded_app().await;
    the_seeds_examples(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_evaluate_requests_apply_nothing() {
    let redis = RedisServer::start();
    let app = app_on(&redis).await;
    put_metric(&app, "logins_1h", "COUNT(1h, login) BY user_id", None).await;
    put_metric(&app, "dev_logins", "COUNT(1h, login) BY device_id", None).await;
    put_rule(&app, "too_many_logins", "logins_1h > 3").await;
    let before = redis.digest();
    let login = json!({"id": "e1", "type": "login", "fields": {"user_id": "u1"}});
    for (body, code, says) in [
        (
            json!({"event": login, "metrics": ["dev_logins"]}),
            "missing_field",
            "fields.device_id",
        ),
        (
            json!({"event": login, "metrics": ["nope"]}),
            "unknown_metric",
            "nope",
        ),
        (
            json!({"event": login, "rules": ["nope"]}),
            "unknown_rule",
            "nope",
        ),
        (
            json!({"event": login, "rules": ["Nope"]}),
            "invalid_rule_id",
            "rules[0]",
        ),
        (
            json!({"event": {"type": "login", "ts": now_ms() + 10 * MINUTE, "fields": {"user_id": "u1"}},
                   "metrics": ["logins_1h"]}),
            "event_in_future",
            "ts",
        ),
        (
            json!({"event": {"type": "login", "fields": {"user_id": [1]}}, "metrics": ["logins_1h"]}),
            "invalid_field",
            "event.fields.user_id",
        ),
        (
            json!({"event": login, "subjects": {"phone": "13800000000"}}),
            "invalid_lists",
            "lists",
        ),
        (
            json!({"event": login, "metrics": ["logins_1h"], "colour": 1}),
            "invalid_body",
            "colour",
        ),
    ] {
        let msg = expect_error(app.post("/v1/evaluate", &body).await, 400, code).await;
        assert!(msg.contains(says), "{code}: {msg:?} should name {says:?}");
        assert_eq!(
            redis.digest(),
            before,
            "a bad evaluate ({code}) changed the store"
        );
    }
    assert_eq!(
        features(&app, &["logins_1h"], json!({"user_id": "u1"}), None).await,
        json!({"logins_1h": 0})
    );
}

/// API.md: a message says "what was wrong and where"; in `/v1/evaluate` the event is
/// `event`, not `events[0]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evaluate_names_the_event_as_sent() {
    let app = embedded_app().await;
    put_metric(&app, "amt", "SUM(1h, pay, amount) BY userid", None).await;
    for (event, code, path) in [
        (
            json!({"type": "pay", "ts": now_ms() + 10 * MINUTE, "fields": {"userid": "u1"}}),
            "event_in_future",
            "event.ts",
        ),
        (
            json!({"type": "pay", "fields": {"userid": "u1", "amount": "abc"}}),
            "invalid_amount",
            "event.fields.amount",
        ),
    ] {
        let msg = expect_error(
            app.post("/v1/evaluate", &json!({ "event": event })).await,
            400,
            code,
        )
        .await;
        assert!(
            msg.starts_with(path),
            "{code}: the message should start with {path:?}: {msg:?}"
        );
    }
}

// ---- two instances ----

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

    let url = redis.url();
    let sleeper = std::thread::spawn(move || {
        let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
        let _: () = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg("0.4")
            .query(&mut conn)
            .unwrap();
    });
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

/// The real Redis store's metric state, except that the answer to a metric update arrives
/// late (after Redis applied it) while `late` is set: a network stall or a slow Redis as the
/// service sees it. Definitions and the bus are the real store's, untouched.
struct LateAnswers {
    inner: Arc<dyn MetricStore>,
    late: AtomicBool,
    delay: Duration,
}

#[async_trait::async_trait]
impl StoreBase for LateAnswers {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn layout(&self) -> &Layout {
        self.inner.layout()
    }
    async fn ping(&self) -> StoreResult<()> {
        self.inner.ping().await
    }
}

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
