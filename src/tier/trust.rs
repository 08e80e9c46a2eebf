//! Trust and generations: whether what is held may answer a check as current, and since when
//! it was last known in sync. The invalidation subscription's state (trusted or not, its
//! proofs of delivery) and the generations' history, under the `sync` lock.
//!
//! **Trust and generations.** While the invalidation subscription is down, writes elsewhere
//! go unseen: the tier is *untrusted* and every lookup goes to the store, but copies stay
//! for fail-open answers. Resubscribing catches up from the change log where it can
//! (`resumed`, `invalidation`): only the buckets written meanwhile are marked dirty and
//! read again, the rest answer again at once. Where it cannot (a gap in the log, no log),
//! resubscribing, like a `Bulk` import, starts a new generation:
//! copies of older generations are used only for fail-open until read again, which the
//! worker does at once. With proofs of delivery (Redis) that is the whole rule: a copy in the
//! current generation, while the last proof is under `LIVE_BOUND`, has heard every change
//! since its read, whatever its age. Age drives only a safety net against a change whose
//! message never reached the feed (on a cluster a write and its message are two steps):
//! each held bucket is read again between one and two `refresh_period`s
//! (`buckets / refresh_rate`, at least `ttl / 2`), so its cost is `refresh_rate` reads a
//! second whatever the keyspace (issue 26: at 50M entries the old rule re-read 4,499 buckets
//! a second per instance). Without proofs (an in-process bus) a copy is never used more than
//! `ttl` after its read started, and is read again from `ttl / 2` on. Never on a caller's
//! path.
//!
//! **Staleness of a fail-open answer** (`stale_ms`): the time since each copy used was last
//! known in sync: now, while trusted and current; otherwise the earliest of when the
//! subscription broke (or its generation ended) and when it turned dirty. A dirty mark never
//! makes a copy fresher: one set after the copy's sync ended (this instance's own write of
//! unknown outcome dirties whatever copy it finds) says nothing of the writes missed before.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::LocalTier;
use super::holding::Held;

/// `proven_ns` when the subscription gives no proofs of delivery.
pub(super) const NO_CLOCK: u64 = u64::MAX;

/// How old the subscription's last proof of delivery may be for the tier to answer a check
/// locally as current: within the invalidation bound (100 ms) that non-degraded answers
/// promise, less the time a message takes to arrive. Proofs come every
/// `Liveness::PROOF_EVERY` (25 ms); past this, lookups go to Redis (no generation change,
/// nothing read again) until the next proof.
pub const LIVE_BOUND: Duration = Duration::from_millis(90);

/// Trust and generations (see the module docs).
pub(super) struct SyncState {
    pub(super) trusted: bool,
    pub(super) generation: u64,
    /// When the subscription broke (while untrusted).
    pub(super) broke_at: Option<Instant>,
    /// When recent generations stopped being in sync.
    pub(super) ended: BTreeMap<u64, Instant>,
    /// When the current generation began (every copy in it was read after).
    pub(super) began: Instant,
}

impl LocalTier {
    /// Whether answers from the tier (and the registry cache) may be given as authoritative:
    /// the invalidation subscription is up.
    pub fn is_trusted(&self) -> bool {
        self.trusted.load(Ordering::Acquire)
    }

    /// Trusted, and (with a clock of proofs) proven to receive invalidations within
    /// `LIVE_BOUND`: what may answer a check locally as current.
    pub(super) fn current(&self, now: Instant) -> bool {
        if !self.is_trusted() {
            return false;
        }
        let proven = now.saturating_duration_since(self.proven_at(now)) <= LIVE_BOUND;
        if !proven {
            self.unproven.fetch_add(1, Ordering::Relaxed);
        }
        proven
    }

    /// Until when what the subscription delivered is known complete: `now` without a clock.
    pub(super) fn proven_at(&self, now: Instant) -> Instant {
        match self.proven_ns.load(Ordering::Acquire) {
            NO_CLOCK => now,
            ns => (self.epoch + Duration::from_nanos(ns)).min(now),
        }
    }

    /// A subscription begins: `clock` says whether it gives proofs of delivery (then the
    /// first proof is its start, `at`).
    pub fn clock(&self, clock: bool, at: Instant) {
        let ns = if clock {
            at.saturating_duration_since(self.epoch).as_nanos() as u64
        } else {
            NO_CLOCK
        };
        self.proven_ns.store(ns, Ordering::Release);
    }

    /// The subscription delivered everything published before `sent` (and the listener
    /// applied it).
    pub fn proven(&self, sent: Instant) {
        let ns = sent.saturating_duration_since(self.epoch).as_nanos() as u64;
        let _ = self
            .proven_ns
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                (p != NO_CLOCK && p < ns).then_some(ns)
            });
    }

    /// Whether the subscription gives proofs of delivery (a Redis store's; an in-process
    /// bus's does not).
    pub(super) fn proven_feed(&self) -> bool {
        self.proven_ns.load(Ordering::Acquire) != NO_CLOCK
    }

    /// Whether what was read at `at` may still answer by its age: always while the feed gives
    /// proofs of delivery (what was held since is known to have heard every change; the
    /// generation and the proof's age are checked apart), else within `ttl`.
    pub(super) fn young_enough(&self, at: Instant, now: Instant) -> bool {
        self.proven_feed() || now.saturating_duration_since(at) <= self.settings.ttl
    }

    /// The subscription broke: writes elsewhere may go unseen from now on. Returns until
    /// when what is held was known in sync, if it was trusted until now (what a catch-up
    /// from the change log must start before: `resumed`).
    pub fn lost_sync(&self) -> Option<Instant> {
        let mut st = self.sync.lock();
        let mut broke = None;
        if st.trusted {
            st.trusted = false;
            // In sync only as far as the subscription last proved it.
            broke = Some(self.proven_at(Instant::now()));
            st.broke_at = broke;
        }
        self.trusted.store(false, Ordering::Release);
        broke
    }

    /// Subscribed again, and the change log told which buckets were written since the
    /// subscription broke (`invalidation`): those are read again (answered from the store
    /// until then, their filters too), and everything else held is current again as it is,
    /// in the same generation: nothing else is read again.
    pub fn resumed(&self, touched: &BTreeSet<u32>) {
        let since = {
            let st = self.sync.lock();
            st.broke_at.unwrap_or_else(Instant::now)
        };
        self.dirty(touched.iter().copied().collect(), since);
        let mut st = self.sync.lock();
        st.broke_at = None;
        st.trusted = true;
        self.trusted.store(true, Ordering::Release);
        drop(st);
        self.queue.wake();
    }

    /// Subscribed (again): everything held may have changed unseen, so a new generation
    /// starts and the worker reads every held bucket again.
    pub fn resynced(&self) {
        let mut st = self.sync.lock();
        let ended = st.broke_at.take().unwrap_or_else(Instant::now);
        self.new_generation(&mut st, ended);
        st.trusted = true;
        self.trusted.store(true, Ordering::Release);
        drop(st);
        self.queue.wake();
    }

    /// Whether the current generation began at or after `at` (every copy in it read since).
    pub fn generation_began_since(&self, at: Instant) -> bool {
        self.sync.lock().began >= at
    }

    /// Entries were written in bulk (import), or the change log cannot be followed: anything
    /// held may be out of date. The generation ends when it was last known in sync: now (the
    /// last proof) while trusted, else when the subscription broke; ended now while the tier
    /// was untrusted, its copies would claim they had heard the writes missed meanwhile.
    pub fn invalidate_all(&self) {
        let mut st = self.sync.lock();
        let ended = self.sync_end(&st, Instant::now());
        self.new_generation(&mut st, ended);
        drop(st);
        self.queue.wake();
    }

    /// Until when what the current generation holds is known in sync: the last proof of
    /// delivery while trusted, else when the subscription broke (`now` when it never was).
    fn sync_end(&self, st: &SyncState, now: Instant) -> Instant {
        if st.trusted {
            self.proven_at(now)
        } else {
            st.broke_at.unwrap_or(now)
        }
    }

    pub(super) fn new_generation(&self, st: &mut SyncState, ended: Instant) {
        st.ended.insert(st.generation, ended);
        while st.ended.len() > 64 {
            st.ended.pop_first();
        }
        st.generation += 1;
        st.began = Instant::now();
        // The count first: a read that sees the new generation installs after this.
        self.held
            .current
            .store(Held::tag(st.generation), Ordering::Release);
        self.held.generation.store(st.generation, Ordering::Release);
    }

    /// When what was read at `fetched_at` in `generation` (dirty since `dirty_since`) was
    /// last known in sync: the earlier of the dirty mark and what its generation says. A copy
    /// dirtied after it stopped being known in sync (the subscription had broken, or its
    /// generation had ended: a write of this instance whose outcome is unknown dirties
    /// whatever copy is held) is no fresher for it.
    pub(super) fn synced_at(
        &self,
        generation: u64,
        dirty_since: Option<Instant>,
        fetched_at: Instant,
        now: Instant,
    ) -> Instant {
        let st = self.sync.lock();
        let known = if generation == st.generation {
            self.sync_end(&st, now)
        } else {
            st.ended.get(&generation).copied().unwrap_or(fetched_at)
        };
        dirty_since.map_or(known, |d| d.min(known))
    }

    /// When the tier as a whole was last known in sync (now, while trusted); `None` when off.
    pub fn synced(&self, now: Instant) -> Option<Instant> {
        self.copies.as_ref()?;
        Some(self.sync_end(&self.sync.lock(), now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier::Lookup;
    use crate::tier::testing::*;

    #[test]
    fn a_lost_subscription_keeps_copies_for_fail_open_only() {
        let t = tier(Duration::ZERO);
        install(&t, vec![(5, 0)]);
        let now = Instant::now();
        assert_eq!(
            t.held(&key(5), now).map(|(_, at)| at),
            Some(now),
            "in sync now"
        );

        t.lost_sync();
        let broke = Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        let now = Instant::now();
        assert_eq!(t.lookup(&key(5), now), Lookup::Remote, "untrusted");
        let (code, at) = t.held(&key(5), now).unwrap();
        assert_eq!(code, Some(0));
        assert!(at <= broke && now.duration_since(at) >= Duration::from_millis(20));
        assert_eq!(t.synced(now), Some(at));

        // Back: a new generation; the old copy is stale until read again, and stays as stale
        // as when the subscription broke.
        t.resynced();
        let now = Instant::now();
        assert_eq!(t.lookup(&key(5), now), Lookup::Remote);
        assert_eq!(t.held(&key(5), now).map(|(_, a)| a), Some(at));
        assert_eq!(t.synced(now), Some(now));
        install(&t, vec![(5, 0)]);
        assert_eq!(t.lookup(&key(5), Instant::now()), Lookup::Local(Some(0)));
    }

    /// A generation ended (an import's `Bulk`, a gap in the change log) while the tier was
    /// untrusted: its copies were known in sync only until the subscription broke, not until
    /// the generation ended.
    #[test]
    fn a_generation_ended_while_untrusted_ends_at_the_break() {
        let t = tier(Duration::ZERO);
        install(&t, vec![(5, 0)]);
        t.lost_sync();
        let broke = Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        t.invalidate_all();
        let (_, at) = t.held(&key(5), Instant::now()).unwrap();
        assert!(at <= broke, "claims sync {:?} after the break", at - broke);
        // Back: the new generation's copies are current again once read.
        t.resynced();
        install(&t, vec![(5, 0)]);
        assert_eq!(t.lookup(&key(5), Instant::now()), Lookup::Local(Some(0)));
    }

    /// A copy marked dirty (here by this instance's own write, outcome unknown) after it
    /// stopped being known in sync (the subscription broke; then its generation ended) is no
    /// fresher for it: a fail-open answer from it is as old as the earlier of the two. (CI's
    /// history seed 8: a copy of an ended generation, missing a write made while the
    /// subscription was dead, was dirtied by the instance's own failed upsert during a
    /// SIGSTOP and answered "not listed" as if in sync at that upsert.)
    #[test]
    fn a_dirty_mark_never_makes_a_copy_fresher_than_its_sync() {
        let t = tier(Duration::ZERO);
        install(&t, vec![(5, 0)]);
        t.lost_sync();
        let broke = Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        // Untrusted, current generation: this instance's write fails (unknown outcome).
        t.wrote(&[key(6)], t.write_mark());
        let (_, at) = t.held(&key(5), Instant::now()).unwrap();
        assert!(at <= broke, "claims sync {:?} after the break", at - broke);

        // Subscribed again, a new generation; the copy is not read again yet, and another
        // write of this instance fails.
        t.resynced();
        std::thread::sleep(Duration::from_millis(20));
        t.wrote(&[key(7)], t.write_mark());
        let (code, at) = t.held(&key(5), Instant::now()).unwrap();
        assert_eq!(code, Some(0));
        assert!(at <= broke, "claims sync {:?} after the break", at - broke);

        // Read again in the current generation, then dirtied while trusted: in sync until the
        // dirty mark, as before.
        install(&t, vec![(5, 0)]);
        let mark = t.write_mark();
        t.wrote(&[key(5)], mark);
        std::thread::sleep(Duration::from_millis(5));
        let (_, at) = t.held(&key(5), Instant::now()).unwrap();
        assert!(at <= mark.at && at > broke);
    }
}
