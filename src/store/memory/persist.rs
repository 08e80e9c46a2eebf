//! The embedded store's durable record and the snapshot files of older builds: the row each
//! piece of state is written as, opening a record (refused if it is another keyspace's, loaded
//! whole otherwise), and the one-time import of an older build's snapshot.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::audit::AuditSlot;
use super::metrics::encode_canonical;
use super::{MemoryStore, NO_SCOPE, State};
use crate::store::durable::{Change, Durable, Table};
use crate::store::fingerprint::{self, RecordedHashing};
use crate::store::{
    AuditRecord, DefinitionKind, EntryKey, Layout, PrefixLen, Scope, StoreError, StoreResult,
};

/// The version of the snapshot file's encoding (its first field).
const SNAPSHOT_VERSION: u32 = 2;

/// The snapshot file's content.
#[derive(Serialize, Deserialize)]
struct Snapshot {
    /// [`SNAPSHOT_VERSION`].
    version: u32,
    /// The layout format (`fingerprint`).
    format: u32,
    /// The key id in format 2, else empty.
    key_id: String,
    buckets: u32,
    entries: Vec<(EntryKey, u32)>,
    registries: Vec<(Scope, Vec<PrefixLen>)>,
    /// (kind, id, version, fingerprint, body) of metric and rule definitions.
    definitions: Vec<(String, String, u64, String, String)>,
}

/// A snapshot as builds before keyed fingerprints wrote it: its first field, 1, was the
/// (unkeyed) layout format.
#[derive(Deserialize)]
struct SnapshotV1 {
    _format: u32,
    buckets: u32,
    entries: Vec<(EntryKey, u32)>,
    registries: Vec<(Scope, Vec<PrefixLen>)>,
    definitions: Vec<(String, String, u64, String, String)>,
}

/// What a snapshot file records about its keyspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotMeta {
    pub buckets: u32,
    pub hashing: RecordedHashing,
    /// The normalisation rules its fingerprints were made under (1: an older build's).
    pub rules: u32,
}

/// The meta rows of a durable record.
pub(super) const META_FORMAT: &[u8] = b"format";
pub(super) const META_KEY_ID: &[u8] = b"key_id";
pub(super) const META_BUCKETS: &[u8] = b"buckets";
const META_IMPORTED: &[u8] = b"snapshot_imported";
pub(super) const META_RULES: &[u8] = b"rules";

pub(super) fn encode<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    postcard::to_stdvec(value).expect("postcard encodes the store's types")
}

pub(super) fn entry_row(k: &EntryKey) -> Vec<u8> {
    let mut key = Vec::with_capacity(12);
    key.extend_from_slice(&k.bucket.to_be_bytes());
    key.extend_from_slice(&k.field.to_be_bytes());
    key
}

pub(super) fn entry_put(k: &EntryKey, code: u32, scope: u32) -> Change {
    (Table::Entries, entry_row(k), Some(encode(&(code, scope))))
}

pub(super) fn audit_row(seq: u64) -> Vec<u8> {
    seq.to_be_bytes().to_vec()
}

pub(super) fn count_change(list: &str, sandbox: &str, value: Option<(i64, i64)>) -> Change {
    (
        Table::Counts,
        encode(&(list, sandbox)),
        value.map(|v| encode(&v)),
    )
}

pub(super) fn definition_change(kind: &str, id: &str, slot: &(u64, String, String)) -> Change {
    (Table::Definitions, encode(&(kind, id)), Some(encode(slot)))
}

pub(super) fn event_row(hash: i64) -> Vec<u8> {
    hash.to_be_bytes().to_vec()
}

/// What a durable record's meta rows say about its keyspace, if it has them.
pub(super) fn recorded_meta(
    rows: &[(Vec<u8>, Vec<u8>)],
    place: &str,
) -> StoreResult<Option<SnapshotMeta>> {
    let get = |name: &[u8]| {
        rows.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    };
    let corrupt = |e: postcard::Error| StoreError::Keyspace(format!("{place}: meta: {e}"));
    let (Some(format), Some(buckets)) = (get(META_FORMAT), get(META_BUCKETS)) else {
        return Ok(None);
    };
    let key_id: String = match get(META_KEY_ID) {
        Some(v) => postcard::from_bytes(v).map_err(corrupt)?,
        None => String::new(),
    };
    let rules: u32 = match get(META_RULES) {
        Some(v) => postcard::from_bytes(v).map_err(corrupt)?,
        None => 1,
    };
    Ok(Some(SnapshotMeta {
        buckets: postcard::from_bytes(buckets).map_err(corrupt)?,
        hashing: RecordedHashing {
            format: postcard::from_bytes(format).map_err(corrupt)?,
            key_id: Some(key_id).filter(|k| !k.is_empty()),
        },
        rules,
    }))
}

impl MemoryStore {
    /// What a durable record says about its keyspace (bucket count, format, key id), if it
    /// has been made: lets a restart adopt its bucket count and find its key before opening.
    pub fn recorded(durable: &Durable) -> StoreResult<Option<SnapshotMeta>> {
        recorded_meta(
            &durable.loaded_rows(Table::Meta),
            &durable.path().display().to_string(),
        )
    }

    /// What a snapshot file of an older build records (bucket count, format, key id), if
    /// there is one.
    pub fn snapshot_meta(path: &Path) -> StoreResult<Option<SnapshotMeta>> {
        if !path.exists() {
            return Ok(None);
        }
        let snap = read_snapshot(path)?;
        Ok(Some(SnapshotMeta {
            buckets: snap.buckets,
            hashing: RecordedHashing {
                format: snap.format,
                key_id: Some(snap.key_id).filter(|k| !k.is_empty()),
            },
            // Snapshots were written by builds before normalisation rules were recorded.
            rules: 1,
        }))
    }

    /// Imports an older build's snapshot file into a durable record that holds no entries and
    /// imported none before (one commit, with the mark that it was imported); the file is left
    /// where it is, as a backup. Returns the entries imported, `None` when nothing was done.
    pub fn import_snapshot(&self, path: &Path) -> StoreResult<Option<usize>> {
        let Some(d) = &self.durable else {
            return Ok(None);
        };
        let already = d
            .loaded_rows(Table::Meta)
            .iter()
            .any(|(k, _)| k == META_IMPORTED);
        if already || !path.exists() || !self.lock().entries.is_empty() {
            return Ok(None);
        }
        let snap = read_snapshot(path)?;
        let place = format!("snapshot {}", path.display());
        check_recorded(
            &self.layout,
            &SnapshotMeta {
                buckets: snap.buckets,
                hashing: RecordedHashing {
                    format: snap.format,
                    key_id: Some(snap.key_id.clone()).filter(|k| !k.is_empty()),
                },
                rules: 1,
            },
            &place,
        )?;
        let mut changes = Vec::new();
        let n = snap.entries.len();
        {
            let mut st = self.lock();
            for (k, c) in snap.entries {
                st.entries.insert(k, (c, NO_SCOPE));
                changes.push(entry_put(&k, c, NO_SCOPE));
            }
            for (scope, lens) in snap.registries {
                for len in lens {
                    changes.push((Table::Registries, encode(&(&scope, len)), Some(Vec::new())));
                    st.registries.entry(scope.clone()).or_default().insert(len);
                }
            }
            for (kind, id, version, fp, body) in snap.definitions {
                let kind = match kind.as_str() {
                    "metric" => DefinitionKind::Metric.as_str(),
                    "rule" => DefinitionKind::Rule.as_str(),
                    _ => continue,
                };
                let slot = (version, fp, body);
                changes.push(definition_change(kind, &id, &slot));
                st.definitions.insert((kind, id), slot);
            }
        }
        changes.push((
            Table::Meta,
            META_IMPORTED.to_vec(),
            Some(encode(&path.display().to_string())),
        ));
        d.write_now(changes)?;
        Ok(Some(n))
    }

    /// The durable record's commits so far (`None` in memory only).
    pub fn commit_stats(&self) -> Option<crate::store::durable::CommitStats> {
        self.durable.as_ref().map(Durable::stats)
    }

    /// Commits what is queued and closes the durable record, releasing its file; later writes
    /// are refused. (Tests reopen a data directory in the same process.)
    pub fn close(&self) {
        if let Some(d) = &self.durable {
            // Under the state's lock: a write either is applied and queued before the close
            // (and committed by it) or finds the record closed and changes nothing.
            let _state = self.lock();
            d.close();
        }
    }

    /// Everything the store holds, in a canonical order (tests compare a store with the same
    /// data directory reopened).
    pub fn canonical_state(&self) -> String {
        let st = self.lock();
        let mut entries: Vec<_> = st.entries.iter().collect();
        entries.sort();
        let mut registries: Vec<_> = st.registries.iter().collect();
        registries.sort();
        let scopes = &st.scopes;
        let audit: Vec<_> = st.audit.iter().map(|s| (s.ms, s.seq, &s.record)).collect();
        let mut index: Vec<_> = st
            .audit_index
            .iter()
            .map(|(t, s)| (format!("{t:?}"), s))
            .collect();
        index.sort();
        let mut metrics: Vec<_> = st
            .metrics
            .iter()
            .map(|(k, m)| (k, encode_canonical(m)))
            .collect();
        metrics.sort();
        let mut events: Vec<_> = st.events.iter().collect();
        events.sort();
        format!(
            "entries {entries:?}\nscopes {scopes:?}\nregistries {registries:?}\naudit {audit:?} seq {} ms {}\nindex {index:?}\ncounts {:?}\nby sandbox {:?}\ndefinitions {:?}\nmetrics {metrics:?}\nevents {events:?}",
            st.audit_seq, st.audit_ms, st.counts, st.counts_by_sandbox, st.definitions
        )
    }
}

/// Refuses a record (a data directory or a snapshot) of another format, key or bucket count.
pub(super) fn check_recorded(layout: &Layout, meta: &SnapshotMeta, place: &str) -> StoreResult<()> {
    let key = match layout.hashing() {
        crate::store::Hashing::Keyed(k) => Some(k),
        crate::store::Hashing::Unkeyed => None,
    };
    let (hashing, _) =
        fingerprint::open_recorded(&meta.hashing, key, place).map_err(StoreError::Keyspace)?;
    if &hashing != layout.hashing() {
        return Err(StoreError::Keyspace(format!(
            "{place} is layout format {}, opened as format {}",
            hashing.format(),
            layout.format()
        )));
    }
    if meta.rules != layout.rules() {
        return Err(StoreError::Keyspace(format!(
            "{place} was made under normalisation rules {}, opened under rules {}",
            meta.rules,
            layout.rules()
        )));
    }
    if meta.buckets != layout.buckets() {
        return Err(StoreError::Keyspace(format!(
            "{place} was written with {} buckets, configured {}: set expected_entries to match or move it away",
            meta.buckets,
            layout.buckets()
        )));
    }
    Ok(())
}

/// Fills `state` from a durable record's rows (in the order of `Table::ALL`), rebuilding
/// what is derived (the audit index, its clock, the counts by sandbox).
pub(super) fn load(
    state: &mut State,
    rows: Vec<crate::store::durable::RowSet>,
    place: &str,
) -> StoreResult<()> {
    let bad = |table: &str, e: String| {
        StoreError::Keyspace(format!(
            "{place}: table {table}: {e}: refused rather than opened partly"
        ))
    };
    let pc = |table: &'static str| move |e: postcard::Error| bad(table, e.to_string());
    for (table, rows) in Table::ALL.into_iter().zip(rows) {
        for (k, v) in rows {
            match table {
                Table::Meta => {}
                Table::Entries => {
                    let (Some(b), Some(f)) = (k.get(..4), k.get(4..12)) else {
                        return Err(bad("entries", "a key of the wrong length".into()));
                    };
                    let key = EntryKey {
                        bucket: u32::from_be_bytes(b.try_into().expect("4 bytes")),
                        field: i64::from_be_bytes(f.try_into().expect("8 bytes")),
                    };
                    state
                        .entries
                        .insert(key, postcard::from_bytes(&v).map_err(pc("entries"))?);
                }
                Table::Registries => {
                    let (scope, len): (Scope, PrefixLen) =
                        postcard::from_bytes(&k).map_err(pc("registries"))?;
                    state.registries.entry(scope).or_default().insert(len);
                }
                Table::Audit => {
                    let seq = u64::from_be_bytes(
                        k.as_slice()
                            .try_into()
                            .map_err(|_| bad("audit", "a key of the wrong length".into()))?,
                    );
                    let (ms, record): (u64, AuditRecord) =
                        postcard::from_bytes(&v).map_err(pc("audit"))?;
                    for term in record.terms() {
                        state.audit_index.entry(term).or_default().insert(seq);
                    }
                    // Rows come in key order: the trail's.
                    state.audit_seq = seq;
                    state.audit_ms = state.audit_ms.max(ms);
                    state.audit.push_back(AuditSlot { ms, seq, record });
                }
                Table::Counts => {
                    let (list, sandbox): (String, String) =
                        postcard::from_bytes(&k).map_err(pc("counts"))?;
                    let value: (i64, i64) = postcard::from_bytes(&v).map_err(pc("counts"))?;
                    state
                        .counts_by_sandbox
                        .insert((sandbox.clone(), list.clone()));
                    state.counts.insert((list, sandbox), value);
                }
                Table::Definitions => {
                    let (kind, id): (String, String) =
                        postcard::from_bytes(&k).map_err(pc("definitions"))?;
                    let kind = match kind.as_str() {
                        "metric" => DefinitionKind::Metric.as_str(),
                        "rule" => DefinitionKind::Rule.as_str(),
                        _ => continue,
                    };
                    state.definitions.insert(
                        (kind, id),
                        postcard::from_bytes(&v).map_err(pc("definitions"))?,
                    );
                }
                Table::Metrics => {
                    let key = String::from_utf8(k)
                        .map_err(|_| bad("metrics", "a key that is not UTF-8".into()))?;
                    state
                        .metrics
                        .insert(key, postcard::from_bytes(&v).map_err(pc("metrics"))?);
                }
                Table::Scopes => {
                    let id = u32::from_be_bytes(
                        k.as_slice()
                            .try_into()
                            .map_err(|_| bad("scopes", "a key of the wrong length".into()))?,
                    );
                    let scope: (String, String) = postcard::from_bytes(&v).map_err(pc("scopes"))?;
                    // Ids are made in order from 0 and never removed: rows come in id order.
                    if id as usize != state.scopes.len() {
                        return Err(bad("scopes", format!("scope id {id} out of order")));
                    }
                    state.scope_ids.insert(scope.clone(), id);
                    state.scopes.push(scope);
                }
                Table::Events => {
                    let hash = i64::from_be_bytes(
                        k.as_slice()
                            .try_into()
                            .map_err(|_| bad("events", "a key of the wrong length".into()))?,
                    );
                    state
                        .events
                        .insert(hash, postcard::from_bytes(&v).map_err(pc("events"))?);
                }
            }
        }
    }
    Ok(())
}

fn read_snapshot(path: &Path) -> StoreResult<Snapshot> {
    let bytes = std::fs::read(path).map_err(|e| {
        StoreError::unavailable(format!("reading snapshot {}: {e}", path.display()))
    })?;
    let corrupt =
        |e: postcard::Error| StoreError::corrupt(format!("snapshot {}: {e}", path.display()));
    match postcard::take_from_bytes::<u32>(&bytes).map_err(corrupt)?.0 {
        1 => {
            let v1: SnapshotV1 = postcard::from_bytes(&bytes).map_err(corrupt)?;
            Ok(Snapshot {
                version: SNAPSHOT_VERSION,
                format: fingerprint::FORMAT_UNKEYED,
                key_id: String::new(),
                buckets: v1.buckets,
                entries: v1.entries,
                registries: v1.registries,
                definitions: v1.definitions,
            })
        }
        SNAPSHOT_VERSION => postcard::from_bytes(&bytes).map_err(corrupt),
        other => Err(StoreError::Keyspace(format!(
            "snapshot {} is of version {other}; this build reads versions 1 and {SNAPSHOT_VERSION}: use a matching build or move it away",
            path.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::domain::now_ms;
    use crate::domain::{Dimension, ListName, Sandbox};
    use crate::store::fingerprint::FingerprintKey;
    use crate::store::{
        AuditOp, CountsQuery, Deadline, EntryStore, Hashing, RemoveBatch, WriteBatch,
    };

    fn layout() -> Layout {
        let material: Vec<u8> = (1..=32).collect();
        let key = FingerprintKey::from_bytes(&material, "test").unwrap();
        Layout::new("t:", 16, Hashing::Keyed(key))
    }

    fn open(dir: &Path, cap: usize) -> MemoryStore {
        MemoryStore::open(layout(), cap, Some(Durable::open(dir).unwrap())).unwrap()
    }

    /// The trail past its cap: the records trimmed leave the file with the memory, and what is
    /// reopened (records, index, positions, counts) is what the store had.
    #[tokio::test]
    async fn a_trimmed_trail_reopens_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), 5);
        let (list, sandbox): (ListName, Sandbox) =
            ("black".parse().unwrap(), "default".parse().unwrap());
        let deadline = Deadline::after(Duration::from_secs(5));
        for i in 0..20i64 {
            let key = EntryKey {
                bucket: (i % 16) as u32,
                field: i,
            };
            let record = AuditRecord::entry(
                1_000 + i,
                "t",
                AuditOp::Upsert,
                &list,
                &Dimension::Uid,
                &sandbox,
                None,
                None,
                &key,
                i as u64,
                format!("v{i}"),
            );
            let batch = WriteBatch {
                entries: vec![(key, 0)],
                audit: vec![record],
                scopes: vec![Scope::new(&list, &sandbox)],
                ..WriteBatch::default()
            };
            store.write(batch, deadline).await.unwrap();
        }
        let removed = EntryKey {
            bucket: 3,
            field: 3,
        };
        store
            .remove(
                RemoveBatch {
                    keys: &[removed],
                    now_ms: now_ms(),
                    audit: Vec::new(),
                },
                deadline,
            )
            .await
            .unwrap();
        assert_eq!(store.audit_tail(100).await.unwrap().len(), 5);
        store.close();
        let had = store.canonical_state();
        let again = open(dir.path(), 5);
        assert_eq!(again.canonical_state(), had);
        assert_eq!(again.audit_tail(100).await.unwrap().len(), 5);
        let counts = again.list_counts(&CountsQuery::first(10)).await.unwrap();
        assert_eq!(counts.counts[0].entries, 19);
        // After close, a write is refused, not applied.
        let refused = store
            .remove(
                RemoveBatch {
                    keys: &[EntryKey {
                        bucket: 4,
                        field: 4,
                    }],
                    now_ms: now_ms(),
                    audit: Vec::new(),
                },
                deadline,
            )
            .await;
        assert!(refused.is_err());
        assert_eq!(store.len(), 19);
    }
}
