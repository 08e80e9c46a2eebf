//! The `Store` trait: the operations the service needs from its state, in terms of the
//! storage layout (`layout`). One implementation per backend, `redis` and the embedded
//! `memory`, and one conformance suite (`tests/conformance.rs`) both must pass.
//!
//! A store knows nothing of normalisation, expiry semantics or caching: it moves fields and
//! their raw expiry codes. Deciding what is listed is the service's job (`lists`), done once
//! for every backend.

pub mod dump;
pub mod layout;
pub mod memory;
pub mod redis;

use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;

pub use layout::{AuditRecord, EntryKey, Invalidation, Layout, PrefixLen, Scope};

/// Why a store call failed. Every variant is the service's (or its store's) problem, never
/// the caller's: the HTTP layer answers 503.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("store call timed out after {0:?}")]
    Timeout(Duration),
    #[error("unexpected data in the store: {0}")]
    Corrupt(String),
    #[error("keyspace: {0}")]
    Keyspace(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

/// The entries, registry additions and audit records of one upsert.
#[derive(Debug, Clone, Default)]
pub struct WriteBatch {
    /// (where, expiry code); for a key given twice the last one wins.
    pub entries: Vec<(EntryKey, u32)>,
    /// Prefix lengths that must be in each scope's registry.
    pub prefixes: Vec<(Scope, PrefixLen)>,
    pub audit: Vec<AuditRecord>,
}

/// A stream of invalidations. It ends when the subscription broke: whatever was cached may
/// since have changed unseen.
pub type InvalidationStream = BoxStream<'static, Invalidation>;

/// What the service needs from its state.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// `redis` or `memory`, for logs and metrics.
    fn kind(&self) -> &'static str;

    /// The keyspace this store was opened with.
    fn layout(&self) -> &Layout;

    /// Whether the store answers.
    async fn ping(&self) -> StoreResult<()>;

    /// The raw expiry codes stored at `keys`, in order (`None` = absent). Expired entries are
    /// returned as stored: the caller decides.
    async fn get_many(&self, keys: &[EntryKey]) -> StoreResult<Vec<Option<u32>>>;

    /// The registered prefix lengths of each scope, in order.
    async fn prefix_lengths(&self, scopes: &[Scope]) -> StoreResult<Vec<Vec<PrefixLen>>>;

    /// Upserts a batch, registers its prefix lengths, appends its audit records, then tells
    /// every instance to drop the changed fields. `Ok` only once the store took all of it.
    async fn write(&self, batch: WriteBatch) -> StoreResult<()>;

    /// Deletes `keys`, appends `audit`, publishes the invalidation; for each key, whether it
    /// was present and still live at `now_ms`.
    async fn remove(
        &self,
        keys: &[EntryKey],
        now_ms: i64,
        audit: Vec<AuditRecord>,
    ) -> StoreResult<Vec<bool>>;

    /// Deletes the field only if it still holds `code` (lazy expiry: a refresh that raced the
    /// deletion survives). Whether it was deleted.
    async fn remove_if_unchanged(&self, key: EntryKey, code: u32) -> StoreResult<bool>;

    /// Subscribes to the invalidations every writer publishes.
    async fn subscribe(&self) -> StoreResult<InvalidationStream>;

    /// Publishes an invalidation (writes publish their own; this is for bulk tools).
    async fn publish(&self, message: &Invalidation) -> StoreResult<()>;

    /// The newest `count` audit records, oldest first.
    async fn audit_tail(&self, count: usize) -> StoreResult<Vec<AuditRecord>>;
}

/// Expiry code comparison shared by both stores: is the entry with `code` live at `now_ms`?
pub fn code_is_live(code: u32, now_ms: i64) -> bool {
    crate::domain::Expiry::from_code(code).is_live(now_ms)
}
