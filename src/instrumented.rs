//! Every store call the service makes, with its deadline, its `store` span and its metrics,
//! written once. `Instrumented<S>` holds one store trait object (`Instrumented<dyn
//! EntryStore>`, `Instrumented<dyn MetricStore>`, …) and the only way to call it is
//! [`Instrumented::call`], which takes the call's `StoreOp` (the caller's label: one store
//! method can serve several operations, `metric_ops` three) and its `Deadline`.
//!
//! Invariants, for every call:
//! * it answers by its deadline: `StoreError::Timeout` once the deadline passes, whatever the
//!   store is doing (the store also gets the deadline where it takes one, so that nothing it
//!   asks of the server outlives the caller);
//! * it runs in a `store` span whose `op` field is its label, inside the caller's span (a
//!   request's), so whatever is logged during it carries both;
//! * its latency goes to `namelist_store_call_duration_seconds{op}`; a failure (a missed
//!   deadline is one) to `namelist_store_errors_total{op}`, a write refused before anything
//!   was sent also to `namelist_write_refusals_total{reason}`;
//! * a failure of a call made for a request (`StoreOp::for_request`) is logged at warn
//!   inside its span; background calls retry, and their callers log what they make of it.
//!
//! It is not a store itself: what a call means (a check's lookups, a lookup, a write) is the
//! caller's to say, and a wrapper that implemented the traits could not know it.

use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument;

use crate::metrics::{Metrics, StoreOp};
use crate::store::{Deadline, Layout, StoreBase, StoreError, StoreResult};

/// A store whose every call is bounded, traced and measured.
pub struct Instrumented<S: ?Sized> {
    store: Arc<S>,
    metrics: Arc<Metrics>,
}

impl<S: ?Sized> Clone for Instrumented<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

impl<S: StoreBase + ?Sized> Instrumented<S> {
    pub fn new(store: Arc<S>, metrics: Arc<Metrics>) -> Self {
        Self { store, metrics }
    }

    /// The keyspace the store was opened with (not a call: nothing is asked of the store).
    pub fn layout(&self) -> &Layout {
        self.store.layout()
    }

    /// `redis` or `memory`.
    pub fn kind(&self) -> &'static str {
        self.store.kind()
    }

    /// The store itself, to hand out (readiness, tests); the service calls it through
    /// [`Instrumented::call`] only.
    pub fn inner(&self) -> &Arc<S> {
        &self.store
    }

    /// Runs `call` on the store until `deadline`, in a `store` span labelled `op`, and
    /// records it. `call` gets the store and returns the call's future (one store method, or
    /// an `async` block that also checks the shape of the answer, so that a malformed answer
    /// is counted as the failure it is).
    pub async fn call<'s, T, F>(
        &'s self,
        op: StoreOp,
        deadline: Deadline,
        call: impl FnOnce(&'s S) -> F,
    ) -> StoreResult<T>
    where
        F: Future<Output = StoreResult<T>>,
    {
        let started = Instant::now();
        let label = op.label();
        let span = tracing::info_span!("store", op = label);
        let answer = tokio::time::timeout_at(
            deadline.instant(),
            call(&self.store).instrument(span.clone()),
        )
        .await;
        let r = answer.unwrap_or(Err(StoreError::Timeout(deadline.budget())));
        let m = &self.metrics;
        m.store_calls
            .with_label_values(&[label])
            .observe(started.elapsed().as_secs_f64());
        if let Err(e) = &r {
            m.store_errors.with_label_values(&[label]).inc();
            if let StoreError::Refused(refusal) = e {
                m.write_refusals.with_label_values(&[refusal.label()]).inc();
            }
            if op.for_request() {
                span.in_scope(|| tracing::warn!(error = %e, "store call failed"));
            }
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use async_trait::async_trait;

    use super::*;
    use crate::store::{FingerprintKey, Hashing, Refusal};

    /// A store that answers `ping` after `delay` with `answer`.
    struct Slow {
        layout: Layout,
        delay: Duration,
        answer: StoreResult<()>,
    }

    #[async_trait]
    impl StoreBase for Slow {
        fn kind(&self) -> &'static str {
            "slow"
        }
        fn layout(&self) -> &Layout {
            &self.layout
        }
        async fn ping(&self) -> StoreResult<()> {
            tokio::time::sleep(self.delay).await;
            self.answer.clone()
        }
    }

    fn slow(
        delay: Duration,
        answer: StoreResult<()>,
    ) -> (Instrumented<dyn StoreBase>, Arc<Metrics>) {
        let key = FingerprintKey::generate("test").unwrap();
        let store: Arc<dyn StoreBase> = Arc::new(Slow {
            layout: Layout::new("i:", 4, Hashing::Keyed(key)),
            delay,
            answer,
        });
        let metrics = Arc::new(Metrics::new());
        (Instrumented::new(store, metrics.clone()), metrics)
    }

    fn counts(m: &Metrics, op: StoreOp) -> (u64, u64) {
        (
            m.store_calls
                .with_label_values(&[op.label()])
                .get_sample_count(),
            m.store_errors.with_label_values(&[op.label()]).get(),
        )
    }

    #[tokio::test]
    async fn a_call_is_recorded_under_its_callers_label() {
        let (store, m) = slow(Duration::ZERO, Ok(()));
        let deadline = Deadline::after(Duration::from_secs(1));
        store
            .call(StoreOp::Ping, deadline, |s| s.ping())
            .await
            .unwrap();
        store
            .call(StoreOp::Ping, deadline, |s| s.ping())
            .await
            .unwrap();
        assert_eq!(counts(&m, StoreOp::Ping), (2, 0));
        assert_eq!(counts(&m, StoreOp::Check), (0, 0), "other labels untouched");
    }

    #[tokio::test]
    async fn a_missed_deadline_is_a_timeout_and_an_error() {
        let (store, m) = slow(Duration::from_secs(5), Ok(()));
        let budget = Duration::from_millis(20);
        let started = Instant::now();
        let r = store
            .call(StoreOp::Check, Deadline::after(budget), |s| s.ping())
            .await;
        assert!(
            matches!(r, Err(StoreError::Timeout(b)) if b == budget),
            "{r:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "answered by the deadline"
        );
        assert_eq!(counts(&m, StoreOp::Check), (1, 1));
    }

    #[tokio::test]
    async fn a_refused_write_is_counted_by_its_reason() {
        let refused = StoreError::Refused(Refusal::NoTime {
            left: Duration::from_millis(3),
        });
        let (store, m) = slow(Duration::ZERO, Err(refused));
        let r = store
            .call(
                StoreOp::Write,
                Deadline::after(Duration::from_secs(1)),
                |s| s.ping(),
            )
            .await;
        assert!(matches!(r, Err(StoreError::Refused(_))), "{r:?}");
        assert_eq!(counts(&m, StoreOp::Write), (1, 1));
        assert_eq!(m.write_refusals.with_label_values(&["deadline"]).get(), 1);
        assert_eq!(m.write_refusals.with_label_values(&["replicas"]).get(), 0);
    }

    #[tokio::test]
    async fn an_answer_checked_in_the_call_counts_as_a_failure() {
        let (store, m) = slow(Duration::ZERO, Ok(()));
        let r: StoreResult<()> = store
            .call(
                StoreOp::Buckets,
                Deadline::after(Duration::from_secs(1)),
                |s| async move {
                    s.ping().await?;
                    Err(StoreError::corrupt("asked for 2 buckets, got 1".into()))
                },
            )
            .await;
        assert!(matches!(r, Err(StoreError::Corrupt { .. })), "{r:?}");
        assert_eq!(counts(&m, StoreOp::Buckets), (1, 1));
    }
}
