//! Helpers of the tools' tests that run `gen`/`import` and then check through the service.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use serde_json::{Value as Json, json};

use crate::common::{self, RedisServer, TestApp};

/// `namelist-tools` with the tests' key, on `redis` at `prefix`, and nothing else from this
/// process's `NAMELIST_*` environment; its stdout (the run must succeed).
pub fn tools(redis: &RedisServer, prefix: &str, args: &[&str]) -> String {
    let url = redis.url();
    let mut all = vec!["--redis-url", url.as_str(), "--prefix", prefix];
    all.extend_from_slice(args);
    tools_with(&all)
}

/// `namelist-tools ARGS` with the tests' key and nothing else from this process's
/// `NAMELIST_*` environment (the arguments say where the store is); its stdout (the run
/// must succeed).
pub fn tools_with(args: &[&str]) -> String {
    let (ok, out, err) = tools_outcome(&[], args);
    assert!(ok, "{args:?}: {err}");
    out
}

/// `namelist-tools ARGS` as [`tools_with`] runs it, with `env` set too: (whether it
/// succeeded, its stdout, its stderr).
pub fn tools_outcome(env: &[(&str, &str)], args: &[&str]) -> (bool, String, String) {
    let out = common::without_namelist_env(env!("CARGO_BIN_EXE_namelist-tools"))
        .env("NAMELIST_FINGERPRINT_KEY_FILE", common::key_file())
        .envs(env.iter().copied())
        .args(args)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// `namelist-tools gen ARGS --quiet --out MEMBERS --non-members NON_MEMBERS` (no store, so no
/// key or environment); its stderr, the summary line (the run must succeed).
pub fn generate(args: &[&str], members: &Path, non_members: &Path) -> String {
    let out = common::without_namelist_env(env!("CARGO_BIN_EXE_namelist-tools"))
        .arg("gen")
        .args(args)
        .arg("--quiet")
        .arg("--out")
        .arg(members)
        .arg("--non-members")
        .arg(non_members)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{said}");
    said
}

/// One listed row to check: where, the value checked, and what a hit on it must show.
#[derive(Clone)]
pub struct Probe {
    pub list: String,
    pub sandbox: String,
    pub dimension: String,
    pub check: String,
    pub shown: String,
}

/// Checks every row (64 values per request, grouped by list and sandbox); returns the rows
/// whose expected value was not among the hits, and every hit seen.
pub async fn check_all(app: &TestApp, rows: &[Probe]) -> (Vec<String>, Vec<Json>) {
    let mut groups: BTreeMap<(&str, &str), Vec<&Probe>> = BTreeMap::new();
    for r in rows {
        groups.entry((&r.list, &r.sandbox)).or_default().push(r);
    }
    let (mut missing, mut all_hits) = (Vec::new(), Vec::new());
    for ((list, sandbox), rows) in groups {
        for chunk in rows.chunks(64) {
            let mut subjects: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
            for r in chunk {
                subjects.entry(&r.dimension).or_default().push(&r.check);
            }
            let body = app
                .check(&json!({"sandbox": sandbox, "lists": [list], "subjects": subjects}))
                .await;
            assert_eq!(body["degraded"], false, "{body}");
            let hits = body["hits"].as_array().unwrap();
            let seen: HashSet<(&str, &str)> = hits
                .iter()
                .map(|h| {
                    (
                        h["dimension"].as_str().unwrap(),
                        h["value"].as_str().unwrap(),
                    )
                })
                .collect();
            for r in chunk {
                if !seen.contains(&(r.dimension.as_str(), r.shown.as_str())) {
                    missing.push(format!("{list}/{sandbox}/{}={}", r.dimension, r.shown));
                }
            }
            all_hits.extend(hits.iter().cloned());
        }
    }
    (missing, all_hits)
}
