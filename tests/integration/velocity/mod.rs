//! Velocity metrics against a brute-force oracle, on both stores.
//!
//! The oracle keeps every event and computes each aggregation by API.md's window semantics
//! (sub-window `floor(ts/r)`, value at `t` over `[floor(t/r) - W/r + 1, floor(t/r)]`). Random
//! event streams (timestamps, group-by values, amounts with up to 4 decimals, distinct values,
//! repeated ids) go to the service, on the embedded store and on a real redis-server, and every
//! metric is compared at random query times: equal for exact aggregations, within 3 % for
//! APPROX_COUNT_DISTINCT. Then the seeds' examples, version bumps, replays and the listpack
//! encoding of a long stream.
//!
//! - `oracle`: the oracle and its random streams, on the embedded store and on Redis;
//! - `behaviours`: the cases run on both stores and a cluster (`on_both_stores!` below:
//!   `velocity::memory_store::…`, `velocity::redis_store::…`,
//!   `velocity::redis_cluster_all_cases`), and replays racing on two instances;
//! - `on_redis`: what only Redis shows (listpack hashes, a flushed script cache, event ids, a
//!   keyspace made before layout 2).
//!
//! This module holds the stores, the velocity services and the events the files share.

mod behaviours;
mod on_redis;
mod oracle;

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{RedisCluster, RedisServer, unique_prefix};
use namelist::domain::MetricId;
use namelist::lists::FailMode;
use namelist::metrics::Metrics;
use namelist::store::memory::MemoryStore;
use namelist::store::redis::{RedisOptions, RedisStore};
use namelist::store::{Layout, Store};
use namelist::velocity::{EventInput, FieldValue, Fields, Velocity, VelocitySettings};
use proptest::prelude::*;
use proptest::strategy::ValueTree;

use behaviours::{
    empty_windows_answer_zero_or_null, late_future_and_bad_input, replays_change_nothing,
    the_distinct_cap_is_reported, the_seeds_examples, version_bumps_forget_old_counts,
};
use oracle::{events_strategy, run_case};

fn settings() -> VelocitySettings {
    VelocitySettings {
        read_deadline: Duration::from_secs(2),
        write_deadline: Duration::from_secs(2),
        fail_mode: FailMode::Open,
        distinct_cap: 10_000,
        dedupe_window: std::time::Duration::from_secs(86_400),
        limits: namelist::velocity::DefinitionLimits::default(),
    }
}

async fn memory_store() -> Arc<dyn Store> {
    Arc::new(
        MemoryStore::open(Layout::new(unique_prefix(), 16, common::keyed()), 100, None).unwrap(),
    )
}

/// A Redis store on `url` (or the cluster `nodes`) at `prefix`.
async fn redis_at(url: String, nodes: Vec<String>, prefix: &str, ids: u64) -> Arc<RedisStore> {
    let (store, _) = RedisStore::open(RedisOptions {
        cluster_nodes: nodes,
        expected_entries: Some(4000),
        default_expected_entries: 4000,
        response_timeout: Duration::from_secs(5),
        audit_max_len: 100,
        dedupe_expected_ids: ids,
        ..common::redis_options(url, prefix)
    })
    .await
    .unwrap();
    Arc::new(store)
}

async fn redis_store(redis: &RedisServer) -> Arc<dyn Store> {
    let ids = namelist::store::layout::DEFAULT_EXPECTED_EVENT_IDS;
    redis_at(redis.url(), Vec::new(), &unique_prefix(), ids).await
}

async fn cluster_store(cluster: &RedisCluster) -> Arc<dyn Store> {
    let ids = namelist::store::layout::DEFAULT_EXPECTED_EVENT_IDS;
    redis_at(String::new(), cluster.urls(), &unique_prefix(), ids).await
}

async fn velocity(store: Arc<dyn Store>) -> Arc<Velocity> {
    velocity_with(store, settings()).await
}

async fn velocity_with(store: Arc<dyn Store>, settings: VelocitySettings) -> Arc<Velocity> {
    Velocity::new(
        store.clone(),
        store.clone(),
        store,
        settings,
        Arc::new(Metrics::new()),
    )
    .await
    .unwrap()
}

fn fields(pairs: &[(&str, &str)]) -> Fields {
    pairs
        .iter()
        .map(|(k, v)| {
            let v = if v.parse::<f64>().is_ok() {
                FieldValue::Number(v.to_string())
            } else {
                FieldValue::Text(v.to_string())
            };
            (k.to_string(), v)
        })
        .collect()
}

fn event(id: Option<&str>, ty: &str, ts: i64, f: &[(&str, &str)]) -> EventInput {
    EventInput {
        id: id.map(str::to_owned),
        event_type: ty.parse().unwrap(),
        ts: Some(ts),
        fields: fields(f),
    }
}

fn mid(s: &str) -> MetricId {
    s.parse().unwrap()
}

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;

macro_rules! on_both_stores {
    ($($case:ident),* $(,)?) => {
        mod memory_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::memory_store().await).await;
                }
            )*
        }
        mod redis_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let redis = super::RedisServer::start();
                    super::$case(super::redis_store(&redis).await).await;
                }
            )*
        }
        /// Every case, and oracle streams, on one local 6-node cluster.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn redis_cluster_all_cases() {
            let cluster = tokio::task::block_in_place(RedisCluster::start);
            $(
                eprintln!("cluster: {}", stringify!($case));
                $case(cluster_store(&cluster).await).await;
            )*
            let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
                cases: 8,
                failure_persistence: None,
                ..ProptestConfig::default()
            });
            let strategy = (events_strategy(), 1usize..50, prop::collection::vec(0i64..i64::MAX, 6));
            for _ in 0..8 {
                let (evs, batch, probes) = strategy.new_tree(&mut runner).unwrap().current();
                run_case(cluster_store(&cluster).await, true, evs, batch, probes).await.unwrap();
            }
        }
    };
}

on_both_stores!(
    the_seeds_examples,
    version_bumps_forget_old_counts,
    replays_change_nothing,
    late_future_and_bad_input,
    empty_windows_answer_zero_or_null,
    the_distinct_cap_is_reported,
);
