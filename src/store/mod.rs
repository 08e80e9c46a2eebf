//! The store traits: the operations the service needs from its state, in terms of the
//! storage layout (`layout`), one trait per concern. `StoreBase` (kind, keyspace, ping) is
//! extended by `EntryStore` (entries, prefix registries, audit trail), `InvalidationBus`
//! (pub/sub between instances), `MetricStore` (velocity counts), `DefinitionStore` (metric and
//! rule definitions) and `AuditReports` (what the bucket audit left); `Store` is all of them.
//! One implementation per backend, `redis` and the embedded `memory`, and one conformance
//! module per trait (`tests/integration/conformance/`) that both must pass.
//!
//! A store knows nothing of normalisation, expiry semantics or caching: it moves fields and
//! their raw expiry codes. Deciding what is listed is the service's job (`lists`), done once
//! for every backend.
//!
//! The traits are here; what they take and give is in one module per concern beside them,
//! re-exported so that every `store::X` is the path: `error` (`StoreError`, `Refusal`,
//! `KeyspaceHealth`), `deadline` (`Deadline`), `entries` (write batches, removals, the lists'
//! counts, audit reads), `bus` (the invalidation stream, the change log's marks and replays,
//! `Liveness`) and `velocity` (metric ops and definitions).

pub mod durable;
pub mod expiry;
pub mod fingerprint;
pub mod layout;
pub mod memory;
pub mod redis;

mod bus;
mod deadline;
mod entries;
mod error;
mod velocity;

use std::sync::Arc;

use async_trait::async_trait;

pub use bus::{InvalidationStream, Liveness, LogMark, LoggedChange, PartMark, Replay};
pub use deadline::Deadline;
pub use entries::{
    AuditChunk, AuditOp, AuditPos, AuditRead, AuditTerm, CountChange, CountsPage, CountsQuery,
    ListCount, RemoveBatch, Removed, WriteBatch,
};
pub(crate) use error::redis_error_may_pass_again;
pub use error::{
    KeyspaceHealth, LOST_MESSAGE, Refusal, SourceError, StoreError, StoreResult, one_each,
};
pub use expiry::ExpiryCode;
pub use fingerprint::{FingerprintKey, Hashing, KeyError};
pub use layout::{
    AuditRecord, AuditSummary, EntryKey, Invalidation, Layout, PrefixKind, PrefixLen, Scope,
};
pub use velocity::{
    DefinitionKind, EventMark, MAX_FUTURE_MARGIN_MS, MetricAnswer, MetricFamily, MetricOp,
    MetricReading, NewDefinition, StoredDefinition,
};

// ---- The store traits ----
//
// One trait per concern, each extending `StoreBase`. A backend implements them all (and so is
// a `Store`); a consumer holds only the one it uses, and a wrapper implements only the one it
// changes. Every caller in the service reaches them through `crate::instrumented`, which puts
// a deadline, a `store` span and metrics around each call.

/// What every store trait extends: which backend this is, the keyspace it was opened with and
/// whether it answers. Nothing here changes state.
#[async_trait]
pub trait StoreBase: Send + Sync + 'static {
    /// `redis` or `memory`, for logs and `/readyz`.
    fn kind(&self) -> &'static str;

    /// Whether what this store acknowledges survives the process, for `/readyz` and the
    /// console: the embedded store knows (a data directory or not); Redis's persistence is
    /// its own configuration's, which the service does not judge (`None`).
    fn durable(&self) -> Option<bool> {
        None
    }

    /// The keyspace this store was opened with. Callers build entry and metric keys with it;
    /// the store maps them to its own keys with the same one.
    fn layout(&self) -> &Layout;

    /// Whether the store answers (and, where a keyspace can be lost, still holds it).
    async fn ping(&self) -> StoreResult<()>;

    /// Where the store tells whether its keyspace is still there; `None` for a store that
    /// cannot lose it behind the service's back (the embedded one).
    fn keyspace(&self) -> Option<tokio::sync::watch::Receiver<KeyspaceHealth>> {
        None
    }

    /// Checks that the keyspace is still there (its id in its meta key), updating what
    /// `keyspace` says: `Err(Lost)` when it is not. Called every second by the service and
    /// before it trusts its copies again.
    async fn verify_keyspace(&self) -> StoreResult<()> {
        Ok(())
    }
}

/// The name-list entries: each entry's raw expiry code in its bucket, the IP prefix-length
/// registry of each scope, and the audit trail every change to them appends to. What the
/// name-list service (`lists`) and its local tier (`cache`) use.
///
/// Invariants: the store moves fields and raw codes and never decides what is listed (only
/// `remove` compares codes with a time, to report what was live); a write or a removal is
/// acknowledged only once all of it (entries, registries, audit records) is stored and its
/// invalidation published on the `InvalidationBus`, so an instance that hears the message and
/// reads again sees the change.
#[async_trait]
pub trait EntryStore: StoreBase {
    /// The raw expiry codes stored at `keys`, in order (`None` = absent). Expired entries are
    /// returned as stored: the caller decides.
    async fn get_many(&self, keys: &[EntryKey]) -> StoreResult<Vec<Option<u32>>>;

    /// Every (field, raw expiry code) of each bucket, in order (an empty list for a bucket
    /// that does not exist); the order within a bucket is unspecified. What the local tier
    /// (`cache`) fetches: a whole bucket answers every lookup that falls in it.
    async fn get_buckets(&self, buckets: &[u32]) -> StoreResult<Vec<Vec<(i64, u32)>>>;

    /// Whether the entries already live in this process (the embedded store), so that a
    /// local copy in front of them would only cost memory.
    fn in_process(&self) -> bool {
        false
    }

    /// Whether a write's invalidation is published atomically with it (one transaction on
    /// one node), so that messages arrive in the order of the writes: what lets the writing
    /// instance apply its own acknowledged upserts at once (`LocalTier::wrote_acked`).
    fn atomic_messages(&self) -> bool {
        false
    }

    /// Whether the store keeps the lists' counts itself, in the same commit as the writes and
    /// removals that change them (the embedded store: its counts cannot drift after a crash
    /// between a write and its count). Then `count_changes` is not called after `write`,
    /// `remove` or `remove_if_unchanged`: the store adds +1 for each field `write` created
    /// (scopes from `WriteBatch::scopes`; every scope of the batch has its last change moved),
    /// −1 for each field `remove` or `remove_if_unchanged` deleted (its scope as written).
    fn counts_itself(&self) -> bool {
        false
    }

    /// The registered prefix lengths of each scope, in order.
    async fn prefix_lengths(&self, scopes: &[Scope]) -> StoreResult<Vec<Vec<PrefixLen>>>;

    /// Upserts a batch, registers its prefix lengths, appends its audit records, then tells
    /// every instance to drop the changed fields. `Ok` only once the store took all of it
    /// (and, where the store replicates, once the replicas it was asked to wait for have it,
    /// within `deadline`); then, for each entry of the batch in order, whether it created a
    /// field that was not there (what the list counts add).
    async fn write(&self, batch: WriteBatch, deadline: Deadline) -> StoreResult<Vec<bool>>;

    /// Deletes the batch's `keys`, appends its `audit`, publishes the invalidation; for each
    /// key, what was there at `now_ms`.
    async fn remove(&self, batch: RemoveBatch<'_>, deadline: Deadline)
    -> StoreResult<Vec<Removed>>;

    /// Deletes the field only if it still holds `code` (lazy expiry: a refresh that raced the
    /// deletion survives). Whether it was deleted. Housekeeping: no audit record, no
    /// invalidation (the field was already answered as absent).
    async fn remove_if_unchanged(
        &self,
        key: EntryKey,
        code: u32,
        deadline: Deadline,
    ) -> StoreResult<bool>;

    /// The newest `count` audit records, oldest first.
    async fn audit_tail(&self, count: usize) -> StoreResult<Vec<AuditRecord>>;

    /// How many parts the audit trail is split in (`AuditRead::part` is below this).
    fn audit_parts(&self) -> u16;

    /// For each read, up to its `count` records of its part older than its bound (with its
    /// index term, if any), newest first, and where the part goes on; all reads at once (on
    /// Redis one `XREVRANGE` per read, or through the index a `ZRANGE` per read then an
    /// `XRANGE` per record: one round trip per primary for each). The merge by position is
    /// the caller's (`audit_trail`).
    ///
    /// Invariant: a read through an index returns exactly the records a read without one
    /// would, less those not indexed under its term, in the same order; no bound, however
    /// odd, is an error.
    async fn audit_read(&self, reads: &[AuditRead]) -> StoreResult<Vec<AuditChunk>>;

    /// Adds `delta` to each scope's approximate entry count and moves its last change up to
    /// `at_ms` (deltas of 0 too: a refresh is a change). A scope whose count reaches 0 or
    /// below is removed entirely (count, time and its place in both orders), so a scope
    /// exists only while its count is positive. Bookkeeping after a write or a removal that
    /// the store already took: see `list_counts`. Each scope's change is atomic; a batch is
    /// not.
    async fn count_changes(
        &self,
        changes: &[CountChange],
        at_ms: i64,
        deadline: Deadline,
    ) -> StoreResult<()>;

    /// One page of the scopes' approximate entry counts and last changes, in (list, sandbox)
    /// order (see `CountsQuery`). Cost: O(log n + limit), filtered or not, however many scopes
    /// the keyspace holds (a range read of an ordered index, never a scan).
    async fn list_counts(&self, query: &CountsQuery) -> StoreResult<CountsPage>;
}

/// The invalidation bus: how every instance hears of a change another one made (entries and
/// their codes, registries, bulk imports, definitions). Entry writes and definition changes
/// publish their own messages; `publish` is for the bulk tools.
///
/// Invariant: every message published while a subscription is up reaches it; a stream that
/// ends may have missed messages, so its subscriber must treat whatever it holds as changed.
#[async_trait]
pub trait InvalidationBus: StoreBase {
    /// Subscribes to the invalidations every writer publishes.
    async fn subscribe(&self) -> StoreResult<InvalidationStream>;

    /// Subscribes, with the proofs of delivery of that subscription when the bus can give
    /// them (`None`: an in-process bus, which delivers every message as it is published).
    async fn subscribe_proven(&self) -> StoreResult<(InvalidationStream, Option<Arc<Liveness>>)> {
        Ok((self.subscribe().await?, None))
    }

    /// Publishes an invalidation.
    async fn publish(&self, message: &Invalidation) -> StoreResult<()>;

    /// Where the change log stands now; `None` when the bus keeps no log (an in-process bus
    /// never misses a message).
    async fn log_mark(&self) -> StoreResult<Option<LogMark>> {
        Ok(None)
    }

    /// What was written after `from` up to `to` (now, when `None`), read from the log: a
    /// subscriber that lost messages after `from` catches up from it instead of reading
    /// everything it holds again, and every instance follows it to find messages that never
    /// arrived (`invalidation`).
    async fn log_read(&self, _from: &LogMark, _to: Option<&LogMark>) -> StoreResult<Replay> {
        Ok(Replay::Gap("this bus keeps no change log".into()))
    }
}

/// Velocity counts: per metric entity, the sub-window aggregates of one `MetricFamily`
/// (`layout` says how each is kept). What the velocity service (`velocity`) updates and reads.
///
/// Invariants: the updates carrying an event are applied at most once per event (the check
/// and the updates are one atomic step; on a Redis Cluster, one per slot the event's keys
/// live in), an event being remembered until its `keep_until_ms`; and a read aggregates
/// exactly the sub-windows
/// `[read_hi - slots + 1, read_hi]`; an entity's data expires by itself once no window can
/// read it.
#[async_trait]
pub trait MetricStore: StoreBase {
    /// Runs metric updates and reads, in one round trip; one answer per op, in order. Ops
    /// with an update are writes (bounded by `deadline` like `EntryStore::write`); reads only
    /// read.
    async fn metric_ops(
        &self,
        ops: &[MetricOp],
        deadline: Deadline,
    ) -> StoreResult<Vec<MetricAnswer>>;
}

/// Metric and rule definitions: id → (version, body), shared by every instance.
///
/// Invariants: a version is kept while the definition's fingerprint is unchanged and is
/// otherwise one more than any earlier version of the id, deleted ones included (so counts
/// kept under an old version are never read again); every change is published as
/// `Invalidation::Definition` (its kind and id) on the `InvalidationBus`.
#[async_trait]
pub trait DefinitionStore: StoreBase {
    /// Every live definition of a kind.
    async fn definitions(&self, kind: DefinitionKind) -> StoreResult<Vec<StoredDefinition>>;

    /// One definition, if it is live.
    async fn definition(
        &self,
        kind: DefinitionKind,
        id: &str,
    ) -> StoreResult<Option<StoredDefinition>>;

    /// Stores a definition and tells every instance. Returns its version.
    async fn put_definition(
        &self,
        definition: NewDefinition<'_>,
        deadline: Deadline,
    ) -> StoreResult<u64>;

    /// Deletes a definition (its version number stays reserved); whether it existed.
    async fn delete_definition(
        &self,
        kind: DefinitionKind,
        id: &str,
        deadline: Deadline,
    ) -> StoreResult<bool>;
}

/// What the bucket audit (`namelist-tools audit`) left in the keyspace for the service's
/// gauges. Read only: the tool writes it through the Redis store's own methods.
#[async_trait]
pub trait AuditReports: StoreBase {
    /// The last audit's summary (`<prefix>audit:last`), if an audit left one. The embedded
    /// store is never audited: always `None`.
    async fn audit_summary(&self) -> StoreResult<Option<AuditSummary>>;
}

/// A whole backend: every store trait. What `startup` opens and hands, one trait at a time,
/// to the services; implemented by every type that implements them all.
pub trait Store:
    EntryStore + InvalidationBus + MetricStore + DefinitionStore + AuditReports
{
}

impl<T> Store for T where
    T: EntryStore + InvalidationBus + MetricStore + DefinitionStore + AuditReports
{
}

/// Expiry code comparison shared by both stores: is the entry with `code` live at `now_ms`?
pub fn code_is_live(code: u32, now_ms: i64) -> bool {
    ExpiryCode::new(code).is_live(now_ms)
}
