//! Velocity metrics: how fast events go in, how fast features come out, and what one
//! (metric, entity) costs in Redis next to the seeds' layouts.
//!
//! Starts its own `redis-server` (free port, no persistence, temporary directory), then:
//!
//! 1. **Ingestion**, five metrics on `transaction` (`COUNT(1h) BY device_id`,
//!    `SUM(1d, amount) BY userid`, `AVG(1d, amount) BY userid`,
//!    `COUNT_DISTINCT(30d, userid) BY device_id`, `APPROX_COUNT_DISTINCT(1d, device_id) BY ip`),
//!    events with ids over 10,000 devices, users and IPs, in batches of 100:
//!    * through the library (`Velocity::ingest` on the Redis store), 8 concurrent tasks;
//!    * through HTTP (`POST /v1/events` on the real app, port 0), 4 concurrent clients;
//!
//!    each for `NAMELIST_BENCH_SECS` (default 5) seconds: events/s, metric updates/s and
//!    Redis CPU per event (`INFO cpu` around the run). The figures at the engine's rate and
//!    size (an outside load generator, 200,000 entities, 50 metrics, `POST /v1/evaluate`,
//!    memory per event id) are `benches/velocity_engine.sh`'s, which `cargo bench --bench
//!    load` runs.
//! 2. **Feature latency**, three metrics (COUNT, SUM, AVG) of a random device and user:
//!    `POST /v1/features` sequentially and from 8 concurrent clients, and the library call
//!    `Velocity::features` the same two ways: p50 / p99 / max.
//! 3. **Memory per (metric, entity)**: `MEMORY USAGE key SAMPLES 0` summed over the keys of
//!    `NAMELIST_BENCH_ENTITIES` (default 10,000) entities and averaged, for
//!    (a) `COUNT(7d) BY device_id` at 1d resolution, one event a day for 7 days, and
//!    (b) `COUNT(1h) BY device_id` at 1m resolution, one event a minute for an hour;
//!    ours (written through `Velocity::ingest`) next to the same events kept
//!    * the seed 000 way: one string key per sub-window,
//!      `$event_type.$device_id.$window_unit.$window_index`, `INCR` + `PEXPIREAT`;
//!    * the seed 003 way: a hash of time slices (`HINCRBY key slice 1`, slices named
//!      `yyyyMMdd` / `yyyyMMddHHmm` as its `ZRANGEBYLEX` needs) plus a sorted set
//!      `keyZSet` of the slice names (`ZADD keyZSet 100 slice`), both with `EXPIRE`;
//!
//!    both written directly with Redis commands here. `MEMORY USAGE` counts a key's name,
//!    object, value and main-dictionary entry (as `sizeof(dictEntry)`), but not the key's
//!    entry in the expires dictionary, the bucket slots of the two dictionaries, nor the
//!    allocator's rounding of the dictEntry. Every layout here gives every key a TTL, so
//!    every key costs more than shown: one key per entity for ours, 7 / 60 for seed 000,
//!    2 for seed 003. The bench measures that per-key overhead on a fresh server
//!    (`INFO memory` `used_memory` around `DEBUG POPULATE` of 100,000 keys, minus their
//!    `MEMORY USAGE`, then around `PEXPIRE` of all of them) and shows both figures.
//!
//! Prints a table, then one JSON line.
//!
//! `cargo bench --bench velocity` (needs `redis-server` on PATH or `$REDIS_SERVER`).

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{RedisServer, redis_cpu_seconds, redis_settings, spawn_app};
use namelist::domain::{MetricId, now_ms};
use namelist::lists::FailMode;
use namelist::metrics::Metrics;
use namelist::startup::open_store;
use namelist::store::Store;
use namelist::velocity::{EventInput, FieldValue, Fields, Velocity, VelocitySettings};
use serde_json::{Value, json};

const MINUTE: i64 = 60_000;
const DAY: i64 = 86_400_000;
const BATCH: usize = 100;
const LIB_TASKS: usize = 8;
const HTTP_CLIENTS: usize = 4;
const LATENCY_CLIENTS: usize = 8;
const LATENCY_REQUESTS: usize = 2_000;
/// Keys of the calibration that measures what `MEMORY USAGE` leaves out.
const CALIBRATION_KEYS: u64 = 100_000;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// A deterministic splitmix64 stream.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

fn device(i: u64) -> String {
    format!("d{i:06}")
}

/// One transaction of random entities (10,000 of each by default).
struct Tx {
    device: String,
    user: String,
    ip: String,
    amount: String,
}

fn random_tx(rng: &mut Rng, entities: u64) -> Tx {
    let ip = rng.below(entities);
    let cents = rng.below(100_000);
    Tx {
        device: device(rng.below(entities)),
        user: format!("u{:06}", rng.below(entities)),
        ip: format!("10.{}.{}.{}", (ip >> 16) & 255, (ip >> 8) & 255, ip & 255),
        amount: format!("{}.{:02}", cents / 100, cents % 100),
    }
}

fn text(s: &str) -> FieldValue {
    FieldValue::Text(s.to_owned())
}

fn tx_event(tx: Tx, id: String) -> EventInput {
    let mut fields = Fields::new();
    fields.insert("device_id".into(), FieldValue::Text(tx.device));
    fields.insert("userid".into(), FieldValue::Text(tx.user));
    fields.insert("ip".into(), FieldValue::Text(tx.ip));
    fields.insert("amount".into(), FieldValue::Number(tx.amount));
    EventInput {
        id: Some(id),
        event_type: "transaction".parse().expect("event type"),
        ts: None,
        fields,
    }
}

fn tx_json(tx: Tx, id: String) -> Value {
    json!({"id": id, "type": "transaction", "fields": {
        "device_id": tx.device, "userid": tx.user, "ip": tx.ip,
        "amount": tx.amount.parse::<f64>().expect("amount")}})
}

/// Percentile of sorted durations, in microseconds.
fn pct(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

#[derive(Default)]
struct Rate {
    events: u64,
    updates: u64,
    errors: u64,
    secs: f64,
    batch_latencies: Vec<Duration>,
    /// Redis's CPU during the run (`INFO cpu` around it).
    redis_cpu_secs: f64,
}

impl Rate {
    fn merge(&mut self, o: Rate) {
        self.events += o.events;
        self.updates += o.updates;
        self.errors += o.errors;
        self.batch_latencies.extend(o.batch_latencies);
    }

    fn json(&mut self) -> Value {
        self.batch_latencies.sort_unstable();
        json!({
            "events_per_sec": self.events as f64 / self.secs,
            "updates_per_sec": self.updates as f64 / self.secs,
            "events": self.events,
            "errors": self.errors,
            "batch_p50_ms": pct(&self.batch_latencies, 0.5) / 1e3,
            "batch_p99_ms": pct(&self.batch_latencies, 0.99) / 1e3,
            "redis_us_per_event": self.redis_cpu_secs / self.events.max(1) as f64 * 1e6,
        })
    }
}

struct Latency {
    samples: Vec<Duration>,
    errors: u64,
}

impl Latency {
    fn json(mut self) -> Value {
        self.samples.sort_unstable();
        json!({
            "n": self.samples.len(),
            "errors": self.errors,
            "p50_us": pct(&self.samples, 0.5),
            "p99_us": pct(&self.samples, 0.99),
            "max_us": pct(&self.samples, 1.0),
        })
    }
}

async fn ingest_library(v: &Arc<Velocity>, entities: u64, secs: u64) -> Rate {
    let end = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let tasks: Vec<_> = (0..LIB_TASKS)
        .map(|t| {
            let v = v.clone();
            tokio::spawn(async move {
                let mut rng = Rng(t as u64 + 1);
                let mut rate = Rate::default();
                let mut n = 0u64;
                while Instant::now() < end {
                    let batch: Vec<EventInput> = (0..BATCH)
                        .map(|_| {
                            n += 1;
                            tx_event(random_tx(&mut rng, entities), format!("L{t}-{n}"))
                        })
                        .collect();
                    let sent = Instant::now();
                    match v.ingest(&batch).await {
                        Ok(o) => {
                            rate.events += BATCH as u64;
                            rate.updates += o.applied;
                        }
                        Err(_) => rate.errors += 1,
                    }
                    rate.batch_latencies.push(sent.elapsed());
                }
                rate
            })
        })
        .collect();
    let mut total = Rate::default();
    for t in tasks {
        total.merge(t.await.expect("ingest task"));
    }
    total.secs = started.elapsed().as_secs_f64();
    total
}

async fn ingest_http(base: &str, entities: u64, secs: u64) -> Rate {
    let end = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let tasks: Vec<_> = (0..HTTP_CLIENTS)
        .map(|t| {
            let url = format!("{base}/v1/events");
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let mut rng = Rng(1000 + t as u64);
                let mut rate = Rate::default();
                let mut n = 0u64;
                while Instant::now() < end {
                    let events: Vec<Value> = (0..BATCH)
                        .map(|_| {
                            n += 1;
                            tx_json(random_tx(&mut rng, entities), format!("H{t}-{n}"))
                        })
                        .collect();
                    let body = json!({ "events": events });
                    let sent = Instant::now();
                    let res = client.post(&url).json(&body).send().await;
                    let outcome = match res {
                        Ok(r) if r.status() == 200 => r.json::<Value>().await.ok(),
                        _ => None,
                    };
                    rate.batch_latencies.push(sent.elapsed());
                    match outcome {
                        Some(o) => {
                            rate.events += BATCH as u64;
                            rate.updates += o["applied"].as_u64().unwrap_or(0);
                        }
                        None => rate.errors += 1,
                    }
                }
                rate
            })
        })
        .collect();
    let mut total = Rate::default();
    for t in tasks {
        total.merge(t.await.expect("http task"));
    }
    total.secs = started.elapsed().as_secs_f64();
    total
}

const FEATURE_METRICS: [&str; 3] = ["dev_tx_1h", "user_amt_1d", "user_avg_1d"];

async fn features_http(base: &str, entities: u64, clients: usize, total: usize) -> Latency {
    let per = total / clients;
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let url = format!("{base}/v1/features");
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let mut rng = Rng(5000 + c as u64);
                let (mut samples, mut errors) = (Vec::with_capacity(per), 0);
                for _ in 0..per {
                    let body = json!({"metrics": FEATURE_METRICS, "fields": {
                        "device_id": device(rng.below(entities)),
                        "userid": format!("u{:06}", rng.below(entities))}});
                    let sent = Instant::now();
                    let ok = match client.post(&url).json(&body).send().await {
                        Ok(r) if r.status() == 200 => r.bytes().await.is_ok(),
                        _ => false,
                    };
                    samples.push(sent.elapsed());
                    if !ok {
                        errors += 1;
                    }
                }
                (samples, errors)
            })
        })
        .collect();
    let mut out = Latency {
        samples: Vec::new(),
        errors: 0,
    };
    for t in tasks {
        let (s, e) = t.await.expect("features task");
        out.samples.extend(s);
        out.errors += e;
    }
    out
}

async fn features_library(v: &Arc<Velocity>, entities: u64, tasks: usize, total: usize) -> Latency {
    let per = total / tasks;
    let ids: Vec<MetricId> = FEATURE_METRICS
        .iter()
        .map(|m| m.parse().expect("metric id"))
        .collect();
    let handles: Vec<_> = (0..tasks)
        .map(|c| {
            let v = v.clone();
            let ids = ids.clone();
            tokio::spawn(async move {
                let mut rng = Rng(9000 + c as u64);
                let (mut samples, mut errors) = (Vec::with_capacity(per), 0);
                for _ in 0..per {
                    let mut fields = Fields::new();
                    fields.insert("device_id".into(), text(&device(rng.below(entities))));
                    fields.insert(
                        "userid".into(),
                        text(&format!("u{:06}", rng.below(entities))),
                    );
                    let sent = Instant::now();
                    let r = v.features(&ids, &fields, None).await;
                    samples.push(sent.elapsed());
                    if r.is_err() {
                        errors += 1;
                    }
                }
                (samples, errors)
            })
        })
        .collect();
    let mut out = Latency {
        samples: Vec::new(),
        errors: 0,
    };
    for h in handles {
        let (s, e) = h.await.expect("features task");
        out.samples.extend(s);
        out.errors += e;
    }
    out
}

// ---- memory ----

/// One memory scenario: a COUNT window of `slots` sub-windows of `r` ms, one event in each.
struct Scenario {
    name: &'static str,
    metric: &'static str,
    expr: &'static str,
    resolution: &'static str,
    event_type: &'static str,
    /// The event type in the seeds' key names.
    seed_event: &'static str,
    r: i64,
    slots: i64,
}

/// (year, month, day) of days since 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Seed 003's time-slice name: `yyyyMMdd` for day slices, `yyyyMMddHHmm` for minute ones.
fn slice_name(ts: i64, r: i64) -> String {
    let (y, m, d) = civil(ts.div_euclid(DAY));
    if r >= DAY {
        format!("{y:04}{m:02}{d:02}")
    } else {
        let in_day = ts.rem_euclid(DAY);
        format!(
            "{y:04}{m:02}{d:02}{:02}{:02}",
            in_day / 3_600_000,
            in_day % 3_600_000 / MINUTE
        )
    }
}

/// `MEMORY USAGE key SAMPLES 0` of every key (0 for a missing one).
fn memory_usage(conn: &mut redis::Connection, keys: &[String]) -> Res<Vec<u64>> {
    let mut out = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(2_000) {
        let mut pipe = redis::pipe();
        for k in chunk {
            pipe.cmd("MEMORY").arg("USAGE").arg(k).arg("SAMPLES").arg(0);
        }
        let sizes: Vec<Option<u64>> = pipe.query(conn)?;
        out.extend(sizes.into_iter().map(Option::unwrap_or_default));
    }
    Ok(out)
}

fn encoding(conn: &mut redis::Connection, key: &str) -> Res<String> {
    Ok(redis::cmd("OBJECT").arg("ENCODING").arg(key).query(conn)?)
}

/// What one layout costs per entity.
struct Cost {
    keys_per_entity: f64,
    bytes_per_entity: f64,
    encoding: String,
}

impl Cost {
    /// With the per-key overhead `MEMORY USAGE` leaves out.
    fn with_uncounted(&self, per_key: f64) -> f64 {
        self.bytes_per_entity + per_key * self.keys_per_entity
    }

    fn json(&self, per_key: f64) -> Value {
        json!({"keys_per_entity": self.keys_per_entity,
               "memory_usage_bytes_per_entity": self.bytes_per_entity,
               "with_uncounted_bytes_per_entity": self.with_uncounted(per_key),
               "encoding": self.encoding})
    }
}

fn used_memory(conn: &mut redis::Connection) -> Res<i64> {
    let info: String = redis::cmd("INFO").arg("memory").query(conn)?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "INFO memory has no used_memory".into())
}

/// Waits until no dictionary of db 0 is being rehashed (an old table would count twice).
fn settle(conn: &mut redis::Connection) -> Res<()> {
    for _ in 0..100 {
        let stats: String = redis::cmd("DEBUG").arg("HTSTATS").arg(0).query(conn)?;
        if !stats.contains("rehashing") {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// What `MEMORY USAGE` leaves out per key, measured on a fresh server: (main dictionary:
/// bucket slot and allocator rounding; expires dictionary: entry and slot).
fn calibrate() -> Res<(f64, f64)> {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    let n = CALIBRATION_KEYS;
    settle(&mut conn)?;
    let before = used_memory(&mut conn)?;
    redis::cmd("DEBUG")
        .arg("POPULATE")
        .arg(n)
        .arg("cal")
        .arg(8)
        .query::<()>(&mut conn)?;
    settle(&mut conn)?;
    let populated = used_memory(&mut conn)?;
    let keys: Vec<String> = (0..n).map(|i| format!("cal:{i}")).collect();
    let counted: u64 = memory_usage(&mut conn, &keys)?.iter().sum();
    redis::cmd("EVAL")
        .arg("for i = 0, tonumber(ARGV[1]) - 1 do redis.call('PEXPIRE', 'cal:' .. i, 86400000) end")
        .arg(0)
        .arg(n)
        .query::<()>(&mut conn)?;
    settle(&mut conn)?;
    let expiring = used_memory(&mut conn)?;
    let main = ((populated - before) as f64 - counted as f64) / n as f64;
    let expires = (expiring - populated) as f64 / n as f64;
    Ok((main, expires))
}

fn cost(conn: &mut redis::Connection, keys: &[String], entities: u64) -> Res<Cost> {
    let sizes = memory_usage(conn, keys)?;
    let present = sizes.iter().filter(|s| **s > 0).count();
    assert_eq!(present, keys.len(), "every key of the layout exists");
    Ok(Cost {
        keys_per_entity: keys.len() as f64 / entities as f64,
        bytes_per_entity: sizes.iter().sum::<u64>() as f64 / entities as f64,
        encoding: encoding(conn, &keys[0])?,
    })
}

/// Ours: the events through `Velocity::ingest` (4 tasks, batches of 1,000, no ids so no
/// markers), then the entity keys measured.
async fn ours(
    v: &Arc<Velocity>,
    store: &Arc<dyn Store>,
    redis: &RedisServer,
    s: &Scenario,
    entities: u64,
) -> Res<(Cost, u64, f64)> {
    let def = v
        .put_metric(s.metric.parse()?, s.expr, Some(s.resolution))
        .await?;
    let started = Instant::now();
    let per_task = entities.div_ceil(4);
    let tasks: Vec<_> = (0..4u64)
        .map(|t| {
            let v = v.clone();
            let event_type = s.event_type;
            let (r, slots) = (s.r, s.slots);
            tokio::spawn(async move {
                let (mut late, mut applied) = (0u64, 0u64);
                let ids: Vec<u64> = (t * per_task..((t + 1) * per_task).min(entities)).collect();
                let per_batch = (1000 / slots as usize).max(1);
                for chunk in ids.chunks(per_batch) {
                    let now = now_ms();
                    let batch: Vec<EventInput> = chunk
                        .iter()
                        .flat_map(|&i| {
                            (0..slots).map(move |k| {
                                let mut fields = Fields::new();
                                fields.insert("device_id".into(), FieldValue::Text(device(i)));
                                EventInput {
                                    id: None,
                                    event_type: event_type.parse().expect("event type"),
                                    ts: Some(now - k * r),
                                    fields,
                                }
                            })
                        })
                        .collect();
                    let o = v.ingest(&batch).await.expect("ingest");
                    late += o.late;
                    applied += o.applied;
                }
                (late, applied)
            })
        })
        .collect();
    let (mut late, mut applied) = (0, 0);
    for t in tasks {
        let (l, a) = t.await?;
        late += l;
        applied += a;
    }
    let secs = started.elapsed().as_secs_f64();
    let keys: Vec<String> = (0..entities)
        .map(|i| {
            store
                .layout()
                .metric_key(s.metric, def.version, &[&device(i)])
        })
        .collect();
    let mut conn = redis.conn();
    let hlen: u64 = redis::cmd("HLEN").arg(&keys[0]).query(&mut conn)?;
    assert_eq!(
        hlen as i64, s.slots,
        "{}: one field per sub-window in {}",
        s.name, keys[0]
    );
    assert_eq!(
        applied + late,
        entities * s.slots as u64,
        "{}: every event applied or late",
        s.name
    );
    Ok((cost(&mut conn, &keys, entities)?, late, secs))
}

/// Seed 000: `$event_type.$device_id.$window_unit.$window_index`, INCR, expiring when the
/// sub-window leaves the window.
fn seed000(redis: &RedisServer, s: &Scenario, entities: u64) -> Res<Cost> {
    let mut conn = redis.conn();
    let now = now_ms();
    let mut keys = Vec::with_capacity((entities as i64 * s.slots) as usize);
    for i in 0..entities {
        for k in 0..s.slots {
            let index = (now - k * s.r).div_euclid(s.r);
            keys.push((
                format!("{}.{}.{}.{index}", s.seed_event, device(i), s.r),
                (index + s.slots) * s.r,
            ));
        }
    }
    for chunk in keys.chunks(5_000) {
        let mut pipe = redis::pipe();
        for (key, expire_at) in chunk {
            pipe.incr(key, 1).ignore();
            pipe.cmd("PEXPIREAT").arg(key).arg(*expire_at).ignore();
        }
        pipe.query::<()>(&mut conn)?;
    }
    let names: Vec<String> = keys.into_iter().map(|(k, _)| k).collect();
    cost(&mut conn, &names, entities)
}

/// Seed 003: a hash of time slices plus the `ZSet` of their names, both with EXPIRE.
fn seed003(redis: &RedisServer, s: &Scenario, entities: u64) -> Res<Cost> {
    let mut conn = redis.conn();
    let now = now_ms();
    let ttl_secs = s.r * s.slots / 1000;
    let mut names = Vec::with_capacity(2 * entities as usize);
    for chunk in (0..entities).collect::<Vec<_>>().chunks(500) {
        let mut pipe = redis::pipe();
        for &i in chunk {
            let key = format!("{}.{}", s.metric, device(i));
            let zkey = format!("{key}ZSet");
            for k in 0..s.slots {
                let slice = slice_name(now - k * s.r, s.r);
                pipe.cmd("HINCRBY").arg(&key).arg(&slice).arg(1).ignore();
                pipe.cmd("ZADD").arg(&zkey).arg(100).arg(&slice).ignore();
            }
            pipe.expire(&key, ttl_secs).ignore();
            pipe.expire(&zkey, ttl_secs).ignore();
            names.push(key);
            names.push(zkey);
        }
        pipe.query::<()>(&mut conn)?;
    }
    let hlen: i64 = redis::cmd("HLEN").arg(&names[0]).query(&mut conn)?;
    assert_eq!(hlen, s.slots, "seed 003: one slice per sub-window");
    let mut cost = cost(&mut conn, &names, entities)?;
    cost.encoding = format!("{} + {}", cost.encoding, encoding(&mut conn, &names[1])?);
    Ok(cost)
}

async fn run(redis: &RedisServer) -> Res<Value> {
    let secs = env_u64("NAMELIST_BENCH_SECS", 5);
    let entities = env_u64("NAMELIST_BENCH_ENTITIES", 10_000);
    let mut settings = redis_settings(redis);
    settings.key_prefix = "vb:".into();
    settings.workers = None;
    let store = open_store(&settings).await?.store;
    let velocity = Velocity::new(
        store.clone(),
        store.clone(),
        store.clone(),
        VelocitySettings {
            read_deadline: Duration::from_millis(settings.check_deadline_ms),
            write_deadline: Duration::from_millis(settings.write_deadline_ms),
            fail_mode: FailMode::Closed,
            distinct_cap: settings.distinct_cap,
            dedupe_window: std::time::Duration::from_secs(86_400),
            limits: namelist::velocity::DefinitionLimits::default(),
        },
        Arc::new(Metrics::new()),
    )
    .await?;
    for (id, expr) in [
        ("dev_tx_1h", "COUNT(1h, transaction) BY device_id"),
        ("user_amt_1d", "SUM(1d, transaction, amount) BY userid"),
        ("user_avg_1d", "AVG(1d, transaction, amount) BY userid"),
        (
            "dev_users_30d",
            "COUNT_DISTINCT(30d, transaction, userid) BY device_id",
        ),
        (
            "ip_devices_1d",
            "APPROX_COUNT_DISTINCT(1d, transaction, device_id) BY ip",
        ),
    ] {
        velocity.put_metric(id.parse()?, expr, None).await?;
    }
    // The app shares the keyspace, so it loads the same definitions.
    let app = spawn_app(settings.clone()).await;

    // Redis's CPU around each run, per event (the app's background work is in it: ~nothing).
    let redis_cpu = || tokio::task::block_in_place(|| redis_cpu_seconds(&redis.url()));
    eprintln!("ingesting through the library for {secs} s...");
    let cpu = redis_cpu();
    let mut lib = ingest_library(&velocity, entities, secs).await;
    lib.redis_cpu_secs = redis_cpu() - cpu;
    eprintln!("ingesting through HTTP for {secs} s...");
    let cpu = redis_cpu();
    let mut http = ingest_http(&app.address, entities, secs).await;
    http.redis_cpu_secs = redis_cpu() - cpu;

    eprintln!("reading features...");
    // Warm-up: connections, scripts, allocator.
    features_http(&app.address, entities, 1, 200).await;
    features_library(&velocity, entities, 1, 200).await;
    let f_http_seq = features_http(&app.address, entities, 1, LATENCY_REQUESTS).await;
    let f_http_conc = features_http(
        &app.address,
        entities,
        LATENCY_CLIENTS,
        LATENCY_REQUESTS * 2,
    )
    .await;
    let f_lib_seq = features_library(&velocity, entities, 1, LATENCY_REQUESTS).await;
    let f_lib_conc =
        features_library(&velocity, entities, LATENCY_CLIENTS, LATENCY_REQUESTS * 2).await;

    let scenarios = [
        Scenario {
            name: "(a) COUNT(7d) BY device_id @1d, 1 event/day x 7",
            metric: "dev_tx_7d",
            expr: "COUNT(7d, mem_tx) BY device_id",
            resolution: "1d",
            event_type: "mem_tx",
            seed_event: "transaction",
            r: DAY,
            slots: 7,
        },
        Scenario {
            name: "(b) COUNT(1h) BY device_id @1m, 1 event/min x 60",
            metric: "dev_login_1h",
            expr: "COUNT(1h, mem_login) BY device_id",
            resolution: "1m",
            event_type: "mem_login",
            seed_event: "login",
            r: MINUTE,
            slots: 60,
        },
    ];
    let (main_uncounted, expires_uncounted) = tokio::task::block_in_place(calibrate)?;
    let per_key = main_uncounted + expires_uncounted;
    let mut memory = Vec::new();
    for s in &scenarios {
        eprintln!("memory {}: ours...", s.name);
        let (our, late, ingest_secs) = ours(&velocity, &store, redis, s, entities).await?;
        eprintln!("memory {}: seed 000, seed 003...", s.name);
        let s000 = tokio::task::block_in_place(|| seed000(redis, s, entities))?;
        let s003 = tokio::task::block_in_place(|| seed003(redis, s, entities))?;
        memory.push((s, our, s000, s003, late, ingest_secs));
    }
    app.stop().await;

    // ---- the table ----
    println!();
    println!(
        "namelist velocity benchmark: {entities} devices/users/IPs, batches of {BATCH}, {} CPUs",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("  ingestion, 5 metrics on `transaction` (events carry ids):");
    println!(
        "    {:<40} {:>10} {:>12} {:>10} {:>10} {:>7} {:>14}",
        "path", "events/s", "updates/s", "p50 ms", "p99 ms", "errors", "Redis us/event"
    );
    let lib_json = lib.json();
    let http_json = http.json();
    for (name, v) in [
        (
            format!("library, {LIB_TASKS} tasks (Velocity::ingest)"),
            &lib_json,
        ),
        (
            format!("HTTP, {HTTP_CLIENTS} clients (POST /v1/events)"),
            &http_json,
        ),
    ] {
        println!(
            "    {:<40} {:>10.0} {:>12.0} {:>10.2} {:>10.2} {:>7} {:>14.1}",
            name,
            v["events_per_sec"].as_f64().unwrap_or(0.0),
            v["updates_per_sec"].as_f64().unwrap_or(0.0),
            v["batch_p50_ms"].as_f64().unwrap_or(0.0),
            v["batch_p99_ms"].as_f64().unwrap_or(0.0),
            v["errors"],
            v["redis_us_per_event"].as_f64().unwrap_or(0.0)
        );
    }
    println!("  feature reads, 3 metrics (COUNT, SUM, AVG) of one device and user:");
    println!(
        "    {:<40} {:>8} {:>10} {:>10} {:>10} {:>7}",
        "path", "n", "p50 us", "p99 us", "max us", "errors"
    );
    let latencies = [
        ("HTTP, sequential", f_http_seq.json()),
        ("HTTP, 8 concurrent clients", f_http_conc.json()),
        ("library, sequential", f_lib_seq.json()),
        ("library, 8 concurrent tasks", f_lib_conc.json()),
    ];
    for (name, v) in &latencies {
        println!(
            "    {:<40} {:>8} {:>10.0} {:>10.0} {:>10.0} {:>7}",
            name,
            v["n"],
            v["p50_us"].as_f64().unwrap_or(0.0),
            v["p99_us"].as_f64().unwrap_or(0.0),
            v["max_us"].as_f64().unwrap_or(0.0),
            v["errors"]
        );
    }
    println!(
        "  memory per (metric, entity), MEMORY USAGE SAMPLES 0 averaged over {entities} entities"
    );
    println!(
        "  (+dict: adding the {per_key:.1} B per key with a TTL that MEMORY USAGE omits, measured: \
         {main_uncounted:.1} B main-dict slot and rounding, {expires_uncounted:.1} B expires entry):"
    );
    let mut memory_json = Vec::new();
    for (s, our, s000, s003, late, ingest_secs) in &memory {
        println!("    {}", s.name);
        println!(
            "      {:<34} {:>6} {:>10} {:>10} {:>10} {:>10}  encoding",
            "layout", "keys", "B/entity", "+dict B", "x ours", "x +dict"
        );
        for (name, c) in [
            ("ours (one hash per entity)", our),
            ("seed 000 (string per sub-window)", s000),
            ("seed 003 (hash + ZSet of slices)", s003),
        ] {
            println!(
                "      {:<34} {:>6.0} {:>10.1} {:>10.1} {:>10.2} {:>10.2}  {}",
                name,
                c.keys_per_entity,
                c.bytes_per_entity,
                c.with_uncounted(per_key),
                c.bytes_per_entity / our.bytes_per_entity,
                c.with_uncounted(per_key) / our.with_uncounted(per_key),
                c.encoding
            );
        }
        println!(
            "      ({} events through Velocity::ingest in {ingest_secs:.1} s, {late} late)",
            entities as i64 * s.slots
        );
        memory_json.push(json!({
            "scenario": s.name,
            "ours": our.json(per_key),
            "seed000": s000.json(per_key),
            "seed003": s003.json(per_key),
            "ratio_seed000_over_ours": s000.bytes_per_entity / our.bytes_per_entity,
            "ratio_seed003_over_ours": s003.bytes_per_entity / our.bytes_per_entity,
            "ratio_seed000_over_ours_with_dict": s000.with_uncounted(per_key) / our.with_uncounted(per_key),
            "ratio_seed003_over_ours_with_dict": s003.with_uncounted(per_key) / our.with_uncounted(per_key),
            "ingest_events_per_sec": (entities as i64 * s.slots) as f64 / ingest_secs,
            "late": late,
        }));
    }
    let [hs, hc, ls, lc] = latencies.map(|(_, v)| v);
    Ok(json!({
        "bench": "velocity",
        "entities": entities,
        "secs": secs,
        "ingest_library": lib_json,
        "ingest_http": http_json,
        "features_http_sequential": hs,
        "features_http_concurrent8": hc,
        "features_library_sequential": ls,
        "features_library_concurrent8": lc,
        "memory": memory_json,
        "memory_usage_omits_per_ttl_key_bytes": {"main_dict": main_uncounted, "expires": expires_uncounted},
    }))
}

fn main() -> Res<()> {
    let redis = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let summary = rt.block_on(run(&redis))?;
    println!("{summary}");
    Ok(())
}
