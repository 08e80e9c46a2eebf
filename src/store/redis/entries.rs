//! `EntryStore` on Redis: bucket reads and writes, removals, the lists' counts.

use super::audit::{newest, parse_index_range, parse_stream};
use super::*;

/// The (list, sandbox) of a pair field of the older counts layout, `<list>|<sandbox>`, if
/// it is one.
pub(super) fn old_pair(field: &str) -> Option<(ListName, Sandbox)> {
    let (list, sandbox) = field.split_once('|')?;
    Some((list.parse().ok()?, sandbox.parse().ok()?))
}

impl RedisStore {
    /// One `EVALSHA REMOVE` per bucket of `keys`; (bucket, the keys' positions in order).
    pub(super) fn removal_calls(&self, keys: &[EntryKey]) -> Vec<(u32, Vec<usize>)> {
        let mut by_bucket: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (i, k) in keys.iter().enumerate() {
            by_bucket.entry(k.bucket).or_default().push(i);
        }
        by_bucket.into_iter().collect()
    }

    pub(super) fn removals(
        &self,
        keys: &[EntryKey],
        calls: &[(u32, Vec<usize>)],
        now_rel_ms: i64,
    ) -> Vec<Keyed> {
        calls
            .iter()
            .map(|(bucket, idx)| {
                let key = self.layout.bucket_key(*bucket);
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(self.remove.get_hash())
                    .arg(1)
                    .arg(&key)
                    .arg(now_rel_ms);
                for &i in idx {
                    cmd.arg(keys[i].field);
                }
                (key.into_bytes(), cmd)
            })
            .collect()
    }

    /// `command <bucket key>` for each bucket.
    pub(super) fn on_buckets(&self, command: &str, buckets: &[u32]) -> Vec<Keyed> {
        buckets
            .iter()
            .map(|b| {
                Self::keyed(self.layout.bucket_key(*b), |c, key| {
                    c.arg(command).arg(key);
                })
            })
            .collect()
    }

    /// Whole buckets by `HGETALL`.
    pub(super) async fn hgetall_buckets(
        &self,
        buckets: &[u32],
    ) -> StoreResult<Vec<Vec<(i64, u32)>>> {
        let mut cmds = self.on_buckets("HGETALL", buckets);
        let probes = self.add_probes(&mut cmds);
        let mut replies = self.bulk.run_all(cmds).await.map_err(unavailable)?;
        self.take_probes(&probes, &mut replies)?;
        replies
            .iter()
            .map(|v| {
                redis::from_redis_value_ref::<Vec<(i64, u32)>>(v)
                    .map_err(|e| StoreError::corrupt(format!("bucket: {e}")))
            })
            .collect()
    }

    /// `COUNT_CHANGES` over `pairs` (list, sandbox, delta, Unix ms): one call per
    /// `COUNT_CHUNK` pairs.
    pub(super) fn count_calls(&self, pairs: &[(&str, &str, i64, i64)]) -> Vec<Keyed> {
        let keys = self.layout.counts_keys();
        pairs
            .chunks(COUNT_CHUNK)
            .map(|chunk| {
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(self.count_changes.get_hash()).arg(keys.len());
                for k in &keys {
                    cmd.arg(k);
                }
                for (list, sandbox, delta, at) in chunk {
                    cmd.arg(*list).arg(*sandbox).arg(*delta).arg(*at);
                }
                (keys[0].clone().into_bytes(), cmd)
            })
            .collect()
    }

    /// Folds the lists' counts of the older layout (64 parts `<prefix>lists:{<tag>}`) into
    /// the current keys (see `layout`, *The lists' counts*): what the service does at every
    /// start. Writes; safe against a live store and against other callers at the same time
    /// (each pair is taken by one of them). One round trip per primary when no part exists,
    /// else two script calls per chunk of `COUNT_CHUNK` pairs.
    pub async fn fold_old_counts(&self) -> StoreResult<Folded> {
        let parts: Vec<String> = (0..AUDIT_PARTS)
            .map(|p| self.layout.old_counts_key(p))
            .collect();
        let exists = self
            .conn
            .run_all(
                parts
                    .iter()
                    .map(|k| {
                        Self::keyed(k.clone(), |c, key| {
                            c.arg("EXISTS").arg(key);
                        })
                    })
                    .collect(),
            )
            .await
            .map_err(unavailable)?;
        let take = Script::new(TAKE_OLD_COUNTS);
        let mut moved = 0u64;
        let mut left_alone = 0u64;
        for (part, found) in parts.iter().zip(&exists) {
            if redis::from_redis_value_ref::<i64>(found).unwrap_or(0) == 0 {
                continue;
            }
            let mut conn = self.conn.clone();
            let mut cursor = 0u64;
            loop {
                let (next, fields): (u64, Vec<(String, String)>) = redis::cmd("HSCAN")
                    .arg(part)
                    .arg(cursor)
                    .arg("COUNT")
                    .arg(COUNT_CHUNK)
                    .query_async(&mut conn)
                    .await
                    .map_err(unavailable)?;
                // A pair's count and time are taken together, whichever of them the scan met.
                let mut pairs: Vec<String> = Vec::new();
                let mut seen = HashSet::new();
                for (field, _) in fields {
                    let pair = field.strip_suffix("|t").unwrap_or(&field);
                    if old_pair(pair).is_none() {
                        left_alone += 1;
                    } else if seen.insert(pair.to_owned()) {
                        pairs.push(pair.to_owned());
                    }
                }
                for chunk in pairs.chunks(COUNT_CHUNK) {
                    let taken: Vec<(Option<i64>, Option<i64>)> = take
                        .key(part)
                        .arg(chunk)
                        .invoke_async(&mut conn)
                        .await
                        .map_err(unavailable)?;
                    let changes: Vec<(&str, &str, i64, i64)> = chunk
                        .iter()
                        .zip(&taken)
                        .filter(|(_, (n, t))| n.is_some() || t.is_some())
                        .filter_map(|(pair, (n, t))| {
                            let (list, sandbox) = pair.split_once('|')?;
                            Some((list, sandbox, n.unwrap_or(0), t.unwrap_or(0)))
                        })
                        .collect();
                    if changes.is_empty() {
                        continue;
                    }
                    self.run_counts(
                        self.count_calls(&changes),
                        Deadline::after(Duration::from_secs(10)),
                    )
                    .await?;
                    moved += changes.len() as u64;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(Folded {
            pairs: moved,
            left_alone,
        })
    }

    /// Runs `COUNT_CHANGES` calls on the write path (no replica waited for: bookkeeping),
    /// loading the script again after a `NOSCRIPT` (only the calls that did not run are sent
    /// again).
    pub(super) async fn run_counts(
        &self,
        calls: Vec<Keyed>,
        deadline: Deadline,
    ) -> StoreResult<()> {
        if calls.is_empty() {
            return Ok(());
        }
        let key = self.layout.counts_keys()[0].clone();
        let topology = self.monitor.topology();
        let mut session = self
            .session(&topology, [key.as_bytes()], 0, deadline)
            .await?;
        let r = async {
            let mut pending = calls;
            for attempt in 0..2 {
                let replies = session.commit(pending.clone(), false).await?;
                let mut again = Vec::new();
                for (call, reply) in pending.into_iter().zip(replies) {
                    match reply {
                        Ok(_) => {}
                        Err(e) if attempt == 0 && is_noscript(&e) => again.push(call),
                        Err(e) => return Err(unavailable(e)),
                    }
                }
                if again.is_empty() {
                    return Ok(());
                }
                self.load_scripts().await?;
                pending = again;
            }
            Err(StoreError::unavailable(
                "count script missing after loading it".into(),
            ))
        }
        .await;
        self.noted(r)
    }
}

#[async_trait]
impl EntryStore for RedisStore {
    /// One node: `write` publishes inside its `MULTI`. A cluster has no transaction across
    /// slots, so there the message follows the write.
    fn atomic_messages(&self) -> bool {
        !self.conn.is_cluster()
    }

    async fn get_many(&self, keys: &[EntryKey]) -> StoreResult<Vec<Option<u32>>> {
        self.unless_lost(false)?;
        let mut cmds: Vec<Keyed> = keys
            .iter()
            .map(|k| {
                Self::keyed(self.layout.bucket_key(k.bucket), |c, key| {
                    c.arg("HGET").arg(key).arg(k.field);
                })
            })
            .collect();
        let probes = self.add_probes(&mut cmds);
        let mut replies = self.reads().run_all(cmds).await.map_err(unavailable)?;
        self.take_probes(&probes, &mut replies)?;
        replies
            .iter()
            .map(|v| {
                redis::from_redis_value_ref::<Option<u32>>(v)
                    .map_err(|e| StoreError::corrupt(format!("bucket value: {e}")))
            })
            .collect()
    }

    async fn get_buckets(&self, buckets: &[u32]) -> StoreResult<Vec<Vec<(i64, u32)>>> {
        self.unless_lost(false)?;
        if self.dump_refused.load(Ordering::Relaxed) {
            return self.hgetall_buckets(buckets).await;
        }
        let mut cmds = self.on_buckets("DUMP", buckets);
        let probes = self.add_probes(&mut cmds);
        let mut replies = self.bulk.run(cmds).await.map_err(unavailable)?;
        self.take_probe_results(&probes, &mut replies)?;
        let mut out: Vec<Option<Vec<(i64, u32)>>> = Vec::with_capacity(buckets.len());
        let mut other = Vec::new();
        for (i, reply) in replies.into_iter().enumerate() {
            let pairs = match reply {
                Ok(redis::Value::Nil) => Some(Vec::new()),
                Ok(redis::Value::BulkString(payload)) => match dump::read_hash_dump(&payload) {
                    Ok(pairs) => Some(
                        pairs
                            .into_iter()
                            .map(|(f, v)| {
                                u32::try_from(v).map(|c| (f, c)).map_err(|_| {
                                    StoreError::corrupt(format!("bucket value {v} is not a code"))
                                })
                            })
                            .collect::<StoreResult<Vec<_>>>()?,
                    ),
                    // A hashtable-encoded bucket (past the listpack limit): read it whole.
                    Err(dump::DumpError::UnsupportedType(_)) => None,
                    Err(e) => {
                        return Err(StoreError::corrupt(format!("bucket {}: {e}", buckets[i])));
                    }
                },
                Ok(v) => return Err(StoreError::corrupt(format!("DUMP answered {v:?}"))),
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::Server(ServerErrorKind::NoPerm | ServerErrorKind::ResponseError)
                    ) =>
                {
                    if !self.dump_refused.swap(true, Ordering::Relaxed) {
                        tracing::warn!(error = %e, "DUMP refused: reading buckets with HGETALL");
                    }
                    None
                }
                Err(e) => return Err(unavailable(e)),
            };
            if pairs.is_none() {
                other.push(i);
            }
            out.push(pairs);
        }
        if !other.is_empty() {
            let read: Vec<u32> = other.iter().map(|&i| buckets[i]).collect();
            for (i, pairs) in other.into_iter().zip(self.hgetall_buckets(&read).await?) {
                out[i] = Some(pairs);
            }
        }
        Ok(out
            .into_iter()
            .map(|p| p.expect("every bucket read"))
            .collect())
    }

    async fn prefix_lengths(&self, scopes: &[Scope]) -> StoreResult<Vec<Vec<PrefixLen>>> {
        let cmds = scopes
            .iter()
            .map(|Scope { list, sandbox }| {
                Self::keyed(self.layout.registry_key(list, sandbox), |c, key| {
                    c.arg("SMEMBERS").arg(key);
                })
            })
            .collect();
        self.unless_lost(false)?;
        let mut cmds: Vec<Keyed> = cmds;
        let probes = self.add_probes(&mut cmds);
        let mut raw = self.reads().run_all(cmds).await.map_err(unavailable)?;
        self.take_probes(&probes, &mut raw)?;
        raw.iter()
            .map(|v| {
                let members: Vec<String> = redis::from_redis_value_ref(v)
                    .map_err(|e| StoreError::corrupt(format!("registry: {e}")))?;
                let mut v: Vec<PrefixLen> = members
                    .iter()
                    .filter_map(|m| PrefixLen::parse_member(m))
                    .collect();
                v.sort();
                Ok(v)
            })
            .collect()
    }

    async fn write(&self, batch: WriteBatch, deadline: Deadline) -> StoreResult<Vec<bool>> {
        self.unless_lost(true)?;
        let mut registries = Vec::new();
        let mut scopes = Vec::new();
        for (Scope { list, sandbox }, len) in &batch.prefixes {
            registries.push(Self::keyed(
                self.layout.registry_key(list, sandbox),
                |c, key| {
                    c.arg("SADD").arg(key).arg(len.member());
                },
            ));
            scopes.push((list.to_string(), sandbox.to_string()));
        }
        // One HSET per entry (in order: for a key given twice the last one wins), so that
        // each reply says whether that entry created its field.
        let buckets: Vec<Keyed> = batch
            .entries
            .iter()
            .map(|(k, code)| {
                Self::keyed(self.layout.bucket_key(k.bucket), |c, key| {
                    c.arg("HSET").arg(key).arg(k.field).arg(code);
                })
            })
            .collect();
        let topology = self.monitor.topology();
        let entry_buckets: Vec<u32> = batch.entries.iter().map(|(k, _)| k.bucket).collect();
        let mut last = self.audit_cmds(&topology, &batch.audit, &entry_buckets);
        let route = last.first().or(buckets.first()).map(|(k, _)| k.clone());
        let atomic = !self.conn.is_cluster(); // one MULTI with the write on one node
        let publish = |message: &Invalidation| match atomic {
            true => self.guarded_publish_cmd(message),
            false => self.publish_cmd(message, route.as_deref()),
        };
        if !scopes.is_empty() {
            scopes.sort();
            scopes.dedup();
            last.push(publish(&Invalidation::Scopes(scopes)));
        }
        last.push(publish(&Invalidation::upserted(&batch.entries, atomic)));
        let touched = registries.iter().chain(&buckets).chain(&last);
        let mut session = self
            .replicated_session(&topology, touched, deadline)
            .await?;
        let n_registries = registries.len();
        let n_entries = buckets.len();
        let r = async {
            let replies = if self.conn.is_cluster() {
                // No transaction across slots: the same order, step by step, then the WAITs.
                // Each slot's marker is read in the entries' `MULTI` on that slot: entries
                // that reached a shard that lost its data are never acknowledged.
                let slots = self.slots_of(registries.iter().chain(&buckets));
                all_ok(session.step(registries, true).await?)?;
                let step = slots.iter().map(|&s| self.shard_probe(s)).chain(buckets);
                let mut replies = all_ok(session.step(step.collect(), true).await?)?;
                let entries = replies.split_off(slots.len().min(replies.len()));
                self.shards_probed(&slots, &replies)?;
                all_ok(session.commit(last, true).await?)?;
                entries
            } else {
                // The keyspace id first, in the same transaction: a write that reached a
                // keyspace lost meanwhile is never acknowledged (and announced to nobody).
                let all = std::iter::once(self.keyspace_probe())
                    .chain(registries)
                    .chain(buckets)
                    .chain(last)
                    .collect();
                let mut replies = all_ok(session.commit(all, true).await?)?;
                self.probed(replies.first())?;
                replies.truncate(1 + n_registries + n_entries);
                replies.split_off(1 + n_registries)
            };
            if replies.len() != n_entries {
                return Err(StoreError::corrupt(format!(
                    "{} replies to {n_entries} HSETs",
                    replies.len()
                )));
            }
            replies
                .iter()
                .map(|v| {
                    redis::from_redis_value_ref::<i64>(v)
                        .map(|n| n == 1)
                        .map_err(|e| StoreError::corrupt(format!("HSET reply: {e}")))
                })
                .collect()
        }
        .await;
        self.noted(r)
    }

    async fn remove(
        &self,
        batch: RemoveBatch<'_>,
        deadline: Deadline,
    ) -> StoreResult<Vec<Removed>> {
        self.unless_lost(true)?;
        let keys = batch.keys;
        let calls = self.removal_calls(keys);
        let now_rel = ExpiryCode::script_now(batch.now_ms);
        let topology = self.monitor.topology();
        let key_buckets: Vec<u32> = keys.iter().map(|k| k.bucket).collect();
        let mut last = self.audit_cmds(&topology, &batch.audit, &key_buckets);
        let scripts = self.removals(keys, &calls, now_rel);
        let route = last.first().or(scripts.first()).map(|(k, _)| k.clone());
        last.push(self.publish_cmd(&Invalidation::removed(keys), route.as_deref()));
        let touched = scripts.iter().chain(&last);
        let mut session = self
            .replicated_session(&topology, touched, deadline)
            .await?;
        let r = async {
            // The keyspace id after the deletions, on their connection: deletions that reached
            // a keyspace lost meanwhile are neither audited, announced nor acknowledged.
            // On a cluster, each slot's marker after its deletions (`shards`).
            let mut cmds = scripts;
            let probes = self.add_probes(&mut cmds);
            let mut results = session.step(cmds, false).await?;
            self.take_probe_results(&probes, &mut results)?;
            if results.iter().any(|r| r.as_ref().is_err_and(is_noscript)) {
                // The script cache was flushed (a restart): load and redo what did not run.
                self.load_scripts().await?;
                let again: Vec<usize> = (0..results.len())
                    .filter(|&i| results[i].as_ref().is_err_and(is_noscript))
                    .collect();
                let redo: Vec<Keyed> = self
                    .removals(keys, &calls, now_rel)
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| again.contains(i))
                    .map(|(_, c)| c)
                    .collect();
                for (i, r) in again.into_iter().zip(session.step(redo, false).await?) {
                    if let Some(slot) = results.get_mut(i) {
                        *slot = r;
                    }
                }
            }
            if results.len() != calls.len() {
                return Err(StoreError::corrupt(format!(
                    "{} replies to {} deletions",
                    results.len(),
                    calls.len()
                )));
            }
            let mut removed = vec![Removed::Absent; keys.len()];
            for ((_, idx), result) in calls.iter().zip(results) {
                let flags: Vec<i64> = result
                    .and_then(|v| Ok(redis::from_redis_value(v)?))
                    .map_err(unavailable)?;
                if flags.len() != idx.len() {
                    return Err(StoreError::corrupt(format!(
                        "{} flags for {} deleted fields",
                        flags.len(),
                        idx.len()
                    )));
                }
                for (&i, flag) in idx.iter().zip(flags) {
                    if let Some(r) = removed.get_mut(i) {
                        match flag {
                            1 => *r = Removed::Live,
                            2 if *r == Removed::Absent => *r = Removed::Expired,
                            _ => {}
                        }
                    }
                }
            }
            // Audit and tell every instance once the deletions are done, then wait for the
            // replicas to have all of it.
            all_ok(session.commit(last, true).await?)?;
            Ok(removed)
        }
        .await;
        self.noted(r)
    }

    async fn remove_if_unchanged(
        &self,
        key: EntryKey,
        code: u32,
        deadline: Deadline,
    ) -> StoreResult<bool> {
        self.unless_lost(true)?;
        // Housekeeping: no replica is waited for (an expired entry deleted again after a
        // failover is harmless), but an unreachable primary is not tried.
        let bucket = self.layout.bucket_key(key.bucket);
        let topology = self.monitor.topology();
        let mut session = self
            .session(&topology, [bucket.as_bytes()], 0, deadline)
            .await?;
        let cmd = || {
            let mut c = redis::cmd("EVALSHA");
            c.arg(self.remove_if_unchanged.get_hash())
                .arg(1)
                .arg(&bucket)
                .arg(key.field)
                .arg(code);
            vec![(bucket.clone().into_bytes(), c)]
        };
        let r = async {
            let mut reply = first(session.commit(cmd(), false).await?)?;
            if reply.as_ref().is_err_and(is_noscript) {
                self.load_scripts().await?;
                reply = first(session.commit(cmd(), false).await?)?;
            }
            // {deleted, refreshed}: one field asked, so deleted is 0 or 1.
            let (deleted, _refreshed): (i64, i64) =
                redis::from_redis_value(reply.map_err(unavailable)?)
                    .map_err(|e| StoreError::corrupt(format!("compare-and-delete reply: {e}")))?;
            Ok(deleted == 1)
        }
        .await;
        self.noted(r)
    }

    async fn audit_tail(&self, count: usize) -> StoreResult<Vec<AuditRecord>> {
        let cmds: Vec<Keyed> = self
            .layout
            .audit_keys()
            .into_iter()
            .map(|key| {
                Self::keyed(key, |c, key| {
                    c.arg("XREVRANGE")
                        .arg(key)
                        .arg("+")
                        .arg("-")
                        .arg("COUNT")
                        .arg(count);
                })
            })
            .collect();
        let parts = self
            .operator_reads()
            .run_all(cmds)
            .await
            .map_err(unavailable)?
            .iter()
            .map(parse_stream)
            .collect::<StoreResult<Vec<_>>>()?;
        Ok(newest(parts, count))
    }

    fn audit_parts(&self) -> u16 {
        // The 64 parts and the single stream of earlier versions, last.
        (AUDIT_PARTS + 1) as u16
    }

    async fn audit_read(&self, reads: &[AuditRead]) -> StoreResult<Vec<AuditChunk>> {
        let keys = self.layout.audit_keys();
        let mut out = vec![AuditChunk::default(); reads.len()];
        // First round trip: an `XREVRANGE` per plain read, an index range per indexed one.
        // The reads sent, by index: a bound with nothing older is answered here (an
        // `XREVRANGE` to `(0-0` is refused: "invalid end ID").
        let mut cmds: Vec<Keyed> = Vec::with_capacity(reads.len());
        let mut sent = Vec::with_capacity(reads.len());
        for (i, read) in reads.iter().enumerate() {
            let stream = usize::from(read.part);
            let key = keys
                .get(stream)
                .ok_or_else(|| StoreError::corrupt(format!("no audit part {}", read.part)))?;
            if read.before_everything() {
                continue;
            }
            sent.push(i);
            if let Some(term) = &read.index {
                cmds.push(self.audit_index_range(stream, term, read));
                continue;
            }
            let end = match read.before {
                None => "+".to_owned(),
                Some((ms, seq)) if read.inclusive => format!("{ms}-{seq}"),
                Some((ms, seq)) => format!("({ms}-{seq}"),
            };
            cmds.push(Self::keyed(key.clone(), |c, key| {
                c.arg("XREVRANGE")
                    .arg(key)
                    .arg(&end)
                    .arg("-")
                    .arg("COUNT")
                    .arg(read.count);
            }));
        }
        // One reply per command (`RedisConn::run`), in order.
        let replies = self
            .operator_reads()
            .run_all(cmds)
            .await
            .map_err(unavailable)?;
        // Second round trip: each record the indexes named, by its id (an `XRANGE` in a
        // script would cost Redis ~10 times more a record: the reply made a Lua table and
        // back).
        let mut fetch: Vec<Keyed> = Vec::new();
        let mut named: Vec<(usize, (u64, u64))> = Vec::new();
        for (&i, v) in sent.iter().zip(&replies) {
            let read = &reads[i];
            let part = read.part;
            if read.index.is_none() {
                let records: Vec<(AuditPos, AuditRecord)> = parse_stream(v)?
                    .into_iter()
                    .map(|((ms, seq), r)| (AuditPos { ms, seq, part }, r))
                    .collect();
                out[i].next = records
                    .last()
                    .filter(|_| records.len() == read.count)
                    .map(|(p, _)| (p.ms, p.seq));
                out[i].records = records;
                continue;
            }
            let ids = parse_index_range(v)?;
            out[i].next = ids.last().copied().filter(|_| ids.len() == read.count);
            let key = &keys[usize::from(part)];
            for (ms, seq) in ids {
                let id = format!("{ms}-{seq}");
                fetch.push(Self::keyed(key.clone(), |c, key| {
                    c.arg("XRANGE").arg(key).arg(&id).arg(&id);
                }));
                named.push((i, (ms, seq)));
            }
        }
        if !fetch.is_empty() {
            let replies = self.conn.run_all(fetch).await.map_err(unavailable)?;
            for ((i, (ms, seq)), v) in named.into_iter().zip(&replies) {
                // A member whose record is gone (an older build trimmed it) finds nothing.
                if let Some((_, record)) = parse_stream(v)?.into_iter().next() {
                    let part = reads[i].part;
                    out[i].records.push((AuditPos { ms, seq, part }, record));
                }
            }
        }
        Ok(out)
    }

    async fn count_changes(
        &self,
        changes: &[CountChange],
        at_ms: i64,
        deadline: Deadline,
    ) -> StoreResult<()> {
        self.unless_lost(true)?;
        let pairs: Vec<(&str, &str, i64, i64)> = changes
            .iter()
            .map(|c| {
                (
                    c.scope.list.as_str(),
                    c.scope.sandbox.as_str(),
                    c.delta,
                    at_ms,
                )
            })
            .collect();
        self.run_counts(self.count_calls(&pairs), deadline).await
    }

    async fn list_counts(&self, query: &CountsQuery) -> StoreResult<CountsPage> {
        if query.limit == 0 {
            return Ok(CountsPage::default());
        }
        let range = Layout::count_range(query);
        let [counts, times, by_list, by_sandbox] = self.layout.counts_keys();
        let index = if range.by_sandbox {
            by_sandbox
        } else {
            by_list
        };
        let call = || {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(self.counts_page.get_hash())
                .arg(3)
                .arg(&counts)
                .arg(&times)
                .arg(&index)
                .arg(&range.min)
                .arg(&range.max)
                // One more than asked says whether there is more (Redis takes an i64).
                .arg(query.limit.min(i64::MAX as usize - 1) + 1)
                .arg(if range.by_sandbox { "1" } else { "0" });
            vec![(counts.clone().into_bytes(), cmd)]
        };
        let conn = self.operator_reads();
        let mut reply = first(conn.run(call()).await.map_err(unavailable)?)?;
        if reply.as_ref().is_err_and(is_noscript) {
            self.load_scripts().await?;
            reply = first(conn.run(call()).await.map_err(unavailable)?)?;
        }
        let flat: Vec<(Vec<u8>, Option<i64>, Option<i64>)> =
            redis::from_redis_value(reply.map_err(unavailable)?)
                .map_err(|e| StoreError::corrupt(format!("lists' counts page: {e}")))?;
        let more = flat.len() > query.limit;
        let mut page = CountsPage {
            counts: Vec::with_capacity(flat.len().min(query.limit)),
            more,
        };
        for (member, count, time) in flat.into_iter().take(query.limit) {
            let (list, sandbox) = Layout::parse_count_member(&member).ok_or_else(|| {
                StoreError::corrupt(format!(
                    "lists' counts member {:?}",
                    String::from_utf8_lossy(&member)
                ))
            })?;
            // Written together by one script: an index member without a count is not ours.
            let Some(entries) = count else { continue };
            page.counts.push(ListCount {
                list,
                sandbox,
                entries,
                last_change_ms: time.unwrap_or(0),
            });
        }
        Ok(page)
    }
}
