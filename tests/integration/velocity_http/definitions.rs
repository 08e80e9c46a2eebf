//! Metric and rule definitions over HTTP: the response shape, versions (kept, bumped, never
//! reused after a delete), list / get / delete, `metric_in_use`, `unknown_metric`; rules with
//! AND, OR and parentheses; every bad definition a 400 pointing at its column, changing
//! nothing.

use crate::common;

use common::RedisServer;
use serde_json::json;

use super::{
    BadCall, HOUR, app_on, evaluate, events, expect_error, features, ok, put_json, put_metric,
    put_rule, send,
};

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

/// Definitions are bounded (`max_definitions`, `max_metrics_per_event`): one past a limit is
/// a 409 `too_many_definitions` that stores nothing; changing a definition that exists, or
/// defining one after another is deleted, is not refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definitions_past_their_limits_are_refused_and_stored_nowhere() {
    let redis = RedisServer::start();
    let mut settings = super::relaxed(common::redis_settings(&redis));
    settings.max_definitions = 3;
    settings.max_metrics_per_event = 2;
    let app = common::spawn_app(settings).await;
    let refused = |id: &'static str, expr: &'static str, what: &'static str| {
        let app = &app;
        async move {
            let path = format!("/v1/metrics/{id}");
            let res = put_json(app, &path, &json!({ "expr": expr })).await;
            let msg = expect_error(res, 409, "too_many_definitions").await;
            assert!(msg.contains(what), "{id}: {msg}");
            expect_error(app.get(&path).await, 404, "unknown_metric").await;
        }
    };

    put_metric(&app, "a1", "COUNT(1h, a) BY device_id", None).await;
    put_metric(&app, "a2", "COUNT(1d, a) BY device_id", None).await;
    refused("a3", "COUNT(7d, a) BY device_id", "max_metrics_per_event").await;
    put_metric(&app, "b1", "COUNT(1h, b) BY device_id", None).await;
    refused("c1", "COUNT(1h, c) BY device_id", "max_definitions").await;
    // Changing one that exists is no new definition, on its event type or moved to another
    // with room.
    let changed = put_metric(&app, "a1", "COUNT(2h, a) BY device_id", None).await;
    assert_eq!(changed["version"], 2, "{changed}");
    put_metric(&app, "a1", "COUNT(2h, b) BY device_id", None).await;
    let again = put_metric(&app, "a1", "COUNT(1h, b) BY userid", None).await;
    assert_eq!(
        again["version"], 4,
        "changed within its full event type: {again}"
    );
    // Event type a now feeds one metric; b feeds two.
    let to_b = json!({"expr": "COUNT(1d, b) BY device_id"});
    let res = put_json(&app, "/v1/metrics/a2", &to_b).await;
    let msg = expect_error(res, 409, "too_many_definitions").await;
    assert!(msg.contains("event type b"), "{msg}");
    assert_eq!(
        ok(app.get("/v1/metrics/a2").await, "a2 kept as it was").await["event"],
        "a"
    );
    // After a delete there is room again.
    ok(
        send(&app, "DELETE", "/v1/metrics/b1", None).await,
        "DELETE b1",
    )
    .await;
    put_metric(&app, "c1", "COUNT(1h, c) BY device_id", None).await;

    // Rules: at most three, however many metrics they read.
    for r in ["r1", "r2", "r3"] {
        put_rule(&app, r, "a2 > 1").await;
    }
    let res = put_json(&app, "/v1/rules/r4", &json!({"expr": "a2 > 2"})).await;
    let msg = expect_error(res, 409, "too_many_definitions").await;
    assert!(
        msg.contains("3 rules") && msg.contains("max_definitions"),
        "{msg}"
    );
    expect_error(app.get("/v1/rules/r4").await, 404, "unknown_rule").await;
    assert_eq!(put_rule(&app, "r1", "a2 > 5").await["version"], 2);
    ok(
        send(&app, "DELETE", "/v1/rules/r3", None).await,
        "DELETE r3",
    )
    .await;
    put_rule(&app, "r4", "a2 > 2").await;
}
