//! The HTTP contract of API.md on the real application (port 0) and a real `redis-server`:
//! every endpoint, every error code, and the store left unchanged by every bad request.

use crate::common;

use common::{Backend, RedisCluster, RedisServer, TestApp, spawn_app};
use serde_json::{Value, json};

async fn app_on(redis: &Backend) -> TestApp {
    let mut settings = redis.settings();
    settings.max_body_bytes = 1024 * 1024;
    spawn_app(settings).await
}

/// Asserts the exact error shape of API.md and returns the message.
async fn expect_error(res: reqwest::Response, status: u16, code: &str) -> String {
    assert_eq!(res.status().as_u16(), status, "status for {code}");
    let retry_after = res.headers().get("retry-after").cloned();
    let body: Value = res.json().await.expect("error body is JSON");
    let obj = body.as_object().expect("error body is an object");
    assert_eq!(obj.len(), 1, "only `error` in {body}");
    let err = obj["error"].as_object().expect("`error` is an object");
    assert_eq!(err.len(), 2, "only code and message in {body}");
    assert_eq!(err["code"], code, "code in {body}");
    if status == 503 {
        assert_eq!(retry_after.as_ref().map(|v| v.to_str().unwrap()), Some("1"));
    }
    err["message"]
        .as_str()
        .expect("message is a string")
        .to_owned()
}

async fn every_endpoint_round_trips(redis: &Backend) {
    let app = app_on(redis).await;
    let future = namelist::domain::now_ms() + 86_400_000;

    let res = app
        .post(
            "/v1/lists/black/entries",
            &json!({"entries": [
                {"dimension": "phone", "value": "+86 138-0000-0000", "sandbox": "loan",
                 "ttl_seconds": 86400, "reason": "chargeback 2026-11"},
                {"dimension": "ip", "value": "10.1.2.0/24", "expires_at": future, "sandbox": "loan"},
                {"dimension": "device", "value": "d000001"}
            ]}),
        )
        .await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.json::<Value>().await.unwrap(), json!({"written": 3}));

    // Lookups: exact entries, the range by its own value (encoded or raw slash).
    let body: Value = app
        .get("/v1/lists/black/entries/device/d000001")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body, json!({"listed": true, "expires_at": null}));
    for path in [
        "/v1/lists/black/entries/ip/10.1.2.0%2F24?sandbox=loan",
        "/v1/lists/black/entries/ip/10.1.2.0/24?sandbox=loan",
    ] {
        let body: Value = app.get(path).await.json().await.unwrap();
        let at = future.div_euclid(1000) * 1000 + if future % 1000 == 0 { 0 } else { 1000 };
        assert_eq!(body, json!({"listed": true, "expires_at": at}), "{path}");
    }
    let body: Value = app
        .get("/v1/lists/black/entries/phone/%2B8613800000000?sandbox=loan")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body["listed"], true);
    let body: Value = app
        .get("/v1/lists/black/entries/phone/%2B8613800000000")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body, json!({"listed": false}), "another sandbox");

    // The risk engine's check.
    let body = app
        .check(&json!({"sandbox": "loan", "lists": ["black", "grey"],
            "subjects": {"uid": "u1", "phone": "+8613800000000", "device": "d1",
                         "imei": "490154203237518", "ip": ["10.1.2.3", "2001:db8::1"],
                         "wifi_mac": "AA-BB-CC-DD-EE-FF"}}))
        .await;
    assert_eq!(
        body.as_object().unwrap().len(),
        2,
        "hits and degraded only: {body}"
    );
    assert_eq!(body["degraded"], false);
    let mut hits = body["hits"].as_array().unwrap().clone();
    hits.sort_by_key(|h| h["dimension"].as_str().unwrap().to_owned());
    assert_eq!(hits.len(), 2, "{body}");
    assert_eq!(
        hits[0],
        json!({"list": "black", "dimension": "ip", "value": "10.1.2.0/24",
               "expires_at": hits[0]["expires_at"]})
    );
    assert!(hits[0]["expires_at"].as_i64().unwrap() >= future);
    assert_eq!(hits[1]["dimension"], "phone");
    assert_eq!(hits[1]["value"], "+8613800000000");

    // Delete: only present, live entries count.
    let res = app
        .delete(
            "/v1/lists/black/entries",
            &json!({"entries": [
                {"dimension": "device", "value": "d000001"},
                {"dimension": "device", "value": "never-there"}
            ]}),
        )
        .await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.json::<Value>().await.unwrap(), json!({"removed": 1}));
    let body: Value = app
        .get("/v1/lists/black/entries/device/d000001")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body, json!({"listed": false}));

    // Operations.
    let res = app.get("/healthz").await;
    assert_eq!(res.status(), 200);
    let res = app.get("/readyz").await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.json::<Value>().await.unwrap()["store"], "redis");
    let res = app.get("/metrics").await;
    assert_eq!(res.status(), 200);
    let text = res.text().await.unwrap();
    for needle in [
        "namelist_http_request_duration_seconds_bucket{method=\"POST\",route=\"/v1/check\",status=\"200\"",
        "namelist_cache_misses_total",
        "namelist_cache_hits_total",
        "namelist_store_call_duration_seconds",
        "namelist_store_errors_total",
        "namelist_entries_written_total 3",
        "namelist_entries_removed_total 1",
    ] {
        assert!(text.contains(needle), "/metrics lacks {needle}");
    }
    assert!(!text.contains("13800000000"), "no identifier in metrics");
}

async fn ten_thousand_entries_in_one_request(redis: &Backend) {
    // About what a 10,000-entry request does, not how fast: a debug build writing it to a
    // cluster beside the rest of the suite on 2 cores once took longer than the default 2 s
    // write deadline (a 503). Its speed is the benches' business.
    let mut settings = redis.settings();
    settings.max_body_bytes = 1024 * 1024;
    settings.write_deadline_ms = 15_000;
    let app = spawn_app(settings).await;
    let entries: Vec<Value> = (0..10_000)
        .map(|i| json!({"dimension": "uid", "value": format!("user-{i}"), "ttl_seconds": 3600}))
        .collect();
    let res = app
        .post("/v1/lists/black/entries", &json!({ "entries": entries }))
        .await;
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.json::<Value>().await.unwrap(),
        json!({"written": 10_000})
    );
    let body = app
        .check(&json!({"lists": ["black"], "subjects": {"uid": ["user-0", "user-9999", "user-10000"]}}))
        .await;
    let values: Vec<&str> = body["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["value"].as_str().unwrap())
        .collect();
    assert_eq!(values, vec!["user-0", "user-9999"]);
}

/// A bad request: what is sent and what must come back.
struct Bad {
    method: &'static str,
    path: &'static str,
    body: Vec<u8>,
    status: u16,
    code: &'static str,
    /// Pieces the message must contain (where the problem is).
    says: &'static [&'static str],
}

fn bad(
    method: &'static str,
    path: &'static str,
    body: Value,
    status: u16,
    code: &'static str,
    says: &'static [&'static str],
) -> Bad {
    Bad {
        method,
        path,
        body: serde_json::to_vec(&body).unwrap(),
        status,
        code,
        says,
    }
}

fn raw(
    method: &'static str,
    path: &'static str,
    body: &[u8],
    status: u16,
    code: &'static str,
) -> Bad {
    Bad {
        method,
        path,
        body: body.to_vec(),
        status,
        code,
        says: &[],
    }
}

async fn every_bad_request_is_a_4xx_and_changes_nothing(redis: &Backend) {
    let app = app_on(redis).await;
    let past = namelist::domain::now_ms() - 1000;
    let post = "/v1/lists/black/entries";
    let ok_entry = json!({"dimension": "uid", "value": "fine"});
    let too_many: Vec<Value> = (0..10_001)
        .map(|i| json!({"dimension": "uid", "value": format!("u{i}")}))
        .collect();
    let over_limit = {
        let big: Vec<Value> = (0..9_000)
            .map(|i| json!({"dimension": "uid", "value": format!("{i:0>120}")}))
            .collect();
        json!({ "entries": big })
    };
    let values: Vec<String> = (0..65).map(|i| format!("d{i}")).collect();

    let cases = vec![
        raw("POST", post, b"{\"entries\": [", 400, "invalid_json"),
        raw("POST", post, b"", 400, "invalid_json"),
        raw("POST", post, b"\xff\xfe{}", 400, "invalid_json"),
        raw(
            "POST",
            post,
            b"{\"entries\": []} trailing",
            400,
            "invalid_json",
        ),
        raw("POST", post, &[b'['; 5000], 400, "invalid_json"),
        raw("POST", post, b"[]", 400, "invalid_body"),
        bad(
            "POST",
            post,
            json!({"entries": [ok_entry, {"dimension": "uid", "value": "x", "ttl": 5}]}),
            400,
            "invalid_body",
            &["entries[1]", "ttl"],
        ),
        bad(
            "POST",
            post,
            json!({"entries": [ok_entry, {"dimension": "uid", "value": 5}]}),
            400,
            "invalid_body",
            &["entries[1].value"],
        ),
        bad(
            "POST",
            post,
            json!({"entries": [ok_entry, ok_entry, {"dimension": "Phone!", "value": "1"}]}),
            400,
            "unknown_dimension",
            &["entries[2].dimension", "unknown dimension"],
        ),
        bad(
            "POST",
            post,
            json!({"entries": [ok_entry, ok_entry, ok_entry, {"dimension": "phone", "value": "12ab"}]}),
            400,
            "invalid_value",
            &["entries[3].value", "phone"],
        ),
        bad(
            "POST",
            post,
            json!({"entries": [{"dimension": "imei", "value": "123"}]}),
            400,
            "invalid_value",
            &["entries[0].value", "imei"],
        ),
        bad(
            "POST",
            post,
            json!({"entries": [{"dimension": "ip", "value": "10.0.0.0/33"}]}),
            400,
            "invalid_value",
            &["entries[0].value", "ip"],
        ),
        bad(
            "POST",
            post,
            json!({"entries": [{"dimension": "uid", "value": "   "}]}),
            400,
            "invalid_value",
            &["entries[0].value"],
        ),
        bad(
            "POST",
            post,
            json!({"entries": [{"dimension": "uid", "value": "x".repeat(257)}]}),
            400,
            "invalid_value",
            &["entries[0].value"],
        ),
        bad(
            "POST",
            "/v1/lists/Black/entries",
            json!({"entries": [ok_entry]}),
            400,
            "invalid_list",
            &["Black"],
        ),
        bad(
            "POST",
            post,
            json!({"entries": [{"dimension": "uid", "value": "x", "sandbox": "a b"}]}),
            400,
            "invalid_sandbox",
            &["entries[0].sandbox"],
        ),
        bad(
            "POST",
            post,
            json!({"entries": [{"dimension": "uid", "value": "x", "ttl_seconds": 5, "expires_at": past + 10_000_000}]}),
            400,
            "invalid_expiry",
            &["entries[0]"],
        ),
        bad(
            "POST",
            post,
            json!({"entries": [{"dimension": "uid", "value": "x", "expires_at": past}]}),
            400,
            "expiry_in_past",
            &["entries[0].expires_at"],
        ),
        bad(
            "POST",
            post,
            json!({"entries": [{"dimension": "uid", "value": "x", "ttl_seconds": 0}]}),
            400,
            "invalid_expiry",
            &["entries[0].ttl_seconds"],
        ),
        bad(
            "POST",
            post,
            json!({"entries": [{"dimension": "uid", "value": "x", "ttl_seconds": -5}]}),
            400,
            "invalid_body",
            &["entries[0].ttl_seconds"],
        ),
        raw(
            "POST",
            post,
            b"{\"entries\": [{\"dimension\": \"uid\", \"value\": \"x\", \"ttl_seconds\": 1e400}]}",
            400,
            "invalid_json",
        ),
        bad(
            "POST",
            post,
            json!({"entries": [{"dimension": "uid", "value": "x", "ttl_seconds": 99_999_999_999u64}]}),
            400,
            "invalid_expiry",
            &["entries[0].ttl_seconds"],
        ),
        bad(
            "POST",
            post,
            json!({"entries": [{"dimension": "uid", "value": "x", "reason": "r".repeat(257)}]}),
            400,
            "invalid_reason",
            &["entries[0].reason"],
        ),
        bad(
            "POST",
            post,
            json!({ "entries": too_many }),
            400,
            "too_many_entries",
            &["10001"],
        ),
        bad("POST", post, over_limit, 413, "payload_too_large", &[]),
        bad(
            "DELETE",
            post,
            json!({"entries": [ok_entry, {"dimension": "wifi_mac", "value": "zz"}]}),
            400,
            "invalid_value",
            &["entries[1].value", "wifi_mac"],
        ),
        bad(
            "DELETE",
            post,
            json!({"entries": [{"dimension": "uid"}]}),
            400,
            "invalid_body",
            &["value"],
        ),
        bad(
            "POST",
            "/v1/check",
            json!({"lists": ["black"], "subjects": {"ip": "10.0.0.0/8"}, "strict": true}),
            400,
            "invalid_value",
            &["subjects.ip[0]", "ranges"],
        ),
        bad(
            "POST",
            "/v1/check",
            json!({"lists": ["black"], "subjects": {"Phone": "1"}}),
            400,
            "unknown_dimension",
            &["subjects.Phone"],
        ),
        bad(
            "POST",
            "/v1/check",
            json!({"lists": ["black"], "subjects": {"device": values}}),
            400,
            "too_many_values",
            &["65"],
        ),
        bad(
            "POST",
            "/v1/check",
            json!({"lists": [], "subjects": {}}),
            400,
            "invalid_lists",
            &[],
        ),
        bad(
            "POST",
            "/v1/check",
            json!({"subjects": {}}),
            400,
            "invalid_body",
            &["lists"],
        ),
        bad(
            "POST",
            "/v1/check",
            json!({"lists": ["black"], "subjects": {"uid": 7}}),
            400,
            "invalid_body",
            &["subjects"],
        ),
        bad(
            "POST",
            "/v1/check",
            json!({"lists": ["black"], "sandbox": "", "subjects": {}}),
            400,
            "invalid_sandbox",
            &["sandbox"],
        ),
        bad(
            "GET",
            "/v1/lists/black/entries/Phone/1",
            json!(null),
            400,
            "unknown_dimension",
            &[],
        ),
        bad(
            "GET",
            "/v1/lists/black/entries/phone/abc",
            json!(null),
            400,
            "invalid_value",
            &["phone"],
        ),
        bad(
            "GET",
            "/v1/lists/black/entries/uid/u1?sandbox=a%20b",
            json!(null),
            400,
            "invalid_sandbox",
            &[],
        ),
        bad(
            "GET",
            "/v1/lists/black/entries/uid/u1?sandbx=x",
            json!(null),
            400,
            "invalid_body",
            &["query"],
        ),
        bad(
            "GET",
            "/v1/nothing-here",
            json!(null),
            404,
            "not_found",
            &[],
        ),
        bad(
            "GET",
            "/v1/check",
            json!(null),
            405,
            "method_not_allowed",
            &[],
        ),
        bad(
            "PUT",
            post,
            json!({"entries": []}),
            405,
            "method_not_allowed",
            &[],
        ),
    ];

    let before = redis.digest();
    for case in cases {
        let url = app.url(case.path);
        let req = match case.method {
            "GET" => app.client.get(url),
            "POST" => app.client.post(url),
            "DELETE" => app.client.delete(url),
            "PUT" => app.client.put(url),
            m => panic!("method {m}"),
        };
        let req = if case.method == "GET" {
            req
        } else {
            req.header("content-type", "application/json")
                .body(case.body.clone())
        };
        let res = req.send().await.expect("request");
        let message = expect_error(res, case.status, case.code).await;
        for piece in case.says {
            assert!(
                message.contains(piece),
                "{} {}: message {message:?} should name {piece:?}",
                case.method,
                case.path
            );
        }
        assert_eq!(
            redis.digest(),
            before,
            "{} {} ({}) changed the store",
            case.method,
            case.path,
            case.code
        );
    }
}

async fn values_are_normalised_before_matching(redis: &Backend) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_are_listpacks_with_integer_fields() {
    let backend = Backend::Node(RedisServer::start());
    let app = app_on(&backend).await;
    let Backend::Node(redis) = &backend else {
        unreachable!()
    };
    let entries: Vec<Value> = (0..2_000)
        .map(|i| json!({"dimension": "device", "value": format!("dev-{i}"), "ttl_seconds": 86_400 * 30}))
        .collect();
    let res = app
        .post("/v1/lists/black/entries", &json!({ "entries": entries }))
        .await;
    assert_eq!(res.status(), 200);
    let mut conn = redis.conn();
    let prefix = app.lists.store().layout().prefix().to_owned();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}b:*"))
        .query(&mut conn)
        .unwrap();
    assert!(!keys.is_empty());
    let mut fields = 0;
    for key in &keys {
        let enc: String = redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg(key)
            .query(&mut conn)
            .unwrap();
        assert_eq!(enc, "listpack", "{key}");
        let all: Vec<(String, String)> = redis::cmd("HGETALL").arg(key).query(&mut conn).unwrap();
        for (f, v) in all {
            assert!(
                f.parse::<i64>().is_ok(),
                "field {f} is a signed decimal i64"
            );
            let code: u32 = v.parse().expect("value is an integer");
            assert!(
                code > 0 && code < (1 << 31),
                "expiry in seconds since 2020: {code}"
            );
            fields += 1;
        }
    }
    assert_eq!(fields, 2_000);
    let meta: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg(format!("{prefix}meta"))
        .query(&mut conn)
        .unwrap();
    assert_eq!(meta["format"], "2", "a new keyspace is keyed");
    assert_eq!(meta["key_id"], common::test_key().id());
    assert_eq!(
        meta["buckets"], "5000",
        "1,000,000 entries by default, 200 per bucket"
    );
}

/// Deletes run a script by SHA: after `SCRIPT FLUSH` (a restart, a failover to a fresh node)
/// it is reloaded and the delete still counts and removes exactly what was there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_survive_a_flushed_script_cache() {
    let backend = Backend::Node(RedisServer::start());
    let app = app_on(&backend).await;
    let Backend::Node(redis) = &backend else {
        unreachable!()
    };
    let entries: Vec<Value> = (0..3)
        .map(|i| json!({"dimension": "device", "value": format!("dev-{i}")}))
        .collect();
    let res = app
        .post("/v1/lists/black/entries", &json!({ "entries": entries }))
        .await;
    assert_eq!(res.status(), 200);
    let mut conn = redis.conn();
    for round in 0..2 {
        let ok: String = redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn).unwrap();
        assert_eq!(ok, "OK");
        let value = format!("dev-{round}");
        let res = app
            .delete(
                "/v1/lists/black/entries",
                &json!({"entries": [
                    {"dimension": "device", "value": value},
                    {"dimension": "device", "value": "never-there"}
                ]}),
            )
            .await;
        assert_eq!(res.status(), 200, "round {round}");
        assert_eq!(res.json::<Value>().await.unwrap(), json!({"removed": 1}));
    }
    for (i, listed) in [(0, false), (1, false), (2, true)] {
        let body: Value = app
            .get(&format!("/v1/lists/black/entries/device/dev-{i}"))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(body["listed"], listed, "dev-{i}");
    }
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

async fn a_bad_value_does_not_void_the_check(redis: &Backend) {
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

async fn spellings_under_rules_2(redis: &Backend) {
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

macro_rules! on_a_node_and_a_cluster {
    ($($case:ident),* $(,)?) => {
        mod one_node {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(&super::Backend::Node(super::RedisServer::start())).await;
                }
            )*
        }
        /// Every case on one local 6-node cluster.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn redis_cluster_all_cases() {
            let cluster = Backend::Cluster(tokio::task::block_in_place(RedisCluster::start));
            $(
                eprintln!("cluster: {}", stringify!($case));
                $case(&cluster).await;
            )*
        }
    };
}

on_a_node_and_a_cluster!(
    every_endpoint_round_trips,
    ten_thousand_entries_in_one_request,
    every_bad_request_is_a_4xx_and_changes_nothing,
    values_are_normalised_before_matching,
    a_bad_value_does_not_void_the_check,
    spellings_under_rules_2,
);
