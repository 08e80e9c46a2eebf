//! Network-slow clients: heads and bodies dripped a byte at a time, idle connections, a client
//! that never reads its responses; normal checks still answered, exactly, and slow connections
//! cut off.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{RedisServer, redis_settings, spawn_app};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::SERIAL;
use super::client::parse_reply;

/// What became of a slow connection.
#[derive(Debug, Clone)]
struct SlowEnd {
    /// When the server closed it (from connect), or `None` if still open at the end.
    closed_after: Option<Duration>,
    /// The status the server answered before closing, if any.
    status: Option<u16>,
}

/// Sends `request` one byte every `every`, until the server closes or `give_up` passes;
/// `closed_after` counts from the connect.
async fn drip(port: u16, request: Vec<u8>, every: Duration, give_up: Duration) -> SlowEnd {
    let started = Instant::now();
    let Ok(stream) = TcpStream::connect(("127.0.0.1", port)).await else {
        return SlowEnd {
            closed_after: Some(Duration::ZERO),
            status: None,
        };
    };
    let left = give_up.saturating_sub(started.elapsed());
    let mut end = drip_on(stream, request, Duration::ZERO, every, left).await;
    end.closed_after = end.closed_after.map(|_| started.elapsed());
    end
}

/// What a client that never reads its responses did, and what became of it.
struct Hog {
    /// Pipelined requests it got onto the wire before the server stopped reading.
    sent: usize,
    /// Whether the server still held the connection open at the end.
    held: Option<bool>,
}

/// The state of a TCP connection of this host from `/proc/net/tcp` (`1`: established,
/// `8`: close-wait, i.e. the peer closed), or `None` if not found.
fn tcp_state(local: std::net::SocketAddr, remote: std::net::SocketAddr) -> Option<u8> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let hex = |a: std::net::SocketAddr| match a.ip() {
        std::net::IpAddr::V4(ip) => {
            format!("{:08X}:{:04X}", u32::from_le_bytes(ip.octets()), a.port())
        }
        std::net::IpAddr::V6(_) => String::new(),
    };
    let (l, r) = (hex(local), hex(remote));
    table.lines().skip(1).find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        (cols.get(1) == Some(&l.as_str()) && cols.get(2) == Some(&r.as_str()))
            .then(|| u8::from_str_radix(cols[3], 16).ok())
            .flatten()
    })
}

/// Sends many pipelined requests for a large response (`/metrics`) and never reads a byte.
async fn never_read(port: u16, stop: Arc<AtomicBool>) -> Hog {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)).await else {
        return Hog {
            sent: 0,
            held: None,
        };
    };
    let req = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut sent = 0;
    while !stop.load(Ordering::Relaxed) && sent < 5_000 {
        match tokio::time::timeout(Duration::from_millis(200), stream.write_all(req)).await {
            Ok(Ok(())) => sent += 1,
            // Refused, or the server stopped reading (back-pressure): keep the connection as
            // it is, unread.
            Ok(Err(_)) | Err(_) => break,
        }
    }
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held = match (stream.local_addr(), stream.peer_addr()) {
        (Ok(l), Ok(r)) => tcp_state(l, r).map(|s| s == 1),
        _ => None,
    };
    Hog { sent, held }
}

/// Normal checks, one every 50 ms for `n`, each timed; all must be 200 with the hit.
async fn timed_checks(app: &common::TestApp, n: usize) -> Vec<Duration> {
    let mut took = Vec::new();
    for i in 0..n {
        let started = Instant::now();
        let res = app
            .post(
                "/v1/check",
                &json!({"lists": ["black"], "subjects": {"uid": ["slow-u1", format!("other-{i}")]}}),
            )
            .await;
        let t = started.elapsed();
        assert_eq!(
            res.status(),
            200,
            "a normal check while slow clients hang on"
        );
        let body: Value = res.json().await.unwrap();
        assert_eq!(body["hits"][0]["value"], "slow-u1", "{body}");
        took.push(t);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    took
}

fn slow_head(pad: usize) -> Vec<u8> {
    format!(
        "POST /v1/check HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: {}\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}",
        "p".repeat(pad)
    )
    .into_bytes()
}

/// `client_request_timeout` in src/startup.rs.
const REQUEST_HEAD_TIMEOUT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_clients_do_not_block_others() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let app = spawn_app(namelist::config::Settings {
        // As deployed: scrapes reuse a render for a second.
        metrics_max_age_ms: namelist::config::Settings::default().metrics_max_age_ms,
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

    // 10 clients pipeline requests for /metrics and never read: the server renders responses
    // until the socket buffers are full (a bounded cost), then those connections stall.
    let stop = Arc::new(AtomicBool::new(false));
    let hogs: Vec<_> = (0..10)
        .map(|_| tokio::spawn(never_read(port, stop.clone())))
        .collect();
    let mut transient = Duration::ZERO;
    let hogs_started = Instant::now();
    while hogs_started.elapsed() < Duration::from_secs(3) {
        let started = Instant::now();
        let res = app.get("/healthz").await;
        assert_eq!(res.status(), 200);
        transient = transient.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // 200 connections dripping request heads (100-500 ms a byte: never complete in time),
    // 100 connections that send nothing.
    let give_up = REQUEST_HEAD_TIMEOUT + Duration::from_secs(3);
    let mut drippers = Vec::new();
    for i in 0..200u64 {
        let every = Duration::from_millis(100 + (i % 5) * 100);
        drippers.push(tokio::spawn(drip(port, slow_head(200), every, give_up)));
    }
    let mut idle = Vec::new();
    for _ in 0..100 {
        idle.push(tokio::spawn(drip(
            port,
            Vec::new(),
            Duration::from_secs(1),
            give_up,
        )));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Meanwhile, normal traffic is served: every check answered, with the hit. (How fast:
    // `cargo bench --bench slow_clients`; speed is measured there, not asserted here.)
    let took = timed_checks(&app, 60).await;
    let worst = took.iter().max().copied().unwrap();
    let mut sorted = took.clone();
    sorted.sort();
    let median = sorted[sorted.len() / 2];
    let res = app.get("/healthz").await;
    assert_eq!(res.status(), 200);
    let res = app.get("/metrics").await;
    assert_eq!(res.status(), 200, "/metrics for a client that reads");

    // The server closes connections whose request head is not complete in time.
    let mut ends = Vec::new();
    for d in drippers {
        ends.push(d.await.unwrap());
    }
    let mut idle_ends = Vec::new();
    for d in idle {
        idle_ends.push(d.await.unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    let mut hog_ends = Vec::new();
    for h in hogs {
        hog_ends.push(h.await.unwrap());
    }
    let late = |e: &SlowEnd| {
        e.closed_after
            .is_none_or(|t| t > REQUEST_HEAD_TIMEOUT + Duration::from_secs(2))
    };
    let still_open = ends.iter().filter(|e| late(e)).count();
    let statuses: std::collections::BTreeMap<String, usize> =
        ends.iter().fold(Default::default(), |mut m, e| {
            *m.entry(format!("{:?}", e.status)).or_default() += 1;
            m
        });
    let closed: Vec<Duration> = ends.iter().filter_map(|e| e.closed_after).collect();
    eprintln!(
        "slowloris: 10 non-reading clients cost others up to {transient:?} while the server \
         filled their buffers ({} pipelined requests taken), and {} of them were still held \
         open {:?} later; normal check median {median:?}, worst {worst:?}; {} of 200 head \
         drippers closed (first after {:?}, last after {:?}), answers {statuses:?}; {} of 100 \
         idle connections closed",
        hog_ends.iter().map(|h| h.sent).sum::<usize>(),
        hog_ends.iter().filter(|h| h.held == Some(true)).count(),
        hogs_started.elapsed(),
        closed.len(),
        closed.iter().min(),
        closed.iter().max(),
        idle_ends.iter().filter(|e| !late(e)).count(),
    );
    assert!(
        transient < Duration::from_secs(5),
        "10 non-reading clients held up a normal request for {transient:?}"
    );
    assert_eq!(
        still_open,
        0,
        "{still_open} of 200 connections dripping a request head were still open {:?} after \
         they connected (client_request_timeout is {REQUEST_HEAD_TIMEOUT:?})",
        REQUEST_HEAD_TIMEOUT + Duration::from_secs(2)
    );
    assert!(
        ends.iter()
            .all(|e| e.closed_after.is_none_or(|t| t >= Duration::from_secs(5))),
        "a slow but live client is not cut off early"
    );
    let idle_late: Vec<Option<Duration>> = idle_ends
        .iter()
        .filter(|e| late(e))
        .map(|e| e.closed_after)
        .collect();
    // (Once in many CI runs one was: whether it closed late or not at all says which.)
    assert!(
        idle_late.is_empty(),
        "{} of 100 idle connections were still open {:?} after they connected (closed after: \
         {idle_late:?}; None: not by {give_up:?})",
        idle_late.len(),
        REQUEST_HEAD_TIMEOUT + Duration::from_secs(2)
    );
    // Still whole.
    timed_checks(&app, 5).await;
}

/// A request whose head is complete but whose body trickles in must not hold a connection
/// (and the memory of a half-read body) forever: a slow-POST attack opens thousands of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_request_bodies_are_cut_off() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let app = spawn_app(redis_settings(&redis)).await;
    let res = app
        .post(
            "/v1/lists/black/entries",
            &json!({"entries": [{"dimension": "uid", "value": "slow-u1"}]}),
        )
        .await;
    assert_eq!(res.status(), 200);
    let before = redis.digest();
    let port = app.port;
    // An upsert of an invalid entry, so that a body that does get through writes nothing.
    let body = format!(
        r#"{{"entries":[{{"dimension":"uid","value":"{}","sandbox":"not valid!"}}]}}"#,
        "v".repeat(100)
    );
    let request = format!(
        "POST /v1/lists/black/entries HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let head_len = request.find("\r\n\r\n").unwrap() + 4;
    let give_up = REQUEST_HEAD_TIMEOUT + Duration::from_secs(3);
    let mut slow = Vec::new();
    for _ in 0..50 {
        let request = request.clone().into_bytes();
        slow.push(tokio::spawn(async move {
            // The head at once, then the body a byte every 200 ms (30 s for all of it).
            let Ok(stream) = TcpStream::connect(("127.0.0.1", port)).await else {
                return SlowEnd {
                    closed_after: Some(Duration::ZERO),
                    status: None,
                };
            };
            let started = Instant::now();
            let (rd, mut wr) = stream.into_split();
            if wr.write_all(&request[..head_len]).await.is_err() {
                return SlowEnd {
                    closed_after: Some(Duration::ZERO),
                    status: None,
                };
            }
            let stream = rd.reunite(wr).unwrap();
            let every = Duration::from_millis(200);
            let rest = request[head_len..].to_vec();
            let mut end = drip_on(stream, rest, every, every, give_up).await;
            end.closed_after = end.closed_after.map(|_| started.elapsed());
            end
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let took = timed_checks(&app, 40).await;
    let worst = took.iter().max().copied().unwrap();
    assert!(
        worst < Duration::from_millis(200),
        "a normal check took {worst:?} with 50 slow bodies open"
    );
    let mut ends = Vec::new();
    for s in slow {
        ends.push(s.await.unwrap());
    }
    assert_eq!(redis.digest(), before, "slow bodies changed the store");
    let open = ends.iter().filter(|e| e.closed_after.is_none()).count();
    eprintln!(
        "slow bodies: {open} of 50 still open after {give_up:?}; answers {:?}",
        ends.iter().map(|e| e.status).collect::<Vec<_>>()
    );
    assert_eq!(
        open, 0,
        "{open} of 50 connections trickling a request body (a byte every 200 ms) were still \
         open {give_up:?} after their head was complete: no deadline on reading a body \
         (client_request_timeout covers the head only), so a slow-POST client holds a \
         connection and its half-read body for as long as it likes"
    );
}

/// On an open stream: sends `rest` one byte every `every`, the first after `first`, until
/// the server closes or `give_up` passes; `closed_after` counts from the call.
async fn drip_on(
    stream: TcpStream,
    rest: Vec<u8>,
    first: Duration,
    every: Duration,
    give_up: Duration,
) -> SlowEnd {
    let started = Instant::now();
    let (mut rd, mut wr) = stream.into_split();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let mut sent = 0;
    let mut next = tokio::time::Instant::now() + first;
    loop {
        if started.elapsed() >= give_up {
            return SlowEnd {
                closed_after: None,
                status: parse_reply(&got, true).map(|r| r.status),
            };
        }
        tokio::select! {
            r = rd.read(&mut buf) => match r {
                Ok(0) | Err(_) => {
                    return SlowEnd {
                        closed_after: Some(started.elapsed()),
                        status: parse_reply(&got, true).map(|r| r.status),
                    };
                }
                Ok(n) => got.extend_from_slice(&buf[..n]),
            },
            _ = tokio::time::sleep_until(next) => {
                if sent < rest.len() {
                    if wr.write_all(&rest[sent..=sent]).await.is_err() {
                        return SlowEnd {
                            closed_after: Some(started.elapsed()),
                            status: parse_reply(&got, true).map(|r| r.status),
                        };
                    }
                    sent += 1;
                }
                next += every;
            }
        }
    }
}
