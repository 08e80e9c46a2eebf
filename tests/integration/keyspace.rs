//! Keyspace start-up rules: the bucket count and format recorded in `<prefix>meta`, the
//! listpack limit check, and the embedded store's data directory across restarts.

use crate::common;

use std::time::Duration;

use common::{RedisServer, redis_settings, spawn_app, test_settings};
use namelist::startup::{Application, StartupError};
use namelist::store::redis::{RedisOptions, RedisStore};
use namelist::store::{StoreBase, StoreError};
use serde_json::json;

fn options(redis: &RedisServer, prefix: &str, expected: Option<u64>) -> RedisOptions {
    RedisOptions {
        expected_entries: expected,
        response_timeout: Duration::from_secs(1),
        audit_max_len: 100,
        ..common::redis_options(redis.url(), prefix)
    }
}

fn keyspace_error(
    r: Result<(RedisStore, namelist::store::redis::OpenReport), StoreError>,
) -> String {
    match r {
        Err(StoreError::Keyspace(m)) => m,
        Err(e) => panic!("expected a keyspace error, got {e}"),
        Ok(_) => panic!("expected a keyspace error, the store opened"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bucket_count_is_fixed_at_creation() {
    let redis = RedisServer::start();
    let (store, report) = RedisStore::open(options(&redis, "k:", Some(2_000_000)))
        .await
        .unwrap();
    assert!(report.created);
    assert_eq!(report.buckets, 10_000);
    assert_eq!(store.layout().buckets(), 10_000);

    // The same configuration reopens it.
    let (_, report) = RedisStore::open(options(&redis, "k:", Some(2_000_000)))
        .await
        .unwrap();
    assert!(!report.created);

    // Another configured count is refused, with a message that says what to do.
    let msg = keyspace_error(RedisStore::open(options(&redis, "k:", Some(1_000_000))).await);
    assert!(
        msg.contains("10000 buckets") && msg.contains("5000"),
        "{msg}"
    );
    assert!(msg.contains("NAMELIST_EXPECTED_ENTRIES"), "{msg}");

    // No configured count: the recorded one is adopted.
    let (store, report) = RedisStore::open(options(&redis, "k:", None)).await.unwrap();
    assert_eq!((report.buckets, store.layout().buckets()), (10_000, 10_000));

    // Other prefixes are other keyspaces.
    let (store, report) = RedisStore::open(options(&redis, "other:", None))
        .await
        .unwrap();
    assert!(report.created);
    assert_eq!(
        store.layout().buckets(),
        5_000,
        "a new keyspace with nothing configured"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_format_stops_the_service() {
    let redis = RedisServer::start();
    let _: () = redis::cmd("HSET")
        .arg("f:meta")
        .arg("format")
        .arg(99)
        .arg("buckets")
        .arg(2500)
        .query(&mut redis.conn())
        .unwrap();
    let msg = keyspace_error(RedisStore::open(options(&redis, "f:", None)).await);
    assert!(
        msg.contains("format 99") && msg.contains("formats 1 and 2"),
        "{msg}"
    );

    // A meta hash without a format is not taken for a missing keyspace.
    let _: () = redis::cmd("HSET")
        .arg("g:meta")
        .arg("buckets")
        .arg(2500)
        .query(&mut redis.conn())
        .unwrap();
    let msg = keyspace_error(RedisStore::open(options(&redis, "g:", None)).await);
    assert!(msg.contains("g:meta has no readable format field"), "{msg}");

    let mut settings = redis_settings(&redis);
    settings.key_prefix = "f:".into();
    match Application::build(settings).await {
        Err(e @ StartupError::Store(_)) => assert!(e.to_string().contains("format 99"), "{e}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("the service must not start on an unknown format"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_listpack_limit_is_a_loud_warning() {
    let redis = RedisServer::start_with(&["--hash-max-listpack-entries", "128"]);
    let (_, report) = RedisStore::open(options(&redis, "w:", Some(1_000_000)))
        .await
        .unwrap();
    assert_eq!(report.warnings.len(), 1, "{:?}", report.warnings);
    assert!(
        report.warnings[0].contains("hash-max-listpack-entries is 128"),
        "{:?}",
        report.warnings
    );

    let redis = RedisServer::start();
    let (_, report) = RedisStore::open(options(&redis, "w:", Some(1_000_000)))
        .await
        .unwrap();
    assert!(
        report.warnings.is_empty(),
        "512 is enough for a mean of 200: {:?}",
        report.warnings
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_redis_stops_start_up_with_a_clear_error() {
    let mut redis = RedisServer::start();
    let settings = redis_settings(&redis);
    tokio::task::block_in_place(|| redis.kill());
    match Application::build(settings).await {
        Err(e @ StartupError::Store(StoreError::Unavailable { .. })) => {
            assert!(e.to_string().starts_with("opening the store"), "{e}")
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("started without its store"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_store_keeps_its_lists_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings();
    settings.data_dir = Some(dir.path().to_owned());
    settings.expected_entries = Some(40_000);

    let app = spawn_app(settings.clone()).await;
    let short_expiry = namelist::domain::now_ms() + 300;
    // Expiries are kept in whole seconds, rounded up: "short" is gone after the next second.
    let short_gone_at = (short_expiry + 999) / 1000 * 1000 + 50;
    let res = app
        .post(
            "/v1/lists/black/entries",
            &json!({"entries": [
                {"dimension": "ip", "value": "10.1.0.0/16"},
                {"dimension": "uid", "value": "kept", "ttl_seconds": 3600},
                {"dimension": "uid", "value": "short", "expires_at": short_expiry}
            ]}),
        )
        .await;
    assert_eq!(res.status(), 200);
    app.stop().await;
    assert!(dir.path().join("namelist.redb").exists());
    let wait = short_gone_at - namelist::domain::now_ms();
    tokio::time::sleep(Duration::from_millis(wait.max(0) as u64)).await;

    let app = spawn_app(settings.clone()).await;
    let body = app
        .check(&json!({"lists": ["black"], "subjects": {"ip": "10.1.200.3", "uid": ["kept", "short"]}}))
        .await;
    let mut values: Vec<&str> = body["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["value"].as_str().unwrap())
        .collect();
    values.sort();
    assert_eq!(
        values,
        vec!["10.1.0.0/16", "kept"],
        "the range registry and the live entry survived"
    );
    app.stop().await;

    // A data directory of another bucket count is refused, as Redis's meta would be.
    settings.expected_entries = Some(4_000_000);
    match Application::build(settings).await {
        Err(e) => assert!(
            e.to_string().contains("buckets") && e.to_string().contains("namelist.redb"),
            "{e}"
        ),
        Ok(_) => panic!("a data directory of another bucket count must be refused"),
    }
}
