//! One identity looked up on every list of a sandbox: every list found (in chunks), only the
//! sandbox's lists read, at most 1,000 of them (`truncated`).

use namelist::domain::{Expiry, Sandbox, now_ms};

use crate::conformance::Harness;

use super::{change, list, new};

pub(super) async fn lookup_everywhere_finds_every_list(h: &Harness) {
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

/// A lookup on every list reads the lists of its sandbox only, at most 1,000 of them (the
/// first by name): a sandbox of 1,001 lists answers from the first 1,000 and says
/// `truncated`; one of a few lists answers without the key, whatever other sandboxes hold.
pub(super) async fn lookup_everywhere_reads_only_the_sandbox_lists(h: &Harness) {
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
