//! The embedded in-process store: what `namelist serve` runs on when no Redis is configured,
//! so the service works on a fresh machine. It mirrors the Redis layout (entries keyed by
//! bucket and field, expiry codes, per-scope prefix registries, a capped audit trail) so that
//! both stores behave identically under the conformance suite.
//!
//! Optionally it is snapshotted to a file (postcard, written to a temporary file and renamed,
//! so a crash leaves the previous snapshot) every `snapshot_interval` when something changed
//! and when the service stops. Expired entries are left out of snapshots.
//!
//! State sits behind one std `Mutex`: every operation is a few hash-map steps and no lock is
//! held across an `.await`.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use super::layout::FORMAT_VERSION;
use super::{
    AuditRecord, EntryKey, Invalidation, InvalidationStream, Layout, PrefixLen, Scope, Store,
    StoreError, StoreResult, WriteBatch, code_is_live,
};
use crate::domain::now_ms;

#[derive(Default)]
struct State {
    entries: HashMap<EntryKey, u32>,
    registries: HashMap<Scope, BTreeSet<PrefixLen>>,
    audit: VecDeque<AuditRecord>,
}

/// The snapshot file's content.
#[derive(Serialize, Deserialize)]
struct Snapshot {
    format: u32,
    buckets: u32,
    entries: Vec<(EntryKey, u32)>,
    registries: Vec<(Scope, Vec<PrefixLen>)>,
}

/// The embedded store.
pub struct MemoryStore {
    layout: Layout,
    state: Mutex<State>,
    audit_max_len: usize,
    invalidations: broadcast::Sender<Invalidation>,
    snapshot_path: Option<PathBuf>,
    dirty: AtomicBool,
}

impl MemoryStore {
    /// An empty store, or the one saved in `snapshot_path` if that file exists. A snapshot of
    /// another format or bucket count is refused, as Redis's meta key would be.
    pub fn open(
        layout: Layout,
        audit_max_len: usize,
        snapshot_path: Option<PathBuf>,
    ) -> StoreResult<Self> {
        let mut state = State::default();
        if let Some(path) = &snapshot_path
            && path.exists()
        {
            let snap = read_snapshot(path)?;
            if snap.format != FORMAT_VERSION {
                return Err(StoreError::Keyspace(format!(
                    "snapshot {} has format {}, this build reads format {FORMAT_VERSION}",
                    path.display(),
                    snap.format
                )));
            }
            if snap.buckets != layout.buckets() {
                return Err(StoreError::Keyspace(format!(
                    "snapshot {} was written with {} buckets, configured {}: set expected_entries to match or move the snapshot away",
                    path.display(),
                    snap.buckets,
                    layout.buckets()
                )));
            }
            state.entries = snap.entries.into_iter().collect();
            state.registries = snap
                .registries
                .into_iter()
                .map(|(s, p)| (s, p.into_iter().collect()))
                .collect();
        }
        let (invalidations, _) = broadcast::channel(1024);
        Ok(Self {
            layout,
            state: Mutex::new(state),
            audit_max_len,
            invalidations,
            snapshot_path,
            dirty: AtomicBool::new(false),
        })
    }

    /// The bucket count recorded in a snapshot file, if there is one: lets a restart adopt it
    /// when no bucket count was configured.
    pub fn snapshot_buckets(path: &Path) -> StoreResult<Option<u32>> {
        if !path.exists() {
            return Ok(None);
        }
        Ok(Some(read_snapshot(path)?.buckets))
    }

    /// Writes the snapshot if anything changed since the last one. Returns whether it wrote.
    pub fn save_snapshot(&self) -> StoreResult<bool> {
        let Some(path) = &self.snapshot_path else {
            return Ok(false);
        };
        if !self.dirty.swap(false, Ordering::AcqRel) {
            return Ok(false);
        }
        let now = now_ms();
        let snap = {
            let st = self.state.lock().expect("memory store lock");
            Snapshot {
                format: FORMAT_VERSION,
                buckets: self.layout.buckets(),
                entries: st
                    .entries
                    .iter()
                    .filter(|(_, c)| code_is_live(**c, now))
                    .map(|(k, c)| (*k, *c))
                    .collect(),
                registries: st
                    .registries
                    .iter()
                    .map(|(s, p)| (s.clone(), p.iter().copied().collect()))
                    .collect(),
            }
        };
        let bytes = postcard::to_stdvec(&snap)
            .map_err(|e| StoreError::Unavailable(format!("encoding snapshot: {e}")))?;
        let tmp = path.with_extension("tmp");
        let io = |e: std::io::Error| {
            self.dirty.store(true, Ordering::Release);
            StoreError::Unavailable(format!("writing snapshot {}: {e}", path.display()))
        };
        std::fs::write(&tmp, bytes).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)?;
        Ok(true)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("memory store lock")
    }

    fn append_audit(&self, st: &mut State, records: Vec<AuditRecord>) {
        st.audit.extend(records);
        while st.audit.len() > self.audit_max_len {
            st.audit.pop_front();
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

fn read_snapshot(path: &Path) -> StoreResult<Snapshot> {
    let bytes = std::fs::read(path).map_err(|e| {
        StoreError::Unavailable(format!("reading snapshot {}: {e}", path.display()))
    })?;
    postcard::from_bytes(&bytes)
        .map_err(|e| StoreError::Corrupt(format!("snapshot {}: {e}", path.display())))
}

#[async_trait]
impl Store for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    async fn ping(&self) -> StoreResult<()> {
        Ok(())
    }

    async fn get_many(&self, keys: &[EntryKey]) -> StoreResult<Vec<Option<u32>>> {
        let st = self.lock();
        Ok(keys.iter().map(|k| st.entries.get(k).copied()).collect())
    }

    async fn prefix_lengths(&self, scopes: &[Scope]) -> StoreResult<Vec<Vec<PrefixLen>>> {
        let st = self.lock();
        Ok(scopes
            .iter()
            .map(|s| {
                st.registries
                    .get(s)
                    .map(|p| p.iter().copied().collect())
                    .unwrap_or_default()
            })
            .collect())
    }

    async fn write(&self, batch: WriteBatch) -> StoreResult<()> {
        let keys: Vec<EntryKey> = batch.entries.iter().map(|(k, _)| *k).collect();
        let mut scopes = Vec::new();
        {
            let mut st = self.lock();
            for (scope, len) in batch.prefixes {
                if st.registries.entry(scope.clone()).or_default().insert(len) {
                    scopes.push((scope.0.to_string(), scope.1.to_string()));
                }
            }
            st.entries.extend(batch.entries);
            self.append_audit(&mut st, batch.audit);
        }
        self.dirty.store(true, Ordering::Release);
        if !scopes.is_empty() {
            let _ = self.invalidations.send(Invalidation::Scopes(scopes));
        }
        let _ = self.invalidations.send(Invalidation::Keys(keys));
        Ok(())
    }

    async fn remove(
        &self,
        keys: &[EntryKey],
        now_ms: i64,
        audit: Vec<AuditRecord>,
    ) -> StoreResult<Vec<bool>> {
        let removed = {
            let mut st = self.lock();
            let removed = keys
                .iter()
                .map(|k| {
                    st.entries
                        .remove(k)
                        .is_some_and(|c| code_is_live(c, now_ms))
                })
                .collect();
            self.append_audit(&mut st, audit);
            removed
        };
        self.dirty.store(true, Ordering::Release);
        let _ = self.invalidations.send(Invalidation::Keys(keys.to_vec()));
        Ok(removed)
    }

    async fn remove_if_unchanged(&self, key: EntryKey, code: u32) -> StoreResult<bool> {
        let mut st = self.lock();
        if st.entries.get(&key) == Some(&code) {
            st.entries.remove(&key);
            self.dirty.store(true, Ordering::Release);
            return Ok(true);
        }
        Ok(false)
    }

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

    async fn audit_tail(&self, count: usize) -> StoreResult<Vec<AuditRecord>> {
        let st = self.lock();
        let skip = st.audit.len().saturating_sub(count);
        Ok(st.audit.iter().skip(skip).cloned().collect())
    }
}
