//! Lazy expiry: an expired field a read finds answers "absent" at once and is queued here,
//! then deleted off the request path by compare-and-delete (so a refresh that raced it
//! survives), and its list's count lowered.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::NameLists;
use crate::domain::now_ms;
use crate::instrumented::Instrumented;
use crate::metrics::{Metrics, StoreOp};
use crate::store::{CountChange, Deadline, EntryKey, EntryStore, Scope};
use crate::tier::LocalTier;

impl NameLists {
    /// Queues an expired field for compare-and-delete, off the request path. If the queue is
    /// full the field stays; the next read that finds it queues it again.
    pub(super) fn reclaim(&self, key: EntryKey, code: u32, scope: impl FnOnce() -> Scope) {
        let _ = self.expired.try_send((key, code, scope()));
    }
}

/// Deletes expired fields that reads found, one compare-and-delete at a time (and from the
/// tier's copy, so that later checks do not ask again).
pub(super) async fn reclaim_expired(
    store: Instrumented<dyn EntryStore>,
    tier: Arc<LocalTier>,
    mut rx: mpsc::Receiver<(EntryKey, u32, Scope)>,
    deadline: Duration,
    metrics: Arc<Metrics>,
) {
    while let Some((key, code, scope)) = rx.recv().await {
        let until = Deadline::after(deadline);
        match store
            .call(StoreOp::Reclaim, until, |s| {
                s.remove_if_unchanged(key, code, until)
            })
            .await
        {
            Ok(true) if store.inner().counts_itself() => {
                tier.forget_expired(&key, code);
                metrics.expired_reclaimed.inc();
            }
            Ok(true) => {
                tier.forget_expired(&key, code);
                metrics.expired_reclaimed.inc();
                let change = [CountChange { scope, delta: -1 }];
                let until = Deadline::after(deadline);
                let counted = store
                    .call(StoreOp::Counts, until, |s| {
                        s.count_changes(&change, now_ms(), until)
                    })
                    .await;
                if counted.is_err() {
                    metrics.count_errors.inc();
                }
            }
            Ok(false) => {}
            Err(e) => {
                tracing::debug!(error = %e, fingerprint = %key.fingerprint(), "lazy expiry failed")
            }
        }
    }
}
