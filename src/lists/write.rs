//! Writes: upsert and delete, each one batch to the store within `write_deadline`, then the
//! local tier told what changed (read-your-writes), then the lists' approximate counts
//! adjusted by what the store says was created or removed.

use std::collections::{HashMap, HashSet};

use super::{EntryRef, ListsError, MAX_ENTRIES_PER_REQUEST, NameLists, NewEntry};
use crate::domain::{ErrorCode, ListName, Sandbox, ValidationError, mask_value, now_ms};
use crate::metrics::StoreOp;
use crate::store::{
    AuditOp, AuditRecord, CountChange, Deadline, EntryKey, PrefixLen, RemoveBatch, Scope,
    WriteBatch,
};

impl NameLists {
    /// Adds each sandbox's delta to the approximate count of `list` there, after a write the
    /// store took. A failure is logged and counted, not returned: the write itself stands,
    /// only the count is off by that much.
    async fn count(&self, list: &ListName, deltas: HashMap<&Sandbox, i64>, at_ms: i64) {
        if deltas.is_empty() || self.store.inner().counts_itself() {
            return;
        }
        let changes: Vec<CountChange> = deltas
            .into_iter()
            .map(|(sandbox, delta)| CountChange {
                scope: Scope::new(list, sandbox),
                delta,
            })
            .collect();
        let deadline = Deadline::after(self.settings.write_deadline);
        let r = self
            .store
            .call(StoreOp::Counts, deadline, |s| {
                s.count_changes(&changes, at_ms, deadline)
            })
            .await;
        if r.is_err() {
            self.metrics.count_errors.inc();
        }
    }

    /// Upserts entries of `list` (last write wins). Returns how many were written.
    pub async fn upsert(
        &self,
        list: &ListName,
        entries: Vec<NewEntry>,
        actor: &str,
    ) -> Result<usize, ListsError> {
        check_entry_count(entries.len())?;
        let layout = self.store.layout();
        let now = now_ms();
        let mut batch = WriteBatch::default();
        let mut scopes: HashSet<Scope> = HashSet::new();
        for e in &entries {
            let key = layout.entry_key(list, &e.dimension, &e.sandbox, &e.value);
            batch.entries.push((key, e.expiry.code()));
            let scope = Scope::new(list, &e.sandbox);
            batch.scopes.push(scope.clone());
            if let Some(len) = PrefixLen::of(&e.value) {
                if !batch.prefixes.contains(&(scope.clone(), len)) {
                    batch.prefixes.push((scope.clone(), len));
                }
                scopes.insert(scope);
            }
            batch.audit.push(AuditRecord::entry(
                now,
                actor,
                AuditOp::Upsert,
                list,
                &e.dimension,
                &e.sandbox,
                e.expiry.expires_at_ms(),
                e.reason.as_deref(),
                &key,
                layout.audit_value(&e.dimension, &e.value),
                mask_value(&e.dimension, &e.value),
            ));
        }
        let keys: Vec<EntryKey> = batch.entries.iter().map(|(k, _)| *k).collect();
        let changes: Vec<(EntryKey, Option<u32>)> =
            batch.entries.iter().map(|(k, c)| (*k, Some(*c))).collect();
        let deadline = Deadline::after(self.settings.write_deadline);
        let mark = self.cache.write_mark();
        let result = self
            .store
            .call(StoreOp::Write, deadline, |s| s.write(batch, deadline))
            .await;
        // Read-your-writes: acknowledged (its message atomic with it), the change is applied
        // here at once; otherwise (an error may still have landed, or messages may overtake
        // writes) its buckets are answered by the store until read again.
        match &result {
            Ok(_) if self.store.inner().atomic_messages() => self.cache.wrote_acked(&changes, mark),
            Ok(_) => {
                self.cache.remember_own(&changes, mark);
                self.cache.wrote(&keys, mark);
            }
            Err(_) => self.cache.wrote(&keys, mark),
        }
        if !scopes.is_empty() {
            self.registries
                .invalidate(&scopes.into_iter().collect::<Vec<_>>())
                .await;
        }
        let created = result?;
        let mut deltas: HashMap<&Sandbox, i64> = HashMap::new();
        for (e, new) in entries
            .iter()
            .zip(created.iter().chain(std::iter::repeat(&false)))
        {
            *deltas.entry(&e.sandbox).or_default() += i64::from(*new);
        }
        self.count(list, deltas, now).await;
        self.metrics.entries_written.inc_by(entries.len() as u64);
        tracing::info!(%list, count = entries.len(), actor, "entries upserted");
        // Each entry by its (keyed) fingerprint, the audit trail's join key; never the value.
        for (e, key) in entries.iter().zip(&keys) {
            tracing::debug!(%list, dimension = %e.dimension, fingerprint = %key.fingerprint(), "entry upserted");
        }
        Ok(entries.len())
    }

    /// Deletes entries of `list`. Returns how many were present and live.
    pub async fn remove(
        &self,
        list: &ListName,
        entries: Vec<EntryRef>,
        actor: &str,
    ) -> Result<usize, ListsError> {
        check_entry_count(entries.len())?;
        let layout = self.store.layout();
        let now = now_ms();
        let mut keys = Vec::with_capacity(entries.len());
        let mut audit = Vec::with_capacity(entries.len());
        for e in &entries {
            let key = layout.entry_key(list, &e.dimension, &e.sandbox, &e.value);
            keys.push(key);
            audit.push(AuditRecord::entry(
                now,
                actor,
                AuditOp::Delete,
                list,
                &e.dimension,
                &e.sandbox,
                None,
                None,
                &key,
                layout.audit_value(&e.dimension, &e.value),
                mask_value(&e.dimension, &e.value),
            ));
        }
        // The same entry twice in one request is removed once.
        let mut seen = HashSet::new();
        let unique: Vec<EntryKey> = keys.iter().copied().filter(|k| seen.insert(*k)).collect();
        let deadline = Deadline::after(self.settings.write_deadline);
        let mark = self.cache.write_mark();
        let result = self
            .store
            .call(StoreOp::Remove, deadline, |s| {
                let batch = RemoveBatch {
                    keys: &unique,
                    now_ms: now,
                    audit,
                };
                s.remove(batch, deadline)
            })
            .await;
        if result.is_ok() {
            let gone: Vec<(EntryKey, Option<u32>)> = unique.iter().map(|k| (*k, None)).collect();
            self.cache.remember_own(&gone, mark);
        }
        self.cache.wrote(&unique, mark);
        let flags = result?;
        let removed = flags.iter().filter(|r| r.was_live()).count();
        // What was there, expired or not, was counted: subtract it from its scope.
        let mut deltas: HashMap<EntryKey, &Sandbox> = HashMap::new();
        for (e, key) in entries.iter().zip(&keys) {
            deltas.entry(*key).or_insert(&e.sandbox);
        }
        let mut by_scope: HashMap<&Sandbox, i64> = HashMap::new();
        for (key, found) in unique.iter().zip(&flags) {
            if let Some(sandbox) = deltas.get(key) {
                *by_scope.entry(sandbox).or_default() -= i64::from(found.was_present());
            }
        }
        self.count(list, by_scope, now).await;
        self.metrics.entries_removed.inc_by(removed as u64);
        tracing::info!(%list, requested = entries.len(), removed, actor, "entries deleted");
        for (key, found) in unique.iter().zip(&flags) {
            tracing::debug!(%list, fingerprint = %key.fingerprint(), removed = found.was_live(), "entry deleted");
        }
        Ok(removed)
    }
}

/// Refuses a request of more than `MAX_ENTRIES_PER_REQUEST` entries (`too_many_entries`):
/// checked by the routes before any entry is parsed, and again here for other callers.
pub fn check_entry_count(n: usize) -> Result<(), ValidationError> {
    ValidationError::check_count(
        n,
        MAX_ENTRIES_PER_REQUEST,
        ErrorCode::TooManyEntries,
        "entries",
    )
}
