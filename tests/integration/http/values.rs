//! Values over HTTP: normalised before matching; one bad value never voids a check; the
//! spellings of issue 29 under rules 2; a keyspace made before rules 2 keeps rules 1.

use crate::common;

use common::{Backend, RedisServer, TestApp, spawn_app};
use serde_json::{Value, json};

use super::{app_on, expect_error};

pub(super) async fn values_are_normalised_before_matching(redis: &Backend) {
    let app = app_on(redis).await;
    let res = app
        .post(
            "/v1/lists/grey/entries",
            &json!({"entries": [
                {"dimension": "wifi_mac", "value": "aabb.ccdd.eeff"},
                {"dimension": "id_card", "value": " 11010519491231002x "},
                {"dimension": "imei", "value": "49-015420-323751-8"},
                {"dimension": "ip", "value": "::ffff:192.0.2.1"},
                {"dimension": "merchant", "value": " 商户-42 "}
            ]}),
        )
        .await;
    assert_eq!(res.status(), 200);
    let body = app
        .check(&json!({"lists": ["grey"], "subjects": {
            "wifi_mac": "AA:BB:CC:DD:EE:FF", "id_card": "11010519491231002X",
            "imei": "490154203237518", "ip": "192.0.2.1", "merchant": "商户-42"}}))
        .await;
    let mut got: Vec<(String, String)> = body["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["dimension"].as_str().unwrap().into(),
                h["value"].as_str().unwrap().into(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            ("id_card".into(), "11010519491231002X".into()),
            // Rules 2: an IMEI is its 14-digit body.
            ("imei".into(), "49015420323751".into()),
            ("ip".into(), "192.0.2.1".into()),
            ("merchant".into(), "商户-42".into()),
            ("wifi_mac".into(), "aa:bb:cc:dd:ee:ff".into()),
        ]
    );
}

/// One malformed subject value does not void the check: every valid value of the request is
/// looked up, the bad one is reported in `invalid` (where, why, never the value); `strict`
/// keeps the old 400; `/v1/evaluate` does the same.
async fn one_bad_value_never_voids_a_check(app: &TestApp) {
    let res = app
        .post(
            "/v1/lists/black/entries",
            &json!({"entries": [
                {"dimension": "device", "value": "dev-listed"},
                {"dimension": "ip", "value": "45.137.21.9"},
                {"dimension": "uid", "value": "u-listed"}
            ]}),
        )
        .await;
    assert_eq!(res.status(), 200);
    let subjects = json!({"phone": "123", "device": "dev-listed", "ip": ["45.137.21.9", "10.0.0.0/8"],
                          "uid": ["u-listed"]});
    let body = app
        .check(&json!({"lists": ["black"], "subjects": subjects}))
        .await;
    let mut hits: Vec<&str> = body["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["dimension"].as_str().unwrap())
        .collect();
    hits.sort();
    assert_eq!(hits, ["device", "ip", "uid"], "{body}");
    let invalid = body["invalid"].as_array().expect("invalid listed");
    assert_eq!(invalid.len(), 2, "{body}");
    // In the order of the subjects (by dimension name), each at its index as sent.
    assert_eq!(
        (
            &invalid[0]["dimension"],
            &invalid[0]["index"],
            &invalid[0]["code"]
        ),
        (&json!("ip"), &json!(1), &json!("invalid_value")),
        "{body}"
    );
    assert_eq!(
        (
            &invalid[1]["dimension"],
            &invalid[1]["index"],
            &invalid[1]["code"]
        ),
        (&json!("phone"), &json!(0), &json!("invalid_value")),
        "{body}"
    );
    assert!(
        !body.to_string().contains("10.0.0.0/8") && !body.to_string().contains("\"123\""),
        "the bad values are never echoed: {body}"
    );
    // A clean check has no `invalid` key at all.
    let clean = app
        .check(&json!({"lists": ["black"], "subjects": {"uid": "u-listed"}}))
        .await;
    assert!(clean.get("invalid").is_none(), "{clean}");
    // `strict`: the whole check is a 400.
    let res = app
        .post(
            "/v1/check",
            &json!({"lists": ["black"], "subjects": subjects, "strict": true}),
        )
        .await;
    let message = expect_error(res, 400, "invalid_value").await;
    assert!(
        message.contains("subjects.ip[1]") || message.contains("subjects.phone[0]"),
        "{message}"
    );
    // The same in one call to /v1/evaluate.
    let res = app
        .post(
            "/v1/evaluate",
            &json!({"lists": ["black"], "subjects": subjects}),
        )
        .await;
    assert_eq!(res.status(), 200);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["hits"].as_array().unwrap().len(), 3, "{body}");
    assert_eq!(body["invalid"].as_array().unwrap().len(), 2, "{body}");
    let res = app
        .post(
            "/v1/evaluate",
            &json!({"lists": ["black"], "subjects": subjects, "strict": true}),
        )
        .await;
    expect_error(res, 400, "invalid_value").await;
}

pub(super) async fn a_bad_value_does_not_void_the_check(redis: &Backend) {
    one_bad_value_never_voids_a_check(&app_on(redis).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_value_does_not_void_the_check_on_the_embedded_store() {
    one_bad_value_never_voids_a_check(&spawn_app(common::test_settings()).await).await;
}

/// Issue 29's table under rules 2 (every new keyspace): each spelling of a listed phone, ID
/// card and IMEI is a hit; a wrong check digit is an invalid value (a 400 as an entry, in
/// `invalid` in a check, never a silent miss).
async fn spellings_cannot_dodge_a_list(app: &TestApp) {
    let res = app
        .post(
            "/v1/lists/black/entries",
            &json!({"entries": [
                {"dimension": "phone", "value": "+86 138 0013 8000"},
                {"dimension": "id_card", "value": "11010519491231002X"},
                {"dimension": "imei", "value": "490154203237518"}
            ]}),
        )
        .await;
    assert_eq!(res.status(), 200);
    for (dimension, spelling) in [
        ("phone", "+86-138-0013-8000"),
        ("phone", "13800138000"),
        ("phone", "8613800138000"),
        ("phone", "008613800138000"),
        ("phone", "+86 (138) 0013-8000"),
        ("id_card", "110105491231002"),
        ("id_card", "11010519491231002x"),
        ("imei", "49015420323751"),
        ("imei", "4901542032375182"),
        ("imei", "49-015420-323751-8"),
    ] {
        let body = app
            .check(&json!({"lists": ["black"], "subjects": {dimension: spelling}}))
            .await;
        assert_eq!(
            body["hits"].as_array().unwrap().len(),
            1,
            "{dimension} {spelling}: {body}"
        );
    }
    for (dimension, bad) in [
        ("id_card", "110105194912310021"),
        ("imei", "490154203237519"),
    ] {
        let body = app
            .check(&json!({"lists": ["black"], "subjects": {dimension: bad, "uid": "u"}}))
            .await;
        assert_eq!(body["invalid"][0]["dimension"], dimension, "{body}");
        let res = app
            .post(
                "/v1/lists/black/entries",
                &json!({"entries": [{"dimension": dimension, "value": bad}]}),
            )
            .await;
        let message = expect_error(res, 400, "invalid_value").await;
        assert!(message.contains("check digit"), "{message}");
    }
}

pub(super) async fn spellings_under_rules_2(redis: &Backend) {
    spellings_cannot_dodge_a_list(&app_on(redis).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spellings_under_rules_2_on_the_embedded_store() {
    spellings_cannot_dodge_a_list(&spawn_app(common::test_settings()).await).await;
}

/// A keyspace made before rules 2 (its meta without `rules`) keeps rules 1 exactly: it records
/// `rules = 1`, phones are matched as typed, no check digit is asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyspace_made_before_rules_2_keeps_rules_1() {
    let redis = RedisServer::start();
    let settings = common::redis_settings(&redis);
    let app = spawn_app(settings.clone()).await;
    app.stop().await;
    let meta = format!("{}meta", settings.key_prefix);
    let _: i64 = ::redis::cmd("HDEL")
        .arg(&meta)
        .arg("rules")
        .query(&mut redis.conn())
        .unwrap();
    let app = spawn_app(settings.clone()).await;
    assert_eq!(
        common::keyspace_meta(&redis, &settings.key_prefix)
            .get("rules")
            .map(String::as_str),
        Some("1")
    );
    let res = app
        .post(
            "/v1/lists/black/entries",
            &json!({"entries": [
                {"dimension": "phone", "value": "13800138000"},
                {"dimension": "id_card", "value": "110105194912310021"},
                {"dimension": "imei", "value": "490154203237519"}
            ]}),
        )
        .await;
    assert_eq!(res.status(), 200, "rules 1 accept what they always did");
    for (dimension, spelling, hit) in [
        ("phone", "138 0013 8000", true),
        ("phone", "+8613800138000", false),
        ("id_card", "110105194912310021", true),
        ("imei", "49-015420-323751-9", true),
        ("imei", "49015420323751", false),
    ] {
        let body = app
            .check(&json!({"lists": ["black"], "subjects": {dimension: spelling}}))
            .await;
        assert_eq!(
            body["hits"].as_array().unwrap().len(),
            usize::from(hit),
            "{dimension} {spelling}: {body}"
        );
    }
    app.stop().await;
}
