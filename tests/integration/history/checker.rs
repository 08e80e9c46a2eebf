//! The checker: every check answer of a history against the contract below, as plain
//! functions of the history (no I/O), so that hand-written histories test it (`tests` below).
//!
//! # The contract
//!
//! Values are (list `black`, dimension `uid`, sandbox `default`) entries; each write upserts
//! or deletes some values; each check asks about some values. Times are the caller's: a write
//! is *acknowledged at* the moment its 200 arrived; a check *began* when it was sent and
//! *ended* when its answer arrived.
//!
//! * **Write outcomes.** 200: acknowledged. 503 `keyspace_lost`, `replicas_unavailable`,
//!   `overloaded` (refused before anything was sent to the store), or a 4xx: not written,
//!   as if never sent. A timeout, a connection error, 503 `store_unavailable` or another
//!   5xx: *unknown*: it may or may not have landed, at any time after it began, but before
//!   any write that began after it ended ("later writes still order").
//! * **The state at t**, as seen by instance I: the writes *it must reflect* are those
//!   acknowledged by I (the same process: a restarted instance is another) before t, and
//!   those acknowledged by any instance before t − 100 ms (the invalidation bound). A lookup
//!   answer *agrees with the state at t* if some write w of that value, acknowledged or of
//!   unknown outcome, that began before the check ended, could be the last one applied: its
//!   kind matches the answer (upsert: a hit, delete: not a hit) and no write that must be
//!   reflected began after w ended. "Not a hit" also agrees when nothing must be reflected
//!   (the value's initial state: not listed). No write here carries an expiry, so an upsert
//!   is never expired.
//! * **Non-degraded answers** (`degraded: false`): every lookup agrees with the state at the
//!   moment the check began.
//! * **Degraded answers** with `stale_ms = s`: every lookup agrees with the state at some
//!   t ≥ check start − s − 5 ms (the slack covers `stale_ms` being whole milliseconds
//!   measured after the request arrived); the earliest such t is the most lenient, since the
//!   writes to reflect only grow with t. `stale_ms: null`, or a value listed in the answer's
//!   `unanswered` (`[{"dimension": "uid", "index": i}]`, index within the check's uids):
//!   no claim for that lookup.
//! * **No phantom hits**: no answer, degraded or not, reports a hit for a value that no
//!   upsert (acknowledged or of unknown outcome) began to write before the check ended, nor
//!   a hit for a value the check did not ask about.
//! * **Checks may be refused**: a 503, a timeout or a connection error claims nothing. Any
//!   other status than 200 or 503 (to a check or a write), a 503 to a write with a code not
//!   listed above, or a 200 that is not an answer breaks the contract.
//! * **A keyspace lost** (Redis restarted empty, flushed, failed over to an empty node) is
//!   not a write: nothing in the history deletes what was listed before it, so the state
//!   checks must reflect is still the pre-loss one. The fixed service refuses writes
//!   (`keyspace_lost`, not written) and answers checks degraded from what it holds, which
//!   agrees with that state within `stale_ms`; a non-degraded answer that misses a value
//!   listed before the loss breaks the first rule above. A write that began after the loss
//!   (once Redis was back, empty) and was acknowledged breaks the contract too: nothing in a
//!   run restores the keyspace, so the service had to refuse it.
//!   On a cluster a shard may lose its part alone (`lost_slots`): the same holds for the
//!   values whose buckets were there, while writes of the others may still be acknowledged
//!   until the instance has seen the loss.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;

use super::model::{
    History, Instance, Micros, Op, Outcome, Reply, Request, Staleness, WriteKind, abridge, rel,
};
use super::schedule::slot_of;

/// How long an acknowledged write may take to reach the other instances (pub/sub).
pub const INVALIDATION_BOUND: Micros = 100_000;
/// Added to `stale_ms`: it is whole milliseconds, measured once the request arrived.
pub const STALE_SLACK: Micros = 5_000;
/// How far back before a check its report lists faults at least, and at most (`render`).
const FAULTS_SHOWN: Micros = 3_000_000;
const FAULTS_MAX: Micros = 10_000_000;

/// Which rule an answer broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rule {
    /// A non-degraded answer that does not agree with the state when the check began.
    Fresh,
    /// A degraded answer that agrees with no state within its `stale_ms`.
    Stale,
    /// A hit for a value never upserted before the check ended, or not asked about.
    Phantom,
    /// A write acknowledged into a lost keyspace.
    Lost,
    /// A status or body outside the contract.
    Protocol,
}

impl Rule {
    pub fn describe(self) -> &'static str {
        match self {
            Rule::Fresh => "a non-degraded answer missed a write it had to reflect",
            Rule::Stale => "a degraded answer is older than its stale_ms says",
            Rule::Phantom => "a hit for a value that was never upserted",
            Rule::Lost => "a write acknowledged after the keyspace was lost",
            Rule::Protocol => "a status or body outside the contract",
        }
    }
}

/// One broken rule: the operation, the value, and the smallest piece of history that shows
/// it (the writes the answer had to reflect, the latest of them only, and the writes of the
/// value it might have seen instead).
#[derive(Debug, Clone)]
pub struct Violation {
    pub rule: Rule,
    /// The check (or, for `Protocol`, the write) in `History::ops`.
    pub op: usize,
    pub value: Option<String>,
    /// The time whose state the answer had to agree with (`Fresh`, `Stale`).
    pub horizon: Option<Micros>,
    /// The latest writes the answer had to reflect (none followed by another of them).
    pub must: Vec<usize>,
    /// The other writes of the value that began before the check ended and did not end
    /// before the first of `must` began: what the answer might have seen instead.
    pub others: Vec<usize>,
    pub why: String,
}

impl Violation {
    /// Operations in its piece of history.
    pub fn size(&self) -> usize {
        1 + self.must.len() + self.others.len()
    }
}

/// The writes of each value that may have happened (acknowledged or unknown), as indexes
/// into `History::ops`, by start.
fn writes_by_value(h: &History) -> HashMap<&str, Vec<usize>> {
    let mut by: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, op) in h.ops.iter().enumerate() {
        if let Some(w) = op.write()
            && w.outcome != Outcome::NotWritten
        {
            for v in &w.values {
                by.entry(v.as_str()).or_default().push(i);
            }
        }
    }
    for list in by.values_mut() {
        list.sort_by_key(|&i| h.ops[i].start);
    }
    by
}

/// The writes instance `seen_by` must reflect in the state at `t`.
fn must_reflect(h: &History, writes: &[usize], seen_by: Instance, t: Micros) -> Vec<usize> {
    writes
        .iter()
        .copied()
        .filter(|&i| {
            let op = &h.ops[i];
            op.write().is_some_and(|w| w.outcome == Outcome::Ok)
                && ((op.instance == seen_by && op.end < t)
                    || op.end.saturating_add(INVALIDATION_BOUND) < t)
        })
        .collect()
}

/// Whether answering `hit` agrees with the state at `t` seen by `seen_by`, for a check that
/// ended at `check_end`; `writes` are the value's.
pub fn agrees(
    h: &History,
    writes: &[usize],
    hit: bool,
    seen_by: Instance,
    t: Micros,
    check_end: Micros,
) -> bool {
    let must = must_reflect(h, writes, seen_by, t);
    if !hit && must.is_empty() {
        return true; // the initial state: not listed
    }
    let want = if hit {
        WriteKind::Upsert
    } else {
        WriteKind::Delete
    };
    writes.iter().any(|&w| {
        let op = &h.ops[w];
        op.start < check_end
            && op.write().is_some_and(|x| x.kind == want)
            && !must.iter().any(|&m| op.end < h.ops[m].start)
    })
}

/// Every broken rule of the history, by operation.
pub fn check(h: &History) -> Vec<Violation> {
    let by_value = writes_by_value(h);
    let none: Vec<usize> = Vec::new();
    let mut out = Vec::new();
    for (i, op) in h.ops.iter().enumerate() {
        let check = match &op.request {
            Request::Check(c) => c,
            Request::Write(w) => {
                if !write_status_allowed(&w.detail) {
                    out.push(protocol(i, format!("a write answered {}", w.detail)));
                }
                let lost = h.faults.iter().find(|f| {
                    f.end < op.start
                        && (f.loses_keyspace
                            || (!f.lost_slots.is_empty()
                                && w.values.iter().any(|v| f.lost_slots.contains(&slot_of(v)))))
                });
                if let (Outcome::Ok, Some(f)) = (w.outcome, lost) {
                    out.push(Violation {
                        rule: Rule::Lost,
                        value: Some(abridge(&w.values)),
                        ..protocol(
                            i,
                            format!(
                                "acknowledged, {} after the keyspace was lost ({}), which nothing \
                                 restored: it had to be refused with keyspace_lost",
                                rel(op.end, f.end),
                                f.what
                            ),
                        )
                    });
                }
                continue;
            }
        };
        let answer = match &check.reply {
            Reply::Answer(a) => a,
            Reply::NoClaim(_) => continue,
            Reply::Unexpected(why) => {
                out.push(protocol(i, format!("a check answered {why}")));
                continue;
            }
        };
        let asked: BTreeSet<&str> = check.values.iter().map(String::as_str).collect();
        for hit in answer.hits.iter().filter(|v| !asked.contains(v.as_str())) {
            out.push(Violation {
                value: Some(hit.clone()),
                rule: Rule::Phantom,
                ..protocol(
                    i,
                    format!("a hit for {hit}, which the check did not ask about"),
                )
            });
        }
        for &value in &asked {
            let writes = by_value.get(value).unwrap_or(&none);
            let hit = answer.hits.contains(value);
            let upserted = writes.iter().any(|&w| {
                h.ops[w].start < op.end
                    && h.ops[w]
                        .write()
                        .is_some_and(|x| x.kind == WriteKind::Upsert)
            });
            if hit && !upserted {
                out.push(piece(
                    h,
                    i,
                    value,
                    writes,
                    Rule::Phantom,
                    None,
                    String::new(),
                ));
                continue;
            }
            if answer.unanswered.contains(value) {
                continue;
            }
            let (rule, t) = match answer.staleness {
                Staleness::Fresh => (Rule::Fresh, op.start),
                Staleness::Stale(s) => (
                    Rule::Stale,
                    op.start.saturating_sub(s * 1_000 + STALE_SLACK),
                ),
                Staleness::Unbounded => continue,
            };
            if !agrees(h, writes, hit, op.instance, t, op.end) {
                let answered = if hit { "a hit" } else { "not a hit" };
                let why = format!(
                    "{answered}, but the state at {} (check start {}) says otherwise",
                    rel(t, op.start),
                    rel(op.start, 0)
                );
                out.push(piece(h, i, value, writes, rule, Some(t), why));
            }
        }
    }
    out
}

/// The codes a write's 503 may carry.
const WRITE_503: [&str; 4] = [
    "keyspace_lost",
    "store_unavailable",
    "replicas_unavailable",
    "overloaded",
];

/// Whether a write's `detail` (`"200"`, `"503 code"`, or a transport error, which is not the
/// service's answer) is one the contract allows.
fn write_status_allowed(detail: &str) -> bool {
    match detail.split_once(' ').unwrap_or((detail, "")) {
        ("200", _) => true,
        ("503", code) => WRITE_503.contains(&code),
        (status, _) => !status.starts_with(|c: char| c.is_ascii_digit()),
    }
}

fn protocol(op: usize, why: String) -> Violation {
    Violation {
        rule: Rule::Protocol,
        op,
        value: None,
        horizon: None,
        must: Vec::new(),
        others: Vec::new(),
        why,
    }
}

/// The violation with its smallest piece of history: the latest writes it had to reflect
/// (those no other of them followed), and the writes it might have seen instead.
fn piece(
    h: &History,
    check: usize,
    value: &str,
    writes: &[usize],
    rule: Rule,
    horizon: Option<Micros>,
    why: String,
) -> Violation {
    let c = &h.ops[check];
    let must_all = horizon
        .map(|t| must_reflect(h, writes, c.instance, t))
        .unwrap_or_default();
    let must: Vec<usize> = must_all
        .iter()
        .copied()
        .filter(|&m| !must_all.iter().any(|&n| h.ops[m].end < h.ops[n].start))
        .collect();
    let from = must.iter().map(|&m| h.ops[m].start).min();
    let others: Vec<usize> = writes
        .iter()
        .copied()
        .filter(|&w| {
            !must.contains(&w) && h.ops[w].start < c.end && from.is_none_or(|f| h.ops[w].end >= f)
        })
        .collect();
    let why = if why.is_empty() {
        "a hit, but no upsert of it began before the check ended".to_owned()
    } else {
        why
    };
    Violation {
        rule,
        op: check,
        value: Some(value.to_owned()),
        horizon,
        must,
        others,
        why,
    }
}

/// The violation's piece of history as a timeline, every time relative to the check, with
/// the faults from the piece's first operation on (and the second before it).
pub fn render(h: &History, v: &Violation) -> String {
    let c = &h.ops[v.op];
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:?}: {} ({})",
        v.rule,
        v.rule.describe(),
        v.value.as_deref().unwrap_or("-")
    );
    let _ = writeln!(s, "  {}", v.why);
    if let Some(t) = v.horizon {
        let _ = writeln!(
            s,
            "  horizon {} (writes acknowledged by {} before it, by others before {}, must show)",
            rel(t, c.start),
            c.instance,
            rel(t.saturating_sub(INVALIDATION_BOUND), c.start)
        );
    }
    let mut lines: Vec<(Micros, String)> = Vec::new();
    let mut op_line = |i: usize, tag: &str| {
        let op: &Op = &h.ops[i];
        lines.push((
            op.start,
            format!(
                "  {tag:<6} #{i:<5} {} .. {}  {op}",
                rel(op.start, c.start),
                rel(op.end, c.start)
            ),
        ));
    };
    op_line(
        v.op,
        if v.rule == Rule::Lost {
            "WRITE"
        } else {
            "CHECK"
        },
    );
    for &m in &v.must {
        op_line(m, "must");
    }
    for &o in &v.others {
        op_line(o, "maybe");
    }
    // The faults of the FAULTS_SHOWN before the check, or since the piece's latest write
    // began if that was earlier, but never more than FAULTS_MAX back: a bulk write at the
    // start of a run would bring every fault along.
    let latest = v
        .must
        .iter()
        .chain(&v.others)
        .map(|&i| h.ops[i].start)
        .max()
        .unwrap_or(c.start);
    let from = latest
        .min(c.start.saturating_sub(FAULTS_SHOWN))
        .max(c.start.saturating_sub(FAULTS_MAX));
    let hidden = h.faults.iter().filter(|f| f.end < from).count();
    if hidden > 0 {
        let _ = writeln!(s, "  ({hidden} earlier fault(s) not shown)");
    }
    for f in &h.faults {
        if f.end >= from && f.start <= c.end {
            lines.push((
                f.start,
                format!(
                    "  fault         {} .. {}  {}",
                    rel(f.start, c.start),
                    rel(f.end, c.start),
                    f.what
                ),
            ));
        }
    }
    lines.sort_by_key(|l| l.0);
    for (_, l) in lines {
        let _ = writeln!(s, "{l}");
    }
    s
}

#[cfg(test)]
mod tests {
    //! Hand-written histories that break, or keep, each rule.

    use super::*;
    use crate::history::model::{Answer, Check, FaultEvent, Sender, Write};

    const MS: Micros = 1_000;
    const A: Instance = Instance {
        slot: 0,
        incarnation: 0,
    };
    const B: Instance = Instance {
        slot: 1,
        incarnation: 0,
    };

    fn write(
        kind: WriteKind,
        at: Instance,
        start: Micros,
        end: Micros,
        outcome: Outcome,
        v: &str,
    ) -> Op {
        let detail = match outcome {
            Outcome::Ok => "200",
            Outcome::NotWritten => "503 replicas_unavailable",
            Outcome::Unknown => "503 store_unavailable",
        };
        Op {
            sender: Sender::Client(0),
            instance: at,
            start: start * MS,
            end: end * MS,
            request: Request::Write(Write {
                kind,
                values: vec![v.to_owned()],
                outcome,
                detail: detail.to_owned(),
            }),
        }
    }

    fn upsert(at: Instance, start: Micros, end: Micros, outcome: Outcome, v: &str) -> Op {
        write(WriteKind::Upsert, at, start, end, outcome, v)
    }

    fn delete(at: Instance, start: Micros, end: Micros, outcome: Outcome, v: &str) -> Op {
        write(WriteKind::Delete, at, start, end, outcome, v)
    }

    fn check_op(at: Instance, start: Micros, end: Micros, values: &[&str], reply: Reply) -> Op {
        Op {
            sender: Sender::Driver,
            instance: at,
            start: start * MS,
            end: end * MS,
            request: Request::Check(Check {
                values: values.iter().map(|v| v.to_string()).collect(),
                reply,
            }),
        }
    }

    fn answer(staleness: Staleness, hits: &[&str]) -> Reply {
        Reply::Answer(Answer {
            staleness,
            hits: hits.iter().map(|v| v.to_string()).collect(),
            unanswered: BTreeSet::new(),
        })
    }

    fn rules(ops: Vec<Op>) -> Vec<Rule> {
        let h = History {
            ops,
            faults: Vec::new(),
        };
        let v = check(&h);
        for x in &v {
            eprintln!("{}", render(&h, x));
        }
        v.into_iter().map(|v| v.rule).collect()
    }

    use Outcome::{NotWritten, Ok as Acked, Unknown};
    use Staleness::{Fresh, Stale, Unbounded};

    #[test]
    fn fresh_answers_reflect_the_same_instances_writes_at_once() {
        let ops = |hits: &[&str]| {
            vec![
                upsert(A, 0, 10, Acked, "u"),
                check_op(A, 11, 12, &["u"], answer(Fresh, hits)),
            ]
        };
        assert_eq!(rules(ops(&[])), [Rule::Fresh], "its own write, 1 ms before");
        assert_eq!(rules(ops(&["u"])), [], "a hit is right");
    }

    #[test]
    fn fresh_answers_reflect_other_instances_writes_after_100ms() {
        let ops = |gap: Micros| {
            vec![
                upsert(A, 0, 10, Acked, "u"),
                check_op(B, 10 + gap, 12 + gap, &["u"], answer(Fresh, &[])),
            ]
        };
        assert_eq!(rules(ops(50)), [], "50 ms: the message may be in flight");
        assert_eq!(
            rules(ops(150)),
            [Rule::Fresh],
            "150 ms: it must have arrived"
        );
    }

    #[test]
    fn another_process_of_the_same_slot_is_another_instance() {
        let restarted = Instance {
            slot: 0,
            incarnation: 1,
        };
        let ops = vec![
            upsert(A, 0, 10, Acked, "u"),
            check_op(restarted, 20, 22, &["u"], answer(Fresh, &[])),
        ];
        assert_eq!(rules(ops), []);
    }

    #[test]
    fn the_latest_write_decides_and_concurrent_ones_may_be_seen() {
        // Upsert, then delete, both long acknowledged: not listed.
        let base = || vec![upsert(A, 0, 10, Acked, "u"), delete(B, 20, 30, Acked, "u")];
        let mut ops = base();
        ops.push(check_op(A, 500, 501, &["u"], answer(Fresh, &["u"])));
        assert_eq!(rules(ops), [Rule::Fresh], "a hit after the delete");
        let mut ops = base();
        ops.push(check_op(A, 500, 501, &["u"], answer(Fresh, &[])));
        assert_eq!(rules(ops), []);
        // An upsert in flight while the check runs may be seen, or not.
        for hits in [&[][..], &["u"][..]] {
            let mut ops = base();
            ops.push(upsert(B, 499, 520, Acked, "u"));
            ops.push(check_op(A, 500, 501, &["u"], answer(Fresh, hits)));
            assert_eq!(rules(ops), [], "hits {hits:?}");
        }
        // Two overlapping acknowledged writes: either order.
        for hits in [&[][..], &["u"][..]] {
            let ops = vec![
                upsert(A, 0, 30, Acked, "u"),
                delete(B, 10, 20, Acked, "u"),
                check_op(A, 500, 501, &["u"], answer(Fresh, hits)),
            ];
            assert_eq!(rules(ops), [], "hits {hits:?}");
        }
    }

    #[test]
    fn unknown_outcomes_allow_both_answers_until_a_later_write() {
        for hits in [&[][..], &["u"][..]] {
            let ops = vec![
                upsert(A, 0, 10, Unknown, "u"),
                check_op(A, 500, 501, &["u"], answer(Fresh, hits)),
            ];
            assert_eq!(rules(ops), [], "hits {hits:?}");
        }
        // A delete that began after the unknown upsert ended comes after it, if it landed.
        let ops = vec![
            upsert(A, 0, 10, Unknown, "u"),
            delete(A, 20, 30, Acked, "u"),
            check_op(A, 500, 501, &["u"], answer(Fresh, &["u"])),
        ];
        assert_eq!(rules(ops), [Rule::Fresh]);
        // A write refused before it was sent never happened.
        let ops = vec![
            upsert(A, 0, 10, NotWritten, "u"),
            check_op(A, 500, 501, &["u"], answer(Fresh, &["u"])),
        ];
        assert_eq!(rules(ops), [Rule::Phantom]);
    }

    #[test]
    fn stale_answers_reflect_the_state_stale_ms_before() {
        let ops = |stale: u64, hits: &[&str]| {
            vec![
                upsert(A, 0, 10, Acked, "u"),
                check_op(A, 1_000, 1_001, &["u"], answer(Stale(stale), hits)),
            ]
        };
        assert_eq!(
            rules(ops(500, &[])),
            [Rule::Stale],
            "acknowledged 990 ms before"
        );
        assert_eq!(rules(ops(500, &["u"])), []);
        assert_eq!(rules(ops(995, &[])), [], "stale_ms covers it");
        assert_eq!(rules(ops(980, &[])), [Rule::Stale], "10 ms short of it");
    }

    #[test]
    fn unbounded_and_unanswered_lookups_claim_nothing_but_never_a_phantom() {
        let ops = vec![
            upsert(A, 0, 10, Acked, "u"),
            check_op(A, 1_000, 1_001, &["u"], answer(Unbounded, &[])),
        ];
        assert_eq!(rules(ops), []);
        let unanswered = Reply::Answer(Answer {
            staleness: Stale(3),
            hits: BTreeSet::new(),
            unanswered: ["u".to_owned()].into(),
        });
        let ops = vec![
            upsert(A, 0, 10, Acked, "u"),
            check_op(A, 1_000, 1_001, &["u", "v"], unanswered),
        ];
        assert_eq!(rules(ops), []);
        let ops = vec![check_op(A, 1_000, 1_001, &["v"], answer(Unbounded, &["v"]))];
        assert_eq!(rules(ops), [Rule::Phantom]);
    }

    #[test]
    fn phantom_hits() {
        // Upserted only after the check ended.
        let ops = vec![
            check_op(A, 0, 10, &["u"], answer(Stale(100), &["u"])),
            upsert(A, 11, 20, Acked, "u"),
        ];
        assert_eq!(rules(ops), [Rule::Phantom]);
        // Of unknown outcome, begun during the check: may be a hit.
        let ops = vec![
            upsert(A, 5, 2_000, Unknown, "u"),
            check_op(B, 0, 10, &["u"], answer(Fresh, &["u"])),
        ];
        assert_eq!(rules(ops), []);
        // A hit for a value not asked about.
        let ops = vec![
            upsert(A, 0, 10, Acked, "w"),
            check_op(A, 500, 510, &["u"], answer(Fresh, &["w"])),
        ];
        assert_eq!(rules(ops), [Rule::Phantom]);
    }

    #[test]
    fn refusals_claim_nothing_and_other_statuses_break_the_contract() {
        let ops = vec![
            upsert(A, 0, 10, Acked, "u"),
            check_op(
                A,
                500,
                510,
                &["u"],
                Reply::NoClaim("503 store_unavailable".into()),
            ),
            check_op(
                A,
                600,
                610,
                &["u"],
                Reply::Unexpected("500 internal".into()),
            ),
        ];
        assert_eq!(rules(ops), [Rule::Protocol]);
        let mut bad = upsert(A, 0, 10, Unknown, "u");
        if let Request::Write(w) = &mut bad.request {
            w.detail = "500 internal".into();
        }
        let mut refused = upsert(A, 0, 10, Unknown, "u");
        if let Request::Write(w) = &mut refused.request {
            w.detail = "connection refused".into();
        }
        assert_eq!(rules(vec![bad, refused]), [Rule::Protocol]);
    }

    #[test]
    fn a_lost_keyspace_does_not_delete_what_was_listed() {
        // Row 3: listed, Redis restarted empty, then answers not degraded and empty.
        let history = |reply: Reply| History {
            ops: vec![
                upsert(A, 0, 10, Acked, "u"),
                check_op(B, 3_000, 3_002, &["u"], reply),
            ],
            faults: vec![FaultEvent {
                what: "redis restarted empty".into(),
                start: 1_000 * MS,
                end: 1_100 * MS,
                loses_keyspace: true,
                lost_slots: Vec::new(),
            }],
        };
        let broken = |h: History| check(&h).into_iter().map(|v| v.rule).collect::<Vec<_>>();
        assert_eq!(broken(history(answer(Fresh, &[]))), [Rule::Fresh]);
        // Degraded from the copy held before the loss: fine; from an empty copy that claims
        // to be recent: not.
        assert_eq!(broken(history(answer(Stale(2_000), &["u"]))), []);
        assert_eq!(broken(history(answer(Stale(1_900), &[]))), [Rule::Stale]);
        // Row 4: the first acknowledged write after the loss, then a check of it that misses.
        let ops = vec![
            upsert(A, 1_200, 1_210, Acked, "w0"),
            check_op(A, 1_211, 1_212, &["w0"], answer(Fresh, &[])),
        ];
        assert_eq!(rules(ops), [Rule::Fresh]);
    }

    #[test]
    fn a_write_acknowledged_after_the_keyspace_was_lost() {
        let loss = FaultEvent {
            what: "redis restarted empty".into(),
            start: 1_000 * MS,
            end: 1_100 * MS,
            loses_keyspace: true,
            lost_slots: Vec::new(),
        };
        let broken = |ops: Vec<Op>| {
            let h = History {
                ops,
                faults: vec![loss.clone()],
            };
            check(&h).into_iter().map(|v| v.rule).collect::<Vec<_>>()
        };
        assert_eq!(
            broken(vec![upsert(A, 1_200, 1_210, Acked, "w0")]),
            [Rule::Lost]
        );
        assert_eq!(
            broken(vec![delete(A, 1_200, 1_210, Acked, "w0")]),
            [Rule::Lost]
        );
        // Refused: right. Begun before Redis was back: it may have gone to the old one.
        assert_eq!(
            broken(vec![upsert(A, 1_200, 1_210, NotWritten, "w0")]),
            Vec::<Rule>::new()
        );
        assert_eq!(broken(vec![upsert(A, 1_050, 1_210, Acked, "w0")]), []);
        // Another fault loses nothing.
        let h = History {
            ops: vec![upsert(A, 1_200, 1_210, Acked, "w0")],
            faults: vec![FaultEvent {
                loses_keyspace: false,
                ..loss.clone()
            }],
        };
        assert!(check(&h).is_empty());
        // A shard lost (a cluster): a write of a value there breaks it, one elsewhere not.
        let h = |value: &str| History {
            ops: vec![upsert(A, 1_200, 1_210, Acked, value)],
            faults: vec![FaultEvent {
                loses_keyspace: false,
                lost_slots: vec![slot_of("w0")],
                ..loss.clone()
            }],
        };
        let elsewhere = (1..)
            .map(|i| format!("w{i}"))
            .find(|v| slot_of(v) != slot_of("w0"))
            .unwrap();
        assert_eq!(
            check(&h("w0"))
                .into_iter()
                .map(|v| v.rule)
                .collect::<Vec<_>>(),
            [Rule::Lost]
        );
        assert!(check(&h(&elsewhere)).is_empty());
    }

    #[test]
    fn the_piece_of_history_is_the_latest_writes_and_the_concurrent_ones() {
        let h = History {
            ops: vec![
                upsert(A, 0, 10, Acked, "u"),    // superseded by #1: not shown
                delete(A, 20, 30, Acked, "u"),   // superseded by #2
                upsert(B, 40, 50, Acked, "u"),   // the latest: must
                delete(A, 45, 60, Unknown, "u"), // concurrent with it: maybe
                upsert(A, 0, 10, Acked, "x"),    // another value
                check_op(A, 1_000, 1_001, &["u"], answer(Fresh, &[])),
            ],
            faults: Vec::new(),
        };
        let v = check(&h);
        assert_eq!(v.len(), 0, "the unknown delete may have landed last");
        let mut h = h;
        h.ops[3] = delete(A, 45, 60, NotWritten, "u");
        let v = check(&h);
        assert_eq!(v.len(), 1);
        assert_eq!((v[0].must.clone(), v[0].others.clone()), (vec![2], vec![]));
        assert_eq!(v[0].size(), 2, "the check and the upsert it missed");
        let text = render(&h, &v[0]);
        assert!(text.contains("must") && text.contains("#2"), "{text}");
    }
}
