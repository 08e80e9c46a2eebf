//! The operators' endpoints over HTTP (issues 13 and 24): `GET /v1/lists` (paged by cursor,
//! filtered), `GET /v1/lists/-/lookup/{dimension}/{value}` and `GET /v1/audit`, on the
//! embedded store, a Redis and a local cluster; every bad filter and cursor a 400 with its
//! code, a cursor with nothing older an empty last page. (Roles:
//! `tests/integration/auth.rs`; no raw value in the logs: `tests/integration/observability.rs`; the same behaviours
//! on every backend without HTTP: `tests/integration/conformance/operators/`.)

use crate::common;

use common::{
    RedisCluster, RedisServer, TestApp, cluster_settings, redis_settings, spawn_app, test_settings,
};
use serde_json::{Value, json};

const PHONE: &str = "13812345678";

async fn get(app: &TestApp, path: &str) -> (u16, Value) {
    let res = app.get(path).await;
    let status = res.status().as_u16();
    (status, res.json().await.unwrap())
}

/// Writes a few entries through the API and reads them back through the three endpoints.
async fn operators_read_what_the_api_wrote(app: &TestApp) {
    let res = app
        .post(
            "/v1/lists/black/entries",
            &json!({"entries": [
                {"dimension": "phone", "value": PHONE, "sandbox": "loan", "reason": "ring 2026-11"},
                {"dimension": "ip", "value": "10.1.2.0/24", "sandbox": "loan", "ttl_seconds": 3600},
                {"dimension": "device", "value": "d-1", "sandbox": "pay"}
            ]}),
        )
        .await;
    assert_eq!(res.status(), 200);
    let res = app
        .post(
            "/v1/lists/grey/entries",
            &json!({"entries": [{"dimension": "phone", "value": "138 1234-5678", "sandbox": "loan"}]}),
        )
        .await;
    assert_eq!(res.status(), 200);
    // A refresh, and a delete of something never listed: neither changes a count.
    app.post(
        "/v1/lists/black/entries",
        &json!({"entries": [{"dimension": "device", "value": "d-1", "sandbox": "pay"}]}),
    )
    .await;
    app.delete(
        "/v1/lists/black/entries",
        &json!({"entries": [{"dimension": "device", "value": "nobody", "sandbox": "pay"}]}),
    )
    .await;
    let res = app
        .post(
            "/v1/check",
            &json!({"sandbox": "loan", "lists": ["black"], "subjects": {"ip": "10.1.2.3"}}),
        )
        .await;
    assert_eq!(res.status(), 200);

    let (status, body) = get(app, "/v1/lists").await;
    assert_eq!(status, 200, "{body}");
    let rows: Vec<(String, String, i64, u64)> = body["lists"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert!(
                r["last_change"].as_i64().unwrap() > 1_700_000_000_000,
                "{r}"
            );
            (
                r["list"].as_str().unwrap().to_owned(),
                r["sandbox"].as_str().unwrap().to_owned(),
                r["entries"].as_i64().unwrap(),
                r["hits"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("black".into(), "loan".into(), 2, 1),
            ("black".into(), "pay".into(), 1, 0),
            ("grey".into(), "loan".into(), 1, 0),
        ],
        "{body}"
    );
    assert_eq!(body["next_cursor"], Value::Null, "one page: {body}");

    // Pages of one, by the cursor handed back; and the filters.
    let mut paged = Vec::new();
    let mut path = "/v1/lists?limit=1".to_owned();
    loop {
        let (status, body) = get(app, &path).await;
        assert_eq!(status, 200, "{body}");
        let page = body["lists"].as_array().unwrap();
        assert_eq!(page.len(), 1, "{body}");
        paged.push(format!("{}/{}", page[0]["list"], page[0]["sandbox"]));
        match body["next_cursor"].as_str() {
            Some(c) => path = format!("/v1/lists?limit=1&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(
        paged,
        [r#""black"/"loan""#, r#""black"/"pay""#, r#""grey"/"loan""#]
    );
    for (query, want) in [
        ("sandbox=loan", vec!["black/loan", "grey/loan"]),
        ("list=black", vec!["black/loan", "black/pay"]),
        ("list=black&sandbox=pay", vec!["black/pay"]),
        ("list=white", vec![]),
        (
            "list=&sandbox=&limit=&cursor=",
            vec!["black/loan", "black/pay", "grey/loan"],
        ),
        ("cursor=black:loan", vec!["black/pay", "grey/loan"]),
    ] {
        let (status, body) = get(app, &format!("/v1/lists?{query}")).await;
        assert_eq!(status, 200, "{query}: {body}");
        let got: Vec<String> = body["lists"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                format!(
                    "{}/{}",
                    r["list"].as_str().unwrap(),
                    r["sandbox"].as_str().unwrap()
                )
            })
            .collect();
        assert_eq!(got, want, "{query}: {body}");
    }

    // The phone, typed another way, on every list of the sandbox.
    let (status, body) = get(
        app,
        "/v1/lists/-/lookup/phone/(138)%201234-5678?sandbox=loan",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let mut lists: Vec<&str> = body["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["list"].as_str().unwrap())
        .collect();
    lists.sort_unstable();
    assert_eq!(lists, ["black", "grey"], "{body}");
    assert_eq!(body["degraded"], false);
    assert!(body.get("truncated").is_none(), "only when true: {body}");
    let (_, body) = get(app, "/v1/lists/-/lookup/ip/10.1.2.200?sandbox=loan").await;
    assert_eq!(body["hits"][0]["value"], "10.1.2.0/24", "{body}");
    assert!(body["hits"][0]["expires_at"].as_i64().is_some());
    let (_, body) = get(app, "/v1/lists/-/lookup/phone/13812345678").await;
    assert_eq!(
        body["hits"],
        json!([]),
        "the default sandbox holds nothing: {body}"
    );

    // The trail: newest first, masked, paged.
    let (status, body) = get(app, &format!("/v1/audit?dimension=phone&value={PHONE}")).await;
    assert_eq!(status, 200, "{body}");
    let records = body["records"].as_array().unwrap();
    assert_eq!(records.len(), 2, "black and grey: {body}");
    assert_eq!(records[0]["list"], "grey");
    assert_eq!(records[1]["reason"], "ring 2026-11");
    assert_eq!(records[1]["who"], "anonymous");
    assert!(records[1]["value"].as_str().unwrap().contains('*'));
    assert!(records[1]["fingerprint"].as_str().unwrap().len() == 16);
    assert!(!body.to_string().contains(PHONE), "{body}");
    assert_eq!(body["next_cursor"], Value::Null);

    let mut seen = 0;
    let mut path = "/v1/audit?limit=2".to_owned();
    loop {
        let (status, body) = get(app, &path).await;
        assert_eq!(status, 200, "{body}");
        seen += body["records"].as_array().unwrap().len();
        match body["next_cursor"].as_str() {
            Some(c) => path = format!("/v1/audit?limit=2&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(
        seen, 6,
        "4 upserts, 1 refresh, 1 delete (of an entry never listed)"
    );
    let (_, body) = get(app, "/v1/audit?op=delete&sandbox=pay").await;
    assert_eq!(body["records"].as_array().unwrap().len(), 1, "{body}");

    // A well-formed cursor with nothing older (on Redis, an `XREVRANGE` to `(0-0` would be
    // refused) is an empty last page, with or without the index: never a store error.
    for path in [
        "/v1/audit?cursor=0-0-3",
        "/v1/audit?cursor=0-0-0&who=anonymous",
        "/v1/audit?cursor=0-0-64&list=black",
        "/v1/audit?cursor=0-1-0&op=upsert",
        "/v1/audit?until=0&dimension=phone&value=13812345678",
    ] {
        let (status, body) = get(app, path).await;
        assert_eq!(status, 200, "{path}: {body}");
        assert_eq!(body["records"], json!([]), "{path}: {body}");
        assert_eq!(body["next_cursor"], Value::Null, "{path}: {body}");
    }
    assert_eq!(
        app.metric(r#"namelist_store_errors_total{op="audit_page"}"#)
            .await
            .unwrap_or(0.0),
        0.0
    );
    // Searches by who and by list, through the index.
    let (_, body) = get(app, "/v1/audit?who=anonymous&list=grey").await;
    assert_eq!(body["records"].as_array().unwrap().len(), 1, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_embedded_store() {
    let app = spawn_app(test_settings()).await;
    operators_read_what_the_api_wrote(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis() {
    let redis = RedisServer::start();
    let app = spawn_app(redis_settings(&redis)).await;
    operators_read_what_the_api_wrote(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster() {
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    let app = spawn_app(cluster_settings(&cluster)).await;
    operators_read_what_the_api_wrote(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_filters_and_cursors_are_400s_that_name_them() {
    let app = spawn_app(test_settings()).await;
    let cases = [
        ("/v1/audit?op=drop", "invalid_filter", "op"),
        ("/v1/audit?since=20&until=10", "invalid_filter", "since"),
        ("/v1/audit?since=yesterday", "invalid_filter", "since"),
        ("/v1/audit?until=-5", "invalid_filter", "until"),
        ("/v1/audit?limit=0", "invalid_filter", "limit"),
        ("/v1/audit?limit=1001", "invalid_filter", "limit"),
        ("/v1/audit?limit=ten", "invalid_filter", "limit"),
        (
            &format!("/v1/audit?value={PHONE}"),
            "invalid_filter",
            "value",
        ),
        (
            "/v1/audit?dimension=phone&value=12",
            "invalid_value",
            "value",
        ),
        (
            "/v1/audit?dimension=Phone!",
            "unknown_dimension",
            "dimension",
        ),
        ("/v1/audit?list=Black%20List", "invalid_list", "list"),
        ("/v1/audit?sandbox=a%20b", "invalid_sandbox", "sandbox"),
        ("/v1/audit?cursor=abc", "invalid_cursor", "cursor"),
        ("/v1/audit?cursor=1-2-99", "invalid_cursor", "cursor"),
        ("/v1/audit?cursor=1-2-3-4", "invalid_cursor", "cursor"),
        ("/v1/audit?colour=red", "invalid_body", "colour"),
        ("/v1/lists?list=Black", "invalid_list", "list"),
        ("/v1/lists?sandbox=a%20b", "invalid_sandbox", "sandbox"),
        ("/v1/lists?limit=0", "invalid_filter", "limit"),
        ("/v1/lists?limit=1001", "invalid_filter", "limit"),
        ("/v1/lists?limit=ten", "invalid_filter", "limit"),
        ("/v1/lists?cursor=abc", "invalid_cursor", "cursor"),
        ("/v1/lists?cursor=black:", "invalid_cursor", "cursor"),
        ("/v1/lists?cursor=Black:loan", "invalid_cursor", "cursor"),
        ("/v1/lists?cursor=black:lo:an", "invalid_cursor", "cursor"),
        ("/v1/lists?colour=red", "invalid_body", "colour"),
        ("/v1/lists/-/lookup/Shoe/x", "unknown_dimension", "path"),
        ("/v1/lists/-/lookup/phone/12", "invalid_value", "path"),
        (
            "/v1/lists/-/lookup/uid/u1?sandbox=no%20way",
            "invalid_sandbox",
            "query",
        ),
        (
            "/v1/lists/-/lookup/ip/10.0.0.0%2F8",
            "invalid_value",
            "path",
        ),
    ];
    for (path, code, names) in cases {
        let (status, body) = get(&app, path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert_eq!(body["error"]["code"], code, "{path}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(names), "{path}: {message}");
        assert!(!message.contains(PHONE), "{path}: {message}");
    }
    // The same filters in a POST body (what the console sends).
    for (body, code, names) in [
        (json!({"op": "drop"}), "invalid_filter", "op"),
        (json!({"since": true}), "invalid_filter", "since"),
        (json!({"since": 1.5}), "invalid_filter", "since"),
        (json!({"until": [1]}), "invalid_body", "until"),
        (json!({"limit": 0}), "invalid_filter", "limit"),
        (json!({"value": PHONE}), "invalid_filter", "value"),
        (json!({"cursor": "x"}), "invalid_cursor", "cursor"),
        (json!({"colour": "red"}), "invalid_body", "colour"),
    ] {
        let res = app.post("/v1/audit", &body).await;
        assert_eq!(res.status(), 400, "{body}");
        let answer: Value = res.json().await.unwrap();
        assert_eq!(answer["error"]["code"], code, "{body}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(names) && !message.contains(PHONE),
            "{message}"
        );
    }
    let res = app
        .post(
            "/v1/audit",
            &json!({"since": 0, "until": 9_999_999_999_999_i64, "limit": 5}),
        )
        .await;
    assert_eq!(res.status(), 200);
    for (method, path) in [
        ("POST", "/v1/lists"),
        ("DELETE", "/v1/lists"),
        ("PUT", "/v1/lists"),
        ("DELETE", "/v1/audit"),
        ("PUT", "/v1/audit"),
        ("POST", "/v1/lists/-/lookup/uid/u1"),
        ("DELETE", "/v1/lists/-/lookup/uid/u1"),
        ("PUT", "/v1/lists/-/lookup/uid/u1"),
    ] {
        {
            let res = app
                .client
                .request(method.parse().unwrap(), app.url(path))
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 405, "{method} {path}");
        }
    }
}
