//! The fingerprint key at start-up of each tool that opens a keyspace (`import`, `audit`,
//! `sweep`), read exactly as the service reads it: a new keyspace is keyed, or refused without
//! a key (unless `NAMELIST_ALLOW_UNKEYED=true`, then said at ERROR level); a keyed keyspace
//! opens with its key only; an unkeyed (format 1) one keeps working, loudly; a bad key file is
//! refused. Also `keygen`, and `gen` without a key. The service's side is the root's
//! `tests/integration/fingerprint_key.rs`.

// The root's test helpers (redis-server on free ports, local clusters, the app on port 0),
// shared by path rather than copied.
use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::{
    KeyFiles, Outcome, RedisServer, TEST_KEY_HEX, WRONG_KEY_HEX, keyspace_meta, spawn_app,
};
use namelist::store::FingerprintKey;
use serde_json::json;

const TOOLS: &str = env!("CARGO_BIN_EXE_namelist-tools");
const KEY: &str = "NAMELIST_FINGERPRINT_KEY_FILE";
const ALLOW: &str = "NAMELIST_ALLOW_UNKEYED";

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tool_reads_the_key_as_the_service_does() {
    let redis = RedisServer::start();
    let k = KeyFiles::new();
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
    assert_eq!(redis.dbsize(), 0);

    // Keyed: made by import with the key, then each tool with the key, the wrong key, none.
    tool(&redis, "t:", &[(KEY, &k.right)], &import).started();
    assert_eq!(keyspace_meta(&redis, "t:")["format"], "2");
    for args in [&import[..], &audit, &sweep] {
        let log = tool(&redis, "t:", &[(KEY, &k.right)], args).started();
        assert!(!log.contains("UNKEYED"), "{args:?}: {log}");
        let msg = tool(&redis, "t:", &[(KEY, &k.wrong)], args).refused();
        assert!(msg.contains("key ids differ"), "{args:?}: {msg}");
        assert!(!msg.contains(&TEST_KEY_HEX[..16]) && !msg.contains(&WRONG_KEY_HEX[..16]));
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
    assert_eq!(keyspace_meta(&redis, "u:")["format"], "1");
    for args in [&import[..], &audit, &sweep] {
        let log = tool(&redis, "u:", &[], args).started();
        assert!(
            log.contains("ERROR: UNKEYED FINGERPRINTS"),
            "{args:?}: {log}"
        );
    }
}

/// A reader of standard output that stops early (`namelist-tools … | head`) ends the tool
/// quietly: exit 0 and no panic (`println!` panics on the broken pipe, exit 101). Here the
/// reader has gone before the tool starts, so every write to stdout fails.
#[test]
fn a_reader_that_stops_early_ends_the_tools_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("fingerprint.key");
    let runs: [&[&str]; 2] = [
        &["keygen", "--out", key.to_str().unwrap()],
        &["gen", "--rows", "100000", "--quiet"],
    ];
    for args in runs {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = common::without_namelist_env(TOOLS)
            .args(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
            .wait_with_output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {:?} {stderr}", out.status);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
    assert!(
        FingerprintKey::from_file(&key).is_ok(),
        "the key was written"
    );
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
