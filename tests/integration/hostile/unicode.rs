//! Unicode in identifiers: rejected or accepted, and then matched, consistently.

use crate::common;

use common::{RedisServer, redis_settings, spawn_app};
use serde_json::{Value, json};

use super::SERIAL;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unicode_identifiers_are_consistent() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let app = spawn_app(redis_settings(&redis)).await;
    let res = app
        .post(
            "/v1/lists/black/entries",
            &json!({"entries": [
                {"dimension": "uid", "value": "u\u{200d}1"},
                {"dimension": "uid", "value": "\u{3000}zw2\u{a0}"},
                {"dimension": "uid", "value": "u\u{455}er"},
                {"dimension": "device", "value": "caf\u{e9}"}
            ]}),
        )
        .await;
    assert_eq!(res.status(), 200);

    let values = |body: &Value| -> Vec<String> {
        let mut v: Vec<String> = body["hits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["value"].as_str().unwrap().to_owned())
            .collect();
        v.sort();
        v
    };
    // Invisible and look-alike characters are part of an opaque value: no folding.
    let body = app
        .check(&json!({"lists": ["black"], "subjects": {"uid": ["u1", "user", "u\u{200d}1", "u\u{455}er"]}}))
        .await;
    assert_eq!(values(&body), vec!["u\u{455}er", "u\u{200d}1"]);
    // Unicode whitespace is trimmed the same way in entries and checks.
    for probe in ["zw2", " zw2", "\u{a0}zw2\u{3000}", "zw2\u{2003}"] {
        let body = app
            .check(&json!({"lists": ["black"], "subjects": {"uid": probe}}))
            .await;
        assert_eq!(values(&body), vec!["zw2"], "{probe:?}");
    }
    // Composed and decomposed forms are different values (no normalisation, by design).
    let body = app
        .check(&json!({"lists": ["black"], "subjects": {"device": ["caf\u{e9}", "cafe\u{301}"]}}))
        .await;
    assert_eq!(values(&body), vec!["caf\u{e9}"]);
    // Lookups agree with checks.
    for (path, listed) in [
        ("/v1/lists/black/entries/uid/u%E2%80%8D1", true),
        ("/v1/lists/black/entries/uid/u1", false),
        ("/v1/lists/black/entries/uid/zw2", true),
        ("/v1/lists/black/entries/uid/%E3%80%80zw2", true),
        ("/v1/lists/black/entries/uid/u%D1%95er", true),
        ("/v1/lists/black/entries/uid/user", false),
    ] {
        let body: Value = app.get(path).await.json().await.unwrap();
        assert_eq!(body["listed"], listed, "{path}: {body}");
    }
    // Look-alike identifiers are refused everywhere, the same way, and change nothing.
    let before = redis.digest();
    for (method, path, body, code) in [
        (
            "POST",
            "/v1/lists/bl%D0%B0ck/entries",
            json!({"entries": [{"dimension": "uid", "value": "x"}]}),
            "invalid_list",
        ),
        (
            "POST",
            "/v1/lists/black/entries",
            json!({"entries": [{"dimension": "u\u{456}d", "value": "x"}]}),
            "unknown_dimension",
        ),
        (
            "POST",
            "/v1/check",
            json!({"lists": ["black"], "subjects": {"u\u{456}d": "x"}}),
            "unknown_dimension",
        ),
        (
            "POST",
            "/v1/check",
            json!({"lists": ["bl\u{430}ck"], "subjects": {"uid": "x"}}),
            "invalid_list",
        ),
        (
            "POST",
            "/v1/check",
            json!({"sandbox": "lo\u{200d}an", "lists": ["black"], "subjects": {"uid": "x"}}),
            "invalid_sandbox",
        ),
        (
            "DELETE",
            "/v1/lists/black/entries",
            json!({"entries": [{"dimension": "uid\u{200d}", "value": "x"}]}),
            "unknown_dimension",
        ),
    ] {
        let req = match method {
            "POST" => app.client.post(app.url(path)),
            _ => app.client.delete(app.url(path)),
        };
        let res = req.json(&body).send().await.unwrap();
        assert_eq!(res.status(), 400, "{method} {path} {body}");
        let v: Value = res.json().await.unwrap();
        assert_eq!(v["error"]["code"], code, "{method} {path} {body}: {v}");
    }
    for path in [
        "/v1/lists/black/entries/u%D1%96d/x",
        "/v1/lists/bl%D0%B0ck/entries/uid/x",
    ] {
        let res = app.get(path).await;
        assert_eq!(res.status(), 400, "{path}");
    }
    assert_eq!(redis.digest(), before, "refused requests changed the store");
}
