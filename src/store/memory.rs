//! The embedded in-process store: what `namelist serve` runs on when no Redis is configured,
//! so the service works on a fresh machine. It mirrors the Redis layout (entries keyed by
//! bucket and field, expiry codes, per-scope prefix registries, a capped and indexed audit
//! trail) so that both stores behave identically under the conformance suite.
//!
//! With a data directory (`data_dir`) it is durable: every change is written to a redb
//! database (`store::durable`) before it is acknowledged, all of the state below (entries
//! with their expiry, registries, the audit trail, the lists' counts, definitions, velocity
//! windows and event ids), and loaded from it at start. Without one it lives in memory only
//! (tests, `cargo run`), and start-up says so at WARN. A snapshot file of an older build is
//! imported once into a new data directory (`import_snapshot`) and left where it is.
//!
//! Velocity metrics follow the Lua scripts of `store::redis` step for step (the conformance
//! suite holds both to the same oracle); APPROX_COUNT_DISTINCT is counted exactly here.
//!
//! The lists' counts are kept in the two orders of the Redis layout's indexes (a `BTreeMap`
//! by (list, sandbox), a `BTreeSet` by (sandbox, list)), so a page is a range read,
//! O(log n + page), and a pair at 0 or below is removed from both.
//!
//! The audit trail is one part, capped exactly at `audit_max_len` records, each at a position
//! `(ms, seq)` like a stream id, and indexed as Redis indexes it (`layout`, *Audit trail*): a
//! term's set of positions, kept with the trail on every append and every trim, so a search by
//! value, who or list reads only the records it returns, and any bound is a binary search.
//!
//! State sits behind one std `Mutex`: every operation is a few hash-map steps and no lock is
//! held across an `.await`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::path::Path;
use std::sync::Mutex;

use async_trait::async_trait;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use super::durable::{Change, Durable, Pending, Table};
use super::fingerprint::{self, RecordedHashing};
use super::{
    AuditChunk, AuditPos, AuditRead, AuditRecord, AuditReports, AuditSummary, AuditTerm,
    CountChange, CountsPage, CountsQuery, Deadline, DefinitionKind, DefinitionStore, EntryKey,
    EntryStore, Invalidation, InvalidationBus, InvalidationStream, Layout, ListCount, MetricAnswer,
    MetricFamily, MetricOp, MetricReading, MetricStore, PrefixLen, Removed, Scope, StoreBase,
    StoreError, StoreResult, StoredDefinition, WriteBatch, code_is_live,
};
use crate::domain::now_ms;

#[derive(Default)]
struct State {
    /// Each field → (expiry code, the id of its (list, sandbox) in `scopes`, or `NO_SCOPE`).
    entries: HashMap<EntryKey, (u32, u32)>,
    /// The (list, sandbox) of each scope id, and back: the scope an entry was written in, for
    /// the counts its deletion changes.
    scopes: Vec<(String, String)>,
    scope_ids: HashMap<(String, String), u32>,
    registries: HashMap<Scope, BTreeSet<PrefixLen>>,
    /// The audit trail, oldest first: positions strictly increase (see `AuditSlot`).
    audit: VecDeque<AuditSlot>,
    audit_seq: u64,
    /// (list, sandbox) → (approximate entry count, always > 0; last change), in (list,
    /// sandbox) order, and the same pairs as (sandbox, list): what the Redis layout's count
    /// hashes and its two indexes hold, so a page is a range read either way.
    counts: BTreeMap<(String, String), (i64, i64)>,
    counts_by_sandbox: BTreeSet<(String, String)>,
    /// The `ms` of the newest position (the clock, never going back).
    audit_ms: u64,
    /// Each index term → the `seq` of every record of `audit` indexed under it, and nothing
    /// else: kept with `audit` on every append and every trim.
    audit_index: HashMap<AuditTerm, BTreeSet<u64>>,
    metrics: HashMap<String, MetricState>,
    /// Events applied (their hash → Unix ms until which they are remembered).
    events: HashMap<i64, i64>,
    /// (kind, id) → (version, fingerprint, body); an empty fingerprint is a deletion.
    definitions: BTreeMap<(&'static str, String), (u64, String, String)>,
    ops_since_purge: u64,
}

/// The scope id of an entry written without one (an imported snapshot's): not counted.
const NO_SCOPE: u32 = u32::MAX;

impl State {
    /// The id of `(list, sandbox)`, made (and its row added to `rows` when `durable`) if new.
    fn scope_id(
        &mut self,
        list: &str,
        sandbox: &str,
        durable: bool,
        rows: &mut Vec<Change>,
    ) -> u32 {
        let key = (list.to_owned(), sandbox.to_owned());
        if let Some(id) = self.scope_ids.get(&key) {
            return *id;
        }
        let id = u32::try_from(self.scopes.len()).unwrap_or(NO_SCOPE - 1);
        if durable {
            rows.push((Table::Scopes, id.to_be_bytes().to_vec(), Some(encode(&key))));
        }
        self.scopes.push(key.clone());
        self.scope_ids.insert(key, id);
        id
    }

    /// Adds `delta` to a scope's count and moves its last change up to `at_ms` (removed at 0
    /// or below), as `EntryStore::count_changes` says; the row changed goes into `rows`.
    fn add_count(
        &mut self,
        list: &str,
        sandbox: &str,
        delta: i64,
        at_ms: i64,
        durable: bool,
        rows: &mut Vec<Change>,
    ) {
        let key = (list.to_owned(), sandbox.to_owned());
        let e = self.counts.entry(key.clone()).or_insert((0, at_ms));
        e.0 += delta;
        e.1 = e.1.max(at_ms);
        let value = *e;
        if value.0 <= 0 {
            self.counts.remove(&key);
            self.counts_by_sandbox.remove(&(key.1, key.0));
            if durable {
                rows.push(count_change(list, sandbox, None));
            }
        } else {
            self.counts_by_sandbox.insert((key.1, key.0));
            if durable {
                rows.push(count_change(list, sandbox, Some(value)));
            }
        }
    }

    /// Adds each scope id's delta (see `add_count`).
    fn add_counts(
        &mut self,
        deltas: BTreeMap<u32, i64>,
        at_ms: i64,
        durable: bool,
        rows: &mut Vec<Change>,
    ) {
        for (id, delta) in deltas {
            let Some((list, sandbox)) = self.scopes.get(id as usize).cloned() else {
                continue;
            };
            self.add_count(&list, &sandbox, delta, at_ms, durable, rows);
        }
    }
}

/// One record of the trail and its position `(ms, seq)`: `seq` is one more than the record
/// before it, `ms` the wall clock when it was appended, held back from going back, as Redis
/// makes a stream id's time. So positions order the trail, and a cursor's `(ms, seq)` means
/// the same on both stores.
struct AuditSlot {
    ms: u64,
    seq: u64,
    record: AuditRecord,
}

impl AuditSlot {
    fn at(&self) -> (u64, u64) {
        (self.ms, self.seq)
    }
}

/// One metric entity, as Redis would keep it (see `layout`).
#[derive(Serialize, Deserialize)]
struct MetricState {
    /// Unix ms; the APPROX family keeps one per sub-window instead.
    expire_at: i64,
    data: MetricData,
}

#[derive(Serialize, Deserialize)]
enum MetricData {
    /// Hash of integer fields (SUM, AVG, MIN, MAX).
    Hash(BTreeMap<i64, i64>),
    /// Sorted set: member → score (COUNT_DISTINCT).
    Zset(HashMap<i64, i64>),
    /// One set per sub-window, each with its own expiry (APPROX_COUNT_DISTINCT, counted
    /// exactly here: within any HyperLogLog error bound).
    Subs(BTreeMap<i64, (i64, HashSet<i64>)>),
}

impl MetricState {
    fn new(op: &MetricOp) -> Self {
        Self {
            expire_at: i64::MAX,
            data: match op.family {
                MetricFamily::Distinct => MetricData::Zset(HashMap::new()),
                MetricFamily::Approx => MetricData::Subs(BTreeMap::new()),
                _ => MetricData::Hash(BTreeMap::new()),
            },
        }
    }

    fn is_empty(&self) -> bool {
        match &self.data {
            MetricData::Hash(h) => h.is_empty(),
            MetricData::Zset(z) => z.is_empty(),
            MetricData::Subs(s) => s.is_empty(),
        }
    }

    /// Applies one op with the semantics of the Lua script in `store::redis::scripts`;
    /// `duplicate`: its event was already applied, so only its read runs.
    fn apply(&mut self, op: &MetricOp, now: i64, duplicate: bool) -> MetricAnswer {
        let n = op.slots;
        let floor = op.trim_hi - n + 1;
        let (lo, hi) = (op.read_hi - n + 1, op.read_hi);
        let update = if duplicate { None } else { op.update };
        if let Some((sub, value)) = update {
            let at = op.expire_at().unwrap_or(i64::MAX);
            match &mut self.data {
                MetricData::Hash(h) => {
                    match op.family {
                        MetricFamily::Sum => *h.entry(sub).or_default() += value,
                        MetricFamily::Avg => {
                            *h.entry(2 * sub).or_default() += value;
                            *h.entry(2 * sub + 1).or_default() += 1;
                        }
                        MetricFamily::Min => {
                            let e = h.entry(sub).or_insert(value);
                            *e = (*e).min(value);
                        }
                        _ => {
                            let e = h.entry(sub).or_insert(value);
                            *e = (*e).max(value);
                        }
                    }
                    let per = if op.family == MetricFamily::Avg { 2 } else { 1 };
                    if h.len() as i64 > per * n {
                        h.retain(|f, _| f.div_euclid(per) >= floor);
                    }
                }
                MetricData::Zset(z) => {
                    // `ZADD GT CH`: at the cap, members that left the window go first, then
                    // the oldest; only when a member was added or moved, as the script does.
                    let changed = z.get(&value).is_none_or(|s| sub > *s);
                    if changed {
                        z.insert(value, sub);
                    }
                    let cap = op.cap as usize;
                    if changed && z.len() >= cap {
                        z.retain(|_, s| *s >= floor);
                    }
                    if changed && z.len() > cap {
                        // ZPOPMIN: lowest score first, then the smallest member as a string.
                        let mut order: Vec<(i64, String, i64)> =
                            z.iter().map(|(m, s)| (*s, m.to_string(), *m)).collect();
                        order.sort();
                        for (_, _, m) in order.into_iter().take(z.len() - cap) {
                            z.remove(&m);
                        }
                    }
                }
                MetricData::Subs(subs) => {
                    let e = subs.entry(sub).or_insert((at, HashSet::new()));
                    e.0 = e.0.max(at);
                    e.1.insert(value);
                }
            }
            if !matches!(self.data, MetricData::Subs(_)) {
                self.expire_at = if self.expire_at == i64::MAX {
                    at
                } else {
                    self.expire_at.max(at)
                };
            }
        }
        if let MetricData::Subs(subs) = &mut self.data {
            subs.retain(|_, (at, _)| *at > now);
        }
        if !op.read {
            return MetricAnswer {
                duplicate,
                reading: None,
            };
        }
        let in_range = |f: i64| f >= lo && f <= hi;
        let reading = match (&self.data, op.family) {
            (MetricData::Hash(h), MetricFamily::Sum) => MetricReading::Sum(
                h.iter()
                    .filter(|(f, _)| in_range(**f))
                    .map(|(_, v)| v)
                    .sum(),
            ),
            (MetricData::Hash(h), MetricFamily::Avg) => {
                let (mut sum, mut count) = (0, 0);
                for (f, v) in h.iter().filter(|(f, _)| in_range(f.div_euclid(2))) {
                    if f % 2 == 0 {
                        sum += v;
                    } else {
                        count += v;
                    }
                }
                MetricReading::Avg { sum, count }
            }
            (MetricData::Hash(h), MetricFamily::Min) => MetricReading::Extreme(
                h.iter()
                    .filter(|(f, _)| in_range(**f))
                    .map(|(_, v)| *v)
                    .min(),
            ),
            (MetricData::Hash(h), _) => MetricReading::Extreme(
                h.iter()
                    .filter(|(f, _)| in_range(**f))
                    .map(|(_, v)| *v)
                    .max(),
            ),
            (MetricData::Zset(z), _) => MetricReading::Distinct {
                count: z.values().filter(|s| in_range(**s)).count() as i64,
                capped: z.len() >= op.cap as usize,
            },
            (MetricData::Subs(subs), _) => {
                let mut all: HashSet<i64> = HashSet::new();
                for (_, (_, set)) in subs.range(lo..=hi) {
                    all.extend(set);
                }
                MetricReading::Distinct {
                    count: all.len() as i64,
                    capped: false,
                }
            }
        };
        MetricAnswer {
            duplicate,
            reading: Some(reading),
        }
    }
}

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

/// The embedded store.
pub struct MemoryStore {
    layout: Layout,
    state: Mutex<State>,
    audit_max_len: usize,
    invalidations: broadcast::Sender<Invalidation>,
    /// The durable record, with a data directory.
    durable: Option<Durable>,
}

/// The meta rows of a durable record.
const META_FORMAT: &[u8] = b"format";
const META_KEY_ID: &[u8] = b"key_id";
const META_BUCKETS: &[u8] = b"buckets";
const META_IMPORTED: &[u8] = b"snapshot_imported";
const META_RULES: &[u8] = b"rules";

fn encode<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    postcard::to_stdvec(value).expect("postcard encodes the store's types")
}

fn entry_row(k: &EntryKey) -> Vec<u8> {
    let mut key = Vec::with_capacity(12);
    key.extend_from_slice(&k.bucket.to_be_bytes());
    key.extend_from_slice(&k.field.to_be_bytes());
    key
}

fn entry_put(k: &EntryKey, code: u32, scope: u32) -> Change {
    (Table::Entries, entry_row(k), Some(encode(&(code, scope))))
}

fn audit_row(seq: u64) -> Vec<u8> {
    seq.to_be_bytes().to_vec()
}

fn count_change(list: &str, sandbox: &str, value: Option<(i64, i64)>) -> Change {
    (
        Table::Counts,
        encode(&(list, sandbox)),
        value.map(|v| encode(&v)),
    )
}

fn definition_change(kind: &str, id: &str, slot: &(u64, String, String)) -> Change {
    (Table::Definitions, encode(&(kind, id)), Some(encode(slot)))
}

fn event_row(hash: i64) -> Vec<u8> {
    hash.to_be_bytes().to_vec()
}

/// What a durable record's meta rows say about its keyspace, if it has them.
fn recorded_meta(rows: &[(Vec<u8>, Vec<u8>)], place: &str) -> StoreResult<Option<SnapshotMeta>> {
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
    /// An empty store in memory only, or the one recorded in `durable` (made there if new).
    /// A record of another format, key or bucket count is refused, as Redis's meta key is.
    pub fn open(
        layout: Layout,
        audit_max_len: usize,
        durable: Option<Durable>,
    ) -> StoreResult<Self> {
        let mut state = State::default();
        if let Some(d) = &durable {
            let place = d.path().display().to_string();
            let rows = d.take_loaded();
            let meta_rows = &rows[0];
            match recorded_meta(meta_rows, &place)? {
                Some(meta) => {
                    check_recorded(&layout, &meta, &place)?;
                    load(&mut state, rows, &place)?;
                }
                None => d.write_now(vec![
                    (
                        Table::Meta,
                        META_FORMAT.to_vec(),
                        Some(encode(&layout.format())),
                    ),
                    (
                        Table::Meta,
                        META_KEY_ID.to_vec(),
                        Some(encode(layout.hashing().key_id().unwrap_or(""))),
                    ),
                    (
                        Table::Meta,
                        META_BUCKETS.to_vec(),
                        Some(encode(&layout.buckets())),
                    ),
                    (
                        Table::Meta,
                        META_RULES.to_vec(),
                        Some(encode(&layout.rules())),
                    ),
                ])?,
            }
        }
        let (invalidations, _) = broadcast::channel(1024);
        Ok(Self {
            layout,
            state: Mutex::new(state),
            audit_max_len,
            invalidations,
            durable,
        })
    }

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
    pub fn commit_stats(&self) -> Option<super::durable::CommitStats> {
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

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("memory store lock")
    }

    /// Refuses a write before anything is applied when the durable record has stopped.
    fn writable(&self) -> StoreResult<()> {
        self.durable
            .as_ref()
            .map_or(Ok(()), Durable::check_writable)
    }

    /// Queues one operation's rows (under the state's lock, right after applying them).
    fn record(&self, changes: Vec<Change>) -> Option<Pending> {
        self.durable.as_ref().map(|d| d.queue(changes))
    }

    /// Waits until what `record` queued is durable.
    async fn durable(pending: Option<Pending>) -> StoreResult<()> {
        match pending {
            Some(p) => p.durable().await,
            None => Ok(()),
        }
    }

    /// Appends records to the trail and indexes them under their terms; past the cap the
    /// oldest go, and their index entries with them. The rows changed go into `changes`.
    fn append_audit(&self, st: &mut State, records: Vec<AuditRecord>, changes: &mut Vec<Change>) {
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

    /// Number of fields stored, expired ones included (what `HLEN` would sum to).
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A metric entity's bytes, for `canonical_state`.
fn encode_canonical(m: &MetricState) -> String {
    match &m.data {
        MetricData::Hash(h) => format!("{} {h:?}", m.expire_at),
        MetricData::Zset(z) => {
            let mut z: Vec<_> = z.iter().collect();
            z.sort();
            format!("{} {z:?}", m.expire_at)
        }
        MetricData::Subs(s) => {
            let s: Vec<_> = s
                .iter()
                .map(|(k, (e, set))| {
                    let mut set: Vec<_> = set.iter().collect();
                    set.sort();
                    (k, e, set)
                })
                .collect();
            format!("{} {s:?}", m.expire_at)
        }
    }
}

/// Refuses a record (a data directory or a snapshot) of another format, key or bucket count.
fn check_recorded(layout: &Layout, meta: &SnapshotMeta, place: &str) -> StoreResult<()> {
    let key = match layout.hashing() {
        super::Hashing::Keyed(k) => Some(k),
        super::Hashing::Unkeyed => None,
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
fn load(state: &mut State, rows: Vec<super::durable::RowSet>, place: &str) -> StoreResult<()> {
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

#[async_trait]
impl StoreBase for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    async fn ping(&self) -> StoreResult<()> {
        Ok(())
    }
}

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
        keys: &[EntryKey],
        now_ms: i64,
        audit: Vec<AuditRecord>,
        _deadline: Deadline,
    ) -> StoreResult<Vec<Removed>> {
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
                        if code_is_live(c, now_ms) {
                            Removed::Live
                        } else {
                            Removed::Expired
                        }
                    }
                })
                .collect();
            st.add_counts(deltas, now_ms, self.durable.is_some(), &mut rows);
            self.append_audit(&mut st, audit, &mut rows);
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
        use std::ops::Bound;
        let st = self.lock();
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
        use std::ops::Bound::{Excluded, Included, Unbounded};
        let st = self.lock();
        let count = |(list, sandbox): (&String, &String), &(entries, at): &(i64, i64)| ListCount {
            list: list.clone(),
            sandbox: sandbox.clone(),
            entries,
            last_change_ms: at,
        };
        // One more than asked says whether there is more.
        let want = query.limit.saturating_add(1);
        let mut found: Vec<ListCount> = match (&query.list, &query.sandbox) {
            (None, Some(sandbox)) => {
                // The lists of one sandbox, by the index (sandbox, list).
                let s = sandbox.to_string();
                let from = match &query.after {
                    Some(Scope {
                        list: al,
                        sandbox: r#as,
                    }) if s.as_str() > r#as.as_str() => Included((s.clone(), al.to_string())),
                    Some(Scope { list: al, .. }) => Excluded((s.clone(), al.to_string())),
                    None => Included((s.clone(), String::new())),
                };
                st.counts_by_sandbox
                    .range((from, Unbounded))
                    .take_while(|(sb, _)| *sb == s)
                    .take(want)
                    .filter_map(|(sb, l)| {
                        let key = (l.clone(), sb.clone());
                        st.counts.get(&key).map(|v| count((&key.0, &key.1), v))
                    })
                    .collect()
            }
            (Some(list), Some(sandbox)) => {
                let key = (list.to_string(), sandbox.to_string());
                st.counts
                    .get(&key)
                    .filter(|_| query.selects(&key.0, &key.1))
                    .map(|v| count((&key.0, &key.1), v))
                    .into_iter()
                    .collect()
            }
            (list, None) => {
                let after = query
                    .after
                    .as_ref()
                    .map(|a| (a.list.to_string(), a.sandbox.to_string()));
                let from = match (list, after) {
                    (Some(l), Some(a)) if a >= (l.to_string(), String::new()) => Excluded(a),
                    (Some(l), _) => Included((l.to_string(), String::new())),
                    (None, Some(a)) => Excluded(a),
                    (None, None) => Unbounded,
                };
                st.counts
                    .range((from, Unbounded))
                    .take_while(|((l, _), _)| list.as_ref().is_none_or(|x| x.as_str() == l))
                    .take(want)
                    .map(|((l, s), v)| count((l, s), v))
                    .collect()
            }
        };
        let more = found.len() > query.limit;
        found.truncate(query.limit);
        Ok(CountsPage {
            counts: found,
            more,
        })
    }
}

#[async_trait]
impl InvalidationBus for MemoryStore {
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
}

#[async_trait]
impl MetricStore for MemoryStore {
    async fn metric_ops(
        &self,
        ops: &[MetricOp],
        _deadline: Deadline,
    ) -> StoreResult<Vec<MetricAnswer>> {
        let now = now_ms();
        let writes = ops.iter().any(|op| op.update.is_some());
        let (answers, pending) = {
            let mut guard = self.lock();
            if writes {
                self.writable()?;
            }
            let st = &mut *guard;
            let durable = self.durable.is_some();
            let mut rows = Vec::new();
            st.ops_since_purge += ops.len() as u64;
            if st.ops_since_purge > 4096 {
                st.ops_since_purge = 0;
                let gone: Vec<String> = st
                    .metrics
                    .iter()
                    .filter(|(_, m)| m.expire_at <= now || m.is_empty())
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in gone {
                    st.metrics.remove(&k);
                    if durable {
                        rows.push((Table::Metrics, k.into_bytes(), None));
                    }
                }
                let gone: Vec<i64> = st
                    .events
                    .iter()
                    .filter(|(_, until)| **until <= now)
                    .map(|(h, _)| *h)
                    .collect();
                for h in gone {
                    st.events.remove(&h);
                    if durable {
                        rows.push((Table::Events, event_row(h), None));
                    }
                }
            }
            // Whether each event (of this call) is a replay, decided at its first op.
            let mut replay: HashMap<(u32, i64), bool> = HashMap::new();
            let mut touched: Vec<&str> = Vec::new();
            let answers = ops
                .iter()
                .map(|op| {
                    let duplicate = match (op.update, op.event) {
                        (Some(_), Some(e)) => *replay.entry((e.seq, e.hash)).or_insert_with(|| {
                            match st.events.get(&e.hash) {
                                Some(until) if *until > now => true,
                                _ => {
                                    st.events.insert(e.hash, e.keep_until_ms);
                                    if durable {
                                        rows.push((
                                            Table::Events,
                                            event_row(e.hash),
                                            Some(encode(&e.keep_until_ms)),
                                        ));
                                    }
                                    false
                                }
                            }
                        }),
                        _ => false,
                    };
                    let state = st
                        .metrics
                        .entry(op.key.clone())
                        .or_insert_with(|| MetricState::new(op));
                    if state.expire_at <= now {
                        *state = MetricState::new(op);
                    }
                    let r = state.apply(op, now, duplicate);
                    if state.is_empty() {
                        st.metrics.remove(&op.key);
                    }
                    if durable && op.update.is_some() && !duplicate {
                        touched.push(&op.key);
                    }
                    r
                })
                .collect::<Vec<_>>();
            // Each entity an update changed, once, as it is now.
            touched.sort_unstable();
            touched.dedup();
            for k in touched {
                let value = st.metrics.get(k).map(encode);
                rows.push((Table::Metrics, k.as_bytes().to_vec(), value));
            }
            let pending = if rows.is_empty() {
                None
            } else {
                self.record(rows)
            };
            (answers, pending)
        };
        Self::durable(pending).await?;
        Ok(answers)
    }
}

#[async_trait]
impl DefinitionStore for MemoryStore {
    async fn definitions(&self, kind: DefinitionKind) -> StoreResult<Vec<StoredDefinition>> {
        let st = self.lock();
        Ok(st
            .definitions
            .iter()
            .filter(|((k, _), (_, fp, _))| *k == kind.as_str() && !fp.is_empty())
            .map(|((_, id), (version, _, body))| StoredDefinition {
                id: id.clone(),
                version: *version,
                body: body.clone(),
            })
            .collect())
    }

    async fn put_definition(
        &self,
        kind: DefinitionKind,
        id: &str,
        fingerprint: &str,
        body: &str,
        _deadline: Deadline,
    ) -> StoreResult<u64> {
        let (version, pending) = {
            let mut st = self.lock();
            self.writable()?;
            let slot = st
                .definitions
                .entry((kind.as_str(), id.to_owned()))
                .or_insert((0, String::new(), String::new()));
            if slot.1.is_empty() || slot.1 != fingerprint {
                slot.0 += 1;
            }
            slot.1 = fingerprint.to_owned();
            slot.2 = body.to_owned();
            let row = definition_change(kind.as_str(), id, slot);
            (slot.0, self.record(vec![row]))
        };
        Self::durable(pending).await?;
        let _ = self.invalidations.send(Invalidation::Definitions);
        Ok(version)
    }

    async fn delete_definition(
        &self,
        kind: DefinitionKind,
        id: &str,
        _deadline: Deadline,
    ) -> StoreResult<bool> {
        let existed = {
            let mut st = self.lock();
            self.writable()?;
            match st.definitions.get_mut(&(kind.as_str(), id.to_owned())) {
                Some(slot) if !slot.1.is_empty() => {
                    slot.1.clear();
                    slot.2.clear();
                    let row = definition_change(kind.as_str(), id, slot);
                    Some(self.record(vec![row]))
                }
                _ => None,
            }
        };
        let Some(pending) = existed else {
            return Ok(false);
        };
        Self::durable(pending).await?;
        let _ = self.invalidations.send(Invalidation::Definitions);
        Ok(true)
    }
}

/// The embedded store is never audited (the audit tool reads Redis).
#[async_trait]
impl AuditReports for MemoryStore {
    async fn audit_summary(&self) -> StoreResult<Option<AuditSummary>> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::domain::{Dimension, ListName, Sandbox};
    use crate::store::fingerprint::FingerprintKey;
    use crate::store::{AuditOp, Hashing};

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
            .remove(&[removed], now_ms(), Vec::new(), deadline)
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
                &[EntryKey {
                    bucket: 4,
                    field: 4,
                }],
                now_ms(),
                Vec::new(),
                deadline,
            )
            .await;
        assert!(refused.is_err());
        assert_eq!(store.len(), 19);
    }
}
