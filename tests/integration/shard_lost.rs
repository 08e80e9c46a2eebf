//! A cluster shard that lost its data while the meta hash's shard kept it (a primary and its
//! replica restarted without persistence, a `FLUSHALL` on one node): before shard markers
//! its buckets read as empty, every entry there "not listed" and every count 0. Now the first
//! read or event that meets it finds its slot's marker missing, and the keyspace is lost
//! until the shard is restored (or its loss accepted explicitly).

use crate::common;

use std::time::{Duration, Instant};

use crate::keyspace_lost::{define_n, dump_all, restore_all};
use common::{RedisCluster, RedisServer, TestApp, cluster_settings, spawn_app};
use namelist::config::Settings;
use namelist::lists::FailMode;
use namelist::startup::Application;
use namelist::store::Layout;
use namelist::store::layout::key_slot;
use namelist::store::redis::{RedisOptions, RedisStore};
use serde_json::{Value, json};

fn uids() -> Vec<String> {
    (0..60).map(|i| format!("u{i}")).collect()
}

/// A check of one uid: (status, whether it is a hit, the error code if any).
async fn check_one(app: &TestApp, uid: &str) -> (u16, bool, String) {
    let res = app
        .post(
            "/v1/check",
            &json!({"lists": ["black"], "subjects": {"uid": [uid]}}),
        )
        .await;
    let status = res.status().as_u16();
    let body: Value = res.json().await.unwrap_or(Value::Null);
    let hit = body["hits"].as_array().is_some_and(|h| h.len() == 1);
    let code = body["error"]["code"].as_str().unwrap_or("").to_owned();
    (status, hit, code)
}

/// `POST /v1/lists/black/entries` of `values`: status and error code.
async fn write(app: &TestApp, values: &[String]) -> (u16, String) {
    let res = app
        .post(
            "/v1/lists/black/entries",
            &json!({"entries": values.iter()
                .map(|v| json!({"dimension": "uid", "value": v}))
                .collect::<Vec<_>>()}),
        )
        .await;
    let status = res.status().as_u16();
    let body: Value = res.json().await.unwrap_or(Value::Null);
    (
        status,
        body["error"]["code"].as_str().unwrap_or("").to_owned(),
    )
}

async fn event(app: &TestApp, id: &str, user: &str) -> (u16, String) {
    let res = app
        .post(
            "/v1/events",
            &json!({"id": id, "type": "tx", "fields": {"user": user}}),
        )
        .await;
    let status = res.status().as_u16();
    let body: Value = res.json().await.unwrap_or(Value::Null);
    (
        status,
        body["error"]["code"].as_str().unwrap_or("").to_owned(),
    )
}

async fn count(app: &TestApp, user: &str) -> Value {
    let res = app
        .post(
            "/v1/features",
            &json!({"metrics": ["n"], "fields": {"user": user}}),
        )
        .await;
    assert_eq!(res.status(), 200, "count of {user}");
    res.json::<Value>().await.unwrap()["values"]["n"].clone()
}

fn dbsize(node: &RedisServer) -> i64 {
    redis::cmd("DBSIZE").query(&mut node.conn()).unwrap()
}

fn flushall(node: &RedisServer) {
    let () = redis::cmd("FLUSHALL").query(&mut node.conn()).unwrap();
}

/// Polls `/readyz` until it answers `status`, for at most `limit`.
async fn ready_becomes(app: &TestApp, status: u16, limit: Duration) {
    let started = Instant::now();
    while app.get("/readyz").await.status() != status {
        assert!(
            started.elapsed() < limit,
            "/readyz did not become {status} within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_restarted_empty_is_noticed_never_read_as_not_listed() {
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    let settings = Settings {
        fail_mode: FailMode::Closed,
        ..cluster_settings(&cluster)
    };
    let prefix = settings.key_prefix.clone();
    let started = Instant::now();
    let writer = spawn_app(settings.clone()).await;
    eprintln!(
        "first instance (16,384 shard markers written) up in {:?}",
        started.elapsed()
    );
    let uids = uids();
    assert_eq!(write(&writer, &uids).await, (200, String::new()));
    assert_eq!(define_n(&writer).await.0, 200);
    let users: Vec<String> = (0..30).map(|i| format!("v{i}")).collect();
    for u in &users {
        assert_eq!(event(&writer, &format!("e-{u}"), u).await.0, 200);
    }
    // A reader without a local tier: every check reads Redis.
    let started = Instant::now();
    let reader = spawn_app(Settings {
        local_memory_mb: 0.0,
        ..settings.clone()
    })
    .await;
    eprintln!(
        "an instance (16,384 shard markers read) up in {:?}",
        started.elapsed()
    );
    let third = spawn_app(settings.clone()).await;
    for u in &uids {
        assert_eq!(
            check_one(&reader, u).await,
            (200, true, String::new()),
            "{u}"
        );
    }

    // A primary that does not hold the meta hash loses its data (its replica follows).
    let meta_node = cluster.primary_of_slot(key_slot(Layout::meta_key_of(&prefix).as_bytes()));
    let lost = cluster
        .primaries()
        .into_iter()
        .find(|n| n.port != cluster.nodes[meta_node].port)
        .expect("another primary");
    // Every key of that primary (its own slots only), as an RDB of it would hold them.
    let backup = dump_all(lost, "");
    assert!(
        backup
            .iter()
            .any(|(k, _)| k.starts_with(&format!("{prefix}b:"))),
        "the shard held buckets"
    );
    flushall(lost);

    // Events through an instance that has not noticed: the first to reach the empty shard
    // is refused by the script's guard before anything is written there; every later one
    // is refused unsent.
    let mut refused = Vec::new();
    for u in &users {
        match event(&writer, &format!("f-{u}"), u).await {
            (200, _) => {}
            (503, code) if code == "keyspace_lost" => refused.push(u.clone()),
            other => panic!("event of {u}: {other:?}"),
        }
    }
    assert!(
        !refused.is_empty(),
        "some user's keys are on the lost shard"
    );
    assert_eq!(dbsize(lost), 0, "nothing was written into the empty shard");

    // Entries written through another instance that has not noticed: the slots' markers,
    // read in the entries' own `MULTI`, make it a 503 instead of an acknowledgement (the
    // entries may have landed in the empty shard; a write is idempotent, to be sent again).
    let more: Vec<String> = (0..60).map(|i| format!("w{i}")).collect();
    assert_eq!(
        write(&third, &more).await,
        (503, "keyspace_lost".to_owned())
    );

    // Checks: never "not listed" for an entry that is there, never a count of 0.
    let mut lost_answers = 0;
    for u in &uids {
        match check_one(&reader, u).await {
            (200, true, _) => {}
            (503, false, code) if code == "keyspace_lost" => lost_answers += 1,
            other => panic!("check of {u} while a shard is empty: {other:?}"),
        }
    }
    assert!(lost_answers > 0, "the empty shard was read");
    ready_becomes(&reader, 503, Duration::from_secs(2)).await;

    // A new instance refuses to start, naming the slots.
    let err = match Application::build(settings.clone()).await {
        Err(e) => e.to_string(),
        Ok(_) => panic!("an instance started on a keyspace with a shard lost"),
    };
    assert!(err.contains("hash slot"), "{err}");
    assert!(err.contains("keyspace create --lost-for-good"), "{err}");

    // The shard restored (as its RDB would bring it back): both instances resume by
    // themselves, every entry listed, and the events refused, sent again, count once.
    restore_all(lost, &backup);
    ready_becomes(&reader, 200, Duration::from_secs(5)).await;
    ready_becomes(&writer, 200, Duration::from_secs(5)).await;
    for u in &uids {
        assert_eq!(
            check_one(&reader, u).await,
            (200, true, String::new()),
            "{u}"
        );
    }
    for u in &users {
        assert_eq!(event(&writer, &format!("f-{u}"), u).await.0, 200, "{u}");
        assert_eq!(
            count(&reader, u).await,
            json!(2),
            "{u}: once before, once after"
        );
    }

    // Lost again, and for good: the explicit tool accepts it, marking that shard's slots
    // again, empty; the rest of the keyspace is kept.
    flushall(lost);
    let (_, report) = RedisStore::open_anew(RedisOptions::from_settings(&settings).unwrap())
        .await
        .unwrap();
    assert!(!report.created);
    let slots: usize = cluster
        .slot_map()
        .iter()
        .filter(|(_, _, port)| *port == lost.port)
        .map(|(s, e, _)| usize::from(e - s) + 1)
        .sum();
    assert_eq!(report.shards_marked, slots);
    let fresh = spawn_app(Settings {
        local_memory_mb: 0.0,
        ..settings.clone()
    })
    .await;
    let listed = futures::future::join_all(uids.iter().map(|u| check_one(&fresh, u))).await;
    let kept = listed
        .iter()
        .filter(|(s, hit, _)| *s == 200 && *hit)
        .count();
    assert!(
        listed.iter().all(|(s, _, _)| *s == 200) && kept > 0 && kept < uids.len(),
        "the other shards' entries kept, the lost one's gone: {listed:?}"
    );
    fresh.stop().await;
    third.stop().await;
    reader.stop().await;
    writer.stop().await;
}

/// The meta hash's shard lost its data while every instance was down: none saw it vanish, so
/// none left the lost marker. The shard markers on the other shards still hold the old
/// keyspace's id, so the first instance to start refuses instead of making a new, empty
/// keyspace over the other shards' entries, and leaves the lost marker for the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_meta_shard_lost_while_no_instance_ran_is_refused_not_made_anew() {
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    let settings = cluster_settings(&cluster);
    let prefix = settings.key_prefix.clone();
    let app = spawn_app(settings.clone()).await;
    assert_eq!(write(&app, &uids()).await, (200, String::new()));
    app.stop().await;
    let meta = Layout::meta_key_of(&prefix);
    let meta_node = &cluster.nodes[cluster.primary_of_slot(key_slot(meta.as_bytes()))];
    let old: String = redis::cmd("HGET")
        .arg(&meta)
        .arg("keyspace_id")
        .query(&mut meta_node.conn())
        .unwrap();
    flushall(meta_node);

    let err = match Application::build(settings.clone()).await {
        Err(e) => format!("{e:#}"),
        Ok(_) => panic!("an instance made a new keyspace over another one's shards"),
    };
    assert!(
        err.contains(&format!("shard markers of keyspace {old}")),
        "{err}"
    );
    assert!(err.contains("keyspace create --lost-for-good"), "{err}");
    // The meta hash it made is taken back, and the lost marker stands as a running instance
    // would have left it: the next instance is refused at once.
    let mut conn = meta_node.conn();
    let exists: i64 = redis::cmd("EXISTS").arg(&meta).query(&mut conn).unwrap();
    assert_eq!(exists, 0, "the new meta hash was taken back");
    let marker: Option<String> = redis::cmd("GET")
        .arg(Layout::lost_marker_key_of(&prefix))
        .query(&mut conn)
        .unwrap();
    assert_eq!(marker.as_deref(), Some(old.as_str()));
    let err = match Application::build(settings.clone()).await {
        Err(e) => format!("{e:#}"),
        Ok(_) => panic!("a second instance made a new keyspace"),
    };
    assert!(err.contains(&old) && err.contains("vanish"), "{err}");

    // Accepted explicitly: a new keyspace, every slot marked with its id.
    let (_, report) = RedisStore::open_anew(RedisOptions::from_settings(&settings).unwrap())
        .await
        .unwrap();
    assert!(report.created);
    assert_eq!(report.shards_marked, 16_384);
    let fresh = spawn_app(settings.clone()).await;
    assert_eq!(fresh.get("/readyz").await.status(), 200);
    fresh.stop().await;
}
