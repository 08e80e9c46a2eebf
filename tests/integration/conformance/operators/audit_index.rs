//! Searches through the audit trail's index (by value, who and list) held to a brute-force
//! scan of the whole trail, over proptest-generated histories and searches across the trim of
//! a small cap; the index then holds exactly the records kept.

use std::time::Duration;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

use namelist::audit_trail::{AuditEntry, AuditTrail};
use namelist::domain::{Dimension, Expiry, Value};
use namelist::store::{EntryStore, StoreBase};

use crate::conformance::{Capped, Harness, with_audit_cap};

use super::{entry_ref, list, new, read_all};

/// One upsert or delete of a generated history: indexes into `WHO`, `LISTS`, `SANDBOXES`
/// and the `uid` values `v0`..`v7`.
#[derive(Debug, Clone)]
struct Write {
    who: usize,
    list: usize,
    sandbox: usize,
    values: Vec<usize>,
    delete: bool,
}

/// Actors, among them two whose names are prefixes of each other's escaped index term, one
/// with the bytes the index escapes.
const WHO: [&str; 4] = ["alice", "n", "n\u{0}ul\u{1}l", "bob"];
const LISTS: [&str; 3] = ["black", "grey", "white"];
const SANDBOXES: [&str; 2] = ["loan", "pay"];

fn history() -> impl Strategy<Value = Vec<Write>> {
    prop::collection::vec(
        (
            0..WHO.len(),
            0..LISTS.len(),
            0..SANDBOXES.len(),
            prop::collection::vec(0..8usize, 1..30),
            prop::bool::weighted(0.25),
        )
            .prop_map(|(who, list, sandbox, values, delete)| Write {
                who,
                list,
                sandbox,
                values,
                delete,
            }),
        25..45,
    )
}

/// A search: each filter absent or an index into its table; `since` and `until` index the
/// sorted times of the trail (in that order when both are given: `Search::bounds`).
#[derive(Debug, Clone)]
struct Search {
    value: Option<usize>,
    who: Option<usize>,
    list: Option<usize>,
    sandbox: Option<usize>,
    op: Option<bool>,
    since: Option<prop::sample::Index>,
    until: Option<prop::sample::Index>,
    limit: usize,
}

impl Search {
    /// `since` and `until` as times of the trail, the earlier first.
    fn bounds(&self, times: &[i64]) -> (Option<i64>, Option<i64>) {
        let since = self.since.map(|i| *i.get(times));
        let until = self.until.map(|i| *i.get(times));
        match (since, until) {
            (Some(s), Some(u)) if s > u => (Some(u), Some(s)),
            bounds => bounds,
        }
    }
}

fn search() -> impl Strategy<Value = Search> {
    (
        (
            prop::option::weighted(0.4, 0..9usize),
            prop::option::weighted(0.4, 0..WHO.len()),
            prop::option::weighted(0.4, 0..LISTS.len()),
            prop::option::weighted(0.2, 0..SANDBOXES.len()),
        ),
        (
            prop::option::weighted(0.2, any::<bool>()),
            prop::option::weighted(0.2, any::<prop::sample::Index>()),
            prop::option::weighted(0.2, any::<prop::sample::Index>()),
            1..40usize,
        ),
    )
        .prop_map(
            |((value, who, list, sandbox), (op, since, until, limit))| Search {
                value,
                who,
                list,
                sandbox,
                op,
                since,
                until,
                limit,
            },
        )
}

/// Draws one value of `strategy` (a proptest generator driven by hand: the cases are async).
fn draw<T: std::fmt::Debug>(runner: &mut TestRunner, strategy: &impl Strategy<Value = T>) -> T {
    strategy.new_tree(runner).unwrap().current()
}

/// The brute-force oracle: `search` applied by hand to the whole trail (scanned, newest
/// first). A value matches by the fingerprint it has in each record's list and sandbox.
fn oracle(
    all: &[AuditEntry],
    s: &Search,
    times: &[i64],
    layout: &namelist::store::Layout,
) -> Vec<AuditEntry> {
    let (since, until) = s.bounds(times);
    all.iter()
        .filter(|r| {
            let is = |got: &Option<String>, want: Option<&str>| {
                want.is_none_or(|w| got.as_deref() == Some(w))
            };
            let value_ok = s.value.is_none_or(|v| {
                let (Some(l), Some(sb)) = (&r.list, &r.sandbox) else {
                    return false;
                };
                let key = layout.entry_key(
                    &list(l),
                    &Dimension::Uid,
                    &sb.parse().unwrap(),
                    &Value::Text(format!("v{v}")),
                );
                r.dimension.as_deref() == Some("uid")
                    && r.fingerprint.as_deref() == Some(key.fingerprint().as_str())
            });
            is(&r.who, s.who.map(|w| WHO[w]))
                && is(&r.list, s.list.map(|l| LISTS[l]))
                && is(&r.sandbox, s.sandbox.map(|b| SANDBOXES[b]))
                && is(&r.op, s.op.map(|d| if d { "delete" } else { "upsert" }))
                && since.is_none_or(|t| r.at.is_some_and(|a| a >= t))
                && until.is_none_or(|t| r.at.is_some_and(|a| a <= t))
                && value_ok
        })
        .cloned()
        .collect()
}

/// Every index term's entries, and the records kept: (index entries, records) per stream on
/// Redis (each stream's `ZCARD` and `XLEN`), one pair for the embedded store.
async fn index_sizes(c: &Capped) -> Vec<(u64, u64)> {
    if let Some(m) = &c.memory {
        let records = m.audit_tail(usize::MAX).await.unwrap().len() as u64;
        return vec![(m.audit_index_len() as u64, records)];
    }
    let redis = c.redis.as_ref().expect("a Redis store");
    let layout = redis.layout();
    let keys = layout.audit_keys();
    let mut cmds = Vec::new();
    for (i, stream) in keys.iter().enumerate() {
        let (ix, _) = layout.audit_index_keys(i);
        let mut zcard = redis::cmd("ZCARD");
        zcard.arg(&ix);
        let mut xlen = redis::cmd("XLEN");
        xlen.arg(stream);
        cmds.push((ix.into_bytes(), zcard));
        cmds.push((stream.clone().into_bytes(), xlen));
    }
    let replies = redis.connection().run_all(cmds).await.unwrap();
    replies
        .chunks(2)
        .map(|pair| {
            let n = |v: &redis::Value| redis::from_redis_value_ref::<u64>(v).unwrap();
            (n(&pair[0]), n(&pair[1]))
        })
        .collect()
}

/// Searches by value, who and list (with paging, `since`/`until` and the other filters)
/// through the index answer exactly what a scan of the whole trail, filtered by hand, does:
/// generated histories of upserts and deletes by actors whose names the index must keep
/// apart, on a trail capped small enough that most records were trimmed away. And the index
/// holds one entry per term of every record kept, and nothing else, after all those trims.
pub(super) async fn audit_index_finds_what_a_scan_finds(h: &Harness) {
    // 200 records: on Redis 4 a part (64 parts), trimmed on nearly every write.
    let cap = 200;
    let mut runner = TestRunner::deterministic();
    for round in 0..3 {
        let c = with_audit_cap(h, cap).await;
        let trail = AuditTrail::new(c.store.clone(), c.metrics.clone(), Duration::from_secs(5));
        let writes = draw(&mut runner, &history());
        let mut written = 0;
        for w in &writes {
            let l = list(LISTS[w.list]);
            if w.delete {
                let refs = w
                    .values
                    .iter()
                    .map(|v| entry_ref("uid", &format!("v{v}"), SANDBOXES[w.sandbox]))
                    .collect();
                c.lists.remove(&l, refs, WHO[w.who]).await.unwrap();
            } else {
                let batch = w
                    .values
                    .iter()
                    .map(|v| new("uid", &format!("v{v}"), SANDBOXES[w.sandbox], Expiry::Never))
                    .collect();
                c.lists.upsert(&l, batch, WHO[w.who]).await.unwrap();
            }
            written += w.values.len();
        }
        let all = read_all(&trail, &[("limit", "1000")]).await;
        // Redis caps each of its 64 parts at `ceil(cap / 64)`.
        let most = if c.redis.is_some() {
            64 * cap.div_ceil(64)
        } else {
            cap
        };
        assert!(
            written > all.len() + 100 && all.len() <= most,
            "round {round}: {written} written, {} kept",
            all.len()
        );
        let mut times: Vec<i64> = all.iter().filter_map(|r| r.at).collect();
        times.sort_unstable();
        let layout = c.store.layout();
        let mut found = 0;
        for case in 0..40 {
            let s = draw(&mut runner, &search());
            let want = oracle(&all, &s, &times, layout);
            let value = s.value.map(|v| format!("v{v}"));
            let (since, until) = s.bounds(&times);
            let (since, until) = (since.map(|t| t.to_string()), until.map(|t| t.to_string()));
            let limit = s.limit.to_string();
            let mut pairs: Vec<(&str, &str)> = vec![("limit", limit.as_str())];
            if let Some(v) = &value {
                pairs.extend([("dimension", "uid"), ("value", v.as_str())]);
            }
            for (k, v) in [
                ("who", s.who.map(|w| WHO[w])),
                ("list", s.list.map(|l| LISTS[l])),
                ("sandbox", s.sandbox.map(|b| SANDBOXES[b])),
                ("op", s.op.map(|d| if d { "delete" } else { "upsert" })),
                ("since", since.as_deref()),
                ("until", until.as_deref()),
            ] {
                if let Some(v) = v {
                    pairs.push((k, v));
                }
            }
            let got = read_all(&trail, &pairs).await;
            assert_eq!(
                got,
                want,
                "round {round}, search {case}: {pairs:?} ({} kept)",
                all.len()
            );
            found += got.len();
        }
        assert!(found > 0, "round {round}: the searches found something");

        // One index entry per term of every record kept (each has a vfp, a who and a list),
        // nothing left of the records trimmed away.
        let sizes = index_sizes(&c).await;
        let kept: u64 = sizes.iter().map(|(_, n)| n).sum();
        assert_eq!(kept, all.len() as u64, "round {round}");
        for (i, (entries, records)) in sizes.iter().enumerate() {
            assert_eq!(
                *entries,
                3 * records,
                "round {round}, stream {i}: {entries} index entries for {records} records"
            );
        }
        if c.redis.is_some() {
            let per_part = cap.div_ceil(64) as u64;
            assert!(
                sizes.iter().all(|(_, n)| *n <= per_part),
                "round {round}: a part past its cap of {per_part}: {sizes:?}"
            );
        }
    }
}
