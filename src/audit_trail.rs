//! The audit trail as operators read it (`GET /v1/audit`): newest first, filtered, paged.
//!
//! Records never hold a raw value: each has the masked value and the entry's keyed
//! fingerprint (`EntryKey::fingerprint`). A `value` filter is therefore normalised for its
//! `dimension` and turned into the fingerprint each record's (list, sandbox) would give it,
//! and records are matched on that; the value itself is neither stored, echoed nor logged.
//!
//! Cost: the store reads the trail in pages of [`READ_BATCH`] (on Redis one `XREVRANGE` per
//! audit part, all at once, merged by stream id) and the filters run here. One request
//! examines at most [`MAX_EXAMINED`] records: a selective filter over a long trail answers
//! the matches found so far with a `next_cursor` that resumes where it stopped, so no request
//! costs more than about 20 such reads, whatever the trail holds.
//!
//! The cursor is the position of the last record examined (`AuditPos`, written `ms-seq-part`):
//! opaque to callers, checked on the way in (a malformed one is a 400 `invalid_cursor`). It
//! is not signed: a caller who edits one only moves where their own page starts, in a trail
//! their role may read whole anyway.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::domain::{Dimension, ErrorCode, ListName, Sandbox, ValidationError, Value};
use crate::instrumented::Instrumented;
use crate::lists::ListsError;
use crate::metrics::{Metrics, StoreOp};
use crate::store::layout::AUDIT_PARTS;
use crate::store::{AuditOp, AuditPos, AuditRecord, Deadline, EntryStore};

/// Records per page when `limit` is not given.
pub const DEFAULT_LIMIT: usize = 100;
/// Most records per page.
pub const MAX_LIMIT: usize = 1_000;
/// Most records one request examines.
pub const MAX_EXAMINED: usize = 10_000;
/// Records read from the store at a time.
pub const READ_BATCH: usize = 500;

/// The query string of `GET /v1/audit`, as sent (every field checked by `AuditQuery`).
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RawAuditQuery {
    /// Only this list.
    pub list: Option<String>,
    /// Only this sandbox.
    pub sandbox: Option<String>,
    /// Only this dimension (needed with `value`).
    pub dimension: Option<String>,
    /// Only this entry: normalised for `dimension`, matched by its keyed fingerprint.
    pub value: Option<String>,
    /// Only this token name.
    pub who: Option<String>,
    /// `upsert`, `delete` or `import`.
    pub op: Option<String>,
    /// Unix ms, inclusive.
    pub since: Option<String>,
    /// Unix ms, inclusive.
    pub until: Option<String>,
    /// 1 to 1,000 (default 100).
    pub limit: Option<String>,
    /// A `next_cursor` as given.
    pub cursor: Option<String>,
}

/// The same filters in a JSON body (`POST /v1/audit`), so that a value searched for stays
/// out of URLs (and out of proxies' access logs): strings, or numbers for `since`, `until` and
/// `limit`.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditSearch {
    pub list: Option<String>,
    pub sandbox: Option<String>,
    pub dimension: Option<String>,
    pub value: Option<String>,
    pub who: Option<String>,
    pub op: Option<String>,
    #[schema(value_type = Option<i64>)]
    pub since: Option<serde_json::Value>,
    #[schema(value_type = Option<i64>)]
    pub until: Option<serde_json::Value>,
    #[schema(value_type = Option<u32>)]
    pub limit: Option<serde_json::Value>,
    pub cursor: Option<String>,
}

fn scalar(name: &str, v: Option<serde_json::Value>) -> Result<Option<String>, ValidationError> {
    match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Number(n)) => Ok(Some(n.to_string())),
        Some(serde_json::Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(filter_error(format!("{name}: expected a number"))),
    }
}

impl TryFrom<AuditSearch> for RawAuditQuery {
    type Error = ValidationError;

    fn try_from(b: AuditSearch) -> Result<Self, Self::Error> {
        Ok(Self {
            list: b.list,
            sandbox: b.sandbox,
            dimension: b.dimension,
            value: b.value,
            who: b.who,
            op: b.op,
            since: scalar("since", b.since)?,
            until: scalar("until", b.until)?,
            limit: scalar("limit", b.limit)?,
            cursor: b.cursor,
        })
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

    fn try_from(raw: RawAuditQuery) -> Result<Self, Self::Error> {
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
            (Some(v), Some(d)) => Some(Value::parse_entry(d, &v).map_err(|e| e.at("value"))?),
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
        let limit = match raw.limit {
            None => DEFAULT_LIMIT,
            Some(l) => l
                .parse::<usize>()
                .ok()
                .filter(|l| (1..=MAX_LIMIT).contains(l))
                .ok_or_else(|| filter_error(format!("limit: expected 1 to {MAX_LIMIT}")))?,
        };
        let cursor = raw
            .cursor
            .map(|c| {
                AuditPos::parse(&c)
                    .filter(|p| usize::from(p.part) <= AUDIT_PARTS)
                    .ok_or_else(|| {
                        ValidationError::new(
                            ErrorCode::InvalidCursor,
                            "cursor: not a cursor this service handed out (use next_cursor as given)",
                        )
                    })
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
}

impl AuditTrail {
    pub fn new(store: Arc<dyn EntryStore>, metrics: Arc<Metrics>, deadline: Duration) -> Self {
        Self {
            store: Instrumented::new(store, metrics),
            deadline,
        }
    }

    /// One page of records matching `q`, newest first.
    pub async fn page(&self, q: &AuditQuery) -> Result<AuditPage, ListsError> {
        let layout = self.store.layout();
        // The fingerprint the filtered value has in each (list, sandbox) met.
        let mut fingerprints: HashMap<(String, String), Option<String>> = HashMap::new();
        let mut records = Vec::new();
        let mut examined = 0usize;
        let mut position = q.cursor;
        let deadline = Deadline::after(self.deadline);
        loop {
            let want = READ_BATCH.min(MAX_EXAMINED - examined);
            let batch = self
                .store
                .call(StoreOp::AuditPage, deadline, |s| {
                    s.audit_page(position, want)
                })
                .await?;
            let ended = batch.len() < want;
            for (pos, r) in batch {
                examined += 1;
                position = Some(pos);
                if self.matches(q, &r, layout, &mut fingerprints) {
                    records.push(AuditEntry::of(&r));
                    if records.len() == q.limit {
                        return Ok(AuditPage {
                            records,
                            next_cursor: Some(pos.encode()),
                        });
                    }
                }
            }
            if ended {
                return Ok(AuditPage {
                    records,
                    next_cursor: None,
                });
            }
            if examined >= MAX_EXAMINED {
                return Ok(AuditPage {
                    records,
                    next_cursor: position.map(AuditPos::encode),
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
