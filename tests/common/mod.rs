//! Test support: real `redis-server` processes on free ports, and the real application on
//! port 0. No mock Redis anywhere.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use namelist::config::{LogFormat, Settings};
use namelist::lists::NameLists;
use namelist::startup::Application;
use secrecy::SecretString;

/// A `redis-server` of the test's own, killed when dropped.
pub struct RedisServer {
    pub port: u16,
    dir: tempfile::TempDir,
    args: Vec<String>,
    child: Option<Child>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The `redis-server` binary: `$REDIS_SERVER` or the one on `PATH`.
pub fn redis_server_bin() -> PathBuf {
    std::env::var_os("REDIS_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("redis-server"))
}

impl RedisServer {
    /// Starts a server with the test defaults (no persistence, DEBUG allowed).
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments (`["--hash-max-listpack-entries", "64"]`).
    pub fn start_with(extra: &[&str]) -> Self {
        let args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        for _ in 0..10 {
            let port = free_port();
            let mut server = Self {
                port,
                dir: tempfile::tempdir().expect("temp dir"),
                args: args.clone(),
                child: None,
            };
            if server.spawn() {
                return server;
            }
        }
        panic!(
            "could not start redis-server ({}); is it installed?",
            redis_server_bin().display()
        );
    }

    fn spawn(&mut self) -> bool {
        let child = Command::new(redis_server_bin())
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--enable-debug-command", "yes"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning redis-server");
        self.child = Some(child);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(5) {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return false; // exited: port taken, most likely
            }
            if let Ok(mut c) = redis::Client::open(self.url()).and_then(|c| c.get_connection())
                && redis::cmd("PING").query::<String>(&mut c).is_ok()
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        false
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A plain synchronous connection, for arranging and inspecting state.
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .expect("client")
            .get_connection()
            .expect("connection")
    }

    /// SIGKILL: the server vanishes mid-conversation, as in a crash.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port (its data is gone: no persistence).
    pub fn restart(&mut self) {
        self.kill();
        for _ in 0..50 {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server did not restart on port {}", self.port);
    }

    /// A digest of the whole dataset (`DEBUG DIGEST`): equal digests, equal data.
    pub fn digest(&self) -> String {
        redis::cmd("DEBUG")
            .arg("DIGEST")
            .query(&mut self.conn())
            .expect("DEBUG DIGEST")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

static PREFIXES: AtomicU32 = AtomicU32::new(0);

/// A key prefix no other test in this process uses.
pub fn unique_prefix() -> String {
    format!("t{}:", PREFIXES.fetch_add(1, Ordering::Relaxed))
}

/// Test settings: quiet, one worker, port 0, embedded store.
pub fn test_settings() -> Settings {
    Settings {
        listen: "127.0.0.1:0".into(),
        workers: Some(1),
        log_format: LogFormat::Text,
        key_prefix: unique_prefix(),
        ..Settings::default()
    }
}

/// Test settings on this Redis.
pub fn redis_settings(redis: &RedisServer) -> Settings {
    Settings {
        redis_url: Some(SecretString::from(redis.url())),
        ..test_settings()
    }
}

/// A running application.
pub struct TestApp {
    pub address: String,
    pub port: u16,
    pub client: reqwest::Client,
    pub lists: actix_web::web::Data<NameLists>,
    handle: actix_web::dev::ServerHandle,
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.address, path)
    }

    pub async fn post(&self, path: &str, body: &serde_json::Value) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .expect("request")
    }

    pub async fn post_raw(&self, path: &str, body: impl Into<reqwest::Body>) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("request")
    }

    pub async fn delete(&self, path: &str, body: &serde_json::Value) -> reqwest::Response {
        self.client
            .delete(self.url(path))
            .json(body)
            .send()
            .await
            .expect("request")
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(self.url(path))
            .send()
            .await
            .expect("request")
    }

    /// `POST /v1/check`, expecting 200, returning the body.
    pub async fn check(&self, body: &serde_json::Value) -> serde_json::Value {
        let res = self.post("/v1/check", body).await;
        assert_eq!(res.status(), 200, "check failed");
        res.json().await.expect("check body")
    }

    pub async fn stop(&self) {
        self.handle.stop(true).await;
    }
}

/// Builds and runs the app; returns once it listens and its cache invalidation
/// subscription is up (so tests about invalidation start from a known state).
pub async fn spawn_app(settings: Settings) -> TestApp {
    if std::env::var_os("NAMELIST_TEST_LOG").is_some() {
        namelist::telemetry::init(LogFormat::Text);
    }
    let app = Application::build(settings)
        .await
        .expect("application starts");
    let port = app.port();
    let lists = app.lists();
    let handle = app.handle();
    tokio::spawn(app.run_until_stopped());
    let started = Instant::now();
    while !lists.cache().is_trusted() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "invalidation subscription did not come up"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    TestApp {
        address: format!("http://127.0.0.1:{port}"),
        port,
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .expect("http client"),
        lists,
        handle,
    }
}
