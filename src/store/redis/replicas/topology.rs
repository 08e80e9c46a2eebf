//! The picture one probe round of the replica monitor takes, and every decision made from
//! it: `INFO replication` and `CLUSTER SLOTS` parsed, which primary serves a slot, whether a
//! write to some slots may be sent (a fresh picture only: [`STALE_AFTER`]), and which audit
//! part an entry's record goes to. No I/O: the monitor (`replicas`) takes the pictures.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use redis::Value;

use crate::store::Refusal;
use crate::store::layout::{AUDIT_PARTS, CLUSTER_SLOTS, Layout};
use crate::store::redis::reply_text;

/// A snapshot older than this refuses nothing.
pub const STALE_AFTER: Duration = Duration::from_secs(3);

/// What one primary's `INFO replication` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicationInfo {
    /// `role:master`.
    pub primary: bool,
    /// `slaveN` lines with `state=online`: what `WAIT` can count.
    pub online_replicas: u32,
}

/// Parses `INFO replication`. An error when there is no `role` line.
pub fn parse_replication_info(text: &str) -> Result<ReplicationInfo, String> {
    let mut role = None;
    let mut online = 0u32;
    for line in text.lines().map(str::trim) {
        if let Some(r) = line.strip_prefix("role:") {
            role = Some(r == "master");
        } else if let Some((name, fields)) = line.split_once(':')
            && name
                .strip_prefix("slave")
                .is_some_and(|n| n.parse::<u32>().is_ok())
            && fields.split(',').any(|f| f == "state=online")
        {
            online += 1;
        }
    }
    let primary = role.ok_or_else(|| "INFO replication has no role line".to_owned())?;
    Ok(ReplicationInfo {
        primary,
        online_replicas: online,
    })
}

/// One contiguous range of slots and the address of the primary serving it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRange {
    pub start: u16,
    pub end: u16,
    /// `host:port`.
    pub primary: String,
}

/// Parses a `CLUSTER SLOTS` reply: `[[start, end, [host, port, id, …], replicas…], …]`. A
/// host of `""` or `"?"` (unknown endpoint) means the node that answered (`asked_host`).
pub fn parse_cluster_slots(reply: &Value, asked_host: &str) -> Result<Vec<SlotRange>, String> {
    let Value::Array(ranges) = reply else {
        return Err(format!("CLUSTER SLOTS: not an array: {reply:?}"));
    };
    let int = |v: &Value, what: &str| -> Result<i64, String> {
        match v {
            Value::Int(i) => Ok(*i),
            other => Err(format!(
                "CLUSTER SLOTS: {what} is not an integer: {other:?}"
            )),
        }
    };
    let mut out = Vec::with_capacity(ranges.len());
    for r in ranges {
        let Value::Array(parts) = r else {
            return Err(format!("CLUSTER SLOTS: a range is not an array: {r:?}"));
        };
        let [start, end, primary, ..] = parts.as_slice() else {
            return Err(format!("CLUSTER SLOTS: a range of {} items", parts.len()));
        };
        let slot = |v: &Value, what: &str| -> Result<u16, String> {
            u16::try_from(int(v, what)?)
                .ok()
                .filter(|s| *s < CLUSTER_SLOTS)
                .ok_or_else(|| format!("CLUSTER SLOTS: {what} out of range: {v:?}"))
        };
        let (start, end) = (slot(start, "start")?, slot(end, "end")?);
        if start > end {
            return Err(format!("CLUSTER SLOTS: range {start}-{end}"));
        }
        let Value::Array(node) = primary else {
            return Err(format!(
                "CLUSTER SLOTS: a node is not an array: {primary:?}"
            ));
        };
        let [host, port, ..] = node.as_slice() else {
            return Err("CLUSTER SLOTS: a node without host and port".to_owned());
        };
        let host = reply_text(host)
            .filter(|h| !h.is_empty() && h != "?")
            .unwrap_or_else(|| asked_host.to_owned());
        let port = u16::try_from(int(port, "port")?)
            .map_err(|_| format!("CLUSTER SLOTS: port out of range: {port:?}"))?;
        out.push(SlotRange {
            start,
            end,
            primary: format!("{host}:{port}"),
        });
    }
    out.sort_by_key(|r| r.start);
    Ok(out)
}

/// A primary as the last probe saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrimaryState {
    /// Answering, with this many replicas online.
    Up { online_replicas: u32 },
    /// Did not answer (connection refused or reset, timeout, `LOADING`).
    Unreachable(String),
    /// Answered, but as a replica: the slot map is changing (a failover).
    NotPrimary,
    /// Answered with an error that says nothing about its health (e.g. `INFO` not allowed):
    /// never a reason to refuse.
    Unknown(String),
}

/// The picture one probe round took.
#[derive(Debug, Clone)]
pub struct Topology {
    pub taken_at: Instant,
    /// Sorted by start; index into `primaries`.
    pub(super) ranges: Vec<(u16, u16, usize)>,
    /// (address, state).
    pub(super) primaries: Vec<(String, PrimaryState)>,
    /// The audit parts on each primary, by index into `primaries`.
    parts: Vec<Vec<usize>>,
}

impl Topology {
    /// Builds a picture from slot ranges and each primary's state (`states` by address;
    /// missing ones are `Unknown`).
    pub fn new(
        taken_at: Instant,
        ranges: &[SlotRange],
        states: &HashMap<String, PrimaryState>,
    ) -> Self {
        let mut primaries: Vec<(String, PrimaryState)> = Vec::new();
        let mut index: HashMap<&str, usize> = HashMap::new();
        let mut out = Vec::with_capacity(ranges.len());
        for r in ranges {
            let i = *index.entry(r.primary.as_str()).or_insert_with(|| {
                let state = states
                    .get(&r.primary)
                    .cloned()
                    .unwrap_or_else(|| PrimaryState::Unknown("not probed".into()));
                primaries.push((r.primary.clone(), state));
                primaries.len() - 1
            });
            out.push((r.start, r.end, i));
        }
        out.sort_by_key(|r| r.0);
        let mut t = Self {
            taken_at,
            ranges: out,
            primaries,
            parts: Vec::new(),
        };
        let mut parts = vec![Vec::new(); t.primaries.len()];
        for part in 0..AUDIT_PARTS {
            if let Some(p) = t.primary_of(Layout::audit_part_slot(part)) {
                parts[p].push(part);
            }
        }
        t.parts = parts;
        t
    }

    /// A picture that knows nothing: refuses nothing.
    pub fn unknown() -> Self {
        Self::new(Instant::now(), &[], &HashMap::new())
    }

    /// The primaries and their states.
    pub fn primaries(&self) -> impl Iterator<Item = (&str, &PrimaryState)> {
        self.primaries.iter().map(|(a, s)| (a.as_str(), s))
    }

    fn primary_of(&self, slot: u16) -> Option<usize> {
        let i = self.ranges.partition_point(|r| r.0 <= slot);
        let (start, end, p) = *self.ranges.get(i.checked_sub(1)?)?;
        (start..=end).contains(&slot).then_some(p)
    }

    /// The primary serving `slot`, if the map covers it.
    pub fn primary_addr(&self, slot: u16) -> Option<&str> {
        self.primary_of(slot).map(|p| self.primaries[p].0.as_str())
    }

    /// The slot ranges of primary `p`, as text (`0-5460`, `0-10,20-30`; at most 4 shown).
    fn slots_of(&self, p: usize) -> String {
        let mine: Vec<String> = self
            .ranges
            .iter()
            .filter(|r| r.2 == p)
            .map(|(s, e, _)| {
                if s == e {
                    s.to_string()
                } else {
                    format!("{s}-{e}")
                }
            })
            .collect();
        let mut text = mine.iter().take(4).cloned().collect::<Vec<_>>().join(",");
        if mine.len() > 4 {
            text.push_str(&format!(",… ({} ranges)", mine.len()));
        }
        text
    }

    /// Whether every primary is up with at least `needed` replicas online.
    pub fn all_healthy(&self, needed: u32) -> bool {
        self.primaries.iter().all(|(_, s)| match s {
            PrimaryState::Up { online_replicas } => *online_replicas >= needed,
            PrimaryState::Unknown(_) => true,
            _ => false,
        })
    }

    /// Whether a write to `slots` may be sent, needing `needed` replicas of each primary it
    /// touches; the first refusal found otherwise. Fresh pictures only (`now`).
    pub fn check(
        &self,
        slots: impl IntoIterator<Item = u16>,
        needed: u32,
        now: Instant,
    ) -> Result<(), Refusal> {
        if now.saturating_duration_since(self.taken_at) > STALE_AFTER {
            return Ok(());
        }
        let mut seen = vec![false; self.primaries.len()];
        for slot in slots {
            let Some(p) = self.primary_of(slot) else {
                continue;
            };
            if std::mem::replace(&mut seen[p], true) {
                continue;
            }
            let (addr, state) = &self.primaries[p];
            match state {
                PrimaryState::Up { online_replicas } if *online_replicas < needed => {
                    return Err(Refusal::Replicas {
                        primary: addr.clone(),
                        slots: self.slots_of(p),
                        needed,
                        online: *online_replicas,
                    });
                }
                PrimaryState::Unreachable(why) => {
                    return Err(Refusal::Unreachable {
                        primary: addr.clone(),
                        slots: self.slots_of(p),
                        why: why.clone(),
                    });
                }
                PrimaryState::NotPrimary => {
                    return Err(Refusal::Unreachable {
                        primary: addr.clone(),
                        slots: self.slots_of(p),
                        why: "it answers as a replica (failover in progress)".into(),
                    });
                }
                PrimaryState::Up { .. } | PrimaryState::Unknown(_) => {}
            }
        }
        Ok(())
    }

    /// The audit part for an entry of `bucket` whose key is in `slot`: one on the same
    /// primary (`bucket` picks among them), else part `bucket % AUDIT_PARTS`.
    pub fn audit_part(&self, slot: u16, bucket: u32) -> usize {
        let fallback = bucket as usize % AUDIT_PARTS;
        let Some(p) = self.primary_of(slot) else {
            return fallback;
        };
        match self.parts[p].as_slice() {
            [] => fallback,
            parts => parts[bucket as usize % parts.len()],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO_PRIMARY: &str = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n\
        slave0:ip=127.0.0.1,port=7004,state=online,offset=1234,lag=0\r\n\
        slave1:ip=127.0.0.1,port=7005,state=wait_bgsave,offset=0,lag=0\r\n\
        master_failover_state:no-failover\r\nmaster_replid:abc\r\nmaster_repl_offset:1234\r\n";

    #[test]
    fn replication_info_counts_online_replicas_only() {
        assert_eq!(
            parse_replication_info(INFO_PRIMARY),
            Ok(ReplicationInfo {
                primary: true,
                online_replicas: 1
            }),
            "a replica still syncing is not counted: WAIT would not count it"
        );
        let replica = "# Replication\r\nrole:slave\r\nmaster_host:127.0.0.1\r\nmaster_port:7001\r\nmaster_link_status:up\r\n";
        assert_eq!(
            parse_replication_info(replica),
            Ok(ReplicationInfo {
                primary: false,
                online_replicas: 0
            })
        );
        let alone = "role:master\nconnected_slaves:0\nmaster_repl_offset:0\n";
        assert_eq!(parse_replication_info(alone).unwrap().online_replicas, 0);
        assert!(parse_replication_info("").is_err());
        assert!(parse_replication_info("# Replication\r\nconnected_slaves:1\r\n").is_err());
        // `slaves_...` style keys are not replica lines.
        let odd = "role:master\nslave_read_only:1\nslavex:state=online\n";
        assert_eq!(parse_replication_info(odd).unwrap().online_replicas, 0);
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            bulk(host),
            Value::Int(port),
            bulk("id"),
            Value::Array(vec![]),
        ])
    }

    #[test]
    fn cluster_slots_replies() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(10922),
                node("127.0.0.1", 7002),
                node("127.0.0.1", 7005),
            ]),
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("?", 7001),
                node("127.0.0.1", 7004),
            ]),
        ]);
        let ranges = parse_cluster_slots(&reply, "10.0.0.9").unwrap();
        assert_eq!(
            ranges,
            vec![
                SlotRange {
                    start: 0,
                    end: 5460,
                    primary: "10.0.0.9:7001".into()
                },
                SlotRange {
                    start: 5461,
                    end: 10922,
                    primary: "127.0.0.1:7002".into()
                },
            ],
            "sorted, and an unknown endpoint is the node asked"
        );
        for bad in [
            Value::Nil,
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Array(vec![Value::Int(0), Value::Int(1)])]),
            Value::Array(vec![Value::Array(vec![
                Value::Int(0),
                Value::Int(20_000),
                node("h", 1),
            ])]),
            Value::Array(vec![Value::Array(vec![
                Value::Int(9),
                Value::Int(3),
                node("h", 1),
            ])]),
            Value::Array(vec![Value::Array(vec![
                Value::Int(0),
                Value::Int(3),
                Value::Array(vec![bulk("h")]),
            ])]),
            Value::Array(vec![Value::Array(vec![
                Value::Int(0),
                Value::Int(3),
                node("h", 70_000),
            ])]),
        ] {
            assert!(parse_cluster_slots(&bad, "h").is_err(), "{bad:?}");
        }
    }

    fn three(states: [PrimaryState; 3]) -> Topology {
        let ranges = [
            SlotRange {
                start: 0,
                end: 5460,
                primary: "a:1".into(),
            },
            SlotRange {
                start: 5461,
                end: 10922,
                primary: "b:2".into(),
            },
            SlotRange {
                start: 10923,
                end: 16383,
                primary: "c:3".into(),
            },
        ];
        let states = ["a:1", "b:2", "c:3"]
            .into_iter()
            .map(String::from)
            .zip(states)
            .collect();
        Topology::new(Instant::now(), &ranges, &states)
    }

    fn up(n: u32) -> PrimaryState {
        PrimaryState::Up { online_replicas: n }
    }

    #[test]
    fn refusals_name_the_primary_and_touch_only_its_slots() {
        let t = three([up(1), up(0), PrimaryState::Unreachable("refused".into())]);
        let now = Instant::now();
        assert_eq!(t.check([0, 100, 5460], 1, now), Ok(()), "a healthy shard");
        assert_eq!(
            t.check([0, 5461], 1, now),
            Err(Refusal::Replicas {
                primary: "b:2".into(),
                slots: "5461-10922".into(),
                needed: 1,
                online: 0
            })
        );
        assert_eq!(t.check([5461], 0, now), Ok(()), "no replica needed");
        assert!(
            matches!(
                t.check([16383], 0, now),
                Err(Refusal::Unreachable { primary, slots, .. }) if primary == "c:3" && slots == "10923-16383"
            ),
            "an unreachable primary is refused whatever is needed"
        );
        assert_eq!(t.check([], 1, now), Ok(()));
        assert!(!t.all_healthy(1));
        assert!(three([up(1), up(1), up(2)]).all_healthy(1));
    }

    #[test]
    fn stale_or_unknown_pictures_refuse_nothing() {
        let t = three([
            up(0),
            PrimaryState::Unknown("NOPERM".into()),
            PrimaryState::NotPrimary,
        ]);
        let now = Instant::now();
        assert!(t.check([0], 1, now).is_err());
        assert_eq!(t.check([6000], 1, now), Ok(()), "unknown state");
        assert!(t.check([12000], 0, now).is_err(), "a demoted primary");
        assert_eq!(
            t.check([0, 12000], 1, now + STALE_AFTER + Duration::from_millis(1)),
            Ok(()),
            "a stale picture"
        );
        let empty = Topology::unknown();
        assert_eq!(empty.check([0, 16383], 3, now), Ok(()), "an empty map");
        assert!(empty.all_healthy(3));
        // A gap in the map (slots being migrated) refuses nothing either.
        let gap = Topology::new(
            Instant::now(),
            &[SlotRange {
                start: 100,
                end: 200,
                primary: "a:1".into(),
            }],
            &[("a:1".to_owned(), up(0))].into_iter().collect(),
        );
        assert_eq!(gap.check([50, 201], 1, now), Ok(()));
        assert!(gap.check([150], 1, now).is_err());
        assert_eq!(gap.primary_addr(100), Some("a:1"));
        assert_eq!(gap.primary_addr(99), None);
    }

    #[test]
    fn audit_parts_live_with_their_entries() {
        let t = three([up(1), up(1), up(1)]);
        for (slot, bucket) in [(0u16, 7u32), (6000, 8), (16383, 123_456)] {
            let part = t.audit_part(slot, bucket);
            assert_eq!(
                t.primary_of(Layout::audit_part_slot(part)),
                t.primary_of(slot),
                "slot {slot}: its part is on its primary"
            );
        }
        // Different buckets of one primary spread over its parts.
        let parts: std::collections::HashSet<usize> =
            (0..100).map(|b| t.audit_part(0, b)).collect();
        assert!(parts.len() > 10, "{parts:?}");
        // No map: part by bucket.
        assert_eq!(Topology::unknown().audit_part(0, 70), 70 % AUDIT_PARTS);
    }

    #[test]
    fn slot_ranges_are_shown_compactly() {
        let mut ranges = Vec::new();
        for i in 0..6u16 {
            ranges.push(SlotRange {
                start: i * 10,
                end: i * 10 + if i == 0 { 0 } else { 5 },
                primary: "a:1".into(),
            });
        }
        let t = Topology::new(
            Instant::now(),
            &ranges,
            &[("a:1".to_owned(), up(0))].into_iter().collect(),
        );
        assert_eq!(t.slots_of(0), "0,10-15,20-25,30-35,… (6 ranges)");
    }
}
