//! Cross-instance cache invalidation: every write publishes the fields it changed; this task,
//! one per instance, applies what it hears to the local caches.
//!
//! If the subscription breaks, the cache is marked untrusted at once (answers bypass it: a
//! write may be going unseen) and the task resubscribes with a capped backoff; once
//! subscribed again it clears both caches and only then trusts them again. A write is thus
//! seen by every instance as soon as its message arrives (well under 100 ms on a healthy
//! link), and never later than the cache TTL.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use crate::cache::{LookupCache, RegistryCache};
use crate::metrics::Metrics;
use crate::store::{Invalidation, Store};

/// Listens for invalidations until the task is aborted.
pub async fn listen(
    store: Arc<dyn Store>,
    entries: Arc<LookupCache>,
    registries: Arc<RegistryCache>,
    metrics: Arc<Metrics>,
) {
    const MIN_BACKOFF: Duration = Duration::from_millis(20);
    const MAX_BACKOFF: Duration = Duration::from_secs(1);
    let mut backoff = MIN_BACKOFF;
    loop {
        match store.subscribe().await {
            Ok(mut stream) => {
                // Anything cached before now may have changed while nobody listened.
                entries.invalidate_all();
                registries.invalidate_all();
                entries.set_trusted(true);
                metrics.subscription_up.set(1);
                backoff = MIN_BACKOFF;
                tracing::info!("cache invalidation subscription up");
                while let Some(message) = stream.next().await {
                    apply(&entries, &registries, message).await;
                }
                entries.set_trusted(false);
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

async fn apply(entries: &LookupCache, registries: &RegistryCache, message: Invalidation) {
    match message {
        Invalidation::Keys(keys) => entries.invalidate(&keys).await,
        Invalidation::Scopes(scopes) => {
            let scopes: Vec<_> = scopes
                .into_iter()
                .filter_map(|(l, s)| Some((l.parse().ok()?, s.parse().ok()?)))
                .collect();
            registries.invalidate(&scopes).await;
        }
        Invalidation::Bulk => {
            entries.invalidate_misses();
            registries.invalidate_all();
        }
        // Definitions are the velocity service's business (its own subscription).
        Invalidation::Definitions => {}
    }
}
