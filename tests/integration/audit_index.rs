//! The audit trail's index on Redis (`store::layout`, *Audit trail*), what only Redis shows
//! (the behaviour on every backend is in
//! `tests/integration/conformance/operators/audit_index.rs`):
//!
//! * what a search costs, counted by Redis itself (`INFO commandstats`): a search by `who`
//!   reads the records it returns, not the trail, and a write stays one `MULTI`;
//! * records written before the index existed (plain `XADD`s, in the parts and in the
//!   unsplit stream of older keyspaces) indexed at open, once; one an older build writes
//!   later (a rolling deploy) indexed by the next write to its part;
//! * index members of records an older build trimmed away skipped by reads, and the index
//!   built again at the next open.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use namelist::audit_trail::{AuditEntry, AuditQuery, AuditTrail, RawAuditQuery};
use namelist::domain::{Dimension, ListName, Sandbox, Value};
use namelist::metrics::Metrics;
use namelist::store::redis::{OpenReport, RedisOptions, RedisStore};
use namelist::store::{AuditOp, AuditRecord, Deadline, EntryStore, StoreBase, WriteBatch};

use common::{RedisServer, unique_prefix};

async fn open(server: &RedisServer, prefix: &str) -> (Arc<RedisStore>, OpenReport) {
    let (store, report) = RedisStore::open(RedisOptions {
        expected_entries: Some(64 * 400),
        audit_max_len: 100_000,
        ..common::redis_options(server.url(), prefix)
    })
    .await
    .unwrap();
    (Arc::new(store), report)
}

/// Upserts `values` (uid `<who>-<i>`) by `who` on `list`, through the store's own write.
async fn write(store: &RedisStore, who: &str, list: &str, values: std::ops::Range<usize>) {
    let layout = store.layout();
    let list: ListName = list.parse().unwrap();
    let sandbox: Sandbox = "loan".parse().unwrap();
    let mut batch = WriteBatch::default();
    for i in values {
        let value = Value::Text(format!("{who}-{i}"));
        let key = layout.entry_key(&list, &Dimension::Uid, &sandbox, &value);
        batch.entries.push((key, 0));
        batch.audit.push(AuditRecord::entry(
            1_800_000_000_000,
            who,
            AuditOp::Upsert,
            &list,
            &Dimension::Uid,
            &sandbox,
            None,
            None,
            &key,
            layout.audit_value(&Dimension::Uid, &value),
            "u***".into(),
        ));
    }
    store
        .write(batch, Deadline::after(Duration::from_secs(30)))
        .await
        .unwrap();
}

async fn search(store: &Arc<RedisStore>, pairs: &[(&str, &str)]) -> (Vec<AuditEntry>, bool) {
    let mut q = RawAuditQuery::default();
    for (k, v) in pairs {
        let v = Some((*v).to_owned());
        match *k {
            "who" => q.who = v,
            "list" => q.list = v,
            "op" => q.op = v,
            "sandbox" => q.sandbox = v,
            "dimension" => q.dimension = v,
            "value" => q.value = v,
            "limit" => q.limit = v,
            other => panic!("{other}"),
        }
    }
    let trail = AuditTrail::new(
        store.clone(),
        Arc::new(Metrics::new()),
        Duration::from_secs(30),
    );
    let page = trail.page(&AuditQuery::try_from(q).unwrap()).await.unwrap();
    (page.records, page.next_cursor.is_some())
}

/// `INFO commandstats` as command → calls (commands run by scripts included).
fn calls(server: &RedisServer) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.conn())
        .unwrap();
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let n = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), n))
        })
        .collect()
}

/// The `usec` of one command in `INFO commandstats` (0 if it never ran).
fn usec(server: &RedisServer, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.conn())
        .unwrap();
    info.lines()
        .find_map(|l| {
            let rest = l.strip_prefix(&format!("cmdstat_{command}:"))?;
            rest.split(',')
                .find_map(|kv| kv.strip_prefix("usec="))?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

fn reset_stats(server: &RedisServer) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut server.conn())
        .unwrap();
}

/// 50,000 records, 3 of them by `needle`: a search by `who` costs one index probe per part
/// and one `XRANGE` per record it returns, not a scan (which would be `XREVRANGE`s over up to
/// 10,000 records: the control search by `op` shows Redis counting those). And a write of
/// 100 entries is still one `MULTI`/`EXEC`, one `EVAL` per part it writes to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_by_who_reads_the_records_it_returns_not_the_trail() {
    let server = RedisServer::start();
    let (store, _) = open(&server, &unique_prefix()).await;
    for chunk in 0..5 {
        write(
            &store,
            "bulk",
            "black",
            chunk * 10_000..(chunk + 1) * 10_000,
        )
        .await;
    }
    for i in 0..3 {
        write(&store, "needle", "grey", i..i + 1).await;
    }

    reset_stats(&server);
    let (found, more) = search(&store, &[("who", "needle")]).await;
    let stats = calls(&server);
    assert_eq!(found.len(), 3);
    assert!(!more, "the trail ends there");
    assert!(found.iter().all(|r| r.who.as_deref() == Some("needle")));
    assert_eq!(
        stats.get("xrange"),
        Some(&3),
        "one XRANGE per record returned: {stats:?}"
    );
    assert_eq!(stats.get("xrevrange"), None, "no scan: {stats:?}");
    assert_eq!(
        stats.get("zrange"),
        Some(&65),
        "one index probe per part (64 and the unsplit stream): {stats:?}"
    );

    reset_stats(&server);
    let (found, _) = search(&store, &[("who", "nobody"), ("limit", "1000")]).await;
    let stats = calls(&server);
    assert!(found.is_empty());
    assert_eq!(stats.get("xrange"), None, "{stats:?}");
    assert_eq!(stats.get("xrevrange"), None, "{stats:?}");
    assert_eq!(stats.get("zrange"), Some(&65), "{stats:?}");

    // The control: a filter the index does not serve scans, and Redis counts it.
    reset_stats(&server);
    let (found, more) = search(&store, &[("op", "delete")]).await;
    let stats = calls(&server);
    assert!(
        found.is_empty() && more,
        "10,000 examined, a cursor to go on"
    );
    assert!(
        stats.get("xrevrange").is_some_and(|n| *n >= 65),
        "{stats:?}"
    );

    reset_stats(&server);
    write(&store, "one-write", "white", 0..100).await;
    let stats = calls(&server);
    assert_eq!(stats.get("multi"), Some(&1), "{stats:?}");
    assert_eq!(stats.get("exec"), Some(&1), "{stats:?}");
    assert_eq!(stats.get("xadd"), Some(&100), "{stats:?}");
    assert!(
        stats.get("eval").is_some_and(|n| (1..=64).contains(n)),
        "one EVAL per part written to: {stats:?}"
    );
    assert_eq!(
        stats.get("evalsha"),
        None,
        "nothing that a NOSCRIPT could fail: {stats:?}"
    );
}

/// A record as a build before the index wrote it: a plain `XADD` (no `vfp`, no index).
fn old_xadd(server: &RedisServer, stream: &str, who: &str, list: &str, i: usize) {
    let _: String = redis::cmd("XADD")
        .arg(stream)
        .arg("MAXLEN")
        .arg("~")
        .arg(1_000)
        .arg("*")
        .arg(&[
            ("at", "1800000000000"),
            ("who", who),
            ("op", "upsert"),
            ("list", list),
            ("dimension", "uid"),
            ("sandbox", "loan"),
            ("expires_at", "never"),
            ("fingerprint", &format!("{i:016x}")),
            ("value", "o***"),
        ])
        .query(&mut server.conn())
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_written_before_the_index_are_found_by_who_and_list_after_open() {
    let server = RedisServer::start();
    let prefix = unique_prefix();
    let (first, report) = open(&server, &prefix).await;
    assert_eq!(
        report.audit_indexed, 0,
        "a new keyspace has nothing to index"
    );
    let layout = first.layout().clone();
    // Ten records in six parts, three in the unsplit stream of keyspaces older still.
    for i in 0..10 {
        old_xadd(&server, &layout.audit_part_key(i % 6), "old-op", "grey", i);
    }
    for i in 10..13 {
        old_xadd(&server, &layout.audit_key(), "old-op", "grey", i);
    }
    let (found, _) = search(&first, &[("who", "old-op")]).await;
    assert!(found.is_empty(), "not indexed yet: {found:?}");

    let (store, report) = open(&server, &prefix).await;
    assert_eq!(report.audit_indexed, 13, "{report:?}");
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    let (found, _) = search(&store, &[("who", "old-op")]).await;
    assert_eq!(found.len(), 13);
    let (found, _) = search(&store, &[("list", "grey"), ("limit", "5")]).await;
    assert_eq!(found.len(), 5);
    let (found, _) = search(&store, &[("list", "grey"), ("sandbox", "loan")]).await;
    assert_eq!(found.len(), 13, "who, list and the filters after them");
    // They have no value fingerprint: a search by value does not find them (docs/behaviour.md).
    let (found, _) = search(&store, &[("dimension", "uid"), ("value", "x")]).await;
    assert!(found.is_empty());

    let (_, report) = open(&server, &prefix).await;
    assert_eq!(report.audit_indexed, 0, "indexed once");

    // A rolling deploy: an instance of the older build writes after the index was built; the
    // next write to that part (here the import's record, to part 0) indexes it first.
    old_xadd(&server, &layout.audit_part_key(0), "old-op", "grey", 13);
    let (found, _) = search(&store, &[("who", "old-op")]).await;
    assert_eq!(found.len(), 13, "not yet");
    store
        .append_audit(&AuditRecord {
            fields: vec![
                ("at".into(), "1800000000001".into()),
                ("who".into(), "importer".into()),
                ("op".into(), "import".into()),
                ("entries_written".into(), "7".into()),
            ],
        })
        .await
        .unwrap();
    let (found, _) = search(&store, &[("who", "old-op")]).await;
    assert_eq!(found.len(), 14);
    let (found, _) = search(&store, &[("who", "importer")]).await;
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].entries, Some(7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_of_records_trimmed_by_an_older_build_are_skipped_then_dropped() {
    let server = RedisServer::start();
    let prefix = unique_prefix();
    let (store, _) = open(&server, &prefix).await;
    let layout = store.layout().clone();
    let record = |who: &str| AuditRecord {
        fields: vec![
            ("at".into(), "1800000000000".into()),
            ("who".into(), who.into()),
            ("op".into(), "import".into()),
            ("list".into(), "black".into()),
        ],
    };
    for _ in 0..5 {
        store.append_audit(&record("gone")).await.unwrap();
    }
    // An older build's `XADD … MAXLEN ~` trims records and leaves their members.
    let part = layout.audit_part_key(0);
    let (ix, _) = layout.audit_index_keys(0);
    let _: i64 = redis::cmd("XTRIM")
        .arg(&part)
        .arg("MAXLEN")
        .arg(0)
        .query(&mut server.conn())
        .unwrap();
    let (found, more) = search(&store, &[("who", "gone")]).await;
    assert!(found.is_empty() && !more, "{found:?}");
    for _ in 0..2 {
        store.append_audit(&record("kept")).await.unwrap();
    }
    let (found, _) = search(&store, &[("list", "black")]).await;
    assert_eq!(found.len(), 2, "the members left behind are skipped");
    let zcard = |server: &RedisServer| -> u64 {
        redis::cmd("ZCARD")
            .arg(&ix)
            .query(&mut server.conn())
            .unwrap()
    };
    assert_eq!(zcard(&server), 14);

    let (store, report) = open(&server, &prefix).await;
    assert_eq!(report.audit_indexed, 2, "built again from the records kept");
    assert_eq!(zcard(&server), 4, "who and list of the two records kept");
    let (found, _) = search(&store, &[("list", "black")]).await;
    assert_eq!(found.len(), 2);
}

/// Not a check: the memory the trail and its index take per record, as `MEMORY USAGE`
/// (`SAMPLES 0`: every element) counts it, after 100,000 records shaped like
/// `benches/operators.sh`'s (a phone, a reason, an expiry) under the default cap, one batch
/// in six written by a second actor on a second list; and again without the `vfp` field, as
/// records were before the index (the stream's share of it). Also the Redis time of an append
/// (the `EVAL`s' `usec` in `INFO commandstats`, trims included) against a plain
/// `XADD … MAXLEN ~` of the same records, as before the index. What `layout`'s header and the
/// README quote. `cargo nextest run --test integration audit_index:: --run-ignored only --no-capture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, printed: run it with --run-ignored only --no-capture"]
async fn measure_bytes_per_record() {
    let server = RedisServer::start();
    for with_vfp in [true, false] {
        let (store, _) = open(&server, &unique_prefix()).await;
        let layout = store.layout().clone();
        let sandbox: Sandbox = "default".parse().unwrap();
        reset_stats(&server);
        let mut plain = Vec::new();
        for b in 0..100 {
            let (who, list): (&str, ListName) = if b % 6 == 5 {
                ("ops-console", "grey".parse().unwrap())
            } else {
                ("risk-loader", "black".parse().unwrap())
            };
            let mut batch = WriteBatch::default();
            for i in 0..1_000 {
                let value =
                    Value::parse_entry(&Dimension::Phone, &format!("+8613{:09}", b * 1000 + i))
                        .unwrap();
                let key = layout.entry_key(&list, &Dimension::Phone, &sandbox, &value);
                batch.entries.push((key, 0));
                let mut record = AuditRecord::entry(
                    1_800_000_000_000 + b as i64,
                    who,
                    AuditOp::Upsert,
                    &list,
                    &Dimension::Phone,
                    &sandbox,
                    Some(1_802_592_000_000),
                    Some(&format!("load {b}")),
                    &key,
                    layout.audit_value(&Dimension::Phone, &value),
                    "+86130****0000".into(),
                );
                if !with_vfp {
                    record.fields.retain(|(n, _)| n != "vfp");
                }
                if b < 10 {
                    plain.push(record.clone());
                }
                batch.audit.push(record);
            }
            store
                .write(batch, Deadline::after(Duration::from_secs(60)))
                .await
                .unwrap();
        }
        let mut conn = server.conn();
        let eval_usec = usec(&server, "eval");
        let xadd_before = usec(&server, "xadd");
        // The same first 10,000 records, as builds before the index appended them.
        let mut pipe = redis::pipe();
        for r in &plain {
            pipe.cmd("XADD")
                .arg("scratch:plain")
                .arg("MAXLEN")
                .arg("~")
                .arg(1_563)
                .arg("*");
            for (k, v) in &r.fields {
                pipe.arg(k).arg(v);
            }
            pipe.ignore();
        }
        let () = pipe.query(&mut conn).unwrap();
        let plain_usec = usec(&server, "xadd") - xadd_before;
        let _: () = redis::cmd("DEL")
            .arg("scratch:plain")
            .query(&mut conn)
            .unwrap();
        let usage = |conn: &mut redis::Connection, key: &str| -> u64 {
            redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(key)
                .arg("SAMPLES")
                .arg(0)
                .query::<Option<u64>>(conn)
                .unwrap()
                .unwrap_or(0)
        };
        let (mut records, mut members, mut streams, mut indexes, mut marks) = (0u64, 0u64, 0, 0, 0);
        for (i, stream) in layout.audit_keys().iter().enumerate() {
            let (ix, mark) = layout.audit_index_keys(i);
            records += redis::cmd("XLEN")
                .arg(stream)
                .query::<u64>(&mut conn)
                .unwrap();
            members += redis::cmd("ZCARD")
                .arg(&ix)
                .query::<u64>(&mut conn)
                .unwrap();
            streams += usage(&mut conn, stream);
            indexes += usage(&mut conn, &ix);
            marks += usage(&mut conn, &mark);
        }
        let per = |bytes: u64| bytes as f64 / records as f64;
        println!(
            "vfp {with_vfp}: {records} records kept, {members} index members: stream {:.1} B/record, \
             index {:.1} B/record ({:.1} B/member), marks {marks} B in all; trail + index {:.1} B/record; \
             Redis time of an append {:.1} µs/record (trims included), of a plain XADD … MAXLEN ~ {:.1} µs/record",
            per(streams),
            per(indexes),
            indexes as f64 / members as f64,
            per(streams + indexes + marks),
            eval_usec as f64 / 100_000.0,
            plain_usec as f64 / plain.len() as f64,
        );
    }
}
