//! The local cache in front of the store: most checks are answered without a round trip.
//!
//! * `LookupCache` holds, per entry key, either the live expiry code (a hit, cached never
//!   beyond the entry's own expiry) or "absent" (a miss), each for at most the configured TTL,
//!   within a bounded capacity (moka: TinyLFU admission, per-entry expiry).
//! * Concurrent misses for one key are coalesced: a fetch registers its keys as in flight;
//!   a check that needs one of them awaits that fetch instead of issuing its own, and fetches
//!   only the rest, still in one pipelined round trip. Fetches run as their own tasks, so a
//!   caller that gives up (deadline) never leaves a half-done fetch for others to resume.
//! * Invalidation races: a fetch that started before a write may return the old value after
//!   the write's invalidation arrived. Each key maps to one of 1024 epoch counters that every
//!   invalidation of the key bumps; a fetch inserts its results and then drops every key whose
//!   epoch moved while it was in flight, so an old value never outlives the invalidation.
//! * Trust: while the invalidation subscription is down, writes elsewhere go unseen, so the
//!   cache is *untrusted*: normal answers bypass it (every lookup goes to the store), but a
//!   fail-open answer may still use it when the store is unreachable. On resubscribing the
//!   cache is cleared before it is trusted again.
//!
//! `RegistryCache` does the same, more simply, for the IP prefix-length registries.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared, join_all};
use moka::Expiry;
use moka::future::Cache;

use crate::domain::{EPOCH_2020_MS, now_ms};
use crate::store::{EntryKey, PrefixLen, Scope, Store, StoreError, code_is_live};

const STRIPES: usize = 1024;

/// What the cache knows about one entry key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cached {
    /// Listed, with this expiry code (0 = never).
    Listed(u32),
    /// Not listed (absent, or expired).
    Absent,
}

impl Cached {
    /// The cache form of a raw stored code read at `now_ms`: expired entries are misses.
    pub fn from_stored(code: Option<u32>, now_ms: i64) -> Self {
        match code {
            Some(c) if code_is_live(c, now_ms) => Cached::Listed(c),
            _ => Cached::Absent,
        }
    }

    pub fn code(self) -> Option<u32> {
        match self {
            Cached::Listed(c) => Some(c),
            Cached::Absent => None,
        }
    }
}

struct Lifetime {
    ttl: Duration,
}

impl Lifetime {
    fn of(&self, value: &Cached) -> Duration {
        match value {
            Cached::Listed(code) if *code != 0 => {
                let until = EPOCH_2020_MS + i64::from(*code) * 1000 - now_ms();
                self.ttl.min(Duration::from_millis(until.max(0) as u64))
            }
            _ => self.ttl,
        }
    }
}

impl Expiry<EntryKey, Cached> for Lifetime {
    fn expire_after_create(&self, _: &EntryKey, value: &Cached, _: Instant) -> Option<Duration> {
        Some(self.of(value))
    }

    fn expire_after_update(
        &self,
        _: &EntryKey,
        value: &Cached,
        _: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        Some(self.of(value))
    }
}

/// Raw stored codes by key, as one fetch returned them.
pub type Fetched = HashMap<EntryKey, Option<u32>>;
type FetchFuture = Shared<BoxFuture<'static, Result<Arc<Fetched>, StoreError>>>;

/// The entry cache with coalesced fetches.
pub struct LookupCache {
    entries: Cache<EntryKey, Cached>,
    epochs: Box<[AtomicU64]>,
    trusted: AtomicBool,
    inflight: Mutex<HashMap<EntryKey, (u64, FetchFuture)>>,
    next_fetch: AtomicU64,
}

impl LookupCache {
    pub fn new(capacity: u64, ttl: Duration) -> Arc<Self> {
        let entries = Cache::builder()
            .max_capacity(capacity)
            .expire_after(Lifetime { ttl })
            .support_invalidation_closures()
            .build();
        Arc::new(Self {
            entries,
            epochs: (0..STRIPES).map(|_| AtomicU64::new(0)).collect(),
            trusted: AtomicBool::new(false),
            inflight: Mutex::new(HashMap::new()),
            next_fetch: AtomicU64::new(0),
        })
    }

    fn epoch(&self, key: &EntryKey) -> &AtomicU64 {
        &self.epochs[(key.field as u64 as usize) % STRIPES]
    }

    fn bump_all(&self) {
        for e in self.epochs.iter() {
            e.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Whether cached answers may be given as authoritative (the subscription is up).
    pub fn is_trusted(&self) -> bool {
        self.trusted.load(Ordering::Acquire)
    }

    pub fn set_trusted(&self, trusted: bool) {
        self.trusted.store(trusted, Ordering::Release);
    }

    pub async fn get(&self, key: &EntryKey) -> Option<Cached> {
        self.entries.get(key).await
    }

    /// Number of cached keys (approximate; for metrics and tests).
    pub fn len(&self) -> u64 {
        self.entries.entry_count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops these keys (a write changed them).
    pub async fn invalidate(&self, keys: &[EntryKey]) {
        for k in keys {
            self.epoch(k).fetch_add(1, Ordering::AcqRel);
            self.entries.invalidate(k).await;
        }
    }

    /// Drops everything.
    pub fn invalidate_all(&self) {
        self.bump_all();
        self.entries.invalidate_all();
    }

    /// Drops every cached miss (a bulk import may have listed any of them).
    pub fn invalidate_misses(&self) {
        self.bump_all();
        if self
            .entries
            .invalidate_entries_if(|_, v| *v == Cached::Absent)
            .is_err()
        {
            self.entries.invalidate_all();
        }
    }

    /// Fetches `keys` from the store, at most until `deadline`, joining fetches of the same
    /// keys already in flight; the results are cached. Returns the raw stored codes.
    pub async fn fetch(
        self: &Arc<Self>,
        store: &Arc<dyn Store>,
        keys: Vec<EntryKey>,
        deadline: tokio::time::Instant,
    ) -> Result<Fetched, StoreError> {
        let mut waits: Vec<(u64, FetchFuture)> = Vec::new();
        {
            let mut inflight = self.inflight.lock().expect("inflight lock");
            let mut owned = Vec::new();
            for k in keys {
                match inflight.get(&k) {
                    Some((id, fut)) => {
                        if !waits.iter().any(|(w, _)| w == id) {
                            waits.push((*id, fut.clone()));
                        }
                    }
                    None => owned.push(k),
                }
            }
            if !owned.is_empty() {
                let id = self.next_fetch.fetch_add(1, Ordering::Relaxed);
                let fut = self.spawn_fetch(id, store.clone(), owned.clone(), deadline);
                for k in owned {
                    inflight.insert(k, (id, fut.clone()));
                }
                waits.push((id, fut));
            }
        }
        let mut out = Fetched::new();
        for r in join_all(waits.into_iter().map(|(_, f)| f)).await {
            out.extend(r?.iter().map(|(k, v)| (*k, *v)));
        }
        Ok(out)
    }

    fn spawn_fetch(
        self: &Arc<Self>,
        id: u64,
        store: Arc<dyn Store>,
        keys: Vec<EntryKey>,
        deadline: tokio::time::Instant,
    ) -> FetchFuture {
        let this = self.clone();
        let task = tokio::spawn(async move {
            let started: Vec<u64> = keys
                .iter()
                .map(|k| this.epoch(k).load(Ordering::Acquire))
                .collect();
            let budget = deadline.saturating_duration_since(tokio::time::Instant::now());
            let result = match tokio::time::timeout_at(deadline, store.get_many(&keys)).await {
                Ok(Ok(codes)) => Ok(codes),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(StoreError::Timeout(budget)),
            };
            let result = match result {
                Ok(codes) if codes.len() == keys.len() => {
                    let now = now_ms();
                    for (k, code) in keys.iter().zip(&codes) {
                        this.entries
                            .insert(*k, Cached::from_stored(*code, now))
                            .await;
                    }
                    for (k, e) in keys.iter().zip(started) {
                        if this.epoch(k).load(Ordering::Acquire) != e {
                            this.entries.invalidate(k).await;
                        }
                    }
                    Ok(Arc::new(keys.iter().copied().zip(codes).collect()))
                }
                Ok(codes) => Err(StoreError::Corrupt(format!(
                    "asked for {} fields, got {}",
                    keys.len(),
                    codes.len()
                ))),
                Err(e) => Err(e),
            };
            let mut inflight = this.inflight.lock().expect("inflight lock");
            for k in &keys {
                if inflight.get(k).is_some_and(|(owner, _)| *owner == id) {
                    inflight.remove(k);
                }
            }
            result
        });
        task.map(|joined| {
            joined.unwrap_or_else(|e| Err(StoreError::Unavailable(format!("fetch task: {e}"))))
        })
        .boxed()
        .shared()
    }
}

/// Cached IP prefix-length registries, per (list, sandbox).
pub struct RegistryCache {
    entries: Cache<Scope, Arc<Vec<PrefixLen>>>,
    epoch: AtomicU64,
}

impl RegistryCache {
    pub fn new(ttl: Duration) -> Arc<Self> {
        Arc::new(Self {
            entries: Cache::builder()
                .max_capacity(100_000)
                .time_to_live(ttl)
                .build(),
            epoch: AtomicU64::new(0),
        })
    }

    /// The registries of `scopes`, from the cache or in one store call.
    pub async fn get(
        &self,
        store: &Arc<dyn Store>,
        scopes: &[Scope],
        trusted: bool,
    ) -> Result<Vec<Arc<Vec<PrefixLen>>>, StoreError> {
        let mut out: Vec<Option<Arc<Vec<PrefixLen>>>> = Vec::with_capacity(scopes.len());
        for s in scopes {
            out.push(if trusted {
                self.entries.get(s).await
            } else {
                None
            });
        }
        let missing: Vec<Scope> = scopes
            .iter()
            .zip(&out)
            .filter(|(_, v)| v.is_none())
            .map(|(s, _)| s.clone())
            .collect();
        if !missing.is_empty() {
            let started = self.epoch.load(Ordering::Acquire);
            let fetched = store.prefix_lengths(&missing).await?;
            let mut fetched = missing.into_iter().zip(fetched.into_iter().map(Arc::new));
            for slot in out.iter_mut().filter(|v| v.is_none()) {
                let (scope, lens) = fetched.next().expect("one result per scope");
                self.entries.insert(scope.clone(), lens.clone()).await;
                if self.epoch.load(Ordering::Acquire) != started {
                    self.entries.invalidate(&scope).await;
                }
                *slot = Some(lens);
            }
        }
        Ok(out.into_iter().map(|v| v.expect("filled")).collect())
    }

    /// The registries known locally, even if untrusted (for a fail-open answer).
    pub async fn get_cached(&self, scopes: &[Scope]) -> Vec<Arc<Vec<PrefixLen>>> {
        let mut out = Vec::with_capacity(scopes.len());
        for s in scopes {
            out.push(self.entries.get(s).await.unwrap_or_default());
        }
        out
    }

    pub async fn invalidate(&self, scopes: &[Scope]) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        for s in scopes {
            self.entries.invalidate(s).await;
        }
    }

    pub fn invalidate_all(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.entries.invalidate_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use async_trait::async_trait;

    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::{
        AuditRecord, Deadline, DefinitionKind, Invalidation, InvalidationStream, Layout,
        MetricAnswer, MetricOp, StoreResult, StoredDefinition, WriteBatch,
    };

    /// A real (embedded) store whose reads are slow and counted.
    struct SlowStore {
        inner: MemoryStore,
        reads: AtomicUsize,
        delay: Duration,
    }

    #[async_trait]
    impl Store for SlowStore {
        fn kind(&self) -> &'static str {
            "slow"
        }
        fn layout(&self) -> &Layout {
            self.inner.layout()
        }
        async fn ping(&self) -> StoreResult<()> {
            self.inner.ping().await
        }
        async fn get_many(&self, keys: &[EntryKey]) -> StoreResult<Vec<Option<u32>>> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            self.inner.get_many(keys).await
        }
        async fn prefix_lengths(&self, scopes: &[Scope]) -> StoreResult<Vec<Vec<PrefixLen>>> {
            self.inner.prefix_lengths(scopes).await
        }
        async fn write(&self, batch: WriteBatch, deadline: Deadline) -> StoreResult<()> {
            self.inner.write(batch, deadline).await
        }
        async fn remove(
            &self,
            keys: &[EntryKey],
            now_ms: i64,
            audit: Vec<AuditRecord>,
            deadline: Deadline,
        ) -> StoreResult<Vec<bool>> {
            self.inner.remove(keys, now_ms, audit, deadline).await
        }
        async fn remove_if_unchanged(
            &self,
            key: EntryKey,
            code: u32,
            deadline: Deadline,
        ) -> StoreResult<bool> {
            self.inner.remove_if_unchanged(key, code, deadline).await
        }
        async fn subscribe(&self) -> StoreResult<InvalidationStream> {
            self.inner.subscribe().await
        }
        async fn publish(&self, message: &Invalidation) -> StoreResult<()> {
            self.inner.publish(message).await
        }
        async fn audit_tail(&self, count: usize) -> StoreResult<Vec<AuditRecord>> {
            self.inner.audit_tail(count).await
        }
        async fn metric_ops(
            &self,
            ops: &[MetricOp],
            deadline: Deadline,
        ) -> StoreResult<Vec<MetricAnswer>> {
            self.inner.metric_ops(ops, deadline).await
        }
        async fn definitions(&self, kind: DefinitionKind) -> StoreResult<Vec<StoredDefinition>> {
            self.inner.definitions(kind).await
        }
        async fn put_definition(
            &self,
            kind: DefinitionKind,
            id: &str,
            fingerprint: &str,
            body: &str,
            deadline: Deadline,
        ) -> StoreResult<u64> {
            self.inner
                .put_definition(kind, id, fingerprint, body, deadline)
                .await
        }
        async fn delete_definition(
            &self,
            kind: DefinitionKind,
            id: &str,
            deadline: Deadline,
        ) -> StoreResult<bool> {
            self.inner.delete_definition(kind, id, deadline).await
        }
    }

    fn slow(delay_ms: u64) -> Arc<SlowStore> {
        Arc::new(SlowStore {
            inner: MemoryStore::open(
                Layout::new(
                    "c:",
                    8,
                    crate::store::Hashing::Keyed(
                        crate::store::FingerprintKey::generate("test").unwrap(),
                    ),
                ),
                10,
                None,
            )
            .unwrap(),
            reads: AtomicUsize::new(0),
            delay: Duration::from_millis(delay_ms),
        })
    }

    fn key(n: i64) -> EntryKey {
        EntryKey {
            bucket: 1,
            field: n,
        }
    }

    fn deadline() -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_secs(2)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_misses_for_one_key_are_coalesced() {
        let slow = slow(50);
        let store: Arc<dyn Store> = slow.clone();
        let cache = LookupCache::new(1000, Duration::from_secs(60));
        let fetches = (0..50).map(|_| {
            let (cache, store) = (cache.clone(), store.clone());
            tokio::spawn(async move { cache.fetch(&store, vec![key(7)], deadline()).await })
        });
        for r in join_all(fetches).await {
            assert_eq!(r.unwrap().unwrap().get(&key(7)), Some(&None));
        }
        assert_eq!(
            slow.reads.load(Ordering::SeqCst),
            1,
            "one store read for 50 callers"
        );
        assert_eq!(
            cache.get(&key(7)).await,
            Some(Cached::Absent),
            "the miss is cached"
        );

        // A caller wanting an in-flight key and a new one joins the first and reads the rest.
        let first = {
            let (cache, store) = (cache.clone(), store.clone());
            tokio::spawn(async move { cache.fetch(&store, vec![key(8)], deadline()).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        let both = cache
            .fetch(&store, vec![key(8), key(9)], deadline())
            .await
            .unwrap();
        assert_eq!(both.len(), 2);
        first.await.unwrap().unwrap();
        assert_eq!(
            slow.reads.load(Ordering::SeqCst),
            3,
            "key 8 once, key 9 once"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_invalidation_during_a_fetch_is_not_undone_by_it() {
        let slow = slow(50);
        let store: Arc<dyn Store> = slow.clone();
        let cache = LookupCache::new(1000, Duration::from_secs(60));
        let fetch = {
            let (cache, store) = (cache.clone(), store.clone());
            tokio::spawn(async move { cache.fetch(&store, vec![key(1), key(2)], deadline()).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        // A write lands while the read is in flight.
        cache.invalidate(&[key(1)]).await;
        fetch.await.unwrap().unwrap();
        assert_eq!(cache.get(&key(1)).await, None, "the stale read was dropped");
        assert_eq!(
            cache.get(&key(2)).await,
            Some(Cached::Absent),
            "the untouched key is cached"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_missed_deadline_fails_every_waiter_and_frees_the_key() {
        let slow = slow(200);
        let store: Arc<dyn Store> = slow.clone();
        let cache = LookupCache::new(1000, Duration::from_secs(60));
        let soon = tokio::time::Instant::now() + Duration::from_millis(20);
        let err = cache.fetch(&store, vec![key(3)], soon).await.unwrap_err();
        assert!(matches!(err, StoreError::Timeout(_)), "{err:?}");
        assert!(
            cache.inflight.lock().unwrap().is_empty(),
            "no fetch left registered"
        );
        assert_eq!(
            cache.get(&key(3)).await,
            None,
            "nothing cached from a failed read"
        );
    }

    #[tokio::test]
    async fn hits_never_outlive_the_entry() {
        let cache = LookupCache::new(1000, Duration::from_secs(60));
        let in_a_second = ((now_ms() - EPOCH_2020_MS) / 1000 + 1) as u32;
        let lifetime = Lifetime {
            ttl: Duration::from_secs(60),
        };
        assert!(lifetime.of(&Cached::Listed(in_a_second)) <= Duration::from_secs(1));
        assert_eq!(lifetime.of(&Cached::Listed(0)), Duration::from_secs(60));
        assert_eq!(lifetime.of(&Cached::Absent), Duration::from_secs(60));
        cache
            .entries
            .insert(key(5), Cached::Listed(in_a_second))
            .await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert_eq!(cache.get(&key(5)).await, None);
    }
}
