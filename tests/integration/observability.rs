//! What operators see: request ids, and JSON log lines inside `request` and `store` spans with
//! no raw identifier in them. (The last audit's findings as gauges on `/metrics` need
//! `namelist-tools audit`: `tools/tests/integration/audit.rs`.)

use crate::common;

use std::time::Duration;

use common::{RedisServer, ServiceProcess, spawn_app, test_settings};
use serde_json::{Value, json};

const PHONE: &str = "13812345678";
const IMEI: &str = "490154203237518";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_carries_a_request_id() {
    let app = spawn_app(test_settings()).await;
    let id_of = |res: &reqwest::Response| {
        res.headers()
            .get("x-request-id")
            .map(|v| v.to_str().unwrap().to_owned())
            .expect("x-request-id on every answer")
    };
    let a = id_of(&app.get("/healthz").await);
    let b = id_of(&app.get("/v1/nowhere").await);
    assert_ne!(a, b, "ids are unique");

    // A caller's id that looks like an id is kept, so its logs and ours can be joined: a
    // UUID, a ULID, or hex digits and `-` with a letter.
    for sane in [
        "0f8fad5b-d9cb-469f-a165-70867728950e",
        "01ARZ3NDEKTSV4RRFFQ69G5FAV",
        "7f3a42bc",
        "bead-7f3a-0042-cafe",
    ] {
        let res = app
            .client
            .get(app.url("/healthz"))
            .header("x-request-id", sane)
            .send()
            .await
            .unwrap();
        assert_eq!(id_of(&res), sane);
    }
    // Anything else is replaced: it could be an identifier or forge a log line.
    for bad in [
        PHONE,
        "203.0.113.77",
        "139-1234-5678",
        "490154203237518",
        "engine-7f3a:42",
        "11010519491231002X",
        "has space",
        "13812345678\n{\"level\":\"ERROR\"}",
        &"x".repeat(65),
        "",
    ] {
        let res = app
            .client
            .get(app.url("/healthz"))
            .header("x-request-id", bad.replace('\n', " "))
            .send()
            .await
            .unwrap();
        let id = id_of(&res);
        assert_ne!(id, bad.replace('\n', " "));
        assert!(
            id.len() <= 32 && id.chars().all(|c| c.is_ascii_hexdigit() || c == '-'),
            "{id}"
        );
    }
}

/// The binary on a Redis, logging JSON at debug into a file; killed when dropped.
async fn start_logged(redis: &RedisServer) -> ServiceProcess {
    ServiceProcess::builder()
        .envs([
            (
                "NAMELIST_FINGERPRINT_KEY_FILE",
                common::key_file().to_str().expect("UTF-8 path"),
            ),
            ("NAMELIST_REDIS_URL", redis.url().as_str()),
            ("NAMELIST_KEY_PREFIX", "obs:"),
            ("NAMELIST_WORKERS", "1"),
            ("NAMELIST_LOG_FORMAT", "json"),
            // A check deadline a loaded CI machine meets; debug shows every request line.
            ("NAMELIST_CHECK_DEADLINE_MS", "1000"),
            ("NAMELIST_WRITE_DEADLINE_MS", "300"),
            ("RUST_LOG", "debug"),
        ])
        .start()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_json_in_spans_and_never_hold_a_raw_identifier() {
    let redis = RedisServer::start();
    let service = start_logged(&redis).await;
    let client = reqwest::Client::new();
    let url = |p: &str| service.url(p);

    let res = client
        .post(url("/v1/lists/black/entries"))
        .json(&json!({"entries": [
            {"dimension": "phone", "value": PHONE, "reason": "test"},
            {"dimension": "imei", "value": IMEI}
        ]}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let res = client
        .post(url("/v1/check"))
        .json(&json!({"lists": ["black"], "subjects": {"phone": PHONE, "imei": IMEI}}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let check_id = res.headers()["x-request-id"].to_str().unwrap().to_owned();
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["hits"].as_array().unwrap().len(), 2, "{body}");
    // The identifier in the path and in a refused body.
    let res = client
        .get(url(&format!("/v1/lists/black/entries/phone/{PHONE}")))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let res = client
        .post(url("/v1/check"))
        .json(&json!({"lists": ["black"], "subjects": {"phone": [PHONE, 5]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    // The operators' reads (issue 13): the identifier in the lookup path and in the audit
    // filter's query string, answered and refused.
    for path in [
        format!("/v1/lists/-/lookup/phone/{PHONE}?sandbox=default"),
        format!("/v1/audit?dimension=phone&value={PHONE}"),
        format!("/v1/audit?dimension=imei&value={IMEI}&op=upsert&limit=5"),
        "/v1/lists".to_owned(),
    ] {
        let res = client.get(url(&path)).send().await.unwrap();
        assert_eq!(res.status(), 200, "{path}");
        let body = res.text().await.unwrap();
        // A lookup's hit names the listed value, as a check's does: the operator typed it.
        if !path.contains("/lookup/") {
            for raw in [PHONE, IMEI] {
                assert!(!body.contains(raw), "{path} answers {raw}: {body}");
            }
        }
    }
    let res = client
        .post(url("/v1/audit"))
        .json(&json!({"dimension": "phone", "value": PHONE, "limit": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(!res.text().await.unwrap().contains(PHONE));
    // The lookup with the identity in the body: answered, and refused for a bad value.
    let res = client
        .post(url("/v1/lists/-/lookup"))
        .json(&json!({"dimension": "phone", "value": PHONE, "sandbox": "default"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["hits"].as_array().map(Vec::len), Some(1), "{body}");
    let res = client
        .post(url("/v1/lists/-/lookup"))
        .json(&json!({"dimension": "imei", "value": "490154203237519"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400, "a bad Luhn digit");
    assert!(!res.text().await.unwrap().contains("490154203237519"));
    let res = client
        .get(url(&format!("/v1/audit?value={PHONE}")))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400, "a value without its dimension");
    assert!(!res.text().await.unwrap().contains(PHONE));
    // A store failure inside a span: Redis stalls past the deadline.
    let sleeper = redis.debug_sleep(1.5);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let res = client
        .post(url("/v1/lists/black/entries"))
        .json(&json!({"entries": [{"dimension": "phone", "value": "13900000001"}]}))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    sleeper.join().unwrap();
    assert_eq!(res.status(), 503, "the write missed its 300 ms deadline");

    // The request lines are written when the answer is; give the file a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = service.log();
    assert!(!log.is_empty());
    let mut request_lines = Vec::new();
    for line in log.lines() {
        let v: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            v["level"].is_string() && v["timestamp"].is_string(),
            "{line}"
        );
        if v["message"] == "request" {
            request_lines.push(v);
        }
    }
    for raw in [PHONE, IMEI, "13900000001"] {
        assert!(!log.contains(raw), "the log holds {raw}:\n{log}");
    }
    let check_line = request_lines
        .iter()
        .find(|v| v["span"]["request_id"] == check_id.as_str())
        .unwrap_or_else(|| panic!("no request line for {check_id}:\n{log}"));
    assert_eq!(check_line["span"]["route"], "/v1/check");
    assert_eq!(check_line["span"]["method"], "POST");
    assert_eq!(check_line["status"], 200);
    assert!(
        request_lines
            .iter()
            .any(|v| v["span"]["route"] == "/v1/lists/{list}/entries/{dimension}/{value:.*}"),
        "the lookup is logged by its route pattern:\n{log}"
    );
    for route in [
        "/v1/lists/-/lookup/{dimension}/{value:.*}",
        "/v1/audit",
        "/v1/lists",
    ] {
        assert!(
            request_lines.iter().any(|v| v["span"]["route"] == route),
            "{route} is logged by its route pattern:\n{log}"
        );
    }
    // The failed store call is logged inside the store span, inside the request span.
    let failed = log
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|v| v["message"] == "store call failed")
        .unwrap_or_else(|| panic!("no store failure logged:\n{log}"));
    assert_eq!(failed["span"]["op"], "write", "{failed}");
    let spans: Vec<&str> = failed["spans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(spans, ["request", "store"], "{failed}");
}
