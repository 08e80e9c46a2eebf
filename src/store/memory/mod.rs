//! The embedded in-process store: what `namelist serve` runs on when no Redis is configured,
//! so the service works on a fresh machine. It mirrors the Redis layout (entries keyed by
//! bucket and field, expiry codes, per-scope prefix registries, a capped and indexed audit
//! trail) so that both stores behave identically under the conformance suite.
//!
//! With a data directory (`data_dir`) it is durable: every change is written to a redb
//! database (`store::durable`) before it is acknowledged, all of the state below (entries
//! with their expiry, registries, the audit trail, the lists' counts, definitions, velocity
//! windows and event ids), and loaded from it at start. Without one it lives in memory only
//! (tests, `cargo run`), and start-up says so at WARN. A snapshot file of an older build is
//! imported once into a new data directory (`import_snapshot`) and left where it is.
//!
//! | concern | file |
//! |---|---|
//! | entries and prefix registries (`EntryStore`) | `entries` |
//! | the audit trail and its index | `audit` |
//! | the lists' counts | `counts` |
//! | velocity metrics and event ids (`MetricStore`) | `metrics` |
//! | metric and rule definitions (`DefinitionStore`) | `definitions` |
//! | the durable record's rows, opening it, older snapshot files | `persist` |
//!
//! State sits behind one std `Mutex`: every operation is a few hash-map steps and no lock is
//! held across an `.await`.

mod audit;
mod counts;
mod definitions;
mod entries;
mod metrics;
mod persist;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Mutex;

use async_trait::async_trait;
use futures::StreamExt;
use tokio::sync::broadcast;

use self::audit::AuditSlot;
use self::metrics::MetricState;
pub use self::persist::SnapshotMeta;
use self::persist::{
    META_BUCKETS, META_FORMAT, META_KEY_ID, META_RULES, check_recorded, encode, load, recorded_meta,
};
use super::durable::{Change, Durable, Pending, Table};
use super::{
    AuditReports, AuditSummary, AuditTerm, EntryKey, Invalidation, InvalidationBus,
    InvalidationStream, Layout, PrefixLen, Scope, StoreBase, StoreResult,
};

#[derive(Default)]
struct State {
    /// Each field → (expiry code, the id of its (list, sandbox) in `scopes`, or `NO_SCOPE`).
    entries: HashMap<EntryKey, (u32, u32)>,
    /// The (list, sandbox) of each scope id, and back: the scope an entry was written in, for
    /// the counts its deletion changes.
    scopes: Vec<(String, String)>,
    scope_ids: HashMap<(String, String), u32>,
    registries: HashMap<Scope, BTreeSet<PrefixLen>>,
    /// The audit trail, oldest first: positions strictly increase (see `AuditSlot`).
    audit: VecDeque<AuditSlot>,
    audit_seq: u64,
    /// (list, sandbox) → (approximate entry count, always > 0; last change), in (list,
    /// sandbox) order, and the same pairs as (sandbox, list): what the Redis layout's count
    /// hashes and its two indexes hold, so a page is a range read either way.
    counts: BTreeMap<(String, String), (i64, i64)>,
    counts_by_sandbox: BTreeSet<(String, String)>,
    /// The `ms` of the newest position (the clock, never going back).
    audit_ms: u64,
    /// Each index term → the `seq` of every record of `audit` indexed under it, and nothing
    /// else: kept with `audit` on every append and every trim.
    audit_index: HashMap<AuditTerm, BTreeSet<u64>>,
    metrics: HashMap<String, MetricState>,
    /// Events applied (their hash → Unix ms until which they are remembered).
    events: HashMap<i64, i64>,
    /// (kind, id) → (version, fingerprint, body); an empty fingerprint is a deletion.
    definitions: BTreeMap<(&'static str, String), (u64, String, String)>,
    ops_since_purge: u64,
}

/// The scope id of an entry written without one (an imported snapshot's): not counted.
const NO_SCOPE: u32 = u32::MAX;

/// The embedded store.
pub struct MemoryStore {
    layout: Layout,
    state: Mutex<State>,
    audit_max_len: usize,
    invalidations: broadcast::Sender<Invalidation>,
    /// The durable record, with a data directory.
    durable: Option<Durable>,
}

impl MemoryStore {
    /// An empty store in memory only, or the one recorded in `durable` (made there if new).
    /// A record of another format, key or bucket count is refused, as Redis's meta key is.
    pub fn open(
        layout: Layout,
        audit_max_len: usize,
        durable: Option<Durable>,
    ) -> StoreResult<Self> {
        let mut state = State::default();
        if let Some(d) = &durable {
            let place = d.path().display().to_string();
            let rows = d.take_loaded();
            let meta_rows = &rows[0];
            match recorded_meta(meta_rows, &place)? {
                Some(meta) => {
                    check_recorded(&layout, &meta, &place)?;
                    load(&mut state, rows, &place)?;
                }
                None => d.write_now(vec![
                    (
                        Table::Meta,
                        META_FORMAT.to_vec(),
                        Some(encode(&layout.format())),
                    ),
                    (
                        Table::Meta,
                        META_KEY_ID.to_vec(),
                        Some(encode(layout.hashing().key_id().unwrap_or(""))),
                    ),
                    (
                        Table::Meta,
                        META_BUCKETS.to_vec(),
                        Some(encode(&layout.buckets())),
                    ),
                    (
                        Table::Meta,
                        META_RULES.to_vec(),
                        Some(encode(&layout.rules())),
                    ),
                ])?,
            }
        }
        let (invalidations, _) = broadcast::channel(1024);
        Ok(Self {
            layout,
            state: Mutex::new(state),
            audit_max_len,
            invalidations,
            durable,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("memory store lock")
    }

    /// Refuses a write before anything is applied when the durable record has stopped.
    fn writable(&self) -> StoreResult<()> {
        self.durable
            .as_ref()
            .map_or(Ok(()), Durable::check_writable)
    }

    /// Queues one operation's rows (under the state's lock, right after applying them).
    fn record(&self, changes: Vec<Change>) -> Option<Pending> {
        self.durable.as_ref().map(|d| d.queue(changes))
    }

    /// Waits until what `record` queued is durable.
    async fn durable(pending: Option<Pending>) -> StoreResult<()> {
        match pending {
            Some(p) => p.durable().await,
            None => Ok(()),
        }
    }

    /// Number of fields stored, expired ones included (what `HLEN` would sum to).
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait]
impl StoreBase for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn durable(&self) -> Option<bool> {
        Some(self.durable.is_some())
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    async fn ping(&self) -> StoreResult<()> {
        Ok(())
    }
}

#[async_trait]
impl InvalidationBus for MemoryStore {
    async fn subscribe(&self) -> StoreResult<InvalidationStream> {
        let rx = self.invalidations.subscribe();
        // A lagging receiver has missed messages: end the stream so the cache is dropped.
        Ok(futures::stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.ok().map(|m| (m, rx)) },
        )
        .boxed())
    }

    async fn publish(&self, message: &Invalidation) -> StoreResult<()> {
        let _ = self.invalidations.send(message.clone());
        Ok(())
    }
}

/// The embedded store is never audited (the audit tool reads Redis).
#[async_trait]
impl AuditReports for MemoryStore {
    async fn audit_summary(&self) -> StoreResult<Option<AuditSummary>> {
        Ok(None)
    }
}
