//! Why a store call failed (`StoreError`, and `Refusal` for a write refused before anything
//! was sent), what a caller is told of a lost keyspace, and whether the keyspace is still
//! there (`KeyspaceHealth`).

use std::time::Duration;

/// Why a store call failed. Every variant is the service's (or its store's) problem, never
/// the caller's: the HTTP layer answers 503.
///
/// A failure that came from a lower-level error (Redis, I/O, decoding) keeps it as its
/// `source()`, so a log that walks the chain sees the original; the message is the same
/// either way.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("store unavailable: {message}")]
    Unavailable {
        message: String,
        #[source]
        source: Option<SourceError>,
    },
    #[error("store call timed out after {0:?}")]
    Timeout(Duration),
    #[error("unexpected data in the store: {message}")]
    Corrupt {
        message: String,
        #[source]
        source: Option<SourceError>,
    },
    #[error("keyspace: {0}")]
    Keyspace(String),
    /// The keyspace this store was opened with is gone from the store (restarted empty,
    /// flushed, failed over to an empty node) or replaced by another: nothing read from the
    /// store now is its state, and nothing written is kept (`KeyspaceHealth`).
    #[error("keyspace lost: {0}")]
    Lost(String),
    /// A write refused before anything was sent: nothing was written.
    #[error("write refused, nothing written: {0}")]
    Refused(Refusal),
}

/// Whether a call Redis failed with `e` may succeed if made again: not after an error reply
/// that would come again (`NOPERM`, a plain `ERR`: `OOM`, `WRONGTYPE`); after anything else
/// (no answer, a connection lost, `LOADING`, `READONLY`, `TRYAGAIN`, a redirection) it may.
pub(crate) fn redis_error_may_pass_again(e: &redis::RedisError) -> bool {
    !matches!(
        e.kind(),
        redis::ErrorKind::Server(
            redis::ServerErrorKind::NoPerm | redis::ServerErrorKind::ResponseError
        )
    )
}

/// The lower-level error a `StoreError` came from; shared so that `StoreError` stays `Clone`
/// (one failed call may be answered to several waiters). To downcast it, take it from the
/// variant (`source.downcast_ref::<RedisError>()`): `Error::source` hands out the `Arc`.
pub type SourceError = std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>;

impl StoreError {
    /// Whether the same call may succeed if made again: the store did not answer (or not in
    /// time), or refused a write for now (replicas behind, a primary being replaced, every
    /// connection busy). Not: a lost or another keyspace, data that is not what it should
    /// be, or a Redis error reply that would come again (`NOPERM`, a plain `ERR`: `OOM`,
    /// `WRONGTYPE`). Callers that try again (the import) give up at once on these.
    pub fn may_pass_again(&self) -> bool {
        match self {
            StoreError::Timeout(_) => true,
            StoreError::Refused(r) => !matches!(r, Refusal::KeyspaceLost),
            StoreError::Unavailable { source, .. } => source
                .as_deref()
                .and_then(|s| s.downcast_ref::<redis::RedisError>())
                .is_none_or(redis_error_may_pass_again),
            StoreError::Corrupt { .. } | StoreError::Keyspace(_) | StoreError::Lost(_) => false,
        }
    }

    /// The store did not answer, or answered with an error; `message` says what was tried.
    pub fn unavailable(message: String) -> Self {
        StoreError::Unavailable {
            message,
            source: None,
        }
    }

    /// As `unavailable`, keeping the error it came from; the message is that error's.
    pub fn unavailable_from(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        StoreError::Unavailable {
            message: source.to_string(),
            source: Some(std::sync::Arc::new(source)),
        }
    }

    /// The store answered with something this version cannot read.
    pub fn corrupt(message: String) -> Self {
        StoreError::Corrupt {
            message,
            source: None,
        }
    }

    /// As `corrupt`, keeping the error it came from; the message is that error's.
    pub fn corrupt_from(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        StoreError::Corrupt {
            message: source.to_string(),
            source: Some(std::sync::Arc::new(source)),
        }
    }
}

/// `answers` to a batch read of `asked` keys (`what`: `fields`, `buckets`) if there is one
/// for each, else `Corrupt`: the answers are matched to the keys by position.
pub fn one_each<T>(what: &str, asked: usize, answers: Vec<T>) -> StoreResult<Vec<T>> {
    if answers.len() != asked {
        return Err(StoreError::corrupt(format!(
            "asked for {asked} {what}, got {}",
            answers.len()
        )));
    }
    Ok(answers)
}

/// Which guarantee a write could not be given, found before anything was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The primary answers but has fewer online replicas than writes must wait for.
    #[error(
        "primary {primary} (slots {slots}) has {online} online replica(s); writes need {needed}"
    )]
    Replicas {
        primary: String,
        slots: String,
        needed: u32,
        online: u32,
    },
    /// The primary does not answer (down, cut off, or not yet replaced by its replica).
    #[error("primary {primary} (slots {slots}) is unreachable: {why}")]
    Unreachable {
        primary: String,
        slots: String,
        why: String,
    },
    /// Too little of the caller's deadline is left to send the write and wait for replicas.
    #[error("only {left:?} of the deadline left")]
    NoTime { left: Duration },
    /// Every write connection stayed busy (waiting for replicas) until the deadline.
    #[error("all {connections} write connections stayed busy until the deadline")]
    Busy { connections: usize },
    /// The keyspace is lost (`KeyspaceHealth::Lost`): nothing is written until it is back.
    #[error("the keyspace is lost")]
    KeyspaceLost,
}

impl Refusal {
    /// The `reason` label of `namelist_write_refusals_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Refusal::Replicas { .. } => "replicas",
            Refusal::Unreachable { .. } => "unreachable",
            Refusal::NoTime { .. } => "deadline",
            Refusal::Busy { .. } => "busy",
            Refusal::KeyspaceLost => "keyspace_lost",
        }
    }

    /// What the HTTP caller is told: the guarantee, by slot range (node addresses stay in
    /// the log).
    pub fn public_message(&self) -> String {
        match self {
            Refusal::Replicas {
                slots,
                needed,
                online,
                ..
            } => format!(
                "writes wait for {needed} replica(s) of every primary they touch, and the primary of slots {slots} has {online} online; nothing was written, retry later"
            ),
            Refusal::Unreachable { slots, .. } => format!(
                "the primary of slots {slots} is unreachable; nothing was written, retry later"
            ),
            Refusal::NoTime { .. } => {
                "too little of the write deadline was left to write and wait for replicas; nothing was written, retry later".to_owned()
            }
            Refusal::Busy { .. } => {
                "every write connection was busy waiting for replicas until the deadline; nothing was written, retry later".to_owned()
            }
            Refusal::KeyspaceLost => LOST_MESSAGE.to_owned(),
        }
    }
}

/// What a caller is told of a lost keyspace (the cause goes to the log).
pub const LOST_MESSAGE: &str = "the keyspace this service was opened with is gone from Redis \
    (restarted empty, flushed, or replaced): nothing is written until it is restored; checks \
    are answered from this instance's copies per fail_mode";

/// Whether the store still holds the keyspace it was opened with (`StoreBase::keyspace`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyspaceHealth {
    /// Its keyspace id is where it was.
    Present,
    /// The id is missing or another one: since `since_ms` (Unix ms), for `why`.
    Lost { since_ms: i64, why: String },
}

pub type StoreResult<T> = Result<T, StoreError>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn a_store_error_keeps_its_source_and_its_message() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let e = StoreError::unavailable_from(io);
        assert_eq!(e.to_string(), "store unavailable: reset by peer");
        let source = e.source().expect("the I/O error is kept");
        assert_eq!(source.to_string(), "reset by peer");
        // Through the variant, the original error itself (not only its text).
        let StoreError::Unavailable {
            source: Some(kept), ..
        } = &e
        else {
            panic!("{e:?}")
        };
        assert_eq!(
            kept.downcast_ref::<std::io::Error>().map(|e| e.kind()),
            Some(std::io::ErrorKind::ConnectionReset)
        );

        let plain = StoreError::corrupt("bucket value 7 is not a code".into());
        assert_eq!(
            plain.to_string(),
            "unexpected data in the store: bucket value 7 is not a code"
        );
        assert!(plain.source().is_none());
    }
}
