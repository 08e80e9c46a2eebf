//! A Jepsen-style history checker (issue 25, part 4): for a risk service the failure that
//! matters is a wrong "not listed", so instances of the real binary run under faults while
//! clients upsert, delete and check a few colliding uids; every operation is recorded with its
//! start and end, and every check answer is judged against the contract written at the top of
//! `checker.rs` (non-degraded answers reflect every write they must; degraded ones a state no
//! older than their `stale_ms`; never a hit for a value never upserted).
//!
//! * `model`: the history (plain data). `checker`: the rules, as functions of a history, with
//!   unit tests on hand-written histories.
mod checker;
mod model;
