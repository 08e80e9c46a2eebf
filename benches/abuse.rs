//! What one hostile client costs the risk engine (issue 24): the victim's check latency at a
//! fixed rate, alone and under each attack of the table, in one run.
//!
//! `tests/integration/abuse` proves the behaviour (every victim check exact, Redis answering, bounded
//! memory and metrics); how fast the victim stays is a measurement, so it lives here.
//!
//! The scene is the test's (`tests/integration/abuse/scene.rs`): its own `redis-server`, the release
//! `namelist` binary with a tokens file and every setting at its default (`RUST_LOG=warn`),
//! the victim's list (a phone and a uid in sandbox `victim`). Then:
//!
//! 1. **alone**: the victim, with its own `engine` token, checks the listed phone and uid and a
//!    never-seen uid at `NAMELIST_ABUSE_RATE` (2,000) checks/s, open loop (each request is
//!    sent at its scheduled time whatever the answers before it, and its latency counts from
//!    that time, so a stall is not hidden by the generator waiting), for
//!    `NAMELIST_ABUSE_SECS` (10) s after a 1 s warm-up; every answer is verified (200, the two
//!    hits, not degraded).
//! 2. **under each attack** (`scene::Attack`): the same, while the attack runs. Attacks 1, 2
//!    and 7 run after the attacker's write token wrote 100,000 entries each in a sandbox of its
//!    own (also 100,000 audit records).
//!
//! Prints the victim's p50 / p99 / max and errors per phase, and the target: p99 under every
//! attack within 2x of alone; then one JSON line. The generator, the attacker, the service
//! and Redis share the machine's cores.
//!
//! `cargo bench --bench abuse` (needs `redis-server` on PATH or `$REDIS_SERVER`); about 2
//! minutes. Knobs: `NAMELIST_ABUSE_RATE`, `NAMELIST_ABUSE_SECS`.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/integration/abuse/scene.rs"]
mod scene;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::RedisServer;
use scene::{Attack, Scene, VICTIM, VictimAnswer, call};
use serde_json::json;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Phase {
    name: &'static str,
    sent: usize,
    errors: usize,
    p50: f64,
    p99: f64,
    max: f64,
    attacker: usize,
}

fn pct_ms(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1e3
}

/// The victim's checks at `rate` a second for `secs`, open loop; (latencies, errors).
async fn victim(url: String, rate: u64, secs: u64) -> (Vec<Duration>, usize) {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()
        .unwrap();
    let fresh = Arc::new(AtomicU64::new(0));
    let every = Duration::from_secs_f64(1.0 / rate as f64);
    let total = rate * secs;
    let start = tokio::time::Instant::now() + Duration::from_millis(10);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..total {
        let due = start + every * i as u32;
        tokio::time::sleep_until(due).await;
        let (http, url, fresh) = (http.clone(), url.clone(), fresh.clone());
        tasks.spawn(async move {
            let n = fresh.fetch_add(1, Ordering::Relaxed);
            let (status, body) = call(
                &http,
                &url,
                "POST",
                Some(VICTIM),
                Some(Scene::victim_check(n)),
            )
            .await;
            (
                due.elapsed(),
                Scene::victim_answer(status, &body) == VictimAnswer::Exact,
            )
        });
    }
    let mut took = Vec::with_capacity(total as usize);
    let mut errors = 0;
    while let Some(r) = tasks.join_next().await {
        let (t, exact) = r.unwrap();
        took.push(t);
        errors += usize::from(!exact);
    }
    took.sort();
    (took, errors)
}

async fn phase(scene: &Scene, attack: Option<Attack>, rate: u64, secs: u64) -> Phase {
    let stop = Arc::new(AtomicBool::new(false));
    let attacking =
        attack.map(|a| tokio::spawn(a.run(scene.url(""), scene.service.port(), stop.clone())));
    // Warm-up: the attack gets going, the victim's connections open.
    victim(scene.url("/v1/check"), rate, 1).await;
    let (took, errors) = victim(scene.url("/v1/check"), rate, secs).await;
    stop.store(true, Ordering::Relaxed);
    let attacker = match attacking {
        Some(a) => a.await.unwrap(),
        None => 0,
    };
    let p = Phase {
        name: attack.map_or("alone", Attack::name),
        sent: took.len(),
        errors,
        p50: pct_ms(&took, 0.50),
        p99: pct_ms(&took, 0.99),
        max: took.last().map_or(f64::NAN, |t| t.as_secs_f64() * 1e3),
        attacker,
    };
    println!(
        "{:<48} {:>7} {:>6} {:>9.2} {:>9.2} {:>9.2} {:>9}",
        p.name, p.sent, p.errors, p.p50, p.p99, p.max, p.attacker
    );
    p
}

fn main() {
    let rate = env_u64("NAMELIST_ABUSE_RATE", 2_000);
    let secs = env_u64("NAMELIST_ABUSE_SECS", 10);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let scene = Scene::start(Some(RedisServer::start()), "warn").await;
        println!(
            "abuse: victim checks at {rate}/s for {secs} s per phase (open loop), the release binary at default settings with a tokens file, one redis-server"
        );
        println!(
            "{:<48} {:>7} {:>6} {:>9} {:>9} {:>9} {:>9}",
            "phase", "checks", "errors", "p50 ms", "p99 ms", "max ms", "attacker"
        );
        let alone = phase(&scene, None, rate, secs).await;
        let mut phases = Vec::new();
        let mut loaded = false;
        for attack in Attack::ALL {
            if matches!(attack, Attack::ListsPages | Attack::Lookups | Attack::AuditByWho) && !loaded {
                scene.many_pairs().await;
                loaded = true;
            }
            phases.push(phase(&scene, Some(attack), rate, secs).await);
        }
        let worst = phases
            .iter()
            .map(|p| p.p99)
            .fold(f64::NAN, f64::max);
        let met = phases.iter().all(|p| p.p99 <= 2.0 * alone.p99 && p.errors == 0);
        println!(
            "target: victim p99 under every attack within 2x of alone ({:.2} ms): worst {worst:.2} ms: {}",
            alone.p99,
            if met { "met" } else { "NOT met" }
        );
        let json = json!({
            "bench": "abuse",
            "rate": rate,
            "secs": secs,
            "alone": {"p50_ms": alone.p50, "p99_ms": alone.p99, "max_ms": alone.max, "errors": alone.errors},
            "attacks": phases.iter().map(|p| json!({
                "attack": p.name, "p50_ms": p.p50, "p99_ms": p.p99, "max_ms": p.max,
                "errors": p.errors, "checks": p.sent, "attacker_requests": p.attacker,
            })).collect::<Vec<_>>(),
            "target_met": met,
        });
        println!("{json}");
    });
}
