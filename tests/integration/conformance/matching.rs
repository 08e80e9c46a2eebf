//! Conformance cases of issue 14: phone segments, e-mail addresses and domains, and
//! allow-list precedence, on every backend the suite runs (the harness and the macro are in
//! `tests/integration/conformance/main.rs`). Segments and domains are ordinary fields in buckets, found by a
//! probe per length in use: with a complete tier every check below is answered locally.

use super::*;
use namelist::store::Scope;
use namelist::store::{PrefixKind, PrefixLen};

fn lengths(kind: PrefixKind, lens: &[u8]) -> Vec<PrefixLen> {
    lens.iter().map(|&len| PrefixLen { kind, len }).collect()
}

fn phone_check(phone: &str) -> CheckQuery {
    query("default", &["black"], &[("phone", &[phone])])
}

fn email_check(address: &str) -> CheckQuery {
    query("default", &["black"], &[("email", &[address])])
}

pub(crate) async fn phone_segments(h: &Harness) {
    let black = list("black");
    put(
        h,
        &black,
        vec![
            new("phone", "170*", "default", Expiry::Never),
            new("phone", "1703*", "default", ttl(3600)),
            new("phone", "+86 (171) *", "default", Expiry::Never),
            new("phone", "17012345678", "default", Expiry::Never),
            new("phone", "162*", "other", Expiry::Never),
        ],
    )
    .await;
    let registered = h
        .store
        .prefix_lengths(&[Scope::new(&black, &sandbox("default"))])
        .await
        .unwrap();
    // Rules 2 (every keyspace the suite makes): segments and phones in E.164, so a segment
    // typed without a country code is the region's (CN: `170*` is `+86170*`).
    assert_eq!(
        registered,
        vec![lengths(PrefixKind::PhoneSegment, &[6, 7])],
        "one registry member per segment length in use"
    );

    assert_eq!(
        hits(h, &phone_check("170-3123-4567")).await,
        vec![
            triple("black", "phone", "+86170*"),
            triple("black", "phone", "+861703*")
        ],
        "every segment the phone starts with"
    );
    for spelling in ["17012345678", "+8617012345678", "008617012345678"] {
        assert_eq!(
            hits(h, &phone_check(spelling)).await,
            vec![
                triple("black", "phone", "+86170*"),
                triple("black", "phone", "+8617012345678")
            ],
            "{spelling}: the exact entry and the segment, however it is spelled"
        );
    }
    assert_eq!(
        hits(h, &phone_check("+86 171 0000 0000")).await,
        vec![triple("black", "phone", "+86171*")]
    );
    for miss in ["17212345678", "16212345678", "+6591234567", "1700"] {
        let Ok(q) = try_query("default", &["black"], &[("phone", &[miss])]) else {
            assert_eq!(miss, "1700", "only the short one is no phone");
            continue;
        };
        assert!(
            hits(h, &q).await.is_empty(),
            "{miss}: other numbers, another country, sandboxes apart"
        );
    }
    assert_eq!(
        hits(
            h,
            &query("other", &["black"], &[("phone", &["16212345678"])])
        )
        .await,
        vec![triple("black", "phone", "+86162*")]
    );

    // A segment is looked up as itself, never by a phone inside it.
    for (raw, listed) in [
        ("170*", true),
        ("+86 170*", true),
        ("1703 *", true),
        ("17*", false),
        ("1701*", false),
    ] {
        let found = h
            .lists
            .lookup(&black, &entry_ref("phone", raw, "default"))
            .await
            .unwrap();
        assert_eq!(found.is_some(), listed, "lookup {raw}");
    }
    let lookup = h
        .lists
        .lookup(&black, &entry_ref("phone", "17031234567", "default"))
        .await
        .unwrap();
    assert_eq!(lookup, None, "a phone inside a segment is not an entry");

    // Deleted, it no longer matches; a segment added later is found at once (the registry
    // cache is told).
    let removed = h
        .lists
        .remove(&black, vec![entry_ref("phone", "170*", "default")], "t")
        .await
        .unwrap();
    assert_eq!(removed, 1);
    assert_eq!(
        hits(h, &phone_check("17031234567")).await,
        vec![triple("black", "phone", "+861703*")]
    );
    put(
        h,
        &black,
        vec![new("phone", "+8616*", "default", Expiry::Never)],
    )
    .await;
    assert_eq!(
        hits(h, &phone_check("+8616212345678")).await,
        vec![triple("black", "phone", "+8616*")]
    );
}

pub(crate) async fn email_addresses_and_domains(h: &Harness) {
    let black = list("black");
    put(
        h,
        &black,
        vec![
            new(
                "email",
                " John.Smith+promo@Example.COM ",
                "default",
                Expiry::Never,
            ),
            new("email", "@Example.org", "default", ttl(3600)),
            new("email", "@b.example.net", "default", Expiry::Never),
            new("email", "j.o.h.n@googlemail.com", "default", Expiry::Never),
            new("email", "@example.com", "other", Expiry::Never),
        ],
    )
    .await;
    let registered = h
        .store
        .prefix_lengths(&[Scope::new(&black, &sandbox("default"))])
        .await
        .unwrap();
    assert_eq!(registered, vec![lengths(PrefixKind::EmailDomain, &[2, 3])]);

    let cases: &[(&str, &[&str])] = &[
        ("john.smith@example.com", &["john.smith@example.com"]),
        ("JOHN.SMITH+other@EXAMPLE.com.", &["john.smith@example.com"]),
        ("someone@example.com", &[]),
        ("a@example.org", &["@example.org"]),
        ("a@x.y.example.org", &["@example.org"]),
        ("a@1.2.3.4.5.6.7.8.9.10.11.example.org", &["@example.org"]),
        ("a@notexample.org", &[]),
        ("a@example.org.cn", &[]),
        ("a@b.example.net", &["@b.example.net"]),
        ("a@c.b.example.net", &["@b.example.net"]),
        ("a@example.net", &[]),
        ("John@GMail.com", &["john@gmail.com"]),
        ("jo.hn+x@gmail.com", &["john@gmail.com"]),
    ];
    for (address, want) in cases {
        let want: Vec<_> = want.iter().map(|v| triple("black", "email", v)).collect();
        assert_eq!(hits(h, &email_check(address)).await, want, "{address}");
    }
    assert_eq!(
        hits(
            h,
            &query("other", &["black"], &[("email", &["x@mail.example.com"])])
        )
        .await,
        vec![triple("black", "email", "@example.com")]
    );

    for (raw, listed) in [
        ("@example.org", true),
        ("@EXAMPLE.ORG.", true),
        ("@x.example.org", false),
        ("@example.net", false),
        ("john.smith@example.com", true),
    ] {
        let found = h
            .lists
            .lookup(&black, &entry_ref("email", raw, "default"))
            .await
            .unwrap();
        assert_eq!(found.is_some(), listed, "lookup {raw}");
    }
    let removed = h
        .lists
        .remove(
            &black,
            vec![
                entry_ref("email", "@example.org", "default"),
                entry_ref("email", "@nowhere.example", "default"),
            ],
            "t",
        )
        .await
        .unwrap();
    assert_eq!(removed, 1);
    assert!(hits(h, &email_check("a@x.example.org")).await.is_empty());
}

pub(crate) async fn precedence_decides(h: &Harness) {
    let (white, black, grey) = (list("white"), list("black"), list("grey"));
    put(h, &white, vec![new("uid", "vip", "default", Expiry::Never)]).await;
    put(
        h,
        &black,
        vec![
            new("phone", "138*", "default", Expiry::Never),
            new("email", "@fraud.example", "default", Expiry::Never),
        ],
    )
    .await;
    put(
        h,
        &grey,
        vec![new("uid", "watch", "default", Expiry::Never)],
    )
    .await;
    let check = |uid: &'static str, order: &[&str]| {
        let q = query(
            "default",
            &["white", "black", "grey"],
            &[("uid", &[uid]), ("phone", &["13800000000"])],
        );
        q.with_precedence(order.iter().map(|s| s.to_string()).collect())
            .unwrap()
    };
    for (uid, order, decision) in [
        ("vip", &["white", "black", "grey"][..], Some("white")),
        ("vip", &["black", "white"][..], Some("black")),
        ("watch", &["white", "grey", "black"][..], Some("grey")),
        ("watch", &["white"][..], None),
        ("nobody", &["white", "white", "black"][..], Some("black")),
    ] {
        let q = check(uid, order);
        let out = h.lists.check(&q).await.unwrap();
        assert_eq!(
            out.decision,
            Some(decision.map(list)),
            "{uid} with precedence {order:?}"
        );
        let lists: Vec<String> = out.hits.iter().map(|h| h.list.to_string()).collect();
        assert!(
            lists.contains(&"black".to_owned()),
            "every hit is still reported: {lists:?}"
        );
    }
    let plain = query("default", &["white", "black"], &[("uid", &["vip"])]);
    assert_eq!(h.lists.check(&plain).await.unwrap().decision, None);

    let err = query("default", &["white", "black"], &[("uid", &["vip"])])
        .with_precedence(vec!["white".into(), "grey".into()])
        .unwrap_err();
    assert_eq!(err.code, "invalid_lists", "{err:?}");
    assert!(
        err.message.starts_with("precedence[1]: "),
        "{}",
        err.message
    );
    let err = query("default", &["white"], &[("uid", &["vip"])])
        .with_precedence(vec![])
        .unwrap_err();
    assert_eq!(err.code, "invalid_lists", "{err:?}");
}

pub(crate) async fn audit_masks_segments_and_addresses(h: &Harness) {
    let black = list("black");
    let entries = vec![
        new("phone", "+86 1703*", "loan", Expiry::Never),
        new("email", "John.Smith@Example.com", "loan", Expiry::Never),
        new("email", "@Example.com", "loan", Expiry::Never),
    ];
    let keys: Vec<String> = entries
        .iter()
        .map(|e| {
            h.store
                .layout()
                .entry_key(&black, &e.dimension, &e.sandbox, &e.value)
                .fingerprint()
        })
        .collect();
    h.lists.upsert(&black, entries, "alice").await.unwrap();
    let tail = h.store.audit_tail(3).await.unwrap();
    // One write's records may sit in several parts of the trail: compare them as a set.
    let mut shown: Vec<(&str, &str, &str)> = tail
        .iter()
        .map(|r| {
            (
                r.get("dimension").unwrap_or_default(),
                r.get("value").unwrap_or_default(),
                r.get("fingerprint").unwrap_or_default(),
            )
        })
        .collect();
    shown.sort_unstable();
    let mut want = vec![
        ("phone", "+861****", keys[0].as_str()),
        ("email", "j***@example.com", keys[1].as_str()),
        ("email", "@example.com", keys[2].as_str()),
    ];
    want.sort_unstable();
    assert_eq!(shown, want);
    for rec in &tail {
        assert!(
            rec.fields
                .iter()
                .all(|(_, v)| !v.contains("john") && !v.contains("861703")),
            "no raw value in {rec:?}"
        );
    }
}

pub(crate) async fn segment_and_domain_probes_count_against_the_limit(h: &Harness) {
    // 19 segment lengths in each of 4 lists: 64 phones fan out to 64 x 4 x 20 = 5,120
    // lookups, over the 4,096 a check may make. (With their `+`: under rules 2 a segment
    // without one gets the region's calling code, and 19 digits with it is the most.)
    for name in ["black", "grey", "white", "other"] {
        let segments: Vec<NewEntry> = (1..=19)
            .map(|n| {
                new(
                    "phone",
                    &format!("+{}*", "1".repeat(n)),
                    "default",
                    Expiry::Never,
                )
            })
            .collect();
        put(h, &list(name), segments).await;
    }
    let phones: Vec<String> = (0..64).map(|i| format!("+1111{i:016}")).collect();
    let refs: Vec<&str> = phones.iter().map(String::as_str).collect();
    let q = query(
        "default",
        &["black", "grey", "white", "other"],
        &[("phone", &refs)],
    );
    let err = h.lists.check(&q).await.unwrap_err();
    assert!(
        matches!(err, ListsError::Invalid(ref v) if v.code == "too_many_lookups"),
        "{err:?}"
    );
    let one = query("default", &["black"], &[("phone", &["+11110000000"])]);
    assert_eq!(
        hits(h, &one).await.len(),
        4,
        "+1*, +11*, +111*, +1111* and no longer segment"
    );
}
