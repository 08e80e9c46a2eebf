//! The operator console (`/console`, issue 13) in a real headless Chromium, driven over
//! WebDriver (Debian's `chromium` and `chromium-driver`, which `.ci/test` installs): search,
//! edit (one entry, a CSV with a bad row, a delete), audit, roles, the no-auth banner, text
//! that stays text, both window sizes without horizontal scroll. Screenshots of every page go
//! to `target/console-screenshots/`.

mod common;

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{RedisServer, TestApp, free_port, redis_settings, spawn_app, test_settings};
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};

const READ: &str = "read-token-0123456789";
const WRITE: &str = "write-token-0123456789";
const ADMIN: &str = "admin-token-0123456789";
const PHONE: &str = "13812345678";
const XSS: &str = "<img src=x onerror=alert(1)>";

fn tokens_file(dir: &std::path::Path) -> PathBuf {
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

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| PathBuf::from(d).join(name))
        .find(|p| p.is_file())
}

/// `chromedriver` on a free port, and a headless Chromium session through it.
struct Browser {
    client: Client,
    driver: Child,
}

impl Drop for Browser {
    /// Kills `chromedriver`'s whole process group: killing it alone left every Chromium it
    /// started running (3 browsers and their helpers a run of this file: 108 processes on
    /// the machine after three runs).
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.driver.id())])
            .status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Browser {
    async fn start() -> Self {
        let driver_bin = which("chromedriver").expect(
            "chromedriver not found: `apt-get install -y chromium chromium-driver` (.ci/test does)",
        );
        let chromium = ["chromium", "chromium-browser", "google-chrome"]
            .iter()
            .find_map(|b| which(b))
            .expect("chromium not found: `apt-get install -y chromium` (.ci/test does)");
        let port = free_port();
        // A process group of its own, which the browsers it starts join: see `Drop`.
        let driver = Command::new(driver_bin)
            .process_group(0)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting chromedriver");
        let url = format!("http://127.0.0.1:{port}");
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,800"],
            }),
        );
        let started = Instant::now();
        let client = loop {
            match ClientBuilder::new(HttpConnector::new())
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(c) => break c,
                Err(e) if started.elapsed() < Duration::from_secs(20) => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("no WebDriver session: {e}"),
            }
        };
        Browser { client, driver }
    }

    async fn open(&self, app: &TestApp, page: &str) {
        self.client
            .goto(&app.url(&format!("/console#{page}")))
            .await
            .unwrap();
        // A new fragment alone would not load the page again.
        self.client.refresh().await.unwrap();
    }

    /// Types the token into the sign-in form.
    async fn sign_in(&self, app: &TestApp, token: &str) {
        self.open(app, "search").await;
        self.visible("token").await.send_keys(token).await.unwrap();
        self.click("login-btn").await;
        self.wait_for("signed in", "return !document.getElementById('app').hidden")
            .await;
    }

    async fn visible(&self, id: &str) -> fantoccini::elements::Element {
        let started = Instant::now();
        loop {
            if let Ok(e) = self.client.find(Locator::Id(id)).await
                && e.is_displayed().await.unwrap_or(false)
            {
                return e;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "#{id} never became visible"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn click(&self, id: &str) {
        self.visible(id).await.click().await.unwrap();
    }

    async fn fill(&self, id: &str, text: &str) {
        let e = self.visible(id).await;
        e.clear().await.unwrap();
        e.send_keys(text).await.unwrap();
    }

    async fn select(&self, id: &str, value: &str) {
        let e = self.visible(id).await;
        e.select_by_value(value).await.unwrap();
    }

    async fn js(&self, script: &str) -> Value {
        self.client.execute(script, vec![]).await.unwrap()
    }

    /// Waits until `script` returns true.
    async fn wait_for(&self, what: &str, script: &str) {
        let started = Instant::now();
        while self.js(script).await != Value::Bool(true) {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "waited 10 s for {what}; status: {}",
                self.text("status").await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn text(&self, id: &str) -> String {
        match self.client.find(Locator::Id(id)).await {
            Ok(e) => e.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// At 1280×800 and 390×844: no horizontal scroll, and a screenshot of each.
    async fn check_layouts(&self, page: &str) {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        for (w, h) in [(1280u32, 800u32), (390, 844)] {
            self.client.set_window_size(w, h).await.unwrap();
            tokio::time::sleep(Duration::from_millis(150)).await;
            let overflow = self
                .js("const d = document.documentElement; return [d.scrollWidth, d.clientWidth];")
                .await;
            let (scroll, client) = (overflow[0].as_u64().unwrap(), overflow[1].as_u64().unwrap());
            assert!(
                scroll <= client,
                "{page} at {w}x{h} scrolls sideways: {scroll} > {client}"
            );
            let png = self.client.screenshot().await.unwrap();
            std::fs::write(dir.join(format!("{page}-{w}x{h}.png")), png).unwrap();
        }
        self.client.set_window_size(1280, 800).await.unwrap();
    }

    /// Every URL the page fetched.
    async fn fetched(&self) -> Vec<String> {
        self.js("return performance.getEntriesByType('resource').map(e => e.name);")
            .await
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    }
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
        // tools/tests/audit.rs): read into /metrics, drawn by the Health page.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_searches_edits_and_reads_the_audit_trail() {
    let redis = RedisServer::start();
    let (app, _dir) = app_with_tokens(Some(&redis)).await;
    let (status, body) = api(
        &app,
        "POST",
        "/v1/lists/black/entries",
        Some(json!({"entries": [
            {"dimension": "phone", "value": PHONE, "reason": XSS, "ttl_seconds": 86400}
        ]})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let b = Browser::start().await;
    b.sign_in(&app, WRITE).await;
    assert!(
        !displayed(&b, "banner-noauth").await,
        "tokens are configured: no banner"
    );
    assert!(b.text("who").await.contains("list-loader (write)"));

    // 1. Search: typed with spaces and dashes, the dimension guessed.
    b.fill("search-q", "138 1234-5678").await;
    b.click("search-btn").await;
    b.wait_for(
        "the hit",
        "return document.querySelectorAll('#search-hits tbody tr td').length >= 4 && document.querySelector('#search-audit tbody tr') !== null",
    )
    .await;
    let hits = b.text("search-hits").await;
    assert!(hits.contains("black") && hits.contains("phone"), "{hits}");
    assert!(b.text("search-guess").await.contains("phone"));
    let trail = b.text("search-audit").await;
    assert!(
        trail.contains("anonymous") || trail.contains("platform-admin"),
        "{trail}"
    );
    assert!(trail.contains(XSS), "the reason is shown as text: {trail}");
    assert!(!trail.contains(PHONE), "no raw value in the trail: {trail}");
    // The XSS reason stayed text: no image element, no alert.
    assert_eq!(
        b.js("return document.querySelectorAll('img').length;")
            .await,
        0
    );
    assert!(b.client.get_alert_text().await.is_err(), "no alert opened");
    // The only request URLs holding the identifier: the lookup path typed.
    for url in b.fetched().await {
        let raw =
            url.contains(PHONE) || url.contains("138%201234-5678") || url.contains("1234-5678");
        assert!(
            !raw || url.contains("/v1/lists/-/lookup/"),
            "an identifier in a request URL: {url}"
        );
    }
    b.check_layouts("search").await;

    // 2. Edit: one entry through the form, then listed through the API.
    b.open(&app, "edit").await;
    b.fill("add-list", "grey").await;
    b.select("add-dim", "device").await;
    b.fill("add-value", "dev-from-form").await;
    b.fill("add-days", "30").await;
    b.fill("add-reason", "ring 2026-11").await;
    b.click("add-btn").await;
    b.wait_for(
        "the write",
        "return document.getElementById('status').textContent.startsWith('Written')",
    )
    .await;
    assert!(listed(&app, "grey", "device", "dev-from-form").await);

    // A CSV with a bad row: the row's error shown, nothing written.
    b.fill("csv-list", "grey").await;
    b.fill(
        "csv-text",
        "dimension,value,sandbox,reason\ndevice,csv-good-1,default,ok\nphone,12,default,too short\ndevice,csv-good-2,default,ok\n",
    )
    .await;
    b.click("csv-write-btn").await;
    b.wait_for(
        "the row errors",
        "return document.querySelectorAll('#csv-errors li').length > 0",
    )
    .await;
    let errors = b.text("csv-errors").await;
    assert!(
        errors.contains("row 2") && errors.contains("phone"),
        "{errors}"
    );
    assert!(
        !listed(&app, "grey", "device", "csv-good-1").await,
        "nothing written"
    );
    assert!(
        !listed(&app, "grey", "device", "csv-good-2").await,
        "nothing written"
    );
    // Fixed, the same rows are written.
    b.fill(
        "csv-text",
        "dimension,value,sandbox,reason\ndevice,csv-good-1,default,ok\nphone,13900000000,default,fixed\ndevice,csv-good-2,default,ok\n",
    )
    .await;
    b.click("csv-write-btn").await;
    b.wait_for(
        "the rows",
        "return document.getElementById('status').textContent.startsWith('Written: 3')",
    )
    .await;
    assert!(listed(&app, "grey", "device", "csv-good-2").await);

    // A delete.
    b.fill("del-list", "grey").await;
    b.select("del-dim", "device").await;
    b.fill("del-value", "dev-from-form").await;
    b.click("del-btn").await;
    b.wait_for(
        "the delete",
        "return document.getElementById('status').textContent.startsWith('Removed')",
    )
    .await;
    assert!(!listed(&app, "grey", "device", "dev-from-form").await);
    b.check_layouts("edit").await;

    // 3. Audit: the token's name and the masked value, never the raw one.
    b.open(&app, "audit").await;
    b.select("audit-op", "delete").await;
    b.click("audit-btn").await;
    b.wait_for("the records", "return document.querySelector('#audit-rows tbody tr td') !== null && document.querySelector('#audit-rows tbody tr td').textContent !== 'No records'").await;
    let rows = b.text("audit-rows").await;
    assert!(
        rows.contains("list-loader") && rows.contains("delete"),
        "{rows}"
    );
    b.select("audit-op", "").await;
    b.select("audit-dim", "phone").await;
    b.fill("audit-value", PHONE).await;
    b.click("audit-btn").await;
    b.wait_for(
        "the phone's records",
        "return document.getElementById('audit-rows').textContent.includes('****')",
    )
    .await;
    let rows = b.text("audit-rows").await;
    assert!(!rows.contains(PHONE), "{rows}");
    assert!(rows.contains(XSS), "{rows}");
    for url in b.fetched().await {
        assert!(
            !url.contains(PHONE) || url.contains("/v1/lists/-/lookup/"),
            "{url}"
        );
    }
    b.check_layouts("audit").await;

    // 4. Health, 5. definitions (a write token sees no definition controls).
    b.open(&app, "health").await;
    b.wait_for(
        "the figures",
        "return document.querySelectorAll('#health-stats dt').length > 0",
    )
    .await;
    assert!(
        b.text("health-stats")
            .await
            .contains("invalidation subscription")
    );
    b.check_layouts("health").await;
    b.open(&app, "definitions").await;
    b.visible("metrics-rows").await;
    assert!(
        !displayed(&b, "metric-save").await,
        "a write token defines nothing"
    );
    assert!(!displayed(&b, "rule-save").await);
    b.check_layouts("definitions").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_decide_the_controls_and_parse_errors_point_at_their_column() {
    let (app, _dir) = app_with_tokens(None).await;
    let b = Browser::start().await;
    b.sign_in(&app, READ).await;
    assert!(b.text("who").await.contains("risk-engine (read)"));
    for id in [
        "add-btn",
        "csv-write-btn",
        "del-btn",
        "metric-save",
        "rule-save",
    ] {
        assert!(!displayed(&b, id).await, "a read token sees no {id}");
    }
    let edit_link = b
        .client
        .find(Locator::Css("#nav a[data-page=edit]"))
        .await
        .unwrap();
    assert!(
        !edit_link.is_displayed().await.unwrap(),
        "no Edit page in the nav"
    );
    b.open(&app, "edit").await;
    assert!(
        !displayed(&b, "page-edit").await,
        "#edit falls back to search"
    );

    // An admin defines; a bad expression's error points at its column.
    b.client
        .execute("sessionStorage.clear();", vec![])
        .await
        .unwrap();
    b.sign_in(&app, ADMIN).await;
    b.open(&app, "definitions").await;
    b.fill("metric-id", "dev_tx_7d").await;
    b.fill("metric-expr", "COUNT(7d, transaction) BY").await;
    b.click("metric-save").await;
    b.wait_for(
        "the error",
        "return !document.getElementById('def-error').hidden",
    )
    .await;
    let err = b.text("def-error").await;
    assert!(
        err.contains("invalid_expr") && err.contains("column") && err.contains('^'),
        "{err}"
    );
    b.fill("metric-expr", "COUNT(7d, transaction) BY device_id")
        .await;
    b.click("metric-save").await;
    b.wait_for(
        "the metric",
        "return document.getElementById('metrics-rows').textContent.includes('dev_tx_7d')",
    )
    .await;
    // Edit: the row fills the form; a changed window is a new version.
    b.fill("metric-id", "").await;
    b.fill("metric-expr", "").await;
    let edit = b
        .client
        .find(Locator::XPath(
            "//table[@id='metrics-rows']//button[text()='Edit']",
        ))
        .await
        .unwrap();
    edit.click().await.unwrap();
    assert_eq!(
        b.js("return document.getElementById('metric-expr').value;")
            .await,
        "COUNT(7d, transaction) BY device_id"
    );
    b.fill("metric-expr", "COUNT(1d, transaction) BY device_id")
        .await;
    b.click("metric-save").await;
    b.wait_for(
        "version 2",
        "return document.getElementById('metrics-rows').textContent.includes('COUNT(1d')",
    )
    .await;
    let (_, def) = api(&app, "GET", "/v1/metrics/dev_tx_7d", None).await;
    assert_eq!(def["version"], 2, "{def}");
    b.fill("try-metrics", "dev_tx_7d").await;
    b.click("try-features").await;
    b.wait_for(
        "features",
        "return document.getElementById('try-out').textContent.includes('dev_tx_7d')",
    )
    .await;
    b.check_layouts("definitions-admin").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tokens_the_console_says_so() {
    let app = spawn_app(test_settings()).await;
    let b = Browser::start().await;
    b.open(&app, "search").await;
    b.wait_for("the app", "return !document.getElementById('app').hidden")
        .await;
    assert!(displayed(&b, "banner-noauth").await);
    assert!(b.text("banner-noauth").await.contains("No authentication"));
    assert!(
        displayed(&b, "add-btn").await || {
            b.open(&app, "edit").await;
            displayed(&b, "add-btn").await
        }
    );
    b.check_layouts("no-auth").await;

    // The API reference renders under its policy, from the binary alone.
    b.client.goto(&app.url("/docs/")).await.unwrap();
    b.wait_for(
        "Swagger UI's operations",
        "return document.querySelectorAll('.opblock').length >= 20",
    )
    .await;
    b.check_layouts("docs").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_is_served_with_a_strict_policy() {
    let app = spawn_app(test_settings()).await;
    for (path, kind) in [
        ("/console", "text/html"),
        ("/console/app.js", "text/javascript"),
        ("/console/app.css", "text/css"),
    ] {
        let res = app.get(path).await;
        assert_eq!(res.status(), 200, "{path}");
        let h = res.headers();
        assert!(
            h["content-type"].to_str().unwrap().starts_with(kind),
            "{path}"
        );
        assert_eq!(
            h["content-security-policy"],
            namelist::routes::console::CONSOLE_CSP,
            "{path}"
        );
        assert_eq!(h["x-content-type-options"], "nosniff");
        let body = res.text().await.unwrap();
        if kind == "text/html" {
            // No inline script, style or handler: the policy would block them anyway.
            assert!(!body.contains("<script>"), "an inline script");
            assert!(!body.contains("<style"), "an inline style sheet");
            assert!(!body.contains(" style="), "an inline style");
            assert!(
                !body
                    .split([' ', '\n', '<'])
                    .any(|w| w.starts_with("on") && w.contains('=')),
                "an inline handler attribute"
            );
        }
        if kind == "text/javascript" {
            assert!(!body.contains("innerHTML"), "values are rendered as text");
            assert!(!body.contains("eval("));
        }
    }
    let csp = namelist::routes::console::CONSOLE_CSP;
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe"),
        "{csp}"
    );
}
