//! The service as a child process (the release `namelist` binary, `tests/common`'s
//! `ServiceProcess`): started with the bench's settings, waited for (subscription, a settled
//! local tier), its resident memory and `/metrics` read; and every answer of a sample
//! verified.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value as Json;

use crate::common::{self, ServiceProcess};
use crate::data::Subject;

pub(crate) struct Service {
    process: ServiceProcess,
    base: String,
}

impl Service {
    async fn start(
        redis_url: &str,
        workers: usize,
        extra: &[(&str, &str)],
        dir: &Path,
        http: &reqwest::Client,
    ) -> Self {
        let process = ServiceProcess::builder()
            .env("NAMELIST_REDIS_URL", redis_url)
            .env("NAMELIST_LOG_FORMAT", "json")
            .env("RUST_LOG", "warn")
            .env("NAMELIST_WORKERS", workers.to_string())
            .env("NAMELIST_CHECK_DEADLINE_MS", "20")
            .env("NAMELIST_FINGERPRINT_KEY_FILE", common::key_file())
            .envs(extra.iter().copied())
            .log_dir(dir)
            .ready_within(Duration::from_secs(20))
            .start()
            .await;
        let service = Self {
            base: process.url(""),
            process,
        };
        service.wait_subscribed(http).await;
        service
    }

    pub(crate) fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Resident memory of the process, from /proc (bytes).
    fn rss(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
            .unwrap_or(0)
            * 1024
    }

    /// Resident memory once idle: after 2 s without traffic (the allocator returns what the
    /// load's read buffers took), the least of 5 samples 200 ms apart. Measured the same way
    /// on the tier-on and tier-off instances, so their difference is the tier's.
    pub(crate) async fn idle_rss(&self) -> u64 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut least = u64::MAX;
        for _ in 0..5 {
            least = least.min(self.rss());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        least
    }

    /// Waits until the local tier has settled: complete and every bucket loaded, or off, or
    /// partial with every bucket answering locally (its filter, or a copy, in sync:
    /// `namelist_tier_answering_ratio`), then preloading for `settle` more; a partial tier
    /// whose filters do not fit never gets there and is taken as settled after `settle`. The
    /// mode reached.
    async fn wait_tier(&self, http: &reqwest::Client, settle: Duration) -> &'static str {
        let started = Instant::now();
        let mut partial_since = None;
        loop {
            let v = self
                .metrics(
                    http,
                    &[
                        "namelist_tier_mode{mode=\"complete\"}",
                        "namelist_tier_mode{mode=\"partial\"}",
                        "namelist_tier_mode{mode=\"off\"}",
                        "namelist_tier_loaded_ratio",
                        "namelist_tier_answering_ratio",
                        "namelist_tier_filter_bits_per_entry",
                    ],
                )
                .await;
            if v[0] == 1.0 && v[3] >= 1.0 {
                return "complete";
            }
            if v[1] == 1.0 {
                let since = *partial_since.get_or_insert_with(Instant::now);
                if v[4] >= 0.999 {
                    tokio::time::sleep(settle).await;
                    return "partial";
                }
                if v[5] == 0.0 && since.elapsed() >= settle {
                    return "partial";
                }
            }
            if v[2] == 1.0 {
                return "off";
            }
            assert!(
                started.elapsed() < Duration::from_secs(600),
                "the local tier did not settle within 10 minutes"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Waits until the invalidation subscription is up (the process is ready already).
    async fn wait_subscribed(&self, http: &reqwest::Client) {
        let started = Instant::now();
        while self
            .metric(http, "namelist_invalidation_subscription_up")
            .await
            != 1.0
        {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the service's invalidation subscription was not up within 20 s:\n{}",
                self.process.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// One value of `/metrics` (summed over its series); 0 if absent.
    pub(crate) async fn metric(&self, http: &reqwest::Client, name: &str) -> f64 {
        self.metrics(http, &[name]).await[0]
    }

    pub(crate) async fn metrics(&self, http: &reqwest::Client, names: &[&str]) -> Vec<f64> {
        let text = match http.get(self.url("/metrics")).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        names
            .iter()
            .map(|name| {
                text.lines()
                    .filter(|l| {
                        l.strip_prefix(name).is_some_and(|rest| {
                            rest.starts_with(' ') || (rest.starts_with('{') && !name.contains('{'))
                        })
                    })
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum()
            })
            .collect()
    }

    pub(crate) fn stop(mut self) {
        self.process.kill();
    }
}

/// Counters read around a run: cache hits, cache misses, degraded answers, refused answers.
pub(crate) const COUNTERS: [&str; 4] = [
    "namelist_cache_hits_total",
    "namelist_cache_misses_total",
    "namelist_degraded_answers_total",
    "namelist_refused_answers_total",
];

/// Posts `n` bodies (spread over the list) and checks every answer: 200, not degraded, hits
/// exactly when the subject carries a listed value. Returns the number of answers with hits.
pub(crate) async fn verify(
    http: &reqwest::Client,
    service: &Service,
    subjects: &[Subject],
    n: usize,
) -> usize {
    let url = service.url("/v1/check");
    let step = (subjects.len() / n.max(1)).max(1);
    let mut with_hits = 0;
    for s in subjects.iter().step_by(step).take(n) {
        let res = http
            .post(&url)
            .header("content-type", "application/json")
            .body(s.body())
            .send()
            .await
            .expect("check request");
        let status = res.status().as_u16();
        let body: Json = res.json().await.expect("check answer JSON");
        assert_eq!(status, 200, "check answered {status}: {body}");
        assert_eq!(body["degraded"], false, "degraded answer: {body}");
        let hits = body["hits"].as_array().map(Vec::len).unwrap_or(0);
        assert_eq!(
            hits > 0,
            s.listed,
            "subject listed={} but {hits} hits: {}",
            s.listed,
            s.body()
        );
        with_hits += usize::from(hits > 0);
    }
    with_hits
}

/// The idle resident memory of a tier-off instance started with `extra`: what the tier's
/// instance is measured against.
pub(crate) async fn rss_without_tier(
    redis_url: &str,
    workers: usize,
    extra: &[(&str, &str)],
    dir: &Path,
    http: &reqwest::Client,
) -> u64 {
    let mut env = extra.to_vec();
    env.push(("NAMELIST_LOCAL_MEMORY_MB", "0"));
    let probe = Service::start(redis_url, workers, &env, dir, http).await;
    let rss = probe.idle_rss().await;
    probe.stop();
    rss
}

/// A service started with `extra`, once its tier has settled; the seconds from spawning it
/// to a settled tier, and the mode reached.
pub(crate) async fn start_settled(
    redis_url: &str,
    workers: usize,
    extra: &[(&str, &str)],
    dir: &Path,
    http: &reqwest::Client,
) -> (Service, f64, &'static str) {
    let spawned = Instant::now();
    let service = Service::start(redis_url, workers, extra, dir, http).await;
    let mode = service.wait_tier(http, Duration::from_secs(2)).await;
    (service, spawned.elapsed().as_secs_f64(), mode)
}
