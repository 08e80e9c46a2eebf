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
//! the task checks that the keyspace is the one opened (again every second while the store
//! cannot answer: Redis still loading its data after a restart); while the store says it is lost, the
//! tier is untrusted (answers go to the fail-open path, from the copies as they stood when the
//! loss was seen: the store refuses to read a lost keyspace) and messages are not applied;
//! when it is back (its data restored), a new generation starts as after a resubscription.
//! `watch_keyspace` checks it every second whatever else happens.
//!
//! # Catching up from the change log
//! A resubscription need not read everything held again: every write leaves records in the
//! change log (`store::redis::changelog`: the audit trail, each record naming its bucket), so the
//! buckets written while nobody listened are known. `note_marks` notes where the log stands
//! every `MARK_EVERY`; when the subscription breaks, the tier says until when it was known in
//! sync (`LocalTier::lost_sync`, the last proof of delivery), and once subscribed again the
//! task reads the log from the newest mark noted at least `lag` before that instant (`lag`:
//! the longest a write's message may follow its records, the write deadline and a second)
//! and only the buckets it names are read again (`LocalTier::resumed`). Everything is read
//! again, as before the log, when the log cannot say: no mark old enough (the first
//! subscription, a break right after a start), a gap (`store::Replay::Gap`: a part trimmed
//! past the mark, a node restarted or failed over, an import's record), the read failed, or
//! the tier was not trusted when the subscription broke (the keyspace lost).
//!
//! The same task that notes the marks follows the log `lag` behind (`follow_log`): every
//! record is checked against what the tier holds, so a message that never went out is made
//! up for within seconds.

use std::collections::{BTreeSet, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;

use crate::instrumented::Instrumented;
use crate::metrics::{Metrics, StoreOp};
use crate::store::{
    Deadline, Invalidation, InvalidationBus, KeyspaceHealth, LogMark, Replay, Scope, StoreBase,
    StoreResult,
};
use crate::tier::{LocalTier, RegistryCache};

/// How often every instance checks that its keyspace is still there (besides every read of a
/// check or of the tier, which carries the check).
pub const KEYSPACE_EVERY: Duration = Duration::from_secs(1);

/// Checks the keyspace id every `KEYSPACE_EVERY` until the task is aborted (the store updates
/// what its `keyspace` channel says).
pub async fn watch_keyspace(bus: Instrumented<dyn InvalidationBus>) {
    let mut polling = Polling::every(KEYSPACE_EVERY);
    loop {
        let deadline = polling.next().await;
        let r = bus
            .call(StoreOp::Keyspace, deadline, |b| b.verify_keyspace())
            .await;
        if let Err(e) = r {
            tracing::debug!(error = %e, "keyspace check");
        }
    }
}

/// A tick every `period`, a late one delaying the next rather than bringing a burst; the call
/// made on a tick is given one period.
struct Polling {
    tick: tokio::time::Interval,
    period: Duration,
}

impl Polling {
    fn every(period: Duration) -> Self {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self { tick, period }
    }

    /// Waits for the next tick; the deadline of the call made on it.
    async fn next(&mut self) -> Deadline {
        self.tick.tick().await;
        Deadline::after(self.period)
    }
}

/// How long subscribing may take before it is given up and tried again.
pub const SUBSCRIBE_DEADLINE: Duration = Duration::from_secs(5);

/// A call on the bus given `SUBSCRIBE_DEADLINE`: subscribing (here and to velocity's
/// definitions), and what a subscription does before it trusts anything or to catch up (the
/// keyspace check, reading the change log).
pub(crate) async fn unhurried<'s, S: StoreBase + ?Sized, T, F>(
    bus: &'s Instrumented<S>,
    op: StoreOp,
    call: impl FnOnce(&'s S) -> F,
) -> StoreResult<T>
where
    F: Future<Output = StoreResult<T>>,
{
    bus.call(op, Deadline::after(SUBSCRIBE_DEADLINE), call)
        .await
}

/// How often `note_marks` notes where the change log stands.
pub const MARK_EVERY: Duration = Duration::from_secs(1);

/// Marks kept: enough to find one `lag` old for any write deadline up to ~25 s.
const MARKS_KEPT: usize = 32;

/// Where the change log stood lately (`note_marks`), oldest first, each with when its
/// reply arrived (every record in it was written before then).
#[derive(Default)]
pub struct Marks {
    noted: Mutex<VecDeque<(Instant, LogMark)>>,
}

impl Marks {
    fn note(&self, at: Instant, mark: LogMark) {
        let mut noted = self.noted.lock().expect("marks lock");
        if noted.len() >= MARKS_KEPT {
            noted.pop_front();
        }
        noted.push_back((at, mark));
    }

    /// The newest mark noted no later than `at`, and when.
    fn before(&self, at: Instant) -> Option<(Instant, LogMark)> {
        let noted = self.noted.lock().expect("marks lock");
        noted.iter().rev().find(|(t, _)| *t <= at).cloned()
    }
}

/// Notes where the change log stands every `MARK_EVERY`, and follows it, until the task is
/// aborted or the bus says it keeps no log (nothing when the tier is off). Following: the
/// records between the last mark followed and the newest mark at least `lag` old (their
/// messages have arrived by then, if they were ever published) are checked against what
/// the tier holds (`LocalTier::verify`): a bucket whose copy or filter disagrees missed a
/// message (on a cluster, a writer that died between its records and its `PUBLISH`) and is
/// read again, within `lag` and two marks of the write. A gap there (the log trimmed faster
/// than it is followed, a node restarted) starts a new generation, unless one began since
/// the gap's start (a resubscription already reads everything again).
///
/// Its cost, per instance: one `INFO server` per Redis primary and one `XINFO STREAM` per
/// audit part (64) a second, whatever the keyspace's size (an `EXISTS` instead for a part
/// never written: no error replies), and every record once (`XRANGE`).
pub async fn follow_log(
    bus: Instrumented<dyn InvalidationBus>,
    marks: Arc<Marks>,
    tier: Arc<LocalTier>,
    metrics: Arc<Metrics>,
    lag: Duration,
) {
    if tier.mode() == crate::tier::Mode::Off {
        return;
    }
    let mut polling = Polling::every(MARK_EVERY);
    let mut followed: Option<(Instant, LogMark)> = None;
    let mut retry: Option<(Instant, LogMark)> = None;
    loop {
        let deadline = polling.next().await;
        let r = bus
            .call(StoreOp::ChangeLog, deadline, |b| b.log_mark())
            .await;
        match r {
            Ok(Some(mark)) => marks.note(Instant::now(), mark),
            Ok(None) => return,
            Err(e) => tracing::debug!(error = %e, "change log mark"),
        }
        // A window that failed is tried again as it was (not grown by what came since).
        let Some(target) = retry.take().or_else(|| {
            Instant::now()
                .checked_sub(lag)
                .and_then(|at| marks.before(at))
        }) else {
            continue;
        };
        let Some((from_at, from)) = &followed else {
            followed = Some(target);
            continue;
        };
        if target.1 == *from {
            followed = Some(target);
            continue;
        }
        let r = unhurried(&bus, StoreOp::ChangeLog, |b| {
            b.log_read(from, Some(&target.1))
        })
        .await;
        // What a copy found behind was last known in sync before the records read (written
        // after `from` was noted, less its round trip).
        let since = from_at.checked_sub(MARK_EVERY).unwrap_or(*from_at);
        match r {
            Ok(Replay::Changes(changes)) => {
                metrics.log_followed.inc_by(changes.len() as u64);
                let missed = tier.verify(&changes, since);
                if missed > 0 {
                    metrics.log_missed.inc_by(missed as u64);
                    // Not a WARN: a field written again since its record (a hot entry) shows
                    // the same way as a lost message, and reading again settles both.
                    tracing::debug!(
                        buckets = missed,
                        "buckets disagree with the change log: read again"
                    );
                }
            }
            Ok(Replay::Gap(why)) => {
                if !tier.generation_began_since(*from_at) {
                    tracing::warn!(%why, "the change log cannot be followed: every bucket held is read again");
                    tier.invalidate_all();
                    metrics.catch_ups.with_label_values(&["full"]).inc();
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "following the change log");
                retry = Some(target);
                continue;
            }
        }
        followed = Some(target);
    }
}

/// After a resubscription: the buckets written since the tier was last known in sync
/// (`broke`), from the change log; `None` when everything held must be read again.
async fn catch_up(
    bus: &Instrumented<dyn InvalidationBus>,
    marks: &Marks,
    broke: Option<Instant>,
    lag: Duration,
) -> Option<BTreeSet<u32>> {
    let broke = broke?;
    let Some((_, mark)) = broke.checked_sub(lag).and_then(|t| marks.before(t)) else {
        tracing::info!("no change log mark old enough: every bucket held is read again");
        return None;
    };
    let r = unhurried(bus, StoreOp::ChangeLog, |b| b.log_read(&mark, None)).await;
    match r {
        Ok(Replay::Changes(changes)) => {
            let buckets: BTreeSet<u32> = changes.iter().map(|c| c.bucket).collect();
            tracing::info!(
                records = changes.len(),
                buckets = buckets.len(),
                "caught up from the change log: only the buckets written meanwhile are read again"
            );
            Some(buckets)
        }
        Ok(Replay::Gap(why)) => {
            tracing::warn!(%why, "the change log cannot say what changed: every bucket held is read again");
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "reading the change log failed: every bucket held is read again");
            None
        }
    }
}

/// After a resubscription: once the keyspace is known to be the one opened, the registries
/// read again and the buckets to read again found (`catch_up`). A check the store cannot
/// answer (Redis still loading its data after a restart, a timeout) is tried again every
/// `KEYSPACE_EVERY`: given up, the subscription would stay untrusted until it next broke,
/// every check going to Redis meanwhile. A lost keyspace ends this from outside (the
/// listener drops it when the store says so).
async fn verified_catch_up(
    bus: &Instrumented<dyn InvalidationBus>,
    registries: &RegistryCache,
    marks: &Marks,
    broke: Option<Instant>,
    lag: Duration,
) -> Option<BTreeSet<u32>> {
    let mut said = false;
    while let Err(e) = unhurried(bus, StoreOp::Keyspace, |b| b.verify_keyspace()).await {
        // Said once; a store that keeps refusing is logged by the calls themselves.
        if !std::mem::replace(&mut said, true) {
            tracing::info!(error = %e, "keyspace check after subscribing failed: trying again every second");
        }
        tokio::time::sleep(KEYSPACE_EVERY).await;
    }
    registries.invalidate_all();
    catch_up(bus, marks, broke, lag).await
}

/// Listens for invalidations until the task is aborted. `marks` and `lag`: see the module
/// docs, *Catching up from the change log*.
pub async fn listen(
    bus: Instrumented<dyn InvalidationBus>,
    tier: Arc<LocalTier>,
    registries: Arc<RegistryCache>,
    metrics: Arc<Metrics>,
    marks: Arc<Marks>,
    lag: Duration,
) {
    // Until when what is held was last known in sync, while a broken subscription's
    // catch-up is pending.
    let mut broke: Option<Instant> = None;
    const MIN_BACKOFF: Duration = Duration::from_millis(20);
    const MAX_BACKOFF: Duration = Duration::from_secs(1);
    let mut backoff = MIN_BACKOFF;
    let mut health = bus.inner().keyspace();
    let lost = |h: &Option<tokio::sync::watch::Receiver<KeyspaceHealth>>| {
        h.as_ref()
            .is_some_and(|h| *h.borrow() != KeyspaceHealth::Present)
    };
    loop {
        let subscribed = unhurried(&bus, StoreOp::Subscribe, |b| b.subscribe_proven()).await;
        match subscribed {
            Ok((mut stream, live)) => {
                // Proofs of delivery date what is held (`LocalTier::proven`); the first is
                // the subscription itself.
                tier.clock(live.is_some(), std::time::Instant::now());
                metrics.subscription_up.set(1);
                backoff = MIN_BACKOFF;
                tracing::info!("cache invalidation subscription up");
                let mut trusting = false;
                // Nothing is trusted until the keyspace is known to be the one opened (checked
                // again until the store answers: `verified_catch_up`). Anything held before
                // now may have changed while nobody listened: the registries are read again
                // (they are small), the buckets the change log names (or all of them). The log
                // is read while messages and proofs keep flowing (a subscription left unread
                // for seconds is found dead), and the messages are applied meanwhile: whatever
                // the log then says is read again.
                let pending = broke.take();
                let mut catching = (!lost(&health))
                    .then(|| Box::pin(verified_catch_up(&bus, &registries, &marks, pending, lag)));
                if catching.is_none() {
                    broke = pending;
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
                    let applying = trusting || catching.is_some();
                    tokio::select! {
                        // Messages first: a proof is passed on only after every message
                        // already delivered before it was applied.
                        biased;
                        message = stream.next() => match message {
                            Some(m) if applying => apply(&tier, &registries, m).await,
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
                        touched = async { catching.as_mut().expect("catching").await },
                            if catching.is_some() =>
                        {
                            catching = None;
                            let how = match touched {
                                Some(touched) => {
                                    tier.resumed(&touched);
                                    "replayed"
                                }
                                None => {
                                    tier.resynced();
                                    "full"
                                }
                            };
                            metrics.catch_ups.with_label_values(&[how]).inc();
                            trusting = true;
                        }
                        alive = changed => {
                            if !alive {
                                health = None;
                                continue;
                            }
                            let now_lost = lost(&health);
                            metrics.keyspace_lost.set(i64::from(now_lost));
                            if catching.is_some() {
                                // Lost while catching up: nothing held is caught up from the
                                // log (everything is read again once it is back).
                                if now_lost {
                                    catching = None;
                                }
                            } else if now_lost && trusting {
                                tier.lost_sync();
                                broke = None;
                                trusting = false;
                            } else if !now_lost && !trusting {
                                registries.invalidate_all();
                                tier.resynced();
                                broke = None;
                                metrics.catch_ups.with_label_values(&["full"]).inc();
                                trusting = true;
                            }
                        }
                    }
                }
                if catching.take().is_some() {
                    // Broke again before the catch-up ended: the next one starts where this
                    // one did.
                    broke = pending;
                }
                if let Some(at) = tier.lost_sync() {
                    broke = Some(at);
                }
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
                .filter_map(|(l, s)| {
                    Some(Scope {
                        list: l.parse().ok()?,
                        sandbox: s.parse().ok()?,
                    })
                })
                .collect();
            registries.invalidate(&scopes).await;
        }
        Invalidation::Bulk => {
            tier.invalidate_all();
            registries.invalidate_all();
        }
        // Definitions are the velocity service's business (its own subscription).
        Invalidation::Definitions | Invalidation::Definition { .. } => {}
    }
}
