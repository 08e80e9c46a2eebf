//! Cross-instance invalidation: every write publishes the fields it changed and their new
//! codes; this task, one per instance, applies what it hears to the local tier (in place)
//! and to the registry cache.
//!
//! If the subscription breaks, the tier is marked untrusted at once (answers go to the store:
//! a write may be going unseen; copies stay for fail-open answers) and the task resubscribes
//! with a capped backoff; once subscribed again it starts a new generation of the tier (every
//! held bucket is read again) and clears the registry cache, and only then trusts them. A
//! write is thus seen by every instance as soon as its message arrives (well under 100 ms on
//! a healthy link), and never later than the cache TTL.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use crate::cache::{LocalTier, RegistryCache};
use crate::instrumented::Instrumented;
use crate::metrics::{Metrics, StoreOp};
use crate::store::{Deadline, Invalidation, InvalidationBus};

/// How long subscribing may take before it is given up and tried again.
pub const SUBSCRIBE_DEADLINE: Duration = Duration::from_secs(5);

/// Listens for invalidations until the task is aborted.
pub async fn listen(
    bus: Instrumented<dyn InvalidationBus>,
    tier: Arc<LocalTier>,
    registries: Arc<RegistryCache>,
    metrics: Arc<Metrics>,
) {
    const MIN_BACKOFF: Duration = Duration::from_millis(20);
    const MAX_BACKOFF: Duration = Duration::from_secs(1);
    let mut backoff = MIN_BACKOFF;
    loop {
        let subscribed = bus
            .call(
                StoreOp::Subscribe,
                Deadline::after(SUBSCRIBE_DEADLINE),
                |b| b.subscribe(),
            )
            .await;
        match subscribed {
            Ok(mut stream) => {
                // Anything held before now may have changed while nobody listened.
                registries.invalidate_all();
                tier.resynced();
                metrics.subscription_up.set(1);
                backoff = MIN_BACKOFF;
                tracing::info!("cache invalidation subscription up");
                while let Some(message) = stream.next().await {
                    apply(&tier, &registries, message).await;
                }
                tier.lost_sync();
                metrics.subscription_up.set(0);
                tracing::warn!(
                    "cache invalidation subscription broke: bypassing the cache until resubscribed"
                );
            }
            Err(e) => tracing::debug!(error = %e, "resubscribing to cache invalidations failed"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

async fn apply(tier: &LocalTier, registries: &RegistryCache, message: Invalidation) {
    match message {
        Invalidation::Changes { changes, atomic } => tier.apply(&changes, atomic),
        Invalidation::Keys(keys) => tier.changed_unknown(&keys),
        Invalidation::Scopes(scopes) => {
            let scopes: Vec<_> = scopes
                .into_iter()
                .filter_map(|(l, s)| Some((l.parse().ok()?, s.parse().ok()?)))
                .collect();
            registries.invalidate(&scopes).await;
        }
        Invalidation::Bulk => {
            tier.invalidate_all();
            registries.invalidate_all();
        }
        // Definitions are the velocity service's business (its own subscription).
        Invalidation::Definitions => {}
    }
}
