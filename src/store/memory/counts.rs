//! The lists' counts on the embedded store: each (list, sandbox) pair's approximate entry
//! count and last change, and the pages `EntryStore::list_counts` reads.
//!
//! The lists' counts are kept in the two orders of the Redis layout's indexes (a `BTreeMap`
//! by (list, sandbox), a `BTreeSet` by (sandbox, list)), so a page is a range read,
//! O(log n + page), and a pair at 0 or below is removed from both.

use std::collections::BTreeMap;

use super::persist::{count_change, encode};
use super::{NO_SCOPE, State};
use crate::store::durable::{Change, Table};
use crate::store::{CountsPage, CountsQuery, ListCount, Scope, StoreResult};

impl State {
    /// The id of `(list, sandbox)`, made (and its row added to `rows` when `durable`) if new.
    pub(super) fn scope_id(
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
    pub(super) fn add_count(
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
    pub(super) fn add_counts(
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

/// A page of the counts `st` holds (`EntryStore::list_counts`).
pub(super) fn page(st: &State, query: &CountsQuery) -> StoreResult<CountsPage> {
    use std::ops::Bound::{Excluded, Included, Unbounded};
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
