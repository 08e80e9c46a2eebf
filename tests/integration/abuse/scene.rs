//! The scene of issue 24's attacks, shared by `tests/integration/abuse` (which asserts what the victim
//! gets) and `benches/abuse.rs` (which measures how fast it gets it): the real binary with a
//! tokens file (a victim, the victim's list loader, an attacker with a write token and one
//! with a read token, an admin), and each attack as a loop that runs until told to stop.
// The bench uses part of it.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::common::{self, RedisServer, ServiceProcess};

pub const VICTIM: &str = "victim-engine-token-0001";
pub const VICTIM_WRITER: &str = "victim-writer-token-0001";
pub const ATTACKER_WRITE: &str = "attacker-write-token-001";
pub const ATTACKER_READ: &str = "attacker-read-token-0001";
pub const ADMIN: &str = "admin-token-00000000001";

/// What the victim has on its list (sandbox `victim`, list `black`).
pub const LISTED_PHONE: &str = "13800138000";
pub const LISTED_UID: &str = "victim-u1";
/// Identifiers the attacker sends in every way it can; none may reach the log.
pub const SECRET_PHONE: &str = "13922223333";
pub const SECRET_ID_CARD: &str = "11010519491231002X";
pub const SECRET_IMEI: &str = "490154203237518";
pub const SECRET_IP: &str = "203.0.113.77";

/// Pairs the attacker makes (one sandbox per entry), as in the issue.
pub const PAIRS: usize = 100_000;
/// Made-up methods and paths attack 4 sends at least.
pub const ODD_REQUESTS: usize = 5_000;

fn tokens_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("tokens.toml");
    let mut text = String::new();
    for (name, role, token) in [
        ("victim", "engine", VICTIM),
        ("victim-writer", "write", VICTIM_WRITER),
        ("attacker-write", "write", ATTACKER_WRITE),
        ("attacker-read", "read", ATTACKER_READ),
        ("admin", "admin", ADMIN),
    ] {
        text.push_str(&format!(
            "[[tokens]]\nname = \"{name}\"\nrole = \"{role}\"\ntoken = \"{token}\"\n\n"
        ));
    }
    std::fs::write(&path, text).unwrap();
    path
}

/// The service under attack: the real binary, a tokens file, JSON logs at `log_level`,
/// every other setting at its default.
pub struct Scene {
    pub service: ServiceProcess,
    pub redis: Option<RedisServer>,
    pub http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Scene {
    /// Starts the service (on `redis`, or the embedded store) and writes the victim's list.
    pub async fn start(redis: Option<RedisServer>, log_level: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let tokens = tokens_file(dir.path());
        let mut builder = ServiceProcess::builder()
            .envs([
                ("NAMELIST_TOKENS_FILE", tokens.to_str().unwrap()),
                (
                    "NAMELIST_FINGERPRINT_KEY_FILE",
                    common::key_file().to_str().unwrap(),
                ),
                ("NAMELIST_LOG_FORMAT", "json"),
                ("RUST_LOG", log_level),
            ])
            .ready_within(Duration::from_secs(30));
        if let Some(r) = &redis {
            builder = builder
                .env("NAMELIST_REDIS_URL", r.url())
                .env("NAMELIST_KEY_PREFIX", common::unique_prefix());
        }
        let service = builder.start().await;
        let scene = Self {
            service,
            redis,
            http: reqwest::Client::new(),
            _dir: dir,
        };
        let (status, body) = scene
            .call(
                "POST",
                "/v1/lists/black/entries",
                Some(VICTIM_WRITER),
                Some(json!({"entries": [
                    {"dimension": "phone", "value": LISTED_PHONE, "sandbox": "victim"},
                    {"dimension": "uid", "value": LISTED_UID, "sandbox": "victim"},
                ]})),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        scene
    }

    pub fn url(&self, path: &str) -> String {
        self.service.url(path)
    }

    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        call(&self.http, &self.url(path), method, token, body).await
    }

    /// The service's resident memory, in bytes.
    pub fn rss(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.service.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
            .expect("VmRSS")
            * 1024
    }

    pub async fn metrics_text(&self) -> String {
        self.http
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Attack 1's set-up: `PAIRS` entries, each in a sandbox of its own (10 requests of
    /// 10,000 with the attacker's write token); they also leave `PAIRS` audit records.
    pub async fn many_pairs(&self) {
        for chunk in 0..PAIRS / 10_000 {
            let entries: Vec<Value> = (chunk * 10_000..(chunk + 1) * 10_000)
                .map(|i| json!({"dimension": "uid", "value": format!("a{i}"), "sandbox": format!("s{i:06}")}))
                .collect();
            let (status, body) = self
                .call(
                    "POST",
                    "/v1/lists/black/entries",
                    Some(ATTACKER_WRITE),
                    Some(json!({ "entries": entries })),
                )
                .await;
            assert_eq!(status, 200, "{body}");
        }
    }

    /// The victim's check: a listed phone and uid and a never-seen uid (`fresh`).
    pub fn victim_check(fresh: u64) -> Value {
        json!({"sandbox": "victim", "lists": ["black"],
               "subjects": {"phone": LISTED_PHONE, "uid": [LISTED_UID, format!("never-seen-{fresh}")]}})
    }

    /// How an answer to `victim_check` came out (see `VictimAnswer`).
    pub fn victim_answer(status: u16, body: &Value) -> VictimAnswer {
        let mut hits: Vec<String> = body["hits"]
            .as_array()
            .map(|h| {
                h.iter()
                    .map(|h| {
                        format!(
                            "{}:{}",
                            h["dimension"].as_str().unwrap_or("?"),
                            h["value"].as_str().unwrap_or("?")
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        hits.sort();
        let phone = hits.first().map(String::as_str);
        let hits_exact = status == 200
            && hits.len() == 2
            && matches!(phone, Some("phone:13800138000" | "phone:+8613800138000"))
            && hits[1] == format!("uid:{LISTED_UID}");
        match (hits_exact, &body["degraded"]) {
            (true, Value::Bool(false)) => VictimAnswer::Exact,
            (true, Value::Bool(true)) if body["stale_ms"].is_u64() => VictimAnswer::Late,
            _ => VictimAnswer::Wrong,
        }
    }
}

/// An answer to `Scene::victim_check`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VictimAnswer {
    /// 200, exactly its two hits, `degraded: false`.
    Exact,
    /// 200, exactly its two hits, but `degraded: true` with its `stale_ms`: a lookup missed
    /// the check's 20 ms deadline, or the tier's last proof of delivery came late, and the
    /// local tier answered. Right, and honest about it, but not known current.
    Late,
    /// Anything else: a missing or extra hit, an error, a degraded answer without its age.
    Wrong,
}

pub async fn call(
    http: &reqwest::Client,
    url: &str,
    method: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = http.request(method.parse().unwrap(), url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    match req.send().await {
        Ok(res) => {
            let status = res.status().as_u16();
            (status, res.json::<Value>().await.unwrap_or(Value::Null))
        }
        Err(e) => (0, json!(e.to_string())),
    }
}

/// Each attack of the issue's table, as a loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attack {
    /// 1 (and 2 on the embedded store): four read-token loops paging through every pair,
    /// 1,000 a page.
    ListsPages,
    /// 2: four read-token loops looking an identity up across the lists of a sandbox.
    Lookups,
    /// 3: 32 connections send a check's head announcing 8 MiB and nothing more (with the
    /// attacker's read token, or none).
    AnnouncedHeads { token: bool },
    /// 4: no token, made-up methods and paths (at least `ODD_REQUESTS`).
    OddMethods,
    /// 5: lookups with a phone in the path and a query the extractor refuses.
    PhoneInPath,
    /// 6: a read token's evaluate with an event (each a 403).
    EvaluateEvent,
    /// 7: four read-token loops searching the audit trail by `who=nobody`, 1,000 a page.
    AuditByWho,
    /// 8: audit cursors Redis would refuse as an end of range.
    BadCursor,
    /// 9: identifiers in the wrong places of bodies (each a 400).
    QuotedValues,
}

impl Attack {
    pub const ALL: [Attack; 10] = [
        Attack::ListsPages,
        Attack::Lookups,
        Attack::AnnouncedHeads { token: true },
        Attack::AnnouncedHeads { token: false },
        Attack::OddMethods,
        Attack::PhoneInPath,
        Attack::EvaluateEvent,
        Attack::AuditByWho,
        Attack::BadCursor,
        Attack::QuotedValues,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Attack::ListsPages => "1: GET /v1/lists pages over 100,000 pairs",
            Attack::Lookups => "2: lookups across the lists of a sandbox",
            Attack::AnnouncedHeads { token: true } => "3: 32 heads announcing 8 MiB (read token)",
            Attack::AnnouncedHeads { token: false } => "3: 32 heads announcing 8 MiB (no token)",
            Attack::OddMethods => "4: made-up methods and paths, no token",
            Attack::PhoneInPath => "5: a phone in a lookup's path, a bad query",
            Attack::EvaluateEvent => "6: a read token's evaluate with an event",
            Attack::AuditByWho => "7: audit searches by who over 100,000 records",
            Attack::BadCursor => "8: audit cursors Redis refuses",
            Attack::QuotedValues => "9: identifiers in the wrong places of bodies",
        }
    }

    /// Runs the attack against the service at `base` (`http://host:port`) until `stop`;
    /// the requests it made. Every answer must be one the attack may get (else it panics).
    pub async fn run(self, base: String, port: u16, stop: Arc<AtomicBool>) -> usize {
        match self {
            Attack::AnnouncedHeads { token } => {
                announced_heads(port, token.then_some(ATTACKER_READ), stop).await
            }
            Attack::OddMethods => odd_methods(base, stop).await,
            _ => {
                let loops: Vec<_> = (0..4)
                    .map(|n| tokio::spawn(self.one_loop(base.clone(), n, stop.clone())))
                    .collect();
                let mut made = 0;
                for l in loops {
                    made += l.await.unwrap();
                }
                made
            }
        }
    }

    async fn one_loop(self, base: String, n: usize, stop: Arc<AtomicBool>) -> usize {
        let http = reqwest::Client::new();
        let mut cursor: Option<String> = None;
        let mut made = 0;
        while !stop.load(Ordering::Relaxed) {
            let (method, path, body, allowed): (&str, String, Option<Value>, &[u16]) = match self {
                Attack::ListsPages => (
                    "GET",
                    match &cursor {
                        Some(c) => format!("/v1/lists?limit=1000&cursor={c}"),
                        None => "/v1/lists?limit=1000".to_owned(),
                    },
                    None,
                    &[200, 429],
                ),
                // 503 only as the operator lane's refusal (`overloaded`, checked below): on a
                // slow hour the attacker's own lookups queue past `operator_deadline_ms`.
                Attack::Lookups => (
                    "GET",
                    format!("/v1/lists/-/lookup/uid/a{made}?sandbox=s{made:06}"),
                    None,
                    &[200, 429, 503],
                ),
                Attack::PhoneInPath => (
                    "GET",
                    match n % 2 {
                        0 => format!("/v1/lists/-/lookup/phone/{SECRET_PHONE}?x=1"),
                        _ => {
                            format!("/v1/lists/black/entries/id_card/{SECRET_ID_CARD}?sandbox=%ZZ")
                        }
                    },
                    None,
                    &[400, 429],
                ),
                Attack::EvaluateEvent => (
                    "POST",
                    "/v1/evaluate".to_owned(),
                    Some(
                        json!({"event": {"id": format!("e{n}-{made}"), "type": "login",
                                          "fields": {"user": SECRET_PHONE}}}),
                    ),
                    &[403, 429],
                ),
                Attack::AuditByWho => (
                    "GET",
                    "/v1/audit?who=nobody&limit=1000".to_owned(),
                    None,
                    &[200, 429],
                ),
                Attack::BadCursor => (
                    "GET",
                    "/v1/audit?cursor=0-0-3".to_owned(),
                    None,
                    &[200, 429],
                ),
                Attack::QuotedValues => (
                    "POST",
                    "/v1/check".to_owned(),
                    Some(json!({"lists": ["black"], "subjects": {SECRET_PHONE: 13912345678u64}})),
                    &[400, 429],
                ),
                Attack::AnnouncedHeads { .. } | Attack::OddMethods => unreachable!(),
            };
            // The answer's bytes, not a parsed document: on a shared machine the attacker's
            // own parsing would count against the victim.
            let mut req = http
                .request(method.parse().unwrap(), format!("{base}{path}"))
                .bearer_auth(ATTACKER_READ);
            if let Some(b) = body {
                req = req.json(&b);
            }
            let (status, answer) = match req.send().await {
                Ok(res) => (res.status().as_u16(), res.bytes().await.unwrap_or_default()),
                Err(_) => (0, Default::default()),
            };
            let text = String::from_utf8_lossy(&answer[..answer.len().min(200)]);
            assert!(
                allowed.contains(&status),
                "{}: {method} {path}: {status} {text}",
                self.name()
            );
            assert!(
                status != 503 || text.contains(r#""code":"overloaded""#),
                "{}: {method} {path}: a 503 that is not the lane's refusal: {text}",
                self.name()
            );
            if self == Attack::AuditByWho && status == 200 {
                assert!(text.starts_with(r#"{"records":[]"#), "{text}");
            }
            cursor = next_cursor(&answer);
            made += 1;
        }
        made
    }
}

/// The `next_cursor` of a page's JSON, found without parsing the page.
fn next_cursor(page: &[u8]) -> Option<String> {
    const KEY: &[u8] = br#""next_cursor":""#;
    let at = page.windows(KEY.len()).rposition(|w| w == KEY)? + KEY.len();
    let len = page[at..].iter().position(|&b| b == b'"')?;
    Some(String::from_utf8_lossy(&page[at..at + len]).into_owned())
}

/// Attack 3: 32 connections send a check's head announcing 8 MiB, then nothing.
async fn announced_heads(port: u16, token: Option<&str>, stop: Arc<AtomicBool>) -> usize {
    let mut held = Vec::new();
    for _ in 0..32 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
        let head = format!(
            "POST /v1/check HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n\
             Content-Length: 8388608\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        held.push(s);
    }
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    held.len()
}

/// Attack 4: no token, made-up methods on made-up paths (a phone in each), 16 at once, at
/// least `ODD_REQUESTS` of them and on until `stop`.
async fn odd_methods(base: String, stop: Arc<AtomicBool>) -> usize {
    let http = reqwest::Client::new();
    let mut sent = 0;
    let mut tasks = tokio::task::JoinSet::new();
    let mut i = 0;
    while i < ODD_REQUESTS || !stop.load(Ordering::Relaxed) {
        let http = http.clone();
        let url = format!("{base}/x{i}/{SECRET_PHONE}");
        let method = reqwest::Method::from_bytes(format!("FOO{i}").as_bytes()).unwrap();
        tasks.spawn(async move { http.request(method, url).send().await.map(|r| r.status()) });
        i += 1;
        if tasks.len() >= 16
            && let Some(r) = tasks.join_next().await
        {
            r.unwrap().unwrap();
            sent += 1;
        }
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap().unwrap();
        sent += 1;
    }
    sent
}
