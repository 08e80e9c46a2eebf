//! The real `namelist` binary under SIGTERM: it stops taking connections, drains the request
//! in flight (answered, not dropped), closes the embedded store's data directory and exits 0; with
//! no traffic it exits at once. Plain HTTP/1.1 over `std::net` sockets, so a request can be
//! left half-sent while the signal arrives.

use crate::common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::ServiceProcess;

/// The drain limit (`shutdown_timeout(25)`) with a margin.
const DRAIN_LIMIT: Duration = Duration::from_secs(25);

/// The service, run as its binary on the embedded store, killed when dropped.
struct Service(ServiceProcess);

impl std::ops::Deref for Service {
    type Target = ServiceProcess;

    fn deref(&self) -> &ServiceProcess {
        &self.0
    }
}

impl std::ops::DerefMut for Service {
    fn deref_mut(&mut self) -> &mut ServiceProcess {
        &mut self.0
    }
}

impl Service {
    /// Starts the binary on the data directory `data`, logging into `dir`; returns once it is
    /// ready.
    fn start(dir: &Path, data: &Path) -> Self {
        Self(
            ServiceProcess::builder()
                .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                .env("NAMELIST_DATA_DIR", data)
                .env("NAMELIST_EXPECTED_ENTRIES", "4000")
                .env("NAMELIST_WORKERS", "2")
                .env("NAMELIST_LOG_FORMAT", "text")
                .log_dir(dir)
                .start_blocking(),
        )
    }

    fn try_request(&self, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
        let mut s = TcpStream::connect_timeout(&self.addr(), Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(head(method, path, body.len()).as_bytes())?;
        s.write_all(body.as_bytes())?;
        read_response(&mut s)
    }

    /// A whole request; panics unless it is answered.
    fn request(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        self.try_request(method, path, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}\n{}", self.log()))
    }
}

fn head(method: &str, path: &str, len: usize) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {len}\r\nConnection: close\r\n\r\n"
    )
}

/// Reads a `Connection: close` response to its end: (status, body).
fn read_response(s: &mut TcpStream) -> std::io::Result<(u16, String)> {
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            std::io::Error::new(ErrorKind::InvalidData, format!("no status: {text:?}"))
        })?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

fn upsert_body(value: &str) -> String {
    format!(r#"{{"entries": [{{"dimension": "uid", "value": "{value}"}}]}}"#)
}

#[test]
fn sigterm_drains_the_request_in_flight_and_keeps_the_lists() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("data");
    let mut service = Service::start(dir.path(), &snapshot);

    let (status, body) = service.request("GET", "/readyz", "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""store":"memory""#), "{body}");
    assert!(body.contains(r#""durable":true"#), "{body}");
    let (status, body) = service.request("POST", "/v1/lists/black/entries", &upsert_body("before"));
    assert_eq!(status, 200, "{body}");

    // A request in flight: its head and half its body sent, the rest held back.
    let body = upsert_body("in-flight");
    let (first, rest) = body.as_bytes().split_at(body.len() / 2);
    let mut in_flight = TcpStream::connect(service.addr()).unwrap();
    in_flight
        .set_read_timeout(Some(DRAIN_LIMIT + Duration::from_secs(5)))
        .unwrap();
    in_flight
        .write_all(head("POST", "/v1/lists/black/entries", body.len()).as_bytes())
        .unwrap();
    in_flight.write_all(first).unwrap();
    std::thread::sleep(Duration::from_millis(200)); // read by the server: the handler waits

    let signalled = Instant::now();
    service.sigterm();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        service.try_wait().is_none(),
        "the process exited with a request in flight:\n{}",
        service.log()
    );

    // New connections are refused (or closed unanswered) while the drain goes on.
    match service.try_request("GET", "/healthz", "") {
        Ok((status, _)) => panic!(
            "a new connection was served ({status}) after SIGTERM:\n{}",
            service.log()
        ),
        Err(e) => {
            eprintln!("a new connection after SIGTERM: {e}");
            assert!(
                matches!(
                    e.kind(),
                    ErrorKind::ConnectionRefused
                        | ErrorKind::ConnectionReset
                        | ErrorKind::ConnectionAborted
                        | ErrorKind::UnexpectedEof
                        | ErrorKind::InvalidData
                        | ErrorKind::BrokenPipe
                ),
                "a new connection after SIGTERM must be refused or closed, not left hanging: {e}"
            )
        }
    }

    // The rest of the body: the request is answered, not dropped.
    in_flight.write_all(rest).unwrap();
    let (status, answer) = read_response(&mut in_flight)
        .unwrap_or_else(|e| panic!("the in-flight request was dropped: {e}\n{}", service.log()));
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains(r#""written":1"#), "{answer}");

    let status = service
        .wait_exit(DRAIN_LIMIT)
        .unwrap_or_else(|| panic!("still running after the drain limit:\n{}", service.log()));
    let took = signalled.elapsed();
    assert!(status.success(), "exit status {status}:\n{}", service.log());
    assert!(
        took < Duration::from_secs(5),
        "shutdown took {took:?} although the request in flight finished at once"
    );
    eprintln!("drained and exited in {took:?} after SIGTERM");
    assert!(snapshot.join("namelist.redb").exists());

    // A new process on the same data directory still lists both entries.
    let service = Service::start(dir.path(), &snapshot);
    for value in ["before", "in-flight"] {
        let (status, body) =
            service.request("GET", &format!("/v1/lists/black/entries/uid/{value}"), "");
        assert_eq!(status, 200, "{body}");
        assert!(body.contains(r#""listed":true"#), "{value}: {body}");
    }
    let (_, body) = service.request("GET", "/v1/lists/black/entries/uid/never", "");
    assert!(body.contains(r#""listed":false"#), "{body}");
}

#[test]
fn sigterm_with_no_traffic_exits_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("data");
    let mut service = Service::start(dir.path(), &snapshot);
    let (status, body) = service.request("GET", "/readyz", "");
    assert_eq!(status, 200, "{body}");

    let signalled = Instant::now();
    service.sigterm();
    let status = service
        .wait_exit(Duration::from_secs(2))
        .unwrap_or_else(|| panic!("not exited 2 s after SIGTERM:\n{}", service.log()));
    assert!(status.success(), "exit status {status}:\n{}", service.log());
    eprintln!("exited in {:?} after SIGTERM", signalled.elapsed());
}
