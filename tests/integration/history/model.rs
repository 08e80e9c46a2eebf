//! The history: every operation the clients and the driver made, with its start and end on
//! one monotonic clock (microseconds since the run began), the instance it went to, what it
//! asked and what came back; and the faults, on the same clock. Plain data: the runner
//! (`scenario`) fills it, the checker (`checker`) reads it, and the checker's unit tests write
//! it by hand.

use std::collections::BTreeSet;
use std::fmt;

/// Microseconds since the run began (`Instant`-based: monotonic).
pub type Micros = u64;

/// One process of the service: the slot it fills (0, 1, 2...) and which start of that slot
/// (a restarted instance is another process, with another memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Instance {
    pub slot: usize,
    pub incarnation: u32,
}

impl fmt::Display for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "i{}.{}", self.slot, self.incarnation)
    }
}

/// What a write does to each of its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    Upsert,
    Delete,
}

/// What the caller learned of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// 200: acknowledged.
    Ok,
    /// Refused before anything was sent to the store (503 `keyspace_lost`,
    /// `replicas_unavailable`, `overloaded`; or a 4xx): it did not happen.
    NotWritten,
    /// A timeout, a connection error, 503 `store_unavailable`, another 5xx: it may have
    /// landed, at any time after it began and before any write that began after it ended.
    Unknown,
}

#[derive(Debug, Clone)]
pub struct Write {
    pub kind: WriteKind,
    pub values: Vec<String>,
    pub outcome: Outcome,
    /// The status and error code, or the transport error, for the report.
    pub detail: String,
}

/// How much a check answer claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Staleness {
    /// `degraded: false`.
    Fresh,
    /// `degraded: true` with `stale_ms` a number.
    Stale(u64),
    /// `degraded: true` with `stale_ms` null (or absent): no claim on any lookup.
    Unbounded,
}

/// A 200 answer to a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub staleness: Staleness,
    /// The values reported as hits.
    pub hits: BTreeSet<String>,
    /// The values listed in `unanswered`: no claim.
    pub unanswered: BTreeSet<String>,
}

#[derive(Debug, Clone)]
pub enum Reply {
    Answer(Answer),
    /// 503, a timeout or a connection error: no claim.
    NoClaim(String),
    /// A status or body the contract does not allow (a 500, a 400 to a valid check, a body
    /// that is not an answer).
    Unexpected(String),
}

#[derive(Debug, Clone)]
pub struct Check {
    pub values: Vec<String>,
    pub reply: Reply,
}

#[derive(Debug, Clone)]
pub enum Request {
    Write(Write),
    Check(Check),
}

/// Who sent an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    /// A concurrent client task.
    Client(usize),
    /// The driver: setup writes and a named schedule's own steps.
    Driver,
}

#[derive(Debug, Clone)]
pub struct Op {
    pub sender: Sender,
    pub instance: Instance,
    pub start: Micros,
    pub end: Micros,
    pub request: Request,
}

impl Op {
    pub fn write(&self) -> Option<&Write> {
        match &self.request {
            Request::Write(w) => Some(w),
            Request::Check(_) => None,
        }
    }
}

/// A fault as it was carried out (`start`: when the driver began it, `end`: when it was done).
#[derive(Debug, Clone)]
pub struct FaultEvent {
    pub what: String,
    pub start: Micros,
    pub end: Micros,
    /// Redis came back without the keyspace (restarted empty): nothing restores it in a run.
    pub loses_keyspace: bool,
    /// Cluster: the hash slots of a shard that lost its data (the rest of the keyspace kept
    /// its own): the values whose buckets are there (`schedule::slot_of`) were lost; nothing
    /// restores them in a run. Empty for every other fault.
    pub lost_slots: Vec<u16>,
}

#[derive(Debug, Clone, Default)]
pub struct History {
    pub ops: Vec<Op>,
    pub faults: Vec<FaultEvent>,
}

/// `+1.234 s` / `-12.5 ms`: a time relative to another, for the report.
pub fn rel(t: Micros, origin: Micros) -> String {
    let d = t as i64 - origin as i64;
    let sign = if d < 0 { '-' } else { '+' };
    let a = d.unsigned_abs();
    if a >= 1_000_000 {
        format!("{sign}{:.3} s", a as f64 / 1e6)
    } else {
        format!("{sign}{:.1} ms", a as f64 / 1e3)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who = match self.sender {
            Sender::Client(c) => format!("client {c}"),
            Sender::Driver => "driver".to_owned(),
        };
        match &self.request {
            Request::Write(w) => {
                let kind = match w.kind {
                    WriteKind::Upsert => "upsert",
                    WriteKind::Delete => "delete",
                };
                let values = abridge(&w.values);
                let outcome = match w.outcome {
                    Outcome::Ok => "ok",
                    Outcome::NotWritten => "not written",
                    Outcome::Unknown => "unknown",
                };
                write!(
                    f,
                    "{kind} {values} via {} ({who}) -> {} [{outcome}]",
                    self.instance, w.detail
                )
            }
            Request::Check(c) => {
                let reply = match &c.reply {
                    Reply::Answer(a) => {
                        let claim = match a.staleness {
                            Staleness::Fresh => "degraded: false".to_owned(),
                            Staleness::Stale(s) => format!("degraded: true, stale_ms: {s}"),
                            Staleness::Unbounded => "degraded: true, stale_ms: null".to_owned(),
                        };
                        let hits: Vec<String> = a.hits.iter().cloned().collect();
                        let mut s = format!("hits {}, {claim}", abridge(&hits));
                        if !a.unanswered.is_empty() {
                            let u: Vec<String> = a.unanswered.iter().cloned().collect();
                            s.push_str(&format!(", unanswered {}", abridge(&u)));
                        }
                        s
                    }
                    Reply::NoClaim(why) => format!("no claim ({why})"),
                    Reply::Unexpected(why) => format!("UNEXPECTED {why}"),
                };
                write!(
                    f,
                    "check {} via {} ({who}) -> {reply}",
                    abridge(&c.values),
                    self.instance
                )
            }
        }
    }
}

/// `[a, b, c]`, or `[a, b, ... (10000 values)]` for a bulk write.
pub fn abridge(values: &[String]) -> String {
    if values.len() <= 8 {
        format!("[{}]", values.join(", "))
    } else {
        format!(
            "[{}, ... ({} values)]",
            values[..3].join(", "),
            values.len()
        )
    }
}
