//! The fingerprint key at start-up, for the service (the real binary) and each tool that opens
//! a keyspace (`import`, `audit`, `sweep`): a new keyspace is keyed, or refused without a key
//! (unless `NAMELIST_ALLOW_UNKEYED=true`, said at ERROR level); a keyed keyspace opens with its
//! key only; an unkeyed (format 1) one keeps working, loudly; a bad key file stops start-up.
//! Also `keygen`, `gen` without a key, and the embedded store's own key.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{RedisServer, TEST_KEY_HEX, free_port, spawn_app, test_settings, write_key_file};
use namelist::domain::{Dimension, ListName, Sandbox, Value};
use namelist::store::layout::canonical;
use namelist::store::{EntryKey, FingerprintKey, PrefixLen};
use serde_json::json;

const SERVICE: &str = env!("CARGO_BIN_EXE_namelist");
const TOOLS: &str = env!("CARGO_BIN_EXE_namelist-tools");
const WRONG_HEX: &str = "c0ffee00112233445566778899aabbccddeeff00112233445566778899aabbcc";

/// Key files of the test: the right one, a wrong one, an exposed copy of the right one and a
/// placeholder.
struct Keys {
    _dir: tempfile::TempDir,
    right: PathBuf,
    wrong: PathBuf,
    exposed: PathBuf,
    placeholder: PathBuf,
}

fn keys() -> Keys {
    let dir = tempfile::tempdir().unwrap();
    let path = |n: &str| dir.path().join(n);
    let (right, wrong, exposed, placeholder) = (
        path("right.key"),
        path("wrong.key"),
        path("exposed.key"),
        path("placeholder.key"),
    );
    write_key_file(&right, TEST_KEY_HEX);
    write_key_file(&wrong, WRONG_HEX);
    write_key_file(&exposed, TEST_KEY_HEX);
    std::fs::set_permissions(&exposed, std::fs::Permissions::from_mode(0o644)).unwrap();
    write_key_file(&placeholder, "CHANGE-ME");
    Keys {
        _dir: dir,
        right,
        wrong,
        exposed,
        placeholder,
    }
}

fn wrong_id() -> String {
    FingerprintKey::from_hex(WRONG_HEX, "w")
        .unwrap()
        .id()
        .to_owned()
}

/// How a start-up went, with what the process wrote on stderr.
#[derive(Debug)]
enum Outcome {
    Started(String),
    Refused(String),
}

impl Outcome {
    fn started(self) -> String {
        match self {
            Outcome::Started(s) => s,
            Outcome::Refused(s) => panic!("expected a start, refused: {s}"),
        }
    }

    fn refused(self) -> String {
        match self {
            Outcome::Refused(s) => s,
            Outcome::Started(s) => panic!("expected a refusal, started: {s}"),
        }
    }
}

/// Starts the service binary on `prefix` with `env` (and nothing else of ours): started once
/// `/readyz` answers 200 (then stopped), refused when it exits first.
async fn service(redis: &RedisServer, prefix: &str, env: &[(&str, &Path)]) -> Outcome {
    let port = free_port();
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut cmd = Command::new(SERVICE);
    cmd.env_clear()
        .env("NAMELIST_LISTEN", format!("127.0.0.1:{port}"))
        .env("NAMELIST_REDIS_URL", redis.url())
        .env("NAMELIST_KEY_PREFIX", prefix)
        .env("NAMELIST_WORKERS", "1")
        .env("NAMELIST_LOG_FORMAT", "json");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let client = reqwest::Client::new();
    let started = Instant::now();
    let outcome = loop {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "neither started nor refused"
        );
        if let Some(status) = child.try_wait().unwrap() {
            assert!(!status.success(), "a refusal exits non-zero");
            break false;
        }
        let ready = client
            .get(format!("http://127.0.0.1:{port}/readyz"))
            .send()
            .await;
        if ready.is_ok_and(|r| r.status() == 200) {
            break true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    let _ = child.kill();
    let _ = child.wait();
    let stderr = std::fs::read_to_string(log.path()).unwrap();
    if outcome {
        Outcome::Started(stderr)
    } else {
        Outcome::Refused(stderr)
    }
}

/// Runs `namelist-tools` on `prefix` with `env` only: started (and succeeded) or refused.
fn tool(redis: &RedisServer, prefix: &str, env: &[(&str, &Path)], args: &[&str]) -> Outcome {
    let mut cmd = common::without_namelist_env(TOOLS);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd
        .args(["--redis-url", &redis.url(), "--prefix", prefix])
        .args(args)
        .output()
        .unwrap();
    let stderr =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    if out.status.success() {
        Outcome::Started(stderr)
    } else {
        Outcome::Refused(stderr)
    }
}

fn meta(redis: &RedisServer, prefix: &str) -> std::collections::HashMap<String, String> {
    redis::cmd("HGETALL")
        .arg(format!("{prefix}meta"))
        .query(&mut redis.conn())
        .unwrap()
}

fn dbsize(redis: &RedisServer) -> u64 {
    redis::cmd("DBSIZE").query(&mut redis.conn()).unwrap()
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
    let k = keys();
    let right_id = common::test_key().id().to_owned();

    // A new keyspace without a key: refused, with how to make one; nothing created.
    let msg = service(&redis, "a:", &[]).await.refused();
    assert!(msg.contains("namelist-tools keygen --out"), "{msg}");
    assert!(msg.contains("NAMELIST_FINGERPRINT_KEY_FILE"), "{msg}");
    assert!(msg.contains("NAMELIST_ALLOW_UNKEYED"), "{msg}");
    assert_eq!(dbsize(&redis), 0, "no keyspace was created");

    // With a key: format 2, the key's id recorded, no loud line.
    let log = service(&redis, "a:", &[(KEY, &k.right)]).await.started();
    assert!(!log.contains("UNKEYED"), "{log}");
    let m = meta(&redis, "a:");
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
    assert!(!msg.contains(&WRONG_HEX[..16]) && !msg.contains(&TEST_KEY_HEX[..16]));
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
    let k = keys();
    let yes = Path::new("true");

    let log = service(&redis, "u:", &[(ALLOW, yes)]).await.started();
    assert!(says_unkeyed_at_error(&log), "{log}");
    let m = meta(&redis, "u:");
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
async fn each_tool_reads_the_key_as_the_service_does() {
    let redis = RedisServer::start();
    let k = keys();
    let yes = Path::new("true");
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("rows.csv");
    std::fs::write(
        &csv,
        "list,dimension,value,sandbox\nblack,phone,13800000001,loan\n",
    )
    .unwrap();
    let csv = csv.to_str().unwrap();
    let import = ["import", csv, "--quiet"];
    let audit = ["audit", "--compare-sample", "0", "--json"];
    let sweep = ["sweep"];

    // A new keyspace: no key, refused by every tool, nothing created.
    for args in [&import[..], &audit, &sweep] {
        let msg = tool(&redis, "t:", &[], args).refused();
        assert!(
            msg.contains("namelist-tools keygen --out"),
            "{args:?}: {msg}"
        );
    }
    assert_eq!(dbsize(&redis), 0);

    // Keyed: made by import with the key, then each tool with the key, the wrong key, none.
    tool(&redis, "t:", &[(KEY, &k.right)], &import).started();
    assert_eq!(meta(&redis, "t:")["format"], "2");
    for args in [&import[..], &audit, &sweep] {
        let log = tool(&redis, "t:", &[(KEY, &k.right)], args).started();
        assert!(!log.contains("UNKEYED"), "{args:?}: {log}");
        let msg = tool(&redis, "t:", &[(KEY, &k.wrong)], args).refused();
        assert!(msg.contains("key ids differ"), "{args:?}: {msg}");
        assert!(!msg.contains(&TEST_KEY_HEX[..16]) && !msg.contains(&WRONG_HEX[..16]));
        let msg = tool(&redis, "t:", &[], args).refused();
        assert!(
            msg.contains("no fingerprint key is configured"),
            "{args:?}: {msg}"
        );
        let msg = tool(&redis, "t:", &[(KEY, &k.exposed)], args).refused();
        assert!(msg.contains("chmod 600"), "{args:?}: {msg}");
    }
    // The import the service reads: the entry is where the key puts it.
    let mut settings = common::redis_settings(&redis);
    settings.key_prefix = "t:".into();
    let app = spawn_app(settings).await;
    let body = app
        .check(
            &json!({"sandbox": "loan", "lists": ["black"], "subjects": {"phone": "13800000001"}}),
        )
        .await;
    assert_eq!(body["hits"].as_array().unwrap().len(), 1, "{body}");
    app.stop().await;

    // Unkeyed: only with the permission, then loud in every tool.
    tool(&redis, "u:", &[(ALLOW, yes)], &import).started();
    assert_eq!(meta(&redis, "u:")["format"], "1");
    for args in [&import[..], &audit, &sweep] {
        let log = tool(&redis, "u:", &[], args).started();
        assert!(
            log.contains("ERROR: UNKEYED FINGERPRINTS"),
            "{args:?}: {log}"
        );
    }
}

#[test]
fn gen_needs_no_key_and_keygen_makes_private_keys_it_never_replaces() {
    let dir = tempfile::tempdir().unwrap();
    let clean = || common::without_namelist_env(TOOLS);
    let (members, outsiders) = (dir.path().join("m.csv"), dir.path().join("n.csv"));
    let out = clean()
        .args(["gen", "--rows", "10", "--quiet", "--out"])
        .arg(&members)
        .arg("--non-members")
        .arg(&outsiders)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::read_to_string(&outsiders).unwrap().lines().count() > 1);

    let key = dir.path().join("fingerprint.key");
    let out = clean()
        .args(["keygen", "--out"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(out.status.success());
    let made = FingerprintKey::from_file(&key).unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains(made.id()), "{stdout}");
    let text = std::fs::read_to_string(&key).unwrap();
    let hex = text.trim();
    assert_eq!(hex.len(), 64, "32 bytes as hex");
    assert!(!stdout.contains(hex) && !String::from_utf8_lossy(&out.stderr).contains(hex));
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let out = clean()
        .args(["keygen", "--out"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(!out.status.success(), "refuses to overwrite");
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
    assert_eq!(std::fs::read_to_string(&key).unwrap(), text, "unchanged");
    let again = dir.path().join("again.key");
    clean()
        .args(["keygen", "--out"])
        .arg(&again)
        .output()
        .unwrap();
    assert_ne!(
        std::fs::read_to_string(&again).unwrap(),
        text,
        "random keys"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_store_keeps_its_own_key_beside_its_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("lists.snapshot");
    let key = dir.path().join("lists.snapshot.key");
    let mut settings = test_settings();
    settings.fingerprint_key_file = None;
    settings.snapshot_path = Some(snapshot.clone());

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
        "the key is not in the snapshot"
    );

    let app = spawn_app(settings.clone()).await;
    let body = app
        .check(&json!({"lists": ["black"], "subjects": {"phone": "13800000002"}}))
        .await;
    assert_eq!(body["hits"].as_array().unwrap().len(), 1, "{body}");
    app.stop().await;

    // Without its key file the snapshot is refused (never silently empty); with another key too.
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

/// A snapshot as builds before keyed fingerprints wrote it opens, unkeyed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unkeyed_snapshot_of_an_older_build_still_opens() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("old.snapshot");
    let list: ListName = "black".parse().unwrap();
    let sandbox: Sandbox = "default".parse().unwrap();
    let value = Value::parse_entry(&Dimension::Phone, "13800000003").unwrap();
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
    // A write: saved again in this build's snapshot encoding, still unkeyed.
    let res = app
        .post(
            "/v1/lists/black/entries",
            &json!({"entries": [{"dimension": "uid", "value": "u-new"}]}),
        )
        .await;
    assert_eq!(res.status(), 200);
    app.stop().await;
    for _ in 0..200 {
        if std::fs::read(&snapshot).unwrap() != old {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_ne!(std::fs::read(&snapshot).unwrap(), old, "saved again");
    let app = spawn_app(settings).await;
    let body = app
        .check(&json!({"lists": ["black"], "subjects": {"phone": "13800000003", "uid": "u-new"}}))
        .await;
    assert_eq!(body["hits"].as_array().unwrap().len(), 2, "{body}");
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
