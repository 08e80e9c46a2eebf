//! One hostile client against the real binary (issue 24): each attack of the table
//! (`scene::Attack`), run while a victim, the risk engine with a token of its own, checks
//! identities that are listed and identities never seen, and writes entries with another token
//! of its own.
//!
//! Throughout every attack: every victim check is a 200 with exactly the expected hits, and
//! at most one in 50 of them is `degraded` (`LATE_AT_MOST`, see there); every victim write
//! is a 200; `/readyz` answers 200; Redis answers every `PING`, all but one in 50 within
//! 50 ms (measured from a thread of the test's own), and runs no command of 50 ms or more
//! (its slow log). Around them: `/metrics` and the service's RSS stay within fixed
//! bounds (5,000 made-up methods and paths add at most one series), a read token's
//! `evaluate` with an event is refused with nothing counted, a caller's audit cursor is never
//! a store error, and nothing a request carried is quoted back. A second run of every attack
//! with the service at `RUST_LOG=trace` (every dependency's target on) checks that no log line
//! holds an identifier any request carried (phones, ID cards, IMEIs, an IP sent as a request
//! id).
//!
//! Default settings throughout (a tokens file, the default limits and budgets). On a real
//! `redis-server`, and attacks 1–3 also on the embedded store. How fast the victim stays under
//! each attack is measured by `cargo bench --bench abuse`, not asserted here.

use crate::common;
mod scene;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::RedisServer;
use scene::*;
use serde_json::{Value, json};

/// How long each attack runs against the victim (each reaches its steady state within a
/// second; `cargo bench --bench abuse` runs them for 10 s).
const ATTACK: Duration = Duration::from_secs(3);
/// Redis must answer `PING` within this, throughout.
const PING_BOUND: Duration = Duration::from_millis(50);
/// `/metrics` may not grow past this, whatever is sent.
const METRICS_BOUND: usize = 256 * 1024;
/// The service's resident memory may not grow past this.
const RSS_BOUND: u64 = 512 * 1024 * 1024;
/// At most one victim check in this many may be answered `degraded: true` (its hits still
/// exact, with its `stale_ms`), and one `PING` take `PING_BOUND` or more. A degraded answer
/// is a lookup that missed the 20 ms check deadline, or a tier whose last proof of delivery
/// came late, on a machine that stalled. A debug build on two shared cores does that
/// without any attack: CI once saw one such answer in 199 checks while Redis answered the
/// test's `PING` within 7.6 ms, and a `PING` took 25 ms during attack 3, which sends Redis
/// nothing. An attack that blinds the tier makes every check degraded (by hand, `SUBSCRIBE`
/// and `HGET` refused: 216 of 216); one that holds Redis delays the `PING`s sent meanwhile
/// and shows in the slow log, while the tier still answers most checks (by hand, 8 × 60 ms
/// of `DEBUG SLEEP`: 8 late `PING`s of 188, 5 degraded checks of 303). How fast the victim
/// stays is measured by `cargo bench --bench abuse`, in a release build. A wrong hit, or a
/// `PING` refused, is never allowed.
const LATE_AT_MOST: usize = 50;

#[derive(Default)]
struct Tally {
    ok: usize,
    /// Right but `degraded` (victim checks only).
    late: usize,
    failures: Vec<String>,
    max: Duration,
}

impl Tally {
    fn fail(&mut self, what: String) {
        if self.failures.len() < 5 {
            self.failures.push(what);
        }
    }
}

/// The risk engine: `Scene::victim_check` every 10 ms on connections of its own; each answer
/// must have exactly the right hits (`Tally::late` counts the degraded ones).
async fn victim_checks(url: String, stop: Arc<AtomicBool>) -> Tally {
    let http = reqwest::Client::new();
    let mut t = Tally::default();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let started = Instant::now();
        let (status, body) = call(
            &http,
            &url,
            "POST",
            Some(VICTIM),
            Some(Scene::victim_check(i)),
        )
        .await;
        t.max = t.max.max(started.elapsed());
        match Scene::victim_answer(status, &body) {
            VictimAnswer::Exact => t.ok += 1,
            VictimAnswer::Late => t.late += 1,
            VictimAnswer::Wrong => t.fail(format!("{status} {body}")),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    t
}

/// The victim's list loader: one upsert every 200 ms with a token of its own; each a 200.
async fn victim_writes(url: String, stop: Arc<AtomicBool>) -> Tally {
    let http = reqwest::Client::new();
    let mut t = Tally::default();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let (status, body) = call(
            &http,
            &url,
            "POST",
            Some(VICTIM_WRITER),
            Some(json!({"entries": [{"dimension": "device", "value": format!("victim-d{i}"), "sandbox": "victim"}]})),
        )
        .await;
        if status == 200 {
            t.ok += 1;
        } else {
            t.fail(format!("{status} {body}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    t
}

async fn poll_ready(url: String, stop: Arc<AtomicBool>) -> Tally {
    let http = reqwest::Client::new();
    let mut t = Tally::default();
    while !stop.load(Ordering::Relaxed) {
        match http.get(&url).send().await {
            Ok(r) if r.status() == 200 => t.ok += 1,
            Ok(r) => t.fail(format!("{}", r.status())),
            Err(e) => t.fail(e.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    t
}

/// What `ping_redis` saw.
#[derive(Debug, Default)]
struct Pings {
    sent: usize,
    /// Answered in `PING_BOUND` or more.
    late: usize,
    failed: usize,
    slowest: Duration,
}

/// `PING` every 20 ms, on a connection of its own, from a thread of its own (not a task among
/// the attacker's and the victim's), so what it measures is Redis.
fn ping_redis(redis: &RedisServer, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Pings> {
    let mut conn = redis.conn();
    std::thread::spawn(move || {
        let mut p = Pings::default();
        while !stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            let r: redis::RedisResult<String> = redis::cmd("PING").query(&mut conn);
            let took = started.elapsed();
            p.sent += 1;
            p.failed += usize::from(r.is_err());
            p.late += usize::from(took >= PING_BOUND);
            p.slowest = p.slowest.max(took);
            std::thread::sleep(Duration::from_millis(20));
        }
        p
    })
}

/// Commands Redis itself took 50 ms or more to run since the last call (its slow log, set to
/// 50 ms by `Scene`'s caller), and the log emptied.
fn slow_commands(redis: &RedisServer) -> Vec<String> {
    let mut conn = redis.conn();
    let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(10)
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("SLOWLOG").arg("RESET").query(&mut conn).unwrap();
    entries.iter().map(|e| format!("{e:?}")).collect()
}

/// Runs `attack` for `ATTACK` while the victim checks and writes, Redis is pinged and
/// `/readyz` polled; then asserts everything the module docs promise for the phase.
async fn under_attack(scene: &Scene, attack: Option<Attack>) {
    let name = attack.map_or("baseline", Attack::name);
    let stop = Arc::new(AtomicBool::new(false));
    let victim = tokio::spawn(victim_checks(scene.url("/v1/check"), stop.clone()));
    let writer = tokio::spawn(victim_writes(
        scene.url("/v1/lists/black/entries"),
        stop.clone(),
    ));
    let ready = tokio::spawn(poll_ready(scene.url("/readyz"), stop.clone()));
    if let Some(r) = &scene.redis {
        slow_commands(r);
    }
    let ping = scene.redis.as_ref().map(|r| ping_redis(r, stop.clone()));
    let attacking =
        attack.map(|a| tokio::spawn(a.run(scene.url(""), scene.service.port(), stop.clone())));
    tokio::time::sleep(ATTACK).await;
    stop.store(true, Ordering::Relaxed);
    let made = match attacking {
        Some(a) => a.await.unwrap(),
        None => 0,
    };
    let v = victim.await.unwrap();
    let w = writer.await.unwrap();
    let r = ready.await.unwrap();
    let ping = ping.map(|p| p.join().unwrap());
    eprintln!(
        "{name}: attacker {made} requests; victim {} checks (slowest {:?}, {} degraded), {} writes; /readyz {} polls; Redis PINGs {ping:?}",
        v.ok + v.late,
        v.max,
        v.late,
        w.ok,
        r.ok
    );
    assert!(
        v.failures.is_empty(),
        "{name}: victim checks {:?}",
        v.failures
    );
    assert!(
        v.late * LATE_AT_MOST <= v.ok + v.late,
        "{name}: {} of the victim's {} checks were degraded",
        v.late,
        v.ok + v.late
    );
    assert!(
        v.ok + v.late >= 10,
        "{name}: the victim got only {} checks through",
        v.ok + v.late
    );
    assert!(
        w.failures.is_empty(),
        "{name}: victim writes {:?}",
        w.failures
    );
    assert!(w.ok >= 2, "{name}: only {} victim writes", w.ok);
    assert!(r.failures.is_empty(), "{name}: /readyz {:?}", r.failures);
    if let Some(p) = ping {
        // A machine that stalls delays one `PING` now and then, as it does a victim's check
        // (`LATE_AT_MOST`); an attack that holds Redis delays every one sent meanwhile.
        assert!(
            p.failed == 0 && p.late * LATE_AT_MOST <= p.sent,
            "{name}: Redis PINGs {p:?}"
        );
    }
    if let Some(r) = &scene.redis {
        let slow = slow_commands(r);
        assert!(
            slow.is_empty(),
            "{name}: Redis ran commands of 50 ms or more: {slow:?}"
        );
    }
    // And right after: Redis and the service are themselves again.
    if let Some(redis) = &scene.redis {
        let started = Instant::now();
        let _: String = redis::cmd("PING").query(&mut redis.conn()).unwrap();
        assert!(started.elapsed() < PING_BOUND, "{name}: PING after");
    }
    assert_eq!(scene.call("GET", "/readyz", None, None).await.0, 200);
}

/// Every attack while the victim checks and writes, at default settings (the attacks that
/// need no data of their own first, then those over 100,000 pairs and the 100,000 audit
/// records they leave).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_hostile_client_cannot_slow_starve_or_blind_the_service_on_redis() {
    let redis = RedisServer::start();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(50_000)
        .query(&mut redis.conn())
        .unwrap();
    let scene = Scene::start(Some(redis), "info").await;
    let rss_start = scene.rss();

    under_attack(&scene, None).await;
    // 5,000 made-up methods and paths add one series at most (`unmatched`, `other`, 404).
    let metrics_start = scene.metrics_text().await.len();
    under_attack(&scene, Some(Attack::OddMethods)).await;
    let metrics = scene.metrics_text().await;
    assert!(
        metrics.len() < metrics_start + 4 * 1024,
        "/metrics grew from {metrics_start} to {} bytes",
        metrics.len()
    );
    assert!(!metrics.contains("FOO"), "a made-up method became a label");
    assert!(!metrics.contains(SECRET_PHONE), "a path became a label");
    for attack in [
        Attack::AnnouncedHeads { token: true },
        Attack::AnnouncedHeads { token: false },
        Attack::PhoneInPath,
        Attack::EvaluateEvent,
        Attack::QuotedValues,
        Attack::BadCursor,
    ] {
        under_attack(&scene, Some(attack)).await;
    }
    read_token_evaluate_counts_nothing(&scene).await;
    nothing_sent_is_quoted_back(&scene).await;
    cursors_are_the_callers_business(&scene).await;

    scene.many_pairs().await;
    for attack in [Attack::ListsPages, Attack::Lookups, Attack::AuditByWho] {
        under_attack(&scene, Some(attack)).await;
    }

    let rss = scene.rss();
    assert!(rss < RSS_BOUND, "RSS grew from {rss_start} to {rss} bytes");
    let metrics = scene.metrics_text().await;
    assert!(
        metrics.len() < METRICS_BOUND,
        "/metrics is {} bytes",
        metrics.len()
    );
}

/// Every attack once more with the service logging at `RUST_LOG=trace` (every dependency's
/// target on); then every line of the log, read for every identifier any request carried.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_identifier_reaches_the_log_at_trace_level() {
    let scene = Scene::start(Some(RedisServer::start()), "trace").await;
    for attack in Attack::ALL {
        if attack == Attack::ListsPages {
            // A few pairs for the lists and lookup loops to read.
            let (status, body) = scene
                .call(
                    "POST",
                    "/v1/lists/black/entries",
                    Some(ATTACKER_WRITE),
                    Some(json!({"entries": [{"dimension": "phone", "value": SECRET_PHONE, "sandbox": "s000001"}]})),
                )
                .await;
            assert_eq!(status, 200, "{body}");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let run = tokio::spawn(attack.run(scene.url(""), scene.service.port(), stop.clone()));
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.store(true, Ordering::Relaxed);
        run.await.unwrap();
    }
    let (status, _) = scene
        .call(
            "POST",
            "/v1/check",
            Some(VICTIM),
            Some(Scene::victim_check(1)),
        )
        .await;
    assert_eq!(status, 200);
    nothing_sent_is_quoted_back(&scene).await;
    let (status, _) = scene
        .call(
            "GET",
            &format!("/v1/lists/-/lookup/phone/{SECRET_PHONE}?sandbox=s000001"),
            Some(ATTACKER_READ),
            None,
        )
        .await;
    assert_eq!(status, 200);

    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = std::fs::read_to_string(scene.service.log_path()).unwrap();
    assert!(
        log.lines().count() > 1_000,
        "trace logging is on: {} lines",
        log.lines().count()
    );
    assert!(
        log.contains("\"target\":\"actix_http") || log.contains("\"target\":\"actix_server"),
        "dependencies' targets are logged too"
    );
    for secret in [
        SECRET_PHONE,
        SECRET_ID_CARD,
        SECRET_IMEI,
        SECRET_IP,
        LISTED_PHONE,
        "13912345678",
    ] {
        if let Some(line) = log.lines().find(|l| l.contains(secret)) {
            panic!("the log holds {secret}: {line}");
        }
    }
}

/// Attacks 1–3 on the embedded store: the heads, then the pairs with the lists and lookup
/// loops (the service's own work is all there is to starve here).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_hostile_client_cannot_slow_or_starve_the_embedded_store() {
    let scene = Scene::start(None, "info").await;
    under_attack(&scene, Some(Attack::AnnouncedHeads { token: true })).await;
    scene.many_pairs().await;
    for attack in [Attack::ListsPages, Attack::Lookups] {
        under_attack(&scene, Some(attack)).await;
    }
    assert!(scene.rss() < RSS_BOUND);
}

async fn read_token_evaluate_counts_nothing(scene: &Scene) {
    let (status, body) = scene
        .call(
            "PUT",
            "/v1/metrics/victim_logins_1h",
            Some(ADMIN),
            Some(json!({"expr": "COUNT(1h, login) BY user"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let count = || async {
        let (_, body) = scene
            .call(
                "POST",
                "/v1/features",
                Some(VICTIM),
                Some(json!({"metrics": ["victim_logins_1h"], "fields": {"user": "u1"}})),
            )
            .await;
        body["values"]["victim_logins_1h"].clone()
    };
    assert_eq!(count().await, 0);
    for i in 0..3 {
        let (status, body) = scene
            .call(
                "POST",
                "/v1/evaluate",
                Some(ATTACKER_READ),
                Some(json!({"event": {"id": format!("e{i}"), "type": "login", "fields": {"user": "u1"}},
                            "metrics": ["victim_logins_1h"], "fields": {"user": "u1"}})),
            )
            .await;
        assert_eq!(status, 403, "{body}");
        assert_eq!(body["error"]["code"], "forbidden");
    }
    assert_eq!(count().await, 0, "a read token's events were counted");
}

async fn nothing_sent_is_quoted_back(scene: &Scene) {
    let long = "x".repeat(10 * 1024);
    for (path, body, secret) in [
        (
            "/v1/lists/black/entries".to_owned(),
            json!({"entries": [{"dimension": "phone", "value": 13912345678u64}]}),
            "13912345678",
        ),
        (
            "/v1/lists/black/entries".to_owned(),
            json!({"entries": [{"dimension": "uid", "value": "u", "ttl_seconds": SECRET_ID_CARD}]}),
            SECRET_ID_CARD,
        ),
        (
            "/v1/lists/black/entries".to_owned(),
            json!({"entries": [{"dimension": "uid", "value": "u", SECRET_PHONE: 1}]}),
            SECRET_PHONE,
        ),
        (
            "/v1/check".to_owned(),
            json!({"lists": ["black"], "subjects": {SECRET_PHONE: "x"}}),
            SECRET_PHONE,
        ),
        (
            "/v1/check".to_owned(),
            json!({"lists": [format!("+86{SECRET_PHONE}")], "subjects": {"uid": "x"}}),
            SECRET_PHONE,
        ),
        (
            format!("/v1/lists/{long}/entries"),
            json!({"entries": [{"dimension": "uid", "value": "u"}]}),
            "xxxxxxxxxx",
        ),
        (
            "/v1/events".to_owned(),
            json!({"type": "login", "fields": {SECRET_IMEI: {"nested": true}}}),
            SECRET_IMEI,
        ),
    ] {
        let token = if path.contains("check") {
            VICTIM
        } else {
            ATTACKER_WRITE
        };
        let (status, answer) = scene.call("POST", &path, Some(token), Some(body)).await;
        assert_eq!(status, 400, "{path}: {answer}");
        let text = answer.to_string();
        assert!(!text.contains(secret), "{path}: {text}");
        assert!(text.len() < 512, "{path}: a long answer: {text}");
    }
    // A request id that is not an id is replaced (and so never logged).
    let res = scene
        .http
        .get(scene.url("/healthz"))
        .header("x-request-id", SECRET_IP)
        .send()
        .await
        .unwrap();
    assert_ne!(res.headers()["x-request-id"], SECRET_IP);
}

async fn cursors_are_the_callers_business(scene: &Scene) {
    let errors = |m: &str| {
        m.lines()
            .filter(|l| l.starts_with("namelist_store_errors_total"))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum::<f64>()
    };
    let before = errors(&scene.metrics_text().await);
    for cursor in [
        "0-0-3",
        "0-0-0",
        "0-0-64",
        "18446744073709551615-18446744073709551615-5",
    ] {
        let (status, body) = scene
            .call(
                "GET",
                &format!("/v1/audit?cursor={cursor}"),
                Some(ATTACKER_READ),
                None,
            )
            .await;
        assert_eq!(status, 200, "{cursor}: {body}");
        if cursor.starts_with("0-0") {
            assert_eq!(body["records"], json!([]), "{cursor}: {body}");
            assert_eq!(body["next_cursor"], Value::Null, "{cursor}: {body}");
        }
    }
    for cursor in ["0-0-65", "x", "1-2-3-4", "-1-0-0"] {
        let (status, body) = scene
            .call(
                "GET",
                &format!("/v1/audit?cursor={cursor}"),
                Some(ATTACKER_READ),
                None,
            )
            .await;
        assert_eq!(status, 400, "{cursor}: {body}");
        assert_eq!(body["error"]["code"], "invalid_cursor", "{cursor}: {body}");
    }
    assert_eq!(
        errors(&scene.metrics_text().await),
        before,
        "a caller's cursor counted as a store error"
    );
}
