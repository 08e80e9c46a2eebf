//! Prometheus metrics of one service instance, rendered at `GET /metrics`. Each application
//! owns its own registry (no globals), so several instances can live in one test process.

use prometheus::{
    Encoder, Gauge, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use actix_web::web::Bytes;

use crate::store::AuditSummary;

const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// What a store call is for: the `op` label of `namelist_store_call_duration_seconds` and
/// `namelist_store_errors_total`, and the `op` field of the call's `store` span
/// (`instrumented`). Labels never change: dashboards and alerts read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp {
    /// A check's lookups (pipelined `HGET`s of the buckets the tier does not answer).
    Check,
    /// One entry looked up by the operator's endpoint.
    Get,
    /// An upsert.
    Write,
    /// A delete.
    Remove,
    /// Events ingested (metric updates).
    Events,
    /// Feature reads.
    Features,
    /// `evaluate`: an event's updates and the reads, together.
    Evaluate,
    /// A metric or rule defined or deleted.
    Define,
    /// A check's IP prefix-length registries (those not cached).
    Registry,
    /// Lazy expiry's compare-and-delete of a field found expired.
    Reclaim,
    /// The local tier's whole-bucket reads (background).
    Buckets,
    /// Subscribing to the invalidation bus (the tier's listener, the velocity service's).
    Subscribe,
    /// Reading the metric and rule definitions (start-up, on every change, every 30 s).
    Definitions,
    /// `/readyz`.
    Ping,
    /// The audit gauges' read of the last audit's summary (background).
    AuditSummary,
    /// The lists' approximate entry counts changed after a write, a delete or a lazy expiry.
    Counts,
    /// `GET /v1/lists`: the counts read.
    ListCounts,
    /// `GET /v1/audit`: a page of the audit trail read.
    AuditPage,
    /// The keyspace id read from its meta hash (every second, and before trusting copies
    /// again).
    Keyspace,
    /// The change log: a mark taken (every second), or read since a mark (on resubscribing).
    ChangeLog,
}

impl StoreOp {
    /// Every operation, in the order their series are first exported.
    pub const ALL: [StoreOp; 20] = [
        StoreOp::Check,
        StoreOp::Get,
        StoreOp::Write,
        StoreOp::Remove,
        StoreOp::Events,
        StoreOp::Features,
        StoreOp::Evaluate,
        StoreOp::Define,
        StoreOp::Registry,
        StoreOp::Reclaim,
        StoreOp::Buckets,
        StoreOp::Subscribe,
        StoreOp::Definitions,
        StoreOp::Ping,
        StoreOp::AuditSummary,
        StoreOp::Counts,
        StoreOp::ListCounts,
        StoreOp::AuditPage,
        StoreOp::Keyspace,
        StoreOp::ChangeLog,
    ];

    /// The `op` label.
    pub fn label(self) -> &'static str {
        match self {
            StoreOp::Check => "check",
            StoreOp::Get => "get",
            StoreOp::Write => "write",
            StoreOp::Remove => "remove",
            StoreOp::Events => "events",
            StoreOp::Features => "features",
            StoreOp::Evaluate => "evaluate",
            StoreOp::Define => "define",
            StoreOp::Registry => "registry",
            StoreOp::Reclaim => "reclaim",
            StoreOp::Buckets => "buckets",
            StoreOp::Subscribe => "subscribe",
            StoreOp::Definitions => "definitions",
            StoreOp::Ping => "ping",
            StoreOp::AuditSummary => "audit_summary",
            StoreOp::Counts => "counts",
            StoreOp::ListCounts => "list_counts",
            StoreOp::AuditPage => "audit_page",
            StoreOp::Keyspace => "keyspace",
            StoreOp::ChangeLog => "change_log",
        }
    }

    /// Whether the call is made for a request that waits for it. Its failure is then logged
    /// where it happens (inside the request's span); background calls retry, and their
    /// callers log what they make of a failure.
    pub fn for_request(self) -> bool {
        !matches!(
            self,
            StoreOp::Reclaim
                | StoreOp::Buckets
                | StoreOp::Subscribe
                | StoreOp::Definitions
                | StoreOp::AuditSummary
                | StoreOp::Keyspace
                | StoreOp::ChangeLog
        )
    }
}

/// The `reason` labels of `namelist_write_refusals_total` (`Refusal::label`).
pub const REFUSAL_REASONS: &[&str] = &[
    "replicas",
    "unreachable",
    "deadline",
    "busy",
    "keyspace_lost",
];

/// The `state` labels of `namelist_audit_buckets`, in [`Metrics::set_audit`]'s order.
const AUDIT_STATES: [&str; 4] = ["all", "near_limit", "over_limit", "hashtable"];

/// The last rendered exposition and how long it may be served again. One client pipelining
/// thousands of `GET /metrics` on a connection it never reads would otherwise have the worker
/// render the whole registry for each until the socket buffers fill (seconds of CPU on a
/// worker thread, stalling every other connection it serves, and again for each new
/// connection); with a reuse age each of those answers is a copy of the same bytes.
#[derive(Default)]
struct Scrapes {
    max_age_ms: AtomicU64,
    last: Mutex<Option<(Instant, Bytes)>>,
}

/// Every metric the service exports.
pub struct Metrics {
    registry: Registry,
    /// Request latency by route pattern (never the raw path: it may hold a phone number),
    /// method and status.
    pub http_requests: HistogramVec,
    /// Lookups answered by the local tier, and lookups sent to the store.
    pub cache_hits: IntCounter,
    pub cache_misses: IntCounter,
    /// Store call latency and errors by operation.
    pub store_calls: HistogramVec,
    pub store_errors: IntCounterVec,
    pub entries_written: IntCounter,
    pub entries_removed: IntCounter,
    /// Expired fields deleted by lazy expiry.
    pub expired_reclaimed: IntCounter,
    /// Counters the process keeps in statics, brought up to them at every scrape: phones
    /// read under rules 2 that the parser could not make valid, requests sent again after
    /// their shared metric call was dropped, cluster connections rebuilt.
    mirrored: Vec<Mirrored>,
    /// The last exposition served, reused by scrapes within `metrics_max_age_ms` of it.
    scrapes: Scrapes,
    /// Checks answered fail-open from the cache alone.
    pub degraded_answers: IntCounter,
    /// Checks refused (fail-closed) because the store could not answer.
    pub refused_answers: IntCounter,
    /// 1 while the invalidation subscription is up.
    pub subscription_up: IntGauge,
    /// 1 while the keyspace is lost (its id gone from its meta hash, or another).
    pub keyspace_lost: IntGauge,
    /// Resubscriptions by how the tier caught up: `replayed` (from the change log, only the
    /// buckets written meanwhile read again) or `full` (every bucket held read again).
    pub catch_ups: IntCounterVec,
    /// Change-log records checked against the local tier (`invalidation::follow_log`).
    pub log_followed: IntCounter,
    /// Buckets whose copy or filter disagreed with the change log (a message that never
    /// arrived), read again.
    pub log_missed: IntCounter,
    /// Events by outcome: `applied` counts metric updates, `duplicate` and `late` events.
    pub events: IntCounterVec,
    /// Feature reads that found a COUNT_DISTINCT entity at its member cap.
    pub distinct_capped: IntCounter,
    /// Requests refused by auth, by reason (`missing`, `invalid`, `forbidden`,
    /// `rate_limited`: over the token's rate or concurrency, answered 429).
    pub auth_failures: IntCounterVec,
    /// Requests refused because a limit was reached, by limit (a class budget, `engine`,
    /// `write`, `operator`, or `body_bytes`).
    pub overloaded: IntCounterVec,
    /// `/v1` requests holding a place in their class budget now, by class.
    pub in_flight: IntGaugeVec,
    /// Writes refused before anything was sent, by reason (`replicas`, `unreachable`,
    /// `deadline`, `busy`).
    pub write_refusals: IntCounterVec,
    /// The last audit (`namelist-tools audit`), as it left its summary in the store.
    pub audit: AuditGauges,
    /// The local tier of whole buckets (`tier`), as its worker last exported it.
    pub tier: Arc<TierGauges>,
    /// Hits answered by checks and evaluations, by list and dimension (at most
    /// [`MAX_HIT_SERIES`] label pairs; later ones are counted under `list="other"`).
    list_hits: IntCounterVec,
    hit_series: std::sync::Mutex<std::collections::HashSet<(String, String)>>,
    /// Count changes that could not be stored (the write itself was acknowledged).
    pub count_errors: IntCounter,
}

/// Most (list, dimension) series of `namelist_list_hits_total`: list names are chosen by
/// callers, and every series costs memory in every scraper.
pub const MAX_HIT_SERIES: usize = 1_000;

/// The `mode` labels of `namelist_tier_mode` (`tier::Mode::label`).
pub const TIER_MODES: [&str; 4] = ["off", "sizing", "complete", "partial"];

/// The local tier's state, exported every 250 ms by its worker.
pub struct TierGauges {
    /// 1 for the current mode, 0 for the others.
    pub mode: IntGaugeVec,
    pub budget_bytes: IntGauge,
    pub bytes: IntGauge,
    pub buckets: IntGauge,
    /// Buckets held in sync / buckets in the keyspace.
    pub loaded: Gauge,
    /// Seconds since the tier was last known in sync (0 while the subscription is up).
    pub stale_seconds: Gauge,
    /// The oldest copy seen by the last refresh pass.
    pub oldest_copy_seconds: Gauge,
    /// Buckets whose lookups of values on no list are answered locally (a copy, or in
    /// partial mode a filter, in sync), as a fraction of the keyspace's buckets.
    pub answering: Gauge,
    /// Partial mode's filter bits per entry (0: no filters, e.g. they do not fit the budget).
    pub filter_bits_per_entry: Gauge,
    /// Lookups sent to the store because the subscription's last proof of delivery was late.
    pub unproven: IntCounter,
    pub fetches: IntCounter,
    pub fetch_errors: IntCounter,
}

impl TierGauges {
    /// Unregistered gauges (`Metrics::new` registers its own).
    pub fn new() -> Self {
        let gauge = |name: &str, help: &str| Gauge::new(name, help).expect("valid metric");
        let int = |name: &str, help: &str| IntGauge::new(name, help).expect("valid metric");
        let counter = |name: &str, help: &str| IntCounter::new(name, help).expect("valid metric");
        Self {
            mode: IntGaugeVec::new(
                Opts::new(
                    "namelist_tier_mode",
                    "Local tier mode: off, sizing (measuring buckets), complete (every bucket                      held) or partial (the hottest within the budget); 1 for the current one",
                ),
                &["mode"],
            )
            .expect("valid metric"),
            budget_bytes: int(
                "namelist_tier_budget_bytes",
                "Local tier memory budget (local_memory_mb)",
            ),
            bytes: int("namelist_tier_bytes", "Bytes taken by the buckets held locally"),
            buckets: int("namelist_tier_buckets", "Buckets held locally"),
            loaded: gauge(
                "namelist_tier_loaded_ratio",
                "Buckets held and in sync, as a fraction of the keyspace's buckets",
            ),
            stale_seconds: gauge(
                "namelist_tier_stale_seconds",
                "Seconds since the local tier was last known in sync (while the invalidation \
                 subscription is up: the age of its last proof of delivery, ~0.03)",
            ),
            oldest_copy_seconds: gauge(
                "namelist_tier_oldest_copy_seconds",
                "Age of the oldest bucket copy seen by the last refresh pass (over Redis copies \
                 answer at any age while the invalidation feed is proven; the safety net reads \
                 each again within two buckets / local_refresh_rate periods)",
            ),
            answering: gauge(
                "namelist_tier_answering_ratio",
                "Buckets whose lookups of values on no list are answered locally (a copy, or a \
                 partial tier's filter, in sync), as a fraction of the keyspace's buckets",
            ),
            filter_bits_per_entry: gauge(
                "namelist_tier_filter_bits_per_entry",
                "Bits per entry of the partial tier's filters of every bucket (0: none; under 4 \
                 they do not fit local_memory_mb and values on no list go to the store)",
            ),
            unproven: counter(
                "namelist_tier_unproven_lookups_total",
                "Lookups a current local copy could have answered, sent to the store because the \
                 invalidation subscription's last proof of delivery was over 90 ms old",
            ),
            fetches: counter(
                "namelist_tier_fetches_total",
                "Buckets read whole in the background (load, refresh, hot, changed)",
            ),
            fetch_errors: counter(
                "namelist_tier_fetch_errors_total",
                "Background bucket reads that failed (retried)",
            ),
        }
    }

    /// Sets the current mode's series to 1 and the others to 0.
    pub fn set_mode(&self, mode: &str) {
        for m in TIER_MODES {
            self.mode.with_label_values(&[m]).set(i64::from(m == mode));
        }
    }

    /// Advances the tier's counters to these totals (the tier keeps its own atomics).
    pub fn set_totals(&self, fetched: u64, errors: u64, unproven: u64) {
        for (counter, total) in [
            (&self.fetches, fetched),
            (&self.fetch_errors, errors),
            (&self.unproven, unproven),
        ] {
            counter.inc_by(total.saturating_sub(counter.get()));
        }
    }

    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.mode.clone()),
            Box::new(self.budget_bytes.clone()),
            Box::new(self.bytes.clone()),
            Box::new(self.buckets.clone()),
            Box::new(self.loaded.clone()),
            Box::new(self.stale_seconds.clone()),
            Box::new(self.oldest_copy_seconds.clone()),
            Box::new(self.answering.clone()),
            Box::new(self.filter_bits_per_entry.clone()),
            Box::new(self.unproven.clone()),
            Box::new(self.fetches.clone()),
            Box::new(self.fetch_errors.clone()),
        ]
    }
}

/// The last audit's findings. All zero until an audit has left a summary (the timestamp says
/// when it ran).
pub struct AuditGauges {
    pub timestamp: Gauge,
    /// Buckets by state: `all`, `near_limit`, `over_limit`, `hashtable`.
    pub buckets: IntGaugeVec,
    pub entries: IntGauge,
    pub expired_entries: IntGauge,
    pub bytes_per_entry: Gauge,
    /// The fill histogram, by bin.
    pub fill: IntGaugeVec,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let http_requests = HistogramVec::new(
            HistogramOpts::new(
                "namelist_http_request_duration_seconds",
                "HTTP request latency by route, method and status",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["route", "method", "status"],
        )
        .expect("valid metric");
        let store_calls = HistogramVec::new(
            HistogramOpts::new(
                "namelist_store_call_duration_seconds",
                "Store call latency by operation",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["op"],
        )
        .expect("valid metric");
        let store_errors = IntCounterVec::new(
            Opts::new(
                "namelist_store_errors_total",
                "Store calls that failed or missed their deadline, by operation",
            ),
            &["op"],
        )
        .expect("valid metric");
        let counter = |name: &str, help: &str| IntCounter::new(name, help).expect("valid metric");
        let m = Self {
            http_requests,
            cache_hits: counter(
                "namelist_cache_hits_total",
                "Lookups answered by the local tier (its bucket held and in sync)",
            ),
            cache_misses: counter(
                "namelist_cache_misses_total",
                "Lookups sent to the store (bucket not held, or not known to be in sync)",
            ),
            store_calls,
            store_errors,
            entries_written: counter("namelist_entries_written_total", "Entries upserted"),
            entries_removed: counter(
                "namelist_entries_removed_total",
                "Entries deleted that were present and live",
            ),
            expired_reclaimed: counter(
                "namelist_expired_reclaimed_total",
                "Expired fields deleted by lazy expiry",
            ),
            mirrored: vec![
                Mirrored::new(
                    counter(
                        "namelist_phones_not_e164_total",
                        "Phones read under normalisation rules 2 that are not valid numbers in their region or country code, kept in their digits-only form",
                    ),
                    crate::domain::rules::phones_not_e164,
                ),
                Mirrored::new(
                    counter(
                        "namelist_velocity_updates_resent_total",
                        "Requests whose metric updates rode a shared script call dropped with the request that sent it (out of time), and that sent them again alone",
                    ),
                    crate::store::redis::coalesce::resent,
                ),
                Mirrored::new(
                    counter(
                        "namelist_redis_cluster_rebuilds_total",
                        "Cluster connections replaced after requests went unanswered past the stall bound",
                    ),
                    crate::store::redis::heal::rebuilds,
                ),
            ],
            scrapes: Scrapes::default(),
            degraded_answers: counter(
                "namelist_degraded_answers_total",
                "Checks answered fail-open from the cache because the store did not answer in time",
            ),
            refused_answers: counter(
                "namelist_refused_answers_total",
                "Checks answered 503 (fail-closed) because the store did not answer in time",
            ),
            events: IntCounterVec::new(
                Opts::new(
                    "namelist_events_total",
                    "Events: metric updates applied, duplicate and late events",
                ),
                &["outcome"],
            )
            .expect("valid metric"),
            auth_failures: IntCounterVec::new(
                Opts::new(
                    "namelist_auth_failures_total",
                    "Requests refused by auth: missing or invalid token, role too low",
                ),
                &["reason"],
            )
            .expect("valid metric"),
            distinct_capped: counter(
                "namelist_distinct_capped_total",
                "Distinct counts read at their member cap (the true count may be higher)",
            ),
            overloaded: IntCounterVec::new(
                Opts::new(
                    "namelist_overloaded_total",
                    "Requests answered 503 overloaded, by the limit reached",
                ),
                &["limit"],
            )
            .expect("valid metric"),
            in_flight: IntGaugeVec::new(
                Opts::new(
                    "namelist_in_flight_requests",
                    "/v1 requests holding a place in their class budget (engine, write, operator)",
                ),
                &["class"],
            )
            .expect("valid metric"),
            write_refusals: IntCounterVec::new(
                Opts::new(
                    "namelist_write_refusals_total",
                    "Writes refused before anything was sent: a primary with too few online \
                     replicas, an unreachable primary, too little deadline left, or every \
                     write connection busy",
                ),
                &["reason"],
            )
            .expect("valid metric"),
            audit: AuditGauges {
                timestamp: Gauge::new(
                    "namelist_audit_last_run_timestamp_seconds",
                    "When the last audit whose summary the store holds started (0: none yet)",
                )
                .expect("valid metric"),
                buckets: IntGaugeVec::new(
                    Opts::new(
                        "namelist_audit_buckets",
                        "Buckets found by the last audit: all, near_limit (>= 90 % of \
                         hash-max-listpack-entries), over_limit, hashtable",
                    ),
                    &["state"],
                )
                .expect("valid metric"),
                entries: IntGauge::new("namelist_audit_entries", "Entries found by the last audit")
                    .expect("valid metric"),
                expired_entries: IntGauge::new(
                    "namelist_audit_expired_entries",
                    "Entries past their expiry, not yet swept, at the last audit",
                )
                .expect("valid metric"),
                bytes_per_entry: Gauge::new(
                    "namelist_audit_bytes_per_entry",
                    "Redis memory per entry (MEMORY USAGE) at the last audit",
                )
                .expect("valid metric"),
                fill: IntGaugeVec::new(
                    Opts::new(
                        "namelist_audit_fill_buckets",
                        "The last audit's fill histogram: buckets holding from..to-1 entries \
                         (bin=\"from-to\")",
                    ),
                    &["bin"],
                )
                .expect("valid metric"),
            },
            tier: Arc::new(TierGauges::new()),
            list_hits: IntCounterVec::new(
                Opts::new(
                    "namelist_list_hits_total",
                    "Hits answered by checks and evaluations since this instance started, by \
                     list and dimension (list=\"other\" past 1,000 series)",
                ),
                &["list", "dimension"],
            )
            .expect("valid metric"),
            hit_series: std::sync::Mutex::new(std::collections::HashSet::new()),
            count_errors: counter(
                "namelist_list_count_errors_total",
                "List count changes that could not be stored after an acknowledged write \
                 (the counts are then off by that much)",
            ),
            subscription_up: IntGauge::new(
                "namelist_invalidation_subscription_up",
                "1 while the cache invalidation subscription is up",
            )
            .expect("valid metric"),
            keyspace_lost: IntGauge::new(
                "namelist_keyspace_lost",
                "1 while the keyspace is lost: its id gone from Redis (restarted empty, flushed) or replaced",
            )
            .expect("valid metric"),
            log_followed: counter(
                "namelist_tier_log_records_total",
                "Change-log records checked against the local tier (every write's, a few \
                 seconds after it)",
            ),
            log_missed: counter(
                "namelist_tier_log_missed_total",
                "Buckets whose copy or filter disagreed with the change log, read again: an \
                 invalidation that never arrived, or a field written again since its record",
            ),
            catch_ups: IntCounterVec::new(
                Opts::new(
                    "namelist_tier_catch_ups_total",
                    "Invalidation resubscriptions, by how the local tier caught up: replayed \
                     from the change log (only the buckets written meanwhile read again) or \
                     full (every bucket held read again)",
                ),
                &["how"],
            )
            .expect("valid metric"),
            registry,
        };
        m.register_all();
        // Export a zero for every store operation from the start, so a dashboard's rate()
        // has a series before the first error.
        for op in StoreOp::ALL {
            m.store_errors.with_label_values(&[op.label()]);
        }
        for outcome in ["applied", "duplicate", "late"] {
            m.events.with_label_values(&[outcome]);
        }
        for how in ["replayed", "full"] {
            m.catch_ups.with_label_values(&[how]);
        }
        for limit in ["engine", "write", "operator", "body_bytes"] {
            m.overloaded.with_label_values(&[limit]);
        }
        for class in ["engine", "write", "operator"] {
            m.in_flight.with_label_values(&[class]);
        }
        for reason in ["missing", "invalid", "forbidden", "rate_limited"] {
            m.auth_failures.with_label_values(&[reason]);
        }
        for reason in REFUSAL_REASONS {
            m.write_refusals.with_label_values(&[reason]);
        }
        for state in AUDIT_STATES {
            m.audit.buckets.with_label_values(&[state]);
        }
        m
    }

    /// Counts one hit of `list` on `dimension`.
    pub fn list_hit(&self, list: &str, dimension: &str) {
        let known = {
            let mut seen = self.hit_series.lock().unwrap_or_else(|e| e.into_inner());
            let key = (list.to_owned(), dimension.to_owned());
            seen.contains(&key) || (seen.len() < MAX_HIT_SERIES && seen.insert(key))
        };
        let list = if known { list } else { "other" };
        self.list_hits.with_label_values(&[list, dimension]).inc();
    }

    /// Exports an audit summary read from the store.
    pub fn set_audit(&self, s: &AuditSummary) {
        let a = &self.audit;
        a.timestamp.set(s.at_ms as f64 / 1000.0);
        for (state, n) in
            AUDIT_STATES
                .iter()
                .zip([s.buckets, s.near_limit, s.over_limit, s.hashtable])
        {
            a.buckets
                .with_label_values(&[state])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        a.entries.set(i64::try_from(s.entries).unwrap_or(i64::MAX));
        a.expired_entries
            .set(i64::try_from(s.expired).unwrap_or(i64::MAX));
        a.bytes_per_entry.set(s.bytes_per_entry);
        a.fill.reset();
        for (from, to, n) in &s.fill_histogram {
            a.fill
                .with_label_values(&[&format!("{from}-{to}")])
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
    }

    fn register_all(&self) {
        let r = &self.registry;
        let all: Vec<Box<dyn prometheus::core::Collector>> = vec![
            Box::new(self.http_requests.clone()),
            Box::new(self.cache_hits.clone()),
            Box::new(self.cache_misses.clone()),
            Box::new(self.store_calls.clone()),
            Box::new(self.store_errors.clone()),
            Box::new(self.entries_written.clone()),
            Box::new(self.entries_removed.clone()),
            Box::new(self.expired_reclaimed.clone()),
            Box::new(self.degraded_answers.clone()),
            Box::new(self.refused_answers.clone()),
            Box::new(self.subscription_up.clone()),
            Box::new(self.keyspace_lost.clone()),
            Box::new(self.catch_ups.clone()),
            Box::new(self.log_followed.clone()),
            Box::new(self.log_missed.clone()),
            Box::new(self.events.clone()),
            Box::new(self.distinct_capped.clone()),
            Box::new(self.auth_failures.clone()),
            Box::new(self.overloaded.clone()),
            Box::new(self.in_flight.clone()),
            Box::new(self.write_refusals.clone()),
            Box::new(self.audit.timestamp.clone()),
            Box::new(self.audit.buckets.clone()),
            Box::new(self.audit.entries.clone()),
            Box::new(self.audit.expired_entries.clone()),
            Box::new(self.audit.bytes_per_entry.clone()),
            Box::new(self.audit.fill.clone()),
            Box::new(self.list_hits.clone()),
            Box::new(self.count_errors.clone()),
        ];
        let mirrored = self
            .mirrored
            .iter()
            .map(|m| Box::new(m.counter.clone()) as _);
        for c in all
            .into_iter()
            .chain(mirrored)
            .chain(self.tier.collectors())
        {
            r.register(c).expect("metric names are unique");
        }
    }

    /// Registers a collector owned elsewhere (e.g. the velocity module's).
    pub fn register(&self, c: Box<dyn prometheus::core::Collector>) {
        self.registry.register(c).expect("metric names are unique");
    }

    /// Lets `scrape` serve one exposition again for `max_age` (zero: render every scrape).
    pub fn set_scrape_max_age(&self, max_age: Duration) {
        let ms = u64::try_from(max_age.as_millis()).unwrap_or(u64::MAX);
        self.scrapes.max_age_ms.store(ms, Ordering::Relaxed);
    }

    /// The exposition for `GET /metrics`: the last one if it is younger than the scrape max
    /// age, else a new render. Concurrent scrapes of a stale one wait for a single render.
    pub fn scrape(&self) -> Bytes {
        let max_age = Duration::from_millis(self.scrapes.max_age_ms.load(Ordering::Relaxed));
        if max_age.is_zero() {
            return self.render().into();
        }
        let mut last = self
            .scrapes
            .last
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match &*last {
            Some((at, body)) if at.elapsed() < max_age => body.clone(),
            _ => {
                let body = Bytes::from(self.render());
                *last = Some((Instant::now(), body.clone()));
                body
            }
        }
    }

    /// The Prometheus text exposition of every metric, rendered now.
    pub fn render(&self) -> String {
        for m in &self.mirrored {
            m.sync();
        }
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding to a Vec cannot fail");
        String::from_utf8(buf).expect("Prometheus text is UTF-8")
    }
}

/// A counter the process keeps in a static (where no `Metrics` reaches), brought up to it at
/// every scrape under its lock (two scrapes at once must not both add the difference).
struct Mirrored {
    counter: IntCounter,
    source: fn() -> u64,
    lock: std::sync::Mutex<()>,
}

impl Mirrored {
    fn new(counter: IntCounter, source: fn() -> u64) -> Self {
        Self {
            counter,
            source,
            lock: std::sync::Mutex::new(()),
        }
    }

    fn sync(&self) {
        let _one_at_a_time = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let c = &self.counter;
        c.inc_by((self.source)().saturating_sub(c.get()));
    }
}

impl Default for TierGauges {
    fn default() -> Self {
        Self::new()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
