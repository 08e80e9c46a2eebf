//! The audit trail as operators read it (`GET /v1/audit`): newest first, filtered, paged.
//!
//! Records never hold a raw value: each has the masked value and the entry's keyed
//! fingerprint (`EntryKey::fingerprint`). A `value` filter is therefore normalised for its
//! `dimension` and turned into the fingerprint each record's (list, sandbox) would give it,
//! and records are matched on that; the value itself is neither stored, echoed nor logged.
//!
//! Cost: the trail is split in parts (65 on Redis, all read at once in one round trip per
//! primary), merged here by position, and the filters run here. What is read depends on the
//! filters:
//!
//! * With `value`, `who` or `list`, the parts are read through their index (`layout`, *Audit
//!   trail*; `AuditRead::index`) by the most selective of them: the value (its `vfp`,
//!   `Layout::audit_value`), else `who`, else `list`. Only records of that term are read (on
//!   Redis a `ZRANGE` of each part's sorted set, then an `XRANGE` of each record it names:
//!   two round trips a batch), and the other filters run on them here. A search whose only filters are index
//!   terms and bounds thus costs the records it returns plus a probe of each part's index,
//!   however long the trail: `who=nobody` is 65 empty probes, not 10,000 records examined.
//!   Records written before the index existed are indexed at start-up by `who` and `list`;
//!   they have no `vfp`, so a search by value does not find them.
//! * Without any of them, every record is examined, newest first.
//!
//! Either way each part is read ahead in chunks: the first read takes about `limit / parts`
//! records of every part (at least [`FIRST_CHUNK`]); when a part runs dry, every part that is
//! low is read again in one batch, each chunk twice the last (at most [`MAX_CHUNK`]). So a
//! page of `n` records reads about `n` plus a chunk per part, not `n` per part, and a request
//! examining [`MAX_EXAMINED`] records reads at most about twice that in some 7–10 round
//! trips. `since` and `until` bound the reads: an `until` starts them there, and once the
//! next record is older than `since` the page ends with no cursor. Both compare with a
//! record's `at` (the writing instance's clock) while positions are the store's clock, so
//! the bounds are widened by [`CLOCK_MARGIN_MS`] and the records in the margin filtered
//! here: exact while the two clocks (and a write's latency) stay within it. One request
//! examines at most [`MAX_EXAMINED`] records: a filter that the index does not serve (an
//! `op`, a `sandbox`, or a term most of the trail has) answers the matches found so far with
//! a `next_cursor` that resumes where it stopped, whatever the trail holds.
//!
//! The cursor is the position of the last record examined (`AuditPos`, written `ms-seq-part`):
//! opaque to callers, checked on the way in (a malformed one is a 400 `invalid_cursor`). It
//! is not signed: a caller who edits one only moves where their own page starts, in a trail
//! their role may read whole anyway; a well-formed one with nothing older (`0-0-3`) is an
//! empty last page on every store, never a command the store refuses.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::domain::{
    Dimension, ErrorCode, ListName, PhoneRegions, Rules, Sandbox, ValidationError, Value,
    invalid_cursor, page_limit, page_query,
};
use crate::instrumented::Instrumented;
use crate::lists::ListsError;
use crate::metrics::{Metrics, StoreOp};
use crate::store::layout::AUDIT_PARTS;
use crate::store::{
    AuditChunk, AuditOp, AuditPos, AuditRead, AuditRecord, AuditTerm, Deadline, EntryStore, Layout,
};

/// Most records one request examines.
pub const MAX_EXAMINED: usize = 10_000;
/// Records first read from each part (at least).
pub const FIRST_CHUNK: usize = 8;
/// Most records read from one part at a time.
pub const MAX_CHUNK: usize = 512;
/// How far apart a record's `at` and its position's time may be for `since` and `until` to
/// bound the reads exactly: a minute of clock skew between the writing instance and the
/// store, write latency included.
pub const CLOCK_MARGIN_MS: u64 = 60_000;

page_query! {
    /// The filters of the audit trail, as sent (every field checked by `AuditQuery`): the query
    /// string of `GET /v1/audit`, or the JSON body of `POST /v1/audit`, which keeps a value
    /// searched for out of URLs (and out of proxies' access logs) and may give `since`,
    /// `until` and `limit` as numbers. `list`, `sandbox`, these, then `limit` and `cursor`.
    /// (The body's schema keeps the name it had as a type of its own.)
    #[schema(as = AuditSearch)]
    pub struct RawAuditQuery {
        /// Only this dimension (needed with `value`).
        pub dimension: Option<String>,
        /// Only this entry: normalised for `dimension`, matched by its keyed fingerprint.
        pub value: Option<String>,
        /// Only this token name.
        pub who: Option<String>,
        /// `upsert`, `delete` or `import`.
        pub op: Option<String>,
        /// Unix ms, inclusive.
        #[serde(default, deserialize_with = "crate::domain::text_or_number")]
        #[schema(value_type = Option<i64>)]
        pub since: Option<String>,
        /// Unix ms, inclusive.
        #[serde(default, deserialize_with = "crate::domain::text_or_number")]
        #[schema(value_type = Option<i64>)]
        pub until: Option<String>,
    }
}

/// A checked audit query.
#[derive(Debug, Clone)]
pub struct AuditQuery {
    list: Option<ListName>,
    sandbox: Option<Sandbox>,
    dimension: Option<Dimension>,
    value: Option<Value>,
    who: Option<String>,
    op: Option<AuditOp>,
    since: Option<i64>,
    until: Option<i64>,
    limit: usize,
    cursor: Option<AuditPos>,
}

fn filter_error(message: impl Into<String>) -> ValidationError {
    ValidationError::new(ErrorCode::InvalidFilter, message)
}

fn millis(name: &str, raw: Option<String>) -> Result<Option<i64>, ValidationError> {
    raw.map(|s| {
        s.parse::<i64>().ok().filter(|t| *t >= 0).ok_or_else(|| {
            filter_error(format!(
                "{name}: expected Unix milliseconds (an integer >= 0)"
            ))
        })
    })
    .transpose()
}

impl TryFrom<RawAuditQuery> for AuditQuery {
    type Error = ValidationError;

    /// `AuditQuery::parse` under a new keyspace's rules.
    fn try_from(raw: RawAuditQuery) -> Result<Self, Self::Error> {
        Self::parse(raw, &Rules::default())
    }
}

impl AuditQuery {
    /// Checks a query; a `value` is normalised under `rules` in the query's sandbox (the
    /// default sandbox's region when none is given: a phone typed without its country code
    /// is read there).
    pub fn parse(raw: RawAuditQuery, rules: &Rules) -> Result<Self, ValidationError> {
        let list = raw
            .list
            .map(ListName::try_from)
            .transpose()
            .map_err(|e| e.at("list"))?;
        let sandbox = raw
            .sandbox
            .map(Sandbox::try_from)
            .transpose()
            .map_err(|e| e.at("sandbox"))?;
        let dimension = raw
            .dimension
            .map(Dimension::try_from)
            .transpose()
            .map_err(|e| e.at("dimension"))?;
        let value = match (raw.value, &dimension) {
            (None, _) => None,
            (Some(_), None) => {
                return Err(filter_error(
                    "value: needs its dimension (the value is matched by the fingerprint it has in that dimension)",
                ));
            }
            (Some(v), Some(d)) => {
                let norm = rules.norm(sandbox.as_ref().unwrap_or(&Sandbox::default()));
                Some(Value::parse_entry_with(d, &v, norm).map_err(|e| e.at("value"))?)
            }
        };
        let who = raw.who.filter(|w| !w.is_empty());
        if who.as_ref().is_some_and(|w| w.len() > 128) {
            return Err(filter_error("who: at most 128 bytes"));
        }
        let op = match raw.op.as_deref() {
            None => None,
            Some("upsert") => Some(AuditOp::Upsert),
            Some("delete") => Some(AuditOp::Delete),
            Some("import") => Some(AuditOp::Import),
            Some(_) => {
                return Err(filter_error("op: expected upsert, delete or import"));
            }
        };
        let since = millis("since", raw.since)?;
        let until = millis("until", raw.until)?;
        if let (Some(s), Some(u)) = (since, until)
            && s > u
        {
            return Err(filter_error("since is after until"));
        }
        let limit = page_limit(raw.limit)?;
        let cursor = raw
            .cursor
            .map(|c| {
                AuditPos::parse(&c)
                    .filter(|p| usize::from(p.part) <= AUDIT_PARTS)
                    .ok_or_else(invalid_cursor)
            })
            .transpose()?;
        Ok(Self {
            list,
            sandbox,
            dimension,
            value,
            who,
            op,
            since,
            until,
            limit,
            cursor,
        })
    }
}

impl AuditQuery {
    /// The index term the search reads through: the most selective of its filters that the
    /// trail is indexed by (a value, then `who`, then `list`); `None` without any of them.
    pub fn index_term(&self, layout: &Layout) -> Option<AuditTerm> {
        if let (Some(value), Some(dimension)) = (&self.value, &self.dimension) {
            return Some(AuditTerm::Value(layout.audit_value(dimension, value)));
        }
        if let Some(who) = &self.who {
            return Some(AuditTerm::Who(who.clone()));
        }
        self.list.as_ref().map(|l| AuditTerm::List(l.to_string()))
    }

    /// Where the reads start, as a cursor would: after the cursor, and no later than `until`
    /// (plus the margin) allows, in every part.
    fn start(&self) -> Option<AuditPos> {
        let until = self.until.map(|u| AuditPos {
            ms: u64::try_from(u)
                .unwrap_or(0)
                .saturating_add(CLOCK_MARGIN_MS),
            seq: u64::MAX,
            part: u16::MAX,
        });
        match (self.cursor, until) {
            (Some(c), Some(u)) => Some(c.min(u)),
            (c, u) => c.or(u),
        }
    }

    /// Positions older than this (in ms) hold no record at or after `since`.
    fn floor(&self) -> Option<u64> {
        self.since.map(|s| {
            u64::try_from(s)
                .unwrap_or(0)
                .saturating_sub(CLOCK_MARGIN_MS)
        })
    }
}

/// One record as `GET /v1/audit` shows it. Fields a record does not have are `null` (an
/// import's record names no entry).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct AuditEntry {
    pub at: Option<i64>,
    pub who: Option<String>,
    pub op: Option<String>,
    pub list: Option<String>,
    pub dimension: Option<String>,
    pub sandbox: Option<String>,
    /// Masked (`138****0000`), never raw.
    pub value: Option<String>,
    /// The entry's keyed fingerprint: the same entry has the same one in every record.
    pub fingerprint: Option<String>,
    pub expires_at: Option<i64>,
    pub reason: Option<String>,
    /// An import's count of entries written.
    pub entries: Option<u64>,
}

impl AuditEntry {
    fn of(r: &AuditRecord) -> Self {
        let text = |k: &str| r.get(k).map(str::to_owned);
        Self {
            at: r.get("at").and_then(|v| v.parse().ok()),
            who: text("who"),
            op: text("op"),
            list: text("list"),
            dimension: text("dimension"),
            sandbox: text("sandbox"),
            value: text("value"),
            fingerprint: text("fingerprint"),
            expires_at: r.get("expires_at").and_then(|v| v.parse().ok()),
            reason: text("reason"),
            entries: r.get("entries_written").and_then(|v| v.parse().ok()),
        }
    }
}

/// A page of `GET /v1/audit`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct AuditPage {
    pub records: Vec<AuditEntry>,
    /// Where the next page starts; `null` once the trail is read to its end.
    pub next_cursor: Option<String>,
}

/// Reads the audit trail for operators.
pub struct AuditTrail {
    store: Instrumented<dyn EntryStore>,
    deadline: Duration,
    phone_regions: PhoneRegions,
}

impl AuditTrail {
    pub fn new(store: Arc<dyn EntryStore>, metrics: Arc<Metrics>, deadline: Duration) -> Self {
        Self {
            store: Instrumented::new(store, metrics),
            deadline,
            phone_regions: PhoneRegions::default(),
        }
    }

    /// The same trail reading phones of each sandbox in `regions` (the settings').
    pub fn with_phone_regions(mut self, regions: PhoneRegions) -> Self {
        self.phone_regions = regions;
        self
    }

    /// How a searched value is normalised: the keyspace's rules, the configured regions.
    pub fn rules(&self) -> Rules {
        Rules {
            version: self.store.layout().rules(),
            regions: self.phone_regions.clone(),
        }
    }

    /// One page of records matching `q`, newest first.
    pub async fn page(&self, q: &AuditQuery) -> Result<AuditPage, ListsError> {
        let layout = self.store.layout();
        // The fingerprint the filtered value has in each (list, sandbox) met.
        let mut fingerprints: HashMap<(String, String), Option<String>> = HashMap::new();
        let mut records = Vec::new();
        let mut examined = 0usize;
        let mut merge = Merge::new(
            self.store.inner().audit_parts(),
            q.start(),
            q.limit,
            q.index_term(layout),
        );
        let floor = q.floor();
        let deadline = Deadline::after(self.deadline);
        loop {
            let reads = merge.reads();
            if !reads.is_empty() {
                let got = self
                    .store
                    .call(StoreOp::AuditPage, deadline, |s| {
                        let reads = &reads;
                        async move { s.audit_read(reads).await }
                    })
                    .await?;
                merge.add(&reads, got);
            }
            let Some((pos, r)) = merge
                .next()
                .filter(|(pos, _)| floor.is_none_or(|f| pos.ms >= f))
            else {
                return Ok(AuditPage {
                    records,
                    next_cursor: None,
                });
            };
            examined += 1;
            if self.matches(q, &r, layout, &mut fingerprints) {
                records.push(AuditEntry::of(&r));
                if records.len() == q.limit {
                    return Ok(AuditPage {
                        records,
                        next_cursor: Some(pos.encode()),
                    });
                }
            }
            if examined >= MAX_EXAMINED {
                return Ok(AuditPage {
                    records,
                    next_cursor: Some(pos.encode()),
                });
            }
        }
    }

    fn matches(
        &self,
        q: &AuditQuery,
        r: &AuditRecord,
        layout: &crate::store::Layout,
        fingerprints: &mut HashMap<(String, String), Option<String>>,
    ) -> bool {
        let is = |field: &str, want: Option<&str>| want.is_none_or(|w| r.get(field) == Some(w));
        if !(is("list", q.list.as_ref().map(ListName::as_str))
            && is("sandbox", q.sandbox.as_ref().map(Sandbox::as_str))
            && is("dimension", q.dimension.as_ref().map(Dimension::as_str))
            && is("who", q.who.as_deref())
            && is("op", q.op.map(AuditOp::as_str)))
        {
            return false;
        }
        let at = r.get("at").and_then(|v| v.parse::<i64>().ok());
        if q.since.is_some_and(|s| at.is_none_or(|a| a < s))
            || q.until.is_some_and(|u| at.is_none_or(|a| a > u))
        {
            return false;
        }
        let (Some(value), Some(dimension)) = (&q.value, &q.dimension) else {
            return true;
        };
        let (Some(list), Some(sandbox)) = (r.get("list"), r.get("sandbox")) else {
            return false;
        };
        let fp = fingerprints
            .entry((list.to_owned(), sandbox.to_owned()))
            .or_insert_with(|| {
                let list = ListName::try_from(list.to_owned()).ok()?;
                let sandbox = Sandbox::try_from(sandbox.to_owned()).ok()?;
                Some(
                    layout
                        .entry_key(&list, dimension, &sandbox, value)
                        .fingerprint(),
                )
            });
        fp.is_some() && r.get("fingerprint") == fp.as_deref()
    }
}

/// One part of the trail as the merge reads it.
struct Part {
    /// Read, not yet taken, newest first.
    buffered: VecDeque<(AuditPos, AuditRecord)>,
    /// Where the next read of this part starts.
    before: Option<(u64, u64)>,
    inclusive: bool,
    /// A read said nothing older is left.
    ended: bool,
    /// Records asked for by this part's next read.
    chunk: usize,
}

/// The k-way merge of the parts by position, newest first, reading ahead in chunks.
struct Merge {
    parts: Vec<Part>,
    /// Every read goes through the parts' index by this term (all records without one).
    index: Option<AuditTerm>,
}

impl Merge {
    /// Parts start where `cursor` left off: records strictly older than it in (position,
    /// part) order, so at its position too in the parts before its part.
    fn new(parts: u16, cursor: Option<AuditPos>, limit: usize, index: Option<AuditTerm>) -> Self {
        let first = (2 * limit)
            .div_ceil(usize::from(parts.max(1)))
            .clamp(FIRST_CHUNK, MAX_CHUNK);
        let parts = (0..parts)
            .map(|p| Part {
                buffered: VecDeque::new(),
                before: cursor.map(|c| (c.ms, c.seq)),
                inclusive: cursor.is_some_and(|c| p < c.part),
                ended: false,
                chunk: first,
            })
            .collect();
        Self { parts, index }
    }

    /// What to read before the next record can be taken: nothing while every part that is
    /// not ended holds a record; else every such part holding less than half its next chunk.
    fn reads(&self) -> Vec<AuditRead> {
        let dry = self.parts.iter().any(|p| !p.ended && p.buffered.is_empty());
        if !dry {
            return Vec::new();
        }
        self.parts
            .iter()
            .enumerate()
            .filter(|(_, p)| !p.ended && p.buffered.len() < p.chunk / 2)
            .map(|(i, p)| AuditRead {
                part: i as u16,
                before: p.before,
                inclusive: p.inclusive,
                count: p.chunk,
                index: self.index.clone(),
            })
            .collect()
    }

    fn add(&mut self, reads: &[AuditRead], got: Vec<AuditChunk>) {
        for (read, chunk) in reads.iter().zip(got) {
            let part = &mut self.parts[usize::from(read.part)];
            match chunk.next {
                None => part.ended = true,
                Some(next) => {
                    part.before = Some(next);
                    part.inclusive = false;
                }
            }
            part.buffered.extend(chunk.records);
            part.chunk = (part.chunk * 2).min(MAX_CHUNK);
        }
    }

    /// The newest record not yet taken; `None` once every part is read to its end. Call only
    /// when `reads()` is empty.
    fn next(&mut self) -> Option<(AuditPos, AuditRecord)> {
        let newest = self
            .parts
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.buffered.front().map(|(pos, _)| (*pos, i)))
            .max()?;
        self.parts[newest.1].buffered.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What a store holding `parts` (each part's stream ids, oldest first) answers.
    fn read(parts: &[Vec<(u64, u64)>], reads: &[AuditRead]) -> Vec<AuditChunk> {
        reads
            .iter()
            .map(|r| {
                let records: Vec<(AuditPos, AuditRecord)> = parts[usize::from(r.part)]
                    .iter()
                    .rev()
                    .filter(|id| match r.before {
                        None => true,
                        Some(b) if r.inclusive => **id <= b,
                        Some(b) => **id < b,
                    })
                    .take(r.count)
                    .map(|&(ms, seq)| {
                        let pos = AuditPos {
                            ms,
                            seq,
                            part: r.part,
                        };
                        (pos, AuditRecord { fields: Vec::new() })
                    })
                    .collect();
                let next = records
                    .last()
                    .filter(|_| records.len() == r.count)
                    .map(|(p, _)| (p.ms, p.seq));
                AuditChunk { records, next }
            })
            .collect()
    }

    /// One page of at most `limit` positions from `cursor`, and the reads it took.
    fn page(
        parts: &[Vec<(u64, u64)>],
        cursor: Option<AuditPos>,
        limit: usize,
    ) -> (Vec<AuditPos>, usize) {
        let mut merge = Merge::new(parts.len() as u16, cursor, limit, None);
        let (mut out, mut trips) = (Vec::new(), 0);
        while out.len() < limit {
            let reads = merge.reads();
            if !reads.is_empty() {
                trips += 1;
                let got = read(parts, &reads);
                merge.add(&reads, got);
            }
            match merge.next() {
                Some((pos, _)) => out.push(pos),
                None => break,
            }
        }
        (out, trips)
    }

    proptest! {
        /// Paging through the merge with its cursors yields every record once, in
        /// descending (position, part) order, whatever the parts hold and the page size.
        #[test]
        fn pages_cover_every_part_once_in_order(
            parts in prop::collection::vec(
                prop::collection::btree_set((0u64..50, 0u64..3), 0..150), 1..8),
            limit in 1usize..40,
        ) {
            let parts: Vec<Vec<(u64, u64)>> =
                parts.into_iter().map(|s| s.into_iter().collect()).collect();
            let mut want: Vec<AuditPos> = parts
                .iter()
                .enumerate()
                .flat_map(|(p, ids)| {
                    ids.iter().map(move |&(ms, seq)| AuditPos { ms, seq, part: p as u16 })
                })
                .collect();
            want.sort_by(|a, b| b.cmp(a));
            let mut got = Vec::new();
            let mut cursor = None;
            loop {
                let (page, _) = page(&parts, cursor, limit);
                let full = page.len() == limit;
                cursor = page.last().copied();
                got.extend(page);
                if !full {
                    break;
                }
            }
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn a_page_reads_about_its_size_not_its_size_per_part() {
        // 65 parts of 1,000 records each, interleaved in time.
        let parts: Vec<Vec<(u64, u64)>> = (0..65u64)
            .map(|p| (0..1_000u64).map(|i| (i * 65 + p, 0)).collect())
            .collect();
        let (first, trips) = page(&parts, None, 100);
        assert_eq!(first.len(), 100);
        assert_eq!(
            first[0],
            AuditPos {
                ms: 64_999,
                seq: 0,
                part: 64
            }
        );
        assert_eq!(trips, 1, "the first read covers a page of 100");
        let (long, trips) = page(&parts, None, MAX_EXAMINED);
        assert_eq!(long.len(), MAX_EXAMINED);
        assert!(
            trips <= 10,
            "{trips} round trips for {MAX_EXAMINED} records"
        );
    }
}
