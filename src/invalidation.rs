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
//!
//! The keyspace too (`KeyspaceHealth`): before it trusts anything again after subscribing,
//! the task checks that the keyspace is the one opened; while the store says it is lost, the
//! tier is untrusted (answers go to the fail-open path, from the copies as they stood when the
//! loss was seen: the store refuses to read a lost keyspace) and messages are not applied;
//! when it is back (its data restored), a new generation starts as after a resubscription.
//! `watch_keyspace` checks it every second whatever else happens.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use crate::cache::{LocalTier, RegistryCache};
use crate::instrumented::Instrumented;
use crate::metrics::{Metrics, StoreOp};
use crate::store::{Deadline, Invalidation, InvalidationBus, KeyspaceHealth};

/// How often every instance checks that its keyspace is still there (besides every read of a
/// check or of the tier, which carries the check).
pub const KEYSPACE_EVERY: Duration = Duration::from_secs(1);

/// Checks the keyspace id every `KEYSPACE_EVERY` until the task is aborted (the store updates
/// what its `keyspace` channel says).
pub async fn watch_keyspace(bus: Instrumented<dyn InvalidationBus>) {
    let mut tick = tokio::time::interval(KEYSPACE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let r = bus
            .call(StoreOp::Keyspace, Deadline::after(KEYSPACE_EVERY), |b| {
                b.verify_keyspace()
            })
            .await;
        if let Err(e) = r {
            tracing::debug!(error = %e, "keyspace check");
        }
    }
}

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
    let mut health = bus.inner().keyspace();
    let lost = |h: &Option<tokio::sync::watch::Receiver<KeyspaceHealth>>| {
        h.as_ref()
            .is_some_and(|h| *h.borrow() != KeyspaceHealth::Present)
    };
    loop {
        let subscribed = bus
            .call(
                StoreOp::Subscribe,
                Deadline::after(SUBSCRIBE_DEADLINE),
                |b| b.subscribe_proven(),
            )
            .await;
        match subscribed {
            Ok((mut stream, live)) => {
                // Proofs of delivery date what is held (`LocalTier::proven`); the first is
                // the subscription itself.
                tier.clock(live.is_some(), std::time::Instant::now());
                metrics.subscription_up.set(1);
                backoff = MIN_BACKOFF;
                tracing::info!("cache invalidation subscription up");
                // Nothing is trusted until the keyspace is known to be the one opened.
                let checked = bus
                    .call(
                        StoreOp::Keyspace,
                        Deadline::after(SUBSCRIBE_DEADLINE),
                        |b| b.verify_keyspace(),
                    )
                    .await;
                let mut trusting = false;
                if checked.is_ok() && !lost(&health) {
                    // Anything held before now may have changed while nobody listened.
                    registries.invalidate_all();
                    tier.resynced();
                    trusting = true;
                }
                metrics.keyspace_lost.set(i64::from(lost(&health)));
                loop {
                    let changed = async {
                        match health.as_mut() {
                            Some(h) => h.changed().await.is_ok(),
                            None => std::future::pending().await,
                        }
                    };
                    let proof = async {
                        match &live {
                            Some(l) => l.notify.notified().await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        // Messages first: a proof is passed on only after every message
                        // already delivered before it was applied.
                        biased;
                        message = stream.next() => match message {
                            Some(m) if trusting => apply(&tier, &registries, m).await,
                            // While the keyspace is lost (or not yet known good), what is
                            // held stays as it was seen last.
                            Some(_) => {}
                            None => break,
                        },
                        () = proof => {
                            if let Some(at) = live.as_ref().and_then(|l| l.take()) {
                                tier.proven(at);
                            }
                        }
                        alive = changed => {
                            if !alive {
                                health = None;
                                continue;
                            }
                            let now_lost = lost(&health);
                            metrics.keyspace_lost.set(i64::from(now_lost));
                            if now_lost && trusting {
                                tier.lost_sync();
                                trusting = false;
                            } else if !now_lost && !trusting {
                                registries.invalidate_all();
                                tier.resynced();
                                trusting = true;
                            }
                        }
                    }
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
