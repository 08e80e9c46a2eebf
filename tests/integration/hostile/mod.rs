//! Hostile callers, on the real application and a real `redis-server`:
//!
//! - a corpus of malformed and hostile bodies (truncated JSON, huge numbers, deep nesting,
//!   invalid UTF-8, wrong types, oversize strings and arrays, duplicate keys, trailing garbage,
//!   lying framing...) sent to every endpoint that takes a body. Every answer must be the exact
//!   status decided for the case (4xx for a caller's mistake, never a 5xx), errors in the
//!   API.md shape, within a few seconds, and a rejected request must leave the Redis dataset
//!   (`DEBUG DIGEST`) unchanged. The corpus runs against the `namelist` binary in a child
//!   process, so that a case that crashes the service (a stack overflow aborts the process) is
//!   reported as that case's failure and the run goes on with a fresh server (`bodies`);
//! - Unicode in identifiers: rejected or accepted, and then matched, consistently (`unicode`);
//! - network-slow clients (slowloris: headers or bodies dripped a byte at a time, idle
//!   connections, a client that never reads its responses) while normal traffic must still be
//!   served, exactly (how fast it is then: `cargo bench --bench slow_clients`) (`slow`);
//! - acknowledged writes under hostile traffic and dropped Redis connections
//!   (`CLIENT KILL TYPE normal`): every write answered 200 is there afterwards (`writes`).
//!
//! `client` is the raw HTTP/1.1 client they share. The tests of this module run one at a time
//! (they time the server's cut-off of slow clients on a small machine).

mod bodies;
mod client;
mod slow;
mod unicode;
mod writes;

use std::time::Duration;

/// One test of this module at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Every corpus answer must come within this.
const CASE_TIMEOUT: Duration = Duration::from_secs(5);
/// The default body limit (`max_body_bytes`).
const LIMIT: usize = 8 * 1024 * 1024;

fn deep_array(depth: usize) -> Vec<u8> {
    let mut v = "[".repeat(depth).into_bytes();
    v.extend("]".repeat(depth).bytes());
    v
}
