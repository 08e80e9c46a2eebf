//! The lists' counts on Redis (issue 24, "Counts bounded"): what they cost in Redis, a pair
//! at zero leaving nothing behind, the fold of the older layout's 64 parts (one node, a
//! cluster, three callers at once, the service's start), and a page's cost that does not grow
//! with the number of pairs. (The same behaviours on every backend: `tests/integration/conformance/operators/counts.rs`.)

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::{RedisCluster, RedisServer, redis_settings, spawn_app, unique_prefix};
use namelist::lists::{FailMode, ListSettings, ListsQuery, NameLists, RawListsQuery};
use namelist::metrics::Metrics;
use namelist::store::Scope;
use namelist::store::redis::{Folded, OpenReport, RedisOptions, RedisStore};
use namelist::store::{CountChange, CountsQuery, Deadline, EntryStore, Hashing, Layout, ListCount};

fn options(urls: Vec<String>, cluster: bool, prefix: &str) -> RedisOptions {
    let (url, cluster_nodes) = if cluster {
        (String::new(), urls)
    } else {
        (urls[0].clone(), Vec::new())
    };
    RedisOptions {
        cluster_nodes,
        expected_entries: Some(64 * 200),
        response_timeout: Duration::from_secs(5),
        ..common::redis_options(url, prefix)
    }
}

async fn open_node(redis: &RedisServer, prefix: &str) -> (RedisStore, OpenReport) {
    RedisStore::open(options(vec![redis.url()], false, prefix))
        .await
        .unwrap()
}

/// Key names only: the counts' keys depend on the prefix alone.
fn layout(prefix: &str) -> Layout {
    Layout::new(prefix, 1, Hashing::Unkeyed)
}

fn deadline() -> Deadline {
    Deadline::after(Duration::from_secs(30))
}

/// Every pair, page after page, straight from the store.
async fn all_counts(store: &RedisStore) -> Vec<ListCount> {
    let mut out: Vec<ListCount> = Vec::new();
    let mut query = CountsQuery::first(1_000);
    loop {
        let page = store.list_counts(&query).await.unwrap();
        out.extend(page.counts);
        if !page.more {
            return out;
        }
        let last = out.last().unwrap();
        query.after = Some(Scope::new(
            &last.list.parse().unwrap(),
            &last.sandbox.parse().unwrap(),
        ));
    }
}

fn changes(pairs: &[(String, String, i64)]) -> Vec<CountChange> {
    pairs
        .iter()
        .map(|(l, s, d)| CountChange {
            scope: Scope::new(&l.parse().unwrap(), &s.parse().unwrap()),
            delta: *d,
        })
        .collect()
}

/// What the older layout holds for `pairs` (count, time) in part `part`.
fn old_part_fields(pairs: &[(&str, i64, i64)]) -> Vec<(String, i64)> {
    pairs
        .iter()
        .flat_map(|(pair, n, t)| [(pair.to_string(), *n), (format!("{pair}|t"), *t)])
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pair_at_zero_leaves_no_key_behind() {
    let redis = RedisServer::start();
    let prefix = unique_prefix();
    let (store, _) = open_node(&redis, &prefix).await;
    let one = changes(&[("black".into(), "loan".into(), 3)]);
    store.count_changes(&one, 1_000, deadline()).await.unwrap();
    let keys = layout(&prefix).counts_keys();
    let mut c = redis.conn();
    for k in &keys {
        let n: i64 = redis::cmd("EXISTS").arg(k).query(&mut c).unwrap();
        assert_eq!(n, 1, "{k} holds the pair");
    }
    let back = changes(&[("black".into(), "loan".into(), -3)]);
    store.count_changes(&back, 2_000, deadline()).await.unwrap();
    for k in &keys {
        let n: i64 = redis::cmd("EXISTS").arg(k).query(&mut c).unwrap();
        assert_eq!(n, 0, "{k}: nothing left of the only pair");
    }
}

/// Writes the older layout's parts on one node: a pair in two parts (summed, the latest time
/// kept), pairs at 0 and below (gone), 2,500 pairs in one part (several chunks), and fields
/// that are not pairs (left alone). Returns the pairs expected after the fold.
fn arrange_old_parts(
    conn: &mut impl redis::ConnectionLike,
    prefix: &str,
) -> Vec<(String, String, i64, i64)> {
    let l = layout(prefix);
    let bulk: Vec<String> = (0..2_500).map(|i| format!("bulk|s{i:04}")).collect();
    let mut part0 = old_part_fields(&[("black|loan", 3, 1_000), ("grey|loan", 1, 2_000)]);
    part0.extend(
        bulk.iter()
            .flat_map(|p| [(p.clone(), 1), (format!("{p}|t"), 7)]),
    );
    let part5 = old_part_fields(&[("black|loan", 2, 3_000), ("zero|loan", 0, 4_000)]);
    let mut part9 = old_part_fields(&[("neg|loan", -2, 5_000)]);
    part9.push(("grey|loan".into(), 1)); // a count without its time
    for (part, fields) in [(0, part0), (5, part5), (9, part9)] {
        for chunk in fields.chunks(500) {
            let mut cmd = redis::cmd("HSET");
            cmd.arg(l.old_counts_key(part));
            for (f, v) in chunk {
                cmd.arg(f).arg(v);
            }
            let _: i64 = cmd.query(conn).unwrap();
        }
    }
    // Not pairs this layout wrote: left where they are.
    let _: i64 = redis::cmd("HSET")
        .arg(l.old_counts_key(63))
        .arg("not a pair")
        .arg("x")
        .arg("Black|loan")
        .arg(4)
        .query(conn)
        .unwrap();
    let mut want = vec![
        ("black".to_owned(), "loan".to_owned(), 5, 3_000),
        ("grey".into(), "loan".into(), 2, 2_000),
    ];
    want.extend((0..2_500).map(|i| ("bulk".to_owned(), format!("s{i:04}"), 1, 7)));
    want.sort();
    want
}

fn as_rows(counts: &[ListCount]) -> Vec<(String, String, i64, i64)> {
    counts
        .iter()
        .map(|c| {
            (
                c.list.clone(),
                c.sandbox.clone(),
                c.entries,
                c.last_change_ms,
            )
        })
        .collect()
}

fn exists(conn: &mut impl redis::ConnectionLike, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(conn).unwrap() == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_count_parts_fold_into_the_paged_counts() {
    let redis = RedisServer::start();
    let prefix = unique_prefix();
    let want = arrange_old_parts(&mut redis.conn(), &prefix);

    let (store, _) = open_node(&redis, &prefix).await;
    assert_eq!(
        store.fold_old_counts().await.unwrap(),
        Folded {
            pairs: 2_502 + 2 + 2,
            left_alone: 2
        },
        "every pair of parts 0, 5 and 9, at zero and below included"
    );
    assert_eq!(as_rows(&all_counts(&store).await), want);
    let l = layout(&prefix);
    let mut c = redis.conn();
    for part in [0, 5, 9] {
        assert!(
            !exists(&mut c, &l.old_counts_key(part)),
            "part {part} folded"
        );
    }
    let left: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(l.old_counts_key(63))
        .query(&mut c)
        .unwrap();
    assert_eq!(left.len(), 2, "fields that are not pairs stay: {left:?}");

    // Idempotent: nothing left to fold, nothing counted twice.
    assert_eq!(store.fold_old_counts().await.unwrap().pairs, 0);
    assert_eq!(as_rows(&all_counts(&store).await), want);

    // An older instance still writing its parts during a rolling deploy: the next start
    // folds what it added into what is there.
    let _: i64 = redis::cmd("HINCRBY")
        .arg(l.old_counts_key(17))
        .arg("black|loan")
        .arg(4)
        .query(&mut c)
        .unwrap();
    assert_eq!(store.fold_old_counts().await.unwrap().pairs, 1);
    let black = all_counts(&store).await;
    assert_eq!(
        as_rows(&black[..1]),
        [("black".into(), "loan".into(), 9, 3_000)]
    );
}

/// Instances of a rolling deploy start together: each pair is taken by one of them only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openers_at_once_fold_each_pair_once() {
    let redis = RedisServer::start();
    let prefix = unique_prefix();
    let want = arrange_old_parts(&mut redis.conn(), &prefix);
    let (a, _) = open_node(&redis, &prefix).await;
    let (b, _) = open_node(&redis, &prefix).await;
    let (c, _) = open_node(&redis, &prefix).await;
    let (fa, fb, fc) = tokio::join!(
        a.fold_old_counts(),
        b.fold_old_counts(),
        c.fold_old_counts()
    );
    let (fa, fb, fc) = (fa.unwrap().pairs, fb.unwrap().pairs, fc.unwrap().pairs);
    assert_eq!(fa + fb + fc, 2_502 + 2 + 2, "folded {fa}, {fb} and {fc}");
    assert_eq!(as_rows(&all_counts(&a).await), want);
}

/// On a cluster the parts live on every primary and the counts on one slot: the fold moves
/// them across slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_count_parts_fold_on_a_cluster() {
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    let prefix = unique_prefix();
    let want = arrange_old_parts(&mut cluster.conn(), &prefix);
    let (store, _) = RedisStore::open(options(cluster.urls(), true, &prefix))
        .await
        .unwrap();
    assert_eq!(store.fold_old_counts().await.unwrap().pairs, 2_502 + 2 + 2);
    assert_eq!(as_rows(&all_counts(&store).await), want);
    let l = layout(&prefix);
    let mut c = cluster.conn();
    for part in [0, 5, 9] {
        assert!(
            !exists(&mut c, &l.old_counts_key(part)),
            "part {part} folded"
        );
    }
}

/// The service folds the older parts when it starts: its first page already has them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_folds_old_parts_when_it_starts() {
    let redis = RedisServer::start();
    let settings = redis_settings(&redis);
    arrange_old_parts(&mut redis.conn(), &settings.key_prefix);
    let app = spawn_app(settings).await;
    let body: serde_json::Value = app.get("/v1/lists?list=grey").await.json().await.unwrap();
    assert_eq!(
        body,
        serde_json::json!({"lists": [{"list": "grey", "sandbox": "loan", "entries": 2,
            "last_change": 2_000, "hits": 0}], "next_cursor": null})
    );
    let body: serde_json::Value = app.get("/v1/lists?limit=1000").await.json().await.unwrap();
    assert_eq!(body["lists"].as_array().unwrap().len(), 1_000, "of 2,502");
    assert!(body["next_cursor"].is_string());
}

/// `INFO commandstats` as (command → (calls, usec)).
fn commandstats(conn: &mut redis::Connection) -> HashMap<String, (u64, u64)> {
    let info: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |k: &str| -> Option<u64> {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))?
                    .parse()
                    .ok()
            };
            Some((name.to_owned(), (field("calls")?, field("usec")?)))
        })
        .collect()
}

/// Bytes `MEMORY USAGE key SAMPLES 0` gives (every element counted).
fn memory_usage(conn: &mut redis::Connection, key: &str) -> u64 {
    redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query(conn)
        .unwrap()
}

/// Issue 24's shape: a write token upserting entries each in its own sandbox. With 20,000
/// pairs (one list in 20,000 sandboxes, and 10 lists in one of them), every page the service
/// asks for (no filter, from a cursor in the middle, by list, by sandbox, one pair, and the
/// lists of one sandbox a lookup reads) runs only the page script and the commands inside it
/// (a range of the index with a `LIMIT`, two `HMGET`s), and Redis spends on each under a
/// quarter of one `HGETALL` of the counts hash: what every `GET /v1/lists` cost before, and
/// what a scan of every pair would cost again. Prints what each key costs per pair.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_costs_the_same_however_many_pairs() {
    const PAIRS: usize = 20_000;
    let redis = RedisServer::start();
    let prefix = unique_prefix();
    let (store, _) = open_node(&redis, &prefix).await;
    let store = Arc::new(store);
    let mut pairs: Vec<(String, String, i64)> = (0..PAIRS - 10)
        .map(|i| ("black".to_owned(), format!("s{i:05}"), 1))
        .collect();
    pairs.extend((0..10).map(|i| (format!("l{i}"), "s00042".to_owned(), 2)));
    store
        .count_changes(&changes(&pairs), 1_800_000_000_000, deadline())
        .await
        .unwrap();
    assert_eq!(all_counts(&store).await.len(), PAIRS);

    let mut conn = redis.conn();
    let keys = layout(&prefix).counts_keys();
    let bytes: Vec<u64> = keys.iter().map(|k| memory_usage(&mut conn, k)).collect();
    let total: u64 = bytes.iter().sum();
    eprintln!(
        "{PAIRS} pairs, members of {}-{} bytes: counts {:.1} B/pair, times {:.1}, by list {:.1}, by sandbox {:.1}; total {:.1} B/pair",
        "black\0s00000".len(),
        "l0\0s00042".len(),
        bytes[0] as f64 / PAIRS as f64,
        bytes[1] as f64 / PAIRS as f64,
        bytes[2] as f64 / PAIRS as f64,
        bytes[3] as f64 / PAIRS as f64,
        total as f64 / PAIRS as f64,
    );

    // And a few pairs, where Redis keeps each key a listpack.
    let small_prefix = unique_prefix();
    let (small, _) = open_node(&redis, &small_prefix).await;
    let few: Vec<(String, String, i64)> = (0..10)
        .map(|i| ("black".to_owned(), format!("s{i:05}"), 1))
        .collect();
    small
        .count_changes(&changes(&few), 1_800_000_000_000, deadline())
        .await
        .unwrap();
    let small_bytes: u64 = layout(&small_prefix)
        .counts_keys()
        .iter()
        .map(|k| memory_usage(&mut conn, k))
        .sum();
    eprintln!(
        "10 pairs: {small_bytes} B in all, {:.1} B/pair",
        small_bytes as f64 / 10.0
    );

    // What one read of every pair costs Redis.
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut conn)
        .unwrap();
    for _ in 0..5 {
        let all: Vec<(Vec<u8>, i64)> = redis::cmd("HGETALL")
            .arg(&keys[0])
            .query(&mut conn)
            .unwrap();
        assert_eq!(all.len(), PAIRS);
    }
    let (calls, usec) = commandstats(&mut conn)["hgetall"];
    let scan_usec = usec as f64 / calls as f64;

    let settings = ListSettings {
        check_deadline: Duration::from_secs(5),
        operator_deadline: Duration::from_secs(5),
        write_deadline: Duration::from_secs(5),
        fail_mode: FailMode::Closed,
        cache_ttl: Duration::from_secs(60),
        cache_capacity: 0,
        local_memory_bytes: 0,
        local_fetch_rate: 0,
        local_refresh_rate: 0,
        phone_regions: Default::default(),
    };
    let lists = NameLists::new(
        store.clone(),
        store.clone(),
        settings,
        Arc::new(Metrics::new()),
    );
    // Subscribed before anything is measured.
    for _ in 0..500 {
        if lists.cache().is_trusted() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(lists.cache().is_trusted());
    let query = |list: Option<&str>, sandbox: Option<&str>, cursor: Option<&str>| {
        ListsQuery::try_from(RawListsQuery {
            list: list.map(str::to_owned),
            sandbox: sandbox.map(str::to_owned),
            limit: Some("100".into()),
            cursor: cursor.map(str::to_owned),
        })
        .unwrap()
    };
    let cases = [
        ("no filter", query(None, None, None), 100),
        (
            "from a cursor",
            query(None, None, Some("black:s09999")),
            100,
        ),
        (
            "by list",
            query(Some("black"), None, Some("black:s12345")),
            100,
        ),
        ("by sandbox", query(None, Some("s00042"), None), 11),
        ("one pair", query(Some("l3"), Some("s00042"), None), 1),
    ];
    const ROUNDS: u64 = 20;
    for (what, q, len) in &cases {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut conn)
            .unwrap();
        for _ in 0..ROUNDS {
            let page = lists.summaries(q).await.unwrap();
            assert_eq!(page.lists.len(), *len, "{what}");
        }
        check_bounded(&mut conn, what, ROUNDS, scan_usec, &[]);
    }
    // The lookup on every list reads the lists of its sandbox (then checks each of them).
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut conn)
        .unwrap();
    for _ in 0..ROUNDS {
        let found = lists
            .lookup_everywhere("uid".into(), "u-1".into(), "s00042".parse().unwrap())
            .await
            .unwrap();
        assert!(found.check.hits.is_empty() && !found.truncated);
    }
    check_bounded(
        &mut conn,
        "lookup",
        ROUNDS,
        scan_usec,
        &["hget", "smembers"],
    );
}

/// Since the last `RESETSTAT`: `rounds` page scripts, nothing else but what they run inside
/// (and `also`, the rest of a lookup), each script well under one whole-hash read.
fn check_bounded(
    conn: &mut redis::Connection,
    what: &str,
    rounds: u64,
    scan_usec: f64,
    also: &[&str],
) {
    let stats = commandstats(conn);
    let (calls, usec) = stats["evalsha"];
    assert_eq!(calls, rounds, "{what}: one script call per page: {stats:?}");
    // Housekeeping of the store and of this test, not of a page.
    let quiet = [
        "evalsha",
        "info",
        "config",
        "ping",
        "client",
        "role",
        "cluster",
        "hello",
        "select",
        "subscribe",
    ];
    for (cmd, (n, _)) in &stats {
        // `config|resetstat`: subcommands are counted apart.
        let cmd = cmd.split('|').next().unwrap_or(cmd).to_owned();
        let inside = matches!(cmd.as_str(), "zrange" | "hmget") && *n <= 2 * rounds;
        assert!(
            quiet.contains(&cmd.as_str()) || inside || also.contains(&cmd.as_str()),
            "{what}: {cmd} ran {n} times: {stats:?}"
        );
    }
    let per_call = usec as f64 / calls as f64;
    eprintln!(
        "{what}: {per_call:.1} µs of Redis a page, one HGETALL of every pair {scan_usec:.0} µs"
    );
    // Measured 20-700x apart on a busy 2-core machine; a read of every pair, by any command,
    // costs about one HGETALL.
    assert!(
        per_call * 4.0 < scan_usec,
        "{what}: a page cost {per_call:.1} µs of Redis, a read of every pair {scan_usec:.0} µs"
    );
}
