//! `StoreBase`: what every store trait extends. The store names its backend, keeps the
//! keyspace it was opened with and answers a ping.

use crate::conformance::Harness;

async fn the_store_names_itself_and_answers(h: &Harness) {
    h.store
        .ping()
        .await
        .expect("a healthy store answers a ping");
    let kind = if h.redis_store.is_some() {
        "redis"
    } else {
        "memory"
    };
    assert_eq!(h.store.kind(), kind);
    assert_eq!(
        h.store.layout().prefix(),
        h.prefix,
        "the keyspace it was opened with"
    );
    assert!(h.store.layout().buckets() > 0);
}

conformance!(the_store_names_itself_and_answers);
