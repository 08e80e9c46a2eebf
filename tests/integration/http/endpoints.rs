//! Every endpoint of API.md round trips; 10,000 entries in one request (one node and a cluster).

use crate::common;

use common::{Backend, spawn_app};
use serde_json::{Value, json};

use super::app_on;

pub(super) async fn every_endpoint_round_trips(redis: &Backend) {
    let app = app_on(redis).await;
    let future = namelist::domain::now_ms() + 86_400_000;

    let res = app
        .post(
            "/v1/lists/black/entries",
            &json!({"entries": [
                {"dimension": "phone", "value": "+86 138-0000-0000", "sandbox": "loan",
                 "ttl_seconds": 86400, "reason": "chargeback 2026-11"},
                {"dimension": "ip", "value": "10.1.2.0/24", "expires_at": future, "sandbox": "loan"},
                {"dimension": "device", "value": "d000001"}
            ]}),
        )
        .await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.json::<Value>().await.unwrap(), json!({"written": 3}));

    // Lookups: exact entries, the range by its own value (encoded or raw slash).
    let body: Value = app
        .get("/v1/lists/black/entries/device/d000001")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body, json!({"listed": true, "expires_at": null}));
    for path in [
        "/v1/lists/black/entries/ip/10.1.2.0%2F24?sandbox=loan",
        "/v1/lists/black/entries/ip/10.1.2.0/24?sandbox=loan",
    ] {
        let body: Value = app.get(path).await.json().await.unwrap();
        let at = future.div_euclid(1000) * 1000 + if future % 1000 == 0 { 0 } else { 1000 };
        assert_eq!(body, json!({"listed": true, "expires_at": at}), "{path}");
    }
    let body: Value = app
        .get("/v1/lists/black/entries/phone/%2B8613800000000?sandbox=loan")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body["listed"], true);
    let body: Value = app
        .get("/v1/lists/black/entries/phone/%2B8613800000000")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body, json!({"listed": false}), "another sandbox");

    // The risk engine's check.
    let body = app
        .check(&json!({"sandbox": "loan", "lists": ["black", "grey"],
            "subjects": {"uid": "u1", "phone": "+8613800000000", "device": "d1",
                         "imei": "490154203237518", "ip": ["10.1.2.3", "2001:db8::1"],
                         "wifi_mac": "AA-BB-CC-DD-EE-FF"}}))
        .await;
    assert_eq!(
        body.as_object().unwrap().len(),
        2,
        "hits and degraded only: {body}"
    );
    assert_eq!(body["degraded"], false);
    let mut hits = body["hits"].as_array().unwrap().clone();
    hits.sort_by_key(|h| h["dimension"].as_str().unwrap().to_owned());
    assert_eq!(hits.len(), 2, "{body}");
    assert_eq!(
        hits[0],
        json!({"list": "black", "dimension": "ip", "value": "10.1.2.0/24",
               "expires_at": hits[0]["expires_at"]})
    );
    assert!(hits[0]["expires_at"].as_i64().unwrap() >= future);
    assert_eq!(hits[1]["dimension"], "phone");
    assert_eq!(hits[1]["value"], "+8613800000000");

    // Delete: only present, live entries count.
    let res = app
        .delete(
            "/v1/lists/black/entries",
            &json!({"entries": [
                {"dimension": "device", "value": "d000001"},
                {"dimension": "device", "value": "never-there"}
            ]}),
        )
        .await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.json::<Value>().await.unwrap(), json!({"removed": 1}));
    let body: Value = app
        .get("/v1/lists/black/entries/device/d000001")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body, json!({"listed": false}));

    // Operations.
    let res = app.get("/healthz").await;
    assert_eq!(res.status(), 200);
    let res = app.get("/readyz").await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.json::<Value>().await.unwrap()["store"], "redis");
    let res = app.get("/metrics").await;
    assert_eq!(res.status(), 200);
    let text = res.text().await.unwrap();
    for needle in [
        "namelist_http_request_duration_seconds_bucket{method=\"POST\",route=\"/v1/check\",status=\"200\"",
        "namelist_cache_misses_total",
        "namelist_cache_hits_total",
        "namelist_store_call_duration_seconds",
        "namelist_store_errors_total",
        "namelist_entries_written_total 3",
        "namelist_entries_removed_total 1",
    ] {
        assert!(text.contains(needle), "/metrics lacks {needle}");
    }
    assert!(!text.contains("13800000000"), "no identifier in metrics");
}

pub(super) async fn ten_thousand_entries_in_one_request(redis: &Backend) {
    // About what a 10,000-entry request does, not how fast: a debug build writing it to a
    // cluster beside the rest of the suite on 2 cores once took longer than the default 2 s
    // write deadline (a 503). Its speed is the benches' business.
    let mut settings = redis.settings();
    settings.max_body_bytes = 1024 * 1024;
    settings.write_deadline_ms = 15_000;
    let app = spawn_app(settings).await;
    let entries: Vec<Value> = (0..10_000)
        .map(|i| json!({"dimension": "uid", "value": format!("user-{i}"), "ttl_seconds": 3600}))
        .collect();
    let res = app
        .post("/v1/lists/black/entries", &json!({ "entries": entries }))
        .await;
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.json::<Value>().await.unwrap(),
        json!({"written": 10_000})
    );
    let body = app
        .check(&json!({"lists": ["black"], "subjects": {"uid": ["user-0", "user-9999", "user-10000"]}}))
        .await;
    let values: Vec<&str> = body["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["value"].as_str().unwrap())
        .collect();
    assert_eq!(values, vec!["user-0", "user-9999"]);
}
