//! The direct-Redis baseline: the new mix's subjects turned into the exact keys a check
//! reads, each check one pipeline of `HGET`s on one multiplexed connection, from concurrent
//! closed loops or an open loop at a fixed rate.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use namelist::domain::{Dimension, ListName, Sandbox, Value};
use namelist::store::{Layout, PrefixLen};

use crate::common;
use crate::data::Subject;
use crate::generator::Measured;
use crate::settings::{LISTS, PREFIX, Res, SANDBOX, pct_ms};

/// The (bucket key, field) pairs one check of `s` reads, exactly as the service builds them.
fn check_keys(layout: &Layout, registries: &[Vec<PrefixLen>], s: &Subject) -> Vec<(String, i64)> {
    let sandbox: Sandbox = SANDBOX.parse().expect("sandbox");
    let mut keys = Vec::new();
    for (li, list) in LISTS.iter().enumerate() {
        let list: ListName = list.parse().expect("list name");
        for (dim, raw) in &s.values {
            let dimension = Dimension::try_from((*dim).to_owned()).expect("dimension");
            let value = Value::parse_check(&dimension, raw).expect("a valid subject value");
            let mut probe = |v: &Value| {
                let k = layout.entry_key(&list, &dimension, &sandbox, v);
                keys.push((layout.bucket_key(k.bucket), k.field));
            };
            probe(&value);
            if let Some(ip) = value.as_ip() {
                let family = namelist::store::PrefixKind::from(ip.family());
                for len in registries[li].iter().filter(|p| p.kind == family) {
                    probe(&Value::Ip(ip.within(len.len)));
                }
            }
        }
    }
    keys
}

pub(crate) async fn baseline_checks(
    url: &str,
    subjects: &[Subject],
) -> Res<Vec<Vec<(String, i64)>>> {
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let buckets: u32 = redis::cmd("HGET")
        .arg(format!("{PREFIX}meta"))
        .arg("buckets")
        .query_async(&mut conn)
        .await?;
    // The service's key: the baseline reads exactly the fields a check reads.
    let layout = Layout::new(PREFIX, buckets, common::keyed());
    let mut registries = Vec::new();
    for list in LISTS {
        let members: Vec<String> = redis::cmd("SMEMBERS")
            .arg(format!("{PREFIX}p:{list}:{SANDBOX}"))
            .query_async(&mut conn)
            .await?;
        let mut lens: Vec<PrefixLen> = members
            .iter()
            .filter_map(|m| PrefixLen::parse_member(m))
            .collect();
        lens.sort();
        registries.push(lens);
    }
    Ok(subjects
        .iter()
        .map(|s| check_keys(&layout, &registries, s))
        .collect())
}

async fn one_check(
    conn: &mut redis::aio::ConnectionManager,
    keys: &[(String, i64)],
) -> Result<usize, ()> {
    let mut pipe = redis::pipe();
    for (k, f) in keys {
        pipe.cmd("HGET").arg(k).arg(*f);
    }
    match pipe.query_async::<Vec<Option<u32>>>(conn).await {
        Ok(v) if v.len() == keys.len() => Ok(v.iter().filter(|c| c.is_some()).count()),
        _ => Err(()),
    }
}

/// `tasks` concurrent closed loops (rate `None`), or an open loop at `rate` checks/s.
pub(crate) async fn baseline(
    url: &str,
    checks: Arc<Vec<Vec<(String, i64)>>>,
    rate: Option<u64>,
    tasks: usize,
    secs: f64,
) -> Res<Measured> {
    let conn = redis::aio::ConnectionManager::new(redis::Client::open(url)?).await?;
    let started = Instant::now();
    let stop = started + Duration::from_secs_f64(secs);
    let next = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    match rate {
        None => {
            for _ in 0..tasks {
                let (mut conn, checks, next) = (conn.clone(), checks.clone(), next.clone());
                handles.push(tokio::spawn(async move {
                    let mut lat = Vec::new();
                    let mut errors = 0u64;
                    while Instant::now() < stop {
                        let i = next.fetch_add(1, Ordering::Relaxed) % checks.len();
                        let t = Instant::now();
                        if one_check(&mut conn, &checks[i]).await.is_err() {
                            errors += 1;
                        }
                        lat.push(t.elapsed());
                    }
                    (lat, errors)
                }));
            }
        }
        Some(rate) => {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            while Instant::now() < stop {
                tick.tick().await;
                let (mut conn, checks) = (conn.clone(), checks.clone());
                let i = next.fetch_add(1, Ordering::Relaxed) % checks.len();
                handles.push(tokio::spawn(async move {
                    let t = Instant::now();
                    let failed = one_check(&mut conn, &checks[i]).await.is_err();
                    (vec![t.elapsed()], u64::from(failed))
                }));
            }
        }
    }
    let mut lat = Vec::new();
    let mut errors = 0;
    for h in handles {
        let (l, e) = h.await?;
        lat.extend(l);
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64();
    lat.sort_unstable();
    let ok = lat.len() as u64 - errors;
    Ok(Measured {
        rps: ok as f64 / elapsed,
        ok,
        p50_ms: pct_ms(&lat, 0.5),
        p99_ms: pct_ms(&lat, 0.99),
        p999_ms: pct_ms(&lat, 0.999),
        errors,
        statuses: BTreeMap::new(),
    })
}
