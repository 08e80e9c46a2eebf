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
    /// Where the browser saves downloads.
    downloads: tempfile::TempDir,
}

/// Chromedriver's log of the browser console (`POST /session/{id}/se/log`): what the page
/// logged and every failed load (a 401, a favicon's 404), read once (reading empties it).
#[derive(Debug)]
struct BrowserLog;

impl fantoccini::wd::WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(
        &self,
        base_url: &reqwest::Url,
        session_id: Option<&str>,
    ) -> Result<reqwest::Url, <reqwest::Url as std::str::FromStr>::Err> {
        base_url.join(&format!(
            "session/{}/se/log",
            session_id.unwrap_or_default()
        ))
    }

    fn method_and_body(&self, _: &reqwest::Url) -> (reqwest::Method, Option<String>) {
        (
            reqwest::Method::POST,
            Some(r#"{"type":"browser"}"#.to_owned()),
        )
    }
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
        Self::start_in(None).await
    }

    /// A browser whose clock reads `tz` (`TZ` of chromedriver, which Chromium inherits).
    async fn start_in(tz: Option<&str>) -> Self {
        let driver_bin = which("chromedriver").expect(
            "chromedriver not found: `apt-get install -y chromium chromium-driver` (.ci/test does)",
        );
        let chromium = ["chromium", "chromium-browser", "google-chrome"]
            .iter()
            .find_map(|b| which(b))
            .expect("chromium not found: `apt-get install -y chromium` (.ci/test does)");
        let port = free_port();
        let downloads = tempfile::tempdir().unwrap();
        // A process group of its own, which the browsers it starts join: see `Drop`.
        let mut driver = Command::new(driver_bin);
        driver
            .process_group(0)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(tz) = tz {
            driver.env("TZ", tz);
        }
        let driver = driver.spawn().expect("starting chromedriver");
        let url = format!("http://127.0.0.1:{port}");
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,800"],
                "prefs": {
                    "download.default_directory": downloads.path(),
                    "download.prompt_for_download": false,
                },
            }),
        );
        caps.insert("goog:loggingPrefs".into(), json!({"browser": "ALL"}));
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
        Browser {
            client,
            driver,
            downloads,
        }
    }

    /// The browser console's entries since the last call, as `LEVEL message`.
    async fn console(&self) -> Vec<String> {
        let log = self.client.issue_cmd(BrowserLog).await.unwrap();
        log.as_array()
            .map(|entries| {
                entries
                    .iter()
                    .map(|e| format!("{} {}", e["level"].as_str().unwrap_or("?"), e["message"]))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The browser console's errors since the last call (`SEVERE`: a script error, a failed
    /// load).
    async fn console_errors(&self) -> Vec<String> {
        self.console()
            .await
            .into_iter()
            .filter(|e| e.starts_with("SEVERE"))
            .collect()
    }

    /// The one file downloaded, once it is complete (Chromium writes it first under a
    /// temporary name: `.org.chromium.Chromium.*`, `*.crdownload`).
    async fn downloaded(&self) -> (String, String) {
        let started = Instant::now();
        loop {
            let files: Vec<String> = std::fs::read_dir(self.downloads.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|name| !name.starts_with('.') && !name.ends_with(".crdownload"))
                .collect();
            if let [name] = files.as_slice()
                && let Ok(text) = std::fs::read_to_string(self.downloads.path().join(name))
            {
                return (name.clone(), text);
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "no download: {files:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
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
        let field = self.visible("token").await;
        // The first load says nothing was refused: nothing was typed yet.
        assert_eq!(self.text("status").await, "", "an error before sign-in");
        field.send_keys(token).await.unwrap();
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

    /// The element's `textContent` (what it holds, however it wraps on screen).
    async fn content(&self, id: &str) -> String {
        self.js(&format!(
            "return document.getElementById('{id}').textContent;"
        ))
        .await
        .as_str()
        .unwrap_or_default()
        .to_owned()
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

/// `ms` as the console shows it in Asia/Shanghai (UTC+8 all year): `2026-11-27 16:20:41 UTC+8`.
fn shanghai(ms: i64) -> String {
    let secs = ms.div_euclid(1000) + 8 * 3600;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC+8",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[test]
fn shanghai_time_is_utc_plus_8() {
    assert_eq!(shanghai(0), "1970-01-01 08:00:00 UTC+8");
    assert_eq!(shanghai(1_795_000_000_123), "2026-11-18 19:06:40 UTC+8");
    assert_eq!(shanghai(951_782_400_000 - 1), "2000-02-29 07:59:59 UTC+8");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_searches_edits_and_reads_the_audit_trail() {
    let redis = RedisServer::start();
    let (app, _dir) = app_with_tokens(Some(&redis)).await;
    let (status, body) = api(
        &app,
        "POST",
        "/v1/lists/black/entries",
        Some(json!({"entries": [
            {"dimension": "phone", "value": PHONE, "reason": XSS, "ttl_seconds": 86400},
            {"dimension": "phone", "value": "170*", "reason": "ring 170: virtual operator SIMs"}
        ]})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // One check the risk engine makes: the lists page counts its hit.
    let (status, body) = api(
        &app,
        "POST",
        "/v1/check",
        Some(json!({"lists": ["black"], "subjects": {"phone": PHONE}})),
    )
    .await;
    assert_eq!(
        body["hits"].as_array().map(Vec::len),
        Some(1),
        "{status} {body}"
    );
    // The browser's clock is in Shanghai, this machine's (and the service's) maybe not.
    let b = Browser::start_in(Some("Asia/Shanghai")).await;
    b.sign_in(&app, WRITE).await;
    assert!(
        !displayed(&b, "banner-noauth").await,
        "tokens are configured: no banner"
    );
    assert!(b.text("who").await.contains("list-loader (write)"));
    assert!(
        b.text("zone").await.contains("Asia/Shanghai"),
        "{}",
        b.text("zone").await
    );

    // 1. Search: typed with spaces and dashes, the dimension guessed.
    b.fill("search-q", "138 1234-5678").await;
    b.click("search-btn").await;
    b.wait_for(
        "the hit",
        "return document.querySelectorAll('#search-hits tbody tr td').length >= 5 && document.querySelector('#search-audit tbody tr') !== null",
    )
    .await;
    let hits = b.text("search-hits").await;
    assert!(hits.contains("black") && hits.contains("phone"), "{hits}");
    assert!(hits.contains(XSS), "why it is listed, as text: {hits}");
    assert!(b.text("search-guess").await.contains("phone"));
    let trail = b.text("search-audit").await;
    assert!(trail.contains("platform-admin"), "{trail}");
    assert!(trail.contains(XSS), "the reason is shown as text: {trail}");
    assert!(!trail.contains(PHONE), "no raw value in the trail: {trail}");
    // Local time in the browser's zone, with the zone.
    let at = last_record(&app, "black", "phone", PHONE).await["at"]
        .as_i64()
        .unwrap();
    let held = b.content("search-audit").await;
    assert!(
        held.contains(&shanghai(at)),
        "{} in Shanghai: {held}",
        shanghai(at)
    );
    assert!(!trail.contains('Z'), "no UTC times: {trail}");
    // The XSS reason stayed text: no image element, no alert.
    assert_eq!(
        b.js("return document.querySelectorAll('img').length;")
            .await,
        0
    );
    assert!(b.client.get_alert_text().await.is_err(), "no alert opened");
    b.check_layouts("search").await;

    // A link to an identity (a ticket's, an alert's) opens with the search run: a segment's
    // hit says why, from the segment's own audit record.
    b.open(&app, "search?value=17012345678&sandbox=default")
        .await;
    b.wait_for(
        "the segment's hit",
        "return document.getElementById('search-hits').textContent.includes('segment')",
    )
    .await;
    let hits = b.text("search-hits").await;
    assert!(
        hits.contains("ring 170: virtual operator SIMs") && hits.contains("platform-admin"),
        "the segment's reason and who: {hits}"
    );
    assert_eq!(
        b.js("return document.getElementById('search-q').value;")
            .await,
        "17012345678"
    );
    // No request URL holds an identifier (lookups and audit filters go in POST bodies); the
    // fragment never leaves the browser.
    let fetched = b.fetched().await;
    assert!(
        fetched.iter().any(|u| u.ends_with("/v1/lists/-/lookup")),
        "the searches were looked up: {fetched:?}"
    );
    for url in fetched {
        let raw = ["13812345678", "138%201234-5678", "1234-5678", "17012345678"]
            .iter()
            .any(|v| url.contains(v));
        assert!(!raw, "an identifier in a request URL: {url}");
    }

    // 2. Lists: sizes, the engine's hit, the last change in local time; a list's changes and
    // what it holds, masked.
    b.open(&app, "lists").await;
    b.wait_for(
        "the lists",
        "return document.getElementById('lists-rows').textContent.includes('black')",
    )
    .await;
    let row = b
        .js("return [...document.querySelectorAll('#lists-rows tbody tr')].map(r => [...r.cells].map(c => c.textContent)).find(c => c[0] === 'black');")
        .await;
    assert_eq!(row[1], "default", "{row}");
    assert_eq!(row[2], "≈ 2", "{row}");
    assert_eq!(row[3], "1", "the check's hit: {row}");
    let last_change = row[4].as_str().unwrap();
    assert!(
        last_change.contains("UTC+8") && last_change.contains("ago"),
        "{row}"
    );
    let open = b
        .client
        .find(Locator::XPath(
            "//table[@id='lists-rows']//tr[td[1]='black']//button",
        ))
        .await
        .unwrap();
    open.click().await.unwrap();
    b.wait_for(
        "what black holds",
        "return document.querySelectorAll('#list-holds tbody tr').length === 2",
    )
    .await;
    let holds = b.text("list-holds").await;
    assert!(
        holds.contains("138****5678") || holds.contains("****"),
        "{holds}"
    );
    assert!(holds.contains("ring 170"), "{holds}");
    assert!(!holds.contains(PHONE), "masked only: {holds}");
    assert!(b.text("list-changes").await.contains("upsert"));
    assert!(
        b.js("return location.hash;")
            .await
            .as_str()
            .unwrap()
            .contains("list=black"),
        "the open list is in the address"
    );
    b.check_layouts("lists").await;

    // 3. Edit: the dimension guessed and said; a mistyped list is a new one, and says so.
    b.open(&app, "edit").await;
    b.fill("add-list", "blakc").await;
    b.fill("add-value", "13912345678").await;
    b.wait_for(
        "the notes",
        "return document.getElementById('add-note').textContent.includes('New list')",
    )
    .await;
    let note = b.text("add-note").await;
    assert!(note.contains("Read as phone"), "{note}");
    b.fill("add-list", "grey").await;
    b.fill("add-ttl", "30d").await;
    b.fill("add-reason", "ring 2026-11").await;
    b.click("add-btn").await;
    b.wait_for(
        "the write",
        "return document.getElementById('status').textContent.startsWith('Written')",
    )
    .await;
    assert!(b.text("status").await.contains("as phone (guessed)"));
    assert!(listed(&app, "grey", "phone", "13912345678").await);

    // A CSV file with a row the browser refuses: named by its line in the file, nothing
    // written.
    let files = tempfile::tempdir().unwrap();
    let bad = files.path().join("suspects.csv");
    std::fs::write(
        &bad,
        "dimension,value,sandbox,reason\ndevice,csv-good-1,default,ok\nphone,12,default,too short\ndevice,csv-good-2,default,ok\n",
    )
    .unwrap();
    b.fill("csv-list", "grey").await;
    b.visible("csv-file")
        .await
        .send_keys(bad.to_str().unwrap())
        .await
        .unwrap();
    b.wait_for(
        "the file",
        "return document.getElementById('csv-text').value.includes('csv-good-2')",
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
        errors.contains("suspects.csv line 3") && errors.contains("phone"),
        "{errors}"
    );
    assert!(!listed(&app, "grey", "device", "csv-good-1").await);
    // A row only the service refuses (the ID card's check digit, rules 2), after a blank
    // line: its refusal names the file's line, not the entry's index.
    let refused = files.path().join("suspects-2.csv");
    std::fs::write(
        &refused,
        "dimension,value,sandbox,reason\ndevice,csv-good-1,default,ok\nphone,13900000000,default,fixed\n\nid_card,110105194912310021,default,typo\ndevice,csv-good-2,default,ok\n",
    )
    .unwrap();
    b.visible("csv-file")
        .await
        .send_keys(refused.to_str().unwrap())
        .await
        .unwrap();
    b.wait_for(
        "the second file",
        "return document.getElementById('csv-text').value.includes('typo')",
    )
    .await;
    b.click("csv-write-btn").await;
    b.wait_for(
        "the service's refusal",
        "return document.getElementById('csv-errors').textContent.includes('refused by the service')",
    )
    .await;
    let errors = b.text("csv-errors").await;
    assert!(
        errors.contains("suspects-2.csv line 5") && errors.contains("check digit"),
        "{errors}"
    );
    assert!(!errors.contains("entries["), "{errors}");
    assert!(!listed(&app, "grey", "device", "csv-good-1").await);
    // Fixed, the rows are written.
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

    // A delete asks first (No keeps the entry), then can be undone within seconds: the entry
    // comes back with its reason and expiry.
    b.fill("del-list", "grey").await;
    b.fill("del-value", "13912345678").await;
    b.click("del-btn").await;
    assert!(
        b.text("confirm-text").await.contains("13912345678"),
        "the question names the entry"
    );
    b.click("confirm-no").await;
    b.wait_for(
        "no delete",
        "return document.getElementById('status').textContent === 'Nothing removed'",
    )
    .await;
    assert!(listed(&app, "grey", "phone", "13912345678").await);
    b.click("del-btn").await;
    b.click("confirm-yes").await;
    b.wait_for(
        "the delete",
        "return document.getElementById('status').textContent.startsWith('Removed')",
    )
    .await;
    assert!(!listed(&app, "grey", "phone", "13912345678").await);
    // Undo right away: the bar lasts 10 s, a slow machine's screenshots could outlast it.
    b.click("undo-btn").await;
    b.wait_for(
        "the undo",
        "return document.getElementById('status').textContent.startsWith('Put back')",
    )
    .await;
    b.check_layouts("edit").await;
    let (_, entry) = api(
        &app,
        "GET",
        "/v1/lists/grey/entries/phone/13912345678",
        None,
    )
    .await;
    assert_eq!(entry["listed"], true, "{entry}");
    let expires = entry["expires_at"].as_i64().expect("the expiry came back");
    assert!(
        expires > at + 29 * 86_400_000,
        "30 days, as before: {entry}"
    );
    let undone = last_record(&app, "grey", "phone", "13912345678").await;
    assert_eq!(undone["op"], "upsert", "{undone}");
    assert_eq!(undone["reason"], "ring 2026-11", "{undone}");

    // 4. Audit: the token's name and the masked value, never the raw one; no word broken at
    // 1280 px; the fingerprint shortened, whole on hover.
    b.open(&app, "audit").await;
    b.wait_for(
        "the trail",
        "return document.querySelectorAll('#audit-rows tbody tr').length >= 6",
    )
    .await;
    let broken = b
        .js(r#"const broken = [];
            for (const td of document.querySelectorAll('#audit-rows td')) {
              const walk = document.createTreeWalker(td, NodeFilter.SHOW_TEXT);
              for (let n = walk.nextNode(); n; n = walk.nextNode()) {
                for (const m of n.textContent.matchAll(/\S+/g)) {
                  const r = document.createRange();
                  r.setStart(n, m.index);
                  r.setEnd(n, m.index + m[0].length);
                  const lines = new Set([...r.getClientRects()].map(x => Math.round(x.top)));
                  if (lines.size > 1) broken.push(m[0]);
                }
              }
            }
            return broken;"#)
        .await;
    assert_eq!(broken, json!([]), "words broken across lines at 1280 px");
    assert_eq!(
        b.js("const s = document.getElementById('audit-rows').parentElement; return s.scrollWidth <= s.clientWidth;")
            .await,
        true,
        "the audit table fits 1280 px"
    );
    let fp = b
        .js("const s = document.querySelector('#audit-rows .fp'); return [s.title, s.textContent, s.getBoundingClientRect().width];")
        .await;
    assert_eq!(fp[0], fp[1], "the whole fingerprint on hover: {fp}");
    assert!(
        fp[0].as_str().unwrap().len() > 12 && fp[2].as_f64().unwrap() < 100.0,
        "shown shortened: {fp}"
    );
    b.select("audit-op", "delete").await;
    b.click("audit-btn").await;
    b.wait_for("the records", "return document.querySelector('#audit-rows tbody tr td') !== null && document.querySelector('#audit-rows tbody tr td').textContent !== 'No records' && !document.getElementById('audit-rows').textContent.includes('upsert')").await;
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
        "return document.getElementById('audit-rows').textContent.includes('****') && !document.getElementById('audit-rows').textContent.includes('delete')",
    )
    .await;
    let rows = b.text("audit-rows").await;
    assert!(!rows.contains(PHONE), "{rows}");
    assert!(rows.contains(XSS), "{rows}");
    let held = b.content("audit-rows").await;
    assert!(held.contains(&shanghai(at)), "{held}");
    for url in b.fetched().await {
        assert!(!url.contains(PHONE), "{url}");
    }
    b.check_layouts("audit").await;
    // Filtered by reason, exported: the file holds the filtered records, masked.
    b.select("audit-dim", "").await;
    b.fill("audit-value", "").await;
    b.fill("audit-reason", "FIXED").await;
    b.click("audit-btn").await;
    b.wait_for(
        "the reason filter",
        "return document.querySelectorAll('#audit-rows tbody tr').length === 1 && document.getElementById('audit-rows').textContent.includes('fixed')",
    )
    .await;
    b.click("audit-export").await;
    let (name, csv) = b.downloaded().await;
    assert!(
        name.starts_with("audit-") && name.ends_with(".csv"),
        "{name}"
    );
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 2, "the header and the one record: {csv}");
    assert!(
        lines[1].contains("fixed") && lines[1].contains("****"),
        "{csv}"
    );
    for raw in ["13900000000", PHONE, "13912345678", "csv-good"] {
        assert!(!csv.contains(raw), "a raw value in the export: {csv}");
    }

    // 5. Health says first whether the service is well, 6. definitions (a write token sees
    // no definition controls).
    b.open(&app, "health").await;
    b.wait_for(
        "the verdict",
        "return document.getElementById('health-verdict').textContent !== ''",
    )
    .await;
    let verdict = b.text("health-verdict").await;
    assert!(verdict.starts_with("Well"), "{verdict}");
    let summary = b.text("health-summary").await;
    assert!(
        summary.contains("Redis") && summary.contains("invalidation subscription"),
        "{summary}"
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

    // 7. Every page once more, as an operator opens them: nothing in the browser console
    // (no 401, no favicon 404, no script error). The refusals above were logged; read
    // them away first.
    let _ = b.console().await;
    for page in [
        "search?value=17012345678",
        "lists?list=black&sandbox=default",
        "edit",
        "audit?op=upsert",
        "health",
        "definitions",
    ] {
        b.open(&app, page).await;
        b.wait_for(
            "the page",
            "return document.querySelector('.page.current') !== null",
        )
        .await;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert_eq!(
        b.js("const l = document.querySelector('link[rel=icon]'); return l !== null && l.href.startsWith('data:image/svg+xml');")
            .await,
        true,
        "a favicon"
    );
    let errors = b.console_errors().await;
    assert!(errors.is_empty(), "browser console errors: {errors:#?}");
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
    let lists_link = b
        .client
        .find(Locator::Css("#nav a[data-page=lists]"))
        .await
        .unwrap();
    assert!(
        lists_link.is_displayed().await.unwrap(),
        "a read token reads the lists"
    );
    b.open(&app, "edit").await;
    assert!(
        !displayed(&b, "page-edit").await,
        "#edit falls back to search"
    );

    // The risk engine's token reads no lists and no audit trail: those pages are not
    // offered, and a link to one falls back to search.
    b.client
        .execute("sessionStorage.clear();", vec![])
        .await
        .unwrap();
    b.sign_in(&app, ENGINE).await;
    for page in ["lists", "audit", "edit"] {
        let link = b
            .client
            .find(Locator::Css(&format!("#nav a[data-page={page}]")))
            .await
            .unwrap();
        assert!(
            !link.is_displayed().await.unwrap(),
            "an engine token is offered no {page} page"
        );
    }
    b.open(&app, "audit?op=delete").await;
    b.wait_for("the app", "return !document.getElementById('app').hidden")
        .await;
    assert!(!displayed(&b, "page-audit").await, "#audit falls back");
    assert!(displayed(&b, "page-search").await);

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
    // Windows read as durations, not seconds.
    let cells = b
        .js("return [...document.querySelectorAll('#metrics-rows td')].map(td => td.textContent);")
        .await;
    assert!(
        cells.as_array().unwrap().iter().any(|c| c == "1d"),
        "{cells}"
    );
    assert!(!cells.to_string().contains("86400"), "{cells}");
    // A refused save leaves no earlier success showing beside its error.
    assert_eq!(b.text("status").await, "Metric saved");
    b.fill("metric-expr", "COUNT(1d, transaction) BY").await;
    b.click("metric-save").await;
    b.wait_for(
        "the error",
        "return !document.getElementById('def-error').hidden",
    )
    .await;
    assert_eq!(b.text("status").await, "", "only the error shows");
    b.fill("try-metrics", "dev_tx_7d").await;
    b.click("try-features").await;
    b.wait_for(
        "features",
        "return document.getElementById('try-out').textContent.includes('dev_tx_7d')",
    )
    .await;
    b.check_layouts("definitions-admin").await;

    // Deleting a metric asks first and can be undone.
    b.client
        .find(Locator::XPath(
            "//table[@id='metrics-rows']//button[text()='Delete']",
        ))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert!(b.text("confirm-text").await.contains("dev_tx_7d"));
    b.click("confirm-yes").await;
    b.wait_for(
        "the delete",
        "return !document.getElementById('metrics-rows').textContent.includes('dev_tx_7d')",
    )
    .await;
    let (status, _) = api(&app, "GET", "/v1/metrics/dev_tx_7d", None).await;
    assert_eq!(status, 404);
    b.click("undo-btn").await;
    b.wait_for(
        "the metric back",
        "return document.getElementById('metrics-rows').textContent.includes('dev_tx_7d')",
    )
    .await;
    let (status, def) = api(&app, "GET", "/v1/metrics/dev_tx_7d", None).await;
    assert_eq!(status, 200, "{def}");
    assert_eq!(def["expr"], "COUNT(1d, transaction) BY device_id", "{def}");

    // Health on the embedded store: said so, and nothing that only Redis has reads as
    // alarming or empty.
    b.open(&app, "health").await;
    b.wait_for(
        "the verdict",
        "return document.getElementById('health-verdict').textContent !== ''",
    )
    .await;
    let verdict = b.text("health-verdict").await;
    assert!(verdict.starts_with("Well"), "{verdict}");
    let summary = b.text("health-summary").await;
    assert!(summary.contains("Embedded store"), "{summary}");
    assert!(!summary.contains("invalidation"), "{summary}");
    let page = b.text("page-health").await;
    assert!(
        !page.contains("0.0 %") && !page.contains("refresh again"),
        "{page}"
    );
    b.check_layouts("health-embedded").await;
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
