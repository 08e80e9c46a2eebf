//! The operator console (`/console`, issues 13 and 30) in a real headless Chromium, driven
//! over WebDriver (Debian's `chromium` and `chromium-driver`, which `.ci/test` installs):
//! search (a segment's reason, a `#search?…` link run on open), the lists page after writes,
//! edit (the dimension guessed, a new list noted, CSV files with a row the browser refuses and
//! one only the service refuses, named by their line in the file, a delete asked and undone),
//! audit (local times in the browser's zone, run with `TZ=Asia/Shanghai`; no word broken;
//! the reason filter; the export downloaded with masked values only), health (the verdict
//! first; Redis and the embedded store), roles, the no-auth banner, text that stays text, no
//! browser-console error on any page after sign-in, both window sizes without horizontal
//! scroll. Screenshots of every page go to `target/console-screenshots/`.
//!
//! A test binary of its own (`console`): `browser` drives Chromium; the tests are in
//! `operator` (an operator's search, lists, edit, audit and health), `roles` (what each role
//! is offered) and `policy` (no tokens, and the console's strict policy). This file holds the
//! tokens, the app and the API calls they share.

#[path = "../common/mod.rs"]
mod common;

mod browser;
mod operator;
mod policy;
mod roles;

use std::path::PathBuf;

use common::{RedisServer, TestApp, redis_settings, spawn_app, test_settings};
use fantoccini::Locator;
use serde_json::{Value, json};

use browser::Browser;

const READ: &str = "read-token-0123456789";
const WRITE: &str = "write-token-0123456789";
const ADMIN: &str = "admin-token-0123456789";
const ENGINE: &str = "engine-token-0123456789";
const PHONE: &str = "13812345678";
const XSS: &str = "<img src=x onerror=alert(1)>";

fn tokens_file(dir: &std::path::Path) -> PathBuf {
    let path = dir.join("tokens.toml");
    std::fs::write(
        &path,
        format!(
            "[[tokens]]\nname = \"risk-engine\"\nrole = \"read\"\ntoken = \"{READ}\"\n\n\
             [[tokens]]\nname = \"list-loader\"\nrole = \"write\"\ntoken = \"{WRITE}\"\n\n\
             [[tokens]]\nname = \"platform-admin\"\nrole = \"admin\"\ntoken = \"{ADMIN}\"\n\n\
             [[tokens]]\nname = \"risk-engine-2\"\nrole = \"engine\"\ntoken = \"{ENGINE}\"\n"
        ),
    )
    .unwrap();
    path
}

async fn app_with_tokens(redis: Option<&RedisServer>) -> (TestApp, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = match redis {
        Some(r) => redis_settings(r),
        None => test_settings(),
    };
    settings.tokens_file = Some(tokens_file(dir.path()));
    settings.audit_refresh_secs = 1;
    if let Some(r) = redis {
        // What `namelist-tools audit` leaves for every instance (its own test:
        // tools/tests/integration/audit.rs): read into /metrics, drawn by the Health page.
        let mut conn = r.conn();
        let _: () = redis::cmd("HSET")
            .arg(format!("{}audit:last", settings.key_prefix))
            .arg(&[
                ("at_ms", "1795000000123"),
                ("sampled", "0"),
                ("buckets", "5000"),
                ("entries", "1000000"),
                ("bytes_per_entry", "17.612"),
                ("listpack_limit", "512"),
                ("near_limit", "2"),
                ("over_limit", "0"),
                ("hashtable", "0"),
                ("expired", "12"),
                (
                    "fill_histogram",
                    "150-170:40,170-190:900,190-210:2100,210-230:1800,230-250:160",
                ),
            ])
            .query(&mut conn)
            .unwrap();
    }
    (spawn_app(settings).await, dir)
}

async fn api(app: &TestApp, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = app
        .client
        .request(method.parse().unwrap(), app.url(path))
        .bearer_auth(ADMIN);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let res = req.send().await.unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

async fn listed(app: &TestApp, list: &str, dimension: &str, value: &str) -> bool {
    let (status, body) = api(
        app,
        "GET",
        &format!("/v1/lists/{list}/entries/{dimension}/{value}"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["listed"] == true
}

async fn displayed(b: &Browser, id: &str) -> bool {
    match b.client.find(Locator::Id(id)).await {
        Ok(e) => e.is_displayed().await.unwrap_or(false),
        Err(_) => false,
    }
}

/// The entry's newest audit record, read through the API.
async fn last_record(app: &TestApp, list: &str, dimension: &str, value: &str) -> Value {
    let (status, body) = api(
        app,
        "POST",
        "/v1/audit",
        Some(json!({"list": list, "dimension": dimension, "value": value, "limit": 1})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["records"][0].clone()
}
