//! Hostile callers, on the real application and a real `redis-server`:
//!
//! - a corpus of malformed and hostile bodies (truncated JSON, huge numbers, deep nesting,
//!   invalid UTF-8, wrong types, oversize strings and arrays, duplicate keys, trailing garbage,
//!   lying framing...) sent to every endpoint that takes a body. Every answer must be the exact
//!   status decided for the case (4xx for a caller's mistake, never a 5xx), errors in the
//!   API.md shape, within a few seconds, and a rejected request must leave the Redis dataset
//!   (`DEBUG DIGEST`) unchanged. The corpus runs against the `namelist` binary in a child
//!   process, so that a case that crashes the service (a stack overflow aborts the process) is
//!   reported as that case's failure and the run goes on with a fresh server;
//! - network-slow clients (slowloris: headers or bodies dripped a byte at a time, idle
//!   connections, a client that never reads its responses) while normal traffic must still be
//!   served, exactly (how fast it is then: `cargo bench --bench slow_clients`);
//! - acknowledged writes under hostile traffic and dropped Redis connections
//!   (`CLIENT KILL TYPE normal`): every write answered 200 is there afterwards.
//!
//! The tests of this file run one at a time (they time the server's cut-off of slow clients
//! on a small machine).

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{RedisServer, ServiceBuilder, ServiceProcess, redis_settings, spawn_app};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;

/// One test of this file at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Every corpus answer must come within this.
const CASE_TIMEOUT: Duration = Duration::from_secs(5);
/// The default body limit (`max_body_bytes`).
const LIMIT: usize = 8 * 1024 * 1024;

// ---------------------------------------------------------------------------------------------
// A raw HTTP/1.1 client: exact bytes on the wire, framing under the test's control.
// ---------------------------------------------------------------------------------------------

/// How a request body is framed on the wire.
#[derive(Clone, Debug)]
enum Framing {
    /// An honest `Content-Length`.
    Length,
    /// `Transfer-Encoding: chunked`, chunks of this size.
    Chunked(usize),
    /// Neither `Content-Length` nor `Transfer-Encoding`: the body bytes follow the head anyway.
    NoLength,
    /// `Content-Length: <this text>` whatever the body's real length (a lie, or not a number).
    Declared(String),
    /// `Content-Length: <n>`, the body (shorter), then the client shuts its sending side.
    DeclaredThenHalfClose(usize),
    /// These header lines (each ending in CRLF) instead of any framing of ours, body as is.
    Custom(String),
    /// `Custom`, then the client shuts its sending side.
    CustomThenHalfClose(String),
}

/// A parsed response.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn decode_chunked(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = find(rest, b"\r\n")?;
        let line = std::str::from_utf8(&rest[..line_end]).ok()?;
        let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        if rest.len() < size + 2 {
            return None;
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

/// The first complete response in `buf` (`eof`: nothing more will come).
fn parse_reply(buf: &[u8], eof: bool) -> Option<Reply> {
    let end = find(buf, b"\r\n\r\n")?;
    let head = std::str::from_utf8(&buf[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let rest = &buf[end + 4..];
    let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let body = if let Some(n) = get("content-length") {
        let n: usize = n.parse().ok()?;
        if rest.len() < n {
            return None;
        }
        rest[..n].to_vec()
    } else if get("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
        decode_chunked(rest)?
    } else if eof {
        rest.to_vec()
    } else {
        return None;
    };
    Some(Reply {
        status,
        headers,
        body,
    })
}

async fn write_request(
    wr: &mut OwnedWriteHalf,
    head: &[u8],
    body: &[u8],
    framing: &Framing,
) -> std::io::Result<()> {
    wr.write_all(head).await?;
    match framing {
        Framing::Chunked(n) => {
            for chunk in body.chunks((*n).max(1)) {
                wr.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                    .await?;
                wr.write_all(chunk).await?;
                wr.write_all(b"\r\n").await?;
            }
            wr.write_all(b"0\r\n\r\n").await?;
        }
        _ => wr.write_all(body).await?,
    }
    if matches!(
        framing,
        Framing::DeclaredThenHalfClose(_) | Framing::CustomThenHalfClose(_)
    ) {
        wr.shutdown().await?;
    }
    wr.flush().await
}

/// Sends one request (`Connection: close`) and reads the first response. The body is written
/// while the response is read, so an early answer (a 413 before the body is read) is seen.
async fn exchange(
    port: u16,
    method: &str,
    path: &str,
    body: Arc<Vec<u8>>,
    framing: Framing,
) -> Result<Reply, String> {
    let stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut rd, mut wr) = stream.into_split();
    let mut head =
        format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    match &framing {
        Framing::Length => {
            head += &format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            )
        }
        Framing::Chunked(_) => {
            head += "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
        }
        Framing::NoLength => head += "Content-Type: application/json\r\n",
        Framing::Declared(v) => {
            head += &format!("Content-Type: application/json\r\nContent-Length: {v}\r\n")
        }
        Framing::DeclaredThenHalfClose(n) => {
            head += &format!("Content-Type: application/json\r\nContent-Length: {n}\r\n")
        }
        Framing::Custom(h) | Framing::CustomThenHalfClose(h) => head += h,
    }
    head += "\r\n";
    let writer = tokio::spawn(async move {
        let _ = write_request(&mut wr, head.as_bytes(), &body, &framing).await;
        wr // kept open until the response is read
    });
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let mut error = None;
    let reply = loop {
        if let Some(r) = parse_reply(&buf, false) {
            break Some(r);
        }
        match rd.read(&mut chunk).await {
            Ok(0) => break parse_reply(&buf, true),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => {
                error = Some(e);
                break parse_reply(&buf, true);
            }
        }
    };
    writer.abort();
    reply.ok_or_else(|| {
        format!(
            "no response: connection {} after {} bytes {:?}",
            error.map_or("closed".to_owned(), |e| format!("failed ({e})")),
            buf.len(),
            String::from_utf8_lossy(&buf[..buf.len().min(120)])
        )
    })
}

async fn send_json(port: u16, method: &str, path: &str, body: &Value) -> Reply {
    exchange(
        port,
        method,
        path,
        Arc::new(serde_json::to_vec(body).unwrap()),
        Framing::Length,
    )
    .await
    .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// The service in a child process: a crash is a failed case, not the end of the test run.
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// The corpus.
// ---------------------------------------------------------------------------------------------

/// What a case must get back.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// Exactly this status; an error in the API.md shape with this code (`None`: any code).
    Is(u16, Option<&'static str>),
    /// One of these statuses (the contract leaves the choice open); errors in the API.md shape.
    OneOf(&'static [u16]),
    /// Refused by the HTTP layer (malformed framing): this status, any body.
    Protocol(u16),
}

struct Case {
    label: String,
    method: &'static str,
    path: String,
    body: Arc<Vec<u8>>,
    framing: Framing,
    expect: Expect,
}

/// JSON value kinds, for wrong-type substitutions.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Null,
    Bool,
    Int,
    Float,
    Str,
    Arr,
    Obj,
}

const KINDS: [(Kind, &str); 7] = [
    (Kind::Null, "null"),
    (Kind::Bool, "true"),
    (Kind::Int, "7"),
    (Kind::Float, "1.5"),
    (Kind::Str, "\"x\""),
    (Kind::Arr, "[\"x\"]"),
    (Kind::Obj, "{\"x\":\"y\"}"),
];

fn kind_of(v: &Value) -> Kind {
    match v {
        Value::Null => Kind::Null,
        Value::Bool(_) => Kind::Bool,
        Value::Number(n) if n.is_f64() => Kind::Float,
        Value::Number(_) => Kind::Int,
        Value::String(_) => Kind::Str,
        Value::Array(_) => Kind::Arr,
        Value::Object(_) => Kind::Obj,
    }
}

/// What numbers mean in a slot.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Num {
    /// Not a number (a string, a container): any number is a 400.
    Text,
    /// `ttl_seconds`: u64, at least 1, not past 2156.
    Ttl,
    /// An event's `ts`: i64 ms, not negative, at most 5 minutes ahead.
    Ts,
    /// `at` of features: any i64.
    At,
    /// A numeric field of an aggregated amount: at most 4 decimal places, at most 9e11.
    Amount,
    /// A group-by field value: any JSON number, kept as its text.
    Group,
}

/// A place in an endpoint's example body.
struct Slot {
    ptr: &'static str,
    /// Kinds that make a valid request there (200).
    accepts: &'static [Kind],
    /// The error code of a value of the wrong kind there (`None`: more than one applies).
    code: Option<&'static str>,
    num: Num,
}

fn slot(ptr: &'static str, accepts: &'static [Kind], num: Num) -> Slot {
    let raw_field = matches!(num, Num::Group | Num::Amount);
    Slot {
        ptr,
        accepts,
        code: if raw_field {
            None
        } else {
            Some("invalid_body")
        },
        num,
    }
}

struct Endpoint {
    name: &'static str,
    method: &'static str,
    path: &'static str,
    example: Value,
    slots: Vec<Slot>,
}

impl Endpoint {
    fn case(&self, label: impl std::fmt::Display, body: Vec<u8>, expect: Expect) -> Case {
        self.shared(label, Arc::new(body), Framing::Length, expect)
    }

    fn shared(
        &self,
        label: impl std::fmt::Display,
        body: Arc<Vec<u8>>,
        framing: Framing,
        expect: Expect,
    ) -> Case {
        Case {
            label: format!("{} {}: {label}", self.method, self.path),
            method: self.method,
            path: self.path.to_owned(),
            body,
            framing,
            expect,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&self.example).unwrap()
    }
}

const MARK: &str = "\u{1}HOSTILE-VALUE\u{1}";
const KEY_MARK: &str = "\u{1}HOSTILE-KEY\u{1}";

fn replace_once(bytes: &[u8], needle: &str, raw: &[u8]) -> Vec<u8> {
    let needle = serde_json::to_vec(&Value::String(needle.into())).unwrap();
    let at = find(bytes, &needle).expect("marker in the body");
    [&bytes[..at], raw, &bytes[at + needle.len()..]].concat()
}

/// The example with the value at `ptr` replaced by these raw bytes (any bytes at all).
fn splice(example: &Value, ptr: &str, raw: &[u8]) -> Vec<u8> {
    let mut v = example.clone();
    *v.pointer_mut(ptr)
        .unwrap_or_else(|| panic!("{ptr} in {example}")) = Value::String(MARK.into());
    replace_once(&serde_json::to_vec(&v).unwrap(), MARK, raw)
}

/// The example with one more member in the object at `ptr`: raw key bytes, raw value bytes.
fn splice_member(example: &Value, ptr: &str, raw_key: &[u8], raw_value: &[u8]) -> Vec<u8> {
    let mut v = example.clone();
    v.pointer_mut(ptr)
        .and_then(Value::as_object_mut)
        .unwrap_or_else(|| panic!("object {ptr} in {example}"))
        .insert(KEY_MARK.into(), Value::String(MARK.into()));
    let bytes = replace_once(&serde_json::to_vec(&v).unwrap(), KEY_MARK, raw_key);
    replace_once(&bytes, MARK, raw_value)
}

fn deep_array(depth: usize) -> Vec<u8> {
    let mut v = "[".repeat(depth).into_bytes();
    v.extend("]".repeat(depth).bytes());
    v
}

fn deep_object(depth: usize) -> Vec<u8> {
    let mut v = "{\"a\":".repeat(depth).into_bytes();
    v.extend(b"1");
    v.extend("}".repeat(depth).bytes());
    v
}

fn quoted(s: &str) -> Vec<u8> {
    serde_json::to_vec(s).unwrap()
}

/// Numbers, and the status an amount of that text gets.
const NUMBERS: &[(&str, u16)] = &[
    ("1e400", 400),
    ("-1e400", 400),
    ("1E400", 400),
    ("1e-400", 400),
    ("4.9e-324", 400),
    ("123456789012345678901234567890", 400),
    ("-123456789012345678901234567890", 400),
    ("1.7976931348623157e309", 400),
    ("1.7976931348623157e308", 400),
    ("18446744073709551615", 400),
    ("18446744073709551616", 400),
    ("9223372036854775807", 400),
    ("-9223372036854775808", 400),
    ("-9223372036854775809", 400),
    ("0", 200),
    ("-0", 200),
    ("-1", 200),
    ("1", 200),
    ("86400", 200),
    ("1e2", 200),
    ("1E+2", 200),
    ("1.0", 200),
    ("0.0001", 200),
    ("0.00001", 400),
    ("1e-5", 400),
    ("900000000000", 200),
    ("900000000000.0001", 400),
    ("1e2147483647", 400),
    ("1e2147483648", 400),
    ("1e-2147483648", 400),
    ("1.0000e-2147483648", 400),
    ("0.1e-2147483648", 400),
    ("0e2147483647", 200),
    ("1e9223372036854775807", 400),
    ("1e-9223372036854775808", 400),
    ("0.00001e-9223372036854775808", 400),
    ("1e99999999999999999999", 400),
];

/// Texts that are not JSON numbers at all.
const NOT_NUMBERS: &[&str] = &[
    "NaN",
    "-NaN",
    "Infinity",
    "-Infinity",
    "inf",
    "01",
    "-01",
    "1.",
    "-",
    "+1",
    ".5",
    "0x10",
    "1e",
    "1e+",
    "--1",
    "1_000",
    "1,5",
    "\u{661}\u{662}\u{663}",
    "\u{ff11}\u{ff12}\u{ff13}",
];

fn number_status(num: Num, text: &str, amount: u16, now: i64) -> u16 {
    match num {
        Num::Text => 400,
        Num::Group => 200,
        Num::Amount => amount,
        // serde_json reads `-0` as the float -0.0 (to keep its sign): not an integer.
        Num::Ttl | Num::Ts | Num::At if text == "-0" => 400,
        Num::Ttl => match text.parse::<u64>() {
            Ok(n) if (1..=3_000_000_000).contains(&n) => 200,
            _ => 400,
        },
        Num::Ts => match text.parse::<i64>() {
            Ok(t) if t >= 0 && t <= now + 300_000 => 200,
            _ => 400,
        },
        Num::At => {
            if text.parse::<i64>().is_ok() {
                200
            } else {
                400
            }
        }
    }
}

/// Invalid UTF-8 inside a JSON string (quotes included).
const BAD_UTF8: &[(&str, &[u8])] = &[
    ("byte ff", b"\"\xff\""),
    ("lone continuation byte", b"\"a\x80b\""),
    ("overlong slash", b"\"u\xc0\xafx\""),
    ("overlong nul", b"\"\xc0\x80\""),
    ("utf-8 encoded surrogate", b"\"\xed\xa0\x80\""),
    ("5-byte sequence", b"\"\xf8\x88\x80\x80\x80\""),
    ("truncated sequence", b"\"\xe2\x82\""),
    ("beyond U+10FFFF", b"\"\xf4\x90\x80\x80\""),
];

/// Escapes that name no Unicode scalar value.
const SURROGATES: &[&str] = &[
    r#""\ud800""#,
    r#""\udc00""#,
    r#""x\ud800y""#,
    r#""\ud800\u0041""#,
    r#""\udbff\udbff""#,
];

fn endpoints(now: i64) -> Vec<Endpoint> {
    use Kind::*;
    let entries = "/v1/lists/black/entries";
    vec![
        Endpoint {
            name: "upsert",
            method: "POST",
            path: entries,
            example: json!({"entries": [{"dimension": "uid", "value": "u-new", "sandbox": "loan",
                "ttl_seconds": 86400, "reason": "hostile corpus"}]}),
            slots: vec![
                slot("/entries", &[Arr], Num::Text),
                slot("/entries/0", &[Obj], Num::Text),
                slot("/entries/0/dimension", &[Str], Num::Text),
                slot("/entries/0/value", &[Str], Num::Text),
                slot("/entries/0/sandbox", &[Str, Null], Num::Text),
                slot("/entries/0/ttl_seconds", &[Int, Null], Num::Ttl),
                slot("/entries/0/reason", &[Str, Null], Num::Text),
            ],
        },
        Endpoint {
            name: "delete",
            method: "DELETE",
            path: entries,
            example: json!({"entries": [{"dimension": "uid", "value": "u-absent", "sandbox": "loan"}]}),
            slots: vec![
                slot("/entries", &[Arr], Num::Text),
                slot("/entries/0", &[Obj], Num::Text),
                slot("/entries/0/dimension", &[Str], Num::Text),
                slot("/entries/0/value", &[Str], Num::Text),
                slot("/entries/0/sandbox", &[Str, Null], Num::Text),
            ],
        },
        Endpoint {
            name: "check",
            method: "POST",
            path: "/v1/check",
            example: json!({"sandbox": "loan", "lists": ["black", "grey"],
                "subjects": {"uid": "u1", "device": ["d1", "d2"]}}),
            slots: vec![
                slot("/sandbox", &[Str, Null], Num::Text),
                slot("/lists", &[Arr], Num::Text),
                slot("/lists/0", &[Str], Num::Text),
                slot("/subjects", &[Obj], Num::Text),
                slot("/subjects/uid", &[Str, Arr], Num::Text),
                slot("/subjects/device", &[Str, Arr], Num::Text),
                slot("/subjects/device/0", &[Str], Num::Text),
            ],
        },
        Endpoint {
            name: "lookup",
            method: "POST",
            path: "/v1/lists/-/lookup",
            example: json!({"dimension": "uid", "value": "u-absent", "sandbox": "loan"}),
            slots: vec![
                slot("/dimension", &[Str], Num::Text),
                slot("/value", &[Str], Num::Text),
                slot("/sandbox", &[Str, Null], Num::Text),
            ],
        },
        Endpoint {
            name: "events",
            method: "POST",
            path: "/v1/events",
            example: json!({"id": "evt-hostile", "type": "transaction", "ts": now - 1000,
                "fields": {"device_id": "d1", "amount": 12.5}}),
            slots: vec![
                slot("/id", &[Str, Null], Num::Text),
                slot("/type", &[Str], Num::Text),
                slot("/ts", &[Int, Null], Num::Ts),
                slot("/fields", &[Obj], Num::Text),
                slot("/fields/device_id", &[Null, Int, Float, Str], Num::Group),
                slot("/fields/amount", &[Null, Int, Float], Num::Amount),
            ],
        },
        Endpoint {
            name: "features",
            method: "POST",
            path: "/v1/features",
            example: json!({"metrics": ["m1", "amt"], "fields": {"device_id": "d1"}, "at": now}),
            slots: vec![
                slot("/metrics", &[Arr], Num::Text),
                slot("/metrics/0", &[Str], Num::Text),
                slot("/fields", &[Obj], Num::Text),
                slot("/fields/device_id", &[Int, Float, Str], Num::Group),
                slot("/at", &[Int, Null], Num::At),
            ],
        },
        Endpoint {
            name: "evaluate",
            method: "POST",
            path: "/v1/evaluate",
            example: json!({"sandbox": "loan", "lists": ["black"], "subjects": {"uid": "u1"},
                "event": {"type": "transaction", "fields": {"device_id": "d1", "amount": 2.5}},
                "fields": {"device_id": "d1"}, "metrics": ["m1"], "rules": ["r1"]}),
            slots: vec![
                slot("/sandbox", &[Str, Null], Num::Text),
                slot("/lists", &[Arr], Num::Text),
                slot("/lists/0", &[Str], Num::Text),
                slot("/subjects", &[Obj], Num::Text),
                slot("/subjects/uid", &[Str, Arr], Num::Text),
                slot("/event", &[Obj, Null], Num::Text),
                slot("/event/type", &[Str], Num::Text),
                slot("/event/fields", &[Obj], Num::Text),
                slot(
                    "/event/fields/device_id",
                    &[Null, Int, Float, Str],
                    Num::Group,
                ),
                slot("/event/fields/amount", &[Null, Int, Float], Num::Amount),
                slot("/fields", &[Obj], Num::Text),
                slot("/fields/device_id", &[Null, Int, Float, Str], Num::Group),
                slot("/metrics", &[Arr], Num::Text),
                slot("/metrics/0", &[Str], Num::Text),
                slot("/rules", &[Arr], Num::Text),
                slot("/rules/0", &[Str], Num::Text),
            ],
        },
        Endpoint {
            name: "metric",
            method: "PUT",
            path: "/v1/metrics/m1",
            example: json!({"expr": "COUNT(7d, transaction) BY device_id", "resolution": "1h"}),
            slots: vec![
                slot("/expr", &[Str], Num::Text),
                slot("/resolution", &[Str, Null], Num::Text),
            ],
        },
        Endpoint {
            name: "rule",
            method: "PUT",
            path: "/v1/rules/r1",
            example: json!({"expr": "m1 > 3 AND amt >= 10"}),
            slots: vec![slot("/expr", &[Str], Num::Text)],
        },
    ]
}

/// The whole corpus, generated.
fn corpus(now: i64) -> Vec<Case> {
    let eps = endpoints(now);
    let mut out = Vec::new();
    for ep in &eps {
        truncations(ep, &mut out);
        syntax(ep, &mut out);
        wrong_types(ep, &mut out);
        numbers(ep, now, &mut out);
        nesting(ep, &mut out);
        utf8(ep, &mut out);
        oversize(ep, &mut out);
    }
    framing(&eps, &mut out);
    huge_arrays(&mut out);
    hand_written(&eps, &mut out);
    out
}

const BAD_JSON: Expect = Expect::Is(400, Some("invalid_json"));
const BAD_BODY: Expect = Expect::Is(400, Some("invalid_body"));
const BAD: Expect = Expect::Is(400, None);
const OK: Expect = Expect::Is(200, None);

/// Every proper prefix of the example: never valid JSON.
fn truncations(ep: &Endpoint, out: &mut Vec<Case>) {
    let full = ep.bytes();
    for n in 0..full.len() {
        out.push(ep.case(
            format_args!("truncated at byte {n} of {}", full.len()),
            full[..n].to_vec(),
            BAD_JSON,
        ));
    }
}

/// Empty, whitespace, BOM, comments, trailing garbage, not-an-object, duplicate keys.
fn syntax(ep: &Endpoint, out: &mut Vec<Case>) {
    let body = ep.bytes();
    let text = String::from_utf8(body.clone()).unwrap();
    let cat = |a: &[u8], b: &[u8]| [a, b].concat();
    let cases: Vec<(&str, Vec<u8>, Expect)> = vec![
        ("empty body", Vec::new(), BAD_JSON),
        ("whitespace only", b" \t\r\n  ".to_vec(), BAD_JSON),
        (
            "a BOM before the body",
            cat(b"\xef\xbb\xbf", &body),
            BAD_JSON,
        ),
        ("a BOM alone", b"\xef\xbb\xbf".to_vec(), BAD_JSON),
        (
            "UTF-16LE with BOM",
            {
                let mut v = vec![0xff, 0xfe];
                v.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
                v
            },
            BAD_JSON,
        ),
        ("trailing garbage", cat(&body, b" x"), BAD_JSON),
        ("a second document", cat(&body, b"{}"), BAD_JSON),
        ("the body twice", cat(&body, &body), BAD_JSON),
        ("a stray bracket", cat(&body, b"]"), BAD_JSON),
        ("a trailing NUL", cat(&body, b"\0"), BAD_JSON),
        ("a leading NUL", cat(b"\0", &body), BAD_JSON),
        ("a block comment before", cat(b"/* c */", &body), BAD_JSON),
        ("a line comment after", cat(&body, b" // c"), BAD_JSON),
        ("a hash comment before", cat(b"# c\n", &body), BAD_JSON),
        (
            "a comment inside",
            text.replacen('{', "{/* c */", 1).into_bytes(),
            BAD_JSON,
        ),
        (
            "a trailing comma",
            {
                let mut t = text.clone();
                t.insert(t.len() - 1, ',');
                t.into_bytes()
            },
            BAD_JSON,
        ),
        (
            "single quotes",
            text.replace('"', "'").into_bytes(),
            BAD_JSON,
        ),
        (
            "unquoted keys",
            {
                let first_key = text[2..].split('"').next().unwrap().to_owned();
                text.replacen(&format!("\"{first_key}\""), &first_key, 1)
                    .into_bytes()
            },
            BAD_JSON,
        ),
        (
            "a form feed as whitespace",
            text.replacen('{', "{\x0c", 1).into_bytes(),
            BAD_JSON,
        ),
        (
            "a vertical tab as whitespace",
            text.replacen('{', "{\x0b", 1).into_bytes(),
            BAD_JSON,
        ),
        (
            "a no-break space as whitespace",
            text.replacen('{', "{\u{a0}", 1).into_bytes(),
            BAD_JSON,
        ),
        (
            "an ideographic space as whitespace",
            text.replacen('{', "{\u{3000}", 1).into_bytes(),
            BAD_JSON,
        ),
        ("an open brace alone", b"{".to_vec(), BAD_JSON),
        ("a close brace alone", b"}".to_vec(), BAD_JSON),
        ("ten thousand open braces", vec![b'{'; 10_000], BAD_JSON),
        ("array body", b"[]".to_vec(), BAD_BODY),
        ("null body", b"null".to_vec(), BAD_BODY),
        ("number body", b"0".to_vec(), BAD_BODY),
        ("string body", b"\"s\"".to_vec(), BAD_BODY),
        ("bool body", b"true".to_vec(), BAD_BODY),
        (
            "the body inside an array",
            [b"[", &body[..], b"]"].concat(),
            BAD_BODY,
        ),
        (
            "an unknown member",
            splice_member(&ep.example, "", b"\"x\"", b"1"),
            BAD_BODY,
        ),
        (
            "an empty key",
            splice_member(&ep.example, "", b"\"\"", b"1"),
            BAD_BODY,
        ),
        (
            "the body with surrounding whitespace",
            [b"\r\n\t ", &body[..], b" \n"].concat(),
            OK,
        ),
        (
            "the body, pretty-printed",
            serde_json::to_vec_pretty(&ep.example).unwrap(),
            OK,
        ),
    ];
    for (label, body, expect) in cases {
        out.push(ep.case(label, body, expect));
    }
    // `{}`: only evaluate has nothing required.
    out.push(ep.case(
        "empty object",
        b"{}".to_vec(),
        if ep.name == "evaluate" { OK } else { BAD_BODY },
    ));
    // A member given twice: a struct field is refused; events are read as a map first, where
    // the last one wins.
    let first_key = ep
        .example
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    let first_value = serde_json::to_vec(&ep.example[&first_key]).unwrap();
    out.push(ep.case(
        format_args!("member {first_key:?} given twice"),
        splice_member(&ep.example, "", &quoted(&first_key), &first_value),
        if ep.name == "events" { OK } else { BAD_BODY },
    ));
}

/// Every slot, and the whole body, given a value of every other JSON kind.
fn wrong_types(ep: &Endpoint, out: &mut Vec<Case>) {
    for (kind, raw) in KINDS {
        if kind != Kind::Obj {
            out.push(ep.case(
                format_args!("whole body {raw}"),
                raw.as_bytes().to_vec(),
                BAD_BODY,
            ));
        }
    }
    for s in &ep.slots {
        let own = kind_of(ep.example.pointer(s.ptr).unwrap());
        for (kind, raw) in KINDS {
            if kind == own {
                continue;
            }
            let expect = if s.accepts.contains(&kind) {
                OK
            } else {
                Expect::Is(400, s.code)
            };
            out.push(ep.case(
                format_args!("{} = {raw}", s.ptr),
                splice(&ep.example, s.ptr, raw.as_bytes()),
                expect,
            ));
        }
    }
}

/// Huge, tiny, out-of-range and not-quite numbers in every slot.
fn numbers(ep: &Endpoint, now: i64, out: &mut Vec<Case>) {
    for s in &ep.slots {
        if s.num == Num::Text {
            for raw in ["1e400", "123456789012345678901234567890", "-0", "7"] {
                out.push(ep.case(
                    format_args!("{} = {raw}", s.ptr),
                    splice(&ep.example, s.ptr, raw.as_bytes()),
                    BAD,
                ));
            }
            for raw in ["NaN", "Infinity", "01", "+1"] {
                out.push(ep.case(
                    format_args!("{} = {raw}", s.ptr),
                    splice(&ep.example, s.ptr, raw.as_bytes()),
                    BAD_JSON,
                ));
            }
            continue;
        }
        for (raw, amount) in NUMBERS {
            let status = number_status(s.num, raw, *amount, now);
            let expect = if s.num == Num::Amount && *raw == "0e2147483647" {
                // Zero either way; refusing the exponent is as fair as reading 0.
                Expect::OneOf(&[200, 400])
            } else {
                Expect::Is(status, None)
            };
            out.push(ep.case(
                format_args!("{} = {raw}", s.ptr),
                splice(&ep.example, s.ptr, raw.as_bytes()),
                expect,
            ));
        }
        for raw in NOT_NUMBERS {
            out.push(ep.case(
                format_args!("{} = {raw}", s.ptr),
                splice(&ep.example, s.ptr, raw.as_bytes()),
                BAD_JSON,
            ));
        }
    }
}

/// 10,000-deep arrays and objects as the body and in every slot; 1,000,000-deep where a value
/// is kept as raw JSON.
fn nesting(ep: &Endpoint, out: &mut Vec<Case>) {
    let arr = deep_array(10_000);
    let obj = deep_object(10_000);
    out.push(ep.case("body nested 10,000 deep in arrays", arr.clone(), BAD));
    out.push(ep.case("body nested 10,000 deep in objects", obj.clone(), BAD));
    out.push(ep.case("body of 10,000 unclosed brackets", vec![b'['; 10_000], BAD));
    out.push(ep.case("body nested 1,000,000 deep", deep_array(1_000_000), BAD));
    for s in &ep.slots {
        out.push(ep.case(
            format_args!("{} nested 10,000 deep in arrays", s.ptr),
            splice(&ep.example, s.ptr, &arr),
            BAD,
        ));
        out.push(ep.case(
            format_args!("{} nested 10,000 deep in objects", s.ptr),
            splice(&ep.example, s.ptr, &obj),
            BAD,
        ));
        if matches!(s.num, Num::Group | Num::Amount) {
            out.push(ep.case(
                format_args!("{} nested 1,000,000 deep", s.ptr),
                splice(&ep.example, s.ptr, &deep_array(1_000_000)),
                BAD,
            ));
            out.push(ep.case(
                format_args!("{} nested 100,000 deep in objects", s.ptr),
                splice(&ep.example, s.ptr, &deep_object(100_000)),
                BAD,
            ));
        }
    }
}

/// Invalid UTF-8 and lone surrogate escapes in every string value and in keys.
fn utf8(ep: &Endpoint, out: &mut Vec<Case>) {
    for s in &ep.slots {
        if kind_of(ep.example.pointer(s.ptr).unwrap()) != Kind::Str {
            continue;
        }
        for (label, raw) in BAD_UTF8 {
            out.push(ep.case(
                format_args!("{} = {label}", s.ptr),
                splice(&ep.example, s.ptr, raw),
                BAD_JSON,
            ));
        }
        for raw in SURROGATES {
            out.push(ep.case(
                format_args!("{} = {raw}", s.ptr),
                splice(&ep.example, s.ptr, raw.as_bytes()),
                BAD,
            ));
        }
    }
    let mut objects = vec![""];
    objects.extend(
        ep.slots
            .iter()
            .filter(|s| kind_of(ep.example.pointer(s.ptr).unwrap()) == Kind::Obj)
            .map(|s| s.ptr),
    );
    for ptr in objects {
        for (label, raw) in BAD_UTF8.iter().take(3) {
            let key: &[u8] = raw;
            out.push(ep.case(
                format_args!("key in {ptr:?} = {label}"),
                splice_member(&ep.example, ptr, key, b"\"v\""),
                BAD_JSON,
            ));
        }
        out.push(ep.case(
            format_args!("key in {ptr:?} = lone surrogate"),
            splice_member(&ep.example, ptr, br#""\ud800""#, b"\"v\""),
            BAD_JSON,
        ));
        out.push(ep.case(
            format_args!("invalid UTF-8 between members of {ptr:?}"),
            splice_member(&ep.example, ptr, b"\xff\"k\"", b"1"),
            BAD_JSON,
        ));
    }
}

/// Raw control characters in strings, a 1 MiB value in every string slot, a 100 KiB key.
fn oversize(ep: &Endpoint, out: &mut Vec<Case>) {
    let mib = quoted(&"a".repeat(1 << 20));
    for s in &ep.slots {
        if kind_of(ep.example.pointer(s.ptr).unwrap()) != Kind::Str {
            continue;
        }
        // A group-by value longer than an event may carry can never have been counted:
        // reading it may be refused or read as nothing.
        let expect = if s.num == Num::Group {
            Expect::OneOf(&[200, 400])
        } else if s.ptr.starts_with("/subjects/") {
            // A subject value that fails its rule is reported in `invalid`, not a 400: the
            // other values are checked (API.md, `strict` keeps the 400).
            Expect::Is(200, None)
        } else {
            BAD
        };
        out.push(ep.case(
            format_args!("{} = 1 MiB string", s.ptr),
            splice(&ep.example, s.ptr, &mib),
            expect,
        ));
        for (label, raw) in [
            ("raw control character", b"\"a\x01b\"".as_slice()),
            ("raw newline", b"\"a\nb\""),
            ("raw tab", b"\"a\tb\""),
            ("raw NUL", b"\"a\0b\""),
            ("invalid escape", br#""a\xb""#),
            ("short unicode escape", br#""a\u12""#),
            ("unterminated string", b"\"abc"),
        ] {
            out.push(ep.case(
                format_args!("{} = {label}", s.ptr),
                splice(&ep.example, s.ptr, raw),
                BAD_JSON,
            ));
        }
    }
    out.push(ep.case(
        "a 100 KiB unknown key",
        splice_member(&ep.example, "", &quoted(&"k".repeat(100 << 10)), b"1"),
        BAD_BODY,
    ));
    out.push(ep.case(
        "100,000 unknown members",
        {
            let mut o = ep.example.as_object().unwrap().clone();
            for i in 0..100_000 {
                o.insert(format!("x{i}"), json!(1));
            }
            serde_json::to_vec(&o).unwrap()
        },
        BAD_BODY,
    ));
}

/// The body limit, honest and lying framing.
fn framing(eps: &[Endpoint], out: &mut Vec<Case>) {
    // `{"x":"aaa...a"}`, exactly `len` bytes.
    let filler = |len: usize| {
        let mut v = b"{\"x\":\"".to_vec();
        v.resize(len - 2, b'a');
        v.extend(b"\"}");
        Arc::new(v)
    };
    let at_limit = filler(LIMIT);
    let over = filler(LIMIT + 1);
    let too_large = Expect::Is(413, Some("payload_too_large"));
    for ep in eps {
        out.push(ep.shared(
            "body of exactly the limit",
            at_limit.clone(),
            Framing::Length,
            BAD_BODY,
        ));
        out.push(ep.shared(
            "body 1 byte over the limit",
            over.clone(),
            Framing::Length,
            too_large,
        ));
        out.push(ep.shared(
            "body 1 byte over the limit, chunked",
            over.clone(),
            Framing::Chunked(64 << 10),
            too_large,
        ));
        out.push(ep.shared(
            "body 1 byte over the limit, no Content-Length (the body is not read)",
            over.clone(),
            Framing::NoLength,
            BAD_JSON,
        ));
        out.push(ep.shared(
            "body 1 byte over the limit, Content-Length: 100 (a lie)",
            over.clone(),
            Framing::Declared("100".into()),
            BAD,
        ));
        out.push(ep.shared(
            "small body, Content-Length: limit + 1 (a lie)",
            Arc::new(ep.bytes()),
            Framing::Declared((LIMIT + 1).to_string()),
            too_large,
        ));
        out.push(ep.shared(
            "small body, Content-Length: 2^64 (a lie)",
            Arc::new(ep.bytes()),
            Framing::Declared("18446744073709551616".into()),
            Expect::Protocol(400),
        ));
        out.push(ep.shared(
            "body in 1-byte chunks",
            Arc::new(ep.bytes()),
            Framing::Chunked(1),
            OK,
        ));
        out.push(ep.shared(
            "Content-Length 1000, 10 bytes, then the client stops sending",
            Arc::new(ep.bytes()[..10].to_vec()),
            Framing::DeclaredThenHalfClose(1000),
            BAD_JSON,
        ));
    }
    let check = eps.iter().find(|e| e.name == "check").unwrap();
    let body = check.bytes();
    let custom = |headers: String, body: Vec<u8>| (Framing::Custom(headers), Arc::new(body));
    // Framing that leaves the server waiting for more: the client then stops sending, so the
    // server sees the end of the stream (a client that just waits is the slow-body case).
    let cut =
        |headers: String, body: Vec<u8>| (Framing::CustomThenHalfClose(headers), Arc::new(body));
    let chunked_body =
        |size_line: &str| [size_line.as_bytes(), b"\r\n", &body[..], b"\r\n0\r\n\r\n"].concat();
    let n = body.len();
    type Framed = (Framing, Arc<Vec<u8>>);
    let cases: Vec<(&str, Framed, Expect)> = vec![
        (
            "Content-Type text/plain",
            custom(
                format!("Content-Type: text/plain\r\nContent-Length: {n}\r\n"),
                body.clone(),
            ),
            OK,
        ),
        (
            "no Content-Type",
            custom(format!("Content-Length: {n}\r\n"), body.clone()),
            OK,
        ),
        (
            "Content-Type form-urlencoded",
            custom(
                format!(
                    "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {n}\r\n"
                ),
                body.clone(),
            ),
            OK,
        ),
        (
            "Content-Length: abc",
            custom("Content-Length: abc\r\n".into(), body.clone()),
            Expect::Protocol(400),
        ),
        (
            "Content-Length: -5",
            custom("Content-Length: -5\r\n".into(), body.clone()),
            Expect::Protocol(400),
        ),
        (
            "two different Content-Lengths",
            custom(
                format!("Content-Length: {n}\r\nContent-Length: 5\r\n"),
                body.clone(),
            ),
            Expect::Protocol(400),
        ),
        (
            "Content-Length and chunked together",
            custom(
                format!("Content-Length: {n}\r\nTransfer-Encoding: chunked\r\n"),
                chunked_body(&format!("{n:x}")),
            ),
            Expect::Protocol(400),
        ),
        (
            "chunk size not hex",
            custom("Transfer-Encoding: chunked\r\n".into(), chunked_body("zz")),
            BAD_JSON,
        ),
        (
            "chunk size beyond 2^64",
            custom(
                "Transfer-Encoding: chunked\r\n".into(),
                chunked_body("fffffffffffffffffffff"),
            ),
            BAD_JSON,
        ),
        (
            "chunk size larger than the limit",
            cut(
                "Transfer-Encoding: chunked\r\n".into(),
                chunked_body(&format!("{:x}", LIMIT + 1)),
            ),
            BAD,
        ),
        (
            "chunk longer than its size",
            custom("Transfer-Encoding: chunked\r\n".into(), chunked_body("3")),
            BAD,
        ),
        (
            "chunked without the last chunk",
            cut(
                "Transfer-Encoding: chunked\r\n".into(),
                [format!("{n:x}\r\n").as_bytes(), &body[..], b"\r\n"].concat(),
            ),
            BAD,
        ),
        (
            "Transfer-Encoding gzip",
            custom(
                format!("Transfer-Encoding: gzip\r\nContent-Length: {n}\r\n"),
                body.clone(),
            ),
            Expect::Protocol(400),
        ),
    ];
    for (label, (framing, body), expect) in cases {
        out.push(check.shared(label, body, framing, expect));
    }
}

fn json_bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

/// Huge arrays of small items, distinct and repeated.
fn huge_arrays(out: &mut Vec<Case>) {
    const N: usize = 100_000;
    let many = |f: &dyn Fn(usize) -> Value| Value::Array((0..N).map(f).collect());
    let mut push = |method: &'static str, path: &str, label: &str, body: Value, expect: Expect| {
        out.push(Case {
            label: format!("{method} {path}: {label}"),
            method,
            path: path.to_owned(),
            body: Arc::new(json_bytes(&body)),
            framing: Framing::Length,
            expect,
        });
    };
    let entries = "/v1/lists/black/entries";
    let too_many_entries = Expect::Is(400, Some("too_many_entries"));
    push(
        "POST",
        entries,
        "100,000 entries",
        json!({"entries": many(&|i| json!({"dimension": "uid", "value": format!("v{i}")}))}),
        too_many_entries,
    );
    push(
        "POST",
        entries,
        "10,001 entries",
        json!({"entries": (0..10_001).map(|i| json!({"dimension": "uid", "value": format!("v{i}")})).collect::<Vec<_>>()}),
        too_many_entries,
    );
    push(
        "DELETE",
        entries,
        "100,000 entries",
        json!({"entries": many(&|i| json!({"dimension": "uid", "value": format!("v{i}")}))}),
        too_many_entries,
    );
    push(
        "DELETE",
        entries,
        "10,000 absent entries",
        json!({"entries": (0..10_000).map(|i| json!({"dimension": "uid", "value": format!("absent{i}")})).collect::<Vec<_>>()}),
        OK,
    );
    let too_many_values = Expect::Is(400, Some("too_many_values"));
    let bad_lists = Expect::Is(400, Some("invalid_lists"));
    for path in ["/v1/check", "/v1/evaluate"] {
        push(
            "POST",
            path,
            "100,000 distinct subject values",
            json!({"lists": ["black"], "subjects": {"uid": many(&|i| json!(format!("v{i}")))}}),
            too_many_values,
        );
        push(
            "POST",
            path,
            "100,000 copies of one subject value",
            json!({"lists": ["black"], "subjects": {"uid": many(&|_| json!("u1"))}}),
            // "At most 64 values in all", counted as sent.
            too_many_values,
        );
        push(
            "POST",
            path,
            "100,000 custom dimensions",
            json!({"lists": ["black"], "subjects": (0..N).map(|i| (format!("c{i}"), json!("x"))).collect::<serde_json::Map<_, _>>()}),
            too_many_values,
        );
        push(
            "POST",
            path,
            "100,000 distinct lists",
            json!({"lists": many(&|i| json!(format!("l{i}"))), "subjects": {"uid": "u1"}}),
            bad_lists,
        );
        push(
            "POST",
            path,
            "100,000 copies of one list",
            json!({"lists": many(&|_| json!("black")), "subjects": {"uid": "u1"}}),
            bad_lists,
        );
    }
    let event = |i: usize| json!({"type": "transaction", "fields": {"device_id": format!("d{i}")}});
    push(
        "POST",
        "/v1/events",
        "100,000 events",
        json!({"events": many(&event)}),
        Expect::Is(400, Some("too_many_events")),
    );
    push(
        "POST",
        "/v1/events",
        "1,001 events",
        json!({"events": (0..1001).map(event).collect::<Vec<_>>()}),
        Expect::Is(400, Some("too_many_events")),
    );
    push(
        "POST",
        "/v1/events",
        "an event with 100,000 fields",
        json!({"type": "transaction", "fields": (0..N).map(|i| (format!("f{i}"), json!(i))).collect::<serde_json::Map<_, _>>()}),
        OK,
    );
    // Over 64 names in one read: refused before anything is looked up.
    let too_many_names = Expect::Is(400, Some("too_many_names"));
    push(
        "POST",
        "/v1/features",
        "100,000 distinct metric ids",
        json!({"metrics": many(&|i| json!(format!("x{i}"))), "fields": {"device_id": "d1"}}),
        too_many_names,
    );
    push(
        "POST",
        "/v1/features",
        "100,000 copies of one metric id",
        json!({"metrics": many(&|_| json!("m1")), "fields": {"device_id": "d1"}}),
        too_many_names,
    );
    push(
        "POST",
        "/v1/features",
        "100,000 fields",
        json!({"metrics": ["m1"], "fields": (0..N).map(|i| (format!("f{i}"), json!(i))).chain([("device_id".to_owned(), json!("d1"))]).collect::<serde_json::Map<_, _>>()}),
        OK,
    );
    push(
        "POST",
        "/v1/evaluate",
        "100,000 distinct metric ids",
        json!({"metrics": many(&|i| json!(format!("x{i}"))), "fields": {"device_id": "d1"}}),
        too_many_names,
    );
    push(
        "POST",
        "/v1/evaluate",
        "100,000 copies of one metric id",
        json!({"metrics": many(&|_| json!("m1")), "fields": {"device_id": "d1"}}),
        too_many_names,
    );
    push(
        "POST",
        "/v1/evaluate",
        "100,000 distinct rule ids",
        json!({"rules": many(&|i| json!(format!("x{i}"))), "fields": {"device_id": "d1"}}),
        too_many_names,
    );
    push(
        "POST",
        "/v1/evaluate",
        "100,000 copies of one rule id",
        json!({"rules": many(&|_| json!("r1")), "fields": {"device_id": "d1"}}),
        too_many_names,
    );
    push(
        "PUT",
        "/v1/metrics/m1",
        "grouped by 100,000 fields",
        json!({"expr": format!("COUNT(7d, transaction) BY {}", (0..N).map(|i| format!("f{i}")).collect::<Vec<_>>().join(", "))}),
        Expect::OneOf(&[200, 400]),
    );
    push(
        "PUT",
        "/v1/metrics/m1",
        "a window of 100,000 digits",
        json!({"expr": format!("COUNT({}d, transaction) BY device_id", "9".repeat(N))}),
        Expect::Is(400, Some("invalid_expr")),
    );
    push(
        "PUT",
        "/v1/rules/r1",
        "a rule nested 100,000 parentheses deep",
        json!({"expr": format!("{}m1 > 1{}", "(".repeat(N), ")".repeat(N))}),
        Expect::OneOf(&[200, 400]),
    );
    push(
        "PUT",
        "/v1/rules/r1",
        "1,000,000 open parentheses",
        json!({"expr": "(".repeat(1_000_000)}),
        Expect::Is(400, Some("invalid_rule")),
    );
    push(
        "PUT",
        "/v1/rules/r1",
        "100,000 comparisons",
        json!({"expr": vec!["m1 > 1"; N].join(" AND ")}),
        Expect::OneOf(&[200, 400]),
    );
}

/// Identifiers with look-alike and invisible characters, and other hand-picked cases.
fn hand_written(eps: &[Endpoint], out: &mut Vec<Case>) {
    let ep = |name: &str| eps.iter().find(|e| e.name == name).unwrap();
    let upsert = ep("upsert");
    let entry = |dimension: &str, value: &str| {
        json_bytes(
            &json!({"entries": [{"dimension": dimension, "value": value, "sandbox": "loan"}]}),
        )
    };
    let cases: Vec<(&str, Vec<u8>, Expect)> = vec![
        (
            "dimension with a Cyrillic i",
            entry("u\u{456}d", "u1"),
            Expect::Is(400, Some("unknown_dimension")),
        ),
        (
            "dimension with a zero-width joiner",
            entry("uid\u{200d}", "u1"),
            Expect::Is(400, Some("unknown_dimension")),
        ),
        (
            "dimension in capitals",
            entry("UID", "u1"),
            Expect::Is(400, Some("unknown_dimension")),
        ),
        (
            "dimension with a trailing space",
            entry("uid ", "u1"),
            Expect::Is(400, Some("unknown_dimension")),
        ),
        (
            "phone in full-width digits",
            entry("phone", "\u{ff11}\u{ff13}\u{ff18}00000000"),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "phone in Arabic-Indic digits",
            entry(
                "phone",
                "\u{661}\u{663}\u{668}\u{660}\u{660}\u{660}\u{660}\u{660}",
            ),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "id_card with a dotless i",
            entry("id_card", "\u{131}2345"),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "id_card with a long s",
            entry("id_card", "\u{17f}2345"),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "imei in full-width digits",
            entry("imei", &"\u{ff14}".repeat(15)),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "wifi_mac in full-width letters",
            entry("wifi_mac", "\u{ff21}\u{ff21}:bb:cc:dd:ee:ff"),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "ip with full-width digits",
            entry("ip", "\u{ff11}0.1.2.3"),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "ip with a zero-width space",
            entry("ip", "10.1.2.3\u{200b}"),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "ip range /33",
            entry("ip", "10.1.2.0/33"),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "ip range /999999999999",
            entry("ip", "10.1.2.0/999999999999"),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "uid of 257 bytes",
            entry("uid", &"a".repeat(257)),
            Expect::Is(400, Some("invalid_value")),
        ),
        ("uid of 256 bytes", entry("uid", &"a".repeat(256)), OK),
        (
            "uid of 129 two-byte characters (258 bytes)",
            entry("uid", &"\u{e9}".repeat(129)),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "uid of spaces only",
            entry("uid", " \u{3000}\u{a0} "),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "uid with a zero-width joiner",
            entry("uid", "u\u{200d}1"),
            OK,
        ),
        ("uid with an escaped NUL", entry("uid", "u\u{0}x"), OK),
        ("uid with DEL", entry("uid", "u\u{7f}x"), OK),
        (
            "reason of 257 bytes",
            json_bytes(
                &json!({"entries": [{"dimension": "uid", "value": "u1", "reason": "r".repeat(257)}]}),
            ),
            Expect::Is(400, Some("invalid_reason")),
        ),
        (
            "sandbox with a Cyrillic o",
            json_bytes(
                &json!({"entries": [{"dimension": "uid", "value": "u1", "sandbox": "l\u{43e}an"}]}),
            ),
            Expect::Is(400, Some("invalid_sandbox")),
        ),
        (
            "sandbox with a zero-width joiner",
            json_bytes(
                &json!({"entries": [{"dimension": "uid", "value": "u1", "sandbox": "lo\u{200d}an"}]}),
            ),
            Expect::Is(400, Some("invalid_sandbox")),
        ),
        (
            "sandbox of 65 bytes",
            json_bytes(
                &json!({"entries": [{"dimension": "uid", "value": "u1", "sandbox": "s".repeat(65)}]}),
            ),
            Expect::Is(400, Some("invalid_sandbox")),
        ),
        (
            "expires_at and ttl_seconds",
            json_bytes(
                &json!({"entries": [{"dimension": "uid", "value": "u1", "ttl_seconds": 5, "expires_at": 4_102_444_800_000_i64}]}),
            ),
            Expect::Is(400, Some("invalid_expiry")),
        ),
        (
            "expires_at in the past",
            json_bytes(&json!({"entries": [{"dimension": "uid", "value": "u1", "expires_at": 1}]})),
            Expect::Is(400, Some("expiry_in_past")),
        ),
        (
            "expires_at i64::MAX",
            json_bytes(
                &json!({"entries": [{"dimension": "uid", "value": "u1", "expires_at": i64::MAX}]}),
            ),
            Expect::Is(400, Some("invalid_expiry")),
        ),
        (
            "expires_at i64::MIN",
            json_bytes(
                &json!({"entries": [{"dimension": "uid", "value": "u1", "expires_at": i64::MIN}]}),
            ),
            Expect::Is(400, Some("expiry_in_past")),
        ),
        (
            "a valid entry then a bad one",
            json_bytes(
                &json!({"entries": [{"dimension": "uid", "value": "fine"}, {"dimension": "phone", "value": "x"}]}),
            ),
            Expect::Is(400, Some("invalid_value")),
        ),
    ];
    for (label, body, expect) in cases {
        out.push(upsert.case(label, body, expect));
    }
    for (path, code) in [
        ("/v1/lists/bl%D0%B0ck/entries", "invalid_list"),
        ("/v1/lists/black%E2%80%8D/entries", "invalid_list"),
        ("/v1/lists/BLACK/entries", "invalid_list"),
        ("/v1/lists/%FF/entries", "invalid_list"),
        (
            "/v1/lists/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/entries",
            "invalid_list",
        ),
    ] {
        for (method, body) in [("POST", upsert.bytes()), ("DELETE", ep("delete").bytes())] {
            out.push(Case {
                label: format!("{method} {path}"),
                method,
                path: path.to_owned(),
                body: Arc::new(body),
                framing: Framing::Length,
                expect: Expect::Is(400, Some(code)),
            });
        }
    }
    for (path, code) in [
        ("/v1/metrics/m%E2%80%8D1", "invalid_metric_id"),
        ("/v1/metrics/M1", "invalid_metric_id"),
        ("/v1/rules/r%D1%961", "invalid_rule_id"),
    ] {
        let body = if path.contains("rules") {
            json!({"expr": "m1 > 3"})
        } else {
            json!({"expr": "COUNT(7d, transaction) BY device_id"})
        };
        out.push(Case {
            label: format!("PUT {path}"),
            method: "PUT",
            path: path.to_owned(),
            body: Arc::new(json_bytes(&body)),
            framing: Framing::Length,
            expect: Expect::Is(400, Some(code)),
        });
    }
    let check = ep("check");
    for (label, body, expect) in [
        (
            "list with a Cyrillic a",
            json!({"lists": ["bl\u{430}ck"], "subjects": {"uid": "u1"}}),
            Expect::Is(400, Some("invalid_list")),
        ),
        (
            "dimension with a Cyrillic i",
            json!({"lists": ["black"], "subjects": {"u\u{456}d": "u1"}}),
            Expect::Is(400, Some("unknown_dimension")),
        ),
        (
            "an ip range in a check",
            json!({"lists": ["black"], "subjects": {"ip": "10.0.0.0/8"}}),
            Expect::Is(200, None),
        ),
        (
            "an ip range in a strict check",
            json!({"lists": ["black"], "subjects": {"ip": "10.0.0.0/8"}, "strict": true}),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "no lists",
            json!({"lists": [], "subjects": {"uid": "u1"}}),
            Expect::Is(400, Some("invalid_lists")),
        ),
        (
            "17 lists",
            json!({"lists": (0..17).map(|i| format!("l{i}")).collect::<Vec<_>>(), "subjects": {"uid": "u1"}}),
            Expect::Is(400, Some("invalid_lists")),
        ),
        (
            "65 subject values",
            json!({"lists": ["black"], "subjects": {"uid": (0..65).map(|i| format!("v{i}")).collect::<Vec<_>>()}}),
            Expect::Is(400, Some("too_many_values")),
        ),
        (
            "64 subject values",
            json!({"lists": ["black"], "subjects": {"uid": (0..64).map(|i| format!("v{i}")).collect::<Vec<_>>()}}),
            OK,
        ),
    ] {
        out.push(check.case(label, json_bytes(&body), expect));
    }
    out.push(check.case(
        "a dimension given twice in subjects (a map: the last wins)",
        br#"{"lists":["black"],"subjects":{"uid":"u1","uid":"u2"}}"#.to_vec(),
        OK,
    ));
    let events = ep("events");
    for (label, body, expect) in [
        (
            "type with a Cyrillic o",
            json!({"type": "transacti\u{43e}n"}),
            Expect::Is(400, Some("invalid_event_type")),
        ),
        (
            "type with a zero-width joiner",
            json!({"type": "transaction\u{200d}"}),
            Expect::Is(400, Some("invalid_event_type")),
        ),
        (
            "a field name with a Cyrillic i (an unknown field)",
            json!({"type": "transaction", "fields": {"dev\u{456}ce_id": "d1"}}),
            OK,
        ),
        (
            "an event id of 257 bytes",
            json!({"type": "transaction", "id": "e".repeat(257), "fields": {"device_id": "d1"}}),
            Expect::Is(400, Some("invalid_event_id")),
        ),
        (
            "an empty event id",
            json!({"type": "transaction", "id": "", "fields": {"device_id": "d1"}}),
            Expect::Is(400, Some("invalid_event_id")),
        ),
        (
            "a group-by value of 257 bytes",
            json!({"type": "transaction", "fields": {"device_id": "d".repeat(257)}}),
            Expect::Is(400, Some("invalid_field")),
        ),
        (
            "a batch with something beside it",
            json!({"events": [], "type": "transaction"}),
            BAD_BODY,
        ),
        (
            "a batch that is not an array",
            json!({"events": {"type": "transaction"}}),
            BAD_BODY,
        ),
        ("a batch of null", json!({"events": null}), BAD_BODY),
        (
            "a batch with a bad event",
            json!({"events": [{"type": "transaction"}, {"type": 5}]}),
            BAD_BODY,
        ),
        ("an empty batch", json!({"events": []}), OK),
        (
            "ts 10 minutes ahead",
            json!({"type": "transaction", "ts": namelist::domain::now_ms() + 600_000}),
            Expect::Is(400, Some("event_in_future")),
        ),
    ] {
        out.push(events.case(label, json_bytes(&body), expect));
    }
    out.push(
        events.case(
            "a group-by number of 300 digits",
            format!(
                r#"{{"type":"transaction","fields":{{"device_id":{}}}}}"#,
                "9".repeat(300)
            )
            .into_bytes(),
            Expect::Is(400, Some("invalid_field")),
        ),
    );
    let evaluate = ep("evaluate");
    for (label, body, expect) in [
        (
            "subjects without lists",
            json!({"subjects": {"uid": "u1"}}),
            Expect::Is(400, Some("invalid_lists")),
        ),
        (
            "an unknown rule",
            json!({"rules": ["nope"]}),
            Expect::Is(400, Some("unknown_rule")),
        ),
        (
            "an unknown metric",
            json!({"metrics": ["nope"], "fields": {"device_id": "d1"}}),
            Expect::Is(400, Some("unknown_metric")),
        ),
        (
            "a metric without its group-by field",
            json!({"metrics": ["m1"]}),
            Expect::Is(400, Some("missing_field")),
        ),
        (
            "a subject of an object",
            json!({"lists": ["black"], "subjects": {"uid": {"a": 1}}}),
            BAD_BODY,
        ),
        (
            "a subject nested 100 deep",
            json!({"lists": ["black"], "subjects": {"uid": serde_json::from_slice::<Value>(&deep_array(100)).unwrap()}}),
            BAD_BODY,
        ),
    ] {
        out.push(evaluate.case(label, json_bytes(&body), expect));
    }
    let metric = ep("metric");
    for (label, body, expect) in [
        (
            "an event type with a Cyrillic o",
            json!({"expr": "COUNT(7d, transacti\u{43e}n) BY device_id"}),
            Expect::Is(400, Some("invalid_expr")),
        ),
        (
            "a full-width parenthesis",
            json!({"expr": "COUNT\u{ff08}7d, transaction) BY device_id"}),
            Expect::Is(400, Some("invalid_expr")),
        ),
        (
            "a window of 0",
            json!({"expr": "COUNT(0d, transaction) BY device_id"}),
            Expect::Is(400, Some("invalid_expr")),
        ),
        (
            "a window of i64::MAX days",
            json!({"expr": "COUNT(9223372036854775807d, transaction) BY device_id"}),
            Expect::Is(400, Some("invalid_expr")),
        ),
        (
            "a resolution of 999999999999999999999s",
            json!({"expr": "COUNT(7d, transaction) BY device_id", "resolution": "999999999999999999999s"}),
            Expect::Is(400, Some("invalid_resolution")),
        ),
        (
            "a resolution of 1ms",
            json!({"expr": "COUNT(7d, transaction) BY device_id", "resolution": "1ms"}),
            Expect::Is(400, Some("invalid_resolution")),
        ),
        (
            "an empty expression",
            json!({"expr": ""}),
            Expect::Is(400, Some("invalid_expr")),
        ),
    ] {
        out.push(metric.case(label, json_bytes(&body), expect));
    }
    let rule = ep("rule");
    for (label, body, expect) in [
        (
            "a full-width >",
            json!({"expr": "m1 \u{ff1e} 3"}),
            Expect::Is(400, Some("invalid_rule")),
        ),
        (
            "a metric id with a zero-width joiner",
            json!({"expr": "m\u{200d}1 > 3"}),
            Expect::Is(400, Some("invalid_rule")),
        ),
        (
            "a number of 1e400",
            json!({"expr": "m1 > 1e400"}),
            Expect::Is(400, Some("invalid_rule")),
        ),
        (
            "a number of NaN",
            json!({"expr": "m1 > NaN"}),
            Expect::Is(400, Some("invalid_rule")),
        ),
        (
            "an unknown metric",
            json!({"expr": "nope > 3"}),
            Expect::Is(400, None),
        ),
        (
            "an empty expression",
            json!({"expr": ""}),
            Expect::Is(400, Some("invalid_rule")),
        ),
        (
            "unbalanced parentheses",
            json!({"expr": "(m1 > 3"}),
            Expect::Is(400, Some("invalid_rule")),
        ),
    ] {
        out.push(rule.case(label, json_bytes(&body), expect));
    }
    // Long expressions: the lexers must stay linear in the length.
    for (label, expr, expect) in [
        (
            "a valid expression and 1 MiB of spaces",
            format!("COUNT(7d, transaction) BY device_id{}", " ".repeat(1 << 20)),
            Expect::OneOf(&[200, 400]),
        ),
        (
            "1 MiB of commas",
            ",".repeat(1 << 20),
            Expect::Is(400, Some("invalid_expr")),
        ),
    ] {
        out.push(metric.case(label, json_bytes(&json!({ "expr": expr })), expect));
    }
    out.push(rule.case(
        "1 MiB of spaces around a comparison",
        json_bytes(&json!({"expr": format!("{0}m1 > 3{0}", " ".repeat(1 << 19))})),
        // A rule is at most 4096 bytes, whatever they are.
        Expect::Is(400, Some("invalid_rule")),
    ));
    // The contract's bodies are objects: a JSON array is not read as the fields in
    // declaration order (whose meaning would change with the order of a struct's fields).
    for (ep, label, body) in [
        (
            check,
            "the fields as a positional array",
            br#"["loan",["black"],{"uid":"u1"}]"#.as_slice(),
        ),
        (
            upsert,
            "an entry as a positional array",
            br#"[[["uid","u-positional","loan",null,null,null]]]"#,
        ),
        (rule, "the fields as a positional array", br#"["m1 > 3"]"#),
        (
            ep("features"),
            "the fields as a positional array",
            br#"[["m1"],{"device_id":"d1"},null]"#,
        ),
    ] {
        out.push(ep.case(label, body.to_vec(), BAD_BODY));
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

// ---------------------------------------------------------------------------------------------
// Unicode in identifiers: rejected or accepted, and then matched, consistently.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unicode_identifiers_are_consistent() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let app = spawn_app(redis_settings(&redis)).await;
    let res = app
        .post(
            "/v1/lists/black/entries",
            &json!({"entries": [
                {"dimension": "uid", "value": "u\u{200d}1"},
                {"dimension": "uid", "value": "\u{3000}zw2\u{a0}"},
                {"dimension": "uid", "value": "u\u{455}er"},
                {"dimension": "device", "value": "caf\u{e9}"}
            ]}),
        )
        .await;
    assert_eq!(res.status(), 200);

    let values = |body: &Value| -> Vec<String> {
        let mut v: Vec<String> = body["hits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["value"].as_str().unwrap().to_owned())
            .collect();
        v.sort();
        v
    };
    // Invisible and look-alike characters are part of an opaque value: no folding.
    let body = app
        .check(&json!({"lists": ["black"], "subjects": {"uid": ["u1", "user", "u\u{200d}1", "u\u{455}er"]}}))
        .await;
    assert_eq!(values(&body), vec!["u\u{455}er", "u\u{200d}1"]);
    // Unicode whitespace is trimmed the same way in entries and checks.
    for probe in ["zw2", " zw2", "\u{a0}zw2\u{3000}", "zw2\u{2003}"] {
        let body = app
            .check(&json!({"lists": ["black"], "subjects": {"uid": probe}}))
            .await;
        assert_eq!(values(&body), vec!["zw2"], "{probe:?}");
    }
    // Composed and decomposed forms are different values (no normalisation, by design).
    let body = app
        .check(&json!({"lists": ["black"], "subjects": {"device": ["caf\u{e9}", "cafe\u{301}"]}}))
        .await;
    assert_eq!(values(&body), vec!["caf\u{e9}"]);
    // Lookups agree with checks.
    for (path, listed) in [
        ("/v1/lists/black/entries/uid/u%E2%80%8D1", true),
        ("/v1/lists/black/entries/uid/u1", false),
        ("/v1/lists/black/entries/uid/zw2", true),
        ("/v1/lists/black/entries/uid/%E3%80%80zw2", true),
        ("/v1/lists/black/entries/uid/u%D1%95er", true),
        ("/v1/lists/black/entries/uid/user", false),
    ] {
        let body: Value = app.get(path).await.json().await.unwrap();
        assert_eq!(body["listed"], listed, "{path}: {body}");
    }
    // Look-alike identifiers are refused everywhere, the same way, and change nothing.
    let before = redis.digest();
    for (method, path, body, code) in [
        (
            "POST",
            "/v1/lists/bl%D0%B0ck/entries",
            json!({"entries": [{"dimension": "uid", "value": "x"}]}),
            "invalid_list",
        ),
        (
            "POST",
            "/v1/lists/black/entries",
            json!({"entries": [{"dimension": "u\u{456}d", "value": "x"}]}),
            "unknown_dimension",
        ),
        (
            "POST",
            "/v1/check",
            json!({"lists": ["black"], "subjects": {"u\u{456}d": "x"}}),
            "unknown_dimension",
        ),
        (
            "POST",
            "/v1/check",
            json!({"lists": ["bl\u{430}ck"], "subjects": {"uid": "x"}}),
            "invalid_list",
        ),
        (
            "POST",
            "/v1/check",
            json!({"sandbox": "lo\u{200d}an", "lists": ["black"], "subjects": {"uid": "x"}}),
            "invalid_sandbox",
        ),
        (
            "DELETE",
            "/v1/lists/black/entries",
            json!({"entries": [{"dimension": "uid\u{200d}", "value": "x"}]}),
            "unknown_dimension",
        ),
    ] {
        let req = match method {
            "POST" => app.client.post(app.url(path)),
            _ => app.client.delete(app.url(path)),
        };
        let res = req.json(&body).send().await.unwrap();
        assert_eq!(res.status(), 400, "{method} {path} {body}");
        let v: Value = res.json().await.unwrap();
        assert_eq!(v["error"]["code"], code, "{method} {path} {body}: {v}");
    }
    for path in [
        "/v1/lists/black/entries/u%D1%96d/x",
        "/v1/lists/bl%D0%B0ck/entries/uid/x",
    ] {
        let res = app.get(path).await;
        assert_eq!(res.status(), 400, "{path}");
    }
    assert_eq!(redis.digest(), before, "refused requests changed the store");
}

// ---------------------------------------------------------------------------------------------
// Network-slow clients.
// ---------------------------------------------------------------------------------------------

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
    let idle_open = idle_ends.iter().filter(|e| late(e)).count();
    assert_eq!(
        idle_open, 0,
        "{idle_open} of 100 idle connections were still open after the request timeout"
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

// ---------------------------------------------------------------------------------------------
// Acknowledged writes are never lost.
// ---------------------------------------------------------------------------------------------

/// Hostile requests a writer slips in between its upserts: each must be a 400 and write
/// nothing.
fn hostile_writes() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (
            "truncated",
            br#"{"entries":[{"dimension":"uid","val"#.to_vec(),
        ),
        (
            "ttl 1e400",
            br#"{"entries":[{"dimension":"uid","value":"h1","ttl_seconds":1e400}]}"#.to_vec(),
        ),
        (
            "invalid UTF-8",
            b"{\"entries\":[{\"dimension\":\"uid\",\"value\":\"\xff\"}]}".to_vec(),
        ),
        ("deep nesting", {
            let mut v = br#"{"entries":"#.to_vec();
            v.extend(deep_array(10_000));
            v.push(b'}');
            v
        }),
        (
            "wrong type",
            br#"{"entries":[{"dimension":"uid","value":5}]}"#.to_vec(),
        ),
        (
            "a good entry, then a bad one",
            br#"{"entries":[{"dimension":"uid","value":"h2"},{"dimension":"phone","value":"x"}]}"#
                .to_vec(),
        ),
        (
            "oversize value",
            format!(
                r#"{{"entries":[{{"dimension":"uid","value":"{}"}}]}}"#,
                "a".repeat(1 << 20)
            )
            .into_bytes(),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_writes_survive_hostile_traffic_and_dropped_connections() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let settings = redis_settings(&redis);
    let prefix = settings.key_prefix.clone();
    let app = Arc::new(spawn_app(settings).await);
    let stop = Arc::new(AtomicBool::new(false));

    const WRITERS: usize = 4;
    const PER_WRITER: usize = 120;
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let app = app.clone();
        writers.push(tokio::spawn(async move {
            let hostile = hostile_writes();
            let mut outcomes: Vec<(Vec<String>, u16)> = Vec::new();
            let mut bad: Vec<String> = Vec::new();
            for i in 0..PER_WRITER {
                if i % 4 == 3 {
                    let (label, body) = &hostile[(i / 4 + w) % hostile.len()];
                    let res = app
                        .client
                        .post(app.url("/v1/lists/black/entries"))
                        .body(body.clone())
                        .timeout(CASE_TIMEOUT)
                        .send()
                        .await;
                    match res {
                        Ok(r) if r.status() == 400 => {}
                        Ok(r) => bad.push(format!("hostile {label}: {}", r.status())),
                        Err(e) => bad.push(format!("hostile {label}: {e}")),
                    }
                }
                let values: Vec<String> = (0..3).map(|k| format!("ack-{w}-{i}-{k}")).collect();
                let body = json!({"entries": values.iter().map(|v| json!({"dimension": "uid", "value": v})).collect::<Vec<_>>()});
                let res = app
                    .client
                    .post(app.url("/v1/lists/black/entries"))
                    .json(&body)
                    .timeout(CASE_TIMEOUT)
                    .send()
                    .await;
                let status = match res {
                    Ok(r) => {
                        let s = r.status().as_u16();
                        if s == 200 {
                            let v: Value = r.json().await.unwrap_or(Value::Null);
                            if v != json!({"written": 3}) {
                                bad.push(format!("upsert {w}-{i}: 200 with {v}"));
                            }
                        } else if s == 503 {
                            if r.headers().get("retry-after").is_none() {
                                bad.push(format!("upsert {w}-{i}: 503 without Retry-After"));
                            }
                        } else {
                            bad.push(format!("upsert {w}-{i}: status {s}"));
                        }
                        s
                    }
                    Err(e) => {
                        bad.push(format!("upsert {w}-{i}: {e}"));
                        0
                    }
                };
                outcomes.push((values, status));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (outcomes, bad)
        }));
    }
    // Drop every normal Redis connection of the service, again and again, while they write.
    let killer = {
        let stop = stop.clone();
        let url = redis.url();
        tokio::task::spawn_blocking(move || {
            let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
            let mut kills = 0;
            let mut killed = 0;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(150));
                if let Ok(n) = redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("TYPE")
                    .arg("normal")
                    .query::<i64>(&mut conn)
                {
                    kills += 1;
                    killed += n;
                }
            }
            (kills, killed)
        })
    };
    let mut outcomes = Vec::new();
    let mut bad = Vec::new();
    for w in writers {
        let (o, b) = w.await.unwrap();
        outcomes.extend(o);
        bad.extend(b);
    }
    stop.store(true, Ordering::Relaxed);
    let (kills, killed) = killer.await.unwrap();

    // The service recovers: a write goes through within a few seconds.
    let started = Instant::now();
    loop {
        let res = app
            .post(
                "/v1/lists/black/entries",
                &json!({"entries": [{"dimension": "uid", "value": "after-the-kills"}]}),
            )
            .await;
        if res.status() == 200 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "writes do not recover after the connection drops: {}",
            res.status()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Every acknowledged entry is listed, as seen by a fresh instance (no cache of its own).
    let fresh = spawn_app(namelist::config::Settings {
        key_prefix: prefix,
        ..redis_settings(&redis)
    })
    .await;
    let acked: Vec<&String> = outcomes
        .iter()
        .filter(|(_, s)| *s == 200)
        .flat_map(|(v, _)| v)
        .collect();
    let refused = outcomes.iter().filter(|(_, s)| *s == 503).count();
    let mut lost = Vec::new();
    for v in &acked {
        let body: Value = fresh
            .get(&format!("/v1/lists/black/entries/uid/{v}"))
            .await
            .json()
            .await
            .unwrap();
        if body["listed"] != true {
            lost.push(format!("{v}: {body}"));
        }
    }
    for v in ["h1", "h2"] {
        let body: Value = fresh
            .get(&format!("/v1/lists/black/entries/uid/{v}"))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(
            body,
            json!({"listed": false}),
            "{v} came from a refused request"
        );
    }
    eprintln!(
        "acknowledged writes: {} requests, {} acknowledged entries, {refused} answered 503, \
         {kills} CLIENT KILLs dropping {killed} connections",
        outcomes.len(),
        acked.len()
    );
    assert!(bad.is_empty(), "unexpected answers:\n{}", bad.join("\n"));
    assert!(
        lost.is_empty(),
        "{} acknowledged entries are not listed:\n{}",
        lost.len(),
        lost.join("\n")
    );
    assert!(kills >= 5 && killed > 0, "the connections were dropped");
    assert!(
        acked.len() > WRITERS * PER_WRITER * 3 / 2,
        "most writes are acknowledged ({} of {})",
        acked.len(),
        WRITERS * PER_WRITER * 3
    );
}
