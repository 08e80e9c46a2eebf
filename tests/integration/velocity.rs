//! Velocity metrics against a brute-force oracle, on both stores.
//!
//! The oracle keeps every event and computes each aggregation by API.md's window semantics
//! (sub-window `floor(ts/r)`, value at `t` over `[floor(t/r) - W/r + 1, floor(t/r)]`). Random
//! event streams (timestamps, group-by values, amounts with up to 4 decimals, distinct values,
//! repeated ids) go to the service, on the embedded store and on a real redis-server, and every
//! metric is compared at random query times: equal for exact aggregations, within 3 % for
//! APPROX_COUNT_DISTINCT. Then the seeds' examples, version bumps, replays and the listpack
//! encoding of a long stream.

use crate::common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use common::{RedisCluster, RedisServer, unique_prefix};
use namelist::domain::{EventType, MetricId, RuleId, now_ms};
use namelist::lists::FailMode;
use namelist::metrics::Metrics;
use namelist::store::layout::key_slot;
use namelist::store::memory::MemoryStore;
use namelist::store::redis::{RedisOptions, RedisStore};
use namelist::store::{Layout, Store, StoreBase};
use namelist::velocity::{
    EventInput, FieldValue, Fields, Velocity, VelocityError, VelocitySettings,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use serde_json::{Value as Json, json};

fn settings() -> VelocitySettings {
    VelocitySettings {
        read_deadline: Duration::from_secs(2),
        write_deadline: Duration::from_secs(2),
        fail_mode: FailMode::Open,
        distinct_cap: 10_000,
        dedupe_window: std::time::Duration::from_secs(86_400),
    }
}

async fn memory_store() -> Arc<dyn Store> {
    Arc::new(
        MemoryStore::open(Layout::new(unique_prefix(), 16, common::keyed()), 100, None).unwrap(),
    )
}

/// A Redis store on `url` (or the cluster `nodes`) at `prefix`.
async fn redis_at(url: String, nodes: Vec<String>, prefix: &str, ids: u64) -> Arc<RedisStore> {
    let (store, _) = RedisStore::open(RedisOptions {
        cluster_nodes: nodes,
        expected_entries: Some(4000),
        default_expected_entries: 4000,
        response_timeout: Duration::from_secs(5),
        audit_max_len: 100,
        dedupe_expected_ids: ids,
        ..common::redis_options(url, prefix)
    })
    .await
    .unwrap();
    Arc::new(store)
}

async fn redis_store(redis: &RedisServer) -> Arc<dyn Store> {
    let ids = namelist::store::layout::DEFAULT_EXPECTED_EVENT_IDS;
    redis_at(redis.url(), Vec::new(), &unique_prefix(), ids).await
}

async fn cluster_store(cluster: &RedisCluster) -> Arc<dyn Store> {
    let ids = namelist::store::layout::DEFAULT_EXPECTED_EVENT_IDS;
    redis_at(String::new(), cluster.urls(), &unique_prefix(), ids).await
}

async fn velocity(store: Arc<dyn Store>) -> Arc<Velocity> {
    velocity_with(store, settings()).await
}

async fn velocity_with(store: Arc<dyn Store>, settings: VelocitySettings) -> Arc<Velocity> {
    Velocity::new(
        store.clone(),
        store.clone(),
        store,
        settings,
        Arc::new(Metrics::new()),
    )
    .await
    .unwrap()
}

fn fields(pairs: &[(&str, &str)]) -> Fields {
    pairs
        .iter()
        .map(|(k, v)| {
            let v = if v.parse::<f64>().is_ok() {
                FieldValue::Number(v.to_string())
            } else {
                FieldValue::Text(v.to_string())
            };
            (k.to_string(), v)
        })
        .collect()
}

fn event(id: Option<&str>, ty: &str, ts: i64, f: &[(&str, &str)]) -> EventInput {
    EventInput {
        id: id.map(str::to_owned),
        event_type: ty.parse().unwrap(),
        ts: Some(ts),
        fields: fields(f),
    }
}

fn mid(s: &str) -> MetricId {
    s.parse().unwrap()
}

// ---------- the oracle ----------

/// The metrics of the random streams: (id, expression, resolution).
const METRICS: &[(&str, &str, &str)] = &[
    ("c1h", "COUNT(1h, tx) BY device", "1m"),
    ("s10m", "SUM(10m, tx, amount) BY user", "20s"),
    ("a1d", "AVG(1d, tx, amount) BY user", "1h"),
    ("mn1h", "MIN(1h, tx, amount) BY device", "5m"),
    ("mx1h", "MAX(1h, tx, amount) BY device, user", "2m"),
    ("d1h", "COUNT_DISTINCT(1h, tx, device, user)", "10m"),
    ("x1h", "APPROX_COUNT_DISTINCT(1h, tx, card) BY device", "1m"),
];

#[derive(Debug, Clone)]
struct Ev {
    id: Option<u8>,
    ts: i64,
    device: u8,
    user: u8,
    /// Scaled by 10^4.
    amount: i64,
    card: u16,
}

/// The oldest timestamp a metric of window `w` and resolution `r` still takes at `now`.
fn late_boundary(w: i64, r: i64, now: i64) -> i64 {
    (now.div_euclid(r) - w / r + 1) * r
}

/// What the oracle expects: exact numbers for exact aggregations (`None` = null). Events
/// late for the metric at ingestion (`now`) are not counted.
#[allow(clippy::too_many_arguments)]
fn oracle(
    id: &str,
    expr_window_ms: i64,
    res_ms: i64,
    events: &[Ev],
    device: u8,
    user: u8,
    at: i64,
    now: i64,
) -> Option<f64> {
    let n = expr_window_ms / res_ms;
    let hi = at.div_euclid(res_ms);
    let lo = hi - n + 1;
    let oldest = late_boundary(expr_window_ms, res_ms, now);
    let inw: Vec<&Ev> = events
        .iter()
        .filter(|e| {
            let s = e.ts.div_euclid(res_ms);
            s >= lo && s <= hi && e.ts >= oldest
        })
        .collect();
    let by_device = |e: &&&Ev| e.device == device;
    let by_user = |e: &&&Ev| e.user == user;
    let scale = 10_000.0;
    match id {
        "c1h" => Some(inw.iter().filter(by_device).count() as f64),
        "s10m" => Some(inw.iter().filter(by_user).map(|e| e.amount).sum::<i64>() as f64 / scale),
        "a1d" => {
            let v: Vec<i64> = inw.iter().filter(by_user).map(|e| e.amount).collect();
            (!v.is_empty()).then(|| v.iter().sum::<i64>() as f64 / v.len() as f64 / scale)
        }
        "mn1h" => inw
            .iter()
            .filter(by_device)
            .map(|e| e.amount)
            .min()
            .map(|m| m as f64 / scale),
        "mx1h" => inw
            .iter()
            .filter(by_device)
            .filter(by_user)
            .map(|e| e.amount)
            .max()
            .map(|m| m as f64 / scale),
        "d1h" => Some(
            inw.iter()
                .filter(by_device)
                .map(|e| e.user)
                .collect::<HashSet<_>>()
                .len() as f64,
        ),
        "x1h" => Some(
            inw.iter()
                .filter(by_device)
                .map(|e| e.card)
                .collect::<HashSet<_>>()
                .len() as f64,
        ),
        _ => unreachable!(),
    }
}

fn amount_text(scaled: i64) -> String {
    let sign = if scaled < 0 { "-" } else { "" };
    let a = scaled.unsigned_abs();
    format!("{sign}{}.{:04}", a / 10_000, a % 10_000)
}

fn events_strategy() -> impl Strategy<Value = Vec<Ev>> {
    // Timestamps up to 75 minutes in the past (so every window has late events and events at
    // its edges), amounts with up to 4 decimals (some negative), a few devices and users so
    // entities repeat, some ids repeated so that duplicates happen.
    prop::collection::vec(
        (
            prop::option::weighted(0.4, 0u8..20),
            0i64..75 * 60_000,
            0u8..3,
            0u8..4,
            -5_000_000i64..50_000_000,
            0u16..400,
        )
            .prop_map(|(id, back, device, user, amount, card)| Ev {
                id,
                ts: -back,
                device,
                user,
                amount,
                card,
            }),
        1..120,
    )
}

async fn run_case(
    store: Arc<dyn Store>,
    per_slot: bool,
    mut evs: Vec<Ev>,
    batch: usize,
    probes: Vec<i64>,
) -> Result<(), TestCaseError> {
    let v = velocity(store.clone()).await;
    let mut windows = HashMap::new();
    let mut versions = HashMap::new();
    for (id, expr, res) in METRICS {
        let d = v.put_metric(mid(id), expr, Some(res)).await.unwrap();
        windows.insert(*id, (d.spec.window_ms, d.spec.resolution_ms));
        versions.insert(*id, d.version);
    }
    let now = now_ms();
    for e in &mut evs {
        e.ts += now;
    }
    // The service decides lateness with its own clock, a moment later: keep events clear of
    // every metric's late boundary for the next seconds, where the two clocks could disagree.
    evs.retain(|e| {
        windows.values().all(|&(w, r)| {
            let (early, late) = (late_boundary(w, r, now), late_boundary(w, r, now + 5_000));
            e.ts < early - 2_000 || e.ts > late + 2_000
        })
    });
    if evs.is_empty() {
        return Ok(());
    }
    let inputs: Vec<EventInput> = evs
        .iter()
        .map(|e| {
            let id = e.id.map(|i| format!("ev-{i}"));
            let (d, u, a, c) = (
                format!("d{}", e.device),
                format!("u{}", e.user),
                amount_text(e.amount),
                format!("card-{}", e.card),
            );
            event(
                id.as_deref(),
                "tx",
                e.ts,
                &[("device", &d), ("user", &u), ("amount", &a), ("card", &c)],
            )
        })
        .collect();
    // Idempotency is per event id: a reused id applies only the first time it reaches the
    // store with an update that is not late; later events with the id are replays, whatever
    // they hold. On a cluster it is per (id, slot): the store remembers the event in each
    // slot its updates' keys live in (`layout`, *Event ids*).
    let layout = store.layout().clone();
    let place = |id: &str, e: &Ev| -> Option<u16> {
        let (d, u) = (format!("d{}", e.device), format!("u{}", e.user));
        let values: Vec<&str> = match id {
            "c1h" | "mn1h" | "d1h" | "x1h" => vec![&d],
            "s10m" | "a1d" => vec![&u],
            _ => vec![&d, &u],
        };
        per_slot.then(|| key_slot(layout.metric_key(id, versions[id], &values).as_bytes()))
    };
    let mut applied: HashMap<&str, Vec<Ev>> = HashMap::new();
    let mut seen: HashSet<(u8, Option<u16>)> = HashSet::new();
    let mut expected_dups = 0;
    for e in &evs {
        let (mut updates, mut replays) = (0, 0);
        let mut first_here = Vec::new();
        for (id, _, _) in METRICS {
            let (w, r) = windows[id];
            if e.ts < late_boundary(w, r, now) {
                continue;
            }
            updates += 1;
            let at = place(id, e);
            match e.id {
                Some(i) if seen.contains(&(i, at)) => replays += 1,
                _ => {
                    applied.entry(id).or_default().push(e.clone());
                    if let Some(i) = e.id {
                        first_here.push((i, at));
                    }
                }
            }
        }
        // Every update of the event in one place shares one decision.
        seen.extend(first_here);
        if updates > 0 && replays == updates {
            expected_dups += 1;
        }
    }
    let mut dups = 0;
    for chunk in inputs.chunks(batch.max(1)) {
        dups += v.ingest(chunk).await.unwrap().duplicates;
    }
    prop_assert_eq!(
        dups,
        expected_dups,
        "events whose every update was a replay"
    );

    // Queries at the present and at later times (up to 75 minutes on), where the windows have
    // slid over the events: every sub-window boundary gets crossed somewhere.
    let ats: Vec<i64> = std::iter::once(now_ms())
        .chain(probes.iter().map(|p| now + p.rem_euclid(75 * 60_000)))
        .collect();
    let ids: Vec<MetricId> = METRICS.iter().map(|(id, _, _)| mid(id)).collect();
    for at in ats {
        for device in 0..3u8 {
            for user in 0..4u8 {
                let f = fields(&[
                    ("device", &format!("d{device}")),
                    ("user", &format!("u{user}")),
                ]);
                let got = v.features(&ids, &f, Some(at)).await.unwrap();
                for (id, _, _) in METRICS {
                    let (w, r) = windows[id];
                    let events = applied.get(id).map_or(&[][..], Vec::as_slice);
                    let want = oracle(id, w, r, events, device, user, at, now);
                    let have = got.numbers[&mid(id)];
                    let ok = match (want, have) {
                        (None, None) => true,
                        (Some(a), Some(b)) if *id == "x1h" => (a - b).abs() <= (a * 0.03).max(1.0),
                        (Some(a), Some(b)) => (a - b).abs() <= 1e-9 * a.abs().max(1.0),
                        _ => false,
                    };
                    prop_assert!(
                        ok,
                        "{} for d{} u{} at {}: oracle {:?}, service {:?} ({} events)",
                        id,
                        device,
                        user,
                        at,
                        want,
                        have,
                        events.len()
                    );
                }
            }
        }
    }
    Ok(())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn oracle_on_the_embedded_store(evs in events_strategy(), batch in 1usize..50, probes in prop::collection::vec(0i64..i64::MAX, 6)) {
        let rt = runtime();
        rt.block_on(async { run_case(memory_store().await, false, evs, batch, probes).await })?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn oracle_on_redis(evs in events_strategy(), batch in 1usize..50, probes in prop::collection::vec(0i64..i64::MAX, 6)) {
        let rt = runtime();
        let redis = RedisServer::start();
        rt.block_on(async { run_case(redis_store(&redis).await, false, evs, batch, probes).await })?;
    }
}

// ---------- behaviours on both stores ----------

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;

async fn the_seeds_examples(store: Arc<dyn Store>) {
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

async fn version_bumps_forget_old_counts(store: Arc<dyn Store>) {
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

async fn replays_change_nothing(store: Arc<dyn Store>) {
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

async fn late_future_and_bad_input(store: Arc<dyn Store>) {
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

async fn empty_windows_answer_zero_or_null(store: Arc<dyn Store>) {
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

async fn the_distinct_cap_is_reported(store: Arc<dyn Store>) {
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

macro_rules! on_both_stores {
    ($($case:ident),* $(,)?) => {
        mod memory_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::memory_store().await).await;
                }
            )*
        }
        mod redis_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let redis = super::RedisServer::start();
                    super::$case(super::redis_store(&redis).await).await;
                }
            )*
        }
        /// Every case, and oracle streams, on one local 6-node cluster.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn redis_cluster_all_cases() {
            let cluster = tokio::task::block_in_place(RedisCluster::start);
            $(
                eprintln!("cluster: {}", stringify!($case));
                $case(cluster_store(&cluster).await).await;
            )*
            let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
                cases: 8,
                failure_persistence: None,
                ..ProptestConfig::default()
            });
            let strategy = (events_strategy(), 1usize..50, prop::collection::vec(0i64..i64::MAX, 6));
            for _ in 0..8 {
                let (evs, batch, probes) = strategy.new_tree(&mut runner).unwrap().current();
                run_case(cluster_store(&cluster).await, true, evs, batch, probes).await.unwrap();
            }
        }
    };
}

on_both_stores!(
    the_seeds_examples,
    version_bumps_forget_old_counts,
    replays_change_nothing,
    late_future_and_bad_input,
    empty_windows_answer_zero_or_null,
    the_distinct_cap_is_reported,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_stream_keeps_hashes_listpacks() {
    let redis = RedisServer::start();
    let store = redis_store(&redis).await;
    let v = velocity(store.clone()).await;
    let def = v
        .put_metric(mid("per_min"), "COUNT(1h, tx) BY device", Some("1m"))
        .await
        .unwrap();
    let avg = v
        .put_metric(mid("avg_min"), "AVG(1h, tx, amount) BY device", Some("1m"))
        .await
        .unwrap();
    let now = now_ms();
    // Three hours of events, oldest first, one every 10 s: 1,080 events over 180 minutes.
    let evs: Vec<EventInput> = (0..1080)
        .map(|i| {
            event(
                None,
                "tx",
                now - 3 * HOUR + i * 10_000,
                &[("device", "d1"), ("amount", "1.5")],
            )
        })
        .collect();
    for chunk in evs.chunks(100) {
        v.ingest(chunk).await.unwrap();
    }
    let mut conn = redis.conn();
    // A hash's length is looked at on one update in eight: a few sub-windows more at most.
    for (d, max_fields) in [(&def, 64), (&avg, 128)] {
        let key = store.layout().metric_key(d.id.as_str(), d.version, &["d1"]);
        let enc: String = redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg(&key)
            .query(&mut conn)
            .unwrap();
        assert_eq!(enc, "listpack", "{}", d.id);
        let len: usize = redis::cmd("HLEN").arg(&key).query(&mut conn).unwrap();
        assert!(
            len <= max_fields,
            "{}: {len} fields: old sub-windows were trimmed",
            d.id
        );
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
        assert!(
            // The window, and the sub-windows events up to 6 minutes ahead could open.
            ttl > 0 && ttl <= HOUR + 9 * 60_000,
            "{}: expires by itself ({ttl} ms)",
            d.id
        );
    }
    let f = v
        .features(&[mid("per_min")], &fields(&[("device", "d1")]), None)
        .await
        .unwrap();
    // The last hour of 10 s events: between 354 and 366 depending on the minute boundary.
    let n = f.values[&mid("per_min")].as_i64().unwrap();
    assert!((354..=366).contains(&n), "{n}");
}

/// Scripts are called by SHA; a flushed script cache (what a Redis restart or failover to a
/// fresh node gives) is reloaded and exactly the calls that did not run are redone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_script_cache_is_reloaded() {
    let redis = RedisServer::start();
    let store = redis_store(&redis).await;
    let v = velocity(store).await;
    v.put_metric(mid("n"), "COUNT(1h, tx) BY device", None)
        .await
        .unwrap();
    v.put_metric(mid("users"), "COUNT_DISTINCT(1h, tx, user) BY device", None)
        .await
        .unwrap();
    let now = now_ms();
    let ev = |i: i64| {
        event(
            Some(&format!("e{i}")),
            "tx",
            now - i * 1000,
            &[("device", "d"), ("user", &format!("u{}", i % 3))],
        )
    };
    let mut conn = redis.conn();
    let flush = |conn: &mut redis::Connection| {
        let ok: String = redis::cmd("SCRIPT").arg("FLUSH").query(conn).unwrap();
        assert_eq!(ok, "OK");
    };
    let first = v.ingest(&(0..4).map(ev).collect::<Vec<_>>()).await.unwrap();
    assert_eq!((first.applied, first.duplicates), (8, 0));

    flush(&mut conn);
    // Two new events and two replays, after the flush: the replays are still recognised.
    let second = v.ingest(&(2..6).map(ev).collect::<Vec<_>>()).await.unwrap();
    assert_eq!((second.applied, second.duplicates), (4, 2));

    flush(&mut conn);
    let f = v
        .features(&[mid("n"), mid("users")], &fields(&[("device", "d")]), None)
        .await
        .unwrap();
    assert_eq!(f.values[&mid("n")], json!(6));
    assert_eq!(f.values[&mid("users")], json!(3));
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

/// Event ids cost under 24 B each in Redis, for the whole event whatever its metrics; they
/// are forgotten after the dedupe window (a replay then counts again), and a bucket drops
/// its expired ids as it fills.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_ids_are_compact_and_forgotten() {
    let redis = RedisServer::start();
    let prefix = unique_prefix();
    // 200 ids: one bucket, at the fill the buckets are sized for.
    let store = redis_at(redis.url(), Vec::new(), &prefix, 200).await;
    assert_eq!(store.layout().event_buckets(), 1);
    let v = velocity_with(
        store.clone(),
        VelocitySettings {
            dedupe_window: Duration::from_secs(2),
            ..settings()
        },
    )
    .await;
    for (id, expr) in [
        ("a", "COUNT(1h, tx) BY user"),
        ("b", "SUM(1d, tx, amount) BY user"),
        ("c", "COUNT_DISTINCT(30d, tx, user) BY device"),
        ("d", "MAX(1d, tx, amount) BY device"),
        ("e", "APPROX_COUNT_DISTINCT(1d, tx, device) BY ip"),
    ] {
        v.put_metric(mid(id), expr, None).await.unwrap();
    }
    let batch = |from: usize, to: usize| -> Vec<EventInput> {
        (from..to)
            .map(|i| {
                event(
                    Some(&format!("id-{i}")),
                    "tx",
                    now_ms(),
                    &[
                        ("user", "u"),
                        ("device", "d"),
                        ("ip", "10.0.0.1"),
                        ("amount", "2"),
                    ],
                )
            })
            .collect()
    };
    let first = v.ingest(&batch(0, 200)).await.unwrap();
    assert_eq!((first.applied, first.duplicates), (1000, 0));
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let key = store.layout().event_bucket_key(0, None);
    let (len, bytes, encoding): (u64, u64, String) = redis::pipe()
        .cmd("HLEN")
        .arg(&key)
        .cmd("MEMORY")
        .arg("USAGE")
        .arg(&key)
        .arg("SAMPLES")
        .arg(0)
        .cmd("OBJECT")
        .arg("ENCODING")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        (len, encoding.as_str()),
        (200, "listpack"),
        "one id per event, not per metric"
    );
    assert!(bytes <= 24 * 200, "{bytes} B for 200 ids");
    // Nothing else was kept per id: no key holds anything per event.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(keys.len() < 20, "{keys:?}");

    let again = v.ingest(&batch(0, 200)).await.unwrap();
    assert_eq!(
        (again.applied, again.duplicates),
        (0, 200),
        "replays inside the window"
    );
    tokio::time::sleep(Duration::from_millis(3_100)).await;
    let late = v.ingest(&batch(0, 1)).await.unwrap();
    assert_eq!(
        (late.applied, late.duplicates),
        (5, 0),
        "a replay after the dedupe window counts again"
    );
    // Filling past 256 purges the expired ids (every 32 new ones).
    v.ingest(&batch(200, 320)).await.unwrap();
    let len: u64 = redis::cmd("HLEN")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        len <= 121 + 32,
        "expired ids purged as the bucket filled: {len} left"
    );
    let f = v
        .features(&[mid("a")], &fields(&[("user", "u")]), None)
        .await
        .unwrap();
    assert_eq!(f.values[&mid("a")], json!(321));
}

/// A keyspace made before velocity layout 2 (its meta hash has neither `velocity` nor
/// `event_buckets`) keeps its metric keys, so counts written before an upgrade are read
/// after it; a new keyspace records layout 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyspace_made_before_layout_2_keeps_its_metric_keys() {
    let redis = RedisServer::start();
    let prefix = unique_prefix();
    let ids = namelist::store::layout::DEFAULT_EXPECTED_EVENT_IDS;
    let store = redis_at(redis.url(), Vec::new(), &prefix, ids).await;
    assert_eq!(store.layout().velocity(), 2, "a new keyspace");
    let mut conn = redis.conn();
    let meta = format!("{prefix}meta");
    let recorded: (u32, u32) = redis::cmd("HMGET")
        .arg(&meta)
        .arg("velocity")
        .arg("event_buckets")
        .query(&mut conn)
        .unwrap();
    assert_eq!(recorded, (2, store.layout().event_buckets()));
    // What an older build left: no velocity fields, counts under layout 1 keys.
    let _: () = redis::cmd("HDEL")
        .arg(&meta)
        .arg("velocity")
        .arg("event_buckets")
        .query(&mut conn)
        .unwrap();
    let old = redis_at(redis.url(), Vec::new(), &prefix, ids).await;
    assert_eq!(
        old.layout().velocity(),
        1,
        "an older keyspace keeps layout 1"
    );
    let v = velocity(old.clone()).await;
    let def = v
        .put_metric(mid("n"), "COUNT(1h, tx) BY user", None)
        .await
        .unwrap();
    let key = old.layout().metric_key("n", def.version, &["u"]);
    assert!(key.ends_with('}'), "a layout 1 key: {key}");
    let sub = now_ms() / def.spec.resolution_ms;
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg(sub)
        .arg(7)
        .query(&mut conn)
        .unwrap();
    v.ingest(&[event(Some("x"), "tx", now_ms(), &[("user", "u")])])
        .await
        .unwrap();
    let f = v
        .features(&[mid("n")], &fields(&[("user", "u")]), None)
        .await
        .unwrap();
    assert_eq!(
        f.values[&mid("n")],
        json!(8),
        "the count kept before the upgrade, and one"
    );
    // Reopened, it stays layout 1 (recorded now).
    let again = redis_at(redis.url(), Vec::new(), &prefix, ids).await;
    assert_eq!(again.layout().velocity(), 1);
}
