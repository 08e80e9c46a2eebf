//! A store call's deadline: when its caller stops waiting, which the store's writes honour
//! (a `WAIT` never asked to outlast it).

use std::time::Duration;

/// When the caller of a store call stops waiting. Writes take it so that nothing they ask of
/// the server outlives the request: a `WAIT` for replicas is given the time left (less a
/// margin), never more, and a write with too little time left is not sent at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    at: tokio::time::Instant,
    budget: Duration,
}

impl Deadline {
    /// `budget` from now.
    pub fn after(budget: Duration) -> Self {
        Self {
            at: tokio::time::Instant::now() + budget,
            budget,
        }
    }

    /// The instant itself, for `tokio::time::timeout_at`.
    pub fn instant(self) -> tokio::time::Instant {
        self.at
    }

    /// The whole budget it was made with (for messages).
    pub fn budget(self) -> Duration {
        self.budget
    }

    /// Time left (zero once passed).
    pub fn remaining(self) -> Duration {
        self.at
            .saturating_duration_since(tokio::time::Instant::now())
    }
}
