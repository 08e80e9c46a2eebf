//! The HTTP contract of API.md on the real application (port 0) and a real `redis-server`:
//! every endpoint, every error code, and the store left unchanged by every bad request.
//!
//! - `endpoints`: every endpoint round trips; 10,000 entries in one request;
//! - `bad_requests`: every bad request is a 4xx with its code and changes nothing;
//! - `values`: values normalised before matching, a bad value that does not void a check,
//!   spellings under rules 2, a keyspace made before rules 2 keeping rules 1;
//! - `storage`: what writes leave in Redis (listpack buckets, integer fields) and deletes after
//!   a flushed script cache.
//!
//! The cases that take a backend run on one node and on a cluster (`on_a_node_and_a_cluster!`
//! below: `http::one_node::…`, `http::redis_cluster_all_cases`).

mod bad_requests;
mod endpoints;
mod storage;
mod values;

use crate::common;

use common::{Backend, RedisCluster, RedisServer, TestApp, spawn_app};
use serde_json::Value;

use bad_requests::every_bad_request_is_a_4xx_and_changes_nothing;
use endpoints::{every_endpoint_round_trips, ten_thousand_entries_in_one_request};
use values::{
    a_bad_value_does_not_void_the_check, spellings_under_rules_2,
    values_are_normalised_before_matching,
};

async fn app_on(redis: &Backend) -> TestApp {
    let mut settings = redis.settings();
    settings.max_body_bytes = 1024 * 1024;
    spawn_app(settings).await
}

/// Asserts the exact error shape of API.md and returns the message.
async fn expect_error(res: reqwest::Response, status: u16, code: &str) -> String {
    assert_eq!(res.status().as_u16(), status, "status for {code}");
    let retry_after = res.headers().get("retry-after").cloned();
    let body: Value = res.json().await.expect("error body is JSON");
    let obj = body.as_object().expect("error body is an object");
    assert_eq!(obj.len(), 1, "only `error` in {body}");
    let err = obj["error"].as_object().expect("`error` is an object");
    assert_eq!(err.len(), 2, "only code and message in {body}");
    assert_eq!(err["code"], code, "code in {body}");
    if status == 503 {
        assert_eq!(retry_after.as_ref().map(|v| v.to_str().unwrap()), Some("1"));
    }
    err["message"]
        .as_str()
        .expect("message is a string")
        .to_owned()
}

macro_rules! on_a_node_and_a_cluster {
    ($($case:ident),* $(,)?) => {
        mod one_node {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(&super::Backend::Node(super::RedisServer::start())).await;
                }
            )*
        }
        /// Every case on one local 6-node cluster.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn redis_cluster_all_cases() {
            let cluster = Backend::Cluster(tokio::task::block_in_place(RedisCluster::start));
            $(
                eprintln!("cluster: {}", stringify!($case));
                $case(&cluster).await;
            )*
        }
    };
}

on_a_node_and_a_cluster!(
    every_endpoint_round_trips,
    ten_thousand_entries_in_one_request,
    every_bad_request_is_a_4xx_and_changes_nothing,
    values_are_normalised_before_matching,
    a_bad_value_does_not_void_the_check,
    spellings_under_rules_2,
);
