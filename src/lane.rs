//! The operator lane: where operators' requests do their work, away from the risk engine's.
//!
//! An HTTP worker thread answers the risk engine's checks; an audit search that examines ten
//! thousand records or a page of a hundred thousand list counts on that thread would hold
//! every check queued behind it for as long as it takes (it did: 93 ms of CPU per audit call
//! took other clients' check p99 from 1 to 78 ms). So operators' work (lists, lookups, audit,
//! definitions) runs on a Tokio runtime of its own, [`OperatorLane`], whose one thread runs at
//! a lower scheduling priority (`nice` +10: under contention the kernel gives it about a
//! tenth of what an HTTP worker gets), and the Redis store sends what it asks from that
//! thread over a connection of its own ([`on_operator_lane`]), so a late reply to an
//! operator's call never sits in front of a check's.
//!
//! A request's work is moved to the lane whole, with the permit of its route class
//! (`routes::gate`): if its client goes away, the work still runs to its own deadline and
//! only then gives the permit back, so the class budget bounds the operator work the store
//! is doing, not only the requests whose clients still wait.
//!
//! And one operator's work at a time ([`OperatorLane::turn`]): Redis runs one connection's
//! commands back to back, so sixteen pages of list counts sent at once (2-5 ms of Redis each)
//! stood 20 ms or more in front of every check's command that arrived meanwhile, past the
//! check's 20 ms deadline. Taking turns bounds what operators queue in Redis to one request's
//! commands; a request that waits longer than its class's deadline for its turn is refused
//! (503 `overloaded`) unsent.
//!
//! This module depends on nothing else of the crate: the store (below) asks
//! [`on_operator_lane`], the routes (above) spawn onto the lane.

use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::{Builder, Handle, Runtime};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

thread_local! {
    static OPERATOR: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is the operator lane's (the Redis store then reads over its
/// operator connection).
pub fn on_operator_lane() -> bool {
    OPERATOR.with(Cell::get)
}

/// How much lower the lane's thread is scheduled than the HTTP workers (added to the `nice`
/// value, at most 19).
pub const NICENESS: i32 = 10;

/// Lowers the calling thread's scheduling priority (Linux: `setpriority` on a thread id
/// affects that thread only). Best effort: a refusal is logged once per thread.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: plain syscalls on the calling thread's own id.
        let r = unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            // Relative to the process's own niceness (a nicer process stays nicer).
            let now = libc::getpriority(libc::PRIO_PROCESS, tid);
            libc::setpriority(libc::PRIO_PROCESS, tid, (now + NICENESS).min(19))
        };
        if r != 0 {
            tracing::warn!(
                error = %std::io::Error::last_os_error(),
                "the operator lane runs at the HTTP workers' priority"
            );
        }
    }
}

/// A runtime of its own for operators' work (see the module docs).
pub struct OperatorLane {
    runtime: Option<Runtime>,
    handle: Handle,
    /// One operator's work at a time (see the module docs).
    turns: Arc<Semaphore>,
    /// The longest a request waits for its turn.
    wait: Duration,
}

impl OperatorLane {
    /// Starts the lane with `threads` threads (at least 1); a request waits at most `wait`
    /// for its turn.
    pub fn start(threads: usize, wait: Duration) -> std::io::Result<Self> {
        let runtime = Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("namelist-operator")
            .on_thread_start(|| {
                OPERATOR.with(|o| o.set(true));
                lower_priority();
            })
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        Ok(Self {
            runtime: Some(runtime),
            handle,
            turns: Arc::new(Semaphore::new(1)),
            wait,
        })
    }

    /// Waits for this request's turn to do its work (see the module docs): `None` if it did
    /// not come within the lane's wait.
    pub fn turn(&self) -> impl Future<Output = Option<OwnedSemaphorePermit>> + Send + 'static {
        let (turns, wait) = (self.turns.clone(), self.wait);
        async move {
            tokio::time::timeout(wait, turns.acquire_owned())
                .await
                .ok()?
                .ok()
        }
    }

    /// Runs `work` on the lane.
    pub fn spawn<F>(&self, work: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(work)
    }
}

impl Drop for OperatorLane {
    fn drop(&mut self) {
        // Dropped from inside another runtime (an HTTP worker's): never block there.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_runs_on_the_lane_thread_at_a_lower_priority() {
        let lane = OperatorLane::start(1, Duration::from_secs(1)).unwrap();
        assert!(!on_operator_lane());
        let (on_lane, nice) = lane
            .spawn(async {
                // SAFETY: reads the calling thread's own priority.
                let nice = unsafe {
                    libc::getpriority(
                        libc::PRIO_PROCESS,
                        libc::syscall(libc::SYS_gettid) as libc::id_t,
                    )
                };
                (on_operator_lane(), nice)
            })
            .await
            .unwrap();
        assert!(on_lane);
        assert!(nice >= NICENESS, "nice {nice}");
        drop(lane);
    }

    #[tokio::test]
    async fn one_turn_at_a_time_and_a_bounded_wait() {
        let lane = OperatorLane::start(1, Duration::from_millis(50)).unwrap();
        let first = lane.turn().await.expect("the first turn is free");
        assert!(
            lane.turn().await.is_none(),
            "a second turn while the first is held"
        );
        drop(first);
        assert!(lane.turn().await.is_some(), "the turn is given back");
        drop(lane);
    }
}
