//! The lists' counts: the keys that hold each (list, sandbox) pair's approximate entry count
//! and last change, their members, and the range a page of them reads.
//!
//! # The lists' counts
//! `GET /v1/lists` pages through the (list, sandbox) pairs holding entries, each with an
//! approximate entry count and its last change, kept on write (`EntryStore::count_changes`,
//! never by scanning buckets). All four keys share the hash tag `{<prefix>}` (a prefix holds
//! no braces), so one script updates them atomically, on one slot of a cluster:
//!
//! | key | Redis | content |
//! |---|---|---|
//! | `<prefix>lists{<prefix>}:n` | hash | `<list> 00 <sandbox>` → count, always > 0 |
//! | `<prefix>lists{<prefix>}:t` | hash | `<list> 00 <sandbox>` → last change, Unix ms |
//! | `<prefix>lists{<prefix>}:l` | sorted set, every score 0 | `<list> 00 <sandbox>`: the index by list |
//! | `<prefix>lists{<prefix>}:s` | sorted set, every score 0 | `<sandbox> 00 <list>`: the index by sandbox |
//!
//! `00` is one NUL byte. It sorts below every byte of both alphabets, so the byte order of
//! the index by list (what `ZRANGE … BYLEX` follows) is exactly (list, sandbox) order, a
//! shorter name first (`a` before `a-b`), and that of the index by sandbox (sandbox, list).
//!
//! A change is one script call (`COUNT_CHANGES`) per [`COUNT_CHUNK`] pairs, all in one round
//! trip: per pair, `HINCRBY` the count; at 0 or below the pair is deleted from all four keys;
//! otherwise its time goes up to the change's (never down) and it is added (`ZADD`, a no-op
//! when present) to both indexes. So a pair is in all four keys or in none, and only while
//! its count is positive: a list emptied by deletes leaves nothing behind.
//!
//! A page (`COUNTS_PAGE`, a read-only script) is one `ZRANGE <index> <min> <max> BYLEX LIMIT
//! 0 <limit + 1>` and one `HMGET` of the page's pairs in each hash: O(log n + limit) whatever
//! the number n of pairs, and whatever the filter ([`Layout::count_range`]):
//!
//! | filter | index | min | max |
//! |---|---|---|---|
//! | none | by list | `-` | `+` |
//! | `list` = L | by list | `[L 00` | `(L 01` |
//! | `list` = L, `sandbox` = S | by list | `[L 00 S` | `[L 00 S` |
//! | `sandbox` = S | by sandbox | `[S 00` | `(S 01` |
//!
//! A cursor `(al, as)` (pairs strictly after it) raises the index by list's min to
//! `(al 00 as` when that is not below it, and the index by sandbox's to `[S 00 al` when
//! S > as, else `(S 00 al` (a min above the max reads nothing). The `limit + 1`-th pair
//! only says that there is more. The names of the lists of one sandbox
//! (`lookup_everywhere`) are the same page of the index by sandbox.
//!
//! Cost per pair, `MEMORY USAGE … SAMPLES 0` over 20,000 pairs of 9–12-byte members (every
//! key past its listpack limit; `tests/integration/list_counts.rs` prints it): 61 B in `:n`, 69 B in
//! `:t`, 113 B in each index, 356 B in all; a member's bytes count about four times. A
//! handful of pairs (listpacks) cost 1,120 B for 10. Nothing bounds the number of pairs but
//! the entries written (a pair is a (list, sandbox) holding at least one): the bound is on
//! what a request reads, a page of at most 1,000 pairs.
//!
//! On a cluster the counts live on the one primary of that slot: while it is down, count
//! changes fail (logged and counted in `namelist_list_count_errors_total`; the write they
//! follow stands) and `GET /v1/lists` answers 503.
//!
//! Builds before this layout kept the counts in 64 hashes `<prefix>lists:{<tag>}` (the audit
//! parts' tags; `Layout::old_counts_key`), a change in any part, a read summing all of them.
//! Every start of the service folds any such part into the keys above
//! (`RedisStore::fold_old_counts`; the operator tools do not, so that the audit stays read
//! only), [`COUNT_CHUNK`] fields at a time: a script on the part's slot takes a chunk's pairs (reads and deletes `f` and
//! `f|t`, atomically), then `COUNT_CHANGES` adds them (count summed, latest time kept); a part
//! left empty no longer exists. Each pair is taken by one opener only, so instances starting
//! together count it once; a process killed between a take and its add loses that chunk's
//! counts (at most [`COUNT_CHUNK`] pairs, undercounted). Why take then add, and not add then
//! delete the part: the parts and the counts are on different slots, so neither order is
//! atomic, and the instances of a rolling deploy start together: two that each added a part
//! before either deleted it would count it twice, every time, where the take loses counts
//! only to a crash inside one chunk. A field that is not a pair this
//! layout wrote is left where it is. During a rolling deploy the old instances keep adding
//! to the parts (and read only the parts: they undercount until they are replaced); the next
//! start of a new instance folds what they added.

use super::audit::{AUDIT_PARTS, audit_tags};
use super::{Layout, Scope};
use crate::domain::{ListName, Sandbox};

/// Which scopes' counts to read (`EntryStore::list_counts`): those of `list` and of
/// `sandbox` when given, strictly after `after` in (list, sandbox) order (names compared byte
/// by byte), at most `limit` of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountsQuery {
    pub list: Option<ListName>,
    pub sandbox: Option<Sandbox>,
    pub after: Option<Scope>,
    pub limit: usize,
}

impl CountsQuery {
    /// The first `limit` scopes, unfiltered.
    pub fn first(limit: usize) -> Self {
        Self {
            list: None,
            sandbox: None,
            after: None,
            limit,
        }
    }

    /// Whether a scope passes the filters and comes after `after` (the oracle every backend's
    /// range reads must agree with).
    pub fn selects(&self, list: &str, sandbox: &str) -> bool {
        self.list.as_ref().is_none_or(|l| l.as_str() == list)
            && self.sandbox.as_ref().is_none_or(|s| s.as_str() == sandbox)
            && self
                .after
                .as_ref()
                .is_none_or(|a| (list, sandbox) > (a.list.as_str(), a.sandbox.as_str()))
    }
}

/// Most pairs of the lists' counts one script call changes or takes (see the module docs):
/// each call holds Redis for a bounded time.
pub const COUNT_CHUNK: usize = 1_000;

impl Layout {
    /// Part `part` of the lists' counts as builds before the paged counts kept them
    /// (`<prefix>lists:{<tag>}`, a hash of `<list>|<sandbox>` → count and
    /// `<list>|<sandbox>|t` → last change, with the audit parts' tags): never written, only
    /// folded into the keys of `counts_keys` when a store opens (see the module docs).
    pub fn old_counts_key(&self, part: usize) -> String {
        format!(
            "{}lists:{{{}}}",
            self.prefix,
            audit_tags()[part % AUDIT_PARTS]
        )
    }

    /// The lists' counts (see the module docs), all on the hash tag `{<prefix>}`: the counts,
    /// the last changes, the index by list and the index by sandbox, in that order.
    pub fn counts_keys(&self) -> [String; 4] {
        let base = format!("{p}lists{{{p}}}", p = self.prefix);
        [
            format!("{base}:n"),
            format!("{base}:t"),
            format!("{base}:l"),
            format!("{base}:s"),
        ]
    }

    /// A pair's field in the count hashes and its member of the index by list:
    /// `<list> 00 <sandbox>`. With the arguments swapped, its member of the index by sandbox.
    pub fn count_member(first: &str, second: &str) -> Vec<u8> {
        let mut m = Vec::with_capacity(first.len() + 1 + second.len());
        m.extend_from_slice(first.as_bytes());
        m.push(0);
        m.extend_from_slice(second.as_bytes());
        m
    }

    /// The two names of a count member (in the member's order), if it is one.
    pub fn parse_count_member(member: &[u8]) -> Option<(String, String)> {
        let at = member.iter().position(|&b| b == 0)?;
        let first = std::str::from_utf8(&member[..at]).ok()?;
        let second = std::str::from_utf8(&member[at + 1..]).ok()?;
        Some((first.to_owned(), second.to_owned()))
    }

    /// Which index a page of counts reads and its `ZRANGE … BYLEX` bounds (module docs):
    /// the members in `[min, max]` are exactly the pairs `query` selects, in its order.
    pub fn count_range(query: &CountsQuery) -> CountRange {
        let incl = |m: Vec<u8>| [&b"["[..], &m].concat();
        let excl = |m: Vec<u8>| [&b"("[..], &m].concat();
        if let (None, Some(sandbox)) = (&query.list, &query.sandbox) {
            // The lists of one sandbox, from the index by sandbox: `(l, S) > (al, as)` is
            // `l > al`, or `l = al` when `S > as`.
            let s = sandbox.as_str();
            let min = match &query.after {
                None => incl(Self::count_member(s, "")),
                Some(Scope {
                    list: al,
                    sandbox: r#as,
                }) if s > r#as.as_str() => incl(Self::count_member(s, al.as_str())),
                Some(Scope { list: al, .. }) => excl(Self::count_member(s, al.as_str())),
            };
            return CountRange {
                by_sandbox: true,
                min,
                max: excl([s.as_bytes(), &[1]].concat()),
            };
        }
        // From the index by list: everything, one list's sandboxes, or one pair.
        let (from, max) = match (&query.list, &query.sandbox) {
            (Some(l), Some(s)) => {
                let m = Self::count_member(l.as_str(), s.as_str());
                (Some(m.clone()), incl(m))
            }
            (Some(l), None) => (
                Some(Self::count_member(l.as_str(), "")),
                excl([l.as_str().as_bytes(), &[1]].concat()),
            ),
            _ => (None, b"+".to_vec()),
        };
        let after = query
            .after
            .as_ref()
            .map(|a| Self::count_member(a.list.as_str(), a.sandbox.as_str()));
        let min = match (from, after) {
            (Some(from), Some(after)) if after >= from => excl(after),
            (Some(from), _) => incl(from),
            (None, Some(after)) => excl(after),
            (None, None) => b"-".to_vec(),
        };
        CountRange {
            by_sandbox: false,
            min,
            max,
        }
    }
}

/// The index a page of counts ranges over and its `BYLEX` bounds (`Layout::count_range`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountRange {
    /// The index by sandbox (members `<sandbox> 00 <list>`), else the index by list.
    pub by_sandbox: bool,
    /// `-`, or `[`/`(` and a member (inclusive, exclusive).
    pub min: Vec<u8>,
    /// `+`, or `[`/`(` and a member.
    pub max: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::fingerprint::Hashing;
    use crate::store::layout::key_slot;
    use proptest::prelude::*;

    /// Redis's `ZRANGE … BYLEX` over equal scores: `-`, `+`, `[m` (inclusive), `(m`
    /// (exclusive), bytes compared as `memcmp` does.
    fn bylex(
        members: &std::collections::BTreeSet<Vec<u8>>,
        min: &[u8],
        max: &[u8],
    ) -> Vec<Vec<u8>> {
        let above = |m: &[u8]| match min.split_first() {
            Some((b'[', x)) => m >= x,
            Some((b'(', x)) => m > x,
            _ => min == b"-",
        };
        let below = |m: &[u8]| match max.split_first() {
            Some((b'[', x)) => m <= x,
            Some((b'(', x)) => m < x,
            _ => max == b"+",
        };
        members
            .iter()
            .filter(|m| above(m) && below(m))
            .cloned()
            .collect()
    }

    fn name(alphabet: &'static str) -> impl Strategy<Value = String> {
        proptest::collection::vec(proptest::sample::select(alphabet.as_bytes().to_vec()), 1..4)
            .prop_map(|b| String::from_utf8(b).unwrap())
    }

    proptest! {
        /// The range a page reads holds exactly the pairs the query selects, in (list,
        /// sandbox) order, for any filter and cursor: names drawn from the alphabets' edges
        /// (`-` `0` `_` and letters), so prefixes and "shorter first" are common.
        #[test]
        fn count_ranges_select_what_the_query_does(
            pairs in proptest::collection::btree_set((name("-0_ab"), name("-0_AZab")), 0..40),
            list in proptest::option::of(name("-0_ab")),
            sandbox in proptest::option::of(name("-0_AZab")),
            after in proptest::option::of((name("-0_ab"), name("-0_AZab"))),
        ) {
            let query = CountsQuery {
                list: list.map(|l| l.parse().unwrap()),
                sandbox: sandbox.map(|s| s.parse().unwrap()),
                after: after.map(|(l, s)| Scope {
                    list: l.parse().unwrap(),
                    sandbox: s.parse().unwrap(),
                }),
                limit: usize::MAX,
            };
            let by_list: std::collections::BTreeSet<Vec<u8>> =
                pairs.iter().map(|(l, s)| Layout::count_member(l, s)).collect();
            let by_sandbox: std::collections::BTreeSet<Vec<u8>> =
                pairs.iter().map(|(l, s)| Layout::count_member(s, l)).collect();
            let range = Layout::count_range(&query);
            let index = if range.by_sandbox { &by_sandbox } else { &by_list };
            let got: Vec<(String, String)> = bylex(index, &range.min, &range.max)
                .iter()
                .map(|m| {
                    let (a, b) = Layout::parse_count_member(m).unwrap();
                    if range.by_sandbox { (b, a) } else { (a, b) }
                })
                .collect();
            let want: Vec<(String, String)> =
                pairs.iter().filter(|(l, s)| query.selects(l, s)).cloned().collect();
            prop_assert_eq!(got, want, "{:?} read {:?}", query, range);
        }
    }

    #[test]
    fn count_keys_share_one_slot_and_start_with_the_prefix() {
        let l = Layout::new("nl:", 10, Hashing::Unkeyed);
        let keys = l.counts_keys();
        assert_eq!(keys[0], "nl:lists{nl:}:n");
        assert_eq!(keys[3], "nl:lists{nl:}:s");
        for k in &keys {
            assert!(k.starts_with("nl:"));
            assert_eq!(key_slot(k.as_bytes()), key_slot(b"nl:"), "{k}");
        }
        assert!(!keys.contains(&l.old_counts_key(0)));
        assert_eq!(
            l.old_counts_key(0),
            "nl:lists:{10}",
            "the older layout's names, pinned"
        );
    }
}
