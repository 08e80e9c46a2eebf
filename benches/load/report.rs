//! One row of the report: a run's figures, printed as a table line and as JSON.

use serde_json::{Value as Json, json};

use crate::generator::Measured;

pub(crate) struct Row {
    pub(crate) mix: String,
    pub(crate) workers: Option<usize>,
    pub(crate) rate: Option<u64>,
    pub(crate) m: Measured,
    pub(crate) degraded: f64,
    pub(crate) refused: f64,
    pub(crate) cache_hit_pct: Option<f64>,
    pub(crate) cpu: [f64; 3],
    /// Redis CPU seconds (user + sys, `INFO cpu`) per 1,000 checks answered, in ms.
    pub(crate) redis_ms_per_1k: Option<f64>,
}

impl Row {
    pub(crate) fn json(&self) -> Json {
        json!({
            "mix": self.mix,
            "workers": self.workers,
            "rate": self.rate,
            "achieved_per_sec": self.m.rps,
            "ok": self.m.ok,
            "p50_ms": self.m.p50_ms,
            "p99_ms": self.m.p99_ms,
            "p999_ms": self.m.p999_ms,
            "errors": self.m.errors,
            "statuses": self.m.statuses,
            "degraded": self.degraded,
            "refused": self.refused,
            "cache_hit_pct": self.cache_hit_pct,
            "cpu_pct": {"service": self.cpu[0], "redis": self.cpu[1], "other": self.cpu[2]},
            "redis_cpu_ms_per_1000_checks": self.redis_ms_per_1k,
        })
    }

    pub(crate) fn print(&self) {
        println!(
            "  {:<12} {:>7} {:>7} {:>10.0} {:>8.3} {:>8.3} {:>8.3} {:>7} {:>8} {:>7} {:>5.0}/{:>3.0}/{:>3.0} {:>9}",
            self.mix,
            self.workers.map(|w| w.to_string()).unwrap_or("-".into()),
            self.rate.map(|r| r.to_string()).unwrap_or("max".into()),
            self.m.rps,
            self.m.p50_ms,
            self.m.p99_ms,
            self.m.p999_ms,
            self.m.errors,
            self.degraded + self.refused,
            self.cache_hit_pct
                .map(|p| format!("{p:.1}"))
                .unwrap_or("-".into()),
            self.cpu[0],
            self.cpu[1],
            self.cpu[2],
            self.redis_ms_per_1k
                .map(|v| format!("{v:.2}"))
                .unwrap_or("-".into()),
        );
    }
}

pub(crate) fn print_header() {
    println!(
        "  {:<12} {:>7} {:>7} {:>10} {:>8} {:>8} {:>8} {:>7} {:>8} {:>7} {:>13} {:>9}",
        "mix",
        "workers",
        "rate",
        "checks/s",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "errors",
        "degraded",
        "local %",
        "cpu% svc/rd/gen",
        "rd ms/1k"
    );
}
