//! Acknowledged writes are never lost: under hostile traffic and dropped Redis connections
//! (`CLIENT KILL TYPE normal`), every write answered 200 is there afterwards.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{RedisServer, redis_settings, spawn_app};
use serde_json::{Value, json};

use super::{CASE_TIMEOUT, SERIAL, deep_array};

/// Hostile requests a writer slips in between its upserts: each must be a 400 and write
/// nothing.
fn hostile_writes() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (
            "truncated",
            br#"{"entries":[{"dimension":"uid","val"#.to_vec(),
        ),
        (
            "ttl 1e400",
            br#"{"entries":[{"dimension":"uid","value":"h1","ttl_seconds":1e400}]}"#.to_vec(),
        ),
        (
            "invalid UTF-8",
            b"{\"entries\":[{\"dimension\":\"uid\",\"value\":\"\xff\"}]}".to_vec(),
        ),
        ("deep nesting", {
            let mut v = br#"{"entries":"#.to_vec();
            v.extend(deep_array(10_000));
            v.push(b'}');
            v
        }),
        (
            "wrong type",
            br#"{"entries":[{"dimension":"uid","value":5}]}"#.to_vec(),
        ),
        (
            "a good entry, then a bad one",
            br#"{"entries":[{"dimension":"uid","value":"h2"},{"dimension":"phone","value":"x"}]}"#
                .to_vec(),
        ),
        (
            "oversize value",
            format!(
                r#"{{"entries":[{{"dimension":"uid","value":"{}"}}]}}"#,
                "a".repeat(1 << 20)
            )
            .into_bytes(),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_writes_survive_hostile_traffic_and_dropped_connections() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let settings = redis_settings(&redis);
    let prefix = settings.key_prefix.clone();
    let app = Arc::new(spawn_app(settings).await);
    let stop = Arc::new(AtomicBool::new(false));

    const WRITERS: usize = 4;
    const PER_WRITER: usize = 120;
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let app = app.clone();
        writers.push(tokio::spawn(async move {
            let hostile = hostile_writes();
            let mut outcomes: Vec<(Vec<String>, u16)> = Vec::new();
            let mut bad: Vec<String> = Vec::new();
            for i in 0..PER_WRITER {
                if i % 4 == 3 {
                    let (label, body) = &hostile[(i / 4 + w) % hostile.len()];
                    let res = app
                        .client
                        .post(app.url("/v1/lists/black/entries"))
                        .body(body.clone())
                        .timeout(CASE_TIMEOUT)
                        .send()
                        .await;
                    match res {
                        Ok(r) if r.status() == 400 => {}
                        Ok(r) => bad.push(format!("hostile {label}: {}", r.status())),
                        Err(e) => bad.push(format!("hostile {label}: {e}")),
                    }
                }
                let values: Vec<String> = (0..3).map(|k| format!("ack-{w}-{i}-{k}")).collect();
                let body = json!({"entries": values.iter().map(|v| json!({"dimension": "uid", "value": v})).collect::<Vec<_>>()});
                let res = app
                    .client
                    .post(app.url("/v1/lists/black/entries"))
                    .json(&body)
                    .timeout(CASE_TIMEOUT)
                    .send()
                    .await;
                let status = match res {
                    Ok(r) => {
                        let s = r.status().as_u16();
                        if s == 200 {
                            let v: Value = r.json().await.unwrap_or(Value::Null);
                            if v != json!({"written": 3}) {
                                bad.push(format!("upsert {w}-{i}: 200 with {v}"));
                            }
                        } else if s == 503 {
                            if r.headers().get("retry-after").is_none() {
                                bad.push(format!("upsert {w}-{i}: 503 without Retry-After"));
                            }
                        } else {
                            bad.push(format!("upsert {w}-{i}: status {s}"));
                        }
                        s
                    }
                    Err(e) => {
                        bad.push(format!("upsert {w}-{i}: {e}"));
                        0
                    }
                };
                outcomes.push((values, status));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (outcomes, bad)
        }));
    }
    // Drop every normal Redis connection of the service, again and again, while they write.
    let killer = {
        let stop = stop.clone();
        let url = redis.url();
        tokio::task::spawn_blocking(move || {
            let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
            let mut kills = 0;
            let mut killed = 0;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(150));
                if let Ok(n) = redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("TYPE")
                    .arg("normal")
                    .query::<i64>(&mut conn)
                {
                    kills += 1;
                    killed += n;
                }
            }
            (kills, killed)
        })
    };
    let mut outcomes = Vec::new();
    let mut bad = Vec::new();
    for w in writers {
        let (o, b) = w.await.unwrap();
        outcomes.extend(o);
        bad.extend(b);
    }
    stop.store(true, Ordering::Relaxed);
    let (kills, killed) = killer.await.unwrap();

    // The service recovers: a write goes through within a few seconds.
    let started = Instant::now();
    loop {
        let res = app
            .post(
                "/v1/lists/black/entries",
                &json!({"entries": [{"dimension": "uid", "value": "after-the-kills"}]}),
            )
            .await;
        if res.status() == 200 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "writes do not recover after the connection drops: {}",
            res.status()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Every acknowledged entry is listed, as seen by a fresh instance (no cache of its own).
    let fresh = spawn_app(namelist::config::Settings {
        key_prefix: prefix,
        ..redis_settings(&redis)
    })
    .await;
    let acked: Vec<&String> = outcomes
        .iter()
        .filter(|(_, s)| *s == 200)
        .flat_map(|(v, _)| v)
        .collect();
    let refused = outcomes.iter().filter(|(_, s)| *s == 503).count();
    let mut lost = Vec::new();
    for v in &acked {
        let body: Value = fresh
            .get(&format!("/v1/lists/black/entries/uid/{v}"))
            .await
            .json()
            .await
            .unwrap();
        if body["listed"] != true {
            lost.push(format!("{v}: {body}"));
        }
    }
    for v in ["h1", "h2"] {
        let body: Value = fresh
            .get(&format!("/v1/lists/black/entries/uid/{v}"))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(
            body,
            json!({"listed": false}),
            "{v} came from a refused request"
        );
    }
    eprintln!(
        "acknowledged writes: {} requests, {} acknowledged entries, {refused} answered 503, \
         {kills} CLIENT KILLs dropping {killed} connections",
        outcomes.len(),
        acked.len()
    );
    assert!(bad.is_empty(), "unexpected answers:\n{}", bad.join("\n"));
    assert!(
        lost.is_empty(),
        "{} acknowledged entries are not listed:\n{}",
        lost.len(),
        lost.join("\n")
    );
    assert!(kills >= 5 && killed > 0, "the connections were dropped");
    assert!(
        acked.len() > WRITERS * PER_WRITER * 3 / 2,
        "most writes are acknowledged ({} of {})",
        acked.len(),
        WRITERS * PER_WRITER * 3
    );
}
