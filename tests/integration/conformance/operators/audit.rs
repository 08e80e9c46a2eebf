//! The audit trail paged and filtered: every record once, newest first; pages read past the
//! first read-ahead chunk of every part; a value matched by its keyed fingerprint however it is
//! typed; a cursor with nothing older is an empty last page.

use std::collections::HashSet;
use std::time::Duration;

use namelist::audit_trail::{AuditQuery, AuditTrail};
use namelist::domain::{Expiry, now_ms};

use crate::conformance::Harness;

use super::{entry_ref, list, new, raw, read_all};

pub(super) async fn audit_pages_cover_the_trail_once(h: &Harness) {
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
pub(super) async fn audit_pages_read_ahead_past_the_first_chunk(h: &Harness) {
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

pub(super) async fn audit_matches_a_value_by_fingerprint(h: &Harness) {
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
pub(super) async fn audit_cursors_with_nothing_older_end_the_trail(h: &Harness) {
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
