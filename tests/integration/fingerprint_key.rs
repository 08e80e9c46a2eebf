//! The fingerprint key at start-up of the service (the real binary): a new keyspace is keyed,
//! or refused without a key (unless `NAMELIST_ALLOW_UNKEYED=true`, said at ERROR level); a
//! keyed keyspace opens with its key only; an unkeyed (format 1) one keeps working, loudly; a
//! bad key file stops start-up. Also the embedded store's own key. The same for each tool that
//! opens a keyspace, and `keygen` and `gen`, is `tools/tests/integration/fingerprint_key.rs`.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::{
    KeyFiles, Outcome, RedisServer, ServiceProcess, TEST_KEY_HEX, WRONG_KEY_HEX, keyspace_meta,
    spawn_app, test_settings,
};
use namelist::domain::{Dimension, ListName, Sandbox, Value};
use namelist::store::layout::canonical;
use namelist::store::{EntryKey, FingerprintKey, PrefixLen};
use serde_json::json;

fn wrong_id() -> String {
    FingerprintKey::from_hex(WRONG_KEY_HEX, "w")
        .unwrap()
        .id()
        .to_owned()
}

/// Starts the service binary on `prefix` with `env` (and nothing else of ours): started once
/// `/readyz` answers 200 (then stopped), refused when it exits first.
async fn service(redis: &RedisServer, prefix: &str, env: &[(&str, &Path)]) -> Outcome {
    let started = ServiceProcess::builder()
        .env("NAMELIST_REDIS_URL", redis.url())
        .env("NAMELIST_KEY_PREFIX", prefix)
        .env("NAMELIST_WORKERS", "1")
        .env("NAMELIST_LOG_FORMAT", "json")
        .envs(env.iter().copied())
        .ready_within(Duration::from_secs(15))
        .try_start()
        .await;
    match started {
        Ok(mut service) => {
            service.kill();
            Outcome::Started(service.log())
        }
        Err(exited) => {
            assert!(!exited.status.success(), "a refusal exits non-zero");
            Outcome::Refused(exited.log)
        }
    }
}

/// The ERROR line of an unkeyed keyspace is in these JSON logs.
fn says_unkeyed_at_error(stderr: &str) -> bool {
    stderr.lines().any(|l| {
        serde_json::from_str::<serde_json::Value>(l).is_ok_and(|v| {
            v["level"] == "ERROR"
                && v["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("UNKEYED FINGERPRINTS"))
        })
    })
}

const KEY: &str = "NAMELIST_FINGERPRINT_KEY_FILE";
const ALLOW: &str = "NAMELIST_ALLOW_UNKEYED";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_creates_keyed_keyspaces_and_opens_them_with_their_key_only() {
    let redis = RedisServer::start();
    let k = KeyFiles::new();
    let right_id = common::test_key().id().to_owned();

    // A new keyspace without a key: refused, with how to make one; nothing created.
    let msg = service(&redis, "a:", &[]).await.refused();
    assert!(msg.contains("namelist-tools keygen --out"), "{msg}");
    assert!(msg.contains("NAMELIST_FINGERPRINT_KEY_FILE"), "{msg}");
    assert!(msg.contains("NAMELIST_ALLOW_UNKEYED"), "{msg}");
    assert_eq!(redis.dbsize(), 0, "no keyspace was created");

    // With a key: format 2, the key's id recorded, no loud line.
    let log = service(&redis, "a:", &[(KEY, &k.right)]).await.started();
    assert!(!log.contains("UNKEYED"), "{log}");
    let m = keyspace_meta(&redis, "a:");
    assert_eq!(m["format"], "2");
    assert_eq!(m["key_id"], right_id);
    assert!(
        !m.values().any(|v| v.contains(&TEST_KEY_HEX[..16])),
        "{m:?}"
    );
    service(&redis, "a:", &[(KEY, &k.right)]).await.started();

    // The wrong key, no key, an exposed or malformed key file: refused, the key never shown.
    let msg = service(&redis, "a:", &[(KEY, &k.wrong)]).await.refused();
    assert!(msg.contains("key ids differ"), "{msg}");
    assert!(
        msg.contains(&right_id) && msg.contains(&wrong_id()),
        "{msg}"
    );
    assert!(!msg.contains(&WRONG_KEY_HEX[..16]) && !msg.contains(&TEST_KEY_HEX[..16]));
    let msg = service(&redis, "a:", &[]).await.refused();
    assert!(msg.contains("no fingerprint key is configured"), "{msg}");
    assert!(msg.contains(&right_id), "{msg}");
    let msg = service(&redis, "a:", &[(KEY, &k.exposed)]).await.refused();
    assert!(msg.contains("chmod 600"), "{msg}");
    let msg = service(&redis, "a:", &[(KEY, &k.placeholder)])
        .await
        .refused();
    assert!(msg.contains("hex digits"), "{msg}");
    let missing = k.right.with_file_name("missing.key");
    let msg = service(&redis, "a:", &[(KEY, &missing)]).await.refused();
    assert!(msg.contains("missing.key"), "{msg}");
    // Allowing unkeyed changes nothing for a keyed keyspace.
    let yes = Path::new("true");
    let msg = service(&redis, "a:", &[(ALLOW, yes)]).await.refused();
    assert!(msg.contains("no fingerprint key is configured"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unkeyed_keyspaces_are_made_only_when_allowed_and_always_said_loudly() {
    let redis = RedisServer::start();
    let k = KeyFiles::new();
    let yes = Path::new("true");

    let log = service(&redis, "u:", &[(ALLOW, yes)]).await.started();
    assert!(says_unkeyed_at_error(&log), "{log}");
    let m = keyspace_meta(&redis, "u:");
    assert_eq!(m["format"], "1");
    assert!(!m.contains_key("key_id"), "{m:?}");

    // An existing format-1 keyspace keeps working, with or without the permission or a key,
    // and says so at every start-up.
    let log = service(&redis, "u:", &[]).await.started();
    assert!(says_unkeyed_at_error(&log), "{log}");
    let log = service(&redis, "u:", &[(KEY, &k.right)]).await.started();
    assert!(says_unkeyed_at_error(&log), "{log}");
    assert!(log.contains("is NOT used"), "{log}");
    // A bad key file is refused even so: it is a configuration error.
    service(&redis, "u:", &[(KEY, &k.exposed)]).await.refused();
}

/// Entries written by a build before keyed fingerprints (format 1 meta, xxh3 fields, crc32
/// buckets) are still found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_1_keyspace_of_an_older_build_keeps_answering() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    let bytes = b"black\nphone\ndefault\n13800000000";
    let _: () = redis::cmd("HSET")
        .arg("old:meta")
        .arg("format")
        .arg(1)
        .arg("buckets")
        .arg(50)
        .arg("created_ms")
        .arg(1)
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(format!("old:b:{}", crc32fast::hash(bytes) % 50))
        .arg(xxhash_rust::xxh3::xxh3_64(bytes) as i64)
        .arg(0)
        .query(&mut conn)
        .unwrap();
    let mut settings = common::redis_settings(&redis);
    settings.key_prefix = "old:".into();
    let app = spawn_app(settings).await;
    let body = app
        .check(&json!({"lists": ["black"], "subjects": {"phone": "138 0000 0000"}}))
        .await;
    assert_eq!(body["hits"][0]["value"], "13800000000", "{body}");
    // New writes go in the keyspace's own format.
    let res = app
        .post(
            "/v1/lists/black/entries",
            &json!({"entries": [{"dimension": "uid", "value": "u1"}]}),
        )
        .await;
    assert_eq!(res.status(), 200);
    let bytes = b"black\nuid\ndefault\nu1";
    let code: Option<u32> = redis::cmd("HGET")
        .arg(format!("old:b:{}", crc32fast::hash(bytes) % 50))
        .arg(xxhash_rust::xxh3::xxh3_64(bytes) as i64)
        .query(&mut conn)
        .unwrap();
    assert_eq!(code, Some(0));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_store_keeps_its_own_key_in_its_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("namelist.redb");
    let key = dir.path().join("fingerprint.key");
    let mut settings = test_settings();
    settings.fingerprint_key_file = None;
    settings.data_dir = Some(dir.path().to_owned());

    let app = spawn_app(settings.clone()).await;
    let res = app
        .post(
            "/v1/lists/black/entries",
            &json!({"entries": [{"dimension": "phone", "value": "13800000002"}]}),
        )
        .await;
    assert_eq!(res.status(), 200);
    app.stop().await;
    wait_for(&snapshot).await;
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let id = FingerprintKey::from_file(&key).unwrap().id().to_owned();
    let hex = std::fs::read_to_string(&key).unwrap().trim().to_owned();
    let raw: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let snap = std::fs::read(&snapshot).unwrap();
    assert!(
        !snap.windows(32).any(|w| w == raw.as_slice())
            && !snap.windows(64).any(|w| w == hex.as_bytes()),
        "the key is not in the database file"
    );

    let app = spawn_app(settings.clone()).await;
    let body = app
        .check(&json!({"lists": ["black"], "subjects": {"phone": "13800000002"}}))
        .await;
    assert_eq!(body["hits"].as_array().unwrap().len(), 1, "{body}");
    app.stop().await;

    // Without its key file the data directory is refused (never silently empty); with another key too.
    let moved = dir.path().join("elsewhere.key");
    std::fs::rename(&key, &moved).unwrap();
    let err = namelist::startup::Application::build(settings.clone())
        .await
        .err()
        .expect("refused");
    assert!(
        err.to_string().contains("is missing") && err.to_string().contains(&id),
        "{err}"
    );
    settings.fingerprint_key_file = Some(common::key_file().to_owned());
    let err = namelist::startup::Application::build(settings.clone())
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("key ids differ"), "{err}");
    settings.fingerprint_key_file = Some(moved);
    spawn_app(settings).await.stop().await;
}

/// A snapshot as builds before keyed fingerprints wrote it is imported once into the data
/// directory (the deprecated `snapshot_path` alone: its directory), unkeyed, and left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unkeyed_snapshot_of_an_older_build_still_opens() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("old.snapshot");
    let list: ListName = "black".parse().unwrap();
    let sandbox: Sandbox = "default".parse().unwrap();
    // Written under rules 1, as every snapshot was.
    let value =
        Value::parse_entry_with(&Dimension::Phone, "13800000003", namelist::domain::Norm::V1)
            .unwrap();
    let bytes = canonical(&list, &Dimension::Phone, &sandbox, &value);
    let entry = EntryKey {
        bucket: crc32fast::hash(&bytes) % 64,
        field: xxhash_rust::xxh3::xxh3_64(&bytes) as i64,
    };
    // The old `Snapshot` struct: format, buckets, entries, registries, definitions.
    type Registries = Vec<((ListName, Sandbox), Vec<PrefixLen>)>;
    type Definitions = Vec<(String, String, u64, String, String)>;
    let old = postcard::to_stdvec(&(
        1u32,
        64u32,
        vec![(entry, 0u32)],
        Registries::new(),
        Definitions::new(),
    ))
    .unwrap();
    std::fs::write(&snapshot, &old).unwrap();
    let mut settings = test_settings();
    settings.snapshot_path = Some(snapshot.clone());
    let app = spawn_app(settings.clone()).await;
    let body = app
        .check(&json!({"lists": ["black"], "subjects": {"phone": "13800000003"}}))
        .await;
    assert_eq!(body["hits"].as_array().unwrap().len(), 1, "{body}");
    // A write: in the data directory, still unkeyed; the old file is left as a backup.
    let res = app
        .post(
            "/v1/lists/black/entries",
            &json!({"entries": [{"dimension": "uid", "value": "u-new"}]}),
        )
        .await;
    assert_eq!(res.status(), 200);
    app.stop().await;
    assert_eq!(std::fs::read(&snapshot).unwrap(), old, "left as it was");
    assert!(dir.path().join("namelist.redb").exists());
    // Imported once: a second start does not import it again over the record (the entry
    // removed here stays removed).
    let app = spawn_app(settings.clone()).await;
    let res = app
        .delete(
            "/v1/lists/black/entries",
            &json!({"entries": [{"dimension": "phone", "value": "13800000003"}]}),
        )
        .await;
    assert_eq!(res.status(), 200);
    app.stop().await;
    let app = spawn_app(settings.clone()).await;
    let body = app
        .check(&json!({"lists": ["black"], "subjects": {"phone": "13800000003", "uid": "u-new"}}))
        .await;
    assert_eq!(body["hits"].as_array().unwrap().len(), 1, "{body}");
    app.stop().await;
    // The snapshot's bytes stay as they were; the store opens from its record alone.
    std::fs::remove_file(&snapshot).unwrap();
    settings.snapshot_path = None;
    settings.data_dir = Some(dir.path().to_owned());
    let app = spawn_app(settings).await;
    let body = app
        .check(&json!({"lists": ["black"], "subjects": {"phone": "13800000003", "uid": "u-new"}}))
        .await;
    assert_eq!(body["hits"].as_array().unwrap().len(), 1, "{body}");
    app.stop().await;
}

async fn wait_for(path: &Path) {
    for _ in 0..200 {
        if path.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} was not written", path.display());
}

/// A keyed snapshot of the build before data directories (format 2, its key beside it as
/// `<snapshot>.key`) is imported once under the deprecated `snapshot_path`: its key is copied
/// into the data directory, its entries answer under rules 1 (they were hashed so), and the
/// snapshot and its key file are left as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_snapshot_of_the_build_before_is_imported_with_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("lists.snapshot");
    let old_key = dir.path().join("lists.snapshot.key");
    std::fs::copy(common::key_file(), &old_key).unwrap();
    let key = common::test_key();
    let layout = namelist::store::Layout::new("any:", 64, common::keyed());
    let value =
        Value::parse_entry_with(&Dimension::Phone, "13800000004", namelist::domain::Norm::V1)
            .unwrap();
    let list: ListName = "black".parse().unwrap();
    let entry = layout.entry_key(&list, &Dimension::Phone, &Sandbox::default(), &value);
    // The snapshot of that build: version, format, key id, buckets, entries, registries,
    // definitions.
    type Registries = Vec<((ListName, Sandbox), Vec<PrefixLen>)>;
    type Definitions = Vec<(String, String, u64, String, String)>;
    let old = postcard::to_stdvec(&(
        2u32,
        2u32,
        key.id().to_owned(),
        64u32,
        vec![(entry, 0u32)],
        Registries::new(),
        Definitions::new(),
    ))
    .unwrap();
    std::fs::write(&snapshot, &old).unwrap();
    let mut settings = test_settings();
    settings.fingerprint_key_file = None;
    settings.snapshot_path = Some(snapshot.clone());
    let app = spawn_app(settings.clone()).await;
    let body = app
        .check(&json!({"lists": ["black"], "subjects": {"phone": "138 0000 0004"}}))
        .await;
    assert_eq!(body["hits"].as_array().unwrap().len(), 1, "{body}");
    app.stop().await;
    assert_eq!(
        std::fs::read(dir.path().join("fingerprint.key")).unwrap(),
        std::fs::read(&old_key).unwrap(),
        "the snapshot's key, copied"
    );
    assert_eq!(std::fs::read(&snapshot).unwrap(), old, "left as it was");
    // Again, from the data directory alone.
    settings.snapshot_path = None;
    settings.data_dir = Some(dir.path().to_owned());
    std::fs::remove_file(&snapshot).unwrap();
    let app = spawn_app(settings).await;
    let body = app
        .check(&json!({"lists": ["black"], "subjects": {"phone": "13800000004"}}))
        .await;
    assert_eq!(body["hits"].as_array().unwrap().len(), 1, "{body}");
    app.stop().await;
}
