//! The embedded store keeps what it acknowledged: the real binary on a data directory, four
//! writers sending upserts (three entries a request), deletes, events with ids and rule
//! definitions, and `kill -9` at a seeded random moment, round after round (20 in CI;
//! `DURABILITY_ROUNDS` and `DURABILITY_SEED` change them). After each restart:
//!
//! * every acknowledged upsert is listed, every acknowledged delete is not, and a request cut
//!   by the kill (unacknowledged) is there whole or not at all: never some of its entries;
//! * every acknowledged event counted exactly once, an unacknowledged one at most once, and
//!   each sent again (a retry, a replay) still counted once;
//! * the audit trail holds a record for each acknowledged upsert and delete;
//! * the list's count agrees exactly with the entries listed (the embedded store changes a
//!   count in the commit of the write that changes it, `EntryStore::counts_itself`);
//! * every acknowledged rule definition is there.

use crate::common;

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use common::ServiceProcess;

/// What one request did, as the client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Acked,
    /// No answer: cut by the kill (or refused before it), so applied whole or not at all.
    Unknown,
}

/// Everything sent so far, and how it ended.
#[derive(Default)]
struct History {
    /// Upserted groups of three values: (values, outcome, deleted: None | Some(outcome)).
    groups: Vec<([String; 3], Outcome, Option<Outcome>)>,
    /// Events: (id, entity, outcome) (each on an entity of its own).
    events: Vec<(String, String, Outcome)>,
    /// Rules: (id, outcome).
    rules: Vec<(String, Outcome)>,
    /// Entries of requests whose answer the kill cut (reported).
    cut_entries: i64,
}

fn seeded(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

fn start(data: &Path, logs: &Path) -> ServiceProcess {
    builder(data)
        .env("NAMELIST_WORKERS", "2")
        .log_dir(logs)
        .start_blocking()
}

/// One writer: sends operations until `stop` is set or the service is gone.
async fn writer(
    url: String,
    round: usize,
    id: usize,
    seed: u64,
    history: Arc<Mutex<History>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut next = seeded(seed);
    let mut n = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        n += 1;
        let tag = format!("{round}-{id}-{n}");
        match next() % 10 {
            0..=4 => {
                let values = [0, 1, 2].map(|i| format!("u{tag}-{i}"));
                let body = json!({"entries": values.iter().map(|v| json!({"dimension": "uid", "value": v})).collect::<Vec<_>>()});
                let at = history.lock().unwrap().groups.len();
                history
                    .lock()
                    .unwrap()
                    .groups
                    .push((values, Outcome::Unknown, None));
                let acked = client
                    .post(format!("{url}/v1/lists/black/entries"))
                    .json(&body)
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 200);
                let mut h = history.lock().unwrap();
                if acked {
                    h.groups[at].1 = Outcome::Acked;
                } else {
                    h.cut_entries += 3;
                }
            }
            5..=6 => {
                // Deletes a group acknowledged earlier and not yet deleted.
                let pick = {
                    let mut h = history.lock().unwrap();
                    let live: Vec<usize> = (0..h.groups.len())
                        .filter(|i| h.groups[*i].1 == Outcome::Acked && h.groups[*i].2.is_none())
                        .collect();
                    if live.is_empty() {
                        continue;
                    }
                    let i = live[(next() as usize) % live.len()];
                    h.groups[i].2 = Some(Outcome::Unknown);
                    i
                };
                let values = history.lock().unwrap().groups[pick].0.clone();
                let body = json!({"entries": values.iter().map(|v| json!({"dimension": "uid", "value": v})).collect::<Vec<_>>()});
                let acked = client
                    .delete(format!("{url}/v1/lists/black/entries"))
                    .json(&body)
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 200);
                let mut h = history.lock().unwrap();
                if acked {
                    h.groups[pick].2 = Some(Outcome::Acked);
                } else {
                    h.cut_entries += 3;
                }
            }
            7..=8 => {
                let (ev, entity) = (format!("ev{tag}"), format!("e{tag}"));
                let at = history.lock().unwrap().events.len();
                history
                    .lock()
                    .unwrap()
                    .events
                    .push((ev.clone(), entity.clone(), Outcome::Unknown));
                let acked = client
                    .post(format!("{url}/v1/events"))
                    .json(&json!({"id": ev, "type": "login", "fields": {"user_id": entity}}))
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 200);
                if acked {
                    history.lock().unwrap().events[at].2 = Outcome::Acked;
                }
            }
            _ => {
                let rule = format!("r{}", tag.replace('-', "_"));
                let at = history.lock().unwrap().rules.len();
                history
                    .lock()
                    .unwrap()
                    .rules
                    .push((rule.clone(), Outcome::Unknown));
                let acked = client
                    .put(format!("{url}/v1/rules/{rule}"))
                    .json(&json!({"expr": format!("logins_30d > {n}")}))
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 200);
                if acked {
                    history.lock().unwrap().rules[at].1 = Outcome::Acked;
                }
            }
        }
    }
}

async fn get(client: &reqwest::Client, url: String) -> (u16, Value) {
    let r = client.get(url).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn post(client: &reqwest::Client, url: String, body: &Value) -> Value {
    let r = client.post(url).json(body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

/// The values of `values` listed on black now.
async fn listed(client: &reqwest::Client, url: &str, values: &[String]) -> HashSet<String> {
    let mut found = HashSet::new();
    for chunk in values.chunks(64) {
        let body = post(
            client,
            format!("{url}/v1/check"),
            &json!({"lists": ["black"], "subjects": {"uid": chunk}}),
        )
        .await;
        assert_eq!(body["degraded"], false);
        for hit in body["hits"].as_array().unwrap() {
            found.insert(hit["value"].as_str().unwrap().to_owned());
        }
    }
    found
}

async fn logins(client: &reqwest::Client, url: &str, entity: &str) -> i64 {
    let body = post(
        client,
        format!("{url}/v1/features"),
        &json!({"metrics": ["logins_30d"], "fields": {"user_id": entity}}),
    )
    .await;
    body["values"]["logins_30d"].as_i64().unwrap()
}

/// The trail's records of `value` (newest first), as (op) strings.
async fn audit_ops(client: &reqwest::Client, url: &str, value: &str) -> Vec<String> {
    let (status, body) = get(
        client,
        format!("{url}/v1/audit?list=black&dimension=uid&value={value}&limit=10"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["op"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_nothing_acknowledged() {
    let rounds: usize = std::env::var("DURABILITY_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let seed: u64 = std::env::var("DURABILITY_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_2028);
    eprintln!("durability: {rounds} rounds, seed {seed}");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let history = Arc::new(Mutex::new(History::default()));
    let mut next = seeded(seed);
    let mut service = tokio::task::block_in_place(|| start(&data, dir.path()));
    let res = client
        .put(service.url("/v1/metrics/logins_30d"))
        .json(&json!({"expr": "COUNT(30d, login) BY user_id"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    for round in 0..rounds {
        // Traffic, then kill -9 at a random moment of it.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers: Vec<_> = (0..4)
            .map(|id| {
                tokio::spawn(writer(
                    service.url(""),
                    round,
                    id,
                    next(),
                    history.clone(),
                    stop.clone(),
                ))
            })
            .collect();
        let after = Duration::from_millis(100 + next() % 500);
        tokio::time::sleep(after).await;
        service.kill();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for w in writers {
            w.await.unwrap();
        }
        service = tokio::task::block_in_place(|| start(&data, dir.path()));
        let url = service.url("");
        let url = url.trim_end_matches('/').to_owned();

        // Entries: acknowledged ones there, deleted ones gone, cut ones whole or absent.
        let (groups, events, rules, cut) = {
            let h = history.lock().unwrap();
            (
                h.groups.clone(),
                h.events.clone(),
                h.rules.clone(),
                h.cut_entries,
            )
        };
        let all: Vec<String> = groups.iter().flat_map(|g| g.0.clone()).collect();
        let found = listed(&client, &url, &all).await;
        for (values, upsert, delete) in &groups {
            let there = values.iter().filter(|v| found.contains(*v)).count();
            assert!(
                there == 0 || there == 3,
                "round {round}: {values:?} is there in part ({there} of 3)"
            );
            match (upsert, delete) {
                (Outcome::Acked, None) => {
                    assert_eq!(there, 3, "round {round}: acknowledged {values:?} lost")
                }
                (_, Some(Outcome::Acked)) => assert_eq!(
                    there, 0,
                    "round {round}: acknowledged delete of {values:?} lost"
                ),
                _ => {}
            }
        }
        // Counts agree with the entries, whatever the kills cut.
        let (status, body) = get(&client, format!("{url}/v1/lists?list=black")).await;
        assert_eq!(status, 200, "{body}");
        let counted = body["lists"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["sandbox"] == "default")
            .map_or(0, |l| l["entries"].as_i64().unwrap());
        let live = found.len() as i64;
        assert_eq!(
            counted, live,
            "round {round}: the count says {counted}, {live} entries are listed ({cut} entries were cut)"
        );
        // The trail: a record for each acknowledged upsert and delete (this round's).
        let prefix = format!("u{round}-");
        for (values, upsert, delete) in groups.iter().filter(|g| g.0[0].starts_with(&prefix)) {
            let ops = audit_ops(&client, &url, &values[0]).await;
            if *upsert == Outcome::Acked {
                assert!(
                    ops.iter().any(|o| o == "upsert"),
                    "round {round}: no upsert record of {}: {ops:?}",
                    values[0]
                );
            }
            if *delete == Some(Outcome::Acked) {
                assert!(
                    ops.iter().any(|o| o == "delete"),
                    "round {round}: no delete record of {}: {ops:?}",
                    values[0]
                );
            }
        }
        // Events: this round's counted once; sent again, still once.
        let prefix = format!("ev{round}-");
        for (ev, entity, outcome) in events.iter().filter(|e| e.0.starts_with(&prefix)) {
            let n = logins(&client, &url, entity).await;
            match outcome {
                Outcome::Acked => assert_eq!(n, 1, "round {round}: event {ev} counted {n} times"),
                Outcome::Unknown => {
                    assert!(n <= 1, "round {round}: cut event {ev} counted {n} times")
                }
            }
            post(
                &client,
                format!("{url}/v1/events"),
                &json!({"id": ev, "type": "login", "fields": {"user_id": entity}}),
            )
            .await;
            let n = logins(&client, &url, entity).await;
            assert_eq!(
                n, 1,
                "round {round}: event {ev} sent again counted {n} times"
            );
        }
        // Rules: every acknowledged one there.
        for (rule, outcome) in &rules {
            if *outcome == Outcome::Acked {
                let (status, body) = get(&client, format!("{url}/v1/rules/{rule}")).await;
                assert_eq!(status, 200, "round {round}: rule {rule} lost: {body}");
            }
        }
        let acked = groups.iter().filter(|g| g.1 == Outcome::Acked).count();
        eprintln!(
            "round {round}: killed after {after:?}; {} groups ({acked} acknowledged), {} events, {} rules, {live} listed, count {counted}, cut {cut}",
            groups.len(),
            events.len(),
            rules.len()
        );
    }
}

fn builder(data: &Path) -> common::ServiceBuilder {
    ServiceProcess::builder()
        .env("NAMELIST_DATA_DIR", data)
        .env("NAMELIST_EXPECTED_ENTRIES", "40000")
        .env("NAMELIST_WORKERS", "1")
        .env("NAMELIST_LOG_FORMAT", "text")
}

/// A second process on a data directory in use is refused, naming the file; the first one
/// goes on serving what it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_in_use_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let first = builder(dir.path()).start().await;
    let client = reqwest::Client::new();
    let body = json!({"entries": [{"dimension": "uid", "value": "held"}]});
    let res = client
        .post(first.url("/v1/lists/black/entries"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let refused = builder(dir.path())
        .try_start()
        .await
        .expect_err("a second process on the same data directory must be refused");
    assert!(!refused.status.success());
    let file = dir.path().join("namelist.redb").display().to_string();
    assert!(
        refused.log.contains(&file) && refused.log.contains("in use by another process"),
        "{}",
        refused.log
    );
    let (status, body) = get(&client, first.url("/v1/lists/black/entries/uid/held")).await;
    assert_eq!((status, body["listed"].as_bool()), (200, Some(true)));
}

/// A database file cut short or with bytes changed is refused with its name, never opened as
/// an empty store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_database_is_refused_with_its_name() {
    for damage in ["truncated", "overwritten"] {
        let dir = tempfile::tempdir().unwrap();
        let mut service = builder(dir.path()).start().await;
        let client = reqwest::Client::new();
        let entries: Vec<Value> = (0..2000)
            .map(|i| json!({"dimension": "uid", "value": format!("v{i}")}))
            .collect();
        let res = client
            .post(service.url("/v1/lists/black/entries"))
            .json(&json!({ "entries": entries }))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        service.sigterm();
        assert!(service.wait_exit(Duration::from_secs(10)).is_some());
        let path = dir.path().join("namelist.redb");
        let bytes = std::fs::read(&path).unwrap();
        let damaged = match damage {
            "truncated" => bytes[..bytes.len() / 2].to_vec(),
            _ => {
                // Every page past the header overwritten with a pattern.
                let mut b = bytes.clone();
                for (i, byte) in b.iter_mut().enumerate().skip(4096) {
                    *byte = (i % 251) as u8;
                }
                b
            }
        };
        std::fs::write(&path, damaged).unwrap();
        let refused = builder(dir.path())
            .try_start()
            .await
            .err()
            .unwrap_or_else(|| panic!("a {damage} database must be refused"));
        assert!(!refused.status.success());
        assert!(
            refused.log.contains(&path.display().to_string()),
            "{damage}: {}",
            refused.log
        );
        eprintln!(
            "{damage}: {}",
            refused.log.lines().last().unwrap_or_default()
        );
    }
}

/// Without a data directory the store says at start-up, at WARN, that nothing survives a
/// restart, and `/readyz` says `"durable": false`; with the deprecated `snapshot_path` alone
/// it says to use `data_dir`, and `/readyz` says `"durable": true`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_says_what_survives() {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let mut service = ServiceProcess::builder()
        .env("NAMELIST_LOG_FORMAT", "text")
        .start()
        .await;
    let (status, ready) = get(&client, service.url("/readyz")).await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(ready["store"], "memory", "{ready}");
    assert_eq!(ready["durable"], false, "{ready}");
    service.sigterm();
    service.wait_exit(Duration::from_secs(10));
    let log = service.log();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("nothing survives a restart")),
        "{log}"
    );
    let mut service = ServiceProcess::builder()
        .env("NAMELIST_LOG_FORMAT", "text")
        .env("NAMELIST_SNAPSHOT_PATH", dir.path().join("lists.snapshot"))
        .start()
        .await;
    let (status, ready) = get(&client, service.url("/readyz")).await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(ready["durable"], true, "{ready}");
    service.sigterm();
    service.wait_exit(Duration::from_secs(10));
    let log = service.log();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("snapshot_path is deprecated")),
        "{log}"
    );
    assert!(dir.path().join("namelist.redb").exists(), "{log}");
}
