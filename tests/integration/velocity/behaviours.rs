//! Behaviours on every store: the cases `on_both_stores!` (in `mod.rs`) runs on the embedded
//! store, Redis and a cluster (the seeds' examples, version bumps, replays, late, future and
//! bad input, empty windows, the distinct cap), and a replay racing its original on another
//! instance (embedded, Redis, cluster).

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{RedisCluster, RedisServer, unique_prefix};
use namelist::domain::{EventType, MetricId, RuleId, now_ms};
use namelist::store::Store;
use namelist::velocity::{EventInput, VelocityError, VelocitySettings};
use serde_json::{Value as Json, json};

use super::{
    DAY, HOUR, event, fields, memory_store, mid, redis_at, settings, velocity, velocity_with,
};

pub(super) async fn the_seeds_examples(store: Arc<dyn Store>) {
    let v = velocity(store).await;
    v.put_metric(
        mid("dev_tx_7d"),
        "COUNT(7d, transaction, device_id)",
        Some("1d"),
    )
    .await
    .unwrap();
    v.put_metric(
        mid("user_amt_1d"),
        "SUM(1d, transaction, amount, userid)",
        None,
    )
    .await
    .unwrap();
    v.put_metric(
        mid("dev_users_30d"),
        "COUNT_DISTINCT(30d, login, device_id, userid)",
        None,
    )
    .await
    .unwrap();
    v.put_metric(mid("logins_1h"), "COUNT(1h, login) BY userid", None)
        .await
        .unwrap();
    v.put_rule("too_many_logins".parse().unwrap(), "logins_1h > 3")
        .await
        .unwrap();
    let now = now_ms();

    // One transaction a day on d000001 over the last 5 days, one on another device.
    let mut evs: Vec<EventInput> = (0..5)
        .map(|d| {
            event(
                None,
                "transaction",
                now - d * DAY,
                &[
                    ("device_id", "d000001"),
                    ("userid", "ud000001"),
                    ("amount", "1"),
                ],
            )
        })
        .collect();
    evs.push(event(
        None,
        "transaction",
        now,
        &[
            ("device_id", "d000002"),
            ("userid", "ud000002"),
            ("amount", "166.6"),
        ],
    ));
    v.ingest(&evs).await.unwrap();
    let f = v
        .features(
            &[mid("dev_tx_7d"), mid("user_amt_1d")],
            &fields(&[("device_id", "d000001"), ("userid", "ud000002")]),
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        f.values[&mid("dev_tx_7d")],
        json!(5),
        "five transactions in the last 7 days"
    );
    assert_eq!(
        f.values[&mid("user_amt_1d")],
        json!(166.6),
        "the seed's 166.6, exactly"
    );

    // Three users on one device in 30 days (one of them twice), one more on another device.
    let logins = [
        ("u000001", 0),
        ("u000002", 3),
        ("u000001", 10),
        ("u000003", 20),
    ];
    let evs: Vec<EventInput> = logins
        .iter()
        .map(|(u, d)| {
            event(
                None,
                "login",
                now - d * DAY,
                &[("device_id", "d000001"), ("userid", u)],
            )
        })
        .chain(std::iter::once(event(
            None,
            "login",
            now,
            &[("device_id", "d9"), ("userid", "u9")],
        )))
        .collect();
    v.ingest(&evs).await.unwrap();
    let f = v
        .features(
            &[mid("dev_users_30d")],
            &fields(&[("device_id", "d000001")]),
            None,
        )
        .await
        .unwrap();
    assert_eq!(f.values[&mid("dev_users_30d")], json!(3));

    // "Logins in the last hour > 3", for a user with no login yet.
    let rule: RuleId = "too_many_logins".parse().unwrap();
    let login = |ts| {
        event(
            None,
            "login",
            ts,
            &[("userid", "u000777"), ("device_id", "d000001")],
        )
    };
    v.ingest(&[
        login(now - 2 * HOUR),
        login(now - 30 * 60_000),
        login(now - 20 * 60_000),
        login(now),
    ])
    .await
    .unwrap();
    let u = fields(&[("userid", "u000777")]);
    let f = v.features(&[mid("logins_1h")], &u, None).await.unwrap();
    assert_eq!(
        f.values[&mid("logins_1h")],
        json!(3),
        "the one 2 h ago is out of the hour"
    );
    assert!(!v.evaluate_rules(std::slice::from_ref(&rule), &f.numbers)[&rule]);
    let f = v
        .apply_and_read(Some(&login(now_ms())), &[mid("logins_1h")], &u)
        .await
        .unwrap();
    assert_eq!(
        f.values[&mid("logins_1h")],
        json!(4),
        "the event is applied before the read"
    );
    assert!(v.evaluate_rules(std::slice::from_ref(&rule), &f.numbers)[&rule]);
}

pub(super) async fn version_bumps_forget_old_counts(store: Arc<dyn Store>) {
    let v = velocity(store.clone()).await;
    let id = mid("logins");
    let d1 = v
        .put_metric(id.clone(), "COUNT(1h, login) BY userid", None)
        .await
        .unwrap();
    assert_eq!(d1.version, 1);
    let same = v
        .put_metric(id.clone(), "count(1h, login, userid)", None)
        .await
        .unwrap();
    assert_eq!(
        same.version, 1,
        "the same definition, spelt differently, keeps its version"
    );
    let u = fields(&[("userid", "u1")]);
    let e = event(None, "login", now_ms(), &[("userid", "u1")]);
    v.ingest(&[e.clone(), e.clone(), e.clone()]).await.unwrap();
    assert_eq!(
        v.features(std::slice::from_ref(&id), &u, None)
            .await
            .unwrap()
            .values[&id],
        json!(3)
    );

    let d2 = v
        .put_metric(id.clone(), "COUNT(1h, login) BY userid", Some("1m"))
        .await
        .unwrap();
    assert_eq!(d2.version, 2);
    assert_eq!(
        v.features(std::slice::from_ref(&id), &u, None)
            .await
            .unwrap()
            .values[&id],
        json!(0),
        "old counts are gone at once"
    );
    v.ingest(std::slice::from_ref(&e)).await.unwrap();
    assert_eq!(
        v.features(std::slice::from_ref(&id), &u, None)
            .await
            .unwrap()
            .values[&id],
        json!(1)
    );

    v.delete_metric(&id).await.unwrap();
    assert!(
        matches!(v.features(std::slice::from_ref(&id), &u, None).await, Err(VelocityError::Invalid(e)) if e.code == "unknown_metric")
    );
    let d3 = v
        .put_metric(id.clone(), "COUNT(1h, login) BY userid", Some("1m"))
        .await
        .unwrap();
    assert_eq!(
        d3.version, 3,
        "a re-created metric never reuses an old version"
    );
    assert_eq!(
        v.features(std::slice::from_ref(&id), &u, None)
            .await
            .unwrap()
            .values[&id],
        json!(0)
    );

    // Another instance sees the definitions (they live in the store).
    let other = velocity(store).await;
    assert_eq!(other.metric(&id).unwrap().version, 3);
}

pub(super) async fn replays_change_nothing(store: Arc<dyn Store>) {
    let v = velocity(store).await;
    v.put_metric(mid("amt"), "SUM(1d, tx, amount) BY user", None)
        .await
        .unwrap();
    v.put_metric(mid("n"), "COUNT(1d, tx) BY user", None)
        .await
        .unwrap();
    let now = now_ms();
    let batch: Vec<EventInput> = (0..10)
        .map(|i| {
            event(
                Some(&format!("e{i}")),
                "tx",
                now - i * 1000,
                &[("user", "u"), ("amount", "0.0001")],
            )
        })
        .collect();
    let first = v.ingest(&batch).await.unwrap();
    assert_eq!((first.applied, first.duplicates), (20, 0));
    let again = v.ingest(&batch).await.unwrap();
    assert_eq!((again.applied, again.duplicates), (0, 10));
    // Same id, other type: another event.
    let other = v
        .ingest(&[event(Some("e0"), "refund", now, &[("user", "u")])])
        .await
        .unwrap();
    assert_eq!(other.duplicates, 0);
    let f = v
        .features(&[mid("amt"), mid("n")], &fields(&[("user", "u")]), None)
        .await
        .unwrap();
    assert_eq!(f.values[&mid("amt")], json!(0.001));
    assert_eq!(f.values[&mid("n")], json!(10));
}

pub(super) async fn late_future_and_bad_input(store: Arc<dyn Store>) {
    let v = velocity(store).await;
    v.put_metric(mid("short"), "COUNT(1h, tx) BY user", None)
        .await
        .unwrap();
    v.put_metric(mid("long"), "SUM(1d, tx, amount) BY user", None)
        .await
        .unwrap();
    let now = now_ms();
    let u = fields(&[("user", "u")]);
    // 3 h old: late for the hour, still counted by the day.
    let r = v
        .ingest(&[event(
            None,
            "tx",
            now - 3 * HOUR,
            &[("user", "u"), ("amount", "2")],
        )])
        .await
        .unwrap();
    assert_eq!((r.applied, r.late), (1, 0));
    // 2 days old: late for every metric.
    let r = v
        .ingest(&[event(
            None,
            "tx",
            now - 2 * DAY,
            &[("user", "u"), ("amount", "2")],
        )])
        .await
        .unwrap();
    assert_eq!((r.applied, r.late), (0, 1));

    let before = v
        .features(&[mid("short"), mid("long")], &u, None)
        .await
        .unwrap();
    let good = event(None, "tx", now, &[("user", "u"), ("amount", "1")]);
    for (bad, code) in [
        (
            event(None, "tx", now + 6 * 60_000, &[("user", "u")]),
            "event_in_future",
        ),
        (
            event(None, "tx", now, &[("user", "u"), ("amount", "12abc")]),
            "invalid_amount",
        ),
        (
            event(None, "tx", now, &[("user", "u"), ("amount", "1.00001")]),
            "invalid_amount",
        ),
    ] {
        let err = v.ingest(&[good.clone(), bad]).await.unwrap_err();
        assert!(
            matches!(&err, VelocityError::Invalid(e) if e.code == code && e.message.starts_with("events[1].")),
            "{err:?}"
        );
    }
    let many = vec![good.clone(); 1001];
    assert!(
        matches!(v.ingest(&many).await, Err(VelocityError::Invalid(e)) if e.code == "too_many_events")
    );
    assert_eq!(
        v.features(&[mid("short"), mid("long")], &u, None)
            .await
            .unwrap(),
        before,
        "nothing applied"
    );

    // A missing group-by field skips the metric; in a read it is an error naming the field.
    let r = v
        .ingest(&[event(None, "tx", now, &[("amount", "1")])])
        .await
        .unwrap();
    assert_eq!(r.applied, 0);
    let err = v
        .features(&[mid("long")], &fields(&[]), None)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, VelocityError::Invalid(e) if e.code == "missing_field" && e.message.contains("fields.user")),
        "{err:?}"
    );
    // Metrics on another event type are untouched.
    let r = v
        .ingest(&[event(None, "login", now, &[("user", "u")])])
        .await
        .unwrap();
    assert_eq!((r.applied, r.late), (0, 0));
    let _ = EventType::try_from("x".to_owned());
}

pub(super) async fn empty_windows_answer_zero_or_null(store: Arc<dyn Store>) {
    let v = velocity(store).await;
    for (id, expr) in [
        ("c", "COUNT(1h, tx) BY u"),
        ("s", "SUM(1h, tx, amount) BY u"),
        ("a", "AVG(1h, tx, amount) BY u"),
        ("mn", "MIN(1h, tx, amount) BY u"),
        ("mx", "MAX(1h, tx, amount) BY u"),
        ("d", "COUNT_DISTINCT(1h, tx, card) BY u"),
        ("x", "APPROX_COUNT_DISTINCT(1h, tx, card) BY u"),
    ] {
        v.put_metric(mid(id), expr, None).await.unwrap();
    }
    let ids: Vec<MetricId> = ["c", "s", "a", "mn", "mx", "d", "x"]
        .iter()
        .map(|s| mid(s))
        .collect();
    let f = v
        .features(&ids, &fields(&[("u", "nobody")]), None)
        .await
        .unwrap();
    let got: BTreeMap<&str, Json> = f
        .values
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    assert_eq!(
        got,
        BTreeMap::from([
            ("a", Json::Null),
            ("c", json!(0)),
            ("d", json!(0)),
            ("mn", Json::Null),
            ("mx", Json::Null),
            ("s", json!(0)),
            ("x", json!(0)),
        ])
    );
}

pub(super) async fn the_distinct_cap_is_reported(store: Arc<dyn Store>) {
    let v = velocity_with(
        store,
        VelocitySettings {
            distinct_cap: 5,
            ..settings()
        },
    )
    .await;
    v.put_metric(mid("d"), "COUNT_DISTINCT(1h, tx, card) BY u", None)
        .await
        .unwrap();
    let now = now_ms();
    let evs: Vec<EventInput> = (0..8)
        .map(|i| {
            event(
                None,
                "tx",
                now - (8 - i) * 1000,
                &[("u", "u"), ("card", &format!("c{i}"))],
            )
        })
        .collect();
    v.ingest(&evs).await.unwrap();
    let f = v
        .features(&[mid("d")], &fields(&[("u", "u")]), None)
        .await
        .unwrap();
    assert_eq!(
        f.values[&mid("d")],
        json!(5),
        "capped at 5 members, the newest"
    );
    assert_eq!(f.capped, vec![mid("d")]);
}

/// Two instances (two stores on one keyspace, connections of their own) ingest the same
/// events at once, as a risk engine's retry racing its original does: every event counts
/// once, and on one node exactly one of the two is told it was a replay.
async fn a_replay_racing_the_original_on_another_instance(
    a: Arc<dyn Store>,
    b: Arc<dyn Store>,
    per_slot: bool,
) {
    let (va, vb) = (velocity(a).await, velocity(b).await);
    for (id, expr) in [
        ("n", "COUNT(1d, tx) BY user"),
        ("amt", "SUM(1d, tx, amount) BY user"),
        ("dev", "COUNT(1d, tx) BY device"),
    ] {
        va.put_metric(mid(id), expr, None).await.unwrap();
    }
    vb.reload().await;
    let now = now_ms();
    let events: Vec<EventInput> = (0..300)
        .map(|i| {
            event(
                Some(&format!("race-{i}")),
                "tx",
                now - i,
                &[
                    ("user", &format!("u{}", i % 3)),
                    ("device", "d"),
                    ("amount", "1"),
                ],
            )
        })
        .collect();
    let (mut applied, mut dups) = (0, 0);
    for chunk in events.chunks(20) {
        let (x, y) = tokio::join!(va.ingest(chunk), vb.ingest(chunk));
        for o in [x.unwrap(), y.unwrap()] {
            applied += o.applied;
            dups += o.duplicates;
        }
    }
    assert_eq!(
        applied,
        300 * 3,
        "every update exactly once over both instances"
    );
    if !per_slot {
        assert_eq!(dups, 300, "one of the two saw each event as a replay");
    }
    for user in 0..3 {
        let f = va
            .features(
                &[mid("n"), mid("amt"), mid("dev")],
                &fields(&[("user", &format!("u{user}")), ("device", "d")]),
                None,
            )
            .await
            .unwrap();
        assert_eq!(f.values[&mid("n")], json!(100), "u{user}");
        assert_eq!(f.values[&mid("amt")], json!(100));
        assert_eq!(f.values[&mid("dev")], json!(300));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_racing_on_two_instances() {
    let store = memory_store().await;
    a_replay_racing_the_original_on_another_instance(store.clone(), store, false).await;
    let redis = RedisServer::start();
    let prefix = unique_prefix();
    let ids = namelist::store::layout::DEFAULT_EXPECTED_EVENT_IDS;
    let a = redis_at(redis.url(), Vec::new(), &prefix, ids).await;
    let b = redis_at(redis.url(), Vec::new(), &prefix, ids).await;
    a_replay_racing_the_original_on_another_instance(a, b, false).await;
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    let prefix = unique_prefix();
    let a = redis_at(String::new(), cluster.urls(), &prefix, ids).await;
    let b = redis_at(String::new(), cluster.urls(), &prefix, ids).await;
    a_replay_racing_the_original_on_another_instance(a, b, true).await;
}
