//! What the entries endpoints leave in Redis: buckets stay listpacks with integer fields, and
//! deletes still count and remove exactly what was there after `SCRIPT FLUSH`.

use crate::common;

use common::{Backend, RedisServer};
use serde_json::{Value, json};

use super::app_on;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_are_listpacks_with_integer_fields() {
    let backend = Backend::Node(RedisServer::start());
    let app = app_on(&backend).await;
    let Backend::Node(redis) = &backend else {
        unreachable!()
    };
    let entries: Vec<Value> = (0..2_000)
        .map(|i| json!({"dimension": "device", "value": format!("dev-{i}"), "ttl_seconds": 86_400 * 30}))
        .collect();
    let res = app
        .post("/v1/lists/black/entries", &json!({ "entries": entries }))
        .await;
    assert_eq!(res.status(), 200);
    let mut conn = redis.conn();
    let prefix = app.lists.store().layout().prefix().to_owned();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}b:*"))
        .query(&mut conn)
        .unwrap();
    assert!(!keys.is_empty());
    let mut fields = 0;
    for key in &keys {
        let enc: String = redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg(key)
            .query(&mut conn)
            .unwrap();
        assert_eq!(enc, "listpack", "{key}");
        let all: Vec<(String, String)> = redis::cmd("HGETALL").arg(key).query(&mut conn).unwrap();
        for (f, v) in all {
            assert!(
                f.parse::<i64>().is_ok(),
                "field {f} is a signed decimal i64"
            );
            let code: u32 = v.parse().expect("value is an integer");
            assert!(
                code > 0 && code < (1 << 31),
                "expiry in seconds since 2020: {code}"
            );
            fields += 1;
        }
    }
    assert_eq!(fields, 2_000);
    let meta: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg(format!("{prefix}meta"))
        .query(&mut conn)
        .unwrap();
    assert_eq!(meta["format"], "2", "a new keyspace is keyed");
    assert_eq!(meta["key_id"], common::test_key().id());
    assert_eq!(
        meta["buckets"], "5000",
        "1,000,000 entries by default, 200 per bucket"
    );
}

/// Deletes run a script by SHA: after `SCRIPT FLUSH` (a restart, a failover to a fresh node)
/// it is reloaded and the delete still counts and removes exactly what was there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_survive_a_flushed_script_cache() {
    let backend = Backend::Node(RedisServer::start());
    let app = app_on(&backend).await;
    let Backend::Node(redis) = &backend else {
        unreachable!()
    };
    let entries: Vec<Value> = (0..3)
        .map(|i| json!({"dimension": "device", "value": format!("dev-{i}")}))
        .collect();
    let res = app
        .post("/v1/lists/black/entries", &json!({ "entries": entries }))
        .await;
    assert_eq!(res.status(), 200);
    let mut conn = redis.conn();
    for round in 0..2 {
        let ok: String = redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn).unwrap();
        assert_eq!(ok, "OK");
        let value = format!("dev-{round}");
        let res = app
            .delete(
                "/v1/lists/black/entries",
                &json!({"entries": [
                    {"dimension": "device", "value": value},
                    {"dimension": "device", "value": "never-there"}
                ]}),
            )
            .await;
        assert_eq!(res.status(), 200, "round {round}");
        assert_eq!(res.json::<Value>().await.unwrap(), json!({"removed": 1}));
    }
    for (i, listed) in [(0, false), (1, false), (2, true)] {
        let body: Value = app
            .get(&format!("/v1/lists/black/entries/device/dev-{i}"))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(body["listed"], listed, "dev-{i}");
    }
}
