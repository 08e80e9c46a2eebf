//! `namelist-tools sweep` on real redis-servers: it deletes exactly the expired fields
//! (compare-and-delete, so a refreshed field survives), leaves everything it does not
//! understand alone, is paced, resumes from its checkpoint to the same end state as one full
//! sweep, changes nothing in a dry run, and the binary reports one JSON line. The buckets of
//! remembered event ids are swept in the same walk, counted apart. The same on a local Redis
//! Cluster: every primary walked, resumed across primaries (checkpoint and
//! `--cursor HOST:PORT/CURSOR`), a checkpoint of another topology restarting the walk.

// The root's test helpers (redis-server on free ports, local clusters, the app on port 0),
// shared by path rather than copied.
use crate::common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{RedisCluster, RedisServer};
use namelist::domain::now_ms;
use namelist::store::expiry::EPOCH_2020_MS;
use namelist::store::redis::bulk::compare_and_delete;
use namelist::store::redis::{RedisOptions, RedisStore};
use namelist::store::{Deadline, EntryKey, EntryStore, ExpiryCode, Layout, StoreBase, WriteBatch};
use namelist_tools::sweep::{self, Args, Position, SweepReport};

const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 24 * HOUR_MS;

/// Everything in one database: key -> (type, content). A hash's content is its fields; any
/// other type is its `DUMP`.
type Snapshot = BTreeMap<Vec<u8>, (String, BTreeMap<Vec<u8>, Vec<u8>>)>;

async fn open(redis: &RedisServer, prefix: &str, expected: u64) -> RedisStore {
    let (store, _) = RedisStore::open(RedisOptions {
        expected_entries: Some(expected),
        default_expected_entries: expected,
        connect_timeout: Duration::from_secs(2),
        response_timeout: Duration::from_secs(30),
        audit_max_len: 100,
        ..common::redis_options(redis.url(), prefix)
    })
    .await
    .expect("opening the keyspace");
    store
}

/// The code of an entry expiring at `ms` (whole seconds since 2020, rounded up).
fn code_at(ms: i64) -> u32 {
    u32::try_from((ms - EPOCH_2020_MS + 999).div_euclid(1000)).expect("a code")
}

fn scan_all(conn: &mut redis::Connection, pattern: &str) -> Vec<Vec<u8>> {
    let mut keys = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query(conn)
            .unwrap();
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    keys.sort();
    keys.dedup();
    keys
}

fn snapshot(redis: &RedisServer) -> Snapshot {
    let mut conn = redis.conn();
    let mut out = Snapshot::new();
    for key in scan_all(&mut conn, "*") {
        let kind: String = redis::cmd("TYPE").arg(&key).query(&mut conn).unwrap();
        let content = if kind == "hash" {
            redis::cmd("HGETALL").arg(&key).query(&mut conn).unwrap()
        } else {
            let dump: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut conn).unwrap();
            BTreeMap::from([(Vec::new(), dump)])
        };
        out.insert(key, (kind, content));
    }
    out
}

/// The buckets of the `r:` keyspace (its meta records its creation time: it differs).
fn buckets(redis: &RedisServer) -> Snapshot {
    let mut s = snapshot(redis);
    s.retain(|k, _| k.starts_with(b"r:b:"));
    assert_eq!(s.len(), 100);
    s
}

/// The buckets of event ids of the `r:` keyspace.
fn event_buckets(redis: &RedisServer) -> Snapshot {
    let mut s = snapshot(redis);
    s.retain(|k, _| k.starts_with(b"r:e{"));
    s
}

/// `MEMORY USAGE` of every bucket key of `layout` (absent = 0).
fn bucket_memory(redis: &RedisServer, layout: &Layout) -> BTreeMap<u32, u64> {
    let mut conn = redis.conn();
    (0..layout.buckets())
        .map(|b| {
            let bytes: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(layout.bucket_key(b))
                .arg("SAMPLES")
                .arg(0)
                .query(&mut conn)
                .unwrap();
            (b, bytes.unwrap_or(0))
        })
        .collect()
}

async fn write(store: &RedisStore, entries: &[(EntryKey, u32)]) {
    for chunk in entries.chunks(10_000) {
        store
            .write(
                WriteBatch {
                    entries: chunk.to_vec(),
                    ..WriteBatch::default()
                },
                Deadline::after(Duration::from_secs(10)),
            )
            .await
            .expect("write");
    }
}

/// A deterministic mix of entries as of the sweep time `t` (a whole second in the past) and
/// the real `now`; returns them and which of them a sweep as of `t` must delete.
fn mix(layout: &Layout, n: usize, t: i64, now: i64) -> (Vec<(EntryKey, u32)>, Vec<bool>) {
    let mut entries = Vec::with_capacity(n);
    let mut expired = Vec::with_capacity(n);
    for i in 0..n {
        let key = layout.key_of(format!("entry {i}").as_bytes());
        let (code, gone) = match i % 7 {
            0 => (0, false),                     // never expires
            1 => (code_at(now + DAY_MS), false), // long-lived
            2 => (1, true),                      // 2020-01-01T00:00:01Z
            3 => (code_at(t - HOUR_MS), true),   // expired an hour before t
            4 => (code_at(t), true),             // expires exactly at t: expired
            5 => (code_at(t) + 1, false),        // a second after t: live at t
            _ => (code_at(t + HOUR_MS), false),  // expired by now, not by --now-ms t
        };
        entries.push((key, code));
        expired.push(gone);
    }
    (entries, expired)
}

/// An event id remembered in a bucket of event ids: its bucket's key, the id's hash (the
/// field) and whether a sweep as of `t` must delete it.
struct RememberedId {
    key: String,
    hash: i64,
    expired: bool,
}

/// Writes 300 remembered event ids straight into `layout`'s buckets of event ids
/// (`key_of(hash)`: the bucket the service would use), as the velocity script leaves them:
/// field = the hash, value = an expiry code. Those of one group are all expired at `t` (so
/// their buckets go whole); the others a mix as of the sweep time `t` and the real `now`.
fn remember_ids(
    conn: &mut dyn redis::ConnectionLike,
    layout: &Layout,
    t: i64,
    now: i64,
    key_of: impl Fn(i64) -> String,
) -> Vec<RememberedId> {
    let code = |ms: i64| ExpiryCode::encode(ms).expect("a code").get();
    let n = i64::from(layout.event_buckets());
    let mut ids = Vec::new();
    for group in 0..6i64 {
        for m in 0..50i64 {
            // Multiples of the bucket count apart: a few ids per bucket; negative ones too.
            let hash = if m % 2 == 0 {
                group + n * m
            } else {
                -(group + 1) - n * m
            };
            let (value, expired) = match (group, m % 5) {
                (0, _) => (code(t - HOUR_MS), true),
                (_, 0) => (code(t), true), // expires exactly at t: expired
                (_, 1) => (code(t) + 1, false), // a second after t: live at t
                (_, 2) => (1, true),       // 2020-01-01T00:00:01Z
                (_, 3) => (0, false),      // 0: never, as for entries
                _ => (code(now + DAY_MS), false),
            };
            let key = key_of(hash);
            redis::cmd("HSET")
                .arg(&key)
                .arg(hash)
                .arg(value)
                .query::<()>(conn)
                .unwrap();
            ids.push(RememberedId { key, hash, expired });
        }
    }
    ids
}

/// `snapshot` without the ids a sweep deletes (a bucket left empty is gone); how many.
fn forget_expired(snapshot: &mut Snapshot, ids: &[RememberedId]) -> u64 {
    let mut gone = 0;
    for id in ids.iter().filter(|id| id.expired) {
        let fields = &mut snapshot.get_mut(id.key.as_bytes()).expect(&id.key).1;
        assert!(fields.remove(id.hash.to_string().as_bytes()).is_some());
        gone += 1;
    }
    snapshot.retain(|_, (kind, fields)| kind != "hash" || !fields.is_empty());
    gone
}

/// The distinct buckets of `ids`.
fn id_buckets(ids: &[RememberedId]) -> u64 {
    let keys: std::collections::BTreeSet<&str> = ids.iter().map(|id| id.key.as_str()).collect();
    keys.len() as u64
}

/// The sweep time used by most tests: a whole second one day ago.
fn sweep_time(now: i64) -> i64 {
    (now - DAY_MS) / 1000 * 1000
}

fn args_at(t: i64) -> Args {
    Args {
        now_ms: Some(t),
        max_ops_per_sec: 0,
        ..Args::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_removes_exactly_the_expired_fields_and_nothing_else() {
    let redis = RedisServer::start();
    let prefix = "s:";
    let store = open(&redis, prefix, 2_000).await;
    let layout = store.layout().clone();
    assert_eq!(layout.buckets(), 10);
    let now = now_ms();
    let t = sweep_time(now);
    let (entries, expired) = mix(&layout, 2_100, t, now);
    // Bucket 9 is left to a key of another type.
    let (entries, expired): (Vec<_>, Vec<_>) = entries
        .into_iter()
        .zip(expired)
        .filter(|((k, _), _)| k.bucket != 9)
        .unzip();
    write(&store, &entries).await;

    let mut conn = redis.conn();
    let junk_bucket = layout.bucket_key(3);
    let _: () = redis::cmd("HSET")
        .arg(&junk_bucket)
        .arg("123456")
        .arg("soon") // a value that is not a code
        .arg("not-a-field")
        .arg(1) // a field that is not a fingerprint
        .arg("777")
        .arg("01") // not a canonical code
        .query(&mut conn)
        .unwrap();
    for key in [format!("{prefix}b:99"), format!("{prefix}b:x")] {
        // Match the SCAN pattern, but are not buckets of this keyspace.
        let _: () = redis::cmd("HSET")
            .arg(key)
            .arg("1")
            .arg("1")
            .query(&mut conn)
            .unwrap();
    }
    let _: () = redis::cmd("SET")
        .arg(layout.bucket_key(9))
        .arg("not a hash")
        .query(&mut conn)
        .unwrap();
    // A keyspace whose prefix starts with ours: `s:b:meta` and `s:b:b:0` match `s:b:*`.
    let other = open(&redis, &format!("{prefix}b:"), 400).await;
    let other_key = other.layout().key_of(b"other");
    write(&other, &[(other_key, 1)]).await;

    let before = snapshot(&redis);
    let mut expected = before.clone();
    for ((k, _), gone) in entries.iter().zip(&expired) {
        if *gone {
            let key = layout.bucket_key(k.bucket).into_bytes();
            let fields = &mut expected.get_mut(&key).unwrap().1;
            assert!(fields.remove(k.field.to_string().as_bytes()).is_some());
        }
    }
    let n_expired = expired.iter().filter(|&&g| g).count() as u64;
    assert!(n_expired > 800, "{n_expired}");
    assert_ne!(before, expected);
    let mem_before = bucket_memory(&redis, &layout);

    let report = sweep::sweep(&store, &args_at(t)).await.unwrap();
    let after = snapshot(&redis);
    assert!(
        after == expected,
        "the sweep removed exactly the expired fields"
    );
    let mem_after = bucket_memory(&redis, &layout);

    assert_eq!(report.prefix, prefix);
    assert_eq!(report.now_ms, t);
    assert!(report.done);
    assert_eq!(report.next_cursor, 0);
    assert_eq!(report.buckets_scanned, 9);
    assert_eq!(
        report.keys_skipped, 5,
        "b:99, b:x, b:9 (a string), b:meta, b:b:0"
    );
    assert_eq!(report.fields_scanned, entries.len() as u64 + 3);
    assert_eq!(report.unparseable, 3);
    assert_eq!(report.expired_found, n_expired);
    assert_eq!(report.fields_reclaimed, n_expired);
    assert_eq!(report.skipped_refreshed, 0);
    assert_eq!(report.already_gone, 0);
    let freed: i64 = mem_before
        .iter()
        .map(|(b, &m)| m as i64 - mem_after[b] as i64)
        .sum();
    assert!(freed > 0);
    assert_eq!(report.bytes_freed, freed);
    assert_eq!(
        report.bytes_before as i64 - report.bytes_after as i64,
        freed
    );
    assert!(report.ops > report.buckets_scanned);

    // A second sweep finds nothing and changes nothing.
    let digest = redis.digest();
    let again = sweep::sweep(&store, &args_at(t)).await.unwrap();
    assert_eq!(
        (
            again.expired_found,
            again.fields_reclaimed,
            again.bytes_freed
        ),
        (0, 0, 0)
    );
    assert_eq!(again.fields_scanned, report.fields_scanned - n_expired);
    assert_eq!(redis.digest(), digest);

    // Swept as of the real time, the entries that expired since t go too.
    let real = sweep::sweep(
        &store,
        &Args {
            max_ops_per_sec: 0,
            ..Args::default()
        },
    )
    .await
    .unwrap();
    let since_t = entries
        .iter()
        .zip(&expired)
        .filter(|((_, c), g)| !**g && *c != 0 && i64::from(*c) * 1000 + EPOCH_2020_MS <= now)
        .count() as u64;
    assert!(since_t > 0);
    assert_eq!(real.fields_reclaimed, since_t);
}

/// A prefix holding glob characters is matched literally by the sweep's `SCAN`: every bucket
/// of the keyspace is found (an unescaped `g[1]*:b:*` would match `g1...` keys and none of ours).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_with_glob_characters_is_swept_like_any_other() {
    let redis = RedisServer::start();
    let store = open(&redis, "g[1]*:", 2_000).await;
    let layout = store.layout().clone();
    let now = now_ms();
    let t = sweep_time(now);
    let (entries, expired) = mix(&layout, 500, t, now);
    write(&store, &entries).await;
    let n_expired = expired.iter().filter(|&&g| g).count() as u64;
    assert!(n_expired > 0, "the mix has expired entries");

    let report = sweep::sweep(&store, &args_at(t)).await.unwrap();
    assert_eq!(report.buckets_scanned, u64::from(layout.buckets()));
    assert_eq!(report.expired_found, n_expired, "every bucket was scanned");
    assert_eq!(report.fields_reclaimed, n_expired);
}

/// The buckets of remembered event ids are swept in the walk of the entries' buckets: exactly
/// their expired ids go (a bucket left empty with them), live ones and codes of 0 stay, keys
/// that only look like event buckets are left alone, and the report counts event ids apart
/// from entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_removes_exactly_the_expired_event_ids_and_nothing_else() {
    let redis = RedisServer::start();
    let prefix = "ev:";
    let store = open(&redis, prefix, 2_000).await;
    let layout = store.layout().clone();
    let now = now_ms();
    let t = sweep_time(now);
    let (entries, expired) = mix(&layout, 700, t, now);
    write(&store, &entries).await;
    let n_expired = expired.iter().filter(|&&g| g).count() as u64;

    let mut conn = redis.conn();
    let ids = remember_ids(&mut conn, &layout, t, now, |h| {
        layout.event_bucket_key(h, None)
    });
    // Fields the layout does not write, in a bucket that keeps live ids: left alone.
    let kept = &ids.iter().find(|id| !id.expired).unwrap().key;
    let _: () = redis::cmd("HSET")
        .arg(kept)
        .arg("not-an-id")
        .arg(1)
        .arg("77")
        .arg("01")
        .query(&mut conn)
        .unwrap();
    // Keys that only look like buckets of event ids, each holding an expired-looking field.
    let first = layout.event_bucket_key(0, None);
    let per_slot = layout.event_buckets().div_ceil(16_384);
    let out_of_range = format!("{}{per_slot}", first.strip_suffix('0').unwrap());
    for key in [
        format!("{prefix}e{{notatag}}0"),
        out_of_range, // the right tag, a bucket number past the slot's buckets
        format!("{prefix}e:0"),
    ] {
        assert!(!layout.is_event_bucket(key.as_bytes()), "{key}");
        let _: () = redis::cmd("HSET")
            .arg(&key)
            .arg("5")
            .arg("1")
            .query(&mut conn)
            .unwrap();
    }
    // An event bucket's key holding a string; a key outside the sweep's pattern.
    let string_bucket = layout.event_bucket_key(7, None);
    assert!(ids.iter().all(|id| id.key != string_bucket));
    for key in [string_bucket, format!("{prefix}events")] {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg("not a hash")
            .query(&mut conn)
            .unwrap();
    }

    let before = snapshot(&redis);
    let mut expected = before.clone();
    let ids_expired = forget_expired(&mut expected, &ids);
    assert!(ids_expired > 100, "{ids_expired}");
    assert!(
        ids.iter()
            .any(|id| !expected.contains_key(id.key.as_bytes())),
        "some event bucket held only expired ids"
    );
    for ((k, _), gone) in entries.iter().zip(&expired) {
        if *gone {
            let key = layout.bucket_key(k.bucket).into_bytes();
            let fields = &mut expected.get_mut(&key).unwrap().1;
            assert!(fields.remove(k.field.to_string().as_bytes()).is_some());
        }
    }

    // A dry run counts, and changes nothing.
    let digest = redis.digest();
    let dry = sweep::sweep(
        &store,
        &Args {
            dry_run: true,
            ..args_at(t)
        },
    )
    .await
    .unwrap();
    assert_eq!(redis.digest(), digest);
    assert_eq!(
        (dry.event_ids_expired_found, dry.event_ids_deleted),
        (ids_expired, 0)
    );
    assert_eq!(dry.event_bytes_freed, 0);

    let report = sweep::sweep(&store, &args_at(t)).await.unwrap();
    assert!(
        snapshot(&redis) == expected,
        "the sweep removed exactly the expired ids and entries"
    );
    assert!(report.done);
    assert_eq!(report.event_buckets_scanned, id_buckets(&ids));
    assert_eq!(report.event_ids_scanned, ids.len() as u64 + 2);
    assert_eq!(report.event_ids_unparseable, 2);
    assert_eq!(report.event_ids_expired_found, ids_expired);
    assert_eq!(report.event_ids_deleted, ids_expired);
    assert_eq!(
        (
            report.event_ids_skipped_refreshed,
            report.event_ids_already_gone
        ),
        (0, 0)
    );
    assert!(report.event_bytes_freed > 0);
    assert_eq!(
        report.keys_skipped, 4,
        "e{{notatag}}0, e{{tag}}<out of range>, e:0, an event bucket holding a string"
    );
    // The entries' figures count entries only.
    assert_eq!(report.buckets_scanned, u64::from(layout.buckets()));
    assert_eq!(report.fields_scanned, entries.len() as u64);
    assert_eq!(report.unparseable, 0);
    assert_eq!(report.expired_found, n_expired);
    assert_eq!(report.fields_reclaimed, n_expired);
    assert!(report.table().contains("event ids deleted"));

    // A second sweep finds nothing and changes nothing.
    let digest = redis.digest();
    let again = sweep::sweep(&store, &args_at(t)).await.unwrap();
    assert_eq!(
        (again.event_ids_expired_found, again.event_ids_deleted),
        (0, 0)
    );
    assert_eq!(
        again.event_ids_scanned,
        report.event_ids_scanned - ids_expired
    );
    assert_eq!(redis.digest(), digest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_and_delete_keeps_a_field_refreshed_after_the_scan() {
    let redis = RedisServer::start();
    let store = open(&redis, "c:", 4_000).await;
    let key = store.layout().bucket_key(0);
    let mut sync = redis.conn();
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg(&["1", "1", "2", "1", "3", "1", "4", "1"])
        .query(&mut sync)
        .unwrap();
    // What a scan saw: all four expired (code 1). Then, before the delete, field 2 is
    // refreshed and field 3 deleted by someone else.
    let seen = [("1", "1"), ("2", "1"), ("3", "1")];
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg("2")
        .arg(code_at(now_ms() + DAY_MS))
        .query(&mut sync)
        .unwrap();
    let _: () = redis::cmd("HDEL")
        .arg(&key)
        .arg("3")
        .query(&mut sync)
        .unwrap();

    let mut conn = store.connection();
    let out = compare_and_delete(&mut conn, &key, &seen).await.unwrap();
    assert_eq!((out.deleted, out.refreshed), (1, 1));
    let left: BTreeMap<String, String> = redis::cmd("HGETALL").arg(&key).query(&mut sync).unwrap();
    assert_eq!(
        left,
        BTreeMap::from([
            ("2".to_owned(), code_at(now_ms() + DAY_MS).to_string()),
            ("4".to_owned(), "1".to_owned()),
        ]),
        "the refreshed field survived, the untouched one was not in the call"
    );

    // The script cache flushed (a restart, SCRIPT FLUSH): reloaded on NOSCRIPT.
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut sync).unwrap();
    let out = compare_and_delete(&mut conn, &key, &[("4", "1")])
        .await
        .unwrap();
    assert_eq!((out.deleted, out.refreshed), (1, 0));
    // An emptied bucket disappears.
    let _: () = redis::cmd("HDEL")
        .arg(&key)
        .arg("2")
        .query(&mut sync)
        .unwrap();
    let exists: bool = redis::cmd("EXISTS").arg(&key).query(&mut sync).unwrap();
    assert!(!exists);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_sweep_ends_where_one_full_sweep_does() {
    let now = now_ms();
    let t = sweep_time(now);
    let (full, stepped) = (RedisServer::start(), RedisServer::start());
    let mut stores = Vec::new();
    for redis in [&full, &stepped] {
        let store = open(redis, "r:", 20_000).await;
        let (entries, _) = mix(store.layout(), 12_000, t, now);
        write(&store, &entries).await;
        let layout = store.layout();
        remember_ids(&mut redis.conn(), layout, t, now, |h| {
            layout.event_bucket_key(h, None)
        });
        stores.push(store);
    }
    assert!(buckets(&full) == buckets(&stepped));
    assert!(event_buckets(&full) == event_buckets(&stepped));
    let one = sweep::sweep(&stores[0], &args_at(t)).await.unwrap();
    assert!(one.done && one.fields_reclaimed > 5_000);
    assert!(one.event_ids_deleted > 100);

    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("sweep.json");
    let args = Args {
        scan_count: 10,
        max_batches: Some(2),
        checkpoint: Some(checkpoint.clone()),
        // No checkpoint yet: a new sweep starts.
        resume: true,
        ..args_at(t)
    };
    let first = sweep::sweep(&stores[1], &args).await.unwrap();
    assert!(!first.done);
    assert_ne!(first.next_cursor, 0);
    assert_eq!(first.scan_batches, 2);
    assert!(first.fields_reclaimed < one.fields_reclaimed);
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&checkpoint).unwrap()).unwrap();
    assert_eq!(saved["report"]["next_cursor"], first.next_cursor);
    assert_eq!(saved["report"]["fields_reclaimed"], first.fields_reclaimed);

    // A checkpoint of another keyspace is refused, and left as it was.
    let other = open(&stepped, "zz:", 400).await;
    let err = sweep::sweep(&other, &args).await.unwrap_err();
    assert!(format!("{err:#}").contains("key prefix"), "{err:#}");
    let err = sweep::sweep(
        &stores[1],
        &Args {
            dry_run: true,
            ..args.clone()
        },
    )
    .await
    .unwrap_err();
    assert!(format!("{err:#}").contains("dry-run"), "{err:#}");
    let again: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&checkpoint).unwrap()).unwrap();
    assert_eq!(again, saved);

    let mut last = first;
    let mut runs = 1;
    while !last.done {
        let next = sweep::sweep(&stores[1], &args).await.unwrap();
        assert!(next.scan_batches <= last.scan_batches + 2);
        assert!(next.fields_reclaimed >= last.fields_reclaimed);
        last = next;
        runs += 1;
        assert!(runs < 100, "the resumed sweep never finished");
    }
    assert!(runs >= 3, "{runs} runs");
    assert!(
        !checkpoint.exists(),
        "a finished sweep removes its checkpoint"
    );
    assert!(buckets(&full) == buckets(&stepped));
    assert!(event_buckets(&full) == event_buckets(&stepped));
    let totals = |r: &SweepReport| {
        (
            r.buckets_scanned,
            r.fields_scanned,
            r.expired_found,
            r.fields_reclaimed,
            r.bytes_freed,
        )
    };
    assert_eq!(totals(&last), totals(&one));
    assert_eq!(event_totals(&last), event_totals(&one));

    // By hand: --cursor continues where a stopped run said. On new keyspaces: a store
    // never writes into one flushed under it (it is a lost keyspace).
    drop(stores);
    let mut stores = Vec::new();
    for redis in [&full, &stepped] {
        let _: () = redis::cmd("FLUSHALL").query(&mut redis.conn()).unwrap();
        stores.push(open(redis, "r:", 20_000).await);
    }
    for store in &stores {
        let (entries, _) = mix(store.layout(), 12_000, t, now);
        write(store, &entries).await;
    }
    sweep::sweep(&stores[0], &args_at(t)).await.unwrap();
    let mut cursor = None;
    loop {
        let r = sweep::sweep(
            &stores[1],
            &Args {
                cursor,
                scan_count: 10,
                max_batches: Some(3),
                ..args_at(t)
            },
        )
        .await
        .unwrap();
        if r.done {
            break;
        }
        cursor = Some(r.next_position.parse().unwrap());
    }
    assert!(buckets(&full) == buckets(&stepped));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_changes_nothing() {
    let redis = RedisServer::start();
    let store = open(&redis, "d:", 4_000).await;
    let now = now_ms();
    let t = sweep_time(now);
    let (entries, expired) = mix(store.layout(), 1_400, t, now);
    write(&store, &entries).await;
    let digest = redis.digest();
    let dry = Args {
        dry_run: true,
        ..args_at(t)
    };
    let report = sweep::sweep(&store, &dry).await.unwrap();
    assert_eq!(redis.digest(), digest);
    assert!(report.dry_run && report.done);
    assert_eq!(
        report.expired_found,
        expired.iter().filter(|&&g| g).count() as u64
    );
    assert_eq!((report.fields_reclaimed, report.bytes_freed), (0, 0));
    assert!(report.bytes_before > 0);
    assert_eq!(report.bytes_after, report.bytes_before);

    // A future --now-ms forecasts in a dry run, and is refused otherwise.
    let future = Args {
        now_ms: Some(now + 2 * DAY_MS),
        ..dry.clone()
    };
    let forecast = sweep::sweep(&store, &future).await.unwrap();
    assert_eq!(
        forecast.expired_found,
        entries.iter().filter(|(_, c)| *c != 0).count() as u64
    );
    let err = sweep::sweep(
        &store,
        &Args {
            dry_run: false,
            ..future
        },
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("in the future"), "{err}");
    assert_eq!(redis.digest(), digest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_ops_per_sec_paces_the_commands() {
    let redis = RedisServer::start();
    let store = open(&redis, "p:", 4_000).await;
    let now = now_ms();
    let t = sweep_time(now);
    let (entries, _) = mix(store.layout(), 700, t, now);
    write(&store, &entries).await;
    let rate = 40;
    let started = Instant::now();
    let report = sweep::sweep(
        &store,
        &Args {
            max_ops_per_sec: rate,
            ..args_at(t)
        },
    )
    .await
    .unwrap();
    let elapsed = started.elapsed().as_secs_f64();
    // 10 buckets with expired fields: 4 commands each, plus INFO, SCRIPT LOAD and SCANs.
    assert!(report.ops >= 42, "{}", report.ops);
    let floor = (report.ops - 1) as f64 / f64::from(rate);
    assert!(
        elapsed >= floor,
        "{} commands in {elapsed:.3} s: faster than {rate}/s",
        report.ops
    );
    assert!(
        elapsed < floor + 5.0,
        "{elapsed:.3} s for {floor:.3} s of pacing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_too_big_for_a_listpack_is_swept_in_several_calls() {
    let redis = RedisServer::start();
    let store = open(&redis, "h:", 200).await;
    assert_eq!(store.layout().buckets(), 1);
    let now = now_ms();
    let t = sweep_time(now);
    let (entries, expired) = mix(store.layout(), 5_000, t, now);
    write(&store, &entries).await;
    let key = store.layout().bucket_key(0);
    let encoding: String = redis::cmd("OBJECT")
        .arg("ENCODING")
        .arg(&key)
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(encoding, "hashtable");
    let report = sweep::sweep(&store, &args_at(t)).await.unwrap();
    let n_expired = expired.iter().filter(|&&g| g).count() as u64;
    assert!(n_expired > 1000);
    assert_eq!(report.fields_scanned, 5_000);
    assert_eq!(report.fields_reclaimed, n_expired);
    let left: u64 = redis::cmd("HLEN")
        .arg(&key)
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(left, 5_000 - n_expired);
    assert!(report.bytes_freed > 0);
}

fn tools() -> Command {
    let mut cmd = common::without_namelist_env(env!("CARGO_BIN_EXE_namelist-tools"));
    cmd.env("RUST_LOG", "warn")
        .env("NAMELIST_FINGERPRINT_KEY_FILE", common::key_file());
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_sweeps_and_prints_one_json_line() {
    let redis = RedisServer::start();
    let prefix = "bin:";
    let store = open(&redis, prefix, 4_000).await;
    let now = now_ms();
    let (entries, _) = mix(store.layout(), 1_400, sweep_time(now), now);
    write(&store, &entries).await;
    let expected = entries
        .iter()
        .filter(|(_, c)| *c != 0 && EPOCH_2020_MS + i64::from(*c) * 1000 <= now)
        .count() as u64;

    let out = tools()
        .args(["sweep", "--redis-url", &redis.url(), "--prefix", prefix])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["prefix"], prefix);
    assert_eq!(report["done"], true);
    assert_eq!(report["next_cursor"], 0);
    assert_eq!(report["fields_reclaimed"], expected);
    assert_eq!(report["expired_found"], expected);
    assert!(report["bytes_freed"].as_i64().unwrap() > 0);
    assert_eq!(report["event_ids_deleted"], 0, "no event ids: {report}");
    assert!(stderr.contains("fields reclaimed"), "{stderr}");
    assert!(stderr.contains("event ids deleted"), "{stderr}");

    let help = tools().args(["sweep", "--help"]).output().unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    for needle in ["Safe against a live store", "--max-ops-per-sec", "--resume"] {
        assert!(help.contains(needle), "{needle} not in {help}");
    }

    // CronJob semantics: no Redis, no report, a non-zero exit.
    let mut gone = RedisServer::start();
    let url = gone.url();
    tokio::task::block_in_place(|| gone.kill());
    let out = tools()
        .args(["sweep", "--redis-url", &url, "--prefix", prefix])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
}

/// A timing, not a check: `cargo test --release -p namelist-tools --test integration -- --ignored --nocapture sweep::timing`.
/// 1,000,000 entries (5,000 buckets), 10% expired, swept unpaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn timing_a_million_entries() {
    let n: usize = std::env::var("NAMELIST_SWEEP_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let redis = RedisServer::start();
    let store = open(&redis, "big:", n as u64).await;
    let layout = store.layout().clone();
    let now = now_ms();
    let started = Instant::now();
    let mut expired = 0u64;
    let mut batch = Vec::with_capacity(10_000);
    for i in 0..n {
        // A splitmix-ish spread: 10% expired 1-30 days ago, the rest live for 1-365 days.
        let h = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
        let code = if h.is_multiple_of(10) {
            expired += 1;
            code_at(now - DAY_MS * (1 + (h / 10 % 30) as i64))
        } else {
            code_at(now + DAY_MS * (1 + (h / 10 % 365) as i64))
        };
        batch.push((layout.key_of(format!("bench {i}").as_bytes()), code));
        if batch.len() == 10_000 || i + 1 == n {
            write(&store, &batch).await;
            batch.clear();
        }
    }
    let write_secs = started.elapsed().as_secs_f64();
    let used = |redis: &RedisServer| -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query(&mut redis.conn())
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap()
    };
    let used_before = used(&redis);
    let report = sweep::sweep(
        &store,
        &Args {
            max_ops_per_sec: 0,
            ..Args::default()
        },
    )
    .await
    .unwrap();
    let used_after = used(&redis);
    assert_eq!(report.fields_reclaimed, expired);
    println!(
        "wrote {n} entries in {write_secs:.1} s; swept {} buckets / {} fields, {} expired reclaimed in {:.2} s ({} commands, {:.0} buckets/s); bytes freed {} (MEMORY USAGE), used_memory {} -> {}",
        report.buckets_scanned,
        report.fields_scanned,
        report.fields_reclaimed,
        report.seconds,
        report.ops,
        report.buckets_scanned as f64 / report.seconds,
        report.bytes_freed,
        used_before,
        used_after
    );
    println!("{}", report.table());
}

async fn open_cluster(cluster: &RedisCluster, prefix: &str, expected: u64) -> RedisStore {
    let (store, _) = RedisStore::open(RedisOptions {
        cluster_nodes: cluster.urls(),
        expected_entries: Some(expected),
        default_expected_entries: expected,
        connect_timeout: Duration::from_secs(2),
        response_timeout: Duration::from_secs(30),
        audit_max_len: 100,
        ..common::redis_options(String::new(), prefix)
    })
    .await
    .expect("opening the keyspace on the cluster");
    store
}

/// Everything on every primary, read from each primary directly.
fn cluster_snapshot(cluster: &RedisCluster) -> Snapshot {
    let mut out = Snapshot::new();
    for node in cluster.primaries() {
        let part = snapshot(node);
        for k in part.keys() {
            assert!(!out.contains_key(k), "a key on two primaries");
        }
        out.extend(part);
    }
    out
}

/// The buckets of keyspace `prefix` by bucket number (prefix-independent, so two keyspaces
/// of the same entries compare equal).
fn cluster_buckets(
    cluster: &RedisCluster,
    prefix: &str,
) -> BTreeMap<String, BTreeMap<Vec<u8>, Vec<u8>>> {
    cluster_snapshot(cluster)
        .into_iter()
        .filter_map(|(k, (_, fields))| {
            let rest = k.strip_prefix(prefix.as_bytes())?.strip_prefix(b"b:")?;
            Some((String::from_utf8(rest.to_vec()).unwrap(), fields))
        })
        .collect()
}

fn primaries_digest(cluster: &RedisCluster) -> String {
    cluster
        .primaries()
        .into_iter()
        .map(RedisServer::digest)
        .collect::<Vec<_>>()
        .join(",")
}

fn totals(r: &SweepReport) -> (u64, u64, u64, u64, i64) {
    (
        r.buckets_scanned,
        r.fields_scanned,
        r.expired_found,
        r.fields_reclaimed,
        r.bytes_freed,
    )
}

fn event_totals(r: &SweepReport) -> (u64, u64, u64, u64, i64) {
    (
        r.event_buckets_scanned,
        r.event_ids_scanned,
        r.event_ids_expired_found,
        r.event_ids_deleted,
        r.event_bytes_freed,
    )
}

/// Every cluster scenario on one local 6-node cluster (3 primaries, 3 replicas).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster() {
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    let urls = cluster.urls().join(",");
    let names: Vec<String> = cluster
        .primaries()
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    assert_eq!(names.len(), 3);
    let now = now_ms();
    let t = sweep_time(now);

    // Exactly the expired fields go, on every primary, and nothing else.
    let prefix = "s:";
    let store = open_cluster(&cluster, prefix, 2_000).await;
    let layout = store.layout().clone();
    let (entries, expired) = mix(&layout, 2_100, t, now);
    let (entries, expired): (Vec<_>, Vec<_>) = entries
        .into_iter()
        .zip(expired)
        .filter(|((k, _), _)| k.bucket != 9)
        .unzip();
    write(&store, &entries).await;
    let mut conn = cluster.conn();
    let _: () = redis::cmd("HSET")
        .arg(layout.bucket_key(3))
        .arg("123456")
        .arg("soon")
        .arg("not-a-field")
        .arg(1)
        .arg("777")
        .arg("01")
        .query(&mut conn)
        .unwrap();
    for key in [format!("{prefix}b:99"), format!("{prefix}b:x")] {
        let _: () = redis::cmd("HSET")
            .arg(key)
            .arg("1")
            .arg("1")
            .query(&mut conn)
            .unwrap();
    }
    let _: () = redis::cmd("SET")
        .arg(layout.bucket_key(9))
        .arg("not a hash")
        .query(&mut conn)
        .unwrap();
    let other = open_cluster(&cluster, &format!("{prefix}b:"), 400).await;
    write(&other, &[(other.layout().key_of(b"other"), 1)]).await;
    // Remembered event ids, in the buckets of the slots a cluster puts them in.
    let ids = remember_ids(&mut conn, &layout, t, now, |h| {
        layout.event_bucket_key(h, Some(h.rem_euclid(16_384) as u16))
    });

    let before = cluster_snapshot(&cluster);
    let mut homes: Vec<usize> = (0..10)
        .map(|b| {
            let key = layout.bucket_key(b);
            cluster
                .primaries()
                .iter()
                .position(|n| {
                    // Another primary answers MOVED.
                    redis::cmd("EXISTS")
                        .arg(&key)
                        .query::<bool>(&mut n.conn())
                        .unwrap_or(false)
                })
                .unwrap()
        })
        .collect();
    homes.sort_unstable();
    homes.dedup();
    assert!(homes.len() >= 2, "the buckets spread over the primaries");
    let mut expected = before.clone();
    for ((k, _), gone) in entries.iter().zip(&expired) {
        if *gone {
            let key = layout.bucket_key(k.bucket).into_bytes();
            let fields = &mut expected.get_mut(&key).unwrap().1;
            assert!(fields.remove(k.field.to_string().as_bytes()).is_some());
        }
    }
    let ids_expired = forget_expired(&mut expected, &ids);
    let n_expired = expired.iter().filter(|&&g| g).count() as u64;
    let report = sweep::sweep(&store, &args_at(t)).await.unwrap();
    assert!(
        cluster_snapshot(&cluster) == expected,
        "the sweep removed exactly the expired fields and ids"
    );
    assert_eq!(
        (report.event_buckets_scanned, report.event_ids_deleted),
        (id_buckets(&ids), ids_expired),
        "every primary's buckets of event ids swept"
    );
    assert!(report.done);
    assert_eq!(report.primaries, names);
    assert_eq!(report.primaries_done, 3);
    assert_eq!(
        (report.next_cursor, report.next_position.as_str()),
        (0, "0")
    );
    assert_eq!(report.next_node, None);
    assert_eq!(report.buckets_scanned, 9);
    assert_eq!(report.keys_skipped, 5);
    assert_eq!(report.fields_scanned, entries.len() as u64 + 3);
    assert_eq!(report.unparseable, 3);
    assert_eq!(
        (report.expired_found, report.fields_reclaimed),
        (n_expired, n_expired)
    );
    assert!(report.bytes_freed > 0);
    assert!(report.scan_batches >= 3, "one SCAN per primary at least");
    let digest = primaries_digest(&cluster);
    let again = sweep::sweep(&store, &args_at(t)).await.unwrap();
    assert_eq!((again.expired_found, again.fields_reclaimed), (0, 0));
    assert_eq!(primaries_digest(&cluster), digest);

    // A dry run changes nothing.
    let dry_store = open_cluster(&cluster, "d:", 4_000).await;
    let (dry_entries, dry_expired) = mix(dry_store.layout(), 1_400, t, now);
    write(&dry_store, &dry_entries).await;
    let digest = primaries_digest(&cluster);
    let dry = sweep::sweep(
        &dry_store,
        &Args {
            dry_run: true,
            ..args_at(t)
        },
    )
    .await
    .unwrap();
    assert_eq!(primaries_digest(&cluster), digest);
    assert!(dry.done);
    assert_eq!(
        dry.expired_found,
        dry_expired.iter().filter(|&&g| g).count() as u64
    );
    assert_eq!(dry.fields_reclaimed, 0);

    // Resumed from its checkpoint, across primaries: the end state of one full sweep.
    let fill = |prefix: &'static str| {
        let cluster = &cluster;
        async move {
            let store = open_cluster(cluster, prefix, 20_000).await;
            let (entries, _) = mix(store.layout(), 12_000, t, now);
            write(&store, &entries).await;
            store
        }
    };
    let full = fill("rf:").await;
    let stepped = fill("rs:").await;
    assert!(cluster_buckets(&cluster, "rf:") == cluster_buckets(&cluster, "rs:"));
    let one = sweep::sweep(&full, &args_at(t)).await.unwrap();
    assert!(one.done && one.fields_reclaimed > 5_000);
    assert_eq!(one.buckets_scanned, 100);

    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("sweep.json");
    let args = Args {
        scan_count: 10,
        max_batches: Some(2),
        checkpoint: Some(checkpoint.clone()),
        resume: true,
        ..args_at(t)
    };
    let mut last: Option<SweepReport> = None;
    let mut seen_nodes = Vec::new();
    let mut runs = 0;
    while !last.as_ref().is_some_and(|r| r.done) {
        let r = sweep::sweep(&stepped, &args).await.unwrap();
        runs += 1;
        assert!(runs < 200, "the resumed sweep never finished");
        if let Some(prev) = &last {
            assert!(r.primaries_done >= prev.primaries_done);
            assert!(r.scan_batches <= prev.scan_batches + 2);
        }
        if !r.done {
            let saved: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&checkpoint).unwrap()).unwrap();
            assert_eq!(saved["targets"].as_array().unwrap().len(), 3);
            assert_eq!(saved["report"]["next_position"], r.next_position.as_str());
            let node = r
                .next_node
                .clone()
                .expect("a cluster position names its node");
            assert_eq!(r.next_position, format!("{node}/{}", r.next_cursor));
            assert_eq!(saved["target_index"], r.primaries_done);
            if seen_nodes.last() != Some(&node) {
                seen_nodes.push(node);
            }
        }
        last = Some(r);
    }
    assert_eq!(
        seen_nodes, names,
        "the walk went through every primary in turn"
    );
    assert!(!checkpoint.exists());
    let last = last.unwrap();
    assert_eq!(totals(&last), totals(&one));
    assert!(cluster_buckets(&cluster, "rf:") == cluster_buckets(&cluster, "rs:"));

    // By hand: --cursor HOST:PORT/CURSOR continues where a stopped run said.
    let full = fill("hf:").await;
    let stepped = fill("hs:").await;
    sweep::sweep(&full, &args_at(t)).await.unwrap();
    let mut cursor: Option<Position> = None;
    let mut positions = Vec::new();
    loop {
        let r = sweep::sweep(
            &stepped,
            &Args {
                cursor: cursor.clone(),
                scan_count: 10,
                max_batches: Some(3),
                ..args_at(t)
            },
        )
        .await
        .unwrap();
        if r.done {
            break;
        }
        positions.push(r.next_position.clone());
        cursor = Some(r.next_position.parse().unwrap());
        assert!(positions.len() < 200);
    }
    assert!(
        names
            .iter()
            .all(|n| positions.iter().any(|p| p.starts_with(&format!("{n}/")))),
        "{positions:?}"
    );
    assert!(cluster_buckets(&cluster, "hf:") == cluster_buckets(&cluster, "hs:"));
    // A bare cursor means nothing on a cluster; an address that is not a primary neither.
    let err = sweep::sweep(
        &stepped,
        &Args {
            cursor: Some(Position::Cursor(5)),
            ..args_at(t)
        },
    )
    .await
    .unwrap_err();
    assert!(format!("{err:#}").contains("HOST:PORT/CURSOR"), "{err:#}");
    let err = sweep::sweep(
        &stepped,
        &Args {
            cursor: Some("127.0.0.1:1/5".parse().unwrap()),
            ..args_at(t)
        },
    )
    .await
    .unwrap_err();
    assert!(format!("{err:#}").contains("not a primary"), "{err:#}");

    // A checkpoint of another topology starts the walk over, keeping its totals (binary).
    let full = fill("tf:").await;
    fill("ts:").await;
    sweep::sweep(&full, &args_at(t)).await.unwrap();
    let run = |extra: &[&str]| {
        let out = tools()
            .args(["sweep", "--cluster-nodes", &urls, "--prefix", "ts:"])
            .args(["--max-ops-per-sec", "0", "--now-ms", &t.to_string()])
            .args(["--checkpoint", checkpoint.to_str().unwrap(), "--resume"])
            .args(["--scan-count", "10"])
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        let report: serde_json::Value =
            serde_json::from_str(String::from_utf8(out.stdout).unwrap().trim()).unwrap();
        (report, stderr)
    };
    // Stop somewhere on the second primary.
    loop {
        let (report, _) = run(&["--max-batches", "3"]);
        assert_eq!(report["done"], false, "{report}");
        if report["primaries_done"].as_u64().unwrap() >= 1 {
            break;
        }
    }
    let mut saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&checkpoint).unwrap()).unwrap();
    let scanned_before = saved["report"]["buckets_scanned"].as_u64().unwrap();
    assert!(scanned_before > 0);
    saved["targets"][0] = serde_json::json!({"Primary": {"host": "127.0.0.1", "port": 1}});
    std::fs::write(&checkpoint, saved.to_string()).unwrap();
    let (report, stderr) = run(&[]);
    assert!(stderr.contains("another topology"), "{stderr}");
    assert_eq!(report["done"], true);
    assert_eq!(
        report["buckets_scanned"].as_u64().unwrap(),
        scanned_before + 100,
        "the whole walk again, on top of the checkpoint's totals"
    );
    assert!(cluster_buckets(&cluster, "tf:") == cluster_buckets(&cluster, "ts:"));
    let help = tools().args(["sweep", "--help"]).output().unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    assert!(help.contains("HOST:PORT/CURSOR"), "{help}");
    assert!(help.contains("Redis Cluster"), "{help}");

    // compare-and-delete reloads its script on every primary after a SCRIPT FLUSH.
    for n in &cluster.nodes {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query(&mut n.conn())
            .unwrap();
    }
    let mut conn = store.connection();
    for b in 0..9 {
        let key = layout.bucket_key(b);
        let _: () = redis::cmd("HSET")
            .arg(&key)
            .arg("5")
            .arg("1")
            .query(&mut cluster.conn())
            .unwrap();
        let out = compare_and_delete(&mut conn, &key, &[("5", "1")])
            .await
            .unwrap();
        assert_eq!((out.deleted, out.refreshed), (1, 0), "{key}");
    }
}
