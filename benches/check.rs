//! `POST /v1/check` end to end: reqwest over a keep-alive connection to the real actix
//! service (one worker) on the embedded store, 10,000 entries preloaded in `black`. A
//! 7-dimension subject is checked against `black` and `grey`:
//!
//! * `check/hit`: every value of the subject is listed in `black` (7 hits);
//! * `check/miss`: nothing is listed (14 misses).
//!
//! Both are served from the local cache after the first call (a listed answer and an absent
//! one are cached alike), so this measures HTTP + JSON + normalisation + cache.
//! `check_durable/hit` and `/miss`: the same on a data directory (issue 28: the durable
//! embedded store answers from the same in-memory state).
//!
//! `matching/…` (issue 14) measures what phone segments and e-mail domains cost a check: a
//! phone checked against `black` and `grey` with 0, 3 and 8 segment lengths in use in `black`
//! (`phone/k0`, `k3`, `k8`: 2, 5 and 10 lookups), and an address on a 5-label domain with 0
//! and 4 domain lengths in use (`email/d0`, `d4`: 2 and 6 lookups); none of them listed, so
//! every answer is the same. Each on the embedded store, on Redis with the local tier
//! (complete: lookups answered in the pod) and on Redis with the tier off (every lookup an
//! `HGET` in one pipelined round trip), with 10,000 and 1,000,000 filler entries in the
//! keyspace (written straight through the store as random fields, sized buckets): the cost
//! must follow the lookups, never the entries. Each case is measured twice: end to end over
//! HTTP, and `…/lib`, the service's `NameLists::check` alone (where a lookup's cost is not
//! lost in HTTP's). `NAMELIST_BENCH_MATCHING_SIZES` (e.g.
//! `10000`) changes the sizes.
//!
//! `cargo bench --bench check` (`-- matching` for issue 14's figures alone; the Redis cases
//! need `redis-server` on PATH or `$REDIS_SERVER`)

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use namelist::config::{LogFormat, Settings};
use namelist::lists::{CheckQuery, RawCheck};
use namelist::startup::Application;
use namelist::store::{Deadline, EntryKey, WriteBatch};
use secrecy::SecretString;
use serde_json::{Value as Json, json};

const PRELOAD: usize = 10_000;

fn subject(
    uid: &str,
    phone: &str,
    device: &str,
    imei: &str,
    ip: &str,
    mac: &str,
    id_card: &str,
) -> Json {
    json!({
        "uid": uid,
        "phone": phone,
        "device": device,
        "imei": imei,
        "ip": ip,
        "wifi_mac": mac,
        "id_card": id_card,
    })
}

fn check_body(subjects: Json) -> String {
    json!({"sandbox": "loan", "lists": ["black", "grey"], "subjects": subjects}).to_string()
}

/// A deterministic xorshift64* stream for the filler entries.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

async fn post(client: &reqwest::Client, url: &str, body: String) -> (u16, Json) {
    let res = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("request");
    let status = res.status().as_u16();
    (status, res.json().await.expect("JSON body"))
}

/// `check/*`: the embedded store in memory only (the default); `check_durable/*`: the same
/// with a data directory (reads are the same in-memory lookups; only writes wait for the
/// fsync).
fn check(c: &mut Criterion) {
    check_on(c, "check", None);
    let dir = tempfile::tempdir().expect("a data directory");
    check_on(c, "check_durable", Some(dir.path().to_owned()));
}

fn check_on(c: &mut Criterion, group_name: &str, data_dir: Option<std::path::PathBuf>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");

    let hit = subject(
        "u1",
        "13800000000",
        "d1",
        "490154203237518",
        "10.1.2.3",
        "AA-BB-CC-DD-EE-FF",
        "11010519491231002X",
    );
    let miss = subject(
        "u2",
        "13900000000",
        "d2",
        "490154203237526",
        "10.9.8.7",
        "11-22-33-44-55-66",
        "110105194912310038",
    );

    let (base, client, handle) = rt.block_on(async {
        let settings = Settings {
            listen: "127.0.0.1:0".into(),
            workers: Some(1),
            log_format: LogFormat::Text,
            data_dir: data_dir.clone(),
            ..Settings::default()
        };
        let app = Application::build(settings)
            .await
            .expect("application starts");
        let port = app.port();
        let lists = app.lists();
        let handle = app.handle();
        tokio::spawn(app.run_until_stopped());
        let started = Instant::now();
        while !lists.cache().is_trusted() {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "cache invalidation never came up"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(1)
            .build()
            .expect("HTTP client");
        let base = format!("http://127.0.0.1:{port}");

        // The hit subject's 7 values, plus filler phones, devices and uids: 10,000 entries.
        let mut entries: Vec<Json> = hit
            .as_object()
            .expect("subject object")
            .iter()
            .map(|(dim, v)| json!({"dimension": dim, "value": v, "sandbox": "loan"}))
            .collect();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        while entries.len() < PRELOAD {
            let r = rng.next();
            let (dim, value) = match r % 3 {
                0 => ("phone", format!("13{:09}", (r >> 8) % 1_000_000_000)),
                1 => ("device", format!("dev-{:016x}", rng.next())),
                _ => ("uid", format!("user-{}", r >> 4)),
            };
            entries.push(json!({
                "dimension": dim,
                "value": value,
                "sandbox": "loan",
                "ttl_seconds": 30 * 86_400,
            }));
        }
        let (status, body) = post(
            &client,
            &format!("{base}/v1/lists/black/entries"),
            json!({ "entries": entries }).to_string(),
        )
        .await;
        assert_eq!(status, 200, "preload failed: {body}");
        assert_eq!(body["written"], PRELOAD, "preload: {body}");
        (base, client, handle)
    });

    let url = format!("{base}/v1/check");
    let hit_body = check_body(hit);
    let miss_body = check_body(miss);

    // Sanity checks (and the first, uncached call of each subject).
    rt.block_on(async {
        let (status, body) = post(&client, &url, hit_body.clone()).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            body["hits"].as_array().map(Vec::len),
            Some(7),
            "hit subject: {body}"
        );
        let (status, body) = post(&client, &url, miss_body.clone()).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            body["hits"].as_array().map(Vec::len),
            Some(0),
            "miss subject: {body}"
        );
        assert_eq!(body["degraded"], false, "{body}");
    });

    let mut group = c.benchmark_group(group_name);
    for (name, body) in [("hit", &hit_body), ("miss", &miss_body)] {
        group.bench_function(name, |b| {
            b.to_async(&rt).iter(|| async {
                let res = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await
                    .expect("check request");
                assert!(res.status().is_success(), "check answered {}", res.status());
                black_box(res.bytes().await.expect("check body"))
            })
        });
    }
    group.finish();

    rt.block_on(handle.stop(true));
}

/// Where `matching` runs.
#[derive(Clone, Copy)]
enum Backend {
    Embedded,
    Redis,
    RedisTierOff,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Embedded => "embedded",
            Backend::Redis => "redis",
            Backend::RedisTierOff => "redis-tier-off",
        }
    }
}

/// Segments of `lens` lengths in `black`, none a prefix of the checked phone (`17012345678`).
fn segments(lens: std::ops::RangeInclusive<usize>) -> Vec<Json> {
    lens.map(|n| json!({"dimension": "phone", "value": format!("{}*", "9".repeat(n)), "sandbox": "loan"}))
        .collect()
}

fn matching(c: &mut Criterion) {
    let sizes: Vec<u64> = std::env::var("NAMELIST_BENCH_MATCHING_SIZES")
        .unwrap_or_else(|_| "10000,1000000".into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("NAMELIST_BENCH_MATCHING_SIZES: numbers")
        })
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut group = c.benchmark_group("matching");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    let phone = |lists: &[&str]| {
        json!({"sandbox": "loan", "lists": lists, "subjects": {"phone": "17012345678"}}).to_string()
    };
    let email = json!({"sandbox": "loan", "lists": ["black", "grey"],
                       "subjects": {"email": "someone@a.b.c.example.com"}})
    .to_string();
    for backend in [Backend::Embedded, Backend::Redis, Backend::RedisTierOff] {
        for &entries in &sizes {
            let redis = match backend {
                Backend::Embedded => None,
                _ => Some(common::RedisServer::start()),
            };
            let (base, client, handle, lists) = rt.block_on(async {
                let mut settings = Settings {
                    workers: Some(1),
                    expected_entries: Some(entries),
                    ..common::test_settings()
                };
                if let Some(r) = &redis {
                    settings.redis_url = Some(SecretString::from(r.url()));
                }
                if let Backend::RedisTierOff = backend {
                    settings.local_memory_mb = 0.0;
                }
                let app = Application::build(settings)
                    .await
                    .expect("application starts");
                let port = app.port();
                let lists = app.lists();
                let handle = app.handle();
                tokio::spawn(app.run_until_stopped());
                // Filler: random fields in the keyspace's buckets, through the store itself.
                let store = lists.store().clone();
                let buckets = store.layout().buckets();
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ entries);
                let mut left = entries;
                while left > 0 {
                    let n = left.min(20_000);
                    let batch = WriteBatch {
                        entries: (0..n)
                            .map(|_| {
                                let key = EntryKey {
                                    bucket: (rng.next() % u64::from(buckets)) as u32,
                                    field: rng.next() as i64,
                                };
                                (key, 0)
                            })
                            .collect(),
                        ..WriteBatch::default()
                    };
                    store
                        .write(batch, Deadline::after(Duration::from_secs(60)))
                        .await
                        .expect("filler written");
                    left -= n;
                }
                assert!(lists.cache().wait_settled(Duration::from_secs(120)).await);
                lists.cache().wait_idle(Duration::from_secs(120)).await;
                let (held, bytes) = lists.cache().held_stats();
                eprintln!(
                    "matching/{}/{entries}: {buckets} buckets, tier {:?}, {held} held ({bytes} B)",
                    backend.name(),
                    lists.cache().mode()
                );
                let client = reqwest::Client::builder()
                    .timeout(Duration::from_secs(10))
                    .pool_max_idle_per_host(1)
                    .build()
                    .expect("HTTP client");
                (format!("http://127.0.0.1:{port}"), client, handle, lists)
            });
            let url = format!("{base}/v1/check");
            let add = |entries: Vec<Json>| {
                rt.block_on(async {
                    let (status, body) = post(
                        &client,
                        &format!("{base}/v1/lists/black/entries"),
                        json!({ "entries": entries }).to_string(),
                    )
                    .await;
                    assert_eq!(status, 200, "{body}");
                })
            };
            let mut bench = |name: String, body: &str| {
                // The service's own check, without HTTP: where the lookups' cost shows.
                let raw: Json = serde_json::from_str(body).expect("a check body");
                let subjects = raw["subjects"]
                    .as_object()
                    .expect("subjects")
                    .iter()
                    .map(|(d, v)| (d.clone(), vec![v.as_str().expect("one value").to_owned()]))
                    .collect();
                let query = CheckQuery::try_from(RawCheck {
                    sandbox: Some("loan".into()),
                    lists: vec!["black".into(), "grey".into()],
                    subjects,
                    ..RawCheck::default()
                })
                .expect("a valid check");
                group.bench_function(format!("{name}/lib"), |b| {
                    b.to_async(&rt).iter(|| async {
                        let out = lists.check(&query).await.expect("check succeeds");
                        assert!(out.hits.is_empty() && !out.degraded);
                        black_box(out)
                    })
                });
                rt.block_on(async {
                    let (status, answer) = post(&client, &url, body.to_owned()).await;
                    assert_eq!(status, 200, "{answer}");
                    assert_eq!(answer["hits"], json!([]), "{name}: {answer}");
                    assert_eq!(answer["degraded"], false, "{name}: {answer}");
                });
                group.bench_function(name, |b| {
                    b.to_async(&rt).iter(|| async {
                        let res = client
                            .post(&url)
                            .header("content-type", "application/json")
                            .body(body.to_owned())
                            .send()
                            .await
                            .expect("check request");
                        assert!(res.status().is_success(), "check answered {}", res.status());
                        black_box(res.bytes().await.expect("check body"))
                    })
                });
            };
            let at = |what: &str| format!("{}/{entries}/{what}", backend.name());
            let body = phone(&["black", "grey"]);
            bench(at("phone/k0"), &body);
            add(segments(3..=5));
            bench(at("phone/k3"), &body);
            add(segments(6..=10));
            bench(at("phone/k8"), &body);
            bench(at("email/d0"), &email);
            add(["@x.org", "@a.x.org", "@b.a.x.org", "@c.b.a.x.org"]
                .iter()
                .map(|d| json!({"dimension": "email", "value": d, "sandbox": "loan"}))
                .collect());
            bench(at("email/d4"), &email);
            rt.block_on(handle.stop(true));
            drop(redis);
        }
    }
    group.finish();
}

criterion_group!(benches, check, matching);
criterion_main!(benches);
