//! The embedded store's audit trail: its records at positions like stream ids, the index
//! beside them, appends with the trims past the cap, and reads.
//!
//! The audit trail is one part, capped exactly at `audit_max_len` records, each at a position
//! `(ms, seq)` like a stream id, and indexed as Redis indexes it (`layout`, *Audit trail*): a
//! term's set of positions, kept with the trail on every append and every trim, so a search by
//! value, who or list reads only the records it returns, and any bound is a binary search.

use std::collections::BTreeSet;

use super::persist::{audit_row, encode};
use super::{MemoryStore, State};
use crate::domain::now_ms;
use crate::store::durable::{Change, Table};
use crate::store::{AuditChunk, AuditPos, AuditRead, AuditRecord, StoreResult};

/// One record of the trail and its position `(ms, seq)`: `seq` is one more than the record
/// before it, `ms` the wall clock when it was appended, held back from going back, as Redis
/// makes a stream id's time. So positions order the trail, and a cursor's `(ms, seq)` means
/// the same on both stores.
pub(super) struct AuditSlot {
    pub(super) ms: u64,
    pub(super) seq: u64,
    pub(super) record: AuditRecord,
}

impl AuditSlot {
    fn at(&self) -> (u64, u64) {
        (self.ms, self.seq)
    }
}

impl MemoryStore {
    /// Appends records to the trail and indexes them under their terms; past the cap the
    /// oldest go, and their index entries with them. The rows changed go into `changes`.
    pub(super) fn append_audit(
        &self,
        st: &mut State,
        records: Vec<AuditRecord>,
        changes: &mut Vec<Change>,
    ) {
        let now = u64::try_from(now_ms()).unwrap_or(0);
        let durable = self.durable.is_some();
        for record in records {
            st.audit_seq += 1;
            st.audit_ms = st.audit_ms.max(now);
            let seq = st.audit_seq;
            for term in record.terms() {
                st.audit_index.entry(term).or_default().insert(seq);
            }
            let ms = st.audit_ms;
            if durable {
                changes.push((Table::Audit, audit_row(seq), Some(encode(&(ms, &record)))));
            }
            st.audit.push_back(AuditSlot { ms, seq, record });
        }
        while st.audit.len() > self.audit_max_len {
            let Some(gone) = st.audit.pop_front() else {
                break;
            };
            if durable {
                changes.push((Table::Audit, audit_row(gone.seq), None));
            }
            for term in gone.record.terms() {
                if let Some(seqs) = st.audit_index.get_mut(&term) {
                    seqs.remove(&gone.seq);
                    if seqs.is_empty() {
                        st.audit_index.remove(&term);
                    }
                }
            }
        }
    }

    /// Index entries of the trail, all terms together (what Redis's `ZCARD`s would sum to).
    pub fn audit_index_len(&self) -> usize {
        self.lock().audit_index.values().map(BTreeSet::len).sum()
    }
}

/// The chunks `reads` ask for, from the trail `st` holds (`EntryStore::audit_read`).
pub(super) fn read(st: &State, reads: &[AuditRead]) -> StoreResult<Vec<AuditChunk>> {
    use std::ops::Bound;
    // One part.
    let found = |slot: &AuditSlot| {
        let pos = AuditPos {
            ms: slot.ms,
            seq: slot.seq,
            part: 0,
        };
        (pos, slot.record.clone())
    };
    Ok(reads
        .iter()
        .map(|read| {
            if read.part != 0 || read.before_everything() {
                return AuditChunk::default();
            }
            // The records older than the bound are `audit[..end]`.
            let end = match read.before {
                None => st.audit.len(),
                Some(b) if read.inclusive => st.audit.partition_point(|s| s.at() <= b),
                Some(b) => st.audit.partition_point(|s| s.at() < b),
            };
            let records: Vec<(AuditPos, AuditRecord)> = match &read.index {
                None => st
                    .audit
                    .range(..end)
                    .rev()
                    .take(read.count)
                    .map(found)
                    .collect(),
                Some(term) => {
                    let below = st
                        .audit
                        .get(end)
                        .map_or(Bound::Unbounded, |s| Bound::Excluded(s.seq));
                    st.audit_index
                        .get(term)
                        .into_iter()
                        .flat_map(|seqs| seqs.range((Bound::Unbounded, below)).rev())
                        .take(read.count)
                        .filter_map(|seq| {
                            let i = st.audit.binary_search_by_key(seq, |s| s.seq).ok()?;
                            st.audit.get(i).map(found)
                        })
                        .collect()
                }
            };
            // Every index entry has its record here: the last one returned is where the
            // part goes on.
            let next = records
                .last()
                .filter(|_| records.len() == read.count)
                .map(|(p, _)| (p.ms, p.seq));
            AuditChunk { records, next }
        })
        .collect())
}
