//! `AuditReports`: no summary until an audit leaves one, then exactly what it left. Only the
//! Redis store is audited (`namelist-tools audit` writes through `RedisStore`); the embedded
//! store never has a summary.

use namelist::store::AuditSummary;

use crate::conformance::Harness;

async fn a_summary_is_read_as_the_audit_left_it(h: &Harness) {
    assert_eq!(h.store.audit_summary().await.unwrap(), None, "no audit yet");
    let Some(redis) = &h.redis_store else {
        return;
    };
    let left = AuditSummary {
        at_ms: 1_795_000_000_123,
        sampled: true,
        buckets: 128,
        entries: 25_431,
        bytes_per_entry: 17.625,
        listpack_limit: Some(512),
        near_limit: 3,
        over_limit: 1,
        hashtable: 1,
        expired: 42,
        fill_histogram: vec![(0, 100, 3), (100, 200, 120), (200, 400, 5)],
    };
    redis.put_audit_summary(&left).await.unwrap();
    assert_eq!(h.store.audit_summary().await.unwrap(), Some(left));
}

conformance!(a_summary_is_read_as_the_audit_left_it);
