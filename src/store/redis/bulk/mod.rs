//! Typed bulk operations of the Redis store, for the operator tools (`namelist-tools`): walk
//! the keyspace's buckets (of entries, and of remembered event ids) node by node with
//! resumable cursors, read a bucket's fields a step at a time, measure a bucket, and delete
//! expired fields with compare-and-delete.
//!
//! Invariant: the tools never name a Redis command or hold Lua; they speak in [`Bucket`]s
//! and cursors, and every key these operations touch is one `Layout` names (`parse_bucket_key`
//! and `is_event_bucket` keep out keys that merely look like buckets). Each method is one
//! command (one round trip), so a tool can pace its commands one by one; none waits for
//! replicas (bulk work is housekeeping; see each tool's help for what it costs against a live
//! store).
//!
//! One module per tool's part, each adding its methods to `RedisStore`: `walk` (the walk the
//! sweep makes: nodes, `SCAN` and `HSCAN` steps, compare-and-delete), `import` (bucket writes,
//! `RESTORE` or `HSET`), `stats` (the bucket audit's probes and node facts) and `scratch` (the
//! audit's layout comparison); here, what they share: [`BulkError`] and [`glob_escape`].

mod import;
mod scratch;
mod stats;
mod walk;

pub use import::{BucketWrite, BucketWriteOutcome};
pub use scratch::ScratchValue;
pub use stats::{BucketProbe, BucketStats};
pub use walk::{Bucket, BucketScan, CasOutcome, EventBucket, FieldScan, compare_and_delete};

use super::dump::DumpError;

/// Why a bulk operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BulkError {
    #[error("{what}: {source}")]
    Redis {
        what: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("building a RESTORE payload: {0}")]
    Payload(#[from] DumpError),
    #[error("the restored probe bucket differs from its HSET twin: {0}")]
    ProbeDiffers(String),
    /// A reply of a shape the command never gives (a proxy in the way, a changed script).
    #[error("unexpected reply: {0}")]
    Reply(String),
}

impl BulkError {
    /// Whether the same write may succeed if made again (`StoreError::may_pass_again`): a
    /// Redis error that may pass; never a payload, a probe or a reply that was wrong.
    pub fn may_pass_again(&self) -> bool {
        match self {
            BulkError::Redis { source, .. } => crate::store::redis_error_may_pass_again(source),
            BulkError::Payload(_) | BulkError::ProbeDiffers(_) | BulkError::Reply(_) => false,
        }
    }
}

fn redis_err(what: impl Into<String>) -> impl FnOnce(redis::RedisError) -> BulkError {
    let what = what.into();
    move |source| BulkError::Redis { what, source }
}

/// Escapes the `SCAN MATCH` glob characters of a literal.
pub fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
