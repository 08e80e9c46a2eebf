//! The operators' reads, each bounded whatever the keyspace holds: one entry from the store
//! itself (`lookup`), one page of the list counts (`summaries`, its query and cursor), and one
//! identity on every list of a sandbox (`lookup_everywhere`, a check per `MAX_CHECK_LISTS`
//! lists). Their hits are not counted as the risk engine's.

use serde::Serialize;

use super::check::{CheckOutcome, CheckQuery, RawCheck, Staleness};
use super::{EntryRef, ListsError, MAX_CHECK_LISTS, MAX_LOOKUP_LISTS, NameLists};
use crate::domain::{
    Dimension, Expiry, ListName, Sandbox, ValidationError, Value, invalid_cursor, now_ms,
    page_limit, page_query,
};
use crate::metrics::StoreOp;
use crate::store::{CountsQuery, Deadline, Scope, code_is_live};

/// One (list, sandbox) of `GET /v1/lists`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ListSummary {
    pub list: String,
    pub sandbox: String,
    /// Approximate: entries written minus entries deleted (docs/behaviour.md, *Operators' reads*).
    pub entries: i64,
    /// Unix ms of the last upsert or delete in this scope.
    pub last_change: i64,
    /// Hits this instance answered since it started.
    pub hits: u64,
}

page_query! {
    /// The query string of `GET /v1/lists`, as sent: `list`, `sandbox`, `limit` and `cursor`
    /// (every field checked by `ListsQuery`; an empty one is as good as absent).
    pub struct RawListsQuery {}
}

/// A checked `GET /v1/lists` query: the filters, the page size, and the pair the page
/// starts after (from the cursor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListsQuery {
    list: Option<ListName>,
    sandbox: Option<Sandbox>,
    limit: usize,
    after: Option<Scope>,
}

/// The cursor of the page after the pair `(list, sandbox)`: `<list>:<sandbox>`. Neither
/// alphabet holds `:`, so it reads back unambiguously; a caller who edits it only moves
/// where their own page starts.
fn cursor_after(list: &str, sandbox: &str) -> String {
    format!("{list}:{sandbox}")
}

fn parse_cursor(cursor: &str) -> Option<Scope> {
    let (list, sandbox) = cursor.split_once(':')?;
    scope(list, sandbox)
}

/// The scope of a list and a sandbox as the store gives them back.
fn scope(list: &str, sandbox: &str) -> Option<Scope> {
    Some(Scope {
        list: list.parse().ok()?,
        sandbox: sandbox.parse().ok()?,
    })
}

impl TryFrom<RawListsQuery> for ListsQuery {
    type Error = ValidationError;

    /// Errors name the parameter: `invalid_list`, `invalid_sandbox`, `invalid_filter` (the
    /// limit), `invalid_cursor`.
    fn try_from(raw: RawListsQuery) -> Result<Self, Self::Error> {
        let given = |v: Option<String>| v.filter(|v| !v.is_empty());
        let list = given(raw.list)
            .map(ListName::try_from)
            .transpose()
            .map_err(|e| e.at("list"))?;
        let sandbox = given(raw.sandbox)
            .map(Sandbox::try_from)
            .transpose()
            .map_err(|e| e.at("sandbox"))?;
        let limit = page_limit(given(raw.limit))?;
        let after = given(raw.cursor)
            .map(|c| parse_cursor(&c).ok_or_else(invalid_cursor))
            .transpose()?;
        Ok(Self {
            list,
            sandbox,
            limit,
            after,
        })
    }
}

/// A page of `GET /v1/lists`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ListsPage {
    /// In (list, sandbox) order.
    pub lists: Vec<ListSummary>,
    /// The `cursor` of the next page; `null` after the last one.
    pub next_cursor: Option<String>,
}

/// The answer of a lookup on every list of a sandbox (`NameLists::lookup_everywhere`): a
/// check's, and `truncated: true` when the sandbox has more lists than it read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct EverywhereOutcome {
    #[serde(flatten)]
    pub check: CheckOutcome,
    /// Only when true (no key otherwise): the sandbox has more than 1,000 lists holding
    /// entries and only the first 1,000 by name were looked at.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    #[schema(required = false)]
    pub truncated: bool,
}

impl NameLists {
    /// Looks one entry up in the store itself (no cache): the operator's view. `Some(expiry)`
    /// when listed.
    pub async fn lookup(
        &self,
        list: &ListName,
        entry: &EntryRef,
    ) -> Result<Option<Expiry>, ListsError> {
        let key =
            self.store
                .layout()
                .entry_key(list, &entry.dimension, &entry.sandbox, &entry.value);
        let deadline = Deadline::after(self.settings.operator_deadline);
        let keys = [key];
        let codes = self
            .store
            .call(StoreOp::Get, deadline, |s| s.get_many(&keys))
            .await?;
        match codes.first().copied().flatten() {
            Some(code) if code_is_live(code, now_ms()) => Ok(Some(Expiry::from_code(code))),
            Some(code) => {
                self.reclaim(key, code, || Scope::new(list, &entry.sandbox));
                Ok(None)
            }
            None => Ok(None),
        }
    }

    /// One page of the (list, sandbox) pairs holding entries, by list then sandbox, with
    /// their approximate counts (see `EntryStore::list_counts`) and the hits this instance
    /// answered. Cost: the store's page, O(log n + limit), and one hash-map lookup per pair.
    pub async fn summaries(&self, q: &ListsQuery) -> Result<ListsPage, ListsError> {
        let deadline = Deadline::after(self.settings.operator_deadline);
        let query = CountsQuery {
            list: q.list.clone(),
            sandbox: q.sandbox.clone(),
            after: q.after.clone(),
            limit: q.limit,
        };
        let page = self
            .store
            .call(StoreOp::ListCounts, deadline, |s| s.list_counts(&query))
            .await?;
        let next_cursor = page
            .more
            .then(|| page.counts.last())
            .flatten()
            .map(|c| cursor_after(&c.list, &c.sandbox));
        let hits = self.hits.lock().unwrap_or_else(|e| e.into_inner());
        let lists = page
            .counts
            .into_iter()
            .map(|c| {
                let hits = scope(&c.list, &c.sandbox)
                    .and_then(|s| hits.get(&s).copied())
                    .unwrap_or(0);
                ListSummary {
                    list: c.list,
                    sandbox: c.sandbox,
                    entries: c.entries,
                    last_change: c.last_change_ms,
                    hits,
                }
            })
            .collect();
        Ok(ListsPage { lists, next_cursor })
    }

    /// One identity on every list of `sandbox` that holds entries (the first
    /// `MAX_LOOKUP_LISTS` by name: past them the answer says `truncated`), exactly as a check
    /// would find it (ranges, segments and domains included), in chunks of
    /// `MAX_CHECK_LISTS` lists. Reads only that sandbox's lists (the store's index by
    /// sandbox), never the other pairs. An operator's read: its hits are not counted as the
    /// risk engine's.
    pub async fn lookup_everywhere(
        &self,
        dimension: String,
        value: String,
        sandbox: Sandbox,
    ) -> Result<EverywhereOutcome, ListsError> {
        let deadline = Deadline::after(self.settings.operator_deadline);
        let query = CountsQuery {
            list: None,
            sandbox: Some(sandbox.clone()),
            after: None,
            limit: MAX_LOOKUP_LISTS,
        };
        let page = self
            .store
            .call(StoreOp::ListCounts, deadline, |s| s.list_counts(&query))
            .await?;
        let lists: Vec<String> = page.counts.into_iter().map(|c| c.list).collect();
        let mut all = EverywhereOutcome {
            check: CheckOutcome {
                hits: Vec::new(),
                degraded: false,
                stale: None,
                unanswered: Vec::new(),
                decision: None,
                invalid: Vec::new(),
            },
            truncated: page.more,
        };
        if lists.is_empty() {
            // Still a 400 for a bad dimension or value.
            let d = Dimension::try_from(dimension)?;
            Value::parse_check_with(&d, &value, self.norm(&sandbox))?;
            return Ok(all);
        }
        for chunk in lists.chunks(MAX_CHECK_LISTS) {
            let q = CheckQuery::try_from(RawCheck {
                sandbox: Some(sandbox.to_string()),
                lists: chunk.to_vec(),
                subjects: vec![(dimension.clone(), vec![value.clone()])],
                strict: true,
                rules: self.rules(),
            })?;
            let part = self.answer(&q, self.settings.operator_deadline).await?;
            let all = &mut all.check;
            all.hits.extend(part.hits);
            all.degraded |= part.degraded;
            for u in part.unanswered {
                if !all.unanswered.contains(&u) {
                    all.unanswered.push(u);
                }
            }
            if let Some(s) = part.stale {
                all.stale = Some(match all.stale {
                    Some(a) => Staleness {
                        stale_ms: a.stale_ms.max(s.stale_ms),
                    },
                    None => s,
                });
            }
        }
        Ok(all)
    }
}
