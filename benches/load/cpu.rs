//! CPU accounting: `/proc/<pid>/stat` of the service and Redis, `/proc/stat` for the whole
//! machine (`CpuMark`), and Redis's own CPU seconds (`INFO cpu`), read around each run.

use std::process::Command;
use std::time::Instant;

pub(crate) fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// utime + stime of a process, in ticks.
fn proc_ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let get = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    get(11) + get(12)
}

/// Busy ticks of the whole machine (all CPUs), from /proc/stat.
fn machine_busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().next() else {
        return 0;
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    total - idle
}

#[derive(Clone, Copy)]
pub(crate) struct CpuMark {
    at: Instant,
    service: u64,
    redis: u64,
    machine: u64,
}

impl CpuMark {
    pub(crate) fn take(service: Option<u32>, redis: u32) -> Self {
        Self {
            at: Instant::now(),
            service: service.map(proc_ticks).unwrap_or(0),
            redis: proc_ticks(redis),
            machine: machine_busy_ticks(),
        }
    }

    /// Percent of one core used since `self` by (service, Redis, everything else).
    pub(crate) fn since(&self, service: Option<u32>, redis: u32, tck: f64) -> [f64; 3] {
        let now = Self::take(service, redis);
        let secs = now.at.duration_since(self.at).as_secs_f64().max(1e-3);
        let p = |t: u64| t as f64 / tck / secs * 100.0;
        let s = p(now.service.saturating_sub(self.service));
        let r = p(now.redis.saturating_sub(self.redis));
        let m = p(now.machine.saturating_sub(self.machine));
        [s, r, (m - s - r).max(0.0)]
    }
}

/// Redis's own CPU seconds so far (`used_cpu_user + used_cpu_sys` of `INFO cpu`).
pub(crate) fn redis_cpu_seconds(url: &str) -> f64 {
    tokio::task::block_in_place(|| crate::common::redis_cpu_seconds(url))
}
