//! `MetricStore` and `DefinitionStore` on Redis: metric script calls (events sharing them on
//! one node, one per event and slot on a cluster: `metric_calls`, `coalesce`), definitions.

use super::coalesce::Coalescer;
use super::*;

/// Most weight in one metric script call without an event (id-less updates, reads), an op
/// weighing 1 and an APPROX_COUNT_DISTINCT read 1 more per sub-window it merges (`weight`):
/// each call holds Redis for a bounded time (`PFCOUNT` over 30 dense HyperLogLogs took 2 ms
/// here, over 240 12 ms: 64 such reads in one call held Redis for 128 ms). An event's ops on
/// one slot are one call, however many; a read heavier than this goes alone.
pub(super) const METRIC_OPS_PER_CALL: usize = 64;

/// What an op costs a metric call, in plain ops (`METRIC_OPS_PER_CALL`).
fn weight(op: &MetricOp) -> usize {
    if op.read && op.family == MetricFamily::Approx {
        1 + usize::try_from(op.slots).unwrap_or(0)
    } else {
        1
    }
}

/// A bucket of event ids holding more than this many is warned about: past 512 Redis
/// converts it to a hashtable, several times the memory (`dedupe_expected_ids` too small).
pub(super) const EVENT_BUCKET_WARN: i64 = 400;

/// One event's ops (or a chunk of id-less ones) in a metric script call: which ops, in order,
/// and the event they share, if any.
pub(super) struct OpGroup {
    pub(super) ops: Vec<usize>,
    pub(super) event: Option<EventMark>,
}

/// One metric script call: its groups, in order (`scripts::METRIC_BODY`).
pub(super) struct MetricCall {
    pub(super) groups: Vec<OpGroup>,
    /// The ops' `weight`s, summed.
    weight: usize,
}

impl MetricCall {
    /// The call's ops, in order.
    pub(super) fn ops(&self) -> impl Iterator<Item = usize> + '_ {
        self.groups.iter().flat_map(|g| g.ops.iter().copied())
    }
}

/// Groups ops into script calls. Each event's ops on one slot are a group, id-less ones per
/// slot in chunks of at most `METRIC_OPS_PER_CALL` in weight. On a cluster each group is a
/// call of its own (a script's keys must share a slot); on a single node, where a script may
/// touch keys of any slot, an event's ops are one group whatever their slots, and groups
/// share a call, in order, while they weigh at most `METRIC_OPS_PER_CALL` together: a batch
/// of events with a few metrics each costs Redis one call's dispatch, argument and guard
/// for a dozen events instead of one each (a heavier group goes alone).
pub(super) fn metric_calls(ops: &[MetricOp], idx: &[usize], cluster: bool) -> Vec<MetricCall> {
    let mut groups: Vec<(OpGroup, usize)> = Vec::new();
    // (the event's (seq, hash), the slot on a cluster) → its open group.
    type Key = (Option<(u32, i64)>, Option<u16>);
    let mut open: HashMap<Key, usize> = HashMap::new();
    for &i in idx {
        let op = &ops[i];
        let slot = cluster.then(|| key_slot(op.key.as_bytes()));
        let key = (op.event.map(|e| (e.seq, e.hash)), slot);
        let w = weight(op);
        match open.get(&key) {
            Some(&g) if op.event.is_some() || groups[g].1 + w <= METRIC_OPS_PER_CALL => {
                groups[g].0.ops.push(i);
                groups[g].1 += w;
            }
            _ => {
                open.insert(key, groups.len());
                let group = OpGroup {
                    ops: vec![i],
                    event: op.event,
                };
                groups.push((group, w));
            }
        }
    }
    let mut calls: Vec<MetricCall> = Vec::new();
    for (group, w) in groups {
        match calls.last_mut() {
            Some(call) if !cluster && call.weight + w <= METRIC_OPS_PER_CALL => {
                call.groups.push(group);
                call.weight += w;
            }
            _ => calls.push(MetricCall {
                groups: vec![group],
                weight: w,
            }),
        }
    }
    calls
}

/// One new event id in this many looks at its bucket's length in the metric script (which
/// then drops the bucket's expired ids past `purge_from`: `scripts::METRIC_BODY`). 25 is the
/// rate the script had when it chose by the hash's last two decimal digits (0, 32, 64, 96).
const PURGE_EVERY: u64 = 25;

/// How many ids a bucket of event ids holds before a looking id drops its expired ones: 1.28×
/// the live ids it is sized for (`expected_ids` over the keyspace's recorded `buckets`: 64 at
/// `EVENT_IDS_PER_BUCKET`; 256 for the 200 a bucket of keyspaces made before 2026-11-28,
/// which the script had as a constant), within 16–320. A bucket's fill then moves between
/// its live ids and this, ~1.14× on average, so a check scans what the sizing chose rather than up to 256 ids
/// whatever it chose; the top stays under `EVENT_BUCKET_WARN`, which is about live ids.
pub(super) fn purge_from(expected_ids: u64, buckets: u32) -> u32 {
    let live = expected_ids as f64 / f64::from(buckets.max(1));
    (live * 1.28).ceil().clamp(16.0, 320.0) as u32
}

/// Whether the new event id with keyed hash `hash` is one of those: by the hash, so a replay
/// of an id decides the same.
pub(super) fn looks_at_fill(hash: i64) -> bool {
    hash.unsigned_abs().is_multiple_of(PURGE_EVERY)
}

/// Writing the metric script's MessagePack argument: writes to a `Vec` cannot fail.
mod pack {
    use std::io::Write;

    pub fn text(out: &mut Vec<u8>, s: &str) {
        rmp::encode::write_str(out, s).expect("writing to a Vec");
    }

    /// `n` as a decimal string (what a Redis command takes), without a `String` for it.
    pub fn decimal(out: &mut Vec<u8>, n: impl std::fmt::Display) {
        let mut digits = std::io::Cursor::new([0u8; 24]);
        write!(digits, "{n}").expect("an integer fits 24 digits");
        let len = digits.position() as usize;
        let digits = &digits.get_ref()[..len];
        text(out, std::str::from_utf8(digits).expect("digits are ASCII"));
    }

    pub fn int(out: &mut Vec<u8>, n: i64) {
        rmp::encode::write_sint(out, n).expect("writing to a Vec");
    }
}

/// The metric script's family number (`scripts::METRIC_BODY`).
fn family_number(f: MetricFamily) -> i64 {
    match f {
        MetricFamily::Sum => 1,
        MetricFamily::Avg => 2,
        MetricFamily::Min => 3,
        MetricFamily::Max => 4,
        MetricFamily::Distinct => 5,
        MetricFamily::Approx => 6,
    }
}

/// Packs one op's values into the metric script's argument (`scripts::METRIC_BODY`: only
/// what the op uses, 4–7 values for an update).
fn pack_op(blob: &mut Vec<u8>, op: &MetricOp) {
    let head = family_number(op.family)
        + if op.update.is_some() { 8 } else { 0 }
        + if op.read { 16 } else { 0 };
    pack::int(blob, head);
    if op.family == MetricFamily::Distinct {
        pack::int(blob, op.cap.into());
    }
    if let Some((sub, v)) = op.update {
        // AVG keeps sub-window i in the fields 2i (sum) and 2i + 1 (count).
        if op.family == MetricFamily::Avg {
            pack::decimal(blob, 2 * sub);
            pack::decimal(blob, 2 * sub + 1);
        } else {
            pack::decimal(blob, sub);
        }
        pack::decimal(blob, v);
        pack::decimal(blob, op.key_expire_at().unwrap_or(0));
        if op.family != MetricFamily::Approx {
            pack::int(blob, op.slots);
            pack::int(blob, op.trim_hi);
        }
    }
    if op.read {
        pack::int(blob, op.read_hi);
        pack::int(blob, op.slots);
    }
}

/// Interprets a metric call's reply, per group `{dup, fill, per op: n, n values}`: one answer
/// per op of the call, in order, and the fullest bucket of event ids it met.
pub(super) fn answers(
    ops: &[MetricOp],
    call: &MetricCall,
    v: &redis::Value,
) -> StoreResult<(Vec<MetricAnswer>, i64)> {
    let all = ints(v)?;
    let short = || StoreError::corrupt("short metric reply".into());
    let mut rest = all.as_slice();
    let mut out = Vec::with_capacity(call.weight);
    let mut fullest = 0;
    for group in &call.groups {
        let (&dup, tail) = rest.split_first().ok_or_else(short)?;
        let (&fill, tail) = tail.split_first().ok_or_else(short)?;
        rest = tail;
        fullest = fullest.max(fill);
        for op in group.ops.iter().map(|&i| &ops[i]) {
            let (&n, tail) = rest.split_first().ok_or_else(short)?;
            let n = usize::try_from(n).map_err(|_| short())?;
            let values = tail.get(..n).ok_or_else(short)?;
            rest = &tail[n..];
            out.push(answer(op, dup == 1, values));
        }
    }
    if !rest.is_empty() {
        return Err(StoreError::corrupt("long metric reply".into()));
    }
    Ok((out, fullest))
}

/// One op's answer from the values it read.
pub(super) fn answer(op: &MetricOp, duplicate: bool, rest: &[i64]) -> MetricAnswer {
    if !op.read {
        return MetricAnswer {
            duplicate,
            reading: None,
        };
    }
    let reading = match op.family {
        MetricFamily::Sum => {
            let total: i128 = rest.iter().copied().map(i128::from).sum();
            MetricReading::Sum(total.clamp(i64::MIN.into(), i64::MAX.into()) as i64)
        }
        MetricFamily::Avg => {
            let (mut sum, mut count) = (0i128, 0i64);
            for pair in rest.chunks(2) {
                if let [f, value] = pair {
                    if f % 2 == 0 {
                        sum += i128::from(*value);
                    } else {
                        count += value;
                    }
                }
            }
            MetricReading::Avg {
                sum: sum.clamp(i64::MIN.into(), i64::MAX.into()) as i64,
                count,
            }
        }
        MetricFamily::Min => MetricReading::Extreme(rest.iter().copied().min()),
        MetricFamily::Max => MetricReading::Extreme(rest.iter().copied().max()),
        MetricFamily::Distinct | MetricFamily::Approx => MetricReading::Distinct {
            count: rest.first().copied().unwrap_or(0),
            capped: rest.get(1) == Some(&1),
        },
    };
    MetricAnswer {
        duplicate,
        reading: Some(reading),
    }
}

impl RedisStore {
    /// The metric ops at `idx` that update: with other requests' in a shared call when they
    /// may wait for one (one node, `coalesce`), else `metric_updates_direct`. (index,
    /// answer) each.
    pub(super) async fn metric_updates(
        &self,
        ops: &[MetricOp],
        idx: Vec<usize>,
        deadline: Deadline,
    ) -> StoreResult<Vec<(usize, MetricAnswer)>> {
        if let Some(co) = &self.coalescer
            && Coalescer::takes(idx.iter().map(|&i| &ops[i]))
        {
            let answers = self.coalesced_updates(co, ops, &idx, deadline).await?;
            return Ok(idx.into_iter().zip(answers).collect());
        }
        self.metric_updates_direct(ops, idx, deadline).await
    }

    /// The metric ops at `idx` that update, in calls of `metric_calls`: refused early or
    /// written on the write path, then waited for. (index, answer) each.
    pub(super) async fn metric_updates_direct(
        &self,
        ops: &[MetricOp],
        idx: Vec<usize>,
        deadline: Deadline,
    ) -> StoreResult<Vec<(usize, MetricAnswer)>> {
        if idx.is_empty() {
            return Ok(Vec::new());
        }
        let topology = self.monitor.topology();
        let calls = metric_calls(ops, &idx, self.conn.is_cluster());
        let now = now_ms();
        let script = &self.metric_scripts.write;
        // Each call checks the keyspace id before it writes (`METRIC_BODY`'s guard), in the
        // meta hash on one node, in its slot's shard marker on a cluster (`shards`): updates
        // that reach a keyspace or shard lost meanwhile are neither applied nor acknowledged.
        let cmd = |c: usize| self.metric_call_cmd(script, ops, &calls[c], now, true);
        let mut cmds: Vec<Keyed> = (0..calls.len()).map(cmd).collect();
        // The keys of a call share its slot (on a cluster), so its routing key stands for it.
        let mut session = self
            .session(
                &topology,
                cmds.iter().map(|(route, _)| route.as_slice()),
                self.write_replicas,
                deadline,
            )
            .await?;
        let r = async {
            let mut out = Vec::with_capacity(idx.len());
            let mut pending: Vec<usize> = (0..calls.len()).collect();
            for attempt in 0..2 {
                // Built once; only a retry after `NOSCRIPT` builds its calls again.
                let batch = std::mem::take(&mut cmds);
                let batch = if attempt == 0 {
                    batch
                } else {
                    pending.iter().map(|&c| cmd(c)).collect()
                };
                let replies = session.commit(batch, false).await?;
                let again =
                    self.sort_replies(ops, &calls, &pending, replies, attempt == 0, &mut out)?;
                if again.is_empty() {
                    break;
                }
                self.load_scripts().await?;
                pending = again;
            }
            Ok(out)
        }
        .await;
        self.noted(r)
    }

    /// The metric ops at `idx` that only read, in calls of `metric_calls`, on the read path
    /// (with the read-only script unless the call counts a HyperLogLog). (index, answer) each.
    /// On an HTTP worker that path is the worker's own connection, as for a check
    /// (`worker_conn`): over the shared one, a `POST /v1/features` hopped threads twice.
    pub(super) async fn metric_reads(
        &self,
        ops: &[MetricOp],
        idx: Vec<usize>,
    ) -> StoreResult<Vec<(usize, MetricAnswer)>> {
        let calls = metric_calls(ops, &idx, self.conn.is_cluster());
        let now = now_ms();
        let mut out = Vec::with_capacity(idx.len());
        let mut pending: Vec<usize> = (0..calls.len()).collect();
        for attempt in 0..2 {
            if pending.is_empty() {
                break;
            }
            let mut cmds: Vec<Keyed> = pending
                .iter()
                .map(|&c| {
                    // `PFCOUNT` is a write command (it caches the count in the HyperLogLog):
                    // no `no-writes` script may call it.
                    let approx = calls[c]
                        .ops()
                        .any(|i| ops[i].family == MetricFamily::Approx);
                    let s = &self.metric_scripts;
                    let script = if approx { &s.write } else { &s.read };
                    self.metric_call_cmd(script, ops, &calls[c], now, false)
                })
                .collect();
            // With the keyspace probe, as every read: counts read from a keyspace lost
            // meanwhile (Redis restarted empty: every count zero) are never answered. First
            // (the shard markers, on a cluster, after the calls, as every read's).
            let slots = self.slots_of(cmds.iter());
            cmds.insert(0, self.keyspace_probe());
            cmds.extend(slots.iter().map(|&s| self.shard_probe(s)));
            let mut replies = self.reads().run(cmds).await.map_err(unavailable)?;
            let shards = replies
                .split_off(replies.len().saturating_sub(slots.len()))
                .into_iter()
                .collect::<RedisResult<Vec<_>>>()
                .map_err(unavailable)?;
            let mut replies = replies.into_iter();
            let probe = replies.next().transpose().map_err(unavailable)?;
            self.probed(probe.as_ref())?;
            self.shards_probed(&slots, &shards)?;
            let again =
                self.sort_replies(ops, &calls, &pending, replies, attempt == 0, &mut out)?;
            if !again.is_empty() {
                self.load_scripts().await?;
            }
            pending = again;
        }
        Ok(out)
    }

    /// Sorts the replies to the calls `pending`: each answer into `out`, and the calls that did
    /// not run for want of their script (`NOSCRIPT`, on a `first` attempt only) returned, to be
    /// sent again once the scripts are loaded. Only calls that did not run are sent again
    /// (each records its event); any other error fails the whole read or update.
    fn sort_replies(
        &self,
        ops: &[MetricOp],
        calls: &[MetricCall],
        pending: &[usize],
        replies: impl IntoIterator<Item = RedisResult<redis::Value>>,
        first: bool,
        out: &mut Vec<(usize, MetricAnswer)>,
    ) -> StoreResult<Vec<usize>> {
        let mut again = Vec::new();
        for (&c, reply) in pending.iter().zip(replies) {
            match reply {
                Ok(v) => out.extend(self.call_answers(ops, &calls[c], &v)?),
                Err(e) if first && is_noscript(&e) => again.push(c),
                Err(e) if is_lost(&e) => {
                    let more = "; the updates were refused before any was applied";
                    let first = calls[c].ops().next().map(|i| ops[i].key.as_bytes());
                    return Err(self.lost_at(first.unwrap_or_default(), more));
                }
                Err(e) => return Err(unavailable(e)),
            }
        }
        Ok(again)
    }

    /// The answers of one call's reply, by op index; warns (at most once a minute) when the
    /// event's bucket is filling past what keeps it a listpack.
    pub(super) fn call_answers(
        &self,
        ops: &[MetricOp],
        call: &MetricCall,
        v: &redis::Value,
    ) -> StoreResult<Vec<(usize, MetricAnswer)>> {
        let (answers, fill) = answers(ops, call, v)?;
        if fill > EVENT_BUCKET_WARN {
            static LAST: AtomicI64 = AtomicI64::new(0);
            let now = now_ms();
            let last = LAST.load(Ordering::Relaxed);
            if now - last > 60_000
                && LAST
                    .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                tracing::warn!(
                    fill,
                    buckets = self.layout.event_buckets(),
                    "a bucket of event ids holds more than {EVENT_BUCKET_WARN} live ids: past \
                     512 Redis keeps it as a hashtable, several times the memory. The keyspace \
                     was sized (dedupe_expected_ids) for fewer ids than it remembers"
                );
            }
        }
        Ok(call.ops().zip(answers).collect())
    }

    /// Runs a definition script (sent whole: rare, and immune to a flushed script cache) on
    /// the write path, after `DEFINITION_GUARD`: `args` (the first is the definition's id),
    /// then the channel and the message naming the definition, then the keyspace id.
    pub(super) async fn definition_call(
        &self,
        kind: DefinitionKind,
        script: &str,
        args: &[&str],
        deadline: Deadline,
    ) -> StoreResult<redis::Value> {
        let key = self.layout.definitions_key(kind.as_str());
        let topology = self.monitor.topology();
        let mut session = self
            .session(&topology, [key.as_bytes()], self.write_replicas, deadline)
            .await?;
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(format!("{DEFINITION_GUARD}{script}"))
            .arg(2)
            .arg(&key)
            .arg(self.guard_key(key.as_bytes()));
        for a in args {
            cmd.arg(*a);
        }
        cmd.arg(self.layout.channel())
            .arg(Invalidation::definition(kind, args[0]).encode())
            .arg(&self.keyspace_id);
        let r = async {
            match first(
                session
                    .commit(vec![(key.clone().into_bytes(), cmd)], false)
                    .await?,
            )? {
                Err(e) if is_lost(&e) => {
                    Err(self.lost_at(key.as_bytes(), "; the definition was refused unwritten"))
                }
                r => r.map_err(unavailable),
            }
        }
        .await;
        self.noted(r)
    }

    /// One metric call's `EVALSHA` of `script` (see `scripts::METRIC_BODY` for the
    /// arguments), and the key it is routed by: its first group's bucket of event ids (in the
    /// slot of the call's keys on a cluster), or its first op's key when that group has no
    /// event.
    pub(super) fn metric_call_cmd(
        &self,
        script: &Script,
        ops: &[MetricOp],
        call: &MetricCall,
        now_ms: i64,
        guard: bool,
    ) -> Keyed {
        let cluster = self.conn.is_cluster();
        let mut keys: Vec<String> = Vec::with_capacity(call.weight + call.groups.len() + 1);
        // A sequence of MessagePack values (see `scripts::METRIC_BODY` for its layout).
        let mut blob = Vec::with_capacity(16 + call.groups.len() * 32 + call.weight * 40);
        pack::int(&mut blob, ExpiryCode::script_now(now_ms));
        pack::int(&mut blob, i64::from(rand::random::<u8>() % 8));
        for group in &call.groups {
            let first = &ops[group.ops[0]].key;
            match group.event {
                Some(e) => {
                    let slot = cluster.then(|| key_slot(first.as_bytes()));
                    keys.push(self.layout.event_bucket_key(e.hash, slot));
                    let until =
                        ExpiryCode::encode(e.keep_until_ms).map_or(u32::MAX, ExpiryCode::get);
                    pack::decimal(&mut blob, e.hash);
                    pack::decimal(&mut blob, until);
                }
                None => {
                    keys.push(first.clone());
                    pack::text(&mut blob, "");
                    pack::text(&mut blob, "");
                }
            }
            let looks = group.event.is_some_and(|e| looks_at_fill(e.hash));
            pack::int(&mut blob, if looks { self.id_purge_from.into() } else { 0 });
            pack::int(&mut blob, group.ops.len() as i64);
            for &i in &group.ops {
                let op = &ops[i];
                if op.family == MetricFamily::Approx {
                    let sub = op.update.map_or(op.read_hi, |(s, _)| s);
                    keys.push(self.layout.metric_sub_key(&op.key, sub));
                    if op.read {
                        let lo = op.read_hi - op.slots + 1;
                        keys.extend(
                            (lo..=op.read_hi).map(|i| self.layout.metric_sub_key(&op.key, i)),
                        );
                    }
                } else {
                    keys.push(op.key.clone());
                }
                pack_op(&mut blob, op);
            }
        }
        let first = &ops[call.groups[0].ops[0]].key;
        if guard {
            keys.push(self.guard_key(first.as_bytes()));
        }
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash())
            .arg(keys.len())
            .arg(&keys)
            .arg(blob);
        if guard {
            cmd.arg(&self.keyspace_id);
        }
        (keys.swap_remove(0).into_bytes(), cmd)
    }
}

#[async_trait]
impl MetricStore for RedisStore {
    async fn metric_ops(
        &self,
        ops: &[MetricOp],
        deadline: Deadline,
    ) -> StoreResult<Vec<MetricAnswer>> {
        // A lost keyspace has no counts to read and keeps none written.
        self.unless_lost(ops.iter().any(|o| o.update.is_some()))?;
        // Updates are writes (their own connections, refusal, WAIT); reads stay on the read
        // path. Both go at once.
        let (updates, reads): (Vec<usize>, Vec<usize>) =
            (0..ops.len()).partition(|&i| ops[i].update.is_some());
        let (written, read) = futures::join!(
            self.metric_updates(ops, updates, deadline),
            self.metric_reads(ops, reads)
        );
        in_order(written?.into_iter().chain(read?), ops.len())
    }
}

/// (index, answer) pairs of `n` ops as the answers in index order. One missing (its call
/// never ran: the scripts still not loaded after a reload) makes the call unavailable.
pub(super) fn in_order(
    answers: impl IntoIterator<Item = (usize, MetricAnswer)>,
    n: usize,
) -> StoreResult<Vec<MetricAnswer>> {
    let mut out: Vec<Option<MetricAnswer>> = vec![None; n];
    for (i, a) in answers {
        if let Some(o) = out.get_mut(i) {
            *o = Some(a);
        }
    }
    out.into_iter()
        .map(|r| r.ok_or_else(|| StoreError::unavailable("metric scripts not loaded".into())))
        .collect()
}

impl RedisStore {
    /// One read of `kind`'s definitions hash (`build` writes the command on its key) behind
    /// the keyspace probe: a keyspace lost (Redis restarted empty, flushed) reads as an
    /// error, never as no definitions, so an instance keeps what it loaded (and refuses
    /// events while it is lost) instead of forgetting every metric and taking events that
    /// count nowhere.
    async fn definitions_read(
        &self,
        kind: DefinitionKind,
        build: impl FnOnce(&mut redis::Cmd, &str),
    ) -> StoreResult<redis::Value> {
        self.unless_lost(false)?;
        let key = self.layout.definitions_key(kind.as_str());
        let mut cmd = redis::Cmd::new();
        build(&mut cmd, &key);
        let mut cmds = vec![(key.into_bytes(), cmd)];
        let probes = self.add_probes(&mut cmds);
        let mut replies = self
            .operator_reads()
            .run_all(cmds)
            .await
            .map_err(unavailable)?;
        self.take_probes(&probes, &mut replies)?;
        replies
            .pop()
            .ok_or_else(|| StoreError::corrupt("no reply to a definitions read".into()))
    }
}

/// A definitions hash's value, `<version>\n<fingerprint>\n<body>`, as the definition it
/// holds; `None` for a deleted one (its version kept, no fingerprint).
fn stored_definition(id: String, value: &str) -> StoreResult<Option<StoredDefinition>> {
    let mut parts = value.splitn(3, '\n');
    let (Some(version), Some(fingerprint), Some(body)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(StoreError::corrupt(format!("definition {id}: {value:?}")));
    };
    if fingerprint.is_empty() {
        return Ok(None);
    }
    let version = version
        .parse()
        .map_err(|_| StoreError::corrupt(format!("definition {id}: version {version:?}")))?;
    Ok(Some(StoredDefinition {
        id,
        version,
        body: body.to_owned(),
    }))
}

#[async_trait]
impl DefinitionStore for RedisStore {
    async fn definitions(&self, kind: DefinitionKind) -> StoreResult<Vec<StoredDefinition>> {
        let v = self
            .definitions_read(kind, |c, key| {
                c.arg("HGETALL").arg(key);
            })
            .await?;
        let all: Vec<(String, String)> = redis::from_redis_value(v)
            .map_err(|e| StoreError::corrupt(format!("definitions: {e}")))?;
        let mut out = Vec::new();
        for (id, value) in all {
            out.extend(stored_definition(id, &value)?);
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    async fn definition(
        &self,
        kind: DefinitionKind,
        id: &str,
    ) -> StoreResult<Option<StoredDefinition>> {
        let v = self
            .definitions_read(kind, |c, key| {
                c.arg("HGET").arg(key).arg(id);
            })
            .await?;
        let value: Option<String> = redis::from_redis_value(v)
            .map_err(|e| StoreError::corrupt(format!("definition {id}: {e}")))?;
        match value {
            Some(value) => stored_definition(id.to_owned(), &value),
            None => Ok(None),
        }
    }

    async fn put_definition(&self, d: NewDefinition<'_>, deadline: Deadline) -> StoreResult<u64> {
        self.unless_lost(true)?;
        let args = [d.id, d.fingerprint, d.body];
        let v = self
            .definition_call(d.kind, PUT_DEFINITION, &args, deadline)
            .await?;
        redis::from_redis_value(v)
            .map_err(|e| StoreError::corrupt(format!("definition version: {e}")))
    }

    async fn delete_definition(
        &self,
        kind: DefinitionKind,
        id: &str,
        deadline: Deadline,
    ) -> StoreResult<bool> {
        self.unless_lost(true)?;
        let v = self
            .definition_call(kind, DELETE_DEFINITION, &[id], deadline)
            .await?;
        let n: i64 = redis::from_redis_value(v)
            .map_err(|e| StoreError::corrupt(format!("definition delete: {e}")))?;
        Ok(n == 1)
    }
}

/// A SUM update of `key` by the event of `seq` and hash `hash`: the shape the grouping
/// tests here and in `coalesce` build calls of.
#[cfg(test)]
pub(super) fn sum_update(key: String, seq: u32, hash: i64) -> MetricOp {
    MetricOp {
        family: MetricFamily::Sum,
        key,
        slots: 60,
        resolution_ms: 60_000,
        update: Some((1, 1)),
        read_hi: 0,
        trim_hi: 1,
        cap: 0,
        event: Some(EventMark {
            hash,
            keep_until_ms: 1,
            seq,
        }),
        read: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads are grouped by weight: a HyperLogLog's window counts each sub-window it merges,
    /// so heavy reads go a few to a call, or alone, while plain ones go 64 to a call.
    #[test]
    fn heavy_reads_share_fewer_calls() {
        let read = |family, slots| MetricOp {
            family,
            key: "k".into(),
            slots,
            resolution_ms: 1,
            update: None,
            read_hi: 0,
            trim_hi: 0,
            cap: 0,
            event: None,
            read: true,
        };
        let sizes = |ops: &[MetricOp]| -> Vec<usize> {
            let idx: Vec<usize> = (0..ops.len()).collect();
            metric_calls(ops, &idx, false)
                .iter()
                .map(|c| c.ops().count())
                .collect()
        };
        let plain = vec![read(MetricFamily::Sum, 240); 130];
        assert_eq!(sizes(&plain), [64, 64, 2]);
        let approx = vec![read(MetricFamily::Approx, 30); 5];
        assert_eq!(sizes(&approx), [2, 2, 1], "31 each, 64 a call");
        let wide = vec![read(MetricFamily::Approx, 240), read(MetricFamily::Sum, 1)];
        assert_eq!(
            sizes(&wide),
            [1, 1],
            "a read heavier than a call goes alone"
        );
    }

    /// On one node events share calls, whole and in order, up to `METRIC_OPS_PER_CALL`
    /// ops; on a cluster each event's ops on one slot are a call of their own.
    #[test]
    fn events_share_calls_on_one_node_only() {
        let update = |key: String, seq: u32| sum_update(key, seq, i64::from(seq) * 7919);
        // 30 events of 5 updates each, on keys of 5 entities (other slots).
        let ops: Vec<MetricOp> = (0..30u32)
            .flat_map(|e| (0..5).map(move |m| update(format!("nl:{{e{e}m{m}}}"), e)))
            .collect();
        let idx: Vec<usize> = (0..ops.len()).collect();
        let one = metric_calls(&ops, &idx, false);
        let shape: Vec<Vec<usize>> = one
            .iter()
            .map(|c| c.groups.iter().map(|g| g.ops.len()).collect())
            .collect();
        assert_eq!(shape, [vec![5; 12], vec![5; 12], vec![5; 6]]);
        let order: Vec<usize> = one.iter().flat_map(MetricCall::ops).collect();
        assert_eq!(order, idx, "every op once, in order");
        for g in one.iter().flat_map(|c| &c.groups) {
            assert!(
                g.ops.iter().all(|&i| ops[i].event == g.event),
                "a group is one event"
            );
        }
        let cluster = metric_calls(&ops, &idx, true);
        assert!(cluster.iter().all(|c| c.groups.len() == 1));
        let slots: std::collections::HashSet<(u32, u16)> = ops
            .iter()
            .map(|o| (o.event.unwrap().seq, key_slot(o.key.as_bytes())))
            .collect();
        assert_eq!(cluster.len(), slots.len(), "one call per event and slot");
        // An event of more ops than a call holds goes whole, alone.
        let mut wide: Vec<MetricOp> = (0..70).map(|m| update(format!("w{m}"), 0)).collect();
        wide.push(update("x".into(), 1));
        let idx: Vec<usize> = (0..wide.len()).collect();
        let sizes: Vec<usize> = metric_calls(&wide, &idx, false)
            .iter()
            .map(|c| c.ops().count())
            .collect();
        assert_eq!(sizes, [70, 1]);
    }

    #[test]
    fn a_bucket_purges_past_its_sizing() {
        assert_eq!(
            purge_from(10_000_000, 50_000),
            256,
            "200 a bucket: as before"
        );
        assert_eq!(
            purge_from(10_000_000, 100_000),
            128,
            "100 a bucket: as before"
        );
        let new = Layout::event_buckets_for(10_000_000);
        assert_eq!(purge_from(10_000_000, new), 64);
        assert_eq!(purge_from(100, 1), 128);
        assert_eq!(purge_from(1, 1), 16);
        assert_eq!(purge_from(100_000_000, 50_000), 320, "under the warning");
        assert_eq!(purge_from(5, 0), 16, "no division by zero");
    }

    /// One new id in `PURGE_EVERY` looks at its bucket's length, negative hashes as often.
    #[test]
    fn one_id_in_purge_every_looks_at_the_fill() {
        let looking = (-5_000i64..5_000).filter(|&h| looks_at_fill(h)).count();
        assert_eq!(looking, 10_000 / PURGE_EVERY as usize);
    }

    /// Integers go to the script as the decimal strings `to_string` would make, each a
    /// MessagePack string, at the extremes too.
    #[test]
    fn decimals_are_packed_as_their_text() {
        for n in [0i64, 7, -1, 498_829, 1_795_878_000_000, i64::MIN, i64::MAX] {
            let mut ours = Vec::new();
            pack::decimal(&mut ours, n);
            let mut expected = Vec::new();
            rmp::encode::write_str(&mut expected, &n.to_string()).unwrap();
            assert_eq!(ours, expected, "{n}");
        }
        let mut ours = Vec::new();
        pack::decimal(&mut ours, u32::MAX);
        assert_eq!(rmp::decode::read_str_len(&mut ours.as_slice()).unwrap(), 10);
    }
}
