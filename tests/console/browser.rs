//! `chromedriver` on a free port and a headless Chromium session through it: pages opened,
//! signed in, filled and read; the browser console's log; downloads; both window sizes checked
//! for horizontal scroll, with screenshots.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{TestApp, free_port};
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| PathBuf::from(d).join(name))
        .find(|p| p.is_file())
}

/// `chromedriver` on a free port, and a headless Chromium session through it.
pub(super) struct Browser {
    pub(super) client: Client,
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
    pub(super) async fn start() -> Self {
        Self::start_in(None).await
    }

    /// A browser whose clock reads `tz` (`TZ` of chromedriver, which Chromium inherits).
    pub(super) async fn start_in(tz: Option<&str>) -> Self {
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
    pub(super) async fn console(&self) -> Vec<String> {
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
    pub(super) async fn console_errors(&self) -> Vec<String> {
        self.console()
            .await
            .into_iter()
            .filter(|e| e.starts_with("SEVERE"))
            .collect()
    }

    /// The one file downloaded, once it is complete (Chromium writes it first under a
    /// temporary name: `.org.chromium.Chromium.*`, `*.crdownload`).
    pub(super) async fn downloaded(&self) -> (String, String) {
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

    pub(super) async fn open(&self, app: &TestApp, page: &str) {
        self.client
            .goto(&app.url(&format!("/console#{page}")))
            .await
            .unwrap();
        // A new fragment alone would not load the page again.
        self.client.refresh().await.unwrap();
    }

    /// Types the token into the sign-in form.
    pub(super) async fn sign_in(&self, app: &TestApp, token: &str) {
        self.open(app, "search").await;
        let field = self.visible("token").await;
        // The first load says nothing was refused: nothing was typed yet.
        assert_eq!(self.text("status").await, "", "an error before sign-in");
        field.send_keys(token).await.unwrap();
        self.click("login-btn").await;
        self.wait_for("signed in", "return !document.getElementById('app').hidden")
            .await;
    }

    pub(super) async fn visible(&self, id: &str) -> fantoccini::elements::Element {
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

    pub(super) async fn click(&self, id: &str) {
        self.visible(id).await.click().await.unwrap();
    }

    pub(super) async fn fill(&self, id: &str, text: &str) {
        let e = self.visible(id).await;
        e.clear().await.unwrap();
        e.send_keys(text).await.unwrap();
    }

    pub(super) async fn select(&self, id: &str, value: &str) {
        let e = self.visible(id).await;
        e.select_by_value(value).await.unwrap();
    }

    pub(super) async fn js(&self, script: &str) -> Value {
        self.client.execute(script, vec![]).await.unwrap()
    }

    /// Waits until `script` returns true.
    pub(super) async fn wait_for(&self, what: &str, script: &str) {
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
    pub(super) async fn content(&self, id: &str) -> String {
        self.js(&format!(
            "return document.getElementById('{id}').textContent;"
        ))
        .await
        .as_str()
        .unwrap_or_default()
        .to_owned()
    }

    pub(super) async fn text(&self, id: &str) -> String {
        match self.client.find(Locator::Id(id)).await {
            Ok(e) => e.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// At 1280×800 and 390×844: no horizontal scroll, and a screenshot of each.
    pub(super) async fn check_layouts(&self, page: &str) {
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
    pub(super) async fn fetched(&self) -> Vec<String> {
        self.js("return performance.getEntriesByType('resource').map(e => e.name);")
            .await
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    }
}
