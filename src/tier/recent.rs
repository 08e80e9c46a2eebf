//! Changes heard lately and this instance's own writes (`Recent`, under the `recent` lock):
//! what tells a change that may have overtaken another (a conflict: the bucket is read again)
//! from one that may be applied in place.
//!
//! **Own writes.** An upsert this instance made and had acknowledged, its message atomic
//! with it (one node), is applied at once (`wrote_acked`): its codes are known, and
//! applying them is what its message will do. Read again instead where that could be
//! wrong: a change of the field heard between sending and the acknowledgement with another
//! code (their order is unknown), or a new generation since sending. The codes written are
//! remembered for `conflict_window`, and a message bringing another code to such a field
//! reads the bucket again, so an older write's message arriving late cannot take the
//! writer back behind its own acknowledged write.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::LocalTier;
use super::lock::{Rank, Ranked};
use crate::store::EntryKey;

/// Field → time of the last change heard, kept for conflict detection; past this many,
/// every change is treated as a conflict (read again) until old ones age out.
const RECENT_CAP: usize = 1_000_000;

/// Changes heard lately, for conflict detection, and this instance's own upserts applied
/// at their acknowledgement (see `LocalTier::wrote_acked`), under the `recent` lock.
pub(super) struct Recent(Ranked<Heards>);

/// What the `recent` lock guards.
struct Heards {
    /// Field → the last change heard of it.
    heard: HashMap<EntryKey, Heard>,
    /// Changes heard so far: a write's mark (`write_mark`) is this count when it was sent.
    seq: u64,
    /// Field → the code this instance wrote and had acknowledged, and when that write was
    /// sent (it took effect between then and its acknowledgement; the acknowledgement may be
    /// processed late on a busy instance, so a fail-open answer from it is dated by the send).
    own: HashMap<EntryKey, (Option<u32>, Instant)>,
    /// When old entries of both maps were last forgotten.
    pruned: Instant,
}

#[derive(Clone, Copy)]
struct Heard {
    at: Instant,
    seq: u64,
    code: Option<u32>,
}

impl Heards {
    /// Forgets what is older than `window`, at most once per window: each map holds about
    /// two windows' worth of fields.
    fn prune(&mut self, now: Instant, window: Duration) {
        if self.heard.len() + self.own.len() > 1024
            && now.saturating_duration_since(self.pruned) >= window
        {
            self.heard
                .retain(|_, h| now.saturating_duration_since(h.at) < window);
            self.own
                .retain(|_, (_, at)| now.saturating_duration_since(*at) < window);
            self.pruned = now;
        }
    }
}

impl Recent {
    pub(super) fn new() -> Self {
        Self(Ranked::new(
            Rank::Recent,
            Heards {
                heard: HashMap::new(),
                seq: 0,
                own: HashMap::new(),
                pruned: Instant::now(),
            },
        ))
    }

    /// Changes heard so far (a `WriteMark`'s `seq`).
    pub(super) fn seq(&self) -> u64 {
        self.0.lock().seq
    }

    /// The code this instance wrote to `key` and had acknowledged, and when that write was
    /// sent, if within the window.
    pub(super) fn own(&self, key: &EntryKey) -> Option<(Option<u32>, Instant)> {
        self.0.lock().own.get(key).copied()
    }

    /// Records `changes` heard at `now` (from `LocalTier::apply`) and returns the buckets of
    /// those that conflict: a field changed again within `window` by a non-atomic message,
    /// or changed to another code than this instance's own acknowledged upsert of it within
    /// the window; with the time before which such a bucket was last known in sync (`now`
    /// without conflicts).
    pub(super) fn hear(
        &self,
        changes: &[(EntryKey, Option<u32>)],
        atomic: bool,
        window: Duration,
        now: Instant,
    ) -> (HashSet<u32>, Instant) {
        let mut conflicts = HashSet::new();
        // A conflicting pair of changes leaves the copy known in sync only before the
        // earlier of them (or, with no earlier one heard, the window before this one).
        let mut since = now;
        let mut recent = self.0.lock();
        recent.prune(now, window);
        for (k, code) in changes {
            recent.seq += 1;
            let heard = Heard {
                at: now,
                seq: recent.seq,
                code: *code,
            };
            let full = recent.heard.len() >= RECENT_CAP;
            let previous = if full {
                None
            } else {
                recent.heard.insert(*k, heard)
            };
            let close = previous.is_some_and(|h| now.saturating_duration_since(h.at) < window);
            let not_own = recent.own.get(k).is_some_and(|(own, at)| {
                own != code && now.saturating_duration_since(*at) < window
            });
            if (!atomic && (full || close)) || not_own {
                conflicts.insert(k.bucket);
                let earlier = match (previous, recent.own.get(k)) {
                    (Some(h), _) if close => h.at,
                    (_, Some((_, at))) if not_own => *at,
                    _ => now.checked_sub(window).unwrap_or(now),
                };
                since = since.min(earlier);
            }
        }
        (conflicts, since)
    }

    /// Records this instance's acknowledged upsert of `changes`, sent at `sent` when `seq`
    /// changes had been heard (`LocalTier::wrote_acked`), and returns the buckets it cannot be
    /// applied to at once: a change of the field heard since with another code, or full maps.
    pub(super) fn acknowledged(
        &self,
        changes: &[(EntryKey, Option<u32>)],
        seq: u64,
        sent: Instant,
        window: Duration,
        now: Instant,
    ) -> HashSet<u32> {
        let mut unsure = HashSet::new();
        let mut recent = self.0.lock();
        recent.prune(now, window);
        let full = recent.heard.len() >= RECENT_CAP || recent.own.len() >= RECENT_CAP;
        for (k, code) in changes {
            let raced = recent
                .heard
                .get(k)
                .is_some_and(|h| h.seq > seq && h.code != *code);
            if full || raced {
                unsure.insert(k.bucket);
            }
            // Unsure too: a message of an older write arriving after the bucket is read
            // again must not take the field back behind this write.
            if !full {
                recent.own.insert(*k, (*code, sent));
            }
        }
        unsure
    }

    /// Remembers this instance's acknowledged write of `changes`, sent at `sent`
    /// (`LocalTier::remember_own`).
    pub(super) fn remember(
        &self,
        changes: &[(EntryKey, Option<u32>)],
        sent: Instant,
        window: Duration,
        now: Instant,
    ) {
        let mut recent = self.0.lock();
        recent.prune(now, window);
        if recent.own.len() < RECENT_CAP {
            for (k, code) in changes {
                recent.own.insert(*k, (*code, sent));
            }
        }
    }
}

/// Where the tier stood when this instance sent a write: what its acknowledgement is
/// compared with (`LocalTier::wrote_acked`).
#[derive(Debug, Clone, Copy)]
pub struct WriteMark {
    pub(super) generation: u64,
    pub(super) seq: u64,
    /// When the write was sent: a copy that misses it was last known in sync then.
    pub(super) at: Instant,
}

impl LocalTier {
    /// Where the tier stands now: taken before this instance sends a write, for
    /// `wrote_acked`.
    pub fn write_mark(&self) -> WriteMark {
        let seq = self.recent.seq();
        WriteMark {
            generation: self.generation(),
            seq,
            at: Instant::now(),
        }
    }

    /// This instance's upsert of `changes`, sent at `mark`, was acknowledged, and its message
    /// is published atomically with it (one node): applied to the copies at once, as its
    /// message will be, rather than marked dirty and read again (`wrote`), so the writer's
    /// next check sees it without a read. Where that cannot be known right, the bucket is
    /// read again as before: a change of the field heard since `mark` with another code
    /// (its order against this write is unknown), a new generation since `mark` (messages
    /// may have been lost), no conflict window to watch later messages in, or full maps.
    /// A message arriving later with another code reads the bucket again (`apply`).
    pub fn wrote_acked(&self, changes: &[(EntryKey, Option<u32>)], mark: WriteMark) {
        if self.copies.is_none() || changes.is_empty() {
            return;
        }
        let window = self.settings.conflict_window;
        if window.is_zero() || mark.generation != self.generation() {
            self.remember_own(changes, mark);
            self.wrote(&changes.iter().map(|(k, _)| *k).collect::<Vec<_>>(), mark);
            return;
        }
        let now = Instant::now();
        let unsure = self
            .recent
            .acknowledged(changes, mark.seq, mark.at, window, now);
        let sure: Vec<_> = changes
            .iter()
            .filter(|(k, _)| !unsure.contains(&k.bucket))
            .copied()
            .collect();
        self.apply_in_place(&sure);
        if !unsure.is_empty() {
            self.dirty(unsure, mark.at);
        }
    }

    /// This instance's write of `changes`, sent at `mark`, was acknowledged: what a fail-open
    /// answer may say of these fields while their buckets are not held (or are held older),
    /// as of its sending (`held`). Kept for the conflict window, like every own write.
    pub fn remember_own(&self, changes: &[(EntryKey, Option<u32>)], mark: WriteMark) {
        if self.copies.is_none() || changes.is_empty() {
            return;
        }
        self.recent.remember(
            changes,
            mark.at,
            self.settings.conflict_window,
            Instant::now(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier::Lookup;
    use crate::tier::testing::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, VecDeque};

    #[test]
    fn an_acknowledged_upsert_is_applied_at_once_without_a_read() {
        let t = tier(Duration::from_secs(3));
        install(&t, vec![(5, LATER)]);
        let queued = |t: &LocalTier| t.queue.lock().queued.contains(&1);
        // Acknowledged, nothing heard of the field meanwhile: local at once, nothing to read.
        let mark = t.write_mark();
        t.wrote_acked(&[(key(6), Some(LATER - 1))], mark);
        assert_eq!(
            t.lookup(&key(6), Instant::now()),
            Lookup::Local(Some(LATER - 1))
        );
        assert!(!queued(&t), "no read");
        // Its own message (the same code) changes nothing; another code (an older write's
        // message arriving late, or a later write) reads the bucket again.
        t.apply(&[(key(6), Some(LATER - 1))], true);
        assert!(t.get(1).unwrap().dirty_since.is_none() && !queued(&t));
        t.apply(&[(key(6), Some(LATER - 2))], true);
        assert_eq!(t.lookup(&key(6), Instant::now()), Lookup::Remote);
        assert!(queued(&t));
        install(&t, vec![(5, LATER), (6, LATER - 1)]);

        // A change of the field with another code heard between sending and the
        // acknowledgement: their order is unknown, so the bucket is read again.
        let mark = t.write_mark();
        t.apply(&[(key(7), Some(LATER - 2))], true);
        t.wrote_acked(&[(key(7), Some(LATER - 3))], mark);
        assert_eq!(t.lookup(&key(7), Instant::now()), Lookup::Remote);
        install(&t, vec![(5, LATER), (6, LATER - 1), (7, LATER - 3)]);

        // A new generation since the write was sent (messages may have been lost).
        let mark = t.write_mark();
        t.invalidate_all();
        install(&t, vec![(5, LATER)]);
        t.wrote_acked(&[(key(8), Some(LATER))], mark);
        assert_eq!(t.lookup(&key(8), Instant::now()), Lookup::Remote);
        // No conflict window to watch later messages in: read again as before.
        let t = tier(Duration::ZERO);
        install(&t, vec![(5, LATER)]);
        let mark = t.write_mark();
        t.wrote_acked(&[(key(6), Some(LATER))], mark);
        assert_eq!(t.lookup(&key(6), Instant::now()), Lookup::Remote);
    }

    /// An own write acknowledged late (a busy instance) answers a fail-open lookup as of its
    /// sending, not of the acknowledgement: writes elsewhere acknowledged meanwhile were not
    /// seen.
    #[test]
    fn an_own_write_answers_fail_open_as_of_its_sending() {
        let t = tier(Duration::from_secs(3));
        let mark = t.write_mark();
        std::thread::sleep(Duration::from_millis(30));
        t.wrote_acked(&[(key(6), Some(LATER))], mark);
        assert_eq!(
            t.held(&key(6), Instant::now()),
            Some((Some(LATER), mark.at))
        );
        // A copy dirtied by that very write (its message not atomic with it): the write
        // answers, as of the same instant.
        install(&t, vec![(5, LATER)]);
        let mark = t.write_mark();
        std::thread::sleep(Duration::from_millis(30));
        t.remember_own(&[(key(7), None)], mark);
        t.wrote(&[key(7)], mark);
        t.lost_sync();
        assert_eq!(t.held(&key(7), Instant::now()), Some((None, mark.at)));
        assert_eq!(
            t.held(&key(5), Instant::now()).map(|(_, at)| at),
            Some(mark.at)
        );
    }

    /// One event of an interleaving with this instance writing too: another instance's
    /// write lands (its message pending), this instance's lands (the same, its mark taken
    /// before), the oldest unacknowledged own write is acknowledged, or the oldest pending
    /// message is delivered.
    #[derive(Debug, Clone, Copy)]
    enum Step {
        Other(i64, Option<u32>),
        Own(i64, u32),
        Ack,
        Deliver,
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        proptest::collection::vec(
            prop_oneof![
                other_write(0..3).prop_map(|(f, c)| Step::Other(f, c)),
                (0i64..3, 1u32..4).prop_map(|(f, c)| Step::Own(f, LATER - c)),
                Just(Step::Ack),
                Just(Step::Deliver),
            ],
            0..28,
        )
    }

    proptest! {
        /// This instance's acknowledged upserts are applied at once (`wrote_acked`): whatever
        /// the order of its writes, other instances' writes, the acknowledgements and the
        /// messages, and a read racing them, once an own write is acknowledged the field never
        /// shows an older state than that write (read-your-writes), nor than the last write
        /// whose message arrived; once everything arrived and what was marked dirty is read
        /// again, the copy is exactly the store.
        #[test]
        fn the_writer_sees_its_acknowledged_upserts_and_never_an_older_state(
            initial in proptest::collection::btree_map(0i64..3, 1u32..4, 0..3),
            steps in steps(),
            marks in (0usize..=28, 0usize..=28, 0usize..=28),
        ) {
            let t = tier(Duration::from_secs(3));
            let mut model = Model::new(&initial);
            install(&t, model.pairs());
            let n = steps.len();
            let mut racing = RacingRead::new(marks, n, false);
            // Own writes waiting for their acknowledgement (index, field, code, mark); the
            // newest acknowledged own write of each field.
            let mut unacked: VecDeque<(usize, i64, u32, WriteMark)> = VecDeque::new();
            let mut acked: HashMap<i64, usize> = HashMap::new();
            let mut delivered = 0;
            let check = |t: &LocalTier, model: &Model, delivered: usize, acked: &HashMap<i64, usize>| {
                for f in 0..3 {
                    let answer = model.answer(t, f);
                    let heard = model.writes[..delivered].iter().rposition(|(g, _)| *g == f);
                    let floor = heard.max(acked.get(&f).copied());
                    let allowed = allowed_values(&initial, &model.writes, f, floor);
                    prop_assert!(allowed.contains(&answer), "field {f}: {answer:?} not in {allowed:?}");
                }
                Ok(())
            };
            let deliver = |t: &LocalTier, (f, c): (i64, Option<u32>)| {
                // Upserts publish inside their transaction; a delete's message follows it.
                t.apply(&[(key(f), c)], c.is_some());
            };
            for i in 0..=n {
                racing.before_step(i, &t, &model);
                check(&t, &model, delivered, &acked)?;
                match steps.get(i) {
                    Some(Step::Other(f, c)) => model.write(*f, *c),
                    Some(Step::Own(f, c)) => {
                        let mark = t.write_mark();
                        model.write(*f, Some(*c));
                        unacked.push_back((model.writes.len() - 1, *f, *c, mark));
                    }
                    Some(Step::Ack) => {
                        if let Some((j, f, c, mark)) = unacked.pop_front() {
                            t.wrote_acked(&[(key(f), Some(c))], mark);
                            let newest = acked.entry(f).or_insert(j);
                            *newest = (*newest).max(j);
                        }
                    }
                    Some(Step::Deliver) if delivered < model.writes.len() => {
                        deliver(&t, model.writes[delivered]);
                        delivered += 1;
                    }
                    _ => {}
                }
            }
            while let Some((j, f, c, mark)) = unacked.pop_front() {
                t.wrote_acked(&[(key(f), Some(c))], mark);
                acked.insert(f, acked.get(&f).copied().unwrap_or(j).max(j));
                check(&t, &model, delivered, &acked)?;
            }
            while delivered < model.writes.len() {
                deliver(&t, model.writes[delivered]);
                delivered += 1;
                check(&t, &model, delivered, &acked)?;
            }
            // What was marked dirty is read again, as the worker does.
            if t.get(1).expect("installed").dirty_since.is_some() {
                install(&t, model.pairs());
            }
            let copy = t.get(1).expect("installed");
            prop_assert!(copy.dirty_since.is_none());
            prop_assert_eq!(copy.pairs().collect::<BTreeMap<_, _>>(), model.store);
        }
    }
}
