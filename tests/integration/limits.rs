//! The instance-wide limits (`routes::limits`): requests in flight per route class and buffered
//! body bytes are bounded, a request beyond them is a 503 `overloaded` at once, other classes
//! and probes still answer, a request still sending its body holds no place, and the room
//! comes back when the requests holding it end, also when their clients just vanish.

use crate::common;

use std::time::{Duration, Instant};

use common::{RedisServer, TestApp, redis_settings, spawn_app, test_settings};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Opens a connection and sends a request head announcing `length` bytes of body, plus
/// `sent` of them: the request is then in flight, waiting for the rest.
async fn stalled_head(app: &TestApp, path: &str, length: usize, sent: usize) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", app.port)).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {length}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(&vec![b' '; sent]).await.unwrap();
    s.flush().await.unwrap();
    s
}

async fn wait_for_metric(app: &TestApp, series: &str, want: f64) {
    let started = Instant::now();
    loop {
        let got = app.metric(series).await;
        if got == Some(want) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{series} is {got:?}, expected {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn expect_overloaded(res: reqwest::Response) {
    assert_eq!(res.status(), 503);
    assert_eq!(
        res.headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap()),
        Some("1")
    );
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["error"]["code"], "overloaded", "{body}");
}

fn check_body() -> Value {
    json!({"lists": ["black"], "subjects": {"uid": "u1"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_their_class_budget_are_refused_at_once_and_others_go_on() {
    // Checks that wait on a frozen Redis hold their places (tier off: every lookup asks).
    let redis = RedisServer::start();
    let mut settings = redis_settings(&redis);
    settings.max_in_flight_requests = 2;
    settings.local_memory_mb = 0.0;
    settings.check_deadline_ms = 3_000;
    let app = spawn_app(settings).await;
    assert_eq!(app.post("/v1/check", &check_body()).await.status(), 200);

    redis.pause();
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let client = app.client.clone();
            let url = app.url("/v1/check");
            tokio::spawn(async move { client.post(url).json(&check_body()).send().await })
        })
        .collect();
    wait_for_metric(&app, "namelist_in_flight_requests{class=\"engine\"}", 2.0).await;

    let started = Instant::now();
    expect_overloaded(app.post("/v1/check", &check_body()).await).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "refused at once, not queued"
    );
    assert_eq!(
        app.metric("namelist_overloaded_total{limit=\"engine\"}")
            .await,
        Some(1.0)
    );
    // Other classes have their own room; probes are not counted at all.
    assert_eq!(
        app.get("/v1/whoami").await.status(),
        200,
        "an operator call"
    );
    for probe in ["/healthz", "/metrics"] {
        assert_eq!(app.get(probe).await.status(), 200, "{probe} is not counted");
    }

    // The room comes back when the requests end.
    redis.resume();
    for w in waiting {
        assert_eq!(w.await.unwrap().unwrap().status(), 200);
    }
    wait_for_metric(&app, "namelist_in_flight_requests{class=\"engine\"}", 0.0).await;
    assert_eq!(app.post("/v1/check", &check_body()).await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_still_sending_its_body_holds_no_place() {
    let mut settings = test_settings();
    settings.max_in_flight_requests = 1;
    let app = spawn_app(settings).await;

    // Heads that announce 100 bytes (or 8 MiB) and send a few, or none.
    let mut stalled = Vec::new();
    for (length, sent) in [(100, 10), (100, 0), (8 * 1024 * 1024, 0)] {
        stalled.push(stalled_head(&app, "/v1/check", length, sent).await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        app.metric("namelist_in_flight_requests{class=\"engine\"}")
            .await,
        Some(0.0)
    );
    for _ in 0..3 {
        assert_eq!(app.post("/v1/check", &check_body()).await.status(), 200);
    }
    drop(stalled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_share_a_byte_budget() {
    let mut settings = test_settings();
    settings.max_body_bytes = 40_000;
    settings.max_buffered_body_bytes = 50_000;
    let app = spawn_app(settings).await;
    let entries = "/v1/lists/black/entries";
    let big = format!(
        r#"{{"entries":[{{"dimension":"uid","value":"u1","reason":"{}"}}]}}"#,
        "x".repeat(29_000)
    );

    // Announced bytes are not reserved: 39,000 announced and 1,000 sent leave room for 29,000.
    let announced = stalled_head(&app, entries, 39_000, 1_000).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let res = app.post_raw(entries, big.clone()).await;
    assert_eq!(
        res.status(),
        400,
        "refused for its reason, not for the budget"
    );
    drop(announced);

    // 30,000 bytes that did arrive are held; 29,000 more do not fit beside them.
    let held = stalled_head(&app, entries, 39_000, 30_000).await;
    let started = Instant::now();
    loop {
        let res = app.post_raw(entries, big.clone()).await;
        if res.status() == 503 {
            expect_overloaded(res).await;
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the 30,000 bytes were never counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        app.metric("namelist_overloaded_total{limit=\"body_bytes\"}")
            .await
            >= Some(1.0)
    );
    // Nothing was written by the refused request.
    let res = app.get("/v1/lists/black/entries/uid/u1").await;
    assert_eq!(res.json::<Value>().await.unwrap()["listed"], false);

    // A small body still fits.
    let res = app.post("/v1/check", &check_body()).await;
    assert_eq!(res.status(), 200);

    // Once the stalled request is gone, the big body fits again.
    drop(held);
    let started = Instant::now();
    loop {
        let res = app.post_raw(entries, big.clone()).await;
        if res.status() == 400 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the room never came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_bodies_are_counted_as_they_arrive() {
    let mut settings = test_settings();
    settings.max_body_bytes = 40_000;
    settings.max_buffered_body_bytes = 40_000;
    let app = spawn_app(settings).await;

    // A chunked body with no length: 30,000 bytes arrive and are held.
    let mut s = TcpStream::connect(("127.0.0.1", app.port)).await.unwrap();
    s.write_all(
        b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Transfer-Encoding: chunked\r\n\r\n",
    )
    .await
    .unwrap();
    s.write_all(format!("{:x}\r\n", 30_000).as_bytes())
        .await
        .unwrap();
    s.write_all(&vec![b' '; 30_000]).await.unwrap();
    s.write_all(b"\r\n").await.unwrap();
    s.flush().await.unwrap();
    // Wait until the chunk is buffered: a 15,000-byte body is then refused.
    let body = format!(
        r#"{{"lists":["black"],"subjects":{{"uid":"u1"}},"pad":"{}"}}"#,
        "x".repeat(15_000)
    );
    let started = Instant::now();
    loop {
        let res = app.post_raw("/v1/check", body.clone()).await;
        if res.status() == 503 {
            expect_overloaded(res).await;
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the chunked body was never counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(s);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let res = app.post("/v1/check", &check_body()).await;
    assert_eq!(res.status(), 200);
}
