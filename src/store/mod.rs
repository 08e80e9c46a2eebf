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

pub mod durable;
pub mod expiry;
pub mod fingerprint;
pub mod layout;
pub mod memory;
pub mod redis;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::stream::BoxStream;

use crate::domain::{ListName, Sandbox};

pub use expiry::ExpiryCode;
pub use fingerprint::{FingerprintKey, Hashing, KeyError};
pub use layout::{
    AuditRecord, AuditSummary, EntryKey, Invalidation, Layout, PrefixKind, PrefixLen, Scope,
};

/// Why a store call failed. Every variant is the service's (or its store's) problem, never
/// the caller's: the HTTP layer answers 503.
///
/// A failure that came from a lower-level error (Redis, I/O, decoding) keeps it as its
/// `source()`, so a log that walks the chain sees the original; the message is the same
/// either way.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("store unavailable: {message}")]
    Unavailable {
        message: String,
        #[source]
        source: Option<SourceError>,
    },
    #[error("store call timed out after {0:?}")]
    Timeout(Duration),
    #[error("unexpected data in the store: {message}")]
    Corrupt {
        message: String,
        #[source]
        source: Option<SourceError>,
    },
    #[error("keyspace: {0}")]
    Keyspace(String),
    /// The keyspace this store was opened with is gone from the store (restarted empty,
    /// flushed, failed over to an empty node) or replaced by another: nothing read from the
    /// store now is its state, and nothing written is kept (`KeyspaceHealth`).
    #[error("keyspace lost: {0}")]
    Lost(String),
    /// A write refused before anything was sent: nothing was written.
    #[error("write refused, nothing written: {0}")]
    Refused(Refusal),
}

/// The lower-level error a `StoreError` came from; shared so that `StoreError` stays `Clone`
/// (one failed call may be answered to several waiters). To downcast it, take it from the
/// variant (`source.downcast_ref::<RedisError>()`): `Error::source` hands out the `Arc`.
pub type SourceError = std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>;

impl StoreError {
    /// The store did not answer, or answered with an error; `message` says what was tried.
    pub fn unavailable(message: String) -> Self {
        StoreError::Unavailable {
            message,
            source: None,
        }
    }

    /// As `unavailable`, keeping the error it came from; the message is that error's.
    pub fn unavailable_from(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        StoreError::Unavailable {
            message: source.to_string(),
            source: Some(std::sync::Arc::new(source)),
        }
    }

    /// The store answered with something this version cannot read.
    pub fn corrupt(message: String) -> Self {
        StoreError::Corrupt {
            message,
            source: None,
        }
    }

    /// As `corrupt`, keeping the error it came from; the message is that error's.
    pub fn corrupt_from(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        StoreError::Corrupt {
            message: source.to_string(),
            source: Some(std::sync::Arc::new(source)),
        }
    }
}

/// Which guarantee a write could not be given, found before anything was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The primary answers but has fewer online replicas than writes must wait for.
    #[error(
        "primary {primary} (slots {slots}) has {online} online replica(s); writes need {needed}"
    )]
    Replicas {
        primary: String,
        slots: String,
        needed: u32,
        online: u32,
    },
    /// The primary does not answer (down, cut off, or not yet replaced by its replica).
    #[error("primary {primary} (slots {slots}) is unreachable: {why}")]
    Unreachable {
        primary: String,
        slots: String,
        why: String,
    },
    /// Too little of the caller's deadline is left to send the write and wait for replicas.
    #[error("only {left:?} of the deadline left")]
    NoTime { left: Duration },
    /// Every write connection stayed busy (waiting for replicas) until the deadline.
    #[error("all {connections} write connections stayed busy until the deadline")]
    Busy { connections: usize },
    /// The keyspace is lost (`KeyspaceHealth::Lost`): nothing is written until it is back.
    #[error("the keyspace is lost")]
    KeyspaceLost,
}

impl Refusal {
    /// The `reason` label of `namelist_write_refusals_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Refusal::Replicas { .. } => "replicas",
            Refusal::Unreachable { .. } => "unreachable",
            Refusal::NoTime { .. } => "deadline",
            Refusal::Busy { .. } => "busy",
            Refusal::KeyspaceLost => "keyspace_lost",
        }
    }

    /// What the HTTP caller is told: the guarantee, by slot range (node addresses stay in
    /// the log).
    pub fn public_message(&self) -> String {
        match self {
            Refusal::Replicas {
                slots,
                needed,
                online,
                ..
            } => format!(
                "writes wait for {needed} replica(s) of every primary they touch, and the primary of slots {slots} has {online} online; nothing was written, retry later"
            ),
            Refusal::Unreachable { slots, .. } => format!(
                "the primary of slots {slots} is unreachable; nothing was written, retry later"
            ),
            Refusal::NoTime { .. } => {
                "too little of the write deadline was left to write and wait for replicas; nothing was written, retry later".to_owned()
            }
            Refusal::Busy { .. } => {
                "every write connection was busy waiting for replicas until the deadline; nothing was written, retry later".to_owned()
            }
            Refusal::KeyspaceLost => LOST_MESSAGE.to_owned(),
        }
    }
}

/// What a caller is told of a lost keyspace (the cause goes to the log).
pub const LOST_MESSAGE: &str = "the keyspace this service was opened with is gone from Redis \
    (restarted empty, flushed, or replaced): nothing is written until it is restored; checks \
    are answered from this instance's copies per fail_mode";

/// Whether the store still holds the keyspace it was opened with (`StoreBase::keyspace`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyspaceHealth {
    /// Its keyspace id is where it was.
    Present,
    /// The id is missing or another one: since `since_ms` (Unix ms), for `why`.
    Lost { since_ms: i64, why: String },
}

pub type StoreResult<T> = Result<T, StoreError>;

/// When the caller of a store call stops waiting. Writes take it so that nothing they ask of
/// the server outlives the request: a `WAIT` for replicas is given the time left (less a
/// margin), never more, and a write with too little time left is not sent at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    at: tokio::time::Instant,
    budget: Duration,
}

impl Deadline {
    /// `budget` from now.
    pub fn after(budget: Duration) -> Self {
        Self {
            at: tokio::time::Instant::now() + budget,
            budget,
        }
    }

    /// The instant itself, for `tokio::time::timeout_at`.
    pub fn instant(self) -> tokio::time::Instant {
        self.at
    }

    /// The whole budget it was made with (for messages).
    pub fn budget(self) -> Duration {
        self.budget
    }

    /// Time left (zero once passed).
    pub fn remaining(self) -> Duration {
        self.at
            .saturating_duration_since(tokio::time::Instant::now())
    }
}

/// What an audit record says was done to an entry; its `op` field, spelt as `as_str`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuditOp {
    /// Added or changed through the API (`upsert`).
    Upsert,
    /// Deleted through the API (`delete`).
    Delete,
    /// Written in bulk by `namelist-tools import` (`import`).
    Import,
}

impl AuditOp {
    /// The `op` field as stored in the audit trail (never changes: readers match on it).
    pub fn as_str(self) -> &'static str {
        match self {
            AuditOp::Upsert => "upsert",
            AuditOp::Delete => "delete",
            AuditOp::Import => "import",
        }
    }
}

impl std::fmt::Display for AuditOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a removal found at one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removed {
    Absent,
    /// Present but expired: deleted, not counted as removed by the API, but it was counted in
    /// its list's entries.
    Expired,
    Live,
}

impl Removed {
    pub fn was_live(self) -> bool {
        self == Removed::Live
    }

    pub fn was_present(self) -> bool {
        self != Removed::Absent
    }
}

/// A change to one scope's approximate entry count (`EntryStore::count_changes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountChange {
    pub scope: Scope,
    pub delta: i64,
}

/// One scope's approximate entry count and the time of its last change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListCount {
    pub list: String,
    pub sandbox: String,
    pub entries: i64,
    pub last_change_ms: i64,
}

/// Which scopes' counts to read (`EntryStore::list_counts`): those of `list` and of
/// `sandbox` when given, strictly after `after` in (list, sandbox) order (names compared byte
/// by byte), at most `limit` of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountsQuery {
    pub list: Option<ListName>,
    pub sandbox: Option<Sandbox>,
    pub after: Option<Scope>,
    pub limit: usize,
}

impl CountsQuery {
    /// The first `limit` scopes, unfiltered.
    pub fn first(limit: usize) -> Self {
        Self {
            list: None,
            sandbox: None,
            after: None,
            limit,
        }
    }

    /// Whether a scope passes the filters and comes after `after` (the oracle every backend's
    /// range reads must agree with).
    pub fn selects(&self, list: &str, sandbox: &str) -> bool {
        self.list.as_ref().is_none_or(|l| l.as_str() == list)
            && self.sandbox.as_ref().is_none_or(|s| s.as_str() == sandbox)
            && self
                .after
                .as_ref()
                .is_none_or(|a| (list, sandbox) > (a.list.as_str(), a.sandbox.as_str()))
    }
}

/// One page of counts (`EntryStore::list_counts`), in (list, sandbox) order; `more` when
/// further scopes match past the last one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CountsPage {
    pub counts: Vec<ListCount>,
    pub more: bool,
}

/// Where an audit record sits in the merged trail: newest first is descending
/// (`ms`, `seq`, `part`), the stream id of the part holding it, then the part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AuditPos {
    pub ms: u64,
    pub seq: u64,
    pub part: u16,
}

impl AuditPos {
    /// `ms-seq-part`, the form a cursor carries.
    pub fn encode(self) -> String {
        format!("{}-{}-{}", self.ms, self.seq, self.part)
    }

    /// The inverse of `encode`; `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        let mut it = s.split('-');
        let pos = Self {
            ms: it.next()?.parse().ok()?,
            seq: it.next()?.parse().ok()?,
            part: it.next()?.parse().ok()?,
        };
        it.next().is_none().then_some(pos)
    }
}

/// A term of the audit trail's index: what a read through the index finds
/// (`AuditRead::index`). Every record is indexed, when written, under the terms of the
/// fields it has (`AuditRecord::terms`): at most one of each kind.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AuditTerm {
    /// The record's value fingerprint (its `vfp` field, `Layout::audit_value`): one entry's
    /// value in its dimension, in every list and sandbox. Records written before the field
    /// existed have none.
    Value(u64),
    /// The record's `who` (a token's name, an import's actor).
    Who(String),
    /// The record's `list`.
    List(String),
}

/// One part's read of the audit trail (`EntryStore::audit_read`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRead {
    pub part: u16,
    /// Records older than this stream position `(ms, seq)` of the part (the newest when
    /// `None`), and at it too when `inclusive`. Any position is valid, `(0, 0)` exclusive
    /// included (nothing is older): a cursor is the caller's input, and no position it holds
    /// may turn into a command the store refuses.
    pub before: Option<(u64, u64)>,
    pub inclusive: bool,
    pub count: usize,
    /// Only the records indexed under this term, read through the part's index: the cost is
    /// that of the records returned (plus a probe of the index), not of the records passed
    /// over. `None`: every record.
    pub index: Option<AuditTerm>,
}

/// What one `AuditRead` found: up to its `count` records of its part, newest first, each
/// with its place in the merged trail, and where the part goes on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditChunk {
    pub records: Vec<(AuditPos, AuditRecord)>,
    /// The position `(ms, seq)` the next read of the part starts strictly before; `None` when
    /// nothing older is left. Past the last record returned when it is one: a read through an
    /// index may pass over index entries whose record is gone (`layout`, *Audit trail*), and
    /// must not meet them again.
    pub next: Option<(u64, u64)>,
}

impl AuditRead {
    /// Whether nothing can be older than the bound: exclusive of the very first position.
    pub fn before_everything(&self) -> bool {
        self.before == Some((0, 0)) && !self.inclusive
    }
}

/// The entries, registry additions and audit records of one upsert.
#[derive(Debug, Clone, Default)]
pub struct WriteBatch {
    /// (where, expiry code); for a key given twice the last one wins.
    pub entries: Vec<(EntryKey, u32)>,
    /// Prefix lengths that must be in each scope's registry.
    pub prefixes: Vec<(Scope, PrefixLen)>,
    pub audit: Vec<AuditRecord>,
    /// The (list, sandbox) of each entry, in the order of `entries`, for a store that keeps
    /// the lists' counts with its writes (`EntryStore::counts_itself`); others ignore it.
    /// Entries beyond its length are not counted there.
    pub scopes: Vec<Scope>,
}

/// How a metric entity is kept: one family per Lua script.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetricFamily {
    /// COUNT and SUM: a hash of sub-window → total.
    Sum,
    /// AVG: a hash of `2i` → sum, `2i+1` → count.
    Avg,
    /// MIN: a hash of sub-window → minimum.
    Min,
    /// MAX: a hash of sub-window → maximum.
    Max,
    /// COUNT_DISTINCT: a sorted set of member → last sub-window seen, capped.
    Distinct,
    /// APPROX_COUNT_DISTINCT: a HyperLogLog per sub-window.
    Approx,
}

/// One update and/or read of one metric entity (see `layout` for what each family stores).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricOp {
    pub family: MetricFamily,
    /// The entity's key (`Layout::metric_key`).
    pub key: String,
    /// Sub-windows in the window (`W / r`).
    pub slots: i64,
    pub resolution_ms: i64,
    /// An update: (sub-window, value). The value is the increment (COUNT: 1, SUM/AVG: the
    /// scaled amount), the observed scaled amount (MIN/MAX) or the member's hash (distinct).
    pub update: Option<(i64, i64)>,
    /// The value returned aggregates sub-windows `[read_hi - slots + 1, read_hi]`.
    pub read_hi: i64,
    /// Updates trim sub-windows older than `trim_hi - slots + 1` (`trim_hi` = the present).
    pub trim_hi: i64,
    /// COUNT_DISTINCT: most members kept (the oldest go first).
    pub cap: u32,
    /// The event an update comes from, if it has an id: an event already applied is not
    /// applied again (checked in the same atomic call as its updates).
    pub event: Option<EventMark>,
    /// Whether to read the value back.
    pub read: bool,
}

/// The event of a metric update with an id: what is remembered, until when, and which
/// event of the request it is (ops of one event share it; the same id twice in a request is
/// two events, the second a replay of the first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventMark {
    /// The keyed hash of (type, id): `Layout::event_hash`.
    pub hash: i64,
    /// Unix ms until which it is remembered (`layout`, *Event ids*).
    pub keep_until_ms: i64,
    /// Its position in the request.
    pub seq: u32,
}

/// How far ahead of a store's clock the newest metric data may be: events up to 5 minutes in
/// the future (`velocity::MAX_FUTURE_MS`) and a minute of clock difference between instances.
pub const MAX_FUTURE_MARGIN_MS: i64 = 6 * 60_000;

impl MetricOp {
    /// When the entity's data written by this op stops being readable.
    pub fn expire_at(&self) -> Option<i64> {
        self.update
            .map(|(sub, _)| (sub + self.slots) * self.resolution_ms)
    }

    /// An expiry for the entity's key that no update any instance may make needs moved
    /// later: past the newest sub-window one could write (`trim_hi` and
    /// `MAX_FUTURE_MARGIN_MS`), so it can be set without reading the key's current one.
    /// APPROX_COUNT_DISTINCT keys hold one sub-window each: theirs is `expire_at`.
    pub fn key_expire_at(&self) -> Option<i64> {
        let (sub, _) = self.update?;
        if self.family == MetricFamily::Approx {
            return self.expire_at();
        }
        let r = self.resolution_ms.max(1);
        let ahead = (MAX_FUTURE_MARGIN_MS + r - 1) / r + 1;
        Some((sub.max(self.trim_hi + ahead) + self.slots) * self.resolution_ms)
    }
}

/// What a metric op read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricReading {
    /// COUNT, SUM: the total (0 when empty).
    Sum(i64),
    /// AVG: total and count.
    Avg { sum: i64, count: i64 },
    /// MIN, MAX: `None` when empty.
    Extreme(Option<i64>),
    /// COUNT_DISTINCT, APPROX_COUNT_DISTINCT; `capped` when the member cap is reached.
    Distinct { count: i64, capped: bool },
}

/// What a metric op did: whether its update was a replay, and the value it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricAnswer {
    pub duplicate: bool,
    pub reading: Option<MetricReading>,
}

/// Metric or rule definitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefinitionKind {
    Metric,
    Rule,
}

impl DefinitionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DefinitionKind::Metric => "metric",
            DefinitionKind::Rule => "rule",
        }
    }
}

/// A live definition as stored: its id, version and JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredDefinition {
    pub id: String,
    pub version: u64,
    pub body: String,
}

/// A stream of invalidations. It ends when the subscription broke: whatever was cached may
/// since have changed unseen.
pub type InvalidationStream = BoxStream<'static, Invalidation>;

/// Where the change log stood when an instance looked (`InvalidationBus::log_mark`): per audit
/// part (the trail is the change log, `layout`, *The change log*), how many records were ever
/// added to it and the id of the newest. Both come from one `XINFO STREAM`, so they agree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogMark {
    pub parts: Vec<PartMark>,
    /// The `run_id` of every Redis node holding parts (sorted): a node restarted or failed
    /// over since may have lost writes whose messages were heard, which no part's count
    /// shows, so the log alone cannot say what changed.
    pub nodes: Vec<String>,
}

/// One audit part's place in a [`LogMark`]: `added` is the stream's `entries-added` (never
/// goes down while the stream lives), `last` its last generated id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartMark {
    pub added: u64,
    pub last: (u64, u64),
}

/// One change a record of the change log tells: an entry's field in its bucket, and its new
/// code (`None`: deleted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoggedChange {
    pub bucket: u32,
    pub field: i64,
    pub code: Option<u32>,
}

/// What the change log says happened between two [`LogMark`]s (`InvalidationBus::log_read`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replay {
    /// Every record added between the marks, as the changes they tell (in order within each
    /// part).
    Changes(Vec<LoggedChange>),
    /// What happened cannot be known from the log: why (a part trimmed past the mark, a
    /// part gone or behind it, a node restarted, a record that names no bucket such as an
    /// import's, more records than a replay reads, or a bus without a log).
    Gap(String),
}

/// How a subscription proves that it still delivers: the bus pings it, and each answered ping
/// proves that every message published (to the node it listens on) before the ping was sent
/// has been delivered to the stream. The ping's send time is left here for the listener,
/// which passes it on only after the messages already in the stream: so a proof never runs
/// ahead of what was applied. A connection that silently stops delivering (a node stopped,
/// half-open) is thus noticed in `PROOF_EVERY`, not at the ping's timeout.
#[derive(Debug, Default)]
pub struct Liveness {
    proven: std::sync::Mutex<Option<Instant>>,
    pub notify: tokio::sync::Notify,
}

impl Liveness {
    /// How often a bus that can prove delivery pings its subscription.
    pub const PROOF_EVERY: Duration = Duration::from_millis(25);

    /// A ping sent at `sent` was answered.
    pub fn proved(&self, sent: Instant) {
        let mut p = self.proven.lock().expect("liveness lock");
        if p.is_none_or(|t| t < sent) {
            *p = Some(sent);
        }
        drop(p);
        self.notify.notify_one();
    }

    /// The latest proof, taken.
    pub fn take(&self) -> Option<Instant> {
        self.proven.lock().expect("liveness lock").take()
    }
}

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

    /// Deletes `keys`, appends `audit`, publishes the invalidation; for each key, what was
    /// there at `now_ms`.
    async fn remove(
        &self,
        keys: &[EntryKey],
        now_ms: i64,
        audit: Vec<AuditRecord>,
        deadline: Deadline,
    ) -> StoreResult<Vec<Removed>>;

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
/// `Invalidation::Definitions` on the `InvalidationBus`.
#[async_trait]
pub trait DefinitionStore: StoreBase {
    /// Every live definition of a kind.
    async fn definitions(&self, kind: DefinitionKind) -> StoreResult<Vec<StoredDefinition>>;

    /// Stores a definition and tells every instance. Returns its version.
    async fn put_definition(
        &self,
        kind: DefinitionKind,
        id: &str,
        fingerprint: &str,
        body: &str,
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn a_store_error_keeps_its_source_and_its_message() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let e = StoreError::unavailable_from(io);
        assert_eq!(e.to_string(), "store unavailable: reset by peer");
        let source = e.source().expect("the I/O error is kept");
        assert_eq!(source.to_string(), "reset by peer");
        // Through the variant, the original error itself (not only its text).
        let StoreError::Unavailable {
            source: Some(kept), ..
        } = &e
        else {
            panic!("{e:?}")
        };
        assert_eq!(
            kept.downcast_ref::<std::io::Error>().map(|e| e.kind()),
            Some(std::io::ErrorKind::ConnectionReset)
        );

        let plain = StoreError::corrupt("bucket value 7 is not a code".into());
        assert_eq!(
            plain.to_string(),
            "unexpected data in the store: bucket value 7 is not a code"
        );
        assert!(plain.source().is_none());
    }
}
