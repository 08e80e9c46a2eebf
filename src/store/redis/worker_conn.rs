//! A connection per HTTP worker, driven by that worker's own runtime: one set for reads, and
//! one for writes when they wait for no replicas (`write_pool`).
//!
//! Each actix worker is a thread with a current-thread Tokio runtime; the store's shared read
//! connection is driven by the service's multi-thread runtime. A check's round trip on the
//! shared connection hops threads twice (the worker hands the request to the connection's
//! task on another thread, whose reply wakes the worker again): in a profile of the load
//! bench's 20× mix (most lookups to Redis) ~15 % of the service's CPU went to those context
//! switches, and with a connection per worker the mix's maximum rose from 11,742 to 14,486
//! checks/s and the service's CPU at 5,000 checks/s fell from ~55 % to 36 % of a core.
//!
//! So [`PerWorker::get`] gives the calling thread a connection of its own when the thread runs
//! a current-thread runtime (an HTTP worker; elsewhere it answers `None` and the caller uses
//! the shared connection). The first call on a thread starts connecting in the background and
//! answers `None` (no request waits for a connect); so does every call until the connection
//! is up, and for `RETRY` after a failed connect. A connection reconnects by itself like the
//! shared one (`ConnectionManager`, same options: TLS, password, timeouts), and speaks RESP3,
//! so that, like the write pool's members, it notices a dropped connection at once and
//! reconnects in the background: a worker idle while Redis restarts finds it up again rather
//! than failing its next check. It belongs to the
//! runtime that made it: a slot whose runtime has ended (a sentinel task there has finished)
//! is dropped and made again, and slots of dropped stores are swept, so a thread that outlives
//! runtimes or stores (tests) never uses a dead connection or keeps one of a dropped store.
//!
//! One node only: a cluster's reads keep the shared connection set (one multiplexed connection
//! per node, kept healthy by `HealingCluster`); a set per worker would multiply its slot-map
//! refreshes and healing, and was not measured.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use redis::Client;
use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::task::JoinHandle;

use super::conn::{ConnectOptions, RedisConn};

/// Wait after a failed connect before a thread tries again.
const RETRY: Duration = Duration::from_secs(1);

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

enum State {
    Connecting,
    Ready(RedisConn),
    Failed(Instant),
}

struct Slot {
    /// The connection once seen up: later calls take it without the lock.
    conn: Option<RedisConn>,
    /// Set by the connecting task.
    state: Arc<Mutex<State>>,
    /// A task that never ends on the runtime that made the connection: finished once that
    /// runtime is gone, and the connection with it.
    sentinel: JoinHandle<()>,
    /// The store this slot serves; dead once it is dropped.
    owner: Weak<()>,
}

thread_local! {
    static SLOTS: RefCell<HashMap<u64, Slot>> = RefCell::new(HashMap::new());
}

/// Per-worker connections of one store, for one use (`role`: reads or writes).
pub struct PerWorker {
    id: u64,
    alive: Arc<()>,
    opts: ConnectOptions,
    clients: Vec<Client>,
    role: &'static str,
}

impl PerWorker {
    /// `None` for a cluster (see the module docs). `role` names the connections in logs.
    pub fn new(opts: &ConnectOptions, clients: &[Client], role: &'static str) -> Option<Self> {
        (!opts.cluster).then(|| Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            alive: Arc::new(()),
            opts: opts.clone(),
            clients: clients.to_vec(),
            role,
        })
    }

    /// The calling thread's own connection, when it has one up; `None` tells the caller to
    /// use the shared connection (and may start connecting one for this thread).
    pub fn get(&self) -> Option<RedisConn> {
        let handle = Handle::try_current().ok()?;
        if handle.runtime_flavor() != RuntimeFlavor::CurrentThread {
            return None;
        }
        SLOTS.with_borrow_mut(|slots| {
            if let Some(slot) = slots.get_mut(&self.id)
                && !slot.sentinel.is_finished()
            {
                if let Some(conn) = &slot.conn {
                    return Some(conn.clone());
                }
                match &*slot.state.lock().expect("slot lock") {
                    State::Connecting => return None,
                    State::Ready(conn) => {
                        slot.conn = Some(conn.clone());
                        return Some(conn.clone());
                    }
                    State::Failed(at) if at.elapsed() < RETRY => return None,
                    State::Failed(_) => {}
                }
            }
            // No slot, its runtime ended, or a retry is due: a new one, and those of dropped
            // stores forgotten.
            slots.retain(|id, s| *id != self.id && s.owner.strong_count() > 0);
            let state = Arc::new(Mutex::new(State::Connecting));
            let (opts, clients, filled) = (self.opts.clone(), self.clients.clone(), state.clone());
            let role = self.role;
            handle.spawn(async move {
                let made = RedisConn::open(&opts, &clients, true, role).await;
                let mut state = filled.lock().expect("slot lock");
                *state = match made {
                    Ok(conn) => State::Ready(conn),
                    Err(e) => {
                        tracing::debug!(error = %e, role, "a worker's own connection failed to connect; the shared ones serve meanwhile");
                        State::Failed(Instant::now())
                    }
                };
            });
            let sentinel = handle.spawn(std::future::pending::<()>());
            slots.insert(
                self.id,
                Slot {
                    conn: None,
                    state,
                    sentinel,
                    owner: Arc::downgrade(&self.alive),
                },
            );
            None
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(url: String) -> ConnectOptions {
        ConnectOptions {
            urls: vec![url],
            cluster: false,
            connect_timeout: Duration::from_millis(200),
            response_timeout: Duration::from_millis(500),
        }
    }

    /// Not on a current-thread runtime, or a cluster: the shared connection.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn only_current_thread_runtimes_get_one() {
        let o = opts("redis://127.0.0.1:1".into());
        let clients = vec![Client::open(o.urls[0].as_str()).unwrap()];
        let w = PerWorker::new(&o, &clients, "reads (worker)").unwrap();
        assert!(w.get().is_none());
        assert!(SLOTS.with_borrow(|s| s.is_empty()), "nothing started");
        let mut c = o.clone();
        c.cluster = true;
        assert!(PerWorker::new(&c, &clients, "reads (worker)").is_none());
    }

    /// Nothing listens: the thread keeps answering `None` (the shared connection), retries
    /// after `RETRY`, and a slot of a runtime that has ended is made again, never used.
    #[test]
    fn a_failed_or_orphaned_connection_is_never_used() {
        let o = opts("redis://127.0.0.1:1".into());
        let clients = vec![Client::open(o.urls[0].as_str()).unwrap()];
        let w = PerWorker::new(&o, &clients, "reads (worker)").unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            assert!(w.get().is_none(), "connecting");
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(w.get().is_none(), "failed");
            let failed =
                SLOTS.with_borrow(|s| matches!(*s[&w.id].state.lock().unwrap(), State::Failed(_)));
            assert!(failed);
        });
        drop(rt);
        let sentinel_done = SLOTS.with_borrow(|s| s[&w.id].sentinel.is_finished());
        assert!(sentinel_done, "the runtime is gone");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            assert!(w.get().is_none());
            let fresh = SLOTS.with_borrow(|s| !s[&w.id].sentinel.is_finished());
            assert!(fresh, "a new slot on the new runtime");
        });
        // A dropped store's slot is swept when another store makes one.
        let id = w.id;
        drop(w);
        let other = PerWorker::new(&o, &clients, "reads (worker)").unwrap();
        rt.block_on(async {
            assert!(other.get().is_none());
        });
        assert!(SLOTS.with_borrow(|s| !s.contains_key(&id)));
    }
}
