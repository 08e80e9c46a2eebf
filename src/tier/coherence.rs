//! Keeping what is held exact: changes applied in place to copies, to reads in flight and to
//! filters; changes of unknown value marking copies dirty; the reads in flight themselves
//! (`Fetching`, one map per stripe of buckets, under the bucket's stripe lock), so that a
//! read racing a write never installs an older state.
//!
//! **Exact in place.** Every write's message carries the new codes (`Invalidation::Changes`)
//! and is applied to the copy in place. A bucket being read when a change arrives gets the
//! change logged and applied on top of what the read returns, so a read that raced a write
//! never installs an older state: changes are absolute (field := code), applying one that
//! the read already saw is a no-op, and messages of one bucket arrive in write order.
//!
//! **When values are not known** the bucket's copy is marked dirty (used only for fail-open)
//! and read again in the background: a message from an older build (`Keys`), a write made
//! by this instance whose outcome is unknown (an error: a timeout may still land) or whose
//! message is not atomic with it, and a non-atomic message for a field changed within
//! `conflict_window` (on a cluster, and for deletes, a write and its message are not one
//! atomic step, so two concurrent writers' messages may arrive in the other order than
//! their writes; the later-arriving one is then the non-atomic one, and reading again after
//! it settles it; an atomic message cannot overtake a write).
//!
//! **Filters** follow the same rules: one answers only while trusted, for the current
//! generation, by the same age rule as copies, and unless a change of unknown value reached its
//! bucket since (then it is read again, for the filter only); every insert or refresh heard
//! is added to its bits, and a deletion stays in them (a false positive) until the next read.
//! With Redis unreachable, a filter's "absent" answers fail-open lookups too.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::copy::BucketCopy;
use super::lock::{Guard, Rank, Ranked};
use super::{LocalTier, WriteMark};
use crate::domain::now_ms;
use crate::store::{EntryKey, LoggedChange, StoreError};

const STRIPES: usize = 256;

/// Reads in flight, and the changes heard meanwhile: one map per stripe of buckets, each
/// under its stripe lock. The lock of a bucket's stripe is held while its copy is installed
/// (`put`); every stripe lock, taken in ascending order, while copies move or are weighed
/// again (`index_for`, `filters_for`).
pub(super) struct Stripes(Box<[Ranked<HashMap<u32, Fetching>>]>);

impl Stripes {
    pub(super) fn new() -> Self {
        Self(
            (0..STRIPES)
                .map(|i| Ranked::new(Rank::Stripe(i as u16), HashMap::new()))
                .collect(),
        )
    }

    /// The stripe of `bucket`, locked.
    pub(super) fn lock(&self, bucket: u32) -> Guard<'_, HashMap<u32, Fetching>> {
        self.0[bucket as usize % STRIPES].lock()
    }

    /// Every stripe, locked in ascending order: no `put` runs until they are dropped.
    pub(super) fn lock_all(&self) -> Vec<Guard<'_, HashMap<u32, Fetching>>> {
        self.0.iter().map(Ranked::lock).collect()
    }

    /// Whether some read is in flight.
    pub(super) fn reading(&self) -> bool {
        self.0.iter().any(|s| !s.lock().is_empty())
    }
}

/// A read of one bucket in flight, and the changes heard meanwhile.
#[derive(Default)]
pub(super) struct Fetching {
    pub(super) log: Vec<(i64, Option<u32>)>,
    /// A change of unknown value arrived meanwhile: install the copy dirty.
    pub(super) poisoned: bool,
    /// A read for the copy found this one (for the filter only) in flight and was skipped:
    /// keep the copy.
    pub(super) wanted: bool,
}

/// A read of some buckets, between `begin_read` and `finish_read`.
pub(super) struct Read {
    pub(super) buckets: Vec<u32>,
    pub(super) generation: u64,
    pub(super) started: Instant,
    /// Read for their filters only: installed as copies only where one is held already.
    pub(super) filter_only: HashSet<u32>,
}

impl LocalTier {
    /// Changes heard from a write (`Invalidation::Changes`): applied to held copies and to
    /// reads in flight. Read again instead: the bucket of a field changed again within the
    /// conflict window by a non-atomic message, or changed to another code than this
    /// instance's own acknowledged upsert of it within the window (an older write's message
    /// arriving after that upsert was applied, or a later write: reading again settles both).
    pub fn apply(&self, changes: &[(EntryKey, Option<u32>)], atomic: bool) {
        if self.copies.is_none() || changes.is_empty() {
            return;
        }
        let (conflicts, since) = self.recent.hear(
            changes,
            atomic,
            self.settings.conflict_window,
            Instant::now(),
        );
        self.apply_in_place(changes);
        if !conflicts.is_empty() {
            self.dirty(conflicts, since);
        }
    }

    /// Applies `changes` to held copies, reads in flight and filters.
    pub(super) fn apply_in_place(&self, changes: &[(EntryKey, Option<u32>)]) {
        let mut by_bucket: BTreeMap<u32, Vec<(i64, Option<u32>)>> = BTreeMap::new();
        for (k, code) in changes {
            by_bucket
                .entry(k.bucket)
                .or_default()
                .push((k.field, *code));
        }
        let now_ms = now_ms();
        let filters = self.filters.load();
        for (bucket, fields) in by_bucket {
            let mut stripe = self.stripes.lock(bucket);
            if let Some(f) = stripe.get_mut(&bucket) {
                f.log.extend_from_slice(&fields);
            }
            if let Some(filters) = filters.as_ref() {
                for (field, code) in &fields {
                    if code.is_some() {
                        filters.add(bucket, *field);
                    }
                }
            }
            if let Some(copy) = self.get(bucket) {
                self.put(bucket, copy.with_changes(&fields, now_ms));
            }
        }
    }

    /// Fields changed to values not known here (an older writer's `Keys`).
    pub fn changed_unknown(&self, keys: &[EntryKey]) {
        self.dirty(keys.iter().map(|k| k.bucket).collect(), Instant::now());
    }

    /// This instance wrote (or tried to write) these fields, sent at `mark`, the outcome or
    /// the order of its message unknown (else `wrote_acked`): their buckets are read again,
    /// and answered from the store until then (read-your-writes whatever the outcome). A copy
    /// held meanwhile was last known in sync when the write was sent, not after.
    pub fn wrote(&self, keys: &[EntryKey], mark: WriteMark) {
        self.dirty(keys.iter().map(|k| k.bucket).collect(), mark.at);
    }

    /// Marks the held copies of `buckets` (and reads in flight) out of date since `since`
    /// (the earliest such time is kept) and queues them.
    pub(super) fn dirty(&self, buckets: HashSet<u32>, since: Instant) {
        if self.copies.is_none() {
            return;
        }
        let filters = self.filters.load();
        let generation = self.generation();
        for bucket in buckets {
            let mut stripe = self.stripes.lock(bucket);
            let fetching = stripe.get_mut(&bucket).map(|f| f.poisoned = true).is_some();
            let filtered = filters.as_ref().is_some_and(|f| {
                let had = f.stamp(bucket, generation).is_some();
                f.invalidate(bucket);
                had
            });
            let held = match self.get(bucket) {
                Some(copy) => {
                    if copy.dirty_since.is_none_or(|d| d > since) {
                        self.put(bucket, copy.dirtied(since));
                    }
                    true
                }
                None => false,
            };
            drop(stripe);
            if held || fetching {
                self.queue.push(bucket);
            } else if filtered {
                self.queue.push_filter(bucket);
            }
        }
    }

    /// Lazy expiry deleted `key` while it held `code`: drop it from the copy too, so that
    /// later checks do not ask for the same deletion again.
    pub fn forget_expired(&self, key: &EntryKey, code: u32) {
        let _stripe = self.stripes.lock(key.bucket);
        if let Some(copy) = self.get(key.bucket)
            && copy.get(key.field) == Some(code)
        {
            self.put(
                key.bucket,
                copy.with_changes(&[(key.field, None)], now_ms()),
            );
        }
    }

    /// Changes read from the change log, old enough that their messages have arrived if
    /// they were ever published (`invalidation::follow_log`): a copy of the current
    /// generation that holds another code for a field, or a filter that says an upserted
    /// field is absent, missed a message (or saw a later change: reading again settles
    /// both). Those buckets are read again, their copies known in sync only until `since`.
    /// Returns how many.
    pub fn verify(&self, changes: &[LoggedChange], since: Instant) -> usize {
        if self.copies.is_none() {
            return 0;
        }
        let filters = self.filters.load();
        let generation = self.generation();
        let mut missed = HashSet::new();
        for c in changes {
            if missed.contains(&c.bucket) {
                continue;
            }
            let disagrees = match self.get(c.bucket) {
                Some(copy) => {
                    copy.generation == generation
                        && copy.dirty_since.is_none()
                        && copy.get(c.field) != c.code
                }
                None => {
                    c.code.is_some()
                        && filters.as_ref().is_some_and(|f| {
                            f.stamp(c.bucket, generation)
                                .is_some_and(|(g, _)| g == generation)
                                && !f.may_hold(c.bucket, c.field)
                        })
                }
            };
            if disagrees {
                missed.insert(c.bucket);
            }
        }
        let n = missed.len();
        if n > 0 {
            self.dirty(missed, since);
        }
        n
    }

    /// Registers a read of `buckets` (those not already being read), so that changes heard
    /// from now on are logged for it. A bucket wanted as a copy whose read for the filter only
    /// is in flight is skipped, and that read keeps the copy instead.
    pub(super) fn begin_read(&self, buckets: &[u32], filter_only: HashSet<u32>) -> Read {
        use std::collections::hash_map::Entry;
        let mut owned = Vec::with_capacity(buckets.len());
        for &b in buckets {
            match self.stripes.lock(b).entry(b) {
                Entry::Vacant(e) => {
                    e.insert(Fetching::default());
                    owned.push(b);
                }
                Entry::Occupied(mut e) => e.get_mut().wanted |= !filter_only.contains(&b),
            }
        }
        Read {
            buckets: owned,
            generation: self.generation(),
            started: Instant::now(),
            filter_only,
        }
    }

    /// Installs what a read returned, each bucket with the changes logged since it began
    /// applied on top (dirty if a change of unknown value arrived); on failure forgets it.
    pub(super) fn finish_read(
        &self,
        read: Read,
        result: Result<Vec<Vec<(i64, u32)>>, StoreError>,
    ) -> Result<(), StoreError> {
        let all = match result {
            Ok(all) => all,
            Err(e) => {
                for &b in &read.buckets {
                    self.stripes.lock(b).remove(&b);
                }
                self.fetch_errors.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
        };
        self.fetched
            .fetch_add(read.buckets.len() as u64, Ordering::Relaxed);
        self.held
            .read_buckets
            .fetch_add(read.buckets.len() as u64, Ordering::Relaxed);
        let now_ms = now_ms();
        let filters = self.filters.load();
        for (b, pairs) in read.buckets.into_iter().zip(all) {
            let mut copy = BucketCopy::from_pairs(pairs, now_ms, read.started, read.generation);
            self.held
                .read_entries
                .fetch_add(copy.len() as u64, Ordering::Relaxed);
            self.held
                .read_bytes
                .fetch_add(copy.bytes() as u64, Ordering::Relaxed);
            let mut stripe = self.stripes.lock(b);
            let fetching = stripe.remove(&b).expect("registered by begin_read");
            if !fetching.log.is_empty() {
                copy = copy.with_changes(&fetching.log, now_ms);
            }
            if let Some(f) = filters.as_ref() {
                let fields = copy.pairs().map(|(field, _)| field);
                f.rebuild(b, fields, read.generation, read.started, !fetching.poisoned);
            }
            if fetching.poisoned {
                copy = copy.dirtied(read.started);
            }
            let keep = !read.filter_only.contains(&b) || fetching.wanted || self.get(b).is_some();
            if keep {
                self.put(b, copy);
            }
            drop(stripe);
            if fetching.poisoned {
                if keep {
                    self.queue.push(b);
                } else {
                    self.queue.push_filter(b);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier::Lookup;
    use crate::tier::testing::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;
    use std::time::Duration;

    /// One event of an interleaving: a write lands in the store (its message pending), the
    /// oldest pending message is delivered, or the read starts / reads / is installed.
    #[derive(Debug, Clone, Copy)]
    enum Event {
        Write(i64, Option<u32>),
        Deliver,
    }

    fn events() -> impl Strategy<Value = Vec<Event>> {
        proptest::collection::vec(
            prop_oneof![
                other_write(0..4).prop_map(|(f, c)| Event::Write(f, c)),
                Just(Event::Deliver),
            ],
            0..24,
        )
    }

    proptest! {
        /// A bucket read while writes land, whatever the order of the read, the writes and
        /// their messages: once a write's message has arrived (and the read is installed), the
        /// answer for its field is never older than that write; once every message has
        /// arrived, the copy is exactly the store.
        #[test]
        fn a_read_racing_writes_never_installs_an_older_state(
            initial in proptest::collection::btree_map(0i64..4, 1u32..4, 0..4),
            held_before in any::<bool>(),
            filter_only in any::<bool>(),
            events in events(),
            marks in (0usize..=24, 0usize..=24, 0usize..=24),
        ) {
            // Complete mode with copies, or partial mode with a read for the filter only.
            let t = if filter_only { filtered_tier(Duration::ZERO) } else { tier(Duration::ZERO) };
            let mut model = Model::new(&initial);
            if held_before {
                install(&t, model.pairs());
            }
            let n = events.len();
            let mut racing = RacingRead::new(marks, n, filter_only);
            let mut delivered = 0;
            let check = |t: &LocalTier, model: &Model, delivered: usize| {
                for f in 0..4 {
                    let answer = model.answer(t, f);
                    // Values the field may show: the last delivered write's or any later one.
                    let last = model.writes[..delivered].iter().rposition(|(g, _)| *g == f);
                    let allowed = allowed_values(&initial, &model.writes, f, last);
                    prop_assert!(allowed.contains(&answer), "field {f}: {answer:?} not in {allowed:?}");
                }
                Ok(())
            };
            for i in 0..=n {
                if racing.before_step(i, &t, &model) {
                    check(&t, &model, delivered)?;
                }
                match events.get(i) {
                    Some(Event::Write(f, c)) => model.write(*f, *c),
                    Some(Event::Deliver) if delivered < model.writes.len() => {
                        let (f, c) = model.writes[delivered];
                        t.apply(&[(key(f), c)], false);
                        delivered += 1;
                    }
                    _ => {}
                }
            }
            while delivered < model.writes.len() {
                let (f, c) = model.writes[delivered];
                t.apply(&[(key(f), c)], false);
                delivered += 1;
                check(&t, &model, delivered)?;
            }
            if filter_only && !held_before {
                prop_assert!(t.get(1).is_none(), "a filter-only read keeps no copy");
                let f = t.filters.load();
                let f = f.as_ref().unwrap();
                prop_assert!(f.stamp(1, t.generation()).is_some(), "usable");
                for field in model.store.keys() {
                    prop_assert!(f.may_hold(1, *field), "field {field} lost");
                }
            } else {
                let copy = t.get(1).expect("installed");
                prop_assert!(copy.dirty_since.is_none());
                prop_assert_eq!(copy.pairs().collect::<BTreeMap<_, _>>(), model.store);
            }
        }
    }

    #[test]
    fn changes_of_unknown_value_and_conflicts_send_the_bucket_to_the_store() {
        let t = tier(Duration::from_secs(3));
        install(&t, vec![(5, LATER)]);
        assert_eq!(
            t.lookup(&key(5), Instant::now()),
            Lookup::Local(Some(LATER))
        );

        // One change: applied in place, still answered locally.
        t.apply(&[(key(6), Some(LATER - 1))], false);
        assert_eq!(
            t.lookup(&key(6), Instant::now()),
            Lookup::Local(Some(LATER - 1))
        );
        assert!(t.queue.lock().queued.is_empty(), "nothing to read again");

        // Again, atomically with its write: it cannot have overtaken another write.
        t.apply(&[(key(6), Some(LATER - 2))], true);
        assert_eq!(
            t.lookup(&key(6), Instant::now()),
            Lookup::Local(Some(LATER - 2))
        );
        assert!(t.queue.lock().queued.is_empty());

        // The same field again within the window, not atomically: the two messages may be out
        // of order.
        t.apply(&[(key(6), None)], false);
        assert_eq!(t.lookup(&key(6), Instant::now()), Lookup::Remote);
        assert_eq!(
            t.lookup(&key(5), Instant::now()),
            Lookup::Remote,
            "the whole bucket"
        );
        assert!(
            t.queue.lock().queued.contains(&1),
            "queued to be read again"
        );
        let (code, _) = t.held(&key(5), Instant::now()).expect("kept for fail-open");
        assert_eq!(code, Some(LATER));

        // Read again: current again.
        t.queue.lock().queued.clear();
        install(&t, vec![(5, LATER)]);
        assert_eq!(t.lookup(&key(6), Instant::now()), Lookup::Local(None));

        // An older writer's message: which fields, not their values.
        t.changed_unknown(&[key(7)]);
        assert_eq!(t.lookup(&key(5), Instant::now()), Lookup::Remote);
        // A read in flight when it arrives installs its result dirty.
        t.queue.lock().queued.clear();
        let read = t.begin_read(&[1], HashSet::new());
        t.changed_unknown(&[key(7)]);
        t.finish_read(read, Ok(vec![vec![(5, LATER)]])).unwrap();
        assert_eq!(t.lookup(&key(5), Instant::now()), Lookup::Remote);
        assert!(t.queue.lock().queued.contains(&1));
    }

    #[test]
    fn a_copy_wanted_while_its_filter_is_read_is_kept_by_that_read() {
        let t = filtered_tier(Duration::from_secs(3));
        // The sweep reads bucket 1 for its filter; meanwhile it turns hot and is read for a
        // copy, which finds that read in flight and is skipped.
        let sweep = t.begin_read(&[1], HashSet::from([1]));
        let hot = t.begin_read(&[1], HashSet::new());
        assert!(hot.buckets.is_empty(), "already being read");
        t.finish_read(sweep, Ok(vec![vec![(5, LATER)]])).unwrap();
        assert!(t.get(1).is_some(), "the filter's read keeps the copy");
        assert_eq!(
            t.lookup(&key(5), Instant::now()),
            Lookup::Local(Some(LATER))
        );

        // Another filter-only read in flight changes nothing of that.
        t.copies.as_ref().unwrap().invalidate_all();
        let sweep = t.begin_read(&[1], HashSet::from([1]));
        assert!(t.begin_read(&[1], HashSet::from([1])).buckets.is_empty());
        t.finish_read(sweep, Ok(vec![vec![(5, LATER)]])).unwrap();
        assert!(t.get(1).is_none(), "no copy wanted, none kept");
    }
}
