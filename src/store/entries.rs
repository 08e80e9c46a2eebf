//! What `EntryStore` takes and gives: a write batch, a removal and what it found, the lists' count
//! changes and pages, and reads of the audit trail (the record's `op`, positions in the
//! merged trail, index terms, one part's read and what it found).

use crate::store::layout::{AuditRecord, EntryKey, PrefixLen, Scope};

// Parts of the format (an audit record's op and index terms, a range of scopes), defined
// with it and taken and given by `EntryStore` as they are.
pub use crate::store::layout::{AuditOp, AuditTerm, CountsQuery};

/// The keys and audit records of one removal (`EntryStore::remove`), as `WriteBatch` is of
/// an upsert.
#[derive(Debug, Clone)]
pub struct RemoveBatch<'a> {
    /// The fields to delete.
    pub keys: &'a [EntryKey],
    /// Unix ms: what each key held is reported live or expired as of then (`Removed`).
    pub now_ms: i64,
    pub audit: Vec<AuditRecord>,
}

/// What a removal found at one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removed {
    Absent,
    /// Present but expired: deleted, not counted as removed by the API, but it was counted in
    /// its list's entries.
    Expired,
    Live,
}

impl Removed {
    pub fn was_live(self) -> bool {
        self == Removed::Live
    }

    pub fn was_present(self) -> bool {
        self != Removed::Absent
    }
}

/// A change to one scope's approximate entry count (`EntryStore::count_changes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountChange {
    pub scope: Scope,
    pub delta: i64,
}

/// One scope's approximate entry count and the time of its last change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListCount {
    pub list: String,
    pub sandbox: String,
    pub entries: i64,
    pub last_change_ms: i64,
}

/// One page of counts (`EntryStore::list_counts`), in (list, sandbox) order; `more` when
/// further scopes match past the last one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CountsPage {
    pub counts: Vec<ListCount>,
    pub more: bool,
}

/// Where an audit record sits in the merged trail: newest first is descending
/// (`ms`, `seq`, `part`), the stream id of the part holding it, then the part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AuditPos {
    pub ms: u64,
    pub seq: u64,
    pub part: u16,
}

impl AuditPos {
    /// `ms-seq-part`, the form a cursor carries.
    pub fn encode(self) -> String {
        format!("{}-{}-{}", self.ms, self.seq, self.part)
    }

    /// The inverse of `encode`; `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        let mut it = s.split('-');
        let pos = Self {
            ms: it.next()?.parse().ok()?,
            seq: it.next()?.parse().ok()?,
            part: it.next()?.parse().ok()?,
        };
        it.next().is_none().then_some(pos)
    }
}

/// One part's read of the audit trail (`EntryStore::audit_read`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRead {
    pub part: u16,
    /// Records older than this stream position `(ms, seq)` of the part (the newest when
    /// `None`), and at it too when `inclusive`. Any position is valid, `(0, 0)` exclusive
    /// included (nothing is older): a cursor is the caller's input, and no position it holds
    /// may turn into a command the store refuses.
    pub before: Option<(u64, u64)>,
    pub inclusive: bool,
    pub count: usize,
    /// Only the records indexed under this term, read through the part's index: the cost is
    /// that of the records returned (plus a probe of the index), not of the records passed
    /// over. `None`: every record.
    pub index: Option<AuditTerm>,
}

/// What one `AuditRead` found: up to its `count` records of its part, newest first, each
/// with its place in the merged trail, and where the part goes on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditChunk {
    pub records: Vec<(AuditPos, AuditRecord)>,
    /// The position `(ms, seq)` the next read of the part starts strictly before; `None` when
    /// nothing older is left. Past the last record returned when it is one: a read through an
    /// index may pass over index entries whose record is gone (`layout`, *Audit trail*), and
    /// must not meet them again.
    pub next: Option<(u64, u64)>,
}

impl AuditRead {
    /// Whether nothing can be older than the bound: exclusive of the very first position.
    pub fn before_everything(&self) -> bool {
        self.before == Some((0, 0)) && !self.inclusive
    }
}

/// The entries, registry additions and audit records of one upsert.
#[derive(Debug, Clone, Default)]
pub struct WriteBatch {
    /// (where, expiry code); for a key given twice the last one wins.
    pub entries: Vec<(EntryKey, u32)>,
    /// Prefix lengths that must be in each scope's registry.
    pub prefixes: Vec<(Scope, PrefixLen)>,
    pub audit: Vec<AuditRecord>,
    /// The (list, sandbox) of each entry, in the order of `entries`, for a store that keeps
    /// the lists' counts with its writes (`EntryStore::counts_itself`); others ignore it.
    /// Entries beyond its length are not counted there.
    pub scopes: Vec<Scope>,
}
