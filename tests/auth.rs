//! Bearer-token auth on the real app: the role each route needs, 401 and 403 in API.md's
//! shape, open operations endpoints, the token's name in the audit trail, and a rotated
//! tokens file taking effect without a restart.

mod common;

use std::time::{Duration, Instant};

use common::{RedisServer, TestApp, redis_settings, spawn_app};
use serde_json::{Value, json};

const READ: &str = "read-token-0123456789";
const WRITE: &str = "write-token-0123456789";
const ADMIN: &str = "admin-token-0123456789";

fn tokens_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("tokens.toml");
    std::fs::write(
        &path,
        format!(
            "[[tokens]]\nname = \"risk-engine\"\nrole = \"read\"\ntoken = \"{READ}\"\n\n\
             [[tokens]]\nname = \"list-loader\"\nrole = \"write\"\ntoken = \"{WRITE}\"\n\n\
             [[tokens]]\nname = \"platform-admin\"\nrole = \"admin\"\ntoken = \"{ADMIN}\"\n"
        ),
    )
    .unwrap();
    path
}

async fn call(
    app: &TestApp,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> reqwest::Response {
    let mut req = match method {
        "GET" => app.client.get(app.url(path)),
        "POST" => app.client.post(app.url(path)),
        "PUT" => app.client.put(app.url(path)),
        "DELETE" => app.client.delete(app.url(path)),
        m => panic!("{m}"),
    };
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    req.send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_needs_its_role() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = redis_settings(&redis);
    settings.tokens_file = Some(tokens_file(dir.path()));
    let app = spawn_app(settings).await;

    let entry = json!({"entries": [{"dimension": "uid", "value": "u1"}]});
    let metric = json!({"expr": "COUNT(1h, login) BY user"});
    // (method, path, body, the lowest role that may call it)
    let routes: Vec<(&str, &str, Option<Value>, usize)> = vec![
        (
            "POST",
            "/v1/check",
            Some(json!({"lists": ["black"], "subjects": {"uid": "u1"}})),
            0,
        ),
        ("GET", "/v1/lists/black/entries/uid/u1", None, 0),
        ("GET", "/v1/lists", None, 0),
        ("GET", "/v1/lists/-/lookup/uid/u1", None, 0),
        ("GET", "/v1/audit?limit=5", None, 0),
        (
            "POST",
            "/v1/features",
            Some(json!({"metrics": ["m1"], "fields": {"user": "u"}})),
            0,
        ),
        (
            "POST",
            "/v1/evaluate",
            Some(json!({"lists": ["black"], "subjects": {"uid": "u1"}})),
            0,
        ),
        ("GET", "/v1/metrics", None, 0),
        ("GET", "/v1/metrics/m1", None, 0),
        ("GET", "/v1/rules", None, 0),
        ("POST", "/v1/lists/black/entries", Some(entry.clone()), 1),
        ("DELETE", "/v1/lists/black/entries", Some(entry.clone()), 1),
        (
            "POST",
            "/v1/events",
            Some(json!({"type": "login", "fields": {"user": "u"}})),
            1,
        ),
        ("PUT", "/v1/metrics/m2", Some(metric.clone()), 2),
        ("PUT", "/v1/rules/r1", Some(json!({"expr": "m1 > 3"})), 2),
        ("DELETE", "/v1/rules/r1", None, 2),
        ("DELETE", "/v1/metrics/m2", None, 2),
    ];
    // A metric the read routes can name.
    let res = call(
        &app,
        "PUT",
        "/v1/metrics/m1",
        Some(ADMIN),
        Some(metric.clone()),
    )
    .await;
    assert_eq!(res.status(), 200);

    for (method, path, body, lowest) in &routes {
        for (role, token) in [READ, WRITE, ADMIN].iter().enumerate() {
            let res = call(&app, method, path, Some(token), body.clone()).await;
            let status = res.status().as_u16();
            if role >= *lowest {
                assert!(
                    status != 401 && status != 403,
                    "{method} {path} with role {role}: {status}"
                );
            } else {
                assert_eq!(status, 403, "{method} {path} with role {role}");
                let body: Value = res.json().await.unwrap();
                assert_eq!(body["error"]["code"], "forbidden");
            }
        }
        for token in [None, Some("not-a-valid-token-at-all"), Some("")] {
            let res = call(&app, method, path, token, body.clone()).await;
            assert_eq!(res.status(), 401, "{method} {path} with {token:?}");
            assert_eq!(res.headers()["www-authenticate"], "Bearer");
            let body: Value = res.json().await.unwrap();
            assert_eq!(body["error"]["code"], "unauthorized");
        }
    }
    // A wrong scheme is no token.
    let res = app
        .client
        .post(app.url("/v1/check"))
        .header("authorization", format!("Basic {READ}"))
        .json(&json!({"lists": ["black"], "subjects": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);

    for open in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(app.get(open).await.status(), 200, "{open} needs no token");
    }
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(metrics.contains("namelist_auth_failures_total{reason=\"forbidden\"}"));
    assert!(metrics.contains("namelist_auth_failures_total{reason=\"missing\"}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_trail_names_the_token() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = redis_settings(&redis);
    settings.tokens_file = Some(tokens_file(dir.path()));
    let app = spawn_app(settings).await;
    let entry = json!({"entries": [{"dimension": "phone", "value": "13800000000"}]});
    assert_eq!(
        call(
            &app,
            "POST",
            "/v1/lists/black/entries",
            Some(WRITE),
            Some(entry.clone())
        )
        .await
        .status(),
        200
    );
    assert_eq!(
        call(
            &app,
            "DELETE",
            "/v1/lists/black/entries",
            Some(ADMIN),
            Some(entry)
        )
        .await
        .status(),
        200
    );
    let tail = app.lists.store().audit_tail(2).await.unwrap();
    assert_eq!(tail[0].get("who"), Some("list-loader"));
    assert_eq!(tail[1].get("who"), Some("platform-admin"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_tokens_file_takes_effect_without_a_restart() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = tokens_file(dir.path());
    let mut settings = redis_settings(&redis);
    settings.tokens_file = Some(path.clone());
    let app = spawn_app(settings).await;
    let check = json!({"lists": ["black"], "subjects": {}});
    assert_eq!(
        call(&app, "POST", "/v1/check", Some(READ), Some(check.clone()))
            .await
            .status(),
        200
    );

    std::fs::write(
        &path,
        "[[tokens]]\nname = \"rotated\"\nrole = \"read\"\ntoken = \"the-new-read-token-42\"\n",
    )
    .unwrap();
    let f = std::fs::File::options().write(true).open(&path).unwrap();
    f.set_modified(std::time::SystemTime::now() + Duration::from_secs(5))
        .unwrap();
    let started = Instant::now();
    loop {
        let old = call(&app, "POST", "/v1/check", Some(READ), Some(check.clone()))
            .await
            .status();
        let new = call(
            &app,
            "POST",
            "/v1/check",
            Some("the-new-read-token-42"),
            Some(check.clone()),
        )
        .await
        .status();
        if old == 401 && new == 200 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(25),
            "still {old} / {new}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_tokens_file_stops_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.toml");
    std::fs::write(
        &path,
        "[[tokens]]\nname = \"x\"\nrole = \"read\"\ntoken = \"short\"\n",
    )
    .unwrap();
    let mut settings = common::test_settings();
    settings.tokens_file = Some(path);
    let err = namelist::startup::Application::build(settings)
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("at least 16"), "{err}");
}
