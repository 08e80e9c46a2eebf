//! The lists' counts: kept exactly through writes, refreshes and deletes, paged through every
//! filter once in (list, sandbox) order (the store's own pages held to an oracle), and a pair
//! at zero gone from every page.

use std::collections::BTreeMap;
use std::time::Duration;

use namelist::domain::{Expiry, now_ms};
use namelist::lists::{CheckQuery, ListSummary, ListsQuery, RawCheck, RawListsQuery};
use namelist::store::CountsQuery;
use namelist::store::Scope;

use crate::conformance::Harness;

use super::{change, entry_ref, list, new};

fn summary<'a>(all: &'a [ListSummary], l: &str, sb: &str) -> Option<&'a ListSummary> {
    all.iter().find(|s| s.list == l && s.sandbox == sb)
}

/// Every pair, through the service's pages (the cursor handed back as given).
async fn counts(h: &Harness) -> Vec<ListSummary> {
    pages(h, RawListsQuery::default()).await
}

/// Every page of `raw` (its cursor replaced by each `next_cursor` in turn), concatenated.
async fn pages(h: &Harness, raw: RawListsQuery) -> Vec<ListSummary> {
    let mut out = Vec::new();
    let mut cursor = raw.cursor.clone();
    for _ in 0..100_000 {
        let q = ListsQuery::try_from(RawListsQuery {
            list: raw.list.clone(),
            sandbox: raw.sandbox.clone(),
            limit: raw.limit.clone(),
            cursor: cursor.clone(),
        })
        .unwrap();
        let page = h.lists.summaries(&q).await.unwrap();
        out.extend(page.lists);
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return out,
        }
    }
    panic!("the cursor never ended");
}

pub(super) async fn list_counts_follow_writes_and_deletes(h: &Harness) {
    let t0 = now_ms();
    let black = list("black");
    let batch = vec![
        new("uid", "a", "loan", Expiry::Never),
        new("uid", "b", "loan", Expiry::Never),
        new("ip", "10.1.2.0/24", "loan", Expiry::Never),
        new("uid", "a", "pay", Expiry::Never),
        // The same entry twice in one batch is one entry.
        new("uid", "b", "loan", Expiry::Never),
    ];
    h.lists.upsert(&black, batch, "t").await.unwrap();
    let all = counts(h).await;
    assert_eq!(
        summary(&all, "black", "loan").unwrap().entries,
        3,
        "{all:?}"
    );
    assert_eq!(summary(&all, "black", "pay").unwrap().entries, 1, "{all:?}");
    assert!(summary(&all, "black", "loan").unwrap().last_change >= t0);
    assert!(
        summary(&all, "grey", "loan").is_none(),
        "no entries, no row"
    );

    // A refresh is a change but not a new entry.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let before = summary(&all, "black", "loan").unwrap().last_change;
    h.lists
        .upsert(&black, vec![new("uid", "a", "loan", Expiry::Never)], "t")
        .await
        .unwrap();
    let all = counts(h).await;
    let loan = summary(&all, "black", "loan").unwrap();
    assert_eq!(loan.entries, 3, "a refresh does not count twice");
    assert!(loan.last_change > before);

    // Deletes subtract what was there, and nothing for what was not.
    let removed = h
        .lists
        .remove(
            &black,
            vec![
                entry_ref("uid", "a", "loan"),
                entry_ref("uid", "never-listed", "loan"),
                entry_ref("uid", "a", "pay"),
            ],
            "t",
        )
        .await
        .unwrap();
    assert_eq!(removed, 2);
    let all = counts(h).await;
    assert_eq!(
        summary(&all, "black", "loan").unwrap().entries,
        2,
        "{all:?}"
    );
    assert!(
        summary(&all, "black", "pay").is_none(),
        "a scope with no entries left is not listed: {all:?}"
    );

    // Hits this instance answered, per (list, sandbox).
    let q = CheckQuery::try_from(RawCheck {
        sandbox: Some("loan".into()),
        lists: vec!["black".into()],
        subjects: vec![
            ("uid".into(), vec!["b".into()]),
            ("ip".into(), vec!["10.1.2.9".into()]),
        ],
        ..RawCheck::default()
    })
    .unwrap();
    assert_eq!(h.lists.check(&q).await.unwrap().hits.len(), 2);
    let all = counts(h).await;
    assert_eq!(summary(&all, "black", "loan").unwrap().hits, 2);
    let text = h.metrics.render();
    assert!(
        text.contains(r#"namelist_list_hits_total{dimension="uid",list="black"} 1"#)
            && text.contains(r#"namelist_list_hits_total{dimension="ip",list="black"} 1"#),
        "{text}"
    );
}

/// (list, sandbox, entries) of each summary.
fn rows(all: &[ListSummary]) -> Vec<(String, String, i64)> {
    all.iter()
        .map(|s| (s.list.clone(), s.sandbox.clone(), s.entries))
        .collect()
}

fn raw_lists(list: Option<&str>, sandbox: Option<&str>, limit: usize) -> RawListsQuery {
    RawListsQuery {
        list: list.map(str::to_owned),
        sandbox: sandbox.map(str::to_owned),
        limit: Some(limit.to_string()),
        cursor: None,
    }
}

/// Pages of every size, with every filter (none, each list, each sandbox, each pair, and
/// names that hold nothing), give each pair exactly once, in (list, sandbox) order, names
/// chosen so that byte order and "shorter first" disagree with naive joins (`a` < `a-b` <
/// `a_b` < `ab`; `A` < `Z` < `_x` < `a`). The store's own pages, started after pairs that
/// exist and pairs that do not, select exactly what the oracle does.
pub(super) async fn counts_page_through_every_filter_once_in_order(h: &Harness) {
    let lists = ["a", "a-b", "a_b", "ab", "b", "z9"];
    let sandboxes = ["A", "Z", "_x", "a", "a-1", "default", "loan"];
    let mut oracle: BTreeMap<(String, String), i64> = BTreeMap::new();
    let mut changes = Vec::new();
    for (i, l) in lists.iter().enumerate() {
        for (j, s) in sandboxes.iter().enumerate() {
            if (i * 7 + j * 3) % 4 != 0 {
                let n = 1 + ((i + j) % 3) as i64;
                changes.push((*l, *s, n));
                oracle.insert((l.to_string(), s.to_string()), n);
            }
        }
    }
    // Created and emptied again in the same batch: not a pair.
    changes.push(("gone", "loan", 2));
    changes.push(("gone", "loan", -2));
    change(h, &changes, now_ms()).await;
    assert!(oracle.len() > 25, "{}", oracle.len());

    let expect = |list: Option<&str>, sandbox: Option<&str>| -> Vec<(String, String, i64)> {
        oracle
            .iter()
            .filter(|((l, s), _)| list.is_none_or(|x| x == l) && sandbox.is_none_or(|x| x == s))
            .map(|((l, s), n)| (l.clone(), s.clone(), *n))
            .collect()
    };
    let mut filters: Vec<(Option<&str>, Option<&str>)> = vec![(None, None)];
    for l in lists.iter().chain(&["nolist", "gone"]) {
        filters.push((Some(l), None));
        for s in sandboxes.iter().chain(&["nosandbox"]) {
            filters.push((Some(l), Some(s)));
        }
    }
    for s in sandboxes.iter().chain(&["nosandbox"]) {
        filters.push((None, Some(s)));
    }
    for (list, sandbox) in &filters {
        for limit in [1, 2, 7, 1000] {
            let got = checked_pages(h, raw_lists(*list, *sandbox, limit), limit).await;
            assert_eq!(
                rows(&got),
                expect(*list, *sandbox),
                "list {list:?}, sandbox {sandbox:?}, pages of {limit}"
            );
        }
    }

    // The store itself, after any pair (there or not), each filter: exactly the oracle's.
    let mut afters: Vec<Option<(&str, &str)>> = vec![None, Some(("a", "A")), Some(("0", "0"))];
    for l in ["a", "a-b", "ab", "b", "zz", "a0"] {
        for s in ["A", "_x", "a", "a-0", "zz", "default"] {
            afters.push(Some((l, s)));
        }
    }
    for (list, sandbox) in &filters {
        for after in &afters {
            let query = CountsQuery {
                list: list.map(|l| l.parse().unwrap()),
                sandbox: sandbox.map(|s| s.parse().unwrap()),
                after: after.map(|(l, s)| Scope::new(&l.parse().unwrap(), &s.parse().unwrap())),
                limit: 3,
            };
            let all: Vec<(String, String, i64)> = oracle
                .iter()
                .filter(|((l, s), _)| query.selects(l, s))
                .map(|((l, s), n)| (l.clone(), s.clone(), *n))
                .collect();
            let page = h.store.list_counts(&query).await.unwrap();
            let got: Vec<(String, String, i64)> = page
                .counts
                .iter()
                .map(|c| (c.list.clone(), c.sandbox.clone(), c.entries))
                .collect();
            assert_eq!(got, all[..all.len().min(3)], "{query:?}");
            assert_eq!(page.more, all.len() > 3, "{query:?}");
        }
    }
}

/// `pages`, checking each page: at most `limit` pairs, exactly `limit` on every page but the
/// last, and a next page only when there is more.
async fn checked_pages(h: &Harness, raw: RawListsQuery, limit: usize) -> Vec<ListSummary> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10_000 {
        let q = ListsQuery::try_from(RawListsQuery {
            cursor: cursor.clone(),
            ..RawListsQuery {
                list: raw.list.clone(),
                sandbox: raw.sandbox.clone(),
                limit: raw.limit.clone(),
                cursor: None,
            }
        })
        .unwrap();
        let page = h.lists.summaries(&q).await.unwrap();
        assert!(page.lists.len() <= limit, "{raw:?}: {page:?}");
        let last = page.next_cursor.is_none();
        if !last {
            assert_eq!(
                page.lists.len(),
                limit,
                "{raw:?}: a short page before the end"
            );
        }
        if cursor.is_some() {
            assert!(!page.lists.is_empty(), "{raw:?}: a cursor to an empty page");
        }
        out.extend(page.lists);
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return out,
        }
    }
    panic!("the cursor never ended");
}

/// A pair whose count reaches 0, or below, is gone from every page and filter; a change to
/// nothing (a delete of what was never counted, a refresh) creates nothing; it comes back
/// with its new count only; its last change never goes back in time.
pub(super) async fn a_count_at_zero_disappears(h: &Harness) {
    let t0 = now_ms();
    change(h, &[("black", "loan", 2), ("black", "pay", 1)], t0).await;
    change(h, &[("black", "loan", -2)], t0 + 1).await;
    change(h, &[("grey", "loan", -1), ("white", "loan", 0)], t0 + 2).await;
    for (list, sandbox) in [
        (None, None),
        (Some("black"), None),
        (None, Some("loan")),
        (Some("black"), Some("loan")),
        (Some("grey"), None),
        (Some("white"), Some("loan")),
    ] {
        let got = rows(&checked_pages(h, raw_lists(list, sandbox, 1), 1).await);
        let want: Vec<(String, String, i64)> =
            if sandbox != Some("loan") && list.is_none_or(|l| l == "black") {
                vec![("black".into(), "pay".into(), 1)]
            } else {
                vec![]
            };
        assert_eq!(got, want, "list {list:?}, sandbox {sandbox:?}");
    }

    // Below zero, then back: the count starts again from what was added.
    change(h, &[("grey", "loan", 1)], t0 + 3).await;
    change(h, &[("black", "pay", -5)], t0 + 4).await;
    change(h, &[("black", "pay", 2)], t0 + 5).await;
    // An older change arriving late moves the count, never the time back.
    change(h, &[("black", "pay", 1)], t0 - 60_000).await;
    let all = counts(h).await;
    assert_eq!(
        rows(&all),
        [
            ("black".into(), "pay".into(), 3),
            ("grey".into(), "loan".into(), 1)
        ]
    );
    assert_eq!(summary(&all, "black", "pay").unwrap().last_change, t0 + 5);
    assert_eq!(summary(&all, "grey", "loan").unwrap().last_change, t0 + 3);
}
