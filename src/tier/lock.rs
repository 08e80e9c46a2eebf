//! The tier's mutexes, each with its rank in the lock order (`tier`'s module docs): a lock may
//! be taken only while every lock the thread already holds ranks lower. Debug builds check it
//! on every `lock` (a thread-local stack of the ranks held, and a `debug_assert!`); release
//! builds keep nothing but the rank.
//!
//! Std mutexes, not Tokio's: no lock is held across an `.await` (the worker's future is
//! `Send`, a guard is not), and every critical section is a few map operations.

use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard};

/// A lock's place in the order: lower ranks are taken first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rank {
    /// Trust and generations (`trust`).
    Sync,
    /// Changes heard lately and own writes (`recent`).
    Recent,
    /// A stripe of reads in flight (`coherence`): several are taken in ascending order only.
    Stripe(u16),
    /// The worker's queue (`worker`).
    Queue,
    /// Hot buckets read lately (`modes`).
    HotReads,
    /// The sweep's progress (`sweep`).
    Sweep,
}

impl Rank {
    /// Its place in the order (read only by the debug builds' check).
    #[cfg_attr(not(debug_assertions), allow(dead_code))]
    fn value(self) -> u32 {
        match self {
            Rank::Sync => 10,
            Rank::Recent => 20,
            Rank::Stripe(i) => 100 + u32::from(i),
            Rank::Queue => 1_000,
            Rank::HotReads => 1_010,
            Rank::Sweep => 1_020,
        }
    }

    /// What a poisoned lock panics with.
    fn name(self) -> &'static str {
        match self {
            Rank::Sync => "sync lock",
            Rank::Recent => "recent lock",
            Rank::Stripe(_) => "stripe lock",
            Rank::Queue => "queue lock",
            Rank::HotReads => "hot lock",
            Rank::Sweep => "sweep lock",
        }
    }
}

#[cfg(debug_assertions)]
thread_local! {
    /// The ranks of the tier's locks this thread holds, in the order taken.
    static HELD: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A mutex with a rank.
pub(super) struct Ranked<T> {
    rank: Rank,
    inner: Mutex<T>,
}

impl<T> Ranked<T> {
    pub(super) fn new(rank: Rank, value: T) -> Self {
        Self {
            rank,
            inner: Mutex::new(value),
        }
    }

    /// Locks it; panics if it is poisoned, and (debug builds) if the thread holds a lock of
    /// this rank or a higher one: the order is broken.
    pub(super) fn lock(&self) -> Guard<'_, T> {
        #[cfg(debug_assertions)]
        {
            let rank = self.rank.value();
            let highest = HELD.with_borrow(|held| held.iter().copied().max());
            debug_assert!(
                highest.is_none_or(|h| h < rank),
                "lock order: {:?} taken while holding rank {highest:?} (see the tier's module docs)",
                self.rank
            );
            HELD.with_borrow_mut(|held| held.push(rank));
        }
        Guard {
            inner: self
                .inner
                .lock()
                .unwrap_or_else(|e| panic!("{}: {e:?}", self.rank.name())),
            #[cfg(debug_assertions)]
            rank: self.rank.value(),
        }
    }
}

/// A held lock; forgets its rank when dropped.
pub(super) struct Guard<'a, T> {
    inner: MutexGuard<'a, T>,
    #[cfg(debug_assertions)]
    rank: u32,
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}

#[cfg(debug_assertions)]
impl<T> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        // Guards may be dropped in any order (a `Vec` of stripe guards drops the first first).
        let _ = HELD.try_with(|held| {
            let mut held = held.borrow_mut();
            if let Some(i) = held.iter().rposition(|r| *r == self.rank) {
                held.remove(i);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_taken_in_rank_order_nest() {
        let (sync, stripes, queue) = (
            Ranked::new(Rank::Sync, ()),
            [
                Ranked::new(Rank::Stripe(0), ()),
                Ranked::new(Rank::Stripe(1), ()),
            ],
            Ranked::new(Rank::Queue, ()),
        );
        let _s = sync.lock();
        let all: Vec<_> = stripes.iter().map(Ranked::lock).collect();
        let q = queue.lock();
        // Dropped out of order (the first stripe first): what is still held is what counts.
        drop(all);
        drop(q);
        let _again = stripes[0].lock();
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "lock order")]
    fn a_lock_taken_under_a_higher_rank_panics_in_debug_builds() {
        let (recent, queue) = (Ranked::new(Rank::Recent, ()), Ranked::new(Rank::Queue, ()));
        let _q = queue.lock();
        let _r = recent.lock();
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "lock order")]
    fn stripes_taken_in_descending_order_panic_in_debug_builds() {
        let stripes = [
            Ranked::new(Rank::Stripe(0), ()),
            Ranked::new(Rank::Stripe(1), ()),
        ];
        let _b = stripes[1].lock();
        let _a = stripes[0].lock();
    }
}
