//! The name-list service: upsert, delete, look up and check entries, on any `EntryStore`.
//!
//! Everything that decides *what is listed* lives here, once for every backend: expiry (an
//! expired field answers "absent" and is deleted off the request path by compare-and-delete,
//! so a refresh that raced it survives), IP ranges (one probe per registered prefix length),
//! the local tier in front of the store (`tier`), the deadlines and the
//! fail-open/fail-closed policy.
//!
//! A check asks the local tier first: a lookup whose bucket is held and in sync is answered
//! in memory, listed or not; the others go to the store in one pipelined round trip.
//!
//! Deadlines: a check's store work (registry and lookups together) gets `check_deadline`;
//! when it is missed or the store fails, fail-open answers from whatever the tier holds with
//! `degraded: true` and `stale_ms` (how long since those copies were last known in sync), and
//! fail-closed refuses (503). A write gets `write_deadline` and is acknowledged only if the
//! store took it; whatever the outcome, the tier reads the buckets it touched again (and
//! answers them from the store until then), since a write that timed out may still have
//! landed.
//!
//! The operators' reads are bounded whatever the keyspace holds: `summaries` is one page of
//! the store's counts (at most `MAX_PAGE_LIMIT` pairs, O(log n + page) in the store, one
//! hash-map lookup per pair for its hits), and `lookup_everywhere` reads the lists of one
//! sandbox only, at most `MAX_LOOKUP_LISTS` of them, and says when there were more.
//!
//! One file per concern, each an `impl NameLists` of its own over the struct defined here:
//! `write` (upsert, delete, and the list counts they change), `check` (the check and its
//! answer: probes, local tier, store, fail mode, hits), `reads` (the operators' reads: one
//! entry, the list counts page and its cursor, one identity on every list) and `reclaim`
//! (lazy expiry, off the request path).

mod check;
mod reads;
mod reclaim;
mod write;

pub use check::{CheckOutcome, CheckQuery, Hit, InvalidValue, RawCheck, Staleness, Unanswered};
pub use reads::{EverywhereOutcome, ListSummary, ListsPage, ListsQuery, RawListsQuery};
pub use write::check_entry_count;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::background::BackgroundTasks;
use crate::domain::{
    Dimension, Expiry, Norm, PhoneRegions, Rules, Sandbox, ValidationError, Value,
};
use crate::instrumented::Instrumented;
use crate::metrics::{Metrics, StoreOp};
use crate::store::{Deadline, EntryKey, EntryStore, InvalidationBus, Scope, StoreError};
use crate::tier::{LocalTier, RegistryCache, TierSettings};
use reclaim::reclaim_expired;

/// Most entries in one upsert or delete request.
pub const MAX_ENTRIES_PER_REQUEST: usize = 10_000;
/// Most subject values in one check.
pub const MAX_CHECK_VALUES: usize = 64;
/// Most lists in one check.
pub const MAX_CHECK_LISTS: usize = 16;
/// Most lookups (values × lists × prefix lengths) one check may fan out to.
pub const MAX_CHECK_PROBES: usize = 4096;
/// Longest `reason`, in bytes.
pub const MAX_REASON_LEN: usize = 256;
/// Most lists of one sandbox a lookup on every list reads (`lookup_everywhere`), the first
/// ones by name: past it, the answer says `truncated`. 1,000 lists are 63 checks.
pub const MAX_LOOKUP_LISTS: usize = 1_000;

/// What to do when the store cannot answer a check in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum FailMode {
    /// Answer from the local tier alone, flagged `degraded: true`.
    #[default]
    Open,
    /// Answer 503.
    Closed,
}

/// Tuning of the service.
#[derive(Debug, Clone)]
pub struct ListSettings {
    pub check_deadline: Duration,
    /// Deadline of operators' reads (lookups, list counts): they run on the operator lane.
    pub operator_deadline: Duration,
    pub write_deadline: Duration,
    pub fail_mode: FailMode,
    /// The local tier's `TierSettings::ttl`; also the registry cache's TTL.
    pub cache_ttl: Duration,
    /// Most buckets the local tier holds; 0 turns it off.
    pub cache_capacity: u64,
    /// The local tier's memory budget, in bytes; 0 turns it off.
    pub local_memory_bytes: u64,
    /// Background bucket reads per second (loading, refreshing); 0: unpaced.
    pub local_fetch_rate: u64,
    /// The tier's safety-net re-reads per second (`TierSettings::refresh_rate`).
    pub local_refresh_rate: u64,
    /// Where phone numbers without a country code are from, by sandbox (rules 2).
    pub phone_regions: PhoneRegions,
}

/// Why a name-list operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ListsError {
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error(transparent)]
    Unavailable(#[from] StoreError),
}

/// One entry to upsert.
#[derive(Debug, Clone)]
pub struct NewEntry {
    pub dimension: Dimension,
    pub value: Value,
    pub sandbox: Sandbox,
    pub expiry: Expiry,
    pub reason: Option<String>,
}

/// One entry to delete or look up.
#[derive(Debug, Clone)]
pub struct EntryRef {
    pub dimension: Dimension,
    pub value: Value,
    pub sandbox: Sandbox,
}

/// The name-list service of one instance.
pub struct NameLists {
    store: Instrumented<dyn EntryStore>,
    cache: Arc<LocalTier>,
    registries: Arc<RegistryCache>,
    settings: ListSettings,
    metrics: Arc<Metrics>,
    expired: mpsc::Sender<(EntryKey, u32, Scope)>,
    /// Hits answered by checks since this instance started, per scope (`GET /v1/lists`).
    hits: std::sync::Mutex<HashMap<Scope, u64>>,
    /// The background tasks (`new`), until `stop_background`.
    tasks: BackgroundTasks,
}

impl NameLists {
    /// Builds the service and starts its background tasks (invalidation listener, the local
    /// tier's worker, lazy expiry); they stop when it is dropped. Must run inside a Tokio
    /// runtime. The embedded store gets no tier: it is in memory already. `bus` is where the
    /// tier hears of other instances' writes (outside tests, the same backend as `store`).
    pub fn new(
        store: Arc<dyn EntryStore>,
        bus: Arc<dyn InvalidationBus>,
        settings: ListSettings,
        metrics: Arc<Metrics>,
    ) -> Self {
        let store = Instrumented::new(store, metrics.clone());
        let bus = Instrumented::new(bus, metrics.clone());
        let cache = LocalTier::new(
            store.layout().buckets(),
            TierSettings {
                budget_bytes: settings.local_memory_bytes,
                max_buckets: settings.cache_capacity,
                ttl: settings.cache_ttl,
                fetch_rate: settings.local_fetch_rate,
                refresh_rate: settings.local_refresh_rate,
                conflict_window: settings.write_deadline + Duration::from_secs(1),
            },
            !store.inner().in_process(),
        );
        let registries = RegistryCache::new(settings.cache_ttl);
        let (expired, rx) = mpsc::channel(4096);
        let marks = Arc::new(crate::invalidation::Marks::default());
        let tasks = vec![
            tokio::spawn(cache.clone().run(store.clone(), metrics.tier.clone())),
            tokio::spawn(crate::invalidation::watch_keyspace(bus.clone())),
            tokio::spawn(crate::invalidation::follow_log(
                bus.clone(),
                marks.clone(),
                cache.clone(),
                metrics.clone(),
                settings.write_deadline + Duration::from_secs(1),
            )),
            tokio::spawn(crate::invalidation::listen(
                bus,
                cache.clone(),
                registries.clone(),
                metrics.clone(),
                marks,
                // The longest a write's message may follow its records (its deadline), and
                // a second: the same as the conflict window.
                settings.write_deadline + Duration::from_secs(1),
            )),
            tokio::spawn(reclaim_expired(
                store.clone(),
                cache.clone(),
                rx,
                settings.write_deadline,
                metrics.clone(),
            )),
        ];
        Self {
            store,
            cache,
            registries,
            settings,
            metrics,
            expired,
            hits: std::sync::Mutex::new(HashMap::new()),
            tasks: BackgroundTasks::new(tasks),
        }
    }

    /// Stops the background tasks and waits until they have ended: once the server has
    /// stopped, nothing of this instance reads or writes Redis any more (a keyspace check of
    /// a stopped instance must not, say, mark a keyspace lost that it no longer serves).
    /// Later calls do nothing; dropping the service aborts them too, without waiting.
    pub async fn stop_background(&self) {
        self.tasks.stop().await;
    }

    /// The store itself, uninstrumented (tests; the service calls it through `Instrumented`).
    pub fn store(&self) -> &Arc<dyn EntryStore> {
        self.store.inner()
    }

    /// Whether the store answers within `within` (`/readyz`).
    pub async fn ping(&self, within: Duration) -> Result<(), StoreError> {
        self.store
            .call(StoreOp::Ping, Deadline::after(within), |s| s.ping())
            .await
    }

    /// The local tier (its trust state, mode and copies).
    pub fn cache(&self) -> &Arc<LocalTier> {
        &self.cache
    }

    pub fn settings(&self) -> &ListSettings {
        &self.settings
    }

    /// How values are normalised: the keyspace's rules, the sandboxes' phone regions.
    pub fn rules(&self) -> Rules {
        Rules {
            version: self.store.layout().rules(),
            regions: self.settings.phone_regions.clone(),
        }
    }

    /// How values of `sandbox` are normalised.
    pub fn norm(&self, sandbox: &Sandbox) -> Norm {
        self.settings
            .phone_regions
            .norm(self.store.layout().rules(), sandbox)
    }
}
