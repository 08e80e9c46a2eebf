//! The corpus of malformed and hostile bodies, sent to the service binary in a child process
//! (a crash is a failed case, not the end of the test run): every answer the exact status
//! decided for its case, in the API.md error shape, within `CASE_TIMEOUT`, and a refused
//! request leaves `DEBUG DIGEST` unchanged.
//!
//! The corpus is generated in `corpus` (its types, the endpoints and their slots) from
//! `mutations` (of each endpoint's example), `framing` (the body limit, honest and lying
//! framing) and `hand_written` (look-alike identifiers and other hand-picked cases).

mod corpus;
mod framing;
mod hand_written;
mod mutations;

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{RedisServer, ServiceBuilder, ServiceProcess};
use serde_json::{Value, json};

use super::client::{Framing, Reply, exchange, send_json};
use super::{CASE_TIMEOUT, SERIAL};
use corpus::{Case, Expect, corpus};

/// The service binary on the test's Redis, restarted (same keyspace) after a case that broke
/// it; its log is read for panics as the corpus goes.
struct Server {
    service: ServiceProcess,
    builder: ServiceBuilder,
    /// How much of the current process's log `new_trouble` has read.
    log_read: usize,
}

impl Server {
    async fn start(redis: &RedisServer) -> Self {
        let builder = ServiceProcess::builder()
            .env("NAMELIST_FINGERPRINT_KEY_FILE", common::key_file())
            .env("NAMELIST_REDIS_URL", redis.url())
            .env("NAMELIST_KEY_PREFIX", common::unique_prefix())
            .env("NAMELIST_WORKERS", "2")
            .env("NAMELIST_LOG_FORMAT", "text")
            // Reads get room on a busy 2-core machine: the corpus is about bodies, not
            // latency (and a caller's huge request must not become a 503 either way).
            .env("NAMELIST_CHECK_DEADLINE_MS", "1000")
            .env("RUST_LOG", "warn");
        Self {
            service: builder.start().await,
            builder,
            log_read: 0,
        }
    }

    fn port(&self) -> u16 {
        self.service.port()
    }

    /// A fresh process in place of this one.
    async fn restart(&mut self) {
        self.service.kill();
        self.service = self.builder.start().await;
        self.log_read = 0;
    }

    fn alive(&mut self) -> bool {
        self.service.alive()
    }

    fn log(&self) -> String {
        self.service.log()
    }

    /// Panics and crashes the log shows since the last call.
    fn new_trouble(&mut self) -> Vec<String> {
        let log = self.log();
        let fresh = log.get(self.log_read..).unwrap_or_default().to_owned();
        self.log_read = log.len();
        let lines: Vec<&str> = fresh.lines().collect();
        let mut out = Vec::new();
        for (i, l) in lines.iter().enumerate() {
            if l.contains("panicked at") {
                out.push(format!("{l} {}", lines.get(i + 1).unwrap_or(&"")));
            } else if l.contains("overflowed its stack") || l.contains("fatal runtime error") {
                out.push((*l).to_owned());
            }
        }
        out
    }
}

/// Checks an answer against what the case must get.
fn judge(case: &Case, reply: &Reply) -> Result<(), String> {
    let status = reply.status;
    let body = || String::from_utf8_lossy(&reply.body[..reply.body.len().min(300)]).into_owned();
    let wanted: Vec<u16> = match case.expect {
        Expect::Is(s, _) | Expect::Protocol(s) => vec![s],
        Expect::OneOf(set) => set.to_vec(),
    };
    if !wanted.contains(&status) {
        let what = if status >= 500 {
            " (a 5xx for a caller's mistake)"
        } else {
            ""
        };
        return Err(format!(
            "status {status}{what}, expected {wanted:?}: {}",
            body()
        ));
    }
    if matches!(case.expect, Expect::Protocol(_)) {
        return Ok(());
    }
    let v: Value = serde_json::from_slice(&reply.body).map_err(|e| {
        format!(
            "status {status} with a body that is not JSON ({e}): {}",
            body()
        )
    })?;
    if status < 300 {
        return if v.is_object() {
            Ok(())
        } else {
            Err(format!("200 with a body that is not an object: {v}"))
        };
    }
    let err = v
        .as_object()
        .filter(|o| o.len() == 1)
        .and_then(|o| o.get("error"))
        .and_then(Value::as_object)
        .filter(|e| e.len() == 2)
        .ok_or_else(|| format!("not the API.md error shape: {v}"))?;
    let code = err.get("code").and_then(Value::as_str).unwrap_or("");
    let message = err.get("message").and_then(Value::as_str).unwrap_or("");
    if code.is_empty()
        || !code
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b == b'_' || b.is_ascii_digit())
        || message.is_empty()
    {
        return Err(format!("not the API.md error shape: {v}"));
    }
    if reply.header("content-type") != Some("application/json") {
        return Err(format!(
            "error with content-type {:?}",
            reply.header("content-type")
        ));
    }
    if let Expect::Is(_, Some(want)) = case.expect
        && code != want
    {
        return Err(format!("code {code:?}, expected {want:?}: {message}"));
    }
    Ok(())
}

fn digest(conn: &mut redis::Connection) -> String {
    redis::cmd("DEBUG")
        .arg("DIGEST")
        .query(conn)
        .expect("DEBUG DIGEST")
}

/// Redis's count of changes made by write commands (`rdb_changes_since_last_save`; the
/// test servers never save, so it only grows).
fn dirty(conn: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("persistence")
        .query(conn)
        .expect("INFO persistence");
    info.lines()
        .find_map(|l| l.strip_prefix("rdb_changes_since_last_save:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("rdb_changes_since_last_save")
}

/// What the store holds, as `DEBUG DIGEST` says, computed only when a write command ran
/// since the last look (`dirty` moved): a digest is O(the dataset), and the corpus's
/// accepted cases grow it, while most cases write nothing.
struct StoreState {
    digest: String,
    dirty: u64,
}

impl StoreState {
    fn read(conn: &mut redis::Connection) -> Self {
        let dirty = dirty(conn);
        Self {
            digest: digest(conn),
            dirty,
        }
    }

    /// The state now: the same digest when nothing was written since `self`.
    fn now(&self, conn: &mut redis::Connection) -> Self {
        let dirty = dirty(conn);
        if dirty == self.dirty {
            return Self {
                digest: self.digest.clone(),
                dirty,
            };
        }
        Self::read(conn)
    }
}

/// The metrics, rule and entry the corpus's valid examples refer to.
async fn seed(port: u16) {
    for (path, body) in [
        (
            "/v1/metrics/m1",
            json!({"expr": "COUNT(7d, transaction) BY device_id", "resolution": "1h"}),
        ),
        (
            "/v1/metrics/amt",
            json!({"expr": "SUM(1d, transaction, amount) BY device_id"}),
        ),
        ("/v1/rules/r1", json!({"expr": "m1 > 3 AND amt >= 10"})),
    ] {
        let r = send_json(port, "PUT", path, &body).await;
        assert_eq!(r.status, 200, "PUT {path}: {:?}", r.json());
    }
    let r = send_json(
        port,
        "POST",
        "/v1/lists/black/entries",
        &json!({"entries": [{"dimension": "uid", "value": "u1", "sandbox": "loan"}]}),
    )
    .await;
    assert_eq!(r.status, 200, "seeding an entry: {:?}", r.json());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_bodies_get_exact_4xx_and_change_nothing() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let mut server = Server::start(&redis).await;
    seed(server.port()).await;
    let cases = corpus(namelist::domain::now_ms());
    let started = Instant::now();
    let mut conn = redis.conn();
    let mut before = StoreState::read(&mut conn);
    let mut failures: Vec<String> = Vec::new();
    let mut restarts = 0;
    let mut open_choices: Vec<String> = Vec::new();
    for case in &cases {
        let sent = Instant::now();
        let send = || async {
            match tokio::time::timeout(
                CASE_TIMEOUT,
                exchange(
                    server.port(),
                    case.method,
                    &case.path,
                    case.body.clone(),
                    case.framing.clone(),
                ),
            )
            .await
            {
                Ok(r) => r,
                Err(_) => Err(format!("no answer within {CASE_TIMEOUT:?} (a hang)")),
            }
        };
        let mut outcome = send().await;
        // A valid request may meet a store that did not answer in time on a busy CI machine
        // (503 `store_unavailable`, nothing written: the contract's answer to a store
        // failure, not a caller's mistake); sent once more. Bad bodies never get this.
        let valid = matches!(case.expect, Expect::Is(200, _));
        if let Ok(reply) = &outcome
            && valid
            && reply.status == 503
            && String::from_utf8_lossy(&reply.body).contains("store_unavailable")
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
            outcome = send().await;
        }
        let took = sent.elapsed();
        match outcome {
            Ok(reply) => {
                if let Expect::OneOf(_) = case.expect {
                    open_choices.push(format!("{} -> {}", case.label, reply.status));
                }
                if let Err(e) = judge(case, &reply) {
                    failures.push(format!("{} [{} bytes]: {e}", case.label, case.body.len()));
                }
                let now = before.now(&mut conn);
                if reply.status >= 300 && now.digest != before.digest {
                    failures.push(format!(
                        "{}: answered {} but the store changed",
                        case.label, reply.status
                    ));
                }
                before = now;
                if reply.status < 300 && case.method == "PUT" {
                    seed(server.port()).await; // put the definitions back
                    before = StoreState::read(&mut conn);
                }
                let trouble = server.new_trouble();
                if !trouble.is_empty() {
                    failures.push(format!("{}: the server logged {trouble:?}", case.label));
                }
            }
            Err(e) => {
                tokio::time::sleep(Duration::from_millis(200)).await; // let a crash finish
                let alive = server.alive();
                let trouble = server.new_trouble();
                failures.push(format!(
                    "{} [{} bytes] after {took:?}: {e}; server {}; log: {trouble:?}",
                    case.label,
                    case.body.len(),
                    if alive { "still running" } else { "DIED" },
                ));
                // A fresh server for the next case (a hung one may still be busy).
                server.restart().await;
                restarts += 1;
                before = StoreState::read(&mut conn);
            }
        }
    }
    let elapsed = started.elapsed();

    // Still whole: health and a normal check.
    let r = exchange(
        server.port(),
        "GET",
        "/healthz",
        Arc::new(Vec::new()),
        Framing::NoLength,
    )
    .await
    .expect("healthz");
    assert_eq!(r.status, 200);
    let r = send_json(
        server.port(),
        "POST",
        "/v1/check",
        &json!({"sandbox": "loan", "lists": ["black"], "subjects": {"uid": ["u1", "nobody"]}}),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["hits"][0]["value"], "u1", "{:?}", r.json());
    assert!(
        server.alive(),
        "the server is still running after the corpus"
    );
    eprintln!(
        "hostile corpus: {} cases in {elapsed:?}, {} failed, {restarts} server restarts",
        cases.len(),
        failures.len()
    );
    eprintln!(
        "where the contract leaves the choice open:\n  {}",
        open_choices.join("\n  ")
    );
    assert!(cases.len() >= 200, "a corpus of at least 200");
    assert!(
        failures.is_empty(),
        "{} of {} hostile cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
