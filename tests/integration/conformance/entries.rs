//! `EntryStore`: the name-list entries, their prefix registries and their audit trail, as
//! the name-list service and its local tier see them (every case but the last goes through
//! `NameLists`), and whole-bucket reads, which the embedded store serves only to tests.

// Cases of issue 14 (segments, e-mail, precedence) live in a module of their own.
#[path = "matching.rs"]
mod matching;
use matching::*;

use std::collections::BTreeMap;
use std::time::Duration;

use namelist::domain::{Dimension, Expiry, ListName, Sandbox, ValidationError, Value, now_ms};
use namelist::lists::{CheckQuery, EntryRef, ListsError, NewEntry, RawCheck};
use namelist::store::{Deadline, EntryKey, Hashing, WriteBatch};

use crate::conformance::{Harness, Tier, deadline};

fn list(s: &str) -> ListName {
    s.parse().unwrap()
}

fn sandbox(s: &str) -> Sandbox {
    s.parse().unwrap()
}

fn new(dim: &str, value: &str, sb: &str, expiry: Expiry) -> NewEntry {
    let dimension: Dimension = dim.parse().unwrap();
    NewEntry {
        value: Value::parse_entry(&dimension, value).unwrap(),
        dimension,
        sandbox: sandbox(sb),
        expiry,
        reason: None,
    }
}

/// Upserts `entries` into `list` as the actor "t", which must succeed.
async fn put(h: &Harness, list: &ListName, entries: Vec<NewEntry>) {
    h.lists.upsert(list, entries, "t").await.unwrap();
}

fn entry_ref(dim: &str, value: &str, sb: &str) -> EntryRef {
    let dimension: Dimension = dim.parse().unwrap();
    EntryRef {
        value: Value::parse_entry(&dimension, value).unwrap(),
        dimension,
        sandbox: sandbox(sb),
    }
}

fn query(sb: &str, lists: &[&str], subjects: &[(&str, &[&str])]) -> CheckQuery {
    try_query(sb, lists, subjects).unwrap()
}

fn try_query(
    sb: &str,
    lists: &[&str],
    subjects: &[(&str, &[&str])],
) -> Result<CheckQuery, ValidationError> {
    CheckQuery::try_from(RawCheck {
        sandbox: Some(sb.to_owned()),
        lists: lists.iter().map(|l| l.to_string()).collect(),
        subjects: subjects
            .iter()
            .map(|(d, vs)| (d.to_string(), vs.iter().map(|v| v.to_string()).collect()))
            .collect(),
        strict: true,
        ..RawCheck::default()
    })
}

/// The hits of a check as sorted (list, dimension, value) triples. With a complete tier, once
/// what writes touched has been read again, the check must not send a lookup to Redis.
async fn hits(h: &Harness, q: &CheckQuery) -> Vec<(String, String, String)> {
    let local = h.tier == Tier::Complete && !h.store.in_process();
    if local {
        assert!(h.lists.cache().wait_idle(Duration::from_secs(5)).await);
    }
    let sent = h.metrics.cache_misses.get();
    let out = h.lists.check(q).await.expect("check succeeds");
    assert!(!out.degraded, "a healthy store never degrades");
    assert_eq!(out.stale, None, "stale_ms only in degraded answers");
    if local {
        assert_eq!(
            h.metrics.cache_misses.get(),
            sent,
            "a complete tier answers every lookup of a check locally"
        );
    }
    let mut v: Vec<_> = out
        .hits
        .into_iter()
        .map(|hit| (hit.list.to_string(), hit.dimension.to_string(), hit.value))
        .collect();
    v.sort();
    v
}

/// A check of one address against `black` in the default sandbox.
fn ip_check(ip: &str) -> CheckQuery {
    query("default", &["black"], &[("ip", &[ip])])
}

fn triple(l: &str, d: &str, v: &str) -> (String, String, String) {
    (l.into(), d.into(), v.into())
}

fn ttl(secs: u64) -> Expiry {
    Expiry::after_ttl(secs, now_ms()).unwrap()
}

/// An expiry `ms` from now (rounded up to the next whole second by the encoding).
fn soon(ms: i64) -> Expiry {
    Expiry::at_ms(now_ms() + ms, now_ms()).unwrap()
}

async fn sleep_past(e: Expiry) {
    let at = e.expires_at_ms().unwrap();
    let wait = (at - now_ms() + 50).max(0) as u64;
    tokio::time::sleep(Duration::from_millis(wait)).await;
}

async fn upsert_lookup_and_check(h: &Harness) {
    let black = list("black");
    let written = h
        .lists
        .upsert(
            &black,
            vec![
                new("phone", "+86 138-0000-0000", "loan", Expiry::Never),
                new("device", "d1", "loan", ttl(3600)),
            ],
            "tester",
        )
        .await
        .unwrap();
    assert_eq!(written, 2);

    let phone = h
        .lists
        .lookup(&black, &entry_ref("phone", "+8613800000000", "loan"))
        .await
        .unwrap();
    assert_eq!(phone, Some(Expiry::Never), "phone is listed forever");
    let device = h
        .lists
        .lookup(&black, &entry_ref("device", "d1", "loan"))
        .await
        .unwrap();
    let at = device
        .and_then(Expiry::expires_at_ms)
        .expect("device listed with an expiry");
    let now = now_ms();
    assert!(
        at > now + 3_598_000 && at <= now + 3_601_000,
        "expiry about an hour out: {at} vs {now}"
    );

    let q = query(
        "loan",
        &["black", "grey"],
        &[
            ("phone", &["+86 (138) 0000 0000"]),
            ("device", &["d1", "d2"]),
        ],
    );
    assert_eq!(
        hits(h, &q).await,
        vec![
            triple("black", "device", "d1"),
            triple("black", "phone", "+8613800000000")
        ]
    );
    let out = h.lists.check(&q).await.unwrap();
    let phone_hit = out
        .hits
        .iter()
        .find(|x| x.dimension == Dimension::Phone)
        .unwrap();
    assert_eq!(
        phone_hit.expires_at, None,
        "never-expiring hit has a null expiry"
    );
    let device_hit = out
        .hits
        .iter()
        .find(|x| x.dimension == Dimension::Device)
        .unwrap();
    assert_eq!(device_hit.expires_at, Some(at));

    let grey_only = query("loan", &["grey"], &[("phone", &["+8613800000000"])]);
    assert!(
        hits(h, &grey_only).await.is_empty(),
        "lists are isolated from each other"
    );
}

async fn refresh_last_write_wins(h: &Harness) {
    let black = list("black");
    let r = entry_ref("uid", "u-refresh", "default");
    let q = query("default", &["black"], &[("uid", &["u-refresh"])]);
    put(h, &black, vec![new("uid", "u-refresh", "default", ttl(60))]).await;
    assert!(matches!(
        h.lists.lookup(&black, &r).await.unwrap(),
        Some(Expiry::At(_))
    ));
    assert!(
        h.lists.check(&q).await.unwrap().hits[0]
            .expires_at
            .is_some()
    );

    put(
        h,
        &black,
        vec![new("uid", "u-refresh", "default", Expiry::Never)],
    )
    .await;
    assert_eq!(
        h.lists.lookup(&black, &r).await.unwrap(),
        Some(Expiry::Never)
    );
    assert_eq!(
        h.lists.check(&q).await.unwrap().hits[0].expires_at,
        None,
        "the cache saw the refresh"
    );

    let later = ttl(7200);
    let batch = vec![
        new("uid", "u-refresh", "default", ttl(10)),
        new("uid", "u-refresh", "default", later),
    ];
    put(h, &black, batch).await;
    assert_eq!(
        h.lists.lookup(&black, &r).await.unwrap(),
        Some(later),
        "last in a batch wins"
    );
}

async fn delete_counts_present_and_live(h: &Harness) {
    let black = list("black");
    let expiring = soon(200);
    put(
        h,
        &black,
        vec![
            new("device", "a", "default", Expiry::Never),
            new("device", "b", "default", Expiry::Never),
            new("device", "old", "default", expiring),
        ],
    )
    .await;
    let q = query("default", &["black"], &[("device", &["a", "b"])]);
    assert_eq!(hits(h, &q).await.len(), 2, "both listed (and now cached)");
    sleep_past(expiring).await;

    let removed = h
        .lists
        .remove(
            &black,
            vec![
                entry_ref("device", "a", "default"),
                entry_ref("device", "never-listed", "default"),
                entry_ref("device", "a", "default"),
                entry_ref("device", "old", "default"),
            ],
            "t",
        )
        .await
        .unwrap();
    assert_eq!(
        removed, 1,
        "only the present, live entry counts; duplicates once; expired not"
    );
    assert_eq!(hits(h, &q).await, vec![triple("black", "device", "b")]);
    assert_eq!(
        h.lists
            .lookup(&black, &entry_ref("device", "a", "default"))
            .await
            .unwrap(),
        None
    );
    let again = h
        .lists
        .remove(&black, vec![entry_ref("device", "a", "default")], "t")
        .await
        .unwrap();
    assert_eq!(again, 0);
    let key = h.store.layout().entry_key(
        &black,
        &Dimension::Device,
        &sandbox("default"),
        &Value::Text("old".into()),
    );
    assert_eq!(
        h.store.get_many(&[key]).await.unwrap(),
        vec![None],
        "the expired field was deleted too"
    );
}

async fn expiry_with_short_ttls(h: &Harness) {
    let black = list("black");
    let e = soon(300);
    put(
        h,
        &black,
        vec![new("imei", "490154203237518", "default", e)],
    )
    .await;
    let r = entry_ref("imei", "49-015420-323751-8", "default");
    let q = query("default", &["black"], &[("imei", &["490154203237518"])]);
    assert_eq!(h.lists.lookup(&black, &r).await.unwrap(), Some(e));
    let out = h.lists.check(&q).await.unwrap();
    assert_eq!(out.hits.len(), 1);
    assert_eq!(out.hits[0].expires_at, e.expires_at_ms());
    sleep_past(e).await;
    assert_eq!(
        h.lists.lookup(&black, &r).await.unwrap(),
        None,
        "expired: not listed"
    );
    assert!(
        hits(h, &q).await.is_empty(),
        "expired: the cached hit ended with the entry"
    );
}

async fn sandbox_isolation(h: &Harness) {
    let black = list("black");
    put(
        h,
        &black,
        vec![
            new("uid", "shared", "loan", Expiry::Never),
            new("uid", "shared", "pay", Expiry::Never),
            new("ip", "10.9.0.0/16", "loan", Expiry::Never),
        ],
    )
    .await;
    let q = |sb: &str| {
        query(
            sb,
            &["black"],
            &[("uid", &["shared"]), ("ip", &["10.9.1.1"])],
        )
    };
    assert_eq!(
        hits(h, &q("loan")).await,
        vec![
            triple("black", "ip", "10.9.0.0/16"),
            triple("black", "uid", "shared")
        ]
    );
    assert_eq!(
        hits(h, &q("pay")).await,
        vec![triple("black", "uid", "shared")]
    );
    assert!(hits(h, &q("default")).await.is_empty());
    assert_eq!(
        h.lists
            .remove(&black, vec![entry_ref("uid", "shared", "pay")], "t")
            .await
            .unwrap(),
        1
    );
    assert!(hits(h, &q("pay")).await.is_empty());
    assert_eq!(
        hits(h, &q("loan")).await.len(),
        2,
        "deleting in one sandbox leaves the others"
    );
}

async fn ipv4_ranges(h: &Harness) {
    let black = list("black");
    put(
        h,
        &black,
        vec![
            new("ip", "10.1.2.77/24", "default", Expiry::Never),
            new("ip", "10.0.0.0/8", "default", Expiry::Never),
            new("ip", "192.168.1.7", "default", Expiry::Never),
            new("ip", "172.16.0.0/12", "other", Expiry::Never),
        ],
    )
    .await;
    assert_eq!(
        hits(h, &ip_check("10.1.2.3")).await,
        vec![
            triple("black", "ip", "10.0.0.0/8"),
            triple("black", "ip", "10.1.2.0/24")
        ]
    );
    assert_eq!(
        hits(h, &ip_check("10.2.0.1")).await,
        vec![triple("black", "ip", "10.0.0.0/8")]
    );
    assert!(hits(h, &ip_check("11.0.0.1")).await.is_empty());
    assert_eq!(
        hits(h, &ip_check("192.168.1.7")).await,
        vec![triple("black", "ip", "192.168.1.7")]
    );
    assert!(hits(h, &ip_check("192.168.1.8")).await.is_empty());
    assert!(
        hits(h, &ip_check("172.16.5.5")).await.is_empty(),
        "a range in another sandbox"
    );
    assert_eq!(
        hits(h, &ip_check("::ffff:10.1.2.3")).await.len(),
        2,
        "an IPv4-mapped address is the IPv4 address"
    );
    let found = h
        .lists
        .lookup(&black, &entry_ref("ip", "10.1.2.0/24", "default"))
        .await
        .unwrap();
    assert_eq!(
        found,
        Some(Expiry::Never),
        "a range is looked up by its own value"
    );

    // A range added later is seen at once (the prefix registry cache is invalidated).
    put(
        h,
        &black,
        vec![new("ip", "11.0.0.0/9", "default", Expiry::Never)],
    )
    .await;
    assert_eq!(
        hits(h, &ip_check("11.0.0.1")).await,
        vec![triple("black", "ip", "11.0.0.0/9")]
    );
}

async fn ipv6_ranges(h: &Harness) {
    let black = list("black");
    put(
        h,
        &black,
        vec![
            new("ip", "2001:db8:1::/48", "default", Expiry::Never),
            new("ip", "2001:DB8:1:2:ffff::/64", "default", Expiry::Never),
            new("ip", "2001:db8::1", "default", Expiry::Never),
            new("ip", "0.0.0.0/1", "default", Expiry::Never),
        ],
    )
    .await;
    assert_eq!(
        hits(h, &ip_check("2001:db8:1:2::99")).await,
        vec![
            triple("black", "ip", "2001:db8:1:2::/64"),
            triple("black", "ip", "2001:db8:1::/48")
        ]
    );
    assert_eq!(
        hits(h, &ip_check("2001:db8:1:3::1")).await,
        vec![triple("black", "ip", "2001:db8:1::/48")]
    );
    assert_eq!(
        hits(h, &ip_check("2001:0db8:0000::0001")).await,
        vec![triple("black", "ip", "2001:db8::1")]
    );
    assert!(hits(h, &ip_check("2001:db8:2::1")).await.is_empty());
    assert!(
        hits(h, &ip_check("::1")).await.is_empty(),
        "an IPv4 range never matches an IPv6 address"
    );
}

async fn multi_valued_subjects(h: &Harness) {
    let black = list("black");
    let grey = list("grey");
    put(
        h,
        &black,
        vec![
            new("ip", "172.16.0.1", "default", Expiry::Never),
            new("phone", "13900000000", "default", Expiry::Never),
        ],
    )
    .await;
    put(
        h,
        &grey,
        vec![new(
            "wifi_mac",
            "aa:bb:cc:dd:ee:ff",
            "default",
            Expiry::Never,
        )],
    )
    .await;
    let q = query(
        "default",
        &["black", "grey"],
        &[
            ("ip", &["10.1.2.3", "172.16.0.1"]),
            ("phone", &["13800000000", "139-0000-0000"]),
            ("wifi_mac", &["AA-BB-CC-DD-EE-FF", "00:11:22:33:44:55"]),
        ],
    );
    assert_eq!(
        hits(h, &q).await,
        vec![
            triple("black", "ip", "172.16.0.1"),
            triple("black", "phone", "+8613900000000"),
            triple("grey", "wifi_mac", "aa:bb:cc:dd:ee:ff"),
        ]
    );
}

async fn lazy_delete_removes_the_field(h: &Harness) {
    let black = list("black");
    let e = soon(200);
    put(h, &black, vec![new("uid", "lazy", "default", e)]).await;
    let key = h.store.layout().entry_key(
        &black,
        &Dimension::Uid,
        &sandbox("default"),
        &Value::Text("lazy".into()),
    );
    sleep_past(e).await;
    assert_eq!(
        h.store.get_many(&[key]).await.unwrap(),
        vec![Some(e.code())],
        "still stored after expiry"
    );
    let q = query("default", &["black"], &[("uid", &["lazy"])]);
    assert!(
        hits(h, &q).await.is_empty(),
        "an expired field answers absent"
    );
    let mut gone = false;
    for _ in 0..200 {
        if h.store.get_many(&[key]).await.unwrap() == vec![None] {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        gone,
        "the read deleted the expired field off the request path"
    );

    // Compare-and-delete keeps a refreshed entry.
    let fresh = ttl(600);
    put(h, &black, vec![new("uid", "lazy", "default", fresh)]).await;
    assert!(
        !h.store
            .remove_if_unchanged(key, e.code(), Deadline::after(Duration::from_secs(10)))
            .await
            .unwrap(),
        "a refresh survives"
    );
    assert_eq!(
        h.store.get_many(&[key]).await.unwrap(),
        vec![Some(fresh.code())]
    );
    assert!(
        h.store
            .remove_if_unchanged(key, fresh.code(), Deadline::after(Duration::from_secs(10)))
            .await
            .unwrap()
    );
    assert_eq!(h.store.get_many(&[key]).await.unwrap(), vec![None]);
}

async fn audit_trail_masks_values(h: &Harness) {
    let black = list("black");
    let mut e = new("phone", "13800000000", "loan", ttl(60));
    e.reason = Some("chargeback 2026-11".into());
    h.lists.upsert(&black, vec![e], "alice").await.unwrap();
    h.lists
        .remove(
            &black,
            vec![entry_ref("phone", "138 0000 0000", "loan")],
            "bob",
        )
        .await
        .unwrap();
    let key = h.store.layout().entry_key(
        &black,
        &Dimension::Phone,
        &sandbox("loan"),
        &Value::Text("+8613800000000".into()),
    );
    let tail = h.store.audit_tail(2).await.unwrap();
    assert_eq!(tail.len(), 2);
    let (up, del) = (&tail[0], &tail[1]);
    for (rec, op, who) in [(up, "upsert", "alice"), (del, "delete", "bob")] {
        assert_eq!(rec.get("op"), Some(op));
        assert_eq!(rec.get("who"), Some(who));
        assert_eq!(rec.get("list"), Some("black"));
        assert_eq!(rec.get("dimension"), Some("phone"));
        assert_eq!(rec.get("sandbox"), Some("loan"));
        assert_eq!(rec.get("value"), Some("+86138****0000"));
        assert_eq!(rec.get("fingerprint"), Some(key.fingerprint().as_str()));
        assert!(rec.get("at").and_then(|t| t.parse::<i64>().ok()).is_some());
        assert!(
            rec.fields.iter().all(|(_, v)| !v.contains("13800000000")),
            "no raw value in {rec:?}"
        );
        // The masked value and the two keyed fingerprints (the entry's, and the value's in its
        // dimension, which the trail's index finds it by): nothing else derived from the value.
        assert_eq!(
            rec.get("vfp"),
            Some(
                format!(
                    "{:016x}",
                    h.store
                        .layout()
                        .audit_value(&Dimension::Phone, &Value::Text("+8613800000000".into()))
                )
                .as_str()
            )
        );
        let mut names: Vec<&str> = rec.fields.iter().map(|(n, _)| n.as_str()).collect();
        names.sort_unstable();
        assert_eq!(rec.get("bucket"), Some(key.bucket.to_string().as_str()));
        let mut expected = vec![
            "at",
            "bucket",
            "dimension",
            "expires_at",
            "fingerprint",
            "list",
            "op",
            "sandbox",
            "value",
            "vfp",
            "who",
        ];
        if op == "upsert" {
            expected.push("reason");
            expected.sort_unstable();
        }
        assert_eq!(names, expected);
    }
    // Keyed, the fingerprint is not the unkeyed hash anyone could recompute.
    let unkeyed = format!(
        "{:016x}",
        xxhash_rust::xxh3::xxh3_64(b"black\nphone\nloan\n+8613800000000")
    );
    assert_eq!(
        up.get("fingerprint") == Some(unkeyed.as_str()),
        *h.store.layout().hashing() == Hashing::Unkeyed,
        "format {}",
        h.store.layout().format()
    );
    let unkeyed_vfp = format!(
        "{:016x}",
        xxhash_rust::xxh3::xxh3_64(b"phone\n+8613800000000")
    );
    assert_eq!(
        up.get("vfp") == Some(unkeyed_vfp.as_str()),
        *h.store.layout().hashing() == Hashing::Unkeyed,
        "format {}",
        h.store.layout().format()
    );
    assert_eq!(up.get("reason"), Some("chargeback 2026-11"));
    assert!(up.get("expires_at").unwrap().parse::<i64>().is_ok());
}

async fn own_writes_are_seen_through_the_cache(h: &Harness) {
    let black = list("black");
    let q = query("default", &["black"], &[("device", &["fresh"])]);
    assert!(hits(h, &q).await.is_empty());
    assert!(hits(h, &q).await.is_empty(), "the miss is now cached");
    put(
        h,
        &black,
        vec![new("device", "fresh", "default", Expiry::Never)],
    )
    .await;
    assert_eq!(hits(h, &q).await, vec![triple("black", "device", "fresh")]);
    h.lists
        .remove(&black, vec![entry_ref("device", "fresh", "default")], "t")
        .await
        .unwrap();
    assert!(hits(h, &q).await.is_empty());
}

async fn limits_change_nothing(h: &Harness) {
    let black = list("black");
    let many: Vec<NewEntry> = (0..10_001)
        .map(|i| new("uid", &format!("u{i}"), "default", Expiry::Never))
        .collect();
    let err = h.lists.upsert(&black, many, "t").await.unwrap_err();
    assert!(
        matches!(err, ListsError::Invalid(ref v) if v.code == "too_many_entries"),
        "{err:?}"
    );
    assert_eq!(
        h.lists
            .lookup(&black, &entry_ref("uid", "u0", "default"))
            .await
            .unwrap(),
        None
    );
    let values: Vec<String> = (0..65).map(|i| format!("d{i}")).collect();
    let refs: Vec<&str> = values.iter().map(String::as_str).collect();
    // A check over the limit cannot even be built (the limit is checked once, there).
    let err = try_query("default", &["black"], &[("device", &refs)]).unwrap_err();
    assert_eq!(err.code, "too_many_values", "{err:?}");
    let err = try_query("default", &[], &[("device", &refs[..1])]).unwrap_err();
    assert_eq!(err.code, "invalid_lists", "{err:?}");
}

/// `get_buckets` answers what `get_many` answers, a bucket at a time: every field written to
/// it with its code, nothing for a bucket never written, a bucket asked twice twice.
async fn buckets_are_read_whole(h: &Harness) {
    let layout = h.store.layout();
    let black = list("black");
    let written: Vec<(EntryKey, u32)> = (0..100)
        .map(|i| {
            let value = Value::Text(format!("whole-{i}"));
            let key = layout.entry_key(&black, &Dimension::Uid, &sandbox("default"), &value);
            (key, 1_000 + i)
        })
        .collect();
    h.store
        .write(
            WriteBatch {
                entries: written.clone(),
                ..WriteBatch::default()
            },
            deadline(),
        )
        .await
        .unwrap();
    let mut expected: BTreeMap<u32, BTreeMap<i64, u32>> = BTreeMap::new();
    for (k, code) in &written {
        expected.entry(k.bucket).or_default().insert(k.field, *code);
    }
    let empty = (0..layout.buckets())
        .find(|b| !expected.contains_key(b))
        .expect("100 entries leave a bucket of 64 or more empty");
    let first = *expected.keys().next().unwrap();
    let mut asked: Vec<u32> = expected.keys().copied().collect();
    asked.extend([empty, first]);
    let read = h.store.get_buckets(&asked).await.unwrap();
    assert_eq!(read.len(), asked.len(), "one answer per bucket asked");
    for (bucket, pairs) in asked.iter().zip(&read) {
        let got: BTreeMap<i64, u32> = pairs.iter().copied().collect();
        assert_eq!(got.len(), pairs.len(), "bucket {bucket}: a field twice");
        let want = expected.get(bucket).cloned().unwrap_or_default();
        assert_eq!(got, want, "bucket {bucket}");
    }
    let keys: Vec<EntryKey> = written.iter().map(|(k, _)| *k).collect();
    let codes = h.store.get_many(&keys).await.unwrap();
    assert_eq!(
        codes,
        written.iter().map(|(_, c)| Some(*c)).collect::<Vec<_>>(),
        "get_many reads the same codes"
    );
}

conformance!(
    upsert_lookup_and_check,
    refresh_last_write_wins,
    delete_counts_present_and_live,
    expiry_with_short_ttls,
    sandbox_isolation,
    ipv4_ranges,
    ipv6_ranges,
    multi_valued_subjects,
    lazy_delete_removes_the_field,
    audit_trail_masks_values,
    own_writes_are_seen_through_the_cache,
    limits_change_nothing,
    phone_segments,
    email_addresses_and_domains,
    precedence_decides,
    audit_masks_segments_and_addresses,
    segment_and_domain_probes_count_against_the_limit,
    buckets_are_read_whole,
);
