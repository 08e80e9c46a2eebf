//! What slow clients cost everyone else: the latency of normal checks while hundreds of
//! connections hang on the server, next to the same checks on an idle server.
//!
//! `tests/integration/hostile/slow.rs` (`slow_clients_do_not_block_others`) proves the behaviour: every normal
//! check is answered, exactly, while the slow clients are there, and the server cuts them off
//! on time. How fast those checks are is a measurement, so it lives here (a timing bound in a
//! test fails on a loaded machine for reasons that have nothing to do with the code).
//!
//! The scenario is the test's: its own `redis-server`, the application in-process with the
//! tests' settings (one HTTP worker, `client_request_timeout` 10 s) but `/metrics` renders
//! reused as deployed (`metrics_max_age_ms` 1 s; `NAMELIST_BENCH_METRICS_MAX_AGE_MS=0` renders
//! every scrape, as before the setting) and one listed entry; then
//! 1. **idle**: `NAMELIST_BENCH_CHECKS` (150) checks of that entry and a new uid, one every
//!    50 ms, each timed on a keep-alive connection;
//! 2. **filling**: 10 clients pipelining `GET /metrics` without ever reading the answers; for
//!    3 s, while the server renders answers until their socket buffers are full, a `GET
//!    /healthz` every 50 ms, timed;
//! 3. **slow clients**: then 200 connections dripping a request head one byte every 100–500 ms
//!    (never complete before the 10 s head timeout) and 100 connections that send nothing;
//!    500 ms later the checks of 1. again (150 × 50 ms ends before the drippers are cut off).
//!
//! Prints median, p99 and worst of each, then one JSON line.
//!
//! `cargo bench --bench slow_clients` (needs `redis-server` on PATH or `$REDIS_SERVER`).

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{RedisServer, TestApp, redis_settings, spawn_app};
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// One check every this long, as in the test.
const EVERY: Duration = Duration::from_millis(50);

/// Pipelines `GET /metrics` (a large answer) until the server stops reading, never reads,
/// and holds the connection until `stop`.
async fn never_read(port: u16, stop: Arc<AtomicBool>) {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)).await else {
        return;
    };
    let req = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    for _ in 0..5_000 {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        match tokio::time::timeout(Duration::from_millis(200), stream.write_all(req)).await {
            Ok(Ok(())) => {}
            // The server stopped reading (back-pressure): keep the connection as it is.
            _ => break,
        }
    }
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends `request` one byte every `every` until `stop`, the end of the request, or the
/// server closing the connection.
async fn drip(port: u16, request: Vec<u8>, every: Duration, stop: Arc<AtomicBool>) {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)).await else {
        return;
    };
    for byte in request {
        if stop.load(Ordering::Relaxed) || stream.write_all(&[byte]).await.is_err() {
            return;
        }
        tokio::time::sleep(every).await;
    }
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Holds a connection that sends nothing until `stop`.
async fn idle(port: u16, stop: Arc<AtomicBool>) {
    let Ok(_stream) = TcpStream::connect(("127.0.0.1", port)).await else {
        return;
    };
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `n` checks, one every [`EVERY`], each timed; every answer must be 200 with the hit.
async fn timed_checks(app: &TestApp, n: usize) -> Vec<Duration> {
    let mut took = Vec::with_capacity(n);
    for i in 0..n {
        let started = Instant::now();
        let res = app
            .post(
                "/v1/check",
                &json!({"lists": ["black"], "subjects": {"uid": ["slow-u1", format!("other-{i}")]}}),
            )
            .await;
        let t = started.elapsed();
        assert_eq!(res.status(), 200, "a normal check");
        let body: serde_json::Value = res.json().await.expect("a JSON answer");
        assert_eq!(body["hits"][0]["value"], "slow-u1", "{body}");
        took.push(t);
        tokio::time::sleep(EVERY).await;
    }
    took
}

/// (median, p99, worst) in ms.
fn summary(took: &[Duration]) -> (f64, f64, f64) {
    let mut ms: Vec<f64> = took.iter().map(|t| t.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() as f64 * q).ceil() as usize).clamp(1, ms.len()) - 1];
    (at(0.5), at(0.99), ms[ms.len() - 1])
}

fn main() {
    let checks: usize = std::env::var("NAMELIST_BENCH_CHECKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let redis = RedisServer::start();
        // `/metrics` renders reused for the default 1 s (0: render every scrape, the
        // behaviour before `metrics_max_age_ms`), so the filling phase measures what a
        // deployment meets; the knob is printed with the figures.
        let metrics_max_age_ms = std::env::var("NAMELIST_BENCH_METRICS_MAX_AGE_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(namelist::config::Settings::default().metrics_max_age_ms);
        eprintln!("metrics_max_age_ms = {metrics_max_age_ms}");
        let app = spawn_app(namelist::config::Settings {
            metrics_max_age_ms,
            ..redis_settings(&redis)
        })
        .await;
        let res = app
            .post(
                "/v1/lists/black/entries",
                &json!({"entries": [{"dimension": "uid", "value": "slow-u1"}]}),
            )
            .await;
        assert_eq!(res.status(), 200);
        let port = app.port;

        timed_checks(&app, 10).await; // warm-up
        let quiet = timed_checks(&app, checks).await;

        let stop = Arc::new(AtomicBool::new(false));
        let mut clients = Vec::new();
        for _ in 0..10 {
            clients.push(tokio::spawn(never_read(port, stop.clone())));
        }
        let mut filling = Vec::new();
        let hogs_started = Instant::now();
        while hogs_started.elapsed() < Duration::from_secs(3) {
            let started = Instant::now();
            let res = app.get("/healthz").await;
            assert_eq!(res.status(), 200);
            filling.push(started.elapsed());
            tokio::time::sleep(EVERY).await;
        }
        for i in 0..200u64 {
            let head = format!(
                "POST /v1/check HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: {}\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}",
                "p".repeat(200)
            );
            let every = Duration::from_millis(100 + (i % 5) * 100);
            clients.push(tokio::spawn(drip(
                port,
                head.into_bytes(),
                every,
                stop.clone(),
            )));
        }
        for _ in 0..100 {
            clients.push(tokio::spawn(idle(port, stop.clone())));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let loaded = timed_checks(&app, checks).await;
        stop.store(true, Ordering::Relaxed);
        for c in clients {
            let _ = c.await;
        }

        let (q50, q99, qmax) = summary(&quiet);
        let (f50, f99, fmax) = summary(&filling);
        let (l50, l99, lmax) = summary(&loaded);
        println!();
        println!(
            "namelist slow-clients benchmark: {checks} checks one every {} ms, one HTTP worker",
            EVERY.as_millis()
        );
        println!(
            "  {:<62} {:>9} {:>9} {:>9}",
            "while", "p50 ms", "p99 ms", "max ms"
        );
        println!(
            "  {:<62} {q50:>9.2} {q99:>9.2} {qmax:>9.2}",
            "nobody else connected"
        );
        println!(
            "  {:<62} {f50:>9.2} {f99:>9.2} {fmax:>9.2}",
            "10 non-reading clients filling their buffers (GET /healthz)"
        );
        println!(
            "  {:<62} {l50:>9.2} {l99:>9.2} {lmax:>9.2}",
            "10 non-reading, 200 head-dripping and 100 idle connections"
        );
        println!(
            "{}",
            json!({
                "bench": "slow_clients",
                "checks": checks,
                "idle_ms": {"p50": q50, "p99": q99, "max": qmax},
                "filling_healthz_ms": {"p50": f50, "p99": f99, "max": fmax},
                "slow_clients_ms": {"p50": l50, "p99": l99, "max": lmax},
            })
        );
        app.stop().await;
    });
}
