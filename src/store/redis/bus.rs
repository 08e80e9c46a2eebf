//! `InvalidationBus` on Redis: the publish commands that ride with writes, and the subscription.

use super::audit::parse_stream;
use super::*;
use crate::store::PartMark;

impl RedisStore {
    /// A write's `PUBLISH` on one node, inside its `MULTI`: only while the keyspace id is
    /// this one (`GUARDED_PUBLISH`), so a write that reached a lost keyspace is announced to
    /// nobody.
    pub(super) fn guarded_publish_cmd(&self, message: &Invalidation) -> Keyed {
        let meta = self.layout.meta_key();
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(GUARDED_PUBLISH)
            .arg(1)
            .arg(&meta)
            .arg(&self.keyspace_id)
            .arg(self.layout.channel())
            .arg(message.encode());
        (meta.into_bytes(), cmd)
    }

    /// `PUBLISH`. On a cluster any node broadcasts it to every subscriber, so it is routed
    /// by `route` (a key the same write touches: it then depends on no other shard); `None`
    /// routes by the channel's name.
    pub(super) fn publish_cmd(&self, message: &Invalidation, route: Option<&[u8]>) -> Keyed {
        let channel = self.layout.channel();
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(&channel).arg(message.encode());
        let key = route.map_or_else(|| channel.into_bytes(), <[u8]>::to_vec);
        (key, cmd)
    }
}

/// Every audit part has a bit in `RedisStore::audit_parts_seen`.
const _: () = assert!(AUDIT_PARTS <= 64);

impl RedisStore {
    /// Every audit part's mark, for `log_mark`. `XINFO STREAM` of a part never written is an
    /// error reply (`no such key`), counted in Redis's `total_error_replies` and
    /// `errorstat_ERR`: asked of 64 parts a second by every instance, a small or new keyspace
    /// would show operators a steady stream of errors. So parts not yet known to exist are
    /// asked `EXISTS` first, and only those that exist `XINFO STREAM`; a missing one is at
    /// zero, as a part with nothing in it (taken at its `EXISTS`, still after the nodes'
    /// ids). A part known to exist is not asked again; one lost since (data loss) answers
    /// `no such key` once, is at zero and is forgotten.
    async fn part_marks(&self) -> StoreResult<Vec<PartMark>> {
        let seen = self.audit_parts_seen.load(Ordering::Relaxed);
        let unknown: Vec<usize> = (0..AUDIT_PARTS).filter(|i| seen & (1 << i) == 0).collect();
        let mut found = 0u64;
        if !unknown.is_empty() {
            let cmds = unknown
                .iter()
                .map(|&i| {
                    Self::keyed(self.layout.audit_part_key(i), |c, key| {
                        c.arg("EXISTS").arg(key);
                    })
                })
                .collect();
            let replies = self.log.run(cmds).await.map_err(unavailable)?;
            for (&i, r) in unknown.iter().zip(replies) {
                if r.map_err(unavailable)? == redis::Value::Int(1) {
                    found |= 1 << i;
                }
            }
        }
        let present = seen | found;
        let asked: Vec<usize> = (0..AUDIT_PARTS)
            .filter(|i| present & (1 << i) != 0)
            .collect();
        let cmds = asked
            .iter()
            .map(|&i| {
                Self::keyed(self.layout.audit_part_key(i), |c, key| {
                    c.arg("XINFO").arg("STREAM").arg(key);
                })
            })
            .collect();
        let replies = self.log.run(cmds).await.map_err(unavailable)?;
        let mut parts = vec![PartMark::default(); AUDIT_PARTS];
        let mut lost = 0u64;
        for (&i, r) in asked.iter().zip(replies) {
            if changelog::no_such_key_reply(&r) {
                lost |= 1 << i;
            }
            parts[i] = changelog::part_mark_of(r)?;
        }
        if found != 0 {
            self.audit_parts_seen.fetch_or(found, Ordering::Relaxed);
        }
        if lost != 0 {
            self.audit_parts_seen.fetch_and(!lost, Ordering::Relaxed);
        }
        Ok(parts)
    }
}

#[async_trait]
impl InvalidationBus for RedisStore {
    async fn subscribe(&self) -> StoreResult<InvalidationStream> {
        Ok(self.subscribe_proven().await?.0)
    }

    async fn subscribe_proven(&self) -> StoreResult<(InvalidationStream, Option<Arc<Liveness>>)> {
        // On a cluster any node delivers every PUBLISH: subscribe to the seeds in turn, so
        // a node that is down (or was failed over) is skipped next time.
        let n = self.pubsub_clients.len().max(1);
        let i = self.pubsub_next.fetch_add(1, Ordering::Relaxed) % n;
        let client =
            self.pubsub_clients.get(i).cloned().ok_or_else(|| {
                StoreError::unavailable("no Redis URL to subscribe through".into())
            })?;
        let connect = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(self.layout.channel()).await?;
            Ok::<_, RedisError>(pubsub)
        };
        let pubsub = tokio::time::timeout(self.pubsub_timeout, connect)
            .await
            .map_err(|_| StoreError::Timeout(self.pubsub_timeout))?
            .map_err(unavailable)?;
        let (mut sink, stream) = pubsub.split();
        // A half-open connection (or a stopped node) delivers nothing and never errors: ping
        // it, leave each answered ping's send time as a proof of delivery (`Liveness`), and
        // end the stream when a ping goes unanswered.
        let (mut dead_tx, dead_rx) = tokio::sync::oneshot::channel::<()>();
        let timeout = self.pubsub_timeout;
        // (The first proof is the subscription itself: the listener starts its clock.)
        let live = Arc::new(Liveness::default());
        let proofs = live.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Liveness::PROOF_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tokio::select! {
                    // The subscriber dropped the stream: stop pinging.
                    _ = dead_tx.closed() => return,
                    _ = tick.tick() => {}
                }
                // In subscribed mode PING answers ["pong", ""], not +PONG.
                let sent = Instant::now();
                let ping = tokio::time::timeout(timeout, sink.ping::<redis::Value>()).await;
                if !matches!(ping, Ok(Ok(_))) {
                    let _ = dead_tx.send(());
                    return;
                }
                proofs.proved(sent);
            }
        });
        let stream = stream
            .take_until(dead_rx)
            .filter_map(|msg| async move { Invalidation::decode(msg.get_payload_bytes()) })
            .boxed();
        Ok((stream, Some(live)))
    }

    async fn publish(&self, message: &Invalidation) -> StoreResult<()> {
        self.conn
            .run_all(vec![self.publish_cmd(message, None)])
            .await
            .map(drop)
            .map_err(unavailable)
    }

    async fn log_mark(&self) -> StoreResult<Option<LogMark>> {
        // The nodes first: a restart after this shows in the next mark's ids.
        let mut nodes = Vec::new();
        let conn = &self.log;
        for target in conn.scan_targets().await.map_err(unavailable)? {
            let info: String = conn
                .on_target(&target, redis::cmd("INFO").arg("server"))
                .await
                .map_err(unavailable)?;
            nodes.push(changelog::run_id(&info)?);
        }
        nodes.sort();
        let parts = self.part_marks().await?;
        Ok(Some(LogMark { parts, nodes }))
    }

    async fn log_read(&self, from: &LogMark, to: Option<&LogMark>) -> StoreResult<Replay> {
        let now = match to {
            Some(to) => to.clone(),
            None => match self.log_mark().await? {
                Some(now) => now,
                None => return Ok(Replay::Gap("no change log".into())),
            },
        };
        let reads = match changelog::replay_reads(from, &now) {
            Ok(r) => r,
            Err(why) => return Ok(Replay::Gap(why)),
        };
        // In rounds of at most `LOG_CHUNK` records over every part: no one reply is large
        // (a burst of writes, a long break), however many records there are.
        let mut records: Vec<Vec<((u64, u64), AuditRecord)>> = vec![Vec::new(); reads.len()];
        let mut next: Vec<Option<changelog::PartRead>> = reads.iter().copied().map(Some).collect();
        loop {
            let active: Vec<usize> = (0..next.len()).filter(|&i| next[i].is_some()).collect();
            if active.is_empty() {
                break;
            }
            let share = (changelog::LOG_CHUNK / active.len() as u64).max(16);
            let asked: Vec<(usize, u64)> = active
                .iter()
                .map(|&i| (i, next[i].map_or(0, |r| r.count.min(share))))
                .collect();
            let cmds = asked
                .iter()
                .map(|&(i, count)| {
                    let read = next[i].expect("active");
                    let (from, to) = read.bounds();
                    Self::keyed(self.layout.audit_part_key(read.part), |c, key| {
                        c.arg("XRANGE")
                            .arg(key)
                            .arg(&from)
                            .arg(&to)
                            .arg("COUNT")
                            .arg(count);
                    })
                })
                .collect();
            let replies = self.log.run_all(cmds).await.map_err(unavailable)?;
            for (&(i, count), reply) in asked.iter().zip(&replies) {
                let got = parse_stream(reply)?;
                let read = next[i].as_mut().expect("active");
                let n = got.len() as u64;
                // A short page: the part holds no more up to the mark (trimmed, if fewer than
                // were added: `replay` sees it).
                let done = n < count || n >= read.count;
                if let Some(((ms, seq), _)) = got.last() {
                    read.from = (*ms, *seq);
                }
                read.count = read.count.saturating_sub(n);
                records[i].extend(got);
                if done {
                    next[i] = None;
                }
            }
        }
        Ok(changelog::replay(&reads, &records, self.layout.buckets()))
    }
}
