//! The change log: how an instance that missed invalidations learns what it missed, instead
//! of reading every bucket it holds again.
//!
//! The log is the audit trail (`layout`, *Audit trail*): every upsert and delete already
//! appends one record per entry, ordered within its part and written before the write is
//! acknowledged, and each record names its entry's bucket (`bucket`). Nothing more is written
//! per write. What an instance keeps is a [`LogMark`]: per part, the stream's `entries-added`
//! (how many records were ever added, which trimming does not lower) and its last id, both
//! from one `XINFO STREAM`. To catch up from a mark, [`replay_reads`] reads each part's
//! `XINFO` again, and [`replay`] reads the records added since, `XRANGE (<mark> <now>` with a
//! count of exactly the records added in between:
//!
//! * all of them there: the buckets they name are the ones written since the mark;
//! * fewer (trimmed past the mark), a part behind its mark or gone (restored from an older
//!   copy, replaced), a record naming no bucket (an import's run record; a writer of an older
//!   build), or more records than [`REPLAY_MAX_RECORDS`]: a [`Replay::Gap`], and the caller
//!   reads everything again.
//!
//! # Why the audit trail, and not a stream of its own or `CLIENT TRACKING`
//! * A stream of its own per part would hold the same records again: one more `XADD` per
//!   entry written (~3 µs of Redis and ~20 B a record) for nothing the trail lacks. The
//!   trail's records are written before a write is acknowledged (`layout`), spread over the
//!   primaries like the buckets, and capped (`audit_max_len`, 100,000 by default): the cap is
//!   the catch-up's horizon (at 500 entries written a second, ~200 s of missed messages);
//!   past it, the gap is seen and everything is read again, paced, as before the log.
//! * `CLIENT TRACKING` (RESP3) keeps no position: invalidations lost with a connection are
//!   lost, and the client is told only to flush everything, exactly the full re-read this
//!   module avoids. Its default mode keeps a server-side table of every key each client read
//!   (at 100M entries, 500k buckets per instance, beyond the default
//!   `tracking-table-max-keys` of 1M with two instances, past which Redis invalidates keys
//!   just to shrink the table: re-reads for nothing); its broadcast mode is our pub/sub
//!   again. And it names keys, not fields and codes, so every write would cost every
//!   instance a bucket read (~9 `HGET`s of Redis CPU) where a message applied in place costs
//!   nothing. Not measured: the reasons above rule it out before its cost matters.
//!
//! Pub/sub (with its proofs of delivery) stays the fast path: a message is applied in place
//! within a millisecond or two. The log is read after a break (the catch-up), and followed
//! a few seconds behind (`invalidation::follow_log`), so that a write whose message never
//! went out (its writer died between its records and its `PUBLISH`, on a cluster) is found
//! within seconds rather than by the tier's age-driven safety net. Following costs every
//! instance every record once; the catch-up, only what it missed.

use redis::Value;

use super::{reply_text, stream_id};
use crate::store::expiry::ExpiryCode;
use crate::store::{AuditRecord, LogMark, LoggedChange, PartMark, Replay, StoreError, StoreResult};

/// Records one replay reads at most, over every part: past this, reading every bucket again
/// (paced) is the cheaper way back.
pub const REPLAY_MAX_RECORDS: u64 = 200_000;

/// Records one round trip of a read asks for at most, over every part.
pub const LOG_CHUNK: u64 = 2_000;

/// A node's `run_id` from its `INFO server`.
pub fn run_id(info: &str) -> StoreResult<String> {
    info.lines()
        .find_map(|l| l.strip_prefix("run_id:"))
        .map(|id| id.trim().to_owned())
        .ok_or_else(|| StoreError::corrupt("INFO server without run_id".into()))
}

/// One part's mark from its `XINFO STREAM` reply (a map in RESP3, pairs in RESP2).
pub fn part_mark(v: &Value) -> StoreResult<PartMark> {
    let pairs: Vec<(&Value, &Value)> = match v {
        Value::Map(m) => m.iter().map(|(k, v)| (k, v)).collect(),
        Value::Array(a) => a.chunks_exact(2).map(|p| (&p[0], &p[1])).collect(),
        other => {
            return Err(StoreError::corrupt(format!(
                "XINFO STREAM reply is not a map: {other:?}"
            )));
        }
    };
    let mut added = None;
    let mut last = None;
    for (k, v) in pairs {
        match reply_text(k).as_deref() {
            Some("entries-added") => {
                added = match v {
                    Value::Int(n) => u64::try_from(*n).ok(),
                    _ => None,
                }
            }
            Some("last-generated-id") => last = reply_text(v).as_deref().and_then(stream_id),
            _ => {}
        }
    }
    match (added, last) {
        (Some(added), Some(last)) => Ok(PartMark { added, last }),
        _ => Err(StoreError::corrupt(
            "XINFO STREAM without entries-added or last-generated-id (Redis before 7.0?)".into(),
        )),
    }
}

/// A part's mark from the outcome of its `XINFO STREAM`: a part never written (no key) is
/// at zero.
pub fn part_mark_of(r: redis::RedisResult<Value>) -> StoreResult<PartMark> {
    match r {
        Ok(v) => part_mark(&v),
        Err(_) if no_such_key_reply(&r) => Ok(PartMark::default()),
        Err(e) => Err(StoreError::unavailable_from(e)),
    }
}

/// Whether `XINFO STREAM`'s outcome says its key does not exist.
pub fn no_such_key_reply(r: &redis::RedisResult<Value>) -> bool {
    matches!(r, Err(e) if matches!(e.kind(), redis::ErrorKind::Server(_)) && no_such_key(e))
}

fn no_such_key(e: &redis::RedisError) -> bool {
    e.to_string().to_ascii_lowercase().contains("no such key")
}

/// One part's read of a catch-up: the `count` records after `from` up to `to` (stream ids).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartRead {
    pub part: usize,
    pub from: (u64, u64),
    pub to: (u64, u64),
    pub count: u64,
}

impl PartRead {
    /// `XRANGE`'s bounds: exclusive from, inclusive to.
    pub fn bounds(&self) -> (String, String) {
        (
            format!("({}-{}", self.from.0, self.from.1),
            format!("{}-{}", self.to.0, self.to.1),
        )
    }
}

/// What to read of each part to catch up from `mark` to `now` (both of every part, in the
/// same order): a read for each part with records added since; or the gap that makes
/// reading pointless.
pub fn replay_reads(mark: &LogMark, now: &LogMark) -> Result<Vec<PartRead>, String> {
    if mark.nodes != now.nodes {
        return Err("a Redis node restarted or failed over since the mark".into());
    }
    if mark.parts.len() != now.parts.len() {
        return Err(format!(
            "the mark has {} parts, the log {}",
            mark.parts.len(),
            now.parts.len()
        ));
    }
    let mut reads = Vec::new();
    let mut total = 0u64;
    for (i, (m, n)) in mark.parts.iter().zip(&now.parts).enumerate() {
        if n.added < m.added || n.last < m.last {
            return Err(format!(
                "audit part {i} is behind the mark (restored from an older copy, or replaced)"
            ));
        }
        let count = n.added - m.added;
        if count == 0 {
            continue;
        }
        total += count;
        if total > REPLAY_MAX_RECORDS {
            return Err(format!(
                "more than {REPLAY_MAX_RECORDS} records were written since the mark"
            ));
        }
        reads.push(PartRead {
            part: i,
            from: m.last,
            to: n.last,
            count,
        });
    }
    Ok(reads)
}

/// The change one record tells, in a keyspace of `buckets` buckets; why not, when it tells
/// none that can be known (an import's record, an older writer's without `bucket`).
pub fn change(record: &AuditRecord, buckets: u32) -> Result<LoggedChange, String> {
    let op = record.get("op").unwrap_or("?");
    let Some(bucket) = record.get("bucket") else {
        return Err(format!(
            "a record names no bucket (op {op:?}: an import, or an older writer)"
        ));
    };
    let bucket = bucket
        .parse::<u32>()
        .ok()
        .filter(|b| *b < buckets)
        .ok_or_else(|| format!("a record names bucket {bucket:?} of {buckets}"))?;
    let field = record
        .get("fingerprint")
        .filter(|f| f.len() == 16)
        .and_then(|f| u64::from_str_radix(f, 16).ok())
        .ok_or_else(|| "a record without a 16-digit fingerprint".to_owned())?
        as i64;
    let code = match op {
        "delete" => None,
        "upsert" => Some(match record.get("expires_at") {
            Some("never") => ExpiryCode::NEVER,
            Some(ms) => ms
                .parse::<i64>()
                .ok()
                .and_then(ExpiryCode::encode)
                .ok_or_else(|| format!("a record expiring at {ms:?}"))?,
            None => return Err("an upsert's record without expires_at".into()),
        }),
        other => return Err(format!("a record of op {other:?} names a bucket")),
    };
    Ok(LoggedChange {
        bucket,
        field,
        code: code.map(ExpiryCode::get),
    })
}

/// The replay from what the reads of `replay_reads` returned (`records[k]` for `reads[k]`),
/// for a keyspace of `buckets` buckets.
pub fn replay(
    reads: &[PartRead],
    records: &[Vec<((u64, u64), AuditRecord)>],
    buckets: u32,
) -> Replay {
    let mut changes = Vec::new();
    for (read, got) in reads.iter().zip(records) {
        let (part, expected) = (read.part, read.count);
        if (got.len() as u64) < expected {
            return Replay::Gap(format!(
                "audit part {part} was trimmed past the mark ({} of {expected} records left)",
                got.len()
            ));
        }
        for (_, record) in got {
            match change(record, buckets) {
                Ok(c) => changes.push(c),
                Err(why) => return Replay::Gap(why),
            }
        }
    }
    Replay::Changes(changes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(parts: &[(u64, (u64, u64))]) -> LogMark {
        LogMark {
            parts: parts
                .iter()
                .map(|&(added, last)| PartMark { added, last })
                .collect(),
            nodes: vec!["a".into()],
        }
    }

    fn rec(bucket: Option<&str>) -> ((u64, u64), AuditRecord) {
        let mut fields = vec![
            ("op".to_owned(), "upsert".to_owned()),
            ("expires_at".to_owned(), "never".to_owned()),
            ("fingerprint".to_owned(), "ffffffffffffffff".to_owned()),
        ];
        if let Some(b) = bucket {
            fields.push(("bucket".to_owned(), b.to_owned()));
        }
        ((1, 0), AuditRecord { fields })
    }

    fn with(mut r: ((u64, u64), AuditRecord), name: &str, value: &str) -> AuditRecord {
        r.1.fields.retain(|(n, _)| n != name);
        r.1.fields.push((name.to_owned(), value.to_owned()));
        r.1
    }

    #[test]
    fn a_record_tells_its_change() {
        let c = |r: AuditRecord| change(&r, 10);
        assert_eq!(
            c(rec(Some("4")).1),
            Ok(LoggedChange {
                bucket: 4,
                field: -1,
                code: Some(0)
            })
        );
        let expiring = with(rec(Some("4")), "expires_at", "1577836800500");
        assert_eq!(
            c(expiring).unwrap().code,
            Some(1),
            "rounded up like a write"
        );
        assert_eq!(c(with(rec(Some("4")), "op", "delete")).unwrap().code, None);
        assert!(c(with(rec(Some("4")), "op", "import")).is_err());
        assert!(c(with(rec(Some("4")), "fingerprint", "abc")).is_err());
        assert!(c(with(rec(Some("4")), "expires_at", "soon")).is_err());
        assert!(c(rec(None).1).is_err());
    }

    #[test]
    fn run_id_from_info() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:4f2a\r\ntcp_port:6379\r\n";
        assert_eq!(run_id(info).unwrap(), "4f2a");
        assert!(run_id("# Server\r\n").is_err());
    }

    #[test]
    fn xinfo_in_either_protocol() {
        let s = |t: &str| Value::BulkString(t.as_bytes().to_vec());
        let resp3 = Value::Map(vec![
            (s("length"), Value::Int(3)),
            (s("last-generated-id"), s("1700000000000-4")),
            (s("entries-added"), Value::Int(9)),
        ]);
        let resp2 = Value::Array(vec![
            s("entries-added"),
            Value::Int(9),
            s("last-generated-id"),
            s("1700000000000-4"),
        ]);
        for v in [resp3, resp2] {
            assert_eq!(
                part_mark(&v).unwrap(),
                PartMark {
                    added: 9,
                    last: (1_700_000_000_000, 4)
                }
            );
        }
        assert!(part_mark(&Value::Array(vec![s("length"), Value::Int(1)])).is_err());
    }

    #[test]
    fn reads_only_parts_written_since() {
        let m = mark(&[(5, (10, 0)), (0, (0, 0)), (7, (12, 1))]);
        let n = mark(&[(5, (10, 0)), (2, (20, 0)), (9, (30, 0))]);
        let r = |part, from, to, count| PartRead {
            part,
            from,
            to,
            count,
        };
        assert_eq!(
            replay_reads(&m, &n).unwrap(),
            vec![r(1, (0, 0), (20, 0), 2), r(2, (12, 1), (30, 0), 2)]
        );
        assert_eq!(
            r(2, (12, 1), (30, 0), 2).bounds(),
            ("(12-1".into(), "30-0".into())
        );
    }

    #[test]
    fn a_part_behind_its_mark_is_a_gap() {
        let m = mark(&[(5, (10, 0))]);
        assert!(replay_reads(&m, &mark(&[(4, (10, 0))])).is_err());
        assert!(replay_reads(&m, &mark(&[(5, (9, 0))])).is_err());
        assert!(replay_reads(&m, &mark(&[(0, (0, 0))])).is_err(), "gone");
        assert!(replay_reads(&m, &mark(&[(5, (10, 0)), (0, (0, 0))])).is_err());
        let mut restarted = mark(&[(5, (10, 0))]);
        restarted.nodes = vec!["b".into()];
        assert!(replay_reads(&m, &restarted).is_err(), "another run_id");
    }

    #[test]
    fn too_much_to_replay_is_a_gap() {
        let m = mark(&[(0, (0, 0)), (0, (0, 0))]);
        let n = mark(&[
            (REPLAY_MAX_RECORDS / 2 + 1, (1, 0)),
            (REPLAY_MAX_RECORDS / 2, (1, 0)),
        ]);
        assert!(replay_reads(&m, &n).is_err());
    }

    #[test]
    fn touched_buckets_or_a_gap() {
        let r = |part, count| PartRead {
            part,
            from: (0, 0),
            to: (9, 0),
            count,
        };
        let reads = vec![r(0, 2), r(3, 1)];
        assert_eq!(
            replay(
                &reads,
                &[vec![rec(Some("4")), rec(Some("7"))], vec![rec(Some("4"))]],
                10
            ),
            Replay::Changes(
                [4, 7, 4]
                    .map(|bucket| LoggedChange {
                        bucket,
                        field: -1,
                        code: Some(0)
                    })
                    .to_vec()
            )
        );
        // Trimmed: fewer records than were added since the mark.
        assert!(matches!(
            replay(&reads, &[vec![rec(Some("4"))], vec![rec(Some("4"))]], 10),
            Replay::Gap(_)
        ));
        // An import's record, or an older writer's: no bucket named.
        assert!(matches!(
            replay(
                &reads,
                &[vec![rec(Some("4")), rec(None)], vec![rec(Some("4"))]],
                10
            ),
            Replay::Gap(_)
        ));
        assert!(matches!(
            replay(
                &reads,
                &[vec![rec(Some("4")), rec(Some("x"))], vec![rec(Some("4"))]],
                10
            ),
            Replay::Gap(_)
        ));
        assert!(matches!(
            replay(
                &reads,
                &[vec![rec(Some("4")), rec(Some("10"))], vec![rec(Some("4"))]],
                10
            ),
            Replay::Gap(_)
        ));
        assert_eq!(replay(&[], &[], 10), Replay::Changes(Vec::new()));
    }
}
