//! What a sweep deletes and what it leaves: exactly the expired fields of entries and the
//! expired remembered event ids (counted apart), nothing it does not understand, a prefix with
//! glob characters matched literally, a bucket too big for a listpack swept in several calls;
//! and compare-and-delete keeping a field refreshed after the scan.

use crate::common;

use std::collections::BTreeMap;

use common::RedisServer;
use namelist::domain::now_ms;
use namelist::store::StoreBase;
use namelist::store::expiry::EPOCH_2020_MS;
use namelist::store::redis::bulk::compare_and_delete;
use namelist_tools::sweep::{self, Args};

use super::{
    DAY_MS, args_at, bucket_memory, code_at, forget_expired, id_buckets, mix, open, remember_ids,
    snapshot, sweep_time, write,
};

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
