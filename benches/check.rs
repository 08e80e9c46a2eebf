//! `POST /v1/check` end to end: reqwest over a keep-alive connection to the real actix
//! service (one worker) on the embedded store, 10,000 entries preloaded in `black`. A
//! 7-dimension subject is checked against `black` and `grey`:
//!
//! * `check/hit`: every value of the subject is listed in `black` (7 hits);
//! * `check/miss`: nothing is listed (14 misses).
//!
//! Both are served from the local cache after the first call (a listed answer and an absent
//! one are cached alike), so this measures HTTP + JSON + normalisation + cache.
//!
//! `cargo bench --bench check`

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use namelist::config::{LogFormat, Settings};
use namelist::startup::Application;
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

fn check(c: &mut Criterion) {
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
        "110105194912310037",
    );

    let (base, client, handle) = rt.block_on(async {
        let settings = Settings {
            listen: "127.0.0.1:0".into(),
            workers: Some(1),
            log_format: LogFormat::Text,
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

    let mut group = c.benchmark_group("check");
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

criterion_group!(benches, check);
criterion_main!(benches);
