//! The one rate limiter of the tools: `import --max-rows-per-sec`, `audit
//! --max-buckets-per-sec` and `sweep --max-ops-per-sec` all pace their Redis work with a
//! [`Pace`].
//!
//! Units (rows, buckets, commands) are spaced `1 / rate` apart: a request for `n` units waits
//! for its slot, then holds the next `n / rate` seconds for itself. Idle time earns no burst:
//! a slot in the past is moved to now, so a run that was slow for a while (a busy Redis) does
//! not catch up by sending faster than the rate afterwards. Over any span `T` a run sends at
//! most `rate × T` units plus one request's worth.
//!
//! A [`Pace`] is shared by reference between concurrent writers (`import` keeps several
//! pipelines in flight): its state is behind a std `Mutex`, not a Tokio one, because the lock
//! is only held to take a slot, never across an `.await`.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Spaces units of work `1 / rate` apart (see the module's header); rate 0: no limit.
#[derive(Debug)]
pub struct Pace {
    /// Units a second; 0: unpaced.
    per_sec: u64,
    /// The next free slot.
    next: Mutex<Instant>,
}

impl Pace {
    /// At most `per_sec` units a second; 0 means no limit.
    pub fn per_sec(per_sec: u64) -> Self {
        Self {
            per_sec,
            next: Mutex::new(Instant::now()),
        }
    }

    /// Waits until `units` units may go, and holds their time.
    pub async fn take(&self, units: u64) {
        if self.per_sec == 0 {
            return;
        }
        let held = u128::from(units) * 1_000_000_000 / u128::from(self.per_sec);
        let held = Duration::from_nanos(u64::try_from(held).unwrap_or(u64::MAX));
        let at = {
            let mut next = self.next.lock().expect("the pace's lock is never poisoned");
            let now = Instant::now();
            if *next < now {
                // Idle time earns no burst.
                *next = now;
            }
            let at = *next;
            *next += held;
            at
        };
        tokio::time::sleep_until(at).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn units_are_spaced_and_idle_time_earns_no_burst() {
        let pace = Pace::per_sec(10);
        let started = Instant::now();
        pace.take(1).await;
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "the first unit goes at once"
        );
        pace.take(5).await;
        assert_eq!(started.elapsed(), Duration::from_millis(100));
        pace.take(1).await;
        assert_eq!(
            started.elapsed(),
            Duration::from_millis(600),
            "5 units held 0.5 s"
        );
        tokio::time::sleep(Duration::from_secs(10)).await;
        let idle = Instant::now();
        pace.take(1).await;
        pace.take(1).await;
        assert_eq!(
            idle.elapsed(),
            Duration::from_millis(100),
            "no burst after idling"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn zero_is_unpaced() {
        let pace = Pace::per_sec(0);
        let started = Instant::now();
        for _ in 0..1000 {
            pace.take(1000).await;
        }
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_takers_share_the_rate() {
        let pace = std::sync::Arc::new(Pace::per_sec(100));
        let started = Instant::now();
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let pace = pace.clone();
                tokio::spawn(async move {
                    for _ in 0..10 {
                        pace.take(5).await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        // 200 units at 100/s: the last request of 5 starts at 1.95 s.
        assert_eq!(started.elapsed(), Duration::from_millis(1950));
    }
}
