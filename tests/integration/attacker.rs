//! Plays the attacker of issue 10 against the real binary on a real Redis: a phone and an ID
//! card are written to a list and counted by a COUNT_DISTINCT metric; the attacker then holds
//! every log line of the run (JSON, at trace level), `/metrics`, the audit trail and a dump of
//! every key in Redis, reads the masks from the audit records (`138****5678`,
//! `1101**********002X`) and tries every candidate that fits them.
//!
//! With the unkeyed function of format 1 and with a wrong key nothing is recovered; with the
//! service's key the search finds exactly the two values, separately in the audit trail, in
//! the logs and in the dump (so the search works, and the test can fail).

use crate::common;

use std::collections::HashSet;

use common::{RedisServer, ServiceProcess};
use namelist::store::{FingerprintKey, Hashing, Layout};
use serde_json::{Value as Json, json};

const PHONE: &str = "13812345678";
const ID_CARD: &str = "11010519491231002X";
const PREFIX: &str = "atk:";
const SANDBOX: &str = "loan";
const METRIC: &str = "ids_per_phone_7d";

/// The service binary, JSON logs at trace level into a file; killed when dropped.
async fn start(redis: &RedisServer) -> ServiceProcess {
    ServiceProcess::builder()
        .envs([
            ("NAMELIST_REDIS_URL", redis.url().as_str()),
            ("NAMELIST_KEY_PREFIX", PREFIX),
            (
                "NAMELIST_FINGERPRINT_KEY_FILE",
                common::key_file().to_str().expect("UTF-8 path"),
            ),
            ("NAMELIST_EXPECTED_ENTRIES", "2000"),
            ("NAMELIST_WORKERS", "1"),
            ("NAMELIST_LOG_FORMAT", "json"),
            ("NAMELIST_CHECK_DEADLINE_MS", "1000"),
            ("RUST_LOG", "trace"),
        ])
        .start()
        .await
}

/// Every maximal run of `[A-Za-z0-9_-]` in `text`: how a fingerprint (hex), a field (signed
/// decimal) or an entity hash (base64url) would show up anywhere.
fn tokens(text: &str) -> HashSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A Redis reply as text.
fn flatten(v: &redis::Value, out: &mut String) {
    use redis::Value as V;
    match v {
        V::BulkString(b) => out.push_str(&String::from_utf8_lossy(b)),
        V::SimpleString(s) => out.push_str(s),
        V::Int(i) => out.push_str(&i.to_string()),
        V::Double(d) => out.push_str(&d.to_string()),
        V::Array(items) | V::Set(items) => {
            for i in items {
                flatten(i, out);
                out.push(' ');
            }
        }
        V::Map(pairs) => {
            for (k, v) in pairs {
                flatten(k, out);
                out.push(' ');
                flatten(v, out);
                out.push(' ');
            }
        }
        other => out.push_str(&format!("{other:?}")),
    }
    out.push(' ');
}

/// Every key of the server and everything in it, as text (the audit trail apart).
fn dump(redis: &RedisServer) -> (String, String) {
    let mut conn = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    let (mut dump, mut audit) = (String::new(), String::new());
    for key in keys {
        let kind: String = redis::cmd("TYPE").arg(&key).query(&mut conn).unwrap();
        let mut cmd = match kind.as_str() {
            "hash" => redis::cmd("HGETALL"),
            "set" => redis::cmd("SMEMBERS"),
            "string" => redis::cmd("GET"),
            "zset" => {
                let mut c = redis::cmd("ZRANGE");
                c.arg(&key).arg(0).arg(-1).arg("WITHSCORES");
                c
            }
            "stream" => {
                let mut c = redis::cmd("XRANGE");
                c.arg(&key).arg("-").arg("+");
                c
            }
            other => panic!("unexpected key type {other} of {key}"),
        };
        if !matches!(kind.as_str(), "zset" | "stream") {
            cmd.arg(&key);
        }
        let value: redis::Value = cmd.query(&mut conn).unwrap();
        // The audit trail: its parts (`<prefix>audit:{<tag>}`) and the older single stream.
        let out = if kind == "stream" && key.starts_with(&format!("{PREFIX}audit")) {
            &mut audit
        } else {
            &mut dump
        };
        out.push_str(&key);
        out.push(' ');
        flatten(&value, out);
        out.push('\n');
    }
    (dump, audit)
}

/// Every 11-digit phone that fits a mask such as `138****5678`.
fn phone_candidates(mask: &str) -> Vec<String> {
    let stars = mask.matches('*').count();
    assert!(stars <= 6, "a mask of {stars} hidden digits: {mask}");
    (0..10u64.pow(stars as u32))
        .map(|n| {
            let digits = format!("{n:0stars$}");
            let mut d = digits.chars();
            mask.chars()
                .map(|c| if c == '*' { d.next().unwrap() } else { c })
                .collect()
        })
        .collect()
}

/// GB 11643: the check character of the first 17 digits.
fn id_check(first17: &[u8]) -> u8 {
    const W: [u32; 17] = [7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2];
    let sum: u32 = first17
        .iter()
        .zip(W)
        .map(|(d, w)| u32::from(d - b'0') * w)
        .sum();
    b"10X98765432"[(sum % 11) as usize]
}

/// Every ID card that fits `1101**********002X`: the two hidden region digits, a birth date
/// (1940–1959: a small space keeps the test fast; the real one is ~12x larger) and a valid
/// check character.
fn id_card_candidates(mask: &str) -> Vec<String> {
    let (head, tail) = (&mask[..4], &mask[14..]);
    assert_eq!(&mask[4..14], "**********", "{mask}");
    let mut out = Vec::new();
    for region in 0..100 {
        for year in 1940..1960 {
            let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
            for month in 1..=12u32 {
                let days = match month {
                    2 if leap => 29,
                    2 => 28,
                    4 | 6 | 9 | 11 => 30,
                    _ => 31,
                };
                for day in 1..=days {
                    let c = format!("{head}{region:02}{year}{month:02}{day:02}{tail}");
                    if id_check(&c.as_bytes()[..17]) == c.as_bytes()[17] {
                        out.push(c);
                    }
                }
            }
        }
    }
    out
}

/// What an entry and its velocity traces would leave under `layout`'s hashing.
fn traces(layout: &Layout, dimension: &str, value: &str) -> Vec<String> {
    let canonical = format!("black\n{dimension}\n{SANDBOX}\n{value}");
    let key = layout.key_of(canonical.as_bytes());
    let mut out = vec![key.field.to_string(), key.fingerprint()];
    match dimension {
        "phone" => {
            let entity = layout.metric_key(METRIC, 1, &[value]);
            // The entity's hash tag: what the key says of the value.
            let hash = entity
                .split_once('{')
                .and_then(|(_, h)| h.split_once('}'))
                .unwrap()
                .0
                .to_owned();
            out.push(hash);
        }
        _ => out.push(layout.distinct_member(value).to_string()),
    }
    out
}

/// The candidates whose traces under `layout` show up in `found`.
fn recovered(
    layout: &Layout,
    found: &HashSet<String>,
    dimension: &str,
    candidates: &[String],
) -> Vec<String> {
    candidates
        .iter()
        .filter(|c| {
            traces(layout, dimension, c)
                .iter()
                .any(|t| found.contains(t))
        })
        .cloned()
        .collect()
}

/// The masked value of the first audit record of `dimension`.
fn mask_of(audit: &str, dimension: &str) -> String {
    let words: Vec<&str> = audit.split_whitespace().collect();
    let at = words
        .windows(2)
        .position(|w| w == ["dimension", dimension])
        .unwrap_or_else(|| panic!("no audit record of {dimension}: {audit}"));
    let value = words[at..].windows(2).find(|w| w[0] == "value").unwrap()[1];
    value.to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masks_logs_and_a_redis_dump_give_nothing_back_without_the_key() {
    let redis = RedisServer::start();
    let mut service = start(&redis).await;
    let client = reqwest::Client::new();
    let url = |p: &str| service.url(p);
    let ok = |res: reqwest::Response| {
        assert!(res.status().is_success(), "{res:?}");
    };

    // Everything a day of operation does with the two values.
    ok(client
        .put(url(&format!("/v1/metrics/{METRIC}")))
        .json(&json!({"expr": "COUNT_DISTINCT(7d, login, id_card) BY phone"}))
        .send()
        .await
        .unwrap());
    ok(client
        .post(url("/v1/lists/black/entries"))
        .json(&json!({"entries": [
            {"dimension": "phone", "value": PHONE, "sandbox": SANDBOX, "reason": "fraud ring"},
            {"dimension": "id_card", "value": ID_CARD, "sandbox": SANDBOX, "ttl_seconds": 3600}
        ]}))
        .send()
        .await
        .unwrap());
    ok(client
        .post(url("/v1/events"))
        .json(&json!({"id": "evt-1", "type": "login", "fields": {"phone": PHONE, "id_card": ID_CARD}}))
        .send()
        .await
        .unwrap());
    let res = client
        .post(url("/v1/evaluate"))
        .json(&json!({"sandbox": SANDBOX, "lists": ["black"],
            "subjects": {"phone": PHONE, "id_card": ID_CARD},
            "metrics": [METRIC], "fields": {"phone": PHONE}}))
        .send()
        .await
        .unwrap();
    let status = res.status();
    let body: Json = res.json().await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["hits"].as_array().unwrap().len(), 2, "{body}");
    assert_eq!(body["features"][METRIC], 1, "{body}");
    ok(client
        .delete(url("/v1/lists/black/entries"))
        .json(&json!({"entries": [{"dimension": "id_card", "value": ID_CARD, "sandbox": SANDBOX}]}))
        .send()
        .await
        .unwrap());
    let metrics = client
        .get(url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    service.kill();
    let logs = service.log() + &metrics;
    assert!(
        logs.lines().count() > 20,
        "trace logs were captured: {logs}"
    );
    let (dump, audit) = dump(&redis);
    drop(service);

    // No raw value anywhere, in any spelling.
    for (what, text) in [("logs", &logs), ("dump", &dump), ("audit", &audit)] {
        for raw in [PHONE, ID_CARD] {
            assert!(!text.contains(raw), "{raw} in the {what}");
        }
    }

    // The attacker reads the masks from the audit trail.
    let phone_mask = mask_of(&audit, "phone");
    let id_mask = mask_of(&audit, "id_card");
    assert_eq!(
        (phone_mask.as_str(), id_mask.as_str()),
        ("+86138****5678", "1101**********002X")
    );
    // Rules 2 keep phones in E.164: the attacker tries every number the mask fits.
    let phones = phone_candidates(&phone_mask);
    let ids = id_card_candidates(&id_mask);
    assert_eq!(phones.len(), 10_000);
    assert!(
        ids.contains(&ID_CARD.to_owned()) && ids.len() > 50_000,
        "{}",
        ids.len()
    );

    let buckets = 1; // the bucket number is not used as a trace: too many collide
    let unkeyed = Layout::new(PREFIX, buckets, Hashing::Unkeyed);
    let wrong = Layout::new(
        PREFIX,
        buckets,
        Hashing::Keyed(
            FingerprintKey::from_hex(
                "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90",
                "a wrong key",
            )
            .unwrap(),
        ),
    );
    let right = Layout::new(PREFIX, buckets, common::keyed());

    let sources = [
        ("audit", tokens(&audit)),
        ("logs", tokens(&logs)),
        ("dump", tokens(&dump)),
    ];
    let everything: HashSet<String> = sources.iter().flat_map(|(_, t)| t.clone()).collect();
    for (name, layout) in [("unkeyed (format 1)", &unkeyed), ("a wrong key", &wrong)] {
        assert_eq!(
            recovered(layout, &everything, "phone", &phones),
            Vec::<String>::new(),
            "phones recovered with {name}"
        );
        assert_eq!(
            recovered(layout, &everything, "id_card", &ids),
            Vec::<String>::new(),
            "ID cards recovered with {name}"
        );
    }
    // With the key, each source alone gives both values back: the search is real.
    for (source, found) in &sources {
        assert_eq!(
            recovered(&right, found, "phone", &phones),
            vec![format!("+86{PHONE}")],
            "the phone from the {source} with the right key"
        );
        assert_eq!(
            recovered(&right, found, "id_card", &ids),
            vec![ID_CARD.to_owned()],
            "the ID card from the {source} with the right key"
        );
    }
}
