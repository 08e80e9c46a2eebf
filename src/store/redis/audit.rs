//! The audit trail on Redis (`AuditReports`, appends, the index): its streams' commands and parsers.

use super::*;

/// Records an audit append indexes first, of those an older build left unindexed (a rolling
/// deploy): what catches a part up without waiting for the next start-up.
pub(super) const AUDIT_CATCH_UP_PER_WRITE: usize = 100;

/// Records one catch-up call indexes at open (a few ms of Redis each, so that nothing else
/// waits long behind it).
pub(super) const AUDIT_INDEX_CHUNK: usize = 1_000;

/// One part's `XREVRANGE` reply: (id, record), newest first.
pub(super) fn parse_stream(v: &redis::Value) -> StoreResult<Vec<((u64, u64), AuditRecord)>> {
    let raw: Vec<(String, Vec<String>)> = redis::from_redis_value_ref(v)
        .map_err(|e| StoreError::corrupt(format!("audit stream: {e}")))?;
    raw.into_iter()
        .map(|(id, kv)| {
            let id = stream_id(&id)
                .ok_or_else(|| StoreError::corrupt(format!("audit stream id {id:?}")))?;
            // Pairs moved out, not cloned; an odd field count keeps the whole pairs.
            let mut kv = kv.into_iter();
            let mut fields = Vec::with_capacity(kv.len() / 2);
            while let (Some(k), Some(v)) = (kv.next(), kv.next()) {
                fields.push((k, v));
            }
            Ok((id, AuditRecord { fields }))
        })
        .collect()
}

/// The ids an audit index range found (`RedisStore::audit_index_range`), newest first: each
/// member ends with `\0` and its stream id in 19 hex digits (`layout::audit_index_id`).
pub(super) fn parse_index_range(v: &redis::Value) -> StoreResult<Vec<(u64, u64)>> {
    let members: Vec<Vec<u8>> = redis::from_redis_value_ref(v)
        .map_err(|e| StoreError::corrupt(format!("audit index range: {e}")))?;
    members
        .iter()
        .map(|m| {
            let split = m.len().checked_sub(AUDIT_INDEX_ID_LEN + 1);
            split
                .filter(|&at| m[at] == 0)
                .and_then(|at| std::str::from_utf8(&m[at + 1..]).ok())
                .and_then(parse_audit_index_id)
                .ok_or_else(|| {
                    StoreError::corrupt(format!(
                        "audit index member {:?}",
                        String::from_utf8_lossy(m)
                    ))
                })
        })
        .collect()
}

/// The `count` newest records of all parts, oldest first (by stream id: the time of the
/// primary that holds each part, then the sequence).
pub(super) fn newest(parts: Vec<Vec<((u64, u64), AuditRecord)>>, count: usize) -> Vec<AuditRecord> {
    let mut all: Vec<((u64, u64), AuditRecord)> = parts.into_iter().flatten().collect();
    all.sort_by_key(|(id, _)| std::cmp::Reverse(*id));
    all.truncate(count);
    all.into_iter().rev().map(|(_, r)| r).collect()
}

impl RedisStore {
    /// Indexes, in every audit stream, the records no index holds yet: all of them the first
    /// time (records written before the index existed), then those an older build wrote
    /// since (a rolling deploy); a stream whose index holds members of records gone (an
    /// older build trimmed them) is indexed again from scratch. `AUDIT_INDEX_CHUNK` records
    /// a call, every stream at once per round trip: on an indexed keyspace, one round trip
    /// that finds nothing to do. Returns the records indexed and, for each stream that could
    /// not be indexed, a warning (its older records are then not found by searches by who or
    /// list until a later start, or a write to it, catches it up).
    pub(super) async fn index_audit_trail(&self) -> (u64, Vec<String>) {
        let keys = self.layout.audit_keys();
        let mut pending: Vec<usize> = (0..keys.len()).collect();
        let (mut indexed, mut first) = (0u64, true);
        let mut warnings = Vec::new();
        while !pending.is_empty() {
            let cmds: Vec<Keyed> = pending
                .iter()
                .map(|&i| {
                    let (ix, mark) = self.layout.audit_index_keys(i);
                    let mut cmd = redis::cmd("EVAL");
                    cmd.arg(AUDIT_CATCH_UP_LUA.as_str())
                        .arg(3)
                        .arg(&keys[i])
                        .arg(ix)
                        .arg(mark)
                        .arg(AUDIT_INDEX_CHUNK)
                        .arg(if first { "1" } else { "" });
                    (keys[i].clone().into_bytes(), cmd)
                })
                .collect();
            let replies = match self.conn.run(cmds).await {
                Ok(r) => r,
                Err(e) => {
                    warnings.push(format!(
                        "audit trail not indexed ({e}): searches by who or list may miss records \
                         written without the index until a later start (or a write to their \
                         part) indexes them"
                    ));
                    break;
                }
            };
            let mut next = Vec::new();
            for (&i, reply) in pending.iter().zip(replies) {
                match reply.and_then(|v| Ok(redis::from_redis_value::<(i64, u64, i64)>(v)?)) {
                    Ok((done, n, _)) => {
                        indexed += n;
                        if done == 0 {
                            next.push(i);
                        }
                    }
                    Err(e) => warnings.push(format!(
                        "audit stream {} not indexed ({e}): searches by who or list may miss its \
                         records written without the index until a later start (or a write to \
                         it) indexes them",
                        keys[i]
                    )),
                }
            }
            pending = next;
            first = false;
        }
        (indexed, warnings)
    }

    /// Appends one record to the audit trail (for tools that write in bulk), in a part on a
    /// primary that can take it, indexed and trimmed as a write's records are.
    pub async fn append_audit(&self, record: &AuditRecord) -> StoreResult<()> {
        let topology = self.monitor.topology();
        let now = Instant::now();
        let part = (0..AUDIT_PARTS)
            .find(|&p| {
                topology
                    .check(
                        [crate::store::layout::Layout::audit_part_slot(p)],
                        self.write_replicas,
                        now,
                    )
                    .is_ok()
            })
            .unwrap_or(0);
        let cmd = self.audit_append(part, &[record]);
        let deadline = Deadline::after(Duration::from_secs(10));
        let mut session = self.replicated_session(&topology, [&cmd], deadline).await?;
        let r = session.commit(vec![cmd], false).await;
        all_ok(self.noted(r)?).map(drop)
    }

    /// Replaces the last audit's summary (`<prefix>audit:last`), read by every instance.
    pub async fn put_audit_summary(&self, summary: &AuditSummary) -> StoreResult<()> {
        let key = self.layout.audit_summary_key();
        let mut del = redis::cmd("DEL");
        del.arg(&key);
        let mut hset = redis::cmd("HSET");
        hset.arg(&key);
        for (k, v) in summary.to_fields() {
            hset.arg(k).arg(v);
        }
        let k = key.into_bytes();
        let mut session = self
            .writes
            .session(0, Deadline::after(Duration::from_secs(10)))
            .await?;
        let r = session
            .commit(vec![(k.clone(), del), (k, hset)], true)
            .await;
        all_ok(self.noted(r)?).map(drop)
    }

    /// Records appended to audit part `part`, indexed, the part trimmed past its cap
    /// (`scripts::AUDIT_APPEND`): one `EVAL`, sent whole, so that inside a write's `MULTI`
    /// it cannot fail for want of a cached script. Records without fields are skipped (a
    /// stream entry needs one).
    pub(super) fn audit_append(&self, part: usize, records: &[&AuditRecord]) -> Keyed {
        let key = self.layout.audit_part_key(part);
        let (ix, mark) = self.layout.audit_index_keys(part);
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(AUDIT_APPEND_LUA.as_str())
            .arg(3)
            .arg(&key)
            .arg(ix)
            .arg(mark)
            .arg(self.audit_part_len)
            .arg(AUDIT_CATCH_UP_PER_WRITE);
        for r in records.iter().filter(|r| !r.fields.is_empty()) {
            cmd.arg(2 * r.fields.len());
            for (name, value) in &r.fields {
                cmd.arg(name).arg(value);
            }
        }
        (key.into_bytes(), cmd)
    }

    /// The appends of a write's audit records, one per part: record `i` goes to a part on
    /// the primary of the bucket of entry `i` (the last entry's past the end: records beyond
    /// the entries, such as a delete naming one entry twice, still land on a primary this
    /// write touches), in order within each part.
    pub(super) fn audit_cmds(
        &self,
        topology: &Topology,
        records: &[AuditRecord],
        buckets: &[u32],
    ) -> Vec<Keyed> {
        let mut by_part: BTreeMap<usize, Vec<&AuditRecord>> = BTreeMap::new();
        for (i, r) in records.iter().enumerate() {
            let part = match buckets.get(i).or(buckets.last()) {
                Some(&b) => {
                    let slot = key_slot(self.layout.bucket_key(b).as_bytes());
                    topology.audit_part(slot, b)
                }
                None => i % AUDIT_PARTS,
            };
            by_part.entry(part).or_default().push(r);
        }
        by_part
            .into_iter()
            .map(|(part, records)| self.audit_append(part, &records))
            .collect()
    }

    /// The range of a read through audit stream `stream`'s index: `ZRANGE <ix> <hi> <lo>
    /// BYLEX REV LIMIT 0 <count>`, the members of `term` older than the read's bound, newest
    /// first (`layout`, *Audit trail*). The bound is written as a member ends: a position past
    /// what its width holds is above every stream id, so it is no bound at all (the sequence
    /// clamped: no id has more).
    pub(super) fn audit_index_range(
        &self,
        stream: usize,
        term: &AuditTerm,
        read: &AuditRead,
    ) -> Keyed {
        let (ix, _) = self.layout.audit_index_keys(stream);
        let term = audit_index_term(term);
        let bound = read.before.and_then(|(ms, seq)| {
            let clamped = seq > u64::from(u32::MAX);
            audit_index_id(ms, seq.min(u64::from(u32::MAX)))
                .map(|id| (id, read.inclusive || clamped))
        });
        let hi = match &bound {
            None => [&b"("[..], &term, b"\x01"].concat(),
            Some((id, true)) => [&b"["[..], &term, b"\0", id.as_bytes()].concat(),
            Some((id, false)) => [&b"("[..], &term, b"\0", id.as_bytes()].concat(),
        };
        let lo = [&b"["[..], &term, b"\0"].concat();
        Self::keyed(ix, |c, key| {
            c.arg("ZRANGE")
                .arg(key)
                .arg(hi)
                .arg(lo)
                .arg("BYLEX")
                .arg("REV")
                .arg("LIMIT")
                .arg(0)
                .arg(read.count);
        })
    }
}

#[async_trait]
impl AuditReports for RedisStore {
    async fn audit_summary(&self) -> StoreResult<Option<AuditSummary>> {
        let mut conn = self.operator_reads();
        let fields: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
            .arg(self.layout.audit_summary_key())
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(AuditSummary::from_fields(&fields))
    }
}
