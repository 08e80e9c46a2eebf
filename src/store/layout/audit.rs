//! The audit trail: its parts, the index beside each part, the records as they go into the
//! stream, and the summary the audit tool leaves.
//!
//! # Audit trail
//! Every upsert and delete appends one record per entry to the audit trail: when, who, op,
//! list, dimension, sandbox, expiry, reason, the fingerprint (the field, as 16 hex digits:
//! keyed in format 2), the `bucket` number (keyed in format 2 too; what makes the trail the
//! change log an instance catches up from, `changelog`), the value fingerprint `vfp` and the
//! masked value; never the raw value, nor anything else derived from it. `vfp` is the format's `audit-value` function
//! (`fingerprint`: SipHash-2-4 under its own subkey in format 2, xxh3-64 in format 1) of
//!
//! ```text
//! <dimension> "\n" <normalised value>
//! ```
//!
//! as 16 lower-case hex digits: without list and sandbox, so that one index term finds a
//! value's records in every list and sandbox (`fingerprint`, which has them, differs in each).
//! It also lets a reader of the trail see that two records of different lists or sandboxes
//! name one value, which the read role, reading the whole trail, could see by value search
//! anyway; without the key it names nothing.
//!
//! The trail is split in [`AUDIT_PARTS`] (64) capped streams `<prefix>audit:{<tag>}`, each
//! holding at most `ceil(audit_max_len / 64)` records, so no write depends on one shard: part
//! `i`'s hash tag is the smallest decimal number whose slot lies in the `i`-th 256 slots, so
//! the parts spread evenly over any even split of the 16,384 slots (every primary of a
//! 3-to-64-primary cluster holds some). A write puts each entry's record in a part on the
//! *same primary* as the entry's bucket (`parts on that primary[bucket % their count]`, from
//! the replica monitor's slot map), so it depends only on its own entries' shards (a primary
//! holding no part, or an unknown map, falls back to part `bucket % 64`). Records are written
//! after the entries and before the write is acknowledged: an acknowledged write always has
//! its records (a write answered 503 may have landed without them). Readers merge the parts
//! newest first by stream id (server time, then sequence), together with the single stream
//! `<prefix>audit` of keyspaces written before the split (read, never written). Read cost of
//! a page of the `n` newest records: 65 `XREVRANGE … COUNT n`, sent as one round trip per
//! primary (concurrent), returning at most 65·n records to merge. The alternative, a record
//! in the same slot and transaction as its entry, would be atomic but leave up to 16,384
//! streams to merge on read.
//!
//! ## The audit index
//! So that a search by value, `who` or `list` reads the records it returns and not the trail,
//! every stream has an index beside it, in its slot: the sorted set `<stream>:ix`
//! (`<prefix>audit:{<tag>}:ix`), every member of score 0, one per *term* of each record it
//! holds, and nothing else:
//!
//! ```text
//! member = <term> 0x00 <ms: 11 lower-case hex digits> <seq: 8 lower-case hex digits>
//! term   = "v:" <vfp> | "w:" <who> | "l:" <list>     (the record's first field of each name;
//!                                                    vfp only if 16 lower-case hex digits)
//!          with 0x00 written 0x01 0x01 and 0x01 written 0x01 0x02
//! e.g.     "w:risk-loader" 0x00 "18bcfe5684d" "00000003"   (stream id 1700000000077-3)
//! ```
//!
//! At most three members a record (a `vfp`, a `who`, a `list`; an import's record has a
//! `who` only). The escape keeps every term free of the `0x00` that ends it, so the members of
//! one term are exactly those starting with `<term> 0x00`, and no other term's lie between
//! them (`w:n` and `w:n\0…` stay apart); the fixed-width id makes their byte order the stream
//! order. A read of one stream through the index is `ZRANGE <ix> (<term> 0x00 <before>
//! [<term> 0x00 BYLEX REV LIMIT 0 <n>` (`(<term> 0x01` without a bound), then `XRANGE
//! <stream> <id> <id>` for each member, each step for every stream at once in one round trip
//! per primary: O(log m + n) for `n` records out of `m` members. A search thus costs its
//! records plus one probe of each of the 65 indexes. Not one script doing both, to save the
//! round trip: measured (`benches/audit_search.sh`), a record fetched inside a script cost
//! Redis ~30 µs (its reply made a Lua table, then a reply again), where the client's `XRANGE`
//! costs ~8.
//!
//! Writes keep the index exact with the stream. A write's records go to each part in one
//! `EVAL` of `scripts::AUDIT_APPEND` (inside the write's `MULTI` on one node; in the per-slot
//! step on a cluster, as the `XADD`s were): `XADD` each record, `ZADD` its members, and once
//! the part holds more than its cap, take the oldest records down to the cap less a sixteenth
//! (at most 1,000 a call), `ZREM` their members, computed from their own fields, and
//! `XTRIM MINID` the first record kept: trimming costs one call every `cap / 16` records, and
//! the index never holds a record the stream does not. `EVAL`, the script sent whole (~2 KB a
//! part written), not `EVALSHA`: inside a `MULTI` a `NOSCRIPT` (a failover to a replica that
//! never loaded it) fails that command only, after the entries before it were written.
//! `namelist-tools import`'s record goes the same way (`RedisStore::append_audit`).
//!
//! `<stream>:ixm` (a string) is the *mark*: the id of the newest record known indexed. An
//! older build writes records with a plain `XADD … MAXLEN ~` (a rolling deploy), which no
//! index holds; so every append first indexes up to 100 records after the mark, and moves it
//! to its last record when none was left. At open the store runs the same catch-up
//! (`scripts::AUDIT_CATCH_UP`) on every stream, 1,000 records a call, every stream at once
//! per round trip, until none is left: the first open after an upgrade indexes the records
//! written before the index existed (by `who` and `list`: they have no `vfp`, so a search by
//! value does not find them), every later one finds nothing to do in one round trip. Records
//! an older build trims away leave their members behind: reads skip a member whose record is
//! gone, and an open that finds an index of more than 3 members a record drops it and its
//! mark and builds it again (searches may miss a stream's older records for the few ms that
//! takes). The unsplit stream `<prefix>audit` is indexed once the same way into
//! `<prefix>audit:ix{<prefix>audit}` and `<prefix>audit:ixm{<prefix>audit}` (its key has no
//! tag, so the whole key is theirs: the same slot; a prefix holds no braces); it is never
//! written, so that index never changes again.
//!
//! Memory, measured (`tests/integration/audit_index.rs`, `measure_bytes_per_record`: 100,000 records of
//! a phone upsert with a reason under the default cap, 96,649 kept; `MEMORY USAGE … SAMPLES
//! 0`; Redis 7.0): the stream 164 B a record (140 without the `vfp`), the index 425 B a record
//! (3 members of 142 B: a part's set holds ~4,700 members, far past the 128 that Redis keeps
//! as a listpack, so each member is a skiplist node, a dict entry and its string), the marks
//! 6.6 KB in all: ~590 B a record, ~57 MB at the default cap (~14 MB before the index).
//! Time, measured by the same test (`INFO commandstats`, the 2-core machine under other
//! builds): an append costs ~30 µs of Redis time a record (the `XADD`, 3 skiplist inserts and
//! the Lua that builds the members; trims included; ~22 µs for records without a `vfp`), where
//! a plain `XADD … MAXLEN ~` cost ~3 µs. A write's `MULTI` grows by that much per entry: ~0.3 s
//! for the 10,000 entries a request may hold (bulk loads belong to `namelist-tools import`,
//! one record a run).
//! Considered and not taken: binary ids and `vfp`s would shorten members by 17 B but save only
//! ~7 % (jemalloc's size classes); a stream per (part, who or list) would cost a few bytes a
//! record, but would need a key per value for `vfp`, and more keys to trim; indexing after the
//! `EXEC` (the mark's catch-up makes it safe) would keep a write's `MULTI` as short as before,
//! at the price of a moment when a record is in its stream but not yet in its index.
//!
//! The audit tool (`namelist-tools audit`) leaves its last summary in the hash
//! `<prefix>audit:last` ([`AuditSummary`]); every service instance reads it periodically and
//! exports it as gauges (buckets near and over the listpack limit, bytes per entry).

use serde::{Deserialize, Serialize};

use super::{CLUSTER_SLOTS, EntryKey, Layout, key_slot, slot_tags};
use crate::domain::{Dimension, ListName, Sandbox, Value};

/// What an audit record says was done to an entry; its `op` field, spelt as `as_str`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuditOp {
    /// Added or changed through the API (`upsert`).
    Upsert,
    /// Deleted through the API (`delete`).
    Delete,
    /// Written in bulk by `namelist-tools import` (`import`).
    Import,
}

impl AuditOp {
    /// The `op` field as stored in the audit trail (never changes: readers match on it).
    pub fn as_str(self) -> &'static str {
        match self {
            AuditOp::Upsert => "upsert",
            AuditOp::Delete => "delete",
            AuditOp::Import => "import",
        }
    }
}

impl std::fmt::Display for AuditOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A term of the audit trail's index: what a read through the index finds
/// (`AuditRead::index`). Every record is indexed, when written, under the terms of the
/// fields it has (`AuditRecord::terms`): at most one of each kind.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AuditTerm {
    /// The record's value fingerprint (its `vfp` field, `Layout::audit_value`): one entry's
    /// value in its dimension, in every list and sandbox. Records written before the field
    /// existed have none.
    Value(u64),
    /// The record's `who` (a token's name, an import's actor).
    Who(String),
    /// The record's `list`.
    List(String),
}

/// Parts of the audit trail (see the module docs).
pub const AUDIT_PARTS: usize = 64;

/// The hash tags of the audit parts: for part `i`, the smallest decimal number whose slot is
/// in `[256·i, 256·(i+1))` (the smallest of those slots' `slot_tags`). Computed once;
/// `tests::audit_tags_are_stable` pins them, since a different tag would be a different key.
pub(super) fn audit_tags() -> &'static [u32; AUDIT_PARTS] {
    static TAGS: std::sync::OnceLock<[u32; AUDIT_PARTS]> = std::sync::OnceLock::new();
    TAGS.get_or_init(|| {
        let width = usize::from(CLUSTER_SLOTS) / AUDIT_PARTS;
        let mut tags = [u32::MAX; AUDIT_PARTS];
        for (part, slots) in tags.iter_mut().zip(slot_tags().chunks(width)) {
            *part = slots.iter().copied().min().unwrap_or(u32::MAX);
        }
        tags
    })
}

impl Layout {
    /// The audit stream of keyspaces written before the trail was split in parts: read,
    /// never written.
    pub fn audit_key(&self) -> String {
        format!("{}audit", self.prefix)
    }

    /// Audit part `part` (`0..AUDIT_PARTS`; taken modulo).
    pub fn audit_part_key(&self, part: usize) -> String {
        format!(
            "{}audit:{{{}}}",
            self.prefix,
            audit_tags()[part % AUDIT_PARTS]
        )
    }

    /// The hash slot of audit part `part` (the same for every prefix: it is the tag's).
    pub fn audit_part_slot(part: usize) -> u16 {
        key_slot(audit_tags()[part % AUDIT_PARTS].to_string().as_bytes())
    }

    /// Every key the audit trail may be in: the parts, then the unsplit stream.
    pub fn audit_keys(&self) -> Vec<String> {
        (0..AUDIT_PARTS)
            .map(|i| self.audit_part_key(i))
            .chain([self.audit_key()])
            .collect()
    }

    /// The index of audit stream `i` of [`Layout::audit_keys`] (a part, or the unsplit stream
    /// last) and its mark, the id of the newest record known indexed: `<stream>:ix` and
    /// `<stream>:ixm` for a part (its hash tag), `<prefix>audit:ix{<prefix>audit}` and
    /// `<prefix>audit:ixm{<prefix>audit}` for the unsplit stream, whose key has no tag: the
    /// tag is the whole key, so both share its slot (a prefix holds no braces).
    pub fn audit_index_keys(&self, i: usize) -> (String, String) {
        if i < AUDIT_PARTS {
            let part = self.audit_part_key(i);
            (format!("{part}:ix"), format!("{part}:ixm"))
        } else {
            let single = self.audit_key();
            (
                format!("{single}:ix{{{single}}}"),
                format!("{single}:ixm{{{single}}}"),
            )
        }
    }

    /// An audit record's value fingerprint (its `vfp` field): the format's `audit-value`
    /// function of `<dimension> "\n" <normalised value>`, without list or sandbox, so that
    /// one index term finds a value wherever it was written.
    pub fn audit_value(&self, dimension: &Dimension, value: &Value) -> u64 {
        let mut bytes = Vec::with_capacity(48);
        {
            use std::io::Write;
            write!(bytes, "{dimension}\n{value}").expect("writing to a Vec cannot fail");
        }
        self.hashing.audit_value(&bytes)
    }

    /// The hash holding the last audit's [`AuditSummary`].
    pub fn audit_summary_key(&self) -> String {
        format!("{}audit:last", self.prefix)
    }
}

/// What the last audit found, as the audit tool leaves it in `<prefix>audit:last` for the
/// service's gauges. With `sampled`, the bucket counts are scaled from the sample to every
/// bucket found.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditSummary {
    /// When the audit started, Unix ms.
    pub at_ms: i64,
    pub sampled: bool,
    /// Bucket keys found.
    pub buckets: u64,
    pub entries: u64,
    pub bytes_per_entry: f64,
    /// `hash-max-listpack-entries` (the lowest over the nodes), if known.
    pub listpack_limit: Option<u64>,
    /// Buckets at 90 % of the limit or more, but not over it.
    pub near_limit: u64,
    pub over_limit: u64,
    pub hashtable: u64,
    /// Entries past their expiry, not yet swept.
    pub expired: u64,
    /// The fill histogram: (from, to, buckets) with `from <= fill < to`, in order (the last
    /// bin may be wider). Empty from an audit that wrote none.
    pub fill_histogram: Vec<(u64, u64, u64)>,
}

impl AuditSummary {
    /// The hash fields, as written.
    pub fn to_fields(&self) -> Vec<(&'static str, String)> {
        vec![
            ("at_ms", self.at_ms.to_string()),
            ("sampled", u8::from(self.sampled).to_string()),
            ("buckets", self.buckets.to_string()),
            ("entries", self.entries.to_string()),
            ("bytes_per_entry", format!("{:.3}", self.bytes_per_entry)),
            (
                "listpack_limit",
                self.listpack_limit
                    .map_or_else(String::new, |l| l.to_string()),
            ),
            ("near_limit", self.near_limit.to_string()),
            ("over_limit", self.over_limit.to_string()),
            ("hashtable", self.hashtable.to_string()),
            ("expired", self.expired.to_string()),
            (
                "fill_histogram",
                self.fill_histogram
                    .iter()
                    .map(|(from, to, n)| format!("{from}-{to}:{n}"))
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        ]
    }

    /// Reads the hash back; `None` if a field is missing or unreadable (an older or foreign
    /// writer), so a gauge never shows a made-up number.
    pub fn from_fields(fields: &std::collections::HashMap<String, String>) -> Option<Self> {
        fn get<T: std::str::FromStr>(
            f: &std::collections::HashMap<String, String>,
            k: &str,
        ) -> Option<T> {
            f.get(k)?.parse().ok()
        }
        Some(Self {
            at_ms: get(fields, "at_ms")?,
            sampled: get::<u8>(fields, "sampled")? == 1,
            buckets: get(fields, "buckets")?,
            entries: get(fields, "entries")?,
            bytes_per_entry: get(fields, "bytes_per_entry")?,
            listpack_limit: get(fields, "listpack_limit"),
            near_limit: get(fields, "near_limit")?,
            over_limit: get(fields, "over_limit")?,
            hashtable: get(fields, "hashtable")?,
            expired: get(fields, "expired")?,
            // Optional: audits before the console wrote none.
            fill_histogram: fields
                .get("fill_histogram")
                .map(|h| {
                    h.split(',')
                        .filter(|b| !b.is_empty())
                        .filter_map(|b| {
                            let (range, n) = b.split_once(':')?;
                            let (from, to) = range.split_once('-')?;
                            Some((from.parse().ok()?, to.parse().ok()?, n.parse().ok()?))
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
    }
}

/// The width of a stream id in an index member: 11 hex digits of ms (until the year 2527),
/// 8 of sequence.
pub const AUDIT_INDEX_ID_LEN: usize = 19;

/// A stream id `(ms, seq)` as an index member ends with it: fixed width, lower-case hex, so
/// that members of one term sort by id. `None` past what the width holds (no stream id this
/// service writes before the year 2527).
pub fn audit_index_id(ms: u64, seq: u64) -> Option<String> {
    (ms < 1 << 44 && seq <= u64::from(u32::MAX)).then(|| format!("{ms:011x}{seq:08x}"))
}

/// The inverse of [`audit_index_id`]: exactly 19 lower-case hex digits.
pub fn parse_audit_index_id(id: &str) -> Option<(u64, u64)> {
    if id.len() != AUDIT_INDEX_ID_LEN
        || !id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    Some((
        u64::from_str_radix(&id[..11], 16).ok()?,
        u64::from_str_radix(&id[11..], 16).ok()?,
    ))
}

/// The bytes of an index term, as members start with them: `v:`, `w:` or `l:` and the field
/// as stored (`vfp` as 16 hex digits), with `\0` written `\1\1` and `\1` written `\1\2` so
/// that no term holds the `\0` that ends it (the Lua twin is `AUDIT_PREAMBLE`'s `esc`).
pub fn audit_index_term(term: &AuditTerm) -> Vec<u8> {
    let (tag, text) = match term {
        AuditTerm::Value(v) => ("v:", std::borrow::Cow::Owned(format!("{v:016x}"))),
        AuditTerm::Who(w) => ("w:", std::borrow::Cow::Borrowed(w.as_str())),
        AuditTerm::List(l) => ("l:", std::borrow::Cow::Borrowed(l.as_str())),
    };
    let mut out = Vec::with_capacity(tag.len() + text.len());
    out.extend_from_slice(tag.as_bytes());
    for &b in text.as_bytes() {
        match b {
            0 => out.extend_from_slice(&[1, 1]),
            1 => out.extend_from_slice(&[1, 2]),
            b => out.push(b),
        }
    }
    out
}

/// One audit record: ordered (name, value) pairs, as they go into the stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    pub fields: Vec<(String, String)>,
}

impl AuditRecord {
    /// The record of one upserted or deleted entry. `value_fingerprint` is
    /// `Layout::audit_value` of its dimension and value; `value_masked` must already be
    /// masked.
    #[allow(clippy::too_many_arguments)]
    pub fn entry(
        at_ms: i64,
        actor: &str,
        op: AuditOp,
        list: &ListName,
        dimension: &Dimension,
        sandbox: &Sandbox,
        expires_at_ms: Option<i64>,
        reason: Option<&str>,
        key: &EntryKey,
        value_fingerprint: u64,
        value_masked: String,
    ) -> Self {
        let mut fields = vec![
            ("at".to_owned(), at_ms.to_string()),
            ("who".to_owned(), actor.to_owned()),
            ("op".to_owned(), op.as_str().to_owned()),
            ("list".to_owned(), list.to_string()),
            ("dimension".to_owned(), dimension.to_string()),
            ("sandbox".to_owned(), sandbox.to_string()),
            (
                "expires_at".to_owned(),
                expires_at_ms.map_or_else(|| "never".to_owned(), |t| t.to_string()),
            ),
            ("fingerprint".to_owned(), key.fingerprint()),
            // What makes the trail the change log: the bucket the entry lives in.
            ("bucket".to_owned(), key.bucket.to_string()),
            ("vfp".to_owned(), format!("{value_fingerprint:016x}")),
            ("value".to_owned(), value_masked),
        ];
        if let Some(r) = reason {
            fields.push(("reason".to_owned(), r.to_owned()));
        }
        Self { fields }
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The index terms the record is found by: its `vfp` (when it is 16 lower-case hex
    /// digits, as written), `who` and `list`, the first of each name (the index script's
    /// `members` reads the fields the same way).
    pub fn terms(&self) -> Vec<AuditTerm> {
        let mut out = Vec::with_capacity(3);
        if let Some(v) = self.get("vfp").filter(|v| {
            v.len() == 16
                && v.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        }) && let Ok(v) = u64::from_str_radix(v, 16)
        {
            out.push(AuditTerm::Value(v));
        }
        if let Some(w) = self.get("who") {
            out.push(AuditTerm::Who(w.to_owned()));
        }
        if let Some(l) = self.get("list") {
            out.push(AuditTerm::List(l.to_owned()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::fingerprint::Hashing;
    use crate::store::layout::tests::keyed;

    #[test]
    fn audit_tags_are_stable() {
        let l = Layout::new("nl:", 10, Hashing::Unkeyed);
        // Pinned: these are key names in existing keyspaces.
        assert_eq!(l.audit_part_key(0), "nl:audit:{10}");
        assert_eq!(l.audit_part_key(3), "nl:audit:{342}");
        assert_eq!(audit_tags()[..8], [10, 18, 113, 342, 29, 21, 3, 122]);
        assert_eq!(audit_tags().iter().max(), Some(&343));
        let mut seen = std::collections::HashSet::new();
        for i in 0..AUDIT_PARTS {
            let slot = Layout::audit_part_slot(i);
            assert_eq!(usize::from(slot) / 256, i, "part {i} in its 256 slots");
            assert_eq!(key_slot(l.audit_part_key(i).as_bytes()), slot);
            assert!(seen.insert(l.audit_part_key(i)));
        }
        assert_eq!(l.audit_keys().len(), AUDIT_PARTS + 1);
        assert_eq!(l.audit_keys().last().unwrap(), "nl:audit");
    }

    #[test]
    fn audit_index_keys_share_their_stream_slot() {
        let l = Layout::new("nl:", 10, Hashing::Unkeyed);
        let streams = l.audit_keys();
        for (i, stream) in streams.iter().enumerate() {
            let (ix, mark) = l.audit_index_keys(i);
            let slot = key_slot(stream.as_bytes());
            assert_eq!(key_slot(ix.as_bytes()), slot, "{ix}");
            assert_eq!(key_slot(mark.as_bytes()), slot, "{mark}");
        }
        assert_eq!(l.audit_index_keys(3).0, "nl:audit:{342}:ix");
        assert_eq!(l.audit_index_keys(AUDIT_PARTS).0, "nl:audit:ix{nl:audit}");
        assert_eq!(l.audit_index_keys(AUDIT_PARTS).1, "nl:audit:ixm{nl:audit}");
    }

    #[test]
    fn audit_index_ids_sort_as_stream_ids() {
        let ids = [
            (0, 0),
            (0, 1),
            (0, u64::from(u32::MAX)),
            (1, 0),
            (1_764_000_000_000, 7),
            (1_764_000_000_001, 0),
            ((1 << 44) - 1, u64::from(u32::MAX)),
        ];
        let written: Vec<String> = ids
            .iter()
            .map(|&(ms, seq)| audit_index_id(ms, seq).unwrap())
            .collect();
        for (w, id) in written.iter().zip(ids) {
            assert_eq!(w.len(), AUDIT_INDEX_ID_LEN);
            assert_eq!(parse_audit_index_id(w), Some(id));
        }
        assert!(written.windows(2).all(|w| w[0] < w[1]), "{written:?}");
        // The module docs' example.
        assert_eq!(
            audit_index_id(1_700_000_000_077, 3).as_deref(),
            Some("18bcfe5684d00000003")
        );
        assert_eq!(audit_index_id(1 << 44, 0), None);
        assert_eq!(audit_index_id(0, 1 << 32), None);
        for bad in [
            "",
            "0000000000000000000 ",
            "000000000000000000A",
            "0000000000000000000x",
        ] {
            assert_eq!(parse_audit_index_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn audit_index_terms_never_hold_the_byte_that_ends_them() {
        use super::AuditTerm;
        let term = |t: AuditTerm| audit_index_term(&t);
        assert_eq!(term(AuditTerm::Value(0xab)), b"v:00000000000000ab");
        assert_eq!(term(AuditTerm::Who("alice".into())), b"w:alice");
        assert_eq!(term(AuditTerm::List("black".into())), b"l:black");
        assert_eq!(
            term(AuditTerm::Who("a\0b\u{1}c".into())),
            b"w:a\x01\x01b\x01\x02c"
        );
        // Two names, one a prefix of the other with the escaped byte after it, stay apart:
        // neither term followed by `\0` is a prefix of the other's.
        let (a, b) = (
            term(AuditTerm::Who("n".into())),
            term(AuditTerm::Who("n\0".into())),
        );
        assert!(!a.contains(&0) && !b.contains(&0));
        assert!(
            ![b.clone(), vec![0]]
                .concat()
                .starts_with(&[a, vec![0]].concat())
        );
    }

    #[test]
    fn a_record_is_indexed_by_its_vfp_who_and_list() {
        use super::AuditTerm;
        let r = |fields: &[(&str, &str)]| AuditRecord {
            fields: fields
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        };
        assert_eq!(
            r(&[
                ("who", "alice"),
                ("list", "black"),
                ("vfp", "00000000000000ff"),
                ("who", "bob"),
            ])
            .terms(),
            vec![
                AuditTerm::Value(255),
                AuditTerm::Who("alice".into()),
                AuditTerm::List("black".into()),
            ],
            "the first field of each name"
        );
        for bad in [
            "ff",
            "00000000000000FF",
            "000000000000000g",
            "000000000000000000",
        ] {
            assert_eq!(
                r(&[("vfp", bad)]).terms(),
                vec![],
                "a vfp this service did not write: {bad}"
            );
        }
        assert_eq!(
            r(&[("op", "import"), ("who", "loader")]).terms(),
            vec![AuditTerm::Who("loader".into())]
        );
    }

    #[test]
    fn the_value_fingerprint_ignores_list_and_sandbox_and_needs_the_key() {
        let keyed = Layout::new("nl:", 10, keyed());
        let dim: Dimension = "phone".parse().unwrap();
        let a = Value::parse_entry(&dim, "+86 138-0000-0000").unwrap();
        let b = Value::parse_entry(&dim, "+8613800000000").unwrap();
        assert_eq!(keyed.audit_value(&dim, &a), keyed.audit_value(&dim, &b));
        let uid: Dimension = "uid".parse().unwrap();
        let c = Value::parse_entry(&uid, "+8613800000000").unwrap();
        assert_ne!(
            keyed.audit_value(&dim, &a),
            keyed.audit_value(&uid, &c),
            "the dimension counts"
        );
        let unkeyed = Layout::new("nl:", 10, Hashing::Unkeyed);
        assert_eq!(
            unkeyed.audit_value(&dim, &a),
            xxhash_rust::xxh3::xxh3_64(format!("phone\n{a}").as_bytes())
        );
        assert_ne!(keyed.audit_value(&dim, &a), unkeyed.audit_value(&dim, &a));
    }
}
