//! The seeds' examples and `/v1/evaluate`: the "logins in the last hour > 3" rule, on Redis and
//! embedded; bad evaluate requests apply nothing; the event is named as it was sent.

use crate::common;

use common::{RedisServer, TestApp};
use namelist::domain::now_ms;
use serde_json::{Value, json};

use super::{
    DAY, MINUTE, app_on, embedded_app, evaluate, events, expect_error, features, ok, put_metric,
    put_rule,
};

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
