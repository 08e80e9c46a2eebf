//! Bearer-token auth on the real app: the permission each route needs (from `ROUTES`, the
//! table the router, the OpenAPI document and the README share), the presets, an event in
//! `evaluate` needing `events`, 401 and 403 in API.md's shape, open operations endpoints, the
//! token's name in the audit trail, and a rotated tokens file taking effect without a
//! restart.

use crate::common;

use std::time::{Duration, Instant};

use common::{RedisServer, TestApp, redis_settings, spawn_app};
use namelist::auth::Permission;
use namelist::routes::{Need, ROUTES, RouteDef};
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

/// A token per permission, holding that permission alone (`role = ["…"]`).
fn single(p: Permission) -> String {
    format!("only-{}-0123456789", p.as_str())
}

fn tokens_with_singles(dir: &std::path::Path) -> std::path::PathBuf {
    let path = tokens_file(dir);
    let mut text = std::fs::read_to_string(&path).unwrap();
    for p in Permission::ALL {
        text.push_str(&format!(
            "\n[[tokens]]\nname = \"only-{0}\"\nrole = [\"{0}\"]\ntoken = \"{1}\"\n",
            p.as_str(),
            single(p)
        ));
    }
    text.push_str(&format!(
        "\n[[tokens]]\nname = \"risk-engine-2\"\nrole = \"engine\"\ntoken = \"{ENGINE}\"\n"
    ));
    std::fs::write(&path, text).unwrap();
    path
}

const ENGINE: &str = "engine-token-0123456789";

/// A request for each route of `ROUTES`: its path with parameters filled in, and a body.
fn request(r: &RouteDef) -> (String, Option<Value>) {
    let path = r
        .path
        .replace("{list}", "black")
        .replace("{dimension}", "uid")
        .replace("{value:.*}", "u1")
        .replace("{id}", if r.path.contains("rules") { "r1" } else { "m1" });
    let body = match (r.method, r.path) {
        ("POST", "/v1/check") | ("POST", "/v1/evaluate") => {
            Some(json!({"lists": ["black"], "subjects": {"uid": "u1"}}))
        }
        ("POST", "/v1/features") => Some(json!({"metrics": ["m1"], "fields": {"user": "u"}})),
        ("POST", "/v1/audit") => Some(json!({"limit": 5})),
        ("POST", "/v1/lists/-/lookup") => Some(json!({"dimension": "uid", "value": "u1"})),
        (_, "/v1/lists/{list}/entries") => {
            Some(json!({"entries": [{"dimension": "uid", "value": "u1"}]}))
        }
        ("POST", "/v1/events") => Some(json!({"type": "login", "fields": {"user": "u"}})),
        ("PUT", "/v1/metrics/{id}") => Some(json!({"expr": "COUNT(1h, login) BY user"})),
        ("PUT", "/v1/rules/{id}") => Some(json!({"expr": "m1 > 3"})),
        _ => None,
    };
    (path, body)
}

/// Every route of the table, called with a token holding exactly one permission each: it
/// answers (not 401/403) to the token holding what it needs, and 403 `forbidden` to every
/// other; 401 without a valid token. The presets mean what `auth` says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_needs_its_permission() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = redis_settings(&redis);
    settings.tokens_file = Some(tokens_with_singles(dir.path()));
    let app = spawn_app(settings).await;
    // A metric the read routes can name (PUT before DELETE in the table's order: done first).
    let res = call(
        &app,
        "PUT",
        "/v1/metrics/m1",
        Some(ADMIN),
        Some(json!({"expr": "COUNT(1h, login) BY user"})),
    )
    .await;
    assert_eq!(res.status(), 200);

    let mut checked = 0;
    for r in ROUTES.iter().filter(|r| r.need != Need::Open) {
        let (path, body) = request(r);
        for p in Permission::ALL {
            let res = call(&app, r.method, &path, Some(&single(p)), body.clone()).await;
            let status = res.status().as_u16();
            let allowed = match r.need {
                Need::Token => true,
                Need::Permission(needed) => needed == p,
                Need::Open => unreachable!(),
            };
            if allowed {
                assert!(
                    status != 401 && status != 403,
                    "{} {path} with only {}: {status}",
                    r.method,
                    p.as_str()
                );
            } else {
                assert_eq!(status, 403, "{} {path} with only {}", r.method, p.as_str());
                let body: Value = res.json().await.unwrap();
                assert_eq!(body["error"]["code"], "forbidden");
            }
            checked += 1;
        }
        for token in [None, Some("not-a-valid-token-at-all"), Some("")] {
            let res = call(&app, r.method, &path, token, body.clone()).await;
            assert_eq!(res.status(), 401, "{} {path} with {token:?}", r.method);
            assert_eq!(res.headers()["www-authenticate"], "Bearer");
            let body: Value = res.json().await.unwrap();
            assert_eq!(body["error"]["code"], "unauthorized");
        }
    }
    assert!(checked >= 20 * Permission::ALL.len(), "{checked}");

    // The presets: what each may and may not do.
    for (token, path, method, body, allowed) in [
        (READ, "/v1/audit?limit=1", "GET", None, true),
        (
            READ,
            "/v1/events",
            "POST",
            Some(json!({"type": "login"})),
            false,
        ),
        (
            ENGINE,
            "/v1/events",
            "POST",
            Some(json!({"type": "login"})),
            true,
        ),
        (
            ENGINE,
            "/v1/check",
            "POST",
            Some(json!({"lists": ["black"], "subjects": {}})),
            true,
        ),
        (
            ENGINE,
            "/v1/lists/black/entries",
            "POST",
            Some(json!({"entries": []})),
            false,
        ),
        (ENGINE, "/v1/audit?limit=1", "GET", None, false),
        (ENGINE, "/v1/lists", "GET", None, false),
        (
            WRITE,
            "/v1/rules/r9",
            "PUT",
            Some(json!({"expr": "m1 > 3"})),
            false,
        ),
    ] {
        let status = call(&app, method, path, Some(token), body).await.status();
        assert_eq!(
            status != 403,
            allowed,
            "{method} {path} with {token}: {status}"
        );
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

/// Recording an event is a permission of its own, in `POST /v1/evaluate` too: a token
/// without `events` gets a 403 and nothing is counted; with it, the event is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evaluate_with_an_event_needs_the_events_permission() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = redis_settings(&redis);
    settings.tokens_file = Some(tokens_with_singles(dir.path()));
    let app = spawn_app(settings).await;
    let res = call(
        &app,
        "PUT",
        "/v1/metrics/logins_1h",
        Some(ADMIN),
        Some(json!({"expr": "COUNT(1h, login) BY user"})),
    )
    .await;
    assert_eq!(res.status(), 200);
    let evaluate = |id: &str| {
        json!({"event": {"id": id, "type": "login", "fields": {"user": "u1"}},
               "metrics": ["logins_1h"], "fields": {"user": "u1"}})
    };
    let count = || async {
        let res = call(
            &app,
            "POST",
            "/v1/features",
            Some(READ),
            Some(json!({"metrics": ["logins_1h"], "fields": {"user": "u1"}})),
        )
        .await;
        res.json::<Value>().await.unwrap()["values"]["logins_1h"].clone()
    };
    for (token, id) in [(READ, "e1"), (single(Permission::Check).as_str(), "e2")] {
        let res = call(
            &app,
            "POST",
            "/v1/evaluate",
            Some(token),
            Some(evaluate(id)),
        )
        .await;
        assert_eq!(res.status(), 403, "{token}");
        let body: Value = res.json().await.unwrap();
        assert_eq!(body["error"]["code"], "forbidden");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("events"),
            "{body}"
        );
        assert_eq!(count().await, 0, "nothing counted for {token}");
    }
    let res = call(
        &app,
        "POST",
        "/v1/evaluate",
        Some(ENGINE),
        Some(evaluate("e3")),
    )
    .await;
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.json::<Value>().await.unwrap()["features"]["logins_1h"],
        1
    );
    assert_eq!(count().await, 1);
    // Without an event, `check` is enough.
    let res = call(
        &app,
        "POST",
        "/v1/evaluate",
        Some(&single(Permission::Check)),
        Some(json!({"metrics": ["logins_1h"], "fields": {"user": "u1"}})),
    )
    .await;
    assert_eq!(res.status(), 200);
}

/// README's table of routes and what each needs is `ROUTES`, row for row.
#[test]
fn the_readme_table_of_routes_is_the_route_table() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let start = readme
        .find("<!-- routes:start -->")
        .expect("README marks its table of routes");
    let end = readme.find("<!-- routes:end -->").expect("and its end");
    let rows: Vec<(String, String, String, String)> = readme[start..end]
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<String> = l
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().trim_matches('`').to_owned())
                .collect();
            (
                cells[0].clone(),
                cells[1].clone(),
                cells[2].clone(),
                cells[3].clone(),
            )
        })
        .collect();
    let table: Vec<(String, String, String, String)> = ROUTES
        .iter()
        .map(|r| {
            let need = match r.need {
                Need::Open => "none".to_owned(),
                Need::Token => "any token".to_owned(),
                Need::Permission(p) => p.as_str().to_owned(),
            };
            (
                r.method.to_owned(),
                r.path.replace(":.*}", "}"),
                need,
                r.class.label().to_owned(),
            )
        })
        .collect();
    assert_eq!(rows, table);
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
