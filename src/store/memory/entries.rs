//! `EntryStore` on the embedded store: entries and their prefix registries, and the trail
//! and the counts a write or removal changes with them, in one step under the lock (the
//! reads of the trail and the counts are in `audit` and `counts`).

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;

use super::persist::{encode, entry_put, entry_row};
use super::{MemoryStore, NO_SCOPE, audit, counts};
use crate::domain::now_ms;
use crate::store::durable::Table;
use crate::store::{
    AuditChunk, AuditRead, AuditRecord, CountChange, CountsPage, CountsQuery, Deadline, EntryKey,
    EntryStore, Invalidation, PrefixLen, RemoveBatch, Removed, Scope, StoreResult, WriteBatch,
    code_is_live,
};

#[async_trait]
impl EntryStore for MemoryStore {
    async fn get_many(&self, keys: &[EntryKey]) -> StoreResult<Vec<Option<u32>>> {
        let st = self.lock();
        Ok(keys
            .iter()
            .map(|k| st.entries.get(k).map(|e| e.0))
            .collect())
    }

    /// A scan of every entry: the embedded store has no local tier in front of it
    /// (`in_process`), so this serves tests of the tier's logic, not the check path.
    async fn get_buckets(&self, buckets: &[u32]) -> StoreResult<Vec<Vec<(i64, u32)>>> {
        let st = self.lock();
        let wanted: HashMap<u32, usize> =
            buckets.iter().enumerate().map(|(i, b)| (*b, i)).collect();
        let mut out = vec![Vec::new(); buckets.len()];
        for (k, (code, _)) in &st.entries {
            if let Some(&i) = wanted.get(&k.bucket) {
                out[i].push((k.field, *code));
            }
        }
        // A bucket asked for twice gets its entries twice.
        for (i, b) in buckets.iter().enumerate() {
            if wanted[b] != i {
                out[i] = out[wanted[b]].clone();
            }
        }
        Ok(out)
    }

    fn in_process(&self) -> bool {
        true
    }

    /// Counts change in the commit of the write or removal that changes them.
    fn counts_itself(&self) -> bool {
        true
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

    async fn write(&self, batch: WriteBatch, _deadline: Deadline) -> StoreResult<Vec<bool>> {
        // Sent after the lock is released: not atomic with the write.
        let changes = Invalidation::upserted(&batch.entries, false);
        let mut scopes = Vec::new();
        let created;
        let pending = {
            let mut st = self.lock();
            self.writable()?;
            let durable = self.durable.is_some();
            let mut rows = Vec::new();
            for (scope, len) in batch.prefixes {
                if st.registries.entry(scope.clone()).or_default().insert(len) {
                    if durable {
                        rows.push((Table::Registries, encode(&(&scope, len)), Some(Vec::new())));
                    }
                    scopes.push((scope.list.to_string(), scope.sandbox.to_string()));
                }
            }
            // Each scope of the batch counted (a refresh moves its last change too).
            let mut deltas: BTreeMap<u32, i64> = BTreeMap::new();
            created = batch
                .entries
                .into_iter()
                .enumerate()
                .map(|(i, (k, c))| {
                    let scope = match batch.scopes.get(i) {
                        Some(sc) => {
                            st.scope_id(sc.list.as_str(), sc.sandbox.as_str(), durable, &mut rows)
                        }
                        None => NO_SCOPE,
                    };
                    if durable {
                        rows.push(entry_put(&k, c, scope));
                    }
                    let new = st.entries.insert(k, (c, scope)).is_none();
                    if scope != NO_SCOPE {
                        *deltas.entry(scope).or_default() += i64::from(new);
                    }
                    new
                })
                .collect();
            st.add_counts(deltas, now_ms(), durable, &mut rows);
            self.append_audit(&mut st, batch.audit, &mut rows);
            self.record(rows)
        };
        Self::durable(pending).await?;
        if !scopes.is_empty() {
            let _ = self.invalidations.send(Invalidation::Scopes(scopes));
        }
        let _ = self.invalidations.send(changes);
        Ok(created)
    }

    async fn remove(
        &self,
        batch: RemoveBatch<'_>,
        _deadline: Deadline,
    ) -> StoreResult<Vec<Removed>> {
        let keys = batch.keys;
        let (removed, pending) = {
            let mut st = self.lock();
            self.writable()?;
            let mut rows = Vec::new();
            // What was there, expired or not, was counted: subtracted from its scope.
            let mut deltas: BTreeMap<u32, i64> = BTreeMap::new();
            let removed = keys
                .iter()
                .map(|k| match st.entries.remove(k) {
                    None => Removed::Absent,
                    Some((c, scope)) => {
                        rows.push((Table::Entries, entry_row(k), None));
                        if scope != NO_SCOPE {
                            *deltas.entry(scope).or_default() -= 1;
                        }
                        if code_is_live(c, batch.now_ms) {
                            Removed::Live
                        } else {
                            Removed::Expired
                        }
                    }
                })
                .collect();
            st.add_counts(deltas, batch.now_ms, self.durable.is_some(), &mut rows);
            self.append_audit(&mut st, batch.audit, &mut rows);
            (removed, self.record(rows))
        };
        Self::durable(pending).await?;
        let _ = self.invalidations.send(Invalidation::removed(keys));
        Ok(removed)
    }

    async fn remove_if_unchanged(
        &self,
        key: EntryKey,
        code: u32,
        _deadline: Deadline,
    ) -> StoreResult<bool> {
        let pending = {
            let mut st = self.lock();
            self.writable()?;
            match st.entries.get(&key) {
                Some((c, _)) if *c == code => {}
                _ => return Ok(false),
            }
            let mut rows = vec![(Table::Entries, entry_row(&key), None)];
            if let Some((_, scope)) = st.entries.remove(&key)
                && scope != NO_SCOPE
            {
                let deltas = BTreeMap::from([(scope, -1)]);
                st.add_counts(deltas, now_ms(), self.durable.is_some(), &mut rows);
            }
            self.record(rows)
        };
        Self::durable(pending).await?;
        Ok(true)
    }

    async fn audit_tail(&self, count: usize) -> StoreResult<Vec<AuditRecord>> {
        let st = self.lock();
        let skip = st.audit.len().saturating_sub(count);
        Ok(st
            .audit
            .iter()
            .skip(skip)
            .map(|s| s.record.clone())
            .collect())
    }

    fn audit_parts(&self) -> u16 {
        1
    }

    /// O(log n + count) per read: the bound by binary search (positions are sorted), then
    /// the trail backwards from it, or the term's records below it in the index.
    async fn audit_read(&self, reads: &[AuditRead]) -> StoreResult<Vec<AuditChunk>> {
        audit::read(&self.lock(), reads)
    }

    async fn count_changes(
        &self,
        changes: &[CountChange],
        at_ms: i64,
        _deadline: Deadline,
    ) -> StoreResult<()> {
        let pending = {
            let mut st = self.lock();
            self.writable()?;
            let mut rows = Vec::new();
            let durable = self.durable.is_some();
            for c in changes {
                st.add_count(
                    c.scope.list.as_str(),
                    c.scope.sandbox.as_str(),
                    c.delta,
                    at_ms,
                    durable,
                    &mut rows,
                );
            }
            self.record(rows)
        };
        Self::durable(pending).await
    }

    async fn list_counts(&self, query: &CountsQuery) -> StoreResult<CountsPage> {
        counts::page(&self.lock(), query)
    }
}
