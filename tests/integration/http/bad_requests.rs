//! Every bad request (body over the limit, broken JSON, unknown dimension, bad value at index
//! i, …) is a 4xx with its exact code and message, and `DEBUG DIGEST` of Redis is unchanged.

use crate::common;

use common::Backend;
use serde_json::{Value, json};

use super::{app_on, expect_error};

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

pub(super) async fn every_bad_request_is_a_4xx_and_changes_nothing(redis: &Backend) {
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
