//! `POST /v1/events`: single and batch forms, duplicates, late and future events.

use crate::common;

use common::RedisServer;
use namelist::domain::now_ms;
use serde_json::{Value, json};

use super::{DAY, HOUR, MINUTE, app_on, events, expect_error, features, put_metric, send};

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

/// Events on an HTTP worker are written over that worker's own write connection once it is
/// up (`store::redis::write_pool`, without replicas), not round robin over the pool's 8
/// shared members: after 40 events, at most 3 connections have run the metric script last
/// (the members that carried the definition's script load and the events sent while the
/// worker's own connected, and the worker's own; the tests run one HTTP worker). Over the
/// members alone it would be all 8.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_ride_the_workers_own_write_connection() {
    let redis = RedisServer::start();
    let app = app_on(&redis).await;
    put_metric(&app, "cnt", "COUNT(1h, tx) BY device_id", None).await;
    for i in 0..40 {
        let body = json!({"type": "tx", "fields": {"device_id": format!("w-{i}")}});
        assert_eq!(events(&app, &body).await["applied"], 1);
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let list = redis.client_list();
    let writing = list
        .lines()
        .filter(|l| l.contains(" cmd=evalsha ") || l.contains(" cmd=eval "))
        .count();
    assert!(
        (1..=3).contains(&writing),
        "connections whose last command ran the metric script:\n{list}"
    );
}
