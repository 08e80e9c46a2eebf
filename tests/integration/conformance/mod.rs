//! The conformance suite: one set of behaviours per store trait that every backend must show,
//! one module per trait, each case written once and run by `conformance!` on every backend:
//! the embedded store in memory and durable (a fresh data directory per case, which after the
//! case is closed, reopened and must hold exactly the state the store had), a real
//! `redis-server` of its own (keyed with the local tier complete,
//! partial and off, and once more on an unkeyed format-1 keyspace) and a local cluster (one
//! cluster for every case of every module, each case on a keyspace of its own).
//!
//! * `base`: `StoreBase` (the backend's name, its keyspace, ping);
//! * `entries`: `EntryStore`, through the name-list service and its local tier (upsert,
//!   refresh, delete, expiry, sandboxes, IP ranges, lazy delete, the audit trail, limits), and
//!   whole-bucket reads directly;
//! * `bus`: `InvalidationBus` (every subscriber hears every message; writes and deletes
//!   publish their changes, housekeeping nothing);
//! * `metrics`: `MetricStore`, directly (each family's window, events applied once per entity,
//!   the distinct cap); the velocity service's oracle over random streams stays in
//!   `tests/integration/velocity/oracle.rs`, on the embedded store, Redis and a cluster;
//! * `definitions`: `DefinitionStore` (versions kept, bumped, never reused; kinds apart;
//!   every change published);
//! * `audit_reports`: `AuditReports` (no summary until an audit leaves one, then exactly it);
//! * `operators`: what operators read (issue 13): the lists' counts, one identity on every
//!   list of a sandbox, the audit trail paged and filtered, through its index too (held to a
//!   brute-force scan of the whole trail), cursors with nothing older included.
//!
//! With a complete tier, every check waits until the tier has read again what writes
//! touched, and then must be answered without a single lookup sent to Redis.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use namelist::lists::{FailMode, ListSettings, NameLists};
use namelist::metrics::Metrics;
use namelist::store::durable::Durable;
use namelist::store::memory::MemoryStore;
use namelist::store::redis::{RedisOptions, RedisStore};
use namelist::store::{
    Deadline, FingerprintKey, Invalidation, InvalidationStream, Layout, Store, StoreBase,
};
use namelist::tier::Mode;

use common::{RedisCluster, RedisServer, unique_prefix};

struct Harness {
    lists: NameLists,
    store: Arc<dyn Store>,
    /// The same store when it is Redis (what only the Redis store offers: the audit tool's
    /// writes).
    redis_store: Option<Arc<RedisStore>>,
    /// The same store when it is the embedded one.
    memory_store: Option<Arc<MemoryStore>>,
    /// The embedded store's data directory when it is durable.
    data_dir: Option<tempfile::TempDir>,
    /// How the Redis store was opened, to open another keyspace beside it.
    redis_options: Option<RedisOptions>,
    /// The keyspace's prefix, as opened.
    prefix: String,
    metrics: Arc<Metrics>,
    tier: Tier,
    _redis: Option<RedisServer>,
}

/// The local tier a Redis case runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    /// Room for every bucket: all loaded before the case starts.
    Complete,
    /// Room for about 16 of the keyspace's 128 buckets, or filters of all and a few copies.
    Partial,
    Off,
}

fn settings(tier: Tier) -> ListSettings {
    ListSettings {
        check_deadline: Duration::from_millis(500),
        operator_deadline: Duration::from_secs(2),
        write_deadline: Duration::from_secs(2),
        fail_mode: FailMode::Open,
        cache_ttl: Duration::from_secs(60),
        cache_capacity: 10_000,
        local_memory_bytes: match tier {
            Tier::Complete => 64 << 20,
            Tier::Partial => 4_000,
            Tier::Off => 0,
        },
        local_fetch_rate: 0,
        local_refresh_rate: 0,
        phone_regions: Default::default(),
    }
}

async fn ready(
    store: Arc<dyn Store>,
    redis_store: Option<Arc<RedisStore>>,
    redis: Option<RedisServer>,
    tier: Tier,
) -> Harness {
    let metrics = Arc::new(Metrics::new());
    let lists = NameLists::new(
        store.clone(),
        store.clone(),
        settings(tier),
        metrics.clone(),
    );
    for _ in 0..500 {
        if lists.cache().is_trusted() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        lists.cache().is_trusted(),
        "invalidation subscription is up"
    );
    assert!(lists.cache().wait_settled(Duration::from_secs(20)).await);
    let mode = lists.cache().mode();
    if !store.in_process() {
        let expected = match tier {
            Tier::Complete => Mode::Complete,
            Tier::Partial => Mode::Partial,
            Tier::Off => Mode::Off,
        };
        assert_eq!(mode, expected, "tier mode");
        // Partial mode keeps filters of every bucket: the cases' checks go through them.
        // (They are made by the worker once partial: on a busy machine, a moment later.)
        let started = std::time::Instant::now();
        while tier == Tier::Partial
            && lists.cache().filter_bytes() == 0
            && started.elapsed() < Duration::from_secs(10)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            lists.cache().filter_bytes() > 0,
            tier == Tier::Partial,
            "filters in partial mode only"
        );
    }
    Harness {
        lists,
        prefix: store.layout().prefix().to_owned(),
        store,
        redis_store,
        memory_store: None,
        data_dir: None,
        redis_options: None,
        metrics,
        tier,
        _redis: redis,
    }
}

/// Another keyspace on the harness's backend, its audit trail capped at `audit_max_len`
/// records, with a name-list service over it (no local tier).
struct Capped {
    store: Arc<dyn Store>,
    lists: NameLists,
    redis: Option<Arc<RedisStore>>,
    memory: Option<Arc<MemoryStore>>,
    metrics: Arc<Metrics>,
}

async fn with_audit_cap(h: &Harness, audit_max_len: usize) -> Capped {
    let (store, redis, memory): (Arc<dyn Store>, _, _) = match &h.redis_options {
        Some(opts) => {
            let (store, _) = RedisStore::open(RedisOptions {
                prefix: unique_prefix(),
                audit_max_len,
                ..opts.clone()
            })
            .await
            .unwrap();
            let store = Arc::new(store);
            (store.clone(), Some(store), None)
        }
        None => {
            let store = Arc::new(
                MemoryStore::open(
                    Layout::new(unique_prefix(), 64, h.store.layout().hashing().clone()),
                    audit_max_len,
                    None,
                )
                .unwrap(),
            );
            (store.clone(), None, Some(store))
        }
    };
    let metrics = Arc::new(Metrics::new());
    let lists = NameLists::new(
        store.clone(),
        store.clone(),
        settings(Tier::Off),
        metrics.clone(),
    );
    Capped {
        store,
        lists,
        redis,
        memory,
        metrics,
    }
}

/// The embedded store on a fresh data directory.
async fn durable() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        MemoryStore::open(
            Layout::new(unique_prefix(), 64, common::keyed()),
            1000,
            Some(Durable::open(dir.path()).unwrap()),
        )
        .unwrap(),
    );
    let mut h = ready(store.clone(), None, None, Tier::Off).await;
    h.memory_store = Some(store);
    h.data_dir = Some(dir);
    h
}

/// Closes a durable harness's store, reopens its data directory and asserts that the store
/// read back holds exactly what the store had: every acknowledged change was recorded, and
/// nothing else.
fn reopens_the_same(h: &Harness) {
    let (Some(store), Some(dir)) = (&h.memory_store, &h.data_dir) else {
        panic!("a durable harness");
    };
    store.close();
    let had = store.canonical_state();
    let again = MemoryStore::open(
        store.layout().clone(),
        1000,
        Some(Durable::open(dir.path()).unwrap()),
    )
    .unwrap();
    let read = again.canonical_state();
    if had != read {
        let first = had
            .lines()
            .zip(read.lines())
            .find(|(a, b)| a != b)
            .map(|(a, b)| format!("had:  {a:.600}\nread: {b:.600}"));
        panic!("the data directory does not hold the store's state:\n{first:?}");
    }
}

async fn memory() -> Harness {
    let store = Arc::new(
        MemoryStore::open(
            Layout::new(unique_prefix(), 64, common::keyed()),
            1000,
            None,
        )
        .unwrap(),
    );
    let mut h = ready(store.clone(), None, None, Tier::Off).await;
    h.memory_store = Some(store);
    h
}

/// A fresh keyspace (prefix) on a shared cluster.
async fn on_cluster(cluster: &RedisCluster) -> Harness {
    let opts = RedisOptions {
        cluster_nodes: cluster.urls(),
        expected_entries: Some(64 * 400),
        response_timeout: Duration::from_secs(2),
        audit_max_len: REDIS_AUDIT_MAX_LEN,
        ..common::redis_options(String::new(), unique_prefix())
    };
    let (store, _) = RedisStore::open(opts.clone()).await.unwrap();
    let store = Arc::new(store);
    let mut h = ready(store.clone(), Some(store), None, Tier::Complete).await;
    h.redis_options = Some(opts);
    h
}

async fn redis() -> Harness {
    on_node(Some(common::test_key()), Tier::Complete).await
}

async fn redis_tier_partial() -> Harness {
    on_node(Some(common::test_key()), Tier::Partial).await
}

async fn redis_tier_off() -> Harness {
    on_node(Some(common::test_key()), Tier::Off).await
}

/// A format-1 (unkeyed) keyspace, as builds before keyed fingerprints made them: existing
/// keyspaces must keep working.
async fn redis_unkeyed() -> Harness {
    on_node(None, Tier::Complete).await
}

async fn on_node(key: Option<FingerprintKey>, tier: Tier) -> Harness {
    let server = RedisServer::start();
    let opts = RedisOptions {
        expected_entries: Some(64 * 400),
        response_timeout: Duration::from_secs(2),
        audit_max_len: REDIS_AUDIT_MAX_LEN,
        allow_unkeyed: key.is_none(),
        fingerprint_key: key,
        ..common::redis_options(server.url(), unique_prefix())
    };
    let (store, report) = RedisStore::open(opts.clone()).await.unwrap();
    assert_eq!(report.unkeyed.is_some(), report.format == 1);
    let store = Arc::new(store);
    let mut h = ready(store.clone(), Some(store), Some(server), tier).await;
    h.redis_options = Some(opts);
    h
}

/// The Redis harnesses' audit cap: 64 records a part (parts are capped exactly), so that the
/// 900 records of a case fit however they spread over the parts.
const REDIS_AUDIT_MAX_LEN: usize = 64 * 64;

/// A deadline no healthy store comes near.
fn deadline() -> Deadline {
    Deadline::after(Duration::from_secs(10))
}

/// The next message of a subscription (within 5 s).
async fn next_message(stream: &mut InvalidationStream) -> Invalidation {
    tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("a message within 5 s")
        .expect("the subscription stays up")
}

/// Runs each case, an `async fn(&Harness)` of the module it is invoked in, on every backend:
/// a test per case and backend, and `all_on_cluster` for the one cluster test.
macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod memory_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(&crate::conformance::memory().await).await;
                }
            )*
        }
        /// Every case on the embedded store with a data directory; after it, the directory
        /// reopened holds exactly the store's state.
        mod durable_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let h = crate::conformance::durable().await;
                    super::$case(&h).await;
                    crate::conformance::reopens_the_same(&h);
                }
            )*
        }
        mod redis_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(&crate::conformance::redis().await).await;
                }
            )*
        }
        /// Every case with a local tier holding a fraction of the keyspace.
        mod redis_tier_partial {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(&crate::conformance::redis_tier_partial().await).await;
                }
            )*
        }
        /// Every case with no local tier: every lookup goes to Redis.
        mod redis_tier_off {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(&crate::conformance::redis_tier_off().await).await;
                }
            )*
        }
        /// Every case on an unkeyed (format 1) keyspace.
        mod redis_unkeyed_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(&crate::conformance::redis_unkeyed().await).await;
                }
            )*
        }
        /// Every case of this module on `cluster`, each on a fresh keyspace.
        pub(crate) async fn all_on_cluster(cluster: &crate::common::RedisCluster) {
            $(
                eprintln!("cluster: {}::{}", module_path!(), stringify!($case));
                $case(&crate::conformance::on_cluster(cluster).await).await;
            )*
        }
    };
}

mod audit_reports;
mod base;
mod bus;
mod definitions;
mod entries;
mod metrics;
mod operators;

/// Every case of every module on one local 6-node cluster (3 primaries, 3 replicas).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_all_cases() {
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    base::all_on_cluster(&cluster).await;
    entries::all_on_cluster(&cluster).await;
    bus::all_on_cluster(&cluster).await;
    metrics::all_on_cluster(&cluster).await;
    definitions::all_on_cluster(&cluster).await;
    audit_reports::all_on_cluster(&cluster).await;
    operators::all_on_cluster(&cluster).await;
}
