//! What only Redis shows: a long stream keeps its hashes listpacks, a flushed script cache is
//! reloaded, event ids compact and forgotten, a keyspace made before velocity layout 2 keeps
//! its metric keys.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{RedisServer, unique_prefix};
use namelist::domain::{ErrorCode, MetricId, now_ms};
use namelist::store::StoreBase;
use namelist::store::redis::RedisStore;
use namelist::velocity::model::MetricDef;
use namelist::velocity::{EventInput, Velocity, VelocityError, VelocitySettings};
use serde_json::json;

use super::{HOUR, event, fields, mid, redis_at, redis_store, settings, velocity, velocity_with};

/// `per_min`: COUNT(1h) of `tx` events by device, and `avg_min`: AVG(1h) of the amounts of
/// `avg_type` events by device, both in sub-windows of a minute.
async fn per_minute(v: &Velocity, avg_type: &str) -> (MetricDef, MetricDef) {
    let count = v
        .put_metric(mid("per_min"), "COUNT(1h, tx) BY device", Some("1m"))
        .await
        .unwrap();
    let expr = format!("AVG(1h, {avg_type}, amount) BY device");
    let avg = v
        .put_metric(mid("avg_min"), &expr, Some("1m"))
        .await
        .unwrap();
    (count, avg)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_stream_keeps_hashes_listpacks() {
    let redis = RedisServer::start();
    let store = redis_store(&redis).await;
    let v = velocity(store.clone()).await;
    let (def, avg) = per_minute(&v, "tx").await;
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

/// An entity written for longer than its window holds sub-windows that left it: the update
/// that looks at the hash's length (one in eight) trims them by their field names. Hours of
/// old sub-windows are planted (events are never older than the window, so only time makes
/// them), then 16 updates in one call, so one of them trims: the call succeeds (a local of
/// the script once shadowed `math.floor`, and every trim failed the whole call), the old
/// fields are gone and the count is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_sub_windows_are_trimmed() {
    let redis = RedisServer::start();
    let store = redis_store(&redis).await;
    let v = velocity(store.clone()).await;
    // Apart event types: each call below updates only one of the two hashes.
    let (count, avg) = per_minute(&v, "ty").await;
    let now = now_ms();
    let present = now / 60_000;
    let mut conn = redis.conn();
    for (d, ty, width) in [(&count, "tx", 1), (&avg, "ty", 2)] {
        let key = store.layout().metric_key(d.id.as_str(), d.version, &["d1"]);
        // Three hours ago to an hour ago: 120 sub-windows the window no longer reads.
        for sub in present - 180..present - 60 {
            for f in 0..width {
                let _: () = redis::cmd("HSET")
                    .arg(&key)
                    .arg(sub * width + f)
                    .arg(1)
                    .query(&mut conn)
                    .unwrap();
            }
        }
        let evs: Vec<EventInput> = (0..16)
            .map(|i| {
                event(
                    None,
                    ty,
                    now - i * 1000,
                    &[("device", "d1"), ("amount", "2")],
                )
            })
            .collect();
        let out = v.ingest(&evs).await.expect("a call that trims succeeds");
        assert_eq!(out.applied, 16, "{}", d.id);
        let len: i64 = redis::cmd("HLEN").arg(&key).query(&mut conn).unwrap();
        assert!(
            len <= 2 * width,
            "{}: {len} fields left: the old ones trimmed",
            d.id
        );
        let enc: String = redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg(&key)
            .query(&mut conn)
            .unwrap();
        assert_eq!(enc, "listpack", "{}", d.id);
    }
    let f = v
        .features(
            &[mid("per_min"), mid("avg_min")],
            &fields(&[("device", "d1")]),
            None,
        )
        .await
        .unwrap();
    assert_eq!(f.values[&mid("per_min")].as_i64(), Some(16));
    assert_eq!(f.values[&mid("avg_min")].as_f64(), Some(2.0));
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

/// A keyspace with one bucket of event ids, sized for 50 (it drops its expired ids past 64),
/// and a velocity service on it that remembers ids for 2 s.
async fn one_id_bucket(redis: &RedisServer, prefix: &str) -> (Arc<RedisStore>, Arc<Velocity>) {
    let store = redis_at(redis.url(), Vec::new(), prefix, 50).await;
    assert_eq!(store.layout().event_buckets(), 1);
    let settings = VelocitySettings {
        dedupe_window: Duration::from_secs(2),
        ..settings()
    };
    let v = velocity_with(store.clone(), settings).await;
    (store, v)
}

/// Event ids cost under 24 B each in Redis, for the whole event whatever its metrics; they
/// are forgotten after the dedupe window (a replay then counts again), and a bucket drops
/// its expired ids as it fills.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_ids_are_compact_and_forgotten() {
    let redis = RedisServer::start();
    let prefix = unique_prefix();
    // The test puts 200 ids in the one bucket.
    let (store, v) = one_id_bucket(&redis, &prefix).await;
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
    // Past 64 (1.28 × the 50 it is sized for), the expired ids go (one new id in 25 looks,
    // by its hash).
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

/// A bucket of event ids drops its expired ids once it holds 1.28× the ids it is sized for
/// (64 for a bucket sized for 50), and not before: one new id in 25 (by its hash) looks.
/// The ids are chosen by their keyed hash, so which of them look is known.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_bucket_drops_its_expired_ids_past_its_sizing() {
    let redis = RedisServer::start();
    let (store, v) = one_id_bucket(&redis, &unique_prefix()).await;
    v.put_metric(mid("n"), "COUNT(1h, tx) BY user", None)
        .await
        .unwrap();
    // `velocity::looks_at_fill`, pinned here: one hash in 25.
    let looks = |id: &str| store.layout().event_hash("tx", id).unsigned_abs() % 25 == 0;
    let mut candidates = (0..).map(|i| format!("id-{i}"));
    let mut ids = |n: usize, looking: bool| -> Vec<EventInput> {
        candidates
            .by_ref()
            .filter(|id| looks(id) == looking)
            .take(n)
            .map(|id| event(Some(&id), "tx", now_ms(), &[("user", "u")]))
            .collect()
    };
    let mut conn = redis.conn();
    let key = store.layout().event_bucket_key(0, None);
    let mut len = || -> u64 { redis::cmd("HLEN").arg(&key).query(&mut conn).unwrap() };

    let first = v.ingest(&ids(50, false)).await.unwrap();
    assert_eq!(first.applied, 50);
    tokio::time::sleep(Duration::from_millis(3_100)).await;
    // 62 ids, 50 of them expired: a looking id finds the bucket under 64 and keeps them.
    v.ingest(&ids(11, false)).await.unwrap();
    v.ingest(&ids(1, true)).await.unwrap();
    assert_eq!(
        len(),
        62,
        "under its threshold a bucket keeps its expired ids"
    );
    // 72: the next looking id drops the 50 expired ones, and only them.
    v.ingest(&ids(9, false)).await.unwrap();
    v.ingest(&ids(1, true)).await.unwrap();
    assert_eq!(len(), 22, "past 64 the expired ids go");
    let f = v
        .features(&[mid("n")], &fields(&[("user", "u")]), None)
        .await
        .unwrap();
    assert_eq!(f.values[&mid("n")], json!(72));
}

/// A keyspace made before velocity layout 2 (its meta hash has neither `velocity` nor
/// `event_buckets`) keeps its metric keys, so counts written before an upgrade are read
/// after it; a new keyspace records the latest layout (3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyspace_made_before_layout_2_keeps_its_metric_keys() {
    let redis = RedisServer::start();
    let prefix = unique_prefix();
    let ids = namelist::store::layout::DEFAULT_EXPECTED_EVENT_IDS;
    let store = redis_at(redis.url(), Vec::new(), &prefix, ids).await;
    assert_eq!(store.layout().velocity(), 3, "a new keyspace");
    let mut conn = redis.conn();
    let meta = format!("{prefix}meta");
    let recorded: (u32, u32) = redis::cmd("HMGET")
        .arg(&meta)
        .arg("velocity")
        .arg("event_buckets")
        .query(&mut conn)
        .unwrap();
    assert_eq!(recorded, (3, store.layout().event_buckets()));
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

/// A HyperLogLog's sub-window keys are named by the keyspace's recorded layout: three bytes
/// shorter in layout 3 (a new keyspace), as before in a keyspace recorded at layout 2, whose
/// windows written by an older build are read and added to after an upgrade. A keyspace
/// recorded at a layout this build does not know is refused, not misread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hyperloglog_keys_are_named_as_the_keyspace_records() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    let ids = namelist::store::layout::DEFAULT_EXPECTED_EVENT_IDS;
    let expr = "APPROX_COUNT_DISTINCT(1h, tx, device) BY ip";
    // The velocity layout the keyspace at `prefix` records.
    let record = |prefix: &str, layout: u32| {
        let _: () = redis::cmd("HSET")
            .arg(format!("{prefix}meta"))
            .arg("velocity")
            .arg(layout)
            .query(&mut redis.conn())
            .unwrap();
    };
    for layout in [3, 2] {
        let prefix = unique_prefix();
        // Made (and recorded) by this build first.
        redis_at(redis.url(), Vec::new(), &prefix, ids).await;
        if layout == 2 {
            record(&prefix, 2); // what a build before layout 3 recorded
        }
        let store = redis_at(redis.url(), Vec::new(), &prefix, ids).await;
        assert_eq!(store.layout().velocity(), layout);
        let v = velocity(store.clone()).await;
        let def = v.put_metric(mid("d"), expr, None).await.unwrap();
        let now = now_ms();
        for (i, device) in ["a", "b", "a"].into_iter().enumerate() {
            let id = format!("e{i}");
            let e = event(
                Some(&id),
                "tx",
                now,
                &[("ip", "1.2.3.4"), ("device", device)],
            );
            v.ingest(&[e]).await.unwrap();
        }
        let f = v
            .features(&[mid("d")], &fields(&[("ip", "1.2.3.4")]), None)
            .await
            .unwrap();
        assert_eq!(f.values[&mid("d")], json!(2), "layout {layout}");
        let base = store.layout().metric_key("d", def.version, &["1.2.3.4"]);
        let sub = now / def.spec.resolution_ms;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{base}*"))
            .query(&mut conn)
            .unwrap();
        let name = if layout == 2 {
            format!("{base}:{sub}")
        } else {
            store.layout().metric_sub_key(&base, sub)
        };
        assert_eq!(keys, vec![name.clone()], "layout {layout}");
        let suffix = &name[base.len()..];
        assert_eq!(suffix.starts_with(':'), layout == 2, "{name}");
        // Minutes since 1970 (a 1h window's sub-windows): 8 digits, or 4 base64 ones.
        assert_eq!(suffix.len(), if layout == 2 { 9 } else { 4 }, "{name}");
    }
    // A layout from a newer build: refused at start-up.
    let prefix = unique_prefix();
    redis_at(redis.url(), Vec::new(), &prefix, ids).await;
    record(&prefix, 4);
    let opened = RedisStore::open(namelist::store::redis::RedisOptions {
        expected_entries: Some(4000),
        dedupe_expected_ids: ids,
        ..common::redis_options(redis.url(), &prefix)
    })
    .await;
    let err = opened.err().expect("a layout this build does not know");
    assert!(err.to_string().contains("velocity layout 1 to 3"), "{err}");
}

/// An event's updates are one script call however many metrics it feeds. The call's argument
/// is a sequence of values the script unpacks onto Lua's stack (which holds ~8,000) 1,000 at
/// a time: the most metrics an event type may feed by default (256, of every family: ~1,540
/// values) make two parts. Every metric counts the event once, and its replay none; one
/// metric more on that event type is refused and stored nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_feeding_hundreds_of_metrics_is_applied_whole_and_once() {
    let redis = RedisServer::start();
    let store = redis_store(&redis).await;
    let v = velocity(store).await;
    let exprs = [
        "COUNT(1h, tx) BY device",
        "SUM(1d, tx, amount) BY device",
        "AVG(1d, tx, amount) BY device",
        "MIN(1h, tx, amount) BY device",
        "MAX(1h, tx, amount) BY device",
        "COUNT_DISTINCT(1d, tx, user) BY device",
        "APPROX_COUNT_DISTINCT(1d, tx, user) BY device",
    ];
    let expected = [1.0, 2.5, 2.5, 2.5, 2.5, 1.0, 1.0];
    let most = namelist::velocity::DefinitionLimits::default().metrics_per_event;
    assert_eq!(most, 256);
    let ids: Vec<_> = (0..most).map(|i| mid(&format!("m{i}"))).collect();
    for (i, id) in ids.iter().enumerate() {
        v.put_metric(id.clone(), exprs[i % exprs.len()], None)
            .await
            .unwrap();
    }
    let over = v.put_metric(mid("one_more"), exprs[0], None).await;
    let Err(VelocityError::Conflict(e)) = over else {
        panic!("a metric past the event type's limit: {over:?}")
    };
    assert_eq!(e.code, ErrorCode::TooManyDefinitions, "{e}");
    assert!(v.metric(&mid("one_more")).is_err(), "nothing stored");
    let f = [("device", "d1"), ("user", "u1"), ("amount", "2.5")];
    let ev = event(Some("e-1"), "tx", now_ms(), &f);
    let out = v.ingest(std::slice::from_ref(&ev)).await.unwrap();
    assert_eq!((out.applied, out.duplicates), (most as u64, 0));
    let again = v.ingest(&[ev]).await.unwrap();
    assert_eq!((again.applied, again.duplicates), (0, 1), "a replay");
    // A read names at most 64 metrics.
    for (c, chunk) in ids.chunks(64).enumerate() {
        let read = v
            .features(chunk, &fields(&[("device", "d1")]), None)
            .await
            .unwrap();
        for (j, id) in chunk.iter().enumerate() {
            let i = c * 64 + j;
            let got = read.values[id].as_f64();
            assert_eq!(got, Some(expected[i % 7]), "{id}: {}", exprs[i % 7]);
        }
    }
}

/// A burst of definition changes costs every instance a read of each changed definition,
/// not a load of them all per change: the writer reads back what it wrote, and every
/// instance reads the one definition each change message names (`Velocity::refresh`). 64
/// puts at once, a move to another event type, a delete and a rule leave a second instance
/// with exactly the writer's definitions, applying events as the writer does, and the only
/// `HGETALL` that ran is the delete's of the rules (each change made two loads of every
/// definition before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_to_definitions_are_read_one_by_one_on_every_instance() {
    let redis = RedisServer::start();
    let store = redis_store(&redis).await;
    let (a, b) = (velocity(store.clone()).await, velocity(store).await);
    a.put_metric(mid("first"), "COUNT(1h, tx) BY device", None)
        .await
        .unwrap();
    // The first put's message and the subscriptions' first loads land before counting.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let hgetall = redis.command_stat("hgetall", "calls");
    let puts = (0..64).map(|i| {
        let a = a.clone();
        async move {
            let expr = format!("COUNT({}h, tx) BY device", 1 + i % 24);
            a.put_metric(mid(&format!("m{i}")), &expr, None).await
        }
    });
    for put in futures::future::join_all(puts).await {
        put.unwrap();
    }
    a.put_metric(mid("m1"), "COUNT(1h, login) BY device", None)
        .await
        .unwrap();
    a.delete_metric(&mid("m2")).await.unwrap();
    let busy = "busy".parse().unwrap();
    a.put_rule(busy, "m3 > 1 AND m1 > 0").await.unwrap();
    let ids = |v: &Velocity| {
        let mut ms: Vec<_> = v
            .list_metrics()
            .into_iter()
            .map(|m| (m.id, m.version))
            .collect();
        ms.sort();
        ms
    };
    assert_eq!(ids(&a).len(), 64, "first, m0..m63 but m2");
    let waited = std::time::Instant::now();
    while ids(&b) != ids(&a) || b.list_rules().len() != 1 {
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "the second instance heard every change"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Deleting what does not exist reads no rule.
    for _ in 0..10 {
        let gone = a.delete_metric(&mid("never_defined")).await;
        assert!(matches!(gone, Err(VelocityError::NotFound(_))), "{gone:?}");
    }
    assert_eq!(
        redis.command_stat("hgetall", "calls"),
        hgetall + 1,
        "no load of every definition: only the delete's read of the rules"
    );
    // Both apply a login to m1 alone and a transaction to the 63 others.
    let f = [("device", "d1")];
    for (v, name) in [(&a, "e-a"), (&b, "e-b")] {
        let login = v.ingest(&[event(Some(name), "login", now_ms(), &f)]).await;
        assert_eq!(login.unwrap().applied, 1, "{name}");
        let tx = v.ingest(&[event(None, "tx", now_ms(), &f)]).await;
        assert_eq!(tx.unwrap().applied, 63, "{name}");
    }
}

/// The metric store, watched: how many calls of a batch's wave (more updates than one event
/// may make, `max_metrics_per_event`) run at once, at most, and their sizes.
struct Watched {
    inner: Arc<dyn namelist::store::Store>,
    straight: usize,
    now: std::sync::atomic::AtomicUsize,
    most_at_once: std::sync::atomic::AtomicUsize,
    waves: std::sync::Mutex<Vec<usize>>,
}

common::store_base_from_inner!(Watched);

#[async_trait::async_trait]
impl namelist::store::MetricStore for Watched {
    async fn metric_ops(
        &self,
        ops: &[namelist::store::MetricOp],
        deadline: namelist::store::Deadline,
    ) -> namelist::store::StoreResult<Vec<namelist::store::MetricAnswer>> {
        use std::sync::atomic::Ordering::SeqCst;
        if ops.len() <= self.straight {
            return self.inner.metric_ops(ops, deadline).await;
        }
        self.waves.lock().unwrap().push(ops.len());
        let at_once = self.now.fetch_add(1, SeqCst) + 1;
        self.most_at_once.fetch_max(at_once, SeqCst);
        let r = self.inner.metric_ops(ops, deadline).await;
        self.now.fetch_sub(1, SeqCst);
        r
    }
}

/// Batches of events go to the store in waves of whole events, one wave of any batch at a
/// time on an instance, while requests of no more updates than one event may make go
/// straight (`Velocity::in_waves`): four batches of 600 events (4 updates each: 2,400, three
/// waves of at most 1,024) posted at once beside 40 single events and 10 pairs. Every count
/// exact afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_take_turns_in_waves_of_whole_events() {
    let redis = RedisServer::start();
    let store = redis_store(&redis).await;
    let watched = Arc::new(Watched {
        inner: store.clone(),
        straight: namelist::velocity::DefinitionLimits::default().metrics_per_event,
        now: Default::default(),
        most_at_once: Default::default(),
        waves: Default::default(),
    });
    let v = Velocity::new(
        watched.clone(),
        store.clone(),
        store,
        settings(),
        Arc::new(namelist::metrics::Metrics::new()),
    )
    .await
    .unwrap();
    for w in ["1h", "2h", "3h", "4h"] {
        let id = mid(&format!("tx_{w}"));
        v.put_metric(id, &format!("COUNT({w}, tx) BY device"), None)
            .await
            .unwrap();
    }
    let batch = |b: usize| {
        let v = v.clone();
        async move {
            let events: Vec<EventInput> = (0..600)
                .map(|i| {
                    let device = format!("b{b}-{}", i % 10);
                    event(None, "tx", now_ms(), &[("device", &device)])
                })
                .collect();
            v.ingest(&events).await.unwrap().applied
        }
    };
    let single = |i: usize| {
        let v = v.clone();
        async move {
            let e = event(Some(&format!("s{i}")), "tx", now_ms(), &[("device", "s")]);
            v.ingest(&[e]).await.unwrap().applied
        }
    };
    let pair = |_| {
        let v = v.clone();
        async move {
            let f = [("device", "p")];
            let two = [
                event(None, "tx", now_ms(), &f),
                event(None, "tx", now_ms(), &f),
            ];
            v.ingest(&two).await.unwrap().applied
        }
    };
    let (batches, singles, pairs) = tokio::join!(
        futures::future::join_all((0..4).map(batch)),
        futures::future::join_all((0..40).map(single)),
        futures::future::join_all((0..10).map(pair)),
    );
    assert_eq!(batches, [2_400; 4]);
    assert_eq!(singles, [4; 40]);
    assert_eq!(pairs, [8; 10]);
    let waves = watched.waves.lock().unwrap().clone();
    assert_eq!(waves.len(), 12, "three waves a batch: {waves:?}");
    assert!(waves.iter().all(|&n| n <= 1_024 && n % 4 == 0), "{waves:?}");
    assert_eq!(
        watched
            .most_at_once
            .load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one wave at a time"
    );
    let ids: Vec<MetricId> = ["1h", "2h", "3h", "4h"]
        .iter()
        .map(|w| mid(&format!("tx_{w}")))
        .collect();
    for (device, n) in [("b0-0", 60.0), ("b3-9", 60.0), ("s", 40.0), ("p", 20.0)] {
        let read = v
            .features(&ids, &fields(&[("device", device)]), None)
            .await
            .unwrap();
        for id in &ids {
            assert_eq!(read.values[id].as_f64(), Some(n), "{device} {id}");
        }
    }
}

/// A metric named many times in one read is read once: a HyperLogLog's window can cost
/// Redis milliseconds (`PFCOUNT` over 30 dense ones: 2 ms), and one request naming it 64
/// times must not cost 64 of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metric_named_many_times_is_read_once() {
    let redis = RedisServer::start();
    let v = velocity(redis_store(&redis).await).await;
    let id = mid("devs_by_ip");
    v.put_metric(
        id.clone(),
        "APPROX_COUNT_DISTINCT(1d, tx, device) BY ip",
        None,
    )
    .await
    .unwrap();
    let f = [("ip", "10.0.0.1"), ("device", "d1")];
    v.ingest(&[event(None, "tx", now_ms(), &f)]).await.unwrap();
    let before = redis.command_stat("pfcount", "calls");
    let named = vec![id.clone(); 64];
    let read = v
        .features(&named, &fields(&[("ip", "10.0.0.1")]), None)
        .await
        .unwrap();
    assert_eq!(read.values[&id].as_f64(), Some(1.0));
    assert_eq!(redis.command_stat("pfcount", "calls") - before, 1);
}

/// Requests of one event each, sent at once, share script calls on one node
/// (`store::redis::coalesce`), and every event still counts once: 400 events with ids from 32
/// tasks, one event a call, 100 of them sent twice at once (a replay racing its original on
/// the same instance, which may put the two in one call). Exact counts, 100 duplicates, and
/// fewer `EVALSHA`s than requests. Without the coalescing it is one call a request (500).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_events_share_calls_and_count_once() {
    let redis = RedisServer::start();
    let store = redis_store(&redis).await;
    let v = velocity(store).await;
    for (id, expr) in [
        ("n", "COUNT(1d, tx) BY user"),
        ("amt", "SUM(1d, tx, amount) BY user"),
        ("dev", "COUNT(1d, tx) BY device"),
    ] {
        v.put_metric(mid(id), expr, None).await.unwrap();
    }
    let now = now_ms();
    let tx = |i: i64| {
        let user = format!("u{}", i % 4);
        let f = [("user", user.as_str()), ("device", "d"), ("amount", "2")];
        event(Some(&format!("co-{i}")), "tx", now - i, &f)
    };
    // Each of the first 100 right after itself: two tasks send the pair at about once.
    let sends: Vec<EventInput> = (0..400)
        .flat_map(|i| {
            if i < 100 {
                vec![tx(i), tx(i)]
            } else {
                vec![tx(i)]
            }
        })
        .collect();
    let sends = Arc::new(sends);
    let before = redis.command_stat("evalsha", "calls");
    let tasks: Vec<_> = (0..32)
        .map(|t| {
            let (v, sends) = (v.clone(), sends.clone());
            tokio::spawn(async move {
                let (mut applied, mut dups) = (0, 0);
                for e in sends.iter().skip(t).step_by(32) {
                    let o = v.ingest(std::slice::from_ref(e)).await.unwrap();
                    applied += o.applied;
                    dups += o.duplicates;
                }
                (applied, dups)
            })
        })
        .collect();
    let (mut applied, mut dups) = (0, 0);
    for t in tasks {
        let (a, d) = t.await.unwrap();
        applied += a;
        dups += d;
    }
    let calls = redis.command_stat("evalsha", "calls") - before;
    println!("500 requests of one event: {calls} script calls");
    assert_eq!(applied, 400 * 3, "every update exactly once");
    assert_eq!(dups, 100, "each replay told it is one");
    for user in 0..4 {
        let entity = fields(&[("user", &format!("u{user}")), ("device", "d")]);
        let f = v
            .features(&[mid("n"), mid("amt"), mid("dev")], &entity, None)
            .await
            .unwrap();
        assert_eq!(f.values[&mid("n")], json!(100), "u{user}");
        assert_eq!(f.values[&mid("amt")], json!(200));
        assert_eq!(f.values[&mid("dev")], json!(400));
    }
    assert!(
        calls < 400,
        "{calls} script calls for 500 requests: they did not share calls"
    );
}
