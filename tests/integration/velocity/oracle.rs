//! The brute-force oracle (every event kept, each aggregation computed by API.md's window
//! semantics) and the random event streams held to it, on the embedded store and on Redis (the
//! cluster runs them in `redis_cluster_all_cases`).

use crate::common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use common::RedisServer;
use namelist::domain::{MetricId, now_ms};
use namelist::store::Store;
use namelist::store::layout::key_slot;
use namelist::velocity::EventInput;
use proptest::prelude::*;

use super::{event, fields, memory_store, mid, redis_store, velocity};

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
pub(super) struct Ev {
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

pub(super) fn events_strategy() -> impl Strategy<Value = Vec<Ev>> {
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

pub(super) async fn run_case(
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
