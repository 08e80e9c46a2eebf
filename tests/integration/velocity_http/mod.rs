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
//! * a primary's failover on a cluster with `write_replicas = 1`: every event, sent to two
//!   instances at once and retried after a 503, counted exactly once (`failover`);
//! * a COUNT_DISTINCT at its member cap says so (`capped`);
//! * ingestion across store timeouts: an event refused with 503 is applied by its retry, and
//!   never twice (the last of these drives the library over a store whose answers come
//!   late on purpose, because over HTTP that timing is not deterministic).
//!
//! `evaluate_names_the_event_as_sent`, `an_event_refused_with_503_is_applied_by_its_retry` and
//! `an_update_answered_after_the_deadline_is_not_applied_twice` were written against bugs (see
//! their docs) and guard their fixes.
//!
//! The tests are in `definitions`, `events`, `features` (the distinct cap included),
//! `evaluate` (the seeds' examples), `instances`, `store_failures` (a killed Redis, store
//! timeouts) and `failover` (a cluster's primary killed under events); this module holds the
//! helpers they share.

mod definitions;
mod evaluate;
mod events;
mod failover;
mod features;
mod instances;
mod store_failures;

use crate::common;

use common::{RedisServer, TestApp, redis_settings, spawn_app, test_settings};
use namelist::config::Settings;
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
