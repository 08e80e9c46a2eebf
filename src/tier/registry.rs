//! `RegistryCache` caches the prefix-length registries (IP prefixes, phone segment and e-mail
//! domain lengths) per scope (a TTL and an epoch).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use moka::future::Cache;

use crate::instrumented::Instrumented;
use crate::metrics::StoreOp;
use crate::store::{Deadline, EntryStore, PrefixLen, Scope, StoreError};

/// Cached prefix-length registries (IP prefixes, phone segments, e-mail domains), per (list,
/// sandbox).
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

    /// The registries of `scopes`, from the cache or in one store call (by `deadline`).
    pub async fn get(
        &self,
        store: &Instrumented<dyn EntryStore>,
        scopes: &[Scope],
        trusted: bool,
        deadline: Deadline,
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
            let fetched = store
                .call(StoreOp::Registry, deadline, |s| s.prefix_lengths(&missing))
                .await?;
            // A backend answering for fewer scopes than asked is a store fault, not a panic.
            if fetched.len() != missing.len() {
                return Err(StoreError::corrupt(format!(
                    "prefix registries: {} answers for {} scopes",
                    fetched.len(),
                    missing.len()
                )));
            }
            let mut fetched = missing.into_iter().zip(fetched.into_iter().map(Arc::new));
            for slot in out.iter_mut().filter(|v| v.is_none()) {
                let Some((scope, lens)) = fetched.next() else {
                    break;
                };
                self.entries.insert(scope.clone(), lens.clone()).await;
                if self.epoch.load(Ordering::Acquire) != started {
                    self.entries.invalidate(&scope).await;
                }
                *slot = Some(lens);
            }
        }
        Ok(out.into_iter().map(Option::unwrap_or_default).collect())
    }

    /// The registries known locally, even if untrusted (for a fail-open answer).
    /// What is cached of each scope's registry, whatever its age (fail-open answers); `None`
    /// where nothing is: its lengths are not known here.
    pub async fn get_cached(&self, scopes: &[Scope]) -> Vec<Option<Arc<Vec<PrefixLen>>>> {
        let mut out = Vec::with_capacity(scopes.len());
        for s in scopes {
            out.push(self.entries.get(s).await);
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
