//! Shard markers: on a cluster, a shard that lost its data is noticed as a lost keyspace
//! (`layout`, *The keyspace id*).
//!
//! The meta hash holds the keyspace id on one shard only. Another shard restarted without its
//! data, flushed, or failed over to a replica that never synced, leaves it in place, and its
//! buckets would read as empty: every entry there "not listed", every count there 0. So every
//! hash slot holds a marker with the keyspace id (`Layout::shard_marker_key`), and:
//!
//! * every read carries, after its own commands, the keyspace probe and `HGET <marker>
//!   keyspace_id` for each slot it read ([`Probes`]). A cluster read is one pipeline per slot,
//!   so each marker is read on the same connection right after that slot's reads: had the
//!   shard lost its data before them, the marker is missing too (markers are only ever
//!   written at open), and the read is not taken as the keyspace's state;
//! * a write's `MULTI` on a slot reads that slot's marker with it, and a metric script call
//!   checks it before it writes (`scripts::METRIC_BODY`'s guard);
//! * `verify_keyspace` (every second) reads the markers of slots already seen lost and the
//!   next [`SWEEP`] slots in turn, so a loss is seen within a minute with no traffic at all,
//!   and a restore (the shard's RDB or AOF brings its markers back) is seen within a second;
//! * at open, a keyspace that records `shard_markers` has every marker read: one missing
//!   refuses the start (as a lost meta hash does); one that does not (made by an older build,
//!   or just made) has them written, and records it, unless some slot holds the marker of
//!   another keyspace: then the meta hash's shard lost its data while no instance ran, and
//!   the open is refused (`refuse_other_keyspace`).
//!
//! On one node there is nothing to add: the meta hash shares the node's fate.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;

use redis::{RedisResult, Value};

use super::conn::{Keyed, RedisConn};
use super::scripts::RETIRE_NEW_META;
use super::{RedisStore, unavailable};
use crate::store::layout::{CLUSTER_SLOTS, Layout, key_slot};
use crate::store::{StoreError, StoreResult};

/// Slots whose markers `verify_keyspace` reads each time besides those seen lost: the whole
/// cluster once every 64 calls (a minute).
pub(super) const SWEEP: usize = 256;

/// The meta hash's field that says the keyspace's shard markers were written.
const RECORDED: &str = "shard_markers";

/// The probes one read or write carries (see the module docs): the keyspace probe, then the
/// shard marker of each slot in `shards`.
pub(super) struct Probes {
    shards: Vec<u16>,
}

impl Probes {
    /// How many commands they add.
    pub(super) fn len(&self) -> usize {
        1 + self.shards.len()
    }
}

impl RedisStore {
    /// `HGET <marker of slot> keyspace_id`.
    pub(super) fn shard_probe(&self, slot: u16) -> Keyed {
        marker_cmd(&self.layout, slot, "HGET")
    }

    /// The distinct slots of `cmds`' keys on a cluster; none on one node.
    pub(super) fn slots_of<'a>(&self, cmds: impl IntoIterator<Item = &'a Keyed>) -> Vec<u16> {
        if !self.conn.is_cluster() {
            return Vec::new();
        }
        let slots: BTreeSet<u16> = cmds.into_iter().map(|(k, _)| key_slot(k)).collect();
        slots.into_iter().collect()
    }

    /// Appends to `cmds` what a read carries after its commands: the keyspace probe, then on
    /// a cluster the marker of every slot `cmds` read.
    pub(super) fn add_probes(&self, cmds: &mut Vec<Keyed>) -> Probes {
        let shards = self.slots_of(cmds.iter());
        cmds.push(self.keyspace_probe());
        cmds.extend(shards.iter().map(|&s| self.shard_probe(s)));
        Probes { shards }
    }

    /// Takes the replies of `probes` off the end of `replies` and checks them: `Err` (the
    /// keyspace marked lost) if any says the keyspace or a shard is not the one opened.
    pub(super) fn take_probes(&self, probes: &Probes, replies: &mut Vec<Value>) -> StoreResult<()> {
        let at = replies.len().checked_sub(probes.len()).ok_or_else(|| {
            StoreError::corrupt(format!(
                "{} replies to a read with its probes",
                replies.len()
            ))
        })?;
        let tail = replies.split_off(at);
        self.probed(tail.first())?;
        self.shards_probed(&probes.shards, &tail[1..])
    }

    /// `take_probes` for a read whose commands answer one result each.
    pub(super) fn take_probe_results(
        &self,
        probes: &Probes,
        replies: &mut Vec<RedisResult<Value>>,
    ) -> StoreResult<()> {
        // A short reply leaves a short tail, which `take_probes` refuses.
        let at = replies.len().saturating_sub(probes.len());
        let mut tail = replies
            .split_off(at)
            .into_iter()
            .collect::<RedisResult<Vec<Value>>>()
            .map_err(unavailable)?;
        self.take_probes(probes, &mut tail)
    }

    /// Checks the replies to the markers of `slots`, in order.
    pub(super) fn shards_probed(&self, slots: &[u16], replies: &[Value]) -> StoreResult<()> {
        if replies.len() != slots.len() {
            return Err(StoreError::corrupt(format!(
                "{} replies to {} shard markers",
                replies.len(),
                slots.len()
            )));
        }
        for (&slot, v) in slots.iter().zip(replies) {
            let id: Option<String> = redis::from_redis_value_ref(v)
                .map_err(|e| StoreError::corrupt(format!("shard marker: {e}")))?;
            match id {
                Some(id) if id == self.keyspace_id => {}
                Some(other) => {
                    self.remember_lost_slot(slot);
                    return Err(self.mark_lost(format!(
                        "the marker of hash slot {slot} holds another keyspace (id {other}, not {})",
                        self.keyspace_id
                    )));
                }
                None => return Err(self.shard_gone(slot, "")),
            }
        }
        Ok(())
    }

    /// The marker of `slot` is gone: its shard lost its data, so the keyspace is lost
    /// (`mark_lost`); `more` ends the why.
    pub(super) fn shard_gone(&self, slot: u16, more: &str) -> StoreError {
        self.remember_lost_slot(slot);
        self.mark_lost(format!(
            "the marker of hash slot {slot} is gone (keyspace id {}): the shard holding it \
             restarted without its data, was flushed, or failed over to an empty node{more}",
            self.keyspace_id
        ))
    }

    /// The key a script's guard reads the keyspace id from, for a call on `key`: the shard
    /// marker of its slot on a cluster, else the meta hash.
    pub(super) fn guard_key(&self, key: &[u8]) -> String {
        match self.conn.is_cluster() {
            true => self.layout.shard_marker_key(key_slot(key)),
            false => self.layout.meta_key(),
        }
    }

    /// A script's guard found the keyspace id missing where a call on `key` checked it: the
    /// shard of its slot on a cluster (`shard_gone`), else the keyspace (`gone`).
    pub(super) fn lost_at(&self, key: &[u8], more: &str) -> StoreError {
        match self.conn.is_cluster() {
            true => self.shard_gone(key_slot(key), more),
            false => self.gone(more),
        }
    }

    fn remember_lost_slot(&self, slot: u16) {
        self.lost_slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(slot);
    }

    /// The markers `verify_keyspace` reads this time: those of the slots seen lost, then the
    /// next `SWEEP` in turn (on a cluster; none on one node).
    pub(super) fn slots_to_verify(&self) -> Vec<u16> {
        if !self.conn.is_cluster() {
            return Vec::new();
        }
        let mut slots = self
            .lost_slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let from = self.sweep.fetch_add(SWEEP, Ordering::Relaxed) % usize::from(CLUSTER_SLOTS);
        slots.extend((from..from + SWEEP).map(|s| (s % usize::from(CLUSTER_SLOTS)) as u16));
        slots.into_iter().collect()
    }

    /// The keyspace is back: forget the slots seen lost.
    pub(super) fn forget_lost_slots(&self) {
        self.lost_slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

/// At open, on a cluster (see the module docs): a keyspace that records its markers has every
/// one read, and a missing one refuses the start unless `accept` (`namelist-tools keyspace
/// create --lost-for-good`: the lost slots are marked again, empty); one that does not record
/// them has them all written, then records it. Returns how many markers were written.
pub(super) async fn open_shard_markers(
    conn: &RedisConn,
    layout: &Layout,
    keyspace_id: &str,
    accept: bool,
    created: bool,
) -> StoreResult<usize> {
    let meta = layout.meta_key();
    let recorded: Option<String> = conn
        .run_all(vec![(meta.clone().into_bytes(), {
            let mut c = redis::cmd("HGET");
            c.arg(&meta).arg(RECORDED);
            c
        })])
        .await
        .map_err(unavailable)?
        .first()
        .map(redis::from_redis_value_ref)
        .transpose()
        .map_err(|e| StoreError::corrupt(format!("{meta} {RECORDED}: {e}")))?
        .flatten();
    let slots: Vec<u16> = (0..CLUSTER_SLOTS).collect();
    let write = if recorded.is_some() {
        let lost: Vec<u16> = read_markers(conn, layout)
            .await?
            .into_iter()
            .zip(&slots)
            .filter(|(id, _)| id.as_deref() != Some(keyspace_id))
            .map(|(_, &slot)| slot)
            .collect();
        if lost.is_empty() {
            return Ok(0);
        }
        if !accept {
            return Err(StoreError::Keyspace(format!(
                "the data of {} hash slot(s) of the keyspace at prefix {} (id {keyspace_id}) is \
                 gone, {}: their shard markers are missing (a shard restarted without its data, \
                 was flushed, or failed over to an empty replica), and their entries would read \
                 as not listed. Restore that shard's data (RDB or AOF) and start again, or \
                 accept the loss with `namelist-tools keyspace create --lost-for-good` and load \
                 the lists again",
                lost.len(),
                layout.prefix(),
                slot_ranges(&lost)
            )));
        }
        lost
    } else {
        if !accept {
            refuse_other_keyspace(conn, layout, keyspace_id, created).await?;
        }
        slots
    };
    let writes: Vec<Keyed> = write
        .iter()
        .map(|&s| {
            let (key, mut c) = marker_cmd(layout, s, "HSET");
            c.arg(keyspace_id);
            (key, c)
        })
        .collect();
    conn.run_spread(writes).await.map_err(unavailable)?;
    let mut c = redis::cmd("HSET");
    c.arg(&meta).arg(RECORDED).arg(1);
    conn.run_all(vec![(meta.into_bytes(), c)])
        .await
        .map_err(unavailable)?;
    Ok(write.len())
}

/// Before the markers of a keyspace that has none yet are written: refuses if any slot holds
/// the marker of another keyspace. The meta hash is then new, or was never marked, while other
/// shards kept a keyspace's data: the shard of the meta hash restarted without its data (or
/// was flushed, or failed over to an empty replica) while every instance was down, so none
/// saw it vanish and none left the lost marker. Writing the markers would have made every
/// entry of the other shards read as the new, empty keyspace's ("not listed"). If this open
/// made the meta hash (`created`), it is removed again and the lost marker left in its place,
/// holding the other keyspace's id, as a running instance would have left it: the next
/// instance is refused the same way (`OPEN_KEYSPACE`'s -2), and `namelist-tools keyspace
/// create --lost-for-good` makes a new keyspace explicitly.
async fn refuse_other_keyspace(
    conn: &RedisConn,
    layout: &Layout,
    keyspace_id: &str,
    created: bool,
) -> StoreResult<()> {
    let mut slots = Vec::new();
    let mut ids: HashMap<String, usize> = HashMap::new();
    for (slot, id) in (0..CLUSTER_SLOTS).zip(read_markers(conn, layout).await?) {
        if let Some(id) = id.filter(|id| id != keyspace_id) {
            slots.push(slot);
            *ids.entry(id).or_default() += 1;
        }
    }
    // The id most slots hold (one, unless something else wrote markers).
    let Some((other, _)) = ids.into_iter().max_by_key(|(_, n)| *n) else {
        return Ok(());
    };
    let meta = layout.meta_key();
    if created {
        redis::Script::new(RETIRE_NEW_META)
            .key(&meta)
            .key(Layout::lost_marker_key_of(layout.prefix()))
            .arg(keyspace_id)
            .arg(&other)
            .arg(RECORDED)
            .invoke_async::<i64>(&mut conn.clone())
            .await
            .map_err(unavailable)?;
    }
    Err(StoreError::Keyspace(format!(
        "{meta} {}, but {} hash slot(s), {}, hold the shard markers of keyspace {other}: the \
         shard holding {meta} lost its data (restarted without it, was flushed, or failed over \
         to an empty replica) while the other shards kept theirs, and no instance was running \
         to see it. Their entries would read as a new, empty keyspace's (not listed). Restore \
         that shard's data (RDB or AOF) and start again, or make a new, empty keyspace \
         explicitly with `namelist-tools keyspace create --lost-for-good` and load the lists \
         again",
        if created {
            "was missing (not made again)"
        } else {
            "has no shard markers recorded"
        },
        slots.len(),
        slot_ranges(&slots)
    )))
}

/// The keyspace id every slot's marker holds (`None`: missing), slot 0 first: one pipeline
/// per slot range.
async fn read_markers(conn: &RedisConn, layout: &Layout) -> StoreResult<Vec<Option<String>>> {
    let reads = (0..CLUSTER_SLOTS)
        .map(|s| marker_cmd(layout, s, "HGET"))
        .collect();
    conn.run_spread(reads)
        .await
        .map_err(unavailable)?
        .iter()
        .map(|v| {
            redis::from_redis_value_ref(v)
                .map_err(|e| StoreError::corrupt(format!("shard marker: {e}")))
        })
        .collect()
}

/// `<verb> <marker of slot> keyspace_id`, keyed by the marker (`HSET` takes the id after).
fn marker_cmd(layout: &Layout, slot: u16, verb: &str) -> Keyed {
    let key = layout.shard_marker_key(slot);
    let mut c = redis::cmd(verb);
    c.arg(&key).arg("keyspace_id");
    (key.into_bytes(), c)
}

/// `0-5460, 7000` for sorted slots: how an error names them.
fn slot_ranges(slots: &[u16]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < slots.len() {
        let mut j = i;
        while j + 1 < slots.len() && slots[j + 1] == slots[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            format!("slot {}", slots[i])
        } else {
            format!("slots {}-{}", slots[i], slots[j])
        });
        i = j + 1;
    }
    if out.len() > 8 {
        let more = out.len() - 8;
        out.truncate(8);
        out.push(format!("and {more} more ranges"));
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_ranges_name_runs() {
        assert_eq!(
            slot_ranges(&[0, 1, 2, 7, 9, 10]),
            "slots 0-2, slot 7, slots 9-10"
        );
        let many: Vec<u16> = (0..40).map(|i| i * 2).collect();
        assert!(slot_ranges(&many).ends_with("and 32 more ranges"));
    }
}
