//! The instance-wide limits (`routes::limits`): requests in flight and buffered body bytes are
//! bounded, a request beyond them is a 503 `overloaded` at once, probes still answer, and the
//! room comes back when the requests holding it end, also when their clients just vanish.

mod common;

use std::time::{Duration, Instant};

use common::{TestApp, spawn_app, test_settings};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Opens a connection and sends a request head announcing `length` bytes of body, plus
/// `sent` of them: the request is then in flight, waiting for the rest.
async fn stalled(app: &TestApp, path: &str, length: usize, sent: usize) -> TcpStream {
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
async fn requests_beyond_the_in_flight_limit_are_refused_at_once() {
    let mut settings = test_settings();
    settings.max_in_flight_requests = 2;
    let app = spawn_app(settings).await;

    let a = stalled(&app, "/v1/check", 100, 10).await;
    let b = stalled(&app, "/v1/check", 100, 0).await;
    wait_for_metric(&app, "namelist_in_flight_requests", 2.0).await;

    let started = Instant::now();
    expect_overloaded(app.post("/v1/check", &check_body()).await).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "refused at once, not queued"
    );
    assert_eq!(
        app.metric("namelist_overloaded_total{limit=\"in_flight\"}")
            .await,
        Some(1.0)
    );
    for probe in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(app.get(probe).await.status(), 200, "{probe} is not counted");
    }

    // Clients that vanish give their room back.
    drop((a, b));
    wait_for_metric(&app, "namelist_in_flight_requests", 0.0).await;
    let res = app.post("/v1/check", &check_body()).await;
    assert_eq!(res.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_share_a_byte_budget() {
    let mut settings = test_settings();
    settings.max_body_bytes = 40_000;
    settings.max_buffered_body_bytes = 50_000;
    let app = spawn_app(settings).await;
    let entries = "/v1/lists/black/entries";

    // 30,000 announced bytes are reserved up front; 30,000 more do not fit beside them.
    let held = stalled(&app, entries, 30_000, 1_000).await;
    wait_for_metric(&app, "namelist_in_flight_requests", 1.0).await;
    // Give the stalled request time to reach the body extractor.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let big = format!(
        r#"{{"entries":[{{"dimension":"uid","value":"u1","reason":"{}"}}]}}"#,
        "x".repeat(29_000)
    );
    expect_overloaded(app.post_raw(entries, big.clone()).await).await;
    assert_eq!(
        app.metric("namelist_overloaded_total{limit=\"body_bytes\"}")
            .await,
        Some(1.0)
    );
    // Nothing was written by the refused request.
    let res = app.get("/v1/lists/black/entries/uid/u1").await;
    assert_eq!(res.json::<Value>().await.unwrap()["listed"], false);

    // A small body still fits.
    let res = app.post("/v1/check", &check_body()).await;
    assert_eq!(res.status(), 200);

    // Once the stalled request is gone, the big body fits (it is then refused for its
    // reason length, a 400: the budget is not what stops it).
    drop(held);
    wait_for_metric(&app, "namelist_in_flight_requests", 0.0).await;
    let res = app.post_raw(entries, big).await;
    assert_eq!(res.status(), 400, "{}", res.text().await.unwrap());
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
    wait_for_metric(&app, "namelist_in_flight_requests", 0.0).await;
    let res = app.post("/v1/check", &check_body()).await;
    assert_eq!(res.status(), 200);
}
