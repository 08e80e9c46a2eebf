//! `namelist-tools sweep` on real redis-servers: it deletes exactly the expired fields
//! (compare-and-delete, so a refreshed field survives), leaves everything it does not
//! understand alone, is paced, resumes from its checkpoint to the same end state as one full
//! sweep, changes nothing in a dry run, and the binary reports one JSON line. The buckets of
//! remembered event ids are swept in the same walk, counted apart. The same on a local Redis
//! Cluster: every primary walked, resumed across primaries (checkpoint and
//! `--cursor HOST:PORT/CURSOR`), a checkpoint of another topology restarting the walk.
//!
//! One module per theme: `deletes` (what a sweep deletes and what it leaves, of entries and
//! of event ids; compare-and-delete), `runs` (how it runs: resumed, dry, paced, as the binary,
//! timed) and `cluster` (all of it on a local Redis Cluster); here, the helpers they share
//! (stores, snapshots, the deterministic mixes of entries and event ids, the binary).

mod cluster;
mod deletes;
mod runs;

// The root's test helpers (redis-server on free ports, local clusters, the app on port 0),
// shared by path rather than copied.
use crate::common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use common::RedisServer;
use namelist::store::expiry::EPOCH_2020_MS;
use namelist::store::redis::{RedisOptions, RedisStore};
use namelist::store::{Deadline, EntryKey, EntryStore, ExpiryCode, Layout, WriteBatch};
use namelist_tools::sweep::Args;

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
    snapshot_matching(redis, "*")
}

/// `snapshot` of the keys matching `pattern`, pipelined a thousand keys at a time: a
/// cluster's primaries hold 16,384 shard markers a keyspace, and a round trip a key made the
/// cluster test take minutes.
fn snapshot_matching(redis: &RedisServer, pattern: &str) -> Snapshot {
    let mut conn = redis.conn();
    let mut out = Snapshot::new();
    let keys = scan_all(&mut conn, pattern);
    for chunk in keys.chunks(1_000) {
        let mut types = redis::pipe();
        for key in chunk {
            types.cmd("TYPE").arg(key);
        }
        let kinds: Vec<String> = types.query(&mut conn).unwrap();
        let mut contents = redis::pipe();
        for (key, kind) in chunk.iter().zip(&kinds) {
            contents
                .cmd(if kind == "hash" { "HGETALL" } else { "DUMP" })
                .arg(key);
        }
        let values: Vec<redis::Value> = contents.query(&mut conn).unwrap();
        for ((key, kind), v) in chunk.iter().zip(kinds).zip(values) {
            let content = if kind == "hash" {
                redis::from_redis_value(v).unwrap()
            } else {
                let dump: Vec<u8> = redis::from_redis_value(v).unwrap();
                BTreeMap::from([(Vec::new(), dump)])
            };
            out.insert(key.clone(), (kind, content));
        }
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

fn tools() -> Command {
    let mut cmd = common::without_namelist_env(env!("CARGO_BIN_EXE_namelist-tools"));
    cmd.env("RUST_LOG", "warn")
        .env("NAMELIST_FINGERPRINT_KEY_FILE", common::key_file());
    cmd
}
