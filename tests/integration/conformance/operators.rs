//! What operators read (issues 13 and 24), on every backend: the lists' approximate counts
//! (`EntryStore::count_changes`, `list_counts`, kept by `NameLists`), paged with every filter
//! and gone at zero; one identity looked up on every list of a sandbox (its lists only, at
//! most 1,000); and the audit trail paged and filtered (`EntryStore::audit_read` merged by
//! `AuditTrail`): searched through its index by value, who and list, it answers exactly what
//! a scan of the whole trail filtered by hand does (generated histories and searches, across
//! the trim of a small cap), its index holds exactly the records kept, and a cursor with
//! nothing older is an empty last page.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

use namelist::audit_trail::{AuditEntry, AuditQuery, AuditTrail, RawAuditQuery};
use namelist::domain::{Dimension, Expiry, ListName, Sandbox, Value, now_ms};
use namelist::lists::{
    CheckQuery, EntryRef, ListSummary, ListsQuery, NewEntry, RawCheck, RawListsQuery,
};
use namelist::store::Scope;
use namelist::store::{CountChange, CountsQuery, EntryStore, StoreBase};

use crate::conformance::{Capped, Harness, with_audit_cap};

fn list(s: &str) -> ListName {
    s.parse().unwrap()
}

fn new(dim: &str, value: &str, sb: &str, expiry: Expiry) -> NewEntry {
    let dimension: Dimension = dim.parse().unwrap();
    NewEntry {
        value: Value::parse_entry(&dimension, value).unwrap(),
        dimension,
        sandbox: sb.parse().unwrap(),
        expiry,
        reason: None,
    }
}

fn entry_ref(dim: &str, value: &str, sb: &str) -> EntryRef {
    let dimension: Dimension = dim.parse().unwrap();
    EntryRef {
        value: Value::parse_entry(&dimension, value).unwrap(),
        dimension,
        sandbox: sb.parse().unwrap(),
    }
}

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

async fn list_counts_follow_writes_and_deletes(h: &Harness) {
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

async fn lookup_everywhere_finds_every_list(h: &Harness) {
    let sb: Sandbox = "ops".parse().unwrap();
    // 18 lists: more than one check may name, so the lookup runs in chunks.
    let names: Vec<String> = (0..18).map(|i| format!("l{i:02}")).collect();
    for n in &names {
        h.lists
            .upsert(&list(n), vec![new("uid", "u-1", "ops", Expiry::Never)], "t")
            .await
            .unwrap();
    }
    let grey = list("grey");
    let until = now_ms() + 3_600_000;
    h.lists
        .upsert(
            &grey,
            vec![
                new(
                    "ip",
                    "10.9.0.0/16",
                    "ops",
                    Expiry::at_ms(until, now_ms()).unwrap(),
                ),
                new("uid", "u-1", "other", Expiry::Never),
            ],
            "t",
        )
        .await
        .unwrap();
    let found = h
        .lists
        .lookup_everywhere("uid".into(), "u-1".into(), sb.clone())
        .await
        .unwrap();
    let mut lists: Vec<String> = found
        .check
        .hits
        .iter()
        .map(|h| h.list.to_string())
        .collect();
    lists.sort();
    assert_eq!(lists, names, "every list of the sandbox, and only of it");
    assert!(!found.check.degraded);
    assert!(!found.truncated);

    let found = h
        .lists
        .lookup_everywhere("ip".into(), "10.9.8.7".into(), sb.clone())
        .await
        .unwrap();
    let found = found.check;
    assert_eq!(found.hits.len(), 1, "{found:?}");
    assert_eq!(found.hits[0].list.as_str(), "grey");
    assert_eq!(
        found.hits[0].value, "10.9.0.0/16",
        "the range that holds it"
    );
    assert!(
        found.hits[0]
            .expires_at
            .is_some_and(|t| (until..until + 1000).contains(&t)),
        "{found:?}"
    );

    let none = h
        .lists
        .lookup_everywhere("uid".into(), "nobody".into(), "empty".parse().unwrap())
        .await
        .unwrap();
    assert!(none.check.hits.is_empty());
    assert!(
        h.lists
            .lookup_everywhere("phone".into(), "12".into(), sb)
            .await
            .is_err(),
        "a bad value is an error, not an empty answer"
    );
}

/// Adds `delta` to each (list, sandbox) count at `at_ms`, straight through the store.
async fn change(h: &Harness, changes: &[(&str, &str, i64)], at_ms: i64) {
    let changes: Vec<CountChange> = changes
        .iter()
        .map(|(l, s, delta)| CountChange {
            scope: Scope::new(&list(l), &s.parse().unwrap()),
            delta: *delta,
        })
        .collect();
    h.store
        .count_changes(&changes, at_ms, crate::conformance::deadline())
        .await
        .unwrap();
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
async fn counts_page_through_every_filter_once_in_order(h: &Harness) {
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
async fn a_count_at_zero_disappears(h: &Harness) {
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

/// A lookup on every list reads the lists of its sandbox only, at most 1,000 of them (the
/// first by name): a sandbox of 1,001 lists answers from the first 1,000 and says
/// `truncated`; one of a few lists answers without the key, whatever other sandboxes hold.
async fn lookup_everywhere_reads_only_the_sandbox_lists(h: &Harness) {
    // 1,001 lists in `wide`, counted (the lookup reads the counts' index by sandbox), and
    // the same uid on three of them: the first, the 1,000th and the 1,001st.
    let names: Vec<String> = (0..=1000).map(|i| format!("w{i:04}")).collect();
    let changes: Vec<(&str, &str, i64)> = names.iter().map(|n| (n.as_str(), "wide", 1)).collect();
    change(h, &changes, now_ms()).await;
    for n in ["w0000", "w0999", "w1000"] {
        h.lists
            .upsert(
                &list(n),
                vec![new("uid", "u-1", "wide", Expiry::Never)],
                "t",
            )
            .await
            .unwrap();
    }
    // The same lists and uid in `narrow`, on two lists only, and in a third sandbox.
    for n in ["w0000", "w1000"] {
        h.lists
            .upsert(
                &list(n),
                vec![new("uid", "u-1", "narrow", Expiry::Never)],
                "t",
            )
            .await
            .unwrap();
    }
    h.lists
        .upsert(
            &list("x"),
            vec![new("uid", "u-1", "third", Expiry::Never)],
            "t",
        )
        .await
        .unwrap();

    let found = h
        .lists
        .lookup_everywhere("uid".into(), "u-1".into(), "wide".parse().unwrap())
        .await
        .unwrap();
    let mut hit: Vec<String> = found
        .check
        .hits
        .iter()
        .map(|h| h.list.to_string())
        .collect();
    hit.sort();
    assert_eq!(hit, ["w0000", "w0999"], "the first 1,000 lists by name");
    assert!(found.truncated);
    let json = serde_json::to_value(&found).unwrap();
    assert_eq!(json["truncated"], true, "{json}");

    let found = h
        .lists
        .lookup_everywhere("uid".into(), "u-1".into(), "narrow".parse().unwrap())
        .await
        .unwrap();
    let mut hit: Vec<String> = found
        .check
        .hits
        .iter()
        .map(|h| h.list.to_string())
        .collect();
    hit.sort();
    assert_eq!(hit, ["w0000", "w1000"], "only the sandbox's lists");
    assert!(!found.truncated);
    let json = serde_json::to_value(&found).unwrap();
    assert!(json.get("truncated").is_none(), "no key when false: {json}");
    assert_eq!(
        json["degraded"], false,
        "a check's answer, flattened: {json}"
    );
}

fn raw(pairs: &[(&str, &str)]) -> RawAuditQuery {
    let mut q = RawAuditQuery::default();
    for (k, v) in pairs {
        let v = Some((*v).to_owned());
        match *k {
            "list" => q.list = v,
            "sandbox" => q.sandbox = v,
            "dimension" => q.dimension = v,
            "value" => q.value = v,
            "who" => q.who = v,
            "op" => q.op = v,
            "since" => q.since = v,
            "until" => q.until = v,
            "limit" => q.limit = v,
            "cursor" => q.cursor = v,
            other => panic!("{other}"),
        }
    }
    q
}

async fn read_all(trail: &AuditTrail, pairs: &[(&str, &str)]) -> Vec<AuditEntry> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..1000 {
        let mut p: Vec<(&str, &str)> = pairs.to_vec();
        if let Some(c) = &cursor {
            p.push(("cursor", c.as_str()));
        }
        let page = trail
            .page(&AuditQuery::try_from(raw(&p)).unwrap())
            .await
            .unwrap();
        out.extend(page.records);
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return out,
        }
    }
    panic!("the cursor never ended");
}

async fn audit_pages_cover_the_trail_once(h: &Harness) {
    let trail = AuditTrail::new(h.store.clone(), h.metrics.clone(), Duration::from_secs(2));
    let black = list("black");
    // 30 upserts by two operators, in 6 requests, then 5 deletes.
    for r in 0..6 {
        let batch = (0..5)
            .map(|i| new("uid", &format!("u{r}-{i}"), "loan", Expiry::Never))
            .collect();
        let who = if r % 2 == 0 { "alice" } else { "bob" };
        h.lists.upsert(&black, batch, who).await.unwrap();
        // The trail is ordered by the store's clock to the millisecond; records of one
        // millisecond in different parts may come in either order.
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let gone = (0..5)
        .map(|i| entry_ref("uid", &format!("u0-{i}"), "loan"))
        .collect();
    h.lists.remove(&black, gone, "carol").await.unwrap();

    let everything = read_all(&trail, &[("limit", "7")]).await;
    assert_eq!(everything.len(), 35, "every record exactly once");
    let mut seen = HashSet::new();
    for r in &everything {
        assert!(
            seen.insert((r.op.clone(), r.fingerprint.clone())),
            "a record twice: {r:?}"
        );
    }
    assert!(
        everything.windows(2).all(|w| w[0].at >= w[1].at),
        "newest first"
    );
    assert_eq!(everything[0].op.as_deref(), Some("delete"));
    assert_eq!(everything[0].who.as_deref(), Some("carol"));

    let deletes = read_all(&trail, &[("op", "delete")]).await;
    assert_eq!(deletes.len(), 5);
    let bobs = read_all(&trail, &[("who", "bob"), ("limit", "4")]).await;
    assert_eq!(bobs.len(), 15);
    assert!(bobs.iter().all(|r| r.who.as_deref() == Some("bob")));
    let elsewhere = read_all(&trail, &[("sandbox", "pay")]).await;
    assert!(elsewhere.is_empty());
    let future = (now_ms() + 60_000).to_string();
    assert!(
        read_all(&trail, &[("since", future.as_str())])
            .await
            .is_empty()
    );
}

/// A trail longer than the first read of every part: pages of 100 over 900 records (~14 a
/// part; the harness's embedded store keeps 1,000) make parts run dry and be read again from
/// where they stopped (on Redis, `XREVRANGE` from an exclusive id), and every record still
/// comes exactly once, newest first.
async fn audit_pages_read_ahead_past_the_first_chunk(h: &Harness) {
    let trail = AuditTrail::new(h.store.clone(), h.metrics.clone(), Duration::from_secs(5));
    let black = list("black");
    let batch = (0..900)
        .map(|i| new("uid", &format!("deep-{i}"), "deep", Expiry::Never))
        .collect();
    h.lists.upsert(&black, batch, "alice").await.unwrap();
    let all = read_all(&trail, &[("sandbox", "deep"), ("limit", "100")]).await;
    assert_eq!(all.len(), 900);
    let distinct: HashSet<_> = all.iter().map(|r| r.fingerprint.clone()).collect();
    assert_eq!(distinct.len(), 900, "every record exactly once");
    assert!(all.windows(2).all(|w| w[0].at >= w[1].at), "newest first");
    // A filter that matches nothing examines the whole trail and says it ended.
    let page = trail
        .page(&AuditQuery::try_from(raw(&[("who", "nobody")])).unwrap())
        .await
        .unwrap();
    assert!(page.records.is_empty() && page.next_cursor.is_none());
}

async fn audit_matches_a_value_by_fingerprint(h: &Harness) {
    let trail = AuditTrail::new(h.store.clone(), h.metrics.clone(), Duration::from_secs(2));
    let black = list("black");
    let mut e = new("phone", "+86 138-0000-0000", "loan", Expiry::Never);
    e.reason = Some("<img src=x onerror=alert(1)>".into());
    h.lists.upsert(&black, vec![e], "alice").await.unwrap();
    tokio::time::sleep(Duration::from_millis(3)).await;
    h.lists
        .upsert(
            &black,
            vec![new("phone", "+86 139-0000-0000", "loan", Expiry::Never)],
            "alice",
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(3)).await;
    h.lists
        .remove(
            &black,
            vec![entry_ref("phone", "+8613800000000", "loan")],
            "bob",
        )
        .await
        .unwrap();
    // Typed another way, the same phone.
    let mine = read_all(
        &trail,
        &[("dimension", "phone"), ("value", "+86 (138) 0000 0000")],
    )
    .await;
    assert_eq!(mine.len(), 2, "{mine:?}");
    assert_eq!(mine[0].op.as_deref(), Some("delete"));
    assert_eq!(mine[1].op.as_deref(), Some("upsert"));
    assert_eq!(
        mine[1].reason.as_deref(),
        Some("<img src=x onerror=alert(1)>")
    );
    for r in &mine {
        let json = serde_json::to_string(r).unwrap();
        assert!(!json.contains("13800000000"), "a raw value in {json}");
        assert!(r.value.as_deref().is_some_and(|v| v.contains('*')), "{r:?}");
        assert_eq!(r.fingerprint, mine[0].fingerprint);
    }
    assert!(
        read_all(&trail, &[("dimension", "phone"), ("value", "13700000000")])
            .await
            .is_empty()
    );
}

/// A well-formed cursor with nothing older (`0-0-3`: on Redis an `XREVRANGE` to `(0-0`,
/// which it refuses) is an empty last page, on every store, with any filter: never a store
/// error (a 503, counted in `namelist_store_errors_total`).
async fn audit_cursors_with_nothing_older_end_the_trail(h: &Harness) {
    let trail = AuditTrail::new(h.store.clone(), h.metrics.clone(), Duration::from_secs(2));
    let batch = (0..40)
        .map(|i| new("uid", &format!("c{i}"), "loan", Expiry::Never))
        .collect();
    h.lists
        .upsert(&list("black"), batch, "alice")
        .await
        .unwrap();
    let filters: [&[(&str, &str)]; 8] = [
        &[],
        &[("who", "alice")],
        &[("list", "black")],
        &[("dimension", "uid"), ("value", "c7")],
        &[("op", "upsert")],
        &[("since", "0")],
        &[("until", "0")],
        &[("who", "alice"), ("until", "1")],
    ];
    let cursors = [
        "0-0-0",
        "0-0-1",
        "0-0-3",
        "0-0-64",
        "0-1-0",
        "0-1-64",
        "1-0-0",
        "0-18446744073709551615-0",
        "1000-0-5",
    ];
    for filter in filters {
        for cursor in cursors.iter().map(Some).chain([None]) {
            let mut pairs = filter.to_vec();
            if let Some(c) = cursor {
                pairs.push(("cursor", c));
            } else if !pairs.iter().any(|(k, _)| *k == "until") {
                continue;
            }
            let page = trail
                .page(&AuditQuery::try_from(raw(&pairs)).unwrap())
                .await
                .unwrap_or_else(|e| panic!("{pairs:?}: {e}"));
            assert!(
                page.records.is_empty() && page.next_cursor.is_none(),
                "{pairs:?}: {page:?}"
            );
        }
    }
    // The newest positions there are: everything is older, through the index or not.
    for filter in [&[("who", "alice")][..], &[("list", "black")], &[]] {
        for cursor in [
            "18446744073709551615-18446744073709551615-64",
            "18446744073709551615-18446744073709551615-0",
            "18446744073709551615-0-0",
            "17592186044416-0-0",
        ] {
            let mut pairs = filter.to_vec();
            pairs.push(("cursor", cursor));
            assert_eq!(read_all(&trail, &pairs).await.len(), 40, "{pairs:?}");
        }
    }
    let text = h.metrics.render();
    let errors = text
        .lines()
        .find_map(|l| l.strip_prefix(r#"namelist_store_errors_total{op="audit_page"} "#));
    assert!(errors.is_none_or(|n| n == "0"), "{text}");
}

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
async fn audit_index_finds_what_a_scan_finds(h: &Harness) {
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

conformance!(
    list_counts_follow_writes_and_deletes,
    counts_page_through_every_filter_once_in_order,
    a_count_at_zero_disappears,
    lookup_everywhere_finds_every_list,
    lookup_everywhere_reads_only_the_sandbox_lists,
    audit_pages_cover_the_trail_once,
    audit_pages_read_ahead_past_the_first_chunk,
    audit_matches_a_value_by_fingerprint,
    audit_cursors_with_nothing_older_end_the_trail,
    audit_index_finds_what_a_scan_finds,
);
