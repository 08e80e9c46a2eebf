//! A service phase: the mixes run against one instance (a warm-up, the fixed rates, then the
//! unlimited rate), each run measured with the service's counters and the CPU around it, and
//! upserts going on meanwhile (`NAMELIST_LOAD_WRITE_RATE`).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};

use crate::cpu::{CpuMark, redis_cpu_seconds};
use crate::generator::Generator;
use crate::report::Row;
use crate::service::{COUNTERS, Service};
use crate::settings::{Knobs, SANDBOX, WARMUP_SECS};

/// Everything a service phase needs.
pub(crate) struct Phase<'a> {
    pub(crate) knobs: &'a Knobs,
    pub(crate) generator: &'a Generator,
    pub(crate) http: &'a reqwest::Client,
    pub(crate) redis_pid: u32,
    pub(crate) redis_url: &'a str,
    pub(crate) tck: f64,
}

/// Upserts at a fixed rate through the service while a run goes on (`NAMELIST_LOAD_WRITE_RATE`).
struct Writer {
    stop: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<WriteStats>,
}

#[derive(Default)]
struct WriteStats {
    acked: u64,
    failed: u64,
    slowest: Duration,
}

impl WriteStats {
    fn print(&self) {
        println!(
            "  {:<12} writes meanwhile: {} acknowledged, {} refused or failed, slowest {:.1} ms",
            "",
            self.acked,
            self.failed,
            self.slowest.as_secs_f64() * 1e3
        );
    }
}

impl Writer {
    /// `None` when `rate` is 0. Each upsert carries 10 device values of its own (`tag`, a
    /// counter), never checked by any mix.
    fn start(http: reqwest::Client, url: String, rate: u64, tag: String) -> Option<Self> {
        if rate == 0 {
            return None;
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut stats = WriteStats::default();
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut n = 0u64;
            while !flag.load(Ordering::Relaxed) {
                tick.tick().await;
                let entries: Vec<Json> = (0..10)
                    .map(|i| {
                        json!({"dimension": "device", "value": format!("w-{tag}-{n}-{i}"),
                               "sandbox": SANDBOX, "ttl_seconds": 3600, "reason": "load bench"})
                    })
                    .collect();
                n += 1;
                let started = Instant::now();
                let ok = http
                    .post(&url)
                    .json(&json!({ "entries": entries }))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                stats.slowest = stats.slowest.max(started.elapsed());
                if ok {
                    stats.acked += 1;
                } else {
                    stats.failed += 1;
                }
            }
            stats
        });
        Some(Self { stop, task })
    }

    async fn stop(self) -> WriteStats {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or_default()
    }
}

impl Phase<'_> {
    /// One generator run against `service`, with the service's counters and CPU around it.
    async fn measure(
        &self,
        mix: &str,
        workers: usize,
        service: &Service,
        bodies: &Path,
        rate: Option<u64>,
        secs: f64,
    ) -> Row {
        let before = service.metrics(self.http, &COUNTERS).await;
        let redis_cpu = redis_cpu_seconds(self.redis_url);
        let cpu = CpuMark::take(Some(service.pid()), self.redis_pid);
        let perf: Vec<Child> = match (&self.knobs.perf_dir, rate) {
            (Some(dir), _) => {
                std::fs::create_dir_all(dir).expect("perf directory");
                let at = rate.map_or("max".to_owned(), |r| r.to_string());
                [("service", service.pid()), ("redis", self.redis_pid)]
                    .into_iter()
                    .filter_map(|(who, pid)| {
                        // cpu-clock: virtual machines often have no hardware counters.
                        Command::new("perf")
                            .args(["record", "-e", "cpu-clock", "-F", "999", "-g", "-p"])
                            .arg(pid.to_string())
                            .arg("-o")
                            .arg(dir.join(format!("{mix}-w{workers}-{at}-{who}.perf.data")))
                            .args(["--", "sleep"])
                            .arg(format!("{}", secs.ceil() as u64))
                            .stdout(Stdio::null())
                            .stderr(Stdio::null())
                            .spawn()
                            .ok()
                    })
                    .collect()
            }
            _ => Vec::new(),
        };
        let url = service.url("/v1/check");
        let (generator, knobs, path) = (self.generator, self.knobs, bodies.to_path_buf());
        let writer = Writer::start(
            self.http.clone(),
            service.url("/v1/lists/grey/entries"),
            knobs.write_rate,
            format!("{mix}-{}", rate.map_or("max".into(), |r| r.to_string())),
        );
        let m = tokio::task::block_in_place(|| {
            generator.run(
                &url,
                &path,
                rate,
                secs,
                knobs.connections,
                knobs.gen_threads,
            )
        });
        let cpu = cpu.since(Some(service.pid()), self.redis_pid, self.tck);
        let redis_cpu = redis_cpu_seconds(self.redis_url) - redis_cpu;
        for mut p in perf {
            let _ = p.wait();
        }
        let after = service.metrics(self.http, &COUNTERS).await;
        let d: Vec<f64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        let lookups = d[0] + d[1];
        let row = Row {
            mix: mix.to_owned(),
            workers: Some(workers),
            rate,
            m: m.clone(),
            degraded: d[2],
            refused: d[3],
            cache_hit_pct: (lookups > 0.0).then(|| d[0] / lookups * 100.0),
            redis_ms_per_1k: (m.ok > 0).then(|| redis_cpu * 1e3 / m.ok as f64 * 1e3),
            cpu,
        };
        row.print();
        if let Some(w) = writer {
            w.stop().await.print();
        }
        row
    }

    /// Warm-up, the fixed rates, then the unlimited rate.
    pub(crate) async fn mix(
        &self,
        mix: &str,
        workers: usize,
        service: &Service,
        bodies: &Path,
        rates: &[u64],
    ) -> Vec<Row> {
        let warm_rate = rates.first().copied().unwrap_or(1_000);
        tokio::task::block_in_place(|| {
            self.generator.run(
                &service.url("/v1/check"),
                bodies,
                self.generator.fixed_rates().then_some(warm_rate),
                WARMUP_SECS,
                self.knobs.connections,
                self.knobs.gen_threads,
            )
        });
        let mut rows = Vec::new();
        if self.generator.fixed_rates() {
            for &r in rates {
                rows.push(
                    self.measure(mix, workers, service, bodies, Some(r), self.knobs.secs)
                        .await,
                );
            }
        }
        rows.push(
            self.measure(mix, workers, service, bodies, None, self.knobs.secs * 1.5)
                .await,
        );
        rows
    }
}
