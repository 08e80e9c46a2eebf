//! What operators read (issue 13), on every backend: the lists' approximate counts
//! (`EntryStore::count_changes`, `list_counts`, kept by `NameLists`), one identity looked up
//! on every list of a sandbox, and the audit trail paged and filtered
//! (`EntryStore::audit_read` merged by `AuditTrail`); a cursor with nothing older is an empty
//! last page.

use std::collections::HashSet;
use std::time::Duration;

use namelist::audit_trail::{AuditEntry, AuditQuery, AuditTrail, RawAuditQuery};
use namelist::domain::{Dimension, Expiry, ListName, Sandbox, Value, now_ms};
use namelist::lists::{CheckQuery, EntryRef, ListSummary, NewEntry, RawCheck};

use crate::Harness;

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

async fn counts(h: &Harness) -> Vec<ListSummary> {
    h.lists.summaries().await.unwrap()
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
    let mut lists: Vec<String> = found.hits.iter().map(|h| h.list.to_string()).collect();
    lists.sort();
    assert_eq!(lists, names, "every list of the sandbox, and only of it");
    assert!(!found.degraded);

    let found = h
        .lists
        .lookup_everywhere("ip".into(), "10.9.8.7".into(), sb.clone())
        .await
        .unwrap();
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
    assert!(none.hits.is_empty());
    assert!(
        h.lists
            .lookup_everywhere("phone".into(), "12".into(), sb)
            .await
            .is_err(),
        "a bad value is an error, not an empty answer"
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
    let cursors = ["0-0-0", "0-0-1", "0-0-3", "0-0-64", "0-1-0"];
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
    // The newest position there is: everything is older.
    let all = read_all(
        &trail,
        &[
            ("who", "alice"),
            ("cursor", "18446744073709551615-18446744073709551615-64"),
        ],
    )
    .await;
    assert_eq!(all.len(), 40);
    let text = h.metrics.render();
    let errors = text
        .lines()
        .find_map(|l| l.strip_prefix(r#"namelist_store_errors_total{op="audit_page"} "#));
    assert!(errors.is_none_or(|n| n == "0"), "{text}");
}

conformance!(
    list_counts_follow_writes_and_deletes,
    lookup_everywhere_finds_every_list,
    audit_pages_cover_the_trail_once,
    audit_pages_read_ahead_past_the_first_chunk,
    audit_matches_a_value_by_fingerprint,
    audit_cursors_with_nothing_older_end_the_trail,
);
