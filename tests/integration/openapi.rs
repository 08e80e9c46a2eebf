//! The API's description (issue 13): `GET /openapi.json` lists exactly the routes the router
//! mounts (`routes::ROUTES`, the one table `configure` mounts from), each answering on its
//! method and no other; its `ErrorCode` schema holds every error code; `/docs/` serves Swagger
//! UI from the binary. (CI validates the document with `openapi-spec-validator`: `.ci/test`.)

use crate::common;

use std::collections::BTreeSet;

use common::{spawn_app, test_settings};
use namelist::domain::ErrorCode;
use namelist::routes::{Need, ROUTES, StoreUse};
use serde_json::Value;

const METHODS: [&str; 5] = ["GET", "POST", "PUT", "DELETE", "PATCH"];

/// A route's path as OpenAPI writes it: `{value:.*}` is `{value}`.
fn documented_form(path: &str) -> String {
    path.replace(":.*}", "}")
}

/// A path to request for a route: every parameter given a harmless value.
fn concrete(path: &str) -> String {
    documented_form(path)
        .replace("{list}", "black")
        .replace("{dimension}", "uid")
        .replace("{value}", "u1")
        .replace("{id}", "m1")
}

async fn document() -> Value {
    let app = spawn_app(test_settings()).await;
    let res = app.get("/openapi.json").await;
    assert_eq!(res.status(), 200);
    res.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_lists_exactly_the_routed_routes() {
    let doc = document().await;
    assert_eq!(doc["openapi"], "3.1.0");
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            documented.insert((method.to_uppercase(), path.clone()));
            // Every operation says who may call it, its responses and their bodies.
            assert!(
                op["responses"]["200"].is_object(),
                "{method} {path}: no 200"
            );
            let secured = op["security"].is_array();
            assert_eq!(
                secured,
                path.starts_with("/v1/"),
                "{method} {path}: /v1 routes need the bearer scheme, the others none"
            );
            if secured {
                for status in ["401", "403", "429", "503"] {
                    assert!(
                        op["responses"][status]["content"]["application/json"]["schema"]["$ref"]
                            == "#/components/schemas/ErrorBody",
                        "{method} {path}: {status} is not an ErrorBody"
                    );
                }
                let route = ROUTES
                    .iter()
                    .find(|r| r.method == method.to_uppercase() && documented_form(r.path) == *path)
                    .expect("a route of the table");
                let needs = format!(
                    "Needs: {}. Budget: {}.",
                    route.need.describe(),
                    route.class.label()
                );
                assert!(
                    op["description"].as_str().unwrap().starts_with(&needs),
                    "{method} {path}: {needs}"
                );
                // The 503 says what the route can meet: the store's codes only where it
                // reads or writes, `replicas_unavailable` only where it writes.
                let unavailable = op["responses"]["503"]["description"].as_str().unwrap();
                let says = |code: &str| unavailable.contains(&format!("`{code}`"));
                assert!(says("overloaded"), "{method} {path}: {unavailable}");
                assert_eq!(
                    says("store_unavailable"),
                    route.store != StoreUse::None,
                    "{method} {path}: {unavailable}"
                );
                assert_eq!(
                    says("replicas_unavailable"),
                    route.store == StoreUse::Writes,
                    "{method} {path}: {unavailable}"
                );
            }
        }
    }
    let routed: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|r| (r.method.to_owned(), documented_form(r.path)))
        .collect();
    assert_eq!(
        documented.difference(&routed).collect::<Vec<_>>(),
        Vec::<&(String, String)>::new(),
        "documented but not routed"
    );
    assert_eq!(
        routed.difference(&documented).collect::<Vec<_>>(),
        Vec::<&(String, String)>::new(),
        "routed but not documented"
    );
    assert!(doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer");
}

/// `ROUTES` is what the router really mounts: every route answers on its method (whatever
/// the answer, never the router's 404 or 405), and every other method on its path is a 405.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_in_the_table_is_mounted_on_its_methods_only() {
    let app = spawn_app(test_settings()).await;
    let paths: BTreeSet<&str> = ROUTES.iter().map(|r| r.path).collect();
    for path in paths {
        let url = app.url(&concrete(path));
        for method in METHODS {
            let res = app
                .client
                .request(method.parse().unwrap(), &url)
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await
                .unwrap();
            let status = res.status().as_u16();
            let code = res
                .json::<Value>()
                .await
                .ok()
                .and_then(|b| b["error"]["code"].as_str().map(str::to_owned));
            let mounted = ROUTES.iter().any(|r| r.path == path && r.method == method);
            if mounted {
                assert!(
                    code.as_deref() != Some("not_found") && status != 405,
                    "{method} {path}: {status} {code:?}"
                );
            } else {
                assert_eq!(status, 405, "{method} {path}: not in ROUTES, so 405");
            }
        }
    }
    // Open routes are exactly the probes and the scraper.
    let open: BTreeSet<&str> = ROUTES
        .iter()
        .filter(|r| r.need == Need::Open)
        .map(|r| r.path)
        .collect();
    assert_eq!(open, BTreeSet::from(["/healthz", "/metrics", "/readyz"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_code_is_in_the_document() {
    let doc = document().await;
    let listed: BTreeSet<&str> = doc["components"]["schemas"]["ErrorCode"]["enum"]
        .as_array()
        .expect("ErrorCode is a string enum")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let ours: BTreeSet<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    // README's table and ErrorCode agree (tests/integration/error_codes.rs), so this is README's too.
    assert_eq!(listed, ours);
    // And every status a code is answered with appears on some operation.
    let mut statuses = BTreeSet::new();
    for item in doc["paths"].as_object().unwrap().values() {
        for op in item.as_object().unwrap().values() {
            for s in op["responses"].as_object().unwrap().keys() {
                statuses.insert(s.parse::<u16>().unwrap());
            }
        }
    }
    for code in ErrorCode::ALL {
        for s in code.statuses() {
            if [404, 405, 500].contains(s)
                && !matches!(code, ErrorCode::UnknownMetric | ErrorCode::UnknownRule)
            {
                continue; // any route: no such path, wrong method, a bug
            }
            assert!(
                statuses.contains(s),
                "{}: status {s} on no operation",
                code.as_str()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docs_are_served_from_the_binary() {
    let app = spawn_app(test_settings()).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let res = client.get(app.url("/docs")).send().await.unwrap();
    assert_eq!(res.status(), 301);
    assert_eq!(res.headers()["location"], "/docs/");
    let res = client.get(app.url("/docs/")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    let csp = res.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("script-src 'self' 'unsafe"),
        "{csp}"
    );
    let html = res.text().await.unwrap();
    assert!(html.contains("swagger-ui"), "{html}");
    assert!(!html.contains("<script>"), "no inline script: {html}");
    // Every asset the page names comes from the binary, none from the internet.
    let assets: Vec<&str> = html
        .split(['"', '\''])
        .filter(|s| s.ends_with(".js") || s.ends_with(".css"))
        .collect();
    assert!(assets.len() >= 3, "{assets:?}");
    for a in assets {
        assert!(!a.contains("//"), "an external asset: {a}");
        let url = app.url(&format!("/docs/{}", a.trim_start_matches("./")));
        let res = client.get(&url).send().await.unwrap();
        assert_eq!(res.status(), 200, "{url}");
    }
    let init = client
        .get(app.url("/docs/swagger-initializer.js"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(init.contains("/openapi.json"), "{init}");
}

/// `namelist openapi | head`: a reader that closes the pipe early is not an error. The
/// document (~100 KB) is larger than a pipe's buffer, so the write meets the closed pipe.
#[test]
fn printing_the_document_to_a_reader_that_stops_early_is_not_an_error() {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let mut child = Command::new(common::service_bin())
        .arg("openapi")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    assert_eq!(&first[..1], b"{");
    // The read end is dropped here, before the rest is written.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
}
