//! What `InvalidationBus` gives: the stream of invalidations, where the change log stands
//! (`LogMark`), what it says happened between two marks (`Replay`), and a subscription's
//! proofs of delivery (`Liveness`).

use std::time::{Duration, Instant};

use futures::stream::BoxStream;

use crate::store::layout::Invalidation;

/// A stream of invalidations. It ends when the subscription broke: whatever was cached may
/// since have changed unseen.
pub type InvalidationStream = BoxStream<'static, Invalidation>;

/// Where the change log stood when an instance looked (`InvalidationBus::log_mark`): per audit
/// part (the trail is the change log, `layout`, *The change log*), how many records were ever
/// added to it and the id of the newest. Both come from one `XINFO STREAM`, so they agree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogMark {
    pub parts: Vec<PartMark>,
    /// The `run_id` of every Redis node holding parts (sorted): a node restarted or failed
    /// over since may have lost writes whose messages were heard, which no part's count
    /// shows, so the log alone cannot say what changed.
    pub nodes: Vec<String>,
}

/// One audit part's place in a [`LogMark`]: `added` is the stream's `entries-added` (never
/// goes down while the stream lives), `last` its last generated id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartMark {
    pub added: u64,
    pub last: (u64, u64),
}

/// One change a record of the change log tells: an entry's field in its bucket, and its new
/// code (`None`: deleted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoggedChange {
    pub bucket: u32,
    pub field: i64,
    pub code: Option<u32>,
}

/// What the change log says happened between two [`LogMark`]s (`InvalidationBus::log_read`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replay {
    /// Every record added between the marks, as the changes they tell (in order within each
    /// part).
    Changes(Vec<LoggedChange>),
    /// What happened cannot be known from the log: why (a part trimmed past the mark, a
    /// part gone or behind it, a node restarted, a record that names no bucket such as an
    /// import's, more records than a replay reads, or a bus without a log).
    Gap(String),
}

/// How a subscription proves that it still delivers: the bus pings it, and each answered ping
/// proves that every message published (to the node it listens on) before the ping was sent
/// has been delivered to the stream. The ping's send time is left here for the listener,
/// which passes it on only after the messages already in the stream: so a proof never runs
/// ahead of what was applied. A connection that silently stops delivering (a node stopped,
/// half-open) is thus noticed in `PROOF_EVERY`, not at the ping's timeout.
#[derive(Debug, Default)]
pub struct Liveness {
    proven: std::sync::Mutex<Option<Instant>>,
    pub notify: tokio::sync::Notify,
}

impl Liveness {
    /// How often a bus that can prove delivery pings its subscription.
    pub const PROOF_EVERY: Duration = Duration::from_millis(25);

    /// A ping sent at `sent` was answered.
    pub fn proved(&self, sent: Instant) {
        let mut p = self.proven.lock().expect("liveness lock");
        if p.is_none_or(|t| t < sent) {
            *p = Some(sent);
        }
        drop(p);
        self.notify.notify_one();
    }

    /// The latest proof, taken.
    pub fn take(&self) -> Option<Instant> {
        self.proven.lock().expect("liveness lock").take()
    }
}
