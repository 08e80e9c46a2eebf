//! Fault schedules: the named ones that reproduce issue 25's rows 1–4 step by step, and
//! random ones drawn from a seed (a small PRNG of our own, so a seed means the same schedule
//! on every machine and every version of `rand`).

use std::fmt;
use std::time::Duration;

use namelist::config::DEFAULT_EXPECTED_ENTRIES;
use namelist::domain::{Dimension, Value};
use namelist::store::Layout;

/// splitmix64: tiny, seedable, good enough to draw schedules and operations.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// One `redis-server`.
    Node,
    /// A local cluster of 3 primaries and 3 replicas, `NAMELIST_WRITE_REPLICAS=1`.
    Cluster,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL the `redis-server` (one node).
    KillRedis,
    /// Start it again on its own data (its AOF, `appendfsync always`).
    RestartRedis,
    /// Start it again with no data: the keyspace is lost.
    RestartRedisEmpty,
    /// SIGSTOP the node: the server (`None`), or the cluster's current primary of a shard.
    Pause { shard: Option<usize> },
    /// SIGCONT the paused node.
    Resume,
    /// SIGKILL instance `slot` and start it again (its local tier loads again).
    RestartInstance(usize),
    /// A new instance (the next slot) starts and gets ready.
    StartInstance,
    /// `CLIENT KILL TYPE pubsub` on every node: the instances' invalidation subscriptions.
    KillPubsub,
    /// Every audit part (the change log) trimmed to nothing (`XTRIM MAXLEN 0`), then
    /// `KillPubsub`: the records a catch-up would read are gone.
    TrimLog,
    /// Cluster: SIGKILL the primary of `shard`, and wait until its replica is promoted.
    KillPrimary { shard: usize },
    /// Cluster: start the killed node again (it rejoins as a replica of its successor).
    RestartKilledNode,
    /// Cluster: `FLUSHALL` on a primary that does not hold the meta hash (its replica
    /// follows): that shard's part of the keyspace is lost, the rest kept.
    FlushShard,
    /// One node: `ACL SETUSER default <rules>`, e.g. `-subscribe` (no instance can subscribe
    /// again after `KillPubsub`, while its other connections and every write's `PUBLISH` go
    /// on) or `-dump -hgetall` (the local tiers cannot read buckets; checks, `HGET`, can).
    Acl(&'static str),
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::KillRedis => write!(f, "redis kill -9"),
            Fault::RestartRedis => write!(f, "redis restarted on its AOF"),
            Fault::RestartRedisEmpty => write!(f, "redis restarted EMPTY (keyspace lost)"),
            Fault::Pause { shard: None } => write!(f, "SIGSTOP redis"),
            Fault::Pause { shard: Some(s) } => write!(f, "SIGSTOP the primary of shard {s}"),
            Fault::Resume => write!(f, "SIGCONT redis"),
            Fault::RestartInstance(i) => write!(f, "instance {i} killed and started again"),
            Fault::StartInstance => write!(f, "a new instance starts"),
            Fault::KillPubsub => write!(f, "CLIENT KILL TYPE pubsub"),
            Fault::TrimLog => write!(f, "change log trimmed to nothing, then pub/sub killed"),
            Fault::KillPrimary { shard } => {
                write!(f, "primary of shard {shard} kill -9, replica promoted")
            }
            Fault::FlushShard => write!(
                f,
                "a primary (not the meta hash's) FLUSHALL: its shard lost"
            ),
            Fault::RestartKilledNode => write!(f, "killed node restarted (rejoins as replica)"),
            Fault::Acl(rules) => write!(f, "ACL SETUSER default {rules}"),
        }
    }
}

#[derive(Debug, Clone)]
pub enum Step {
    Wait(Duration),
    Fault(Fault),
    /// The driver's own upsert through instance `slot`.
    Upsert {
        slot: usize,
        values: Vec<String>,
    },
    /// Upserts through `slot` until one is answered other than "unknown" (a timeout, a
    /// connection error, `store_unavailable`: the store is still coming back), for up to
    /// 10 s; every attempt recorded.
    UpsertUntilAcked {
        slot: usize,
        values: Vec<String>,
    },
    /// The driver's own check through instance `slot`.
    Check {
        slot: usize,
        values: Vec<String>,
    },
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let values = |v: &[String]| super::model::abridge(v);
        match self {
            Step::Wait(d) => write!(f, "wait {} ms", d.as_millis()),
            Step::Fault(x) => write!(f, "FAULT {x}"),
            Step::Upsert { slot, values: v } => write!(f, "upsert {} via i{slot}", values(v)),
            Step::UpsertUntilAcked { slot, values: v } => {
                write!(f, "upsert {} via i{slot} until acknowledged", values(v))
            }
            Step::Check { slot, values: v } => write!(f, "check {} via i{slot}", values(v)),
        }
    }
}

/// What a run sets up, and the steps its driver takes while the clients (if any) run.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub name: String,
    pub seed: Option<u64>,
    pub topology: Topology,
    /// Instances started before the steps.
    pub instances: usize,
    /// `redis-server --appendonly yes --appendfsync always` (one node).
    pub aof: bool,
    /// Entries `bg-00000`, `bg-00001`... upserted through instance 0 before the steps.
    pub background: usize,
    /// Concurrent clients doing random upserts, deletes and checks (0: only the driver).
    pub clients: usize,
    pub steps: Vec<Step>,
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let seed = self.seed.map(|s| format!(" seed {s}")).unwrap_or_default();
        writeln!(
            f,
            "schedule {}{seed}: {:?}, {} instance(s), aof {}, {} background entries, {} clients",
            self.name, self.topology, self.instances, self.aof, self.background, self.clients
        )?;
        let mut at = Duration::ZERO;
        for s in &self.steps {
            writeln!(f, "  ~{:>6} ms  {s}", at.as_millis())?;
            if let Step::Wait(d) = s {
                at += *d;
            }
        }
        Ok(())
    }
}

/// The uids the clients work on: few, so that operations collide.
pub const UIDS: usize = 20;

pub fn uid(i: usize) -> String {
    format!("u{i:02}")
}

pub fn background_value(i: usize) -> String {
    format!("bg-{i:05}")
}

/// Buckets of a keyspace made with the default settings (no `NAMELIST_EXPECTED_ENTRIES`).
fn default_buckets() -> u32 {
    Layout::buckets_for(DEFAULT_EXPECTED_ENTRIES)
}

/// The bucket of uid `v` in a keyspace of `buckets` keyed with the tests' key.
fn bucket_of(v: &str, buckets: u32) -> u32 {
    let layout = Layout::new("nl:", buckets, crate::common::keyed());
    let dim: Dimension = "uid".parse().unwrap();
    let value = Value::parse_entry(&dim, v).unwrap();
    layout
        .entry_key(
            &"black".parse().unwrap(),
            &dim,
            &"default".parse().unwrap(),
            &value,
        )
        .bucket
}

/// The hash slot of uid `v`'s bucket in a keyspace made by the runs (prefix `nl:`, the
/// default bucket count): where a cluster keeps it.
pub fn slot_of(v: &str) -> u16 {
    let buckets = default_buckets();
    let key = Layout::new("nl:", buckets, crate::common::keyed()).bucket_key(bucket_of(v, buckets));
    namelist::store::layout::key_slot(key.as_bytes())
}

/// Whether `v` lives in the last fifth of the buckets, which a new instance's tier loads last
/// (its sweep goes up from bucket 0): so that a named row does not depend on whether the
/// bucket happened to be loaded already.
fn loaded_late(v: &str) -> bool {
    let n = default_buckets();
    bucket_of(v, n) >= n / 5 * 4
}

/// The first value `prefix-<i>` loaded late.
fn late_value(prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|v| loaded_late(v))
        .unwrap()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn all_uids() -> Vec<String> {
    (0..UIDS).map(uid).collect()
}

/// Row 1: 50,000 entries in the keyspace (AOF on); a new instance starts, writes `w0`; 0.3 s
/// later Redis is killed; 0.5 s later a check of `w0` and of entries loaded long before
/// (16 of them, in buckets the new instance loads last).
pub fn row1() -> Schedule {
    let old: Vec<String> = (0..50_000)
        .map(background_value)
        .filter(|v| loaded_late(v))
        .take(16)
        .collect();
    let w0 = late_value("w0");
    let mut checked = vec![w0.clone()];
    checked.extend(old);
    Schedule {
        name: "row1_redis_killed_while_a_new_instance_loads".into(),
        seed: None,
        topology: Topology::Node,
        instances: 1,
        aof: true,
        background: 50_000,
        clients: 0,
        steps: vec![
            Step::Fault(Fault::StartInstance),
            Step::Upsert {
                slot: 1,
                values: vec![w0],
            },
            Step::Wait(ms(300)),
            Step::Fault(Fault::KillRedis),
            Step::Wait(ms(500)),
            Step::Check {
                slot: 1,
                values: checked,
            },
        ],
    }
}

/// Row 2: an empty keyspace; a new instance writes `w0`, checks it (a hit), Redis is killed,
/// 0.5 s later a check of `w0`. The same upsert also writes `w1`..`w4` (all in buckets loaded
/// last), which are not checked before the kill: a check of a bucket not yet held queues it
/// for loading at once, so whether `w0`'s copy was read before the kill is a race (one run in
/// three on this machine), while nothing reads theirs. 100 ms pass between the check and the
/// kill, so that the write is acknowledged well before the subscription breaks (more than the
/// 5 ms slack of `stale_ms`).
pub fn row2() -> Schedule {
    let written: Vec<String> = (0..5).map(|i| late_value(&format!("w{i}"))).collect();
    Schedule {
        name: "row2_own_write_then_redis_killed".into(),
        seed: None,
        topology: Topology::Node,
        instances: 1,
        aof: true,
        background: 0,
        clients: 0,
        steps: vec![
            Step::Upsert {
                slot: 0,
                values: written.clone(),
            },
            Step::Check {
                slot: 0,
                values: vec![written[0].clone()],
            },
            Step::Wait(ms(100)),
            Step::Fault(Fault::KillRedis),
            Step::Wait(ms(500)),
            Step::Check {
                slot: 0,
                values: written,
            },
        ],
    }
}

/// Row 3: 20 uids listed; Redis restarted without its data (no persistence); 1 s and 3 s
/// later, a check of every uid on each of two instances.
pub fn row3() -> Schedule {
    let check = |slot| Step::Check {
        slot,
        values: all_uids(),
    };
    Schedule {
        name: "row3_redis_restarted_empty".into(),
        seed: None,
        topology: Topology::Node,
        instances: 2,
        aof: false,
        background: 0,
        clients: 0,
        steps: vec![
            Step::Upsert {
                slot: 0,
                values: all_uids(),
            },
            Step::Wait(ms(1_500)),
            check(0),
            check(1),
            Step::Fault(Fault::RestartRedisEmpty),
            Step::Wait(ms(1_000)),
            check(0),
            check(1),
            Step::Wait(ms(2_000)),
            check(0),
            check(1),
        ],
    }
}

/// Row 4: as row 3, and right after the restart an instance's first acknowledged write of
/// `w0`, then a check of it through the same instance; then checks of it through both
/// instances 0.2 s and 1 s later. The acknowledgement itself breaks the contract (a write
/// into a lost keyspace); the checks show whether it can be read back.
/// The change log (issue 26): clients write while the instances' subscriptions are killed
/// three times (each catches up from the log: only the buckets written meanwhile are read
/// again), then once with the log trimmed to nothing first (a gap: everything is read
/// again). The first break comes after the marks are old enough (the write deadline and a
/// second, 3 s by default).
pub fn row5() -> Schedule {
    let wait = |m| Step::Wait(ms(m));
    Schedule {
        name: "row5_pubsub_killed_with_and_without_the_change_log".into(),
        seed: Some(5),
        topology: Topology::Node,
        instances: 3,
        aof: true,
        background: 10_000,
        clients: 4,
        steps: vec![
            wait(4_500),
            Step::Fault(Fault::KillPubsub),
            wait(1_500),
            Step::Fault(Fault::KillPubsub),
            wait(4_000),
            Step::Fault(Fault::KillPubsub),
            wait(1_000),
            Step::Fault(Fault::TrimLog),
            wait(2_000),
        ],
    }
}

/// Row 6 (cluster): every uid listed, then, while clients upsert, delete and check, a shard
/// other than the meta hash's loses its data. A uid there must never be answered "not listed"
/// without `degraded` (and a staleness that reaches back before the loss), and no write of a
/// uid there may be acknowledged once it is gone.
pub fn row6() -> Schedule {
    let check = |slot| Step::Check {
        slot,
        values: all_uids(),
    };
    Schedule {
        name: "row6_cluster_shard_flushed".into(),
        seed: Some(6),
        topology: Topology::Cluster,
        instances: 2,
        aof: false,
        background: 0,
        clients: 4,
        steps: vec![
            Step::Upsert {
                slot: 0,
                values: all_uids(),
            },
            Step::Wait(ms(2_000)),
            check(0),
            check(1),
            Step::Fault(Fault::FlushShard),
            check(0),
            check(1),
            Step::Wait(ms(1_500)),
            check(0),
            check(1),
            Step::Wait(ms(1_500)),
            check(0),
            check(1),
        ],
    }
}

/// Row 7: a write missed while an instance could not subscribe, a new generation of its tier
/// that could not read that bucket again, then Redis stopped and that instance's own write to
/// the same entry, of unknown outcome. Two instances, tiers loaded; the ACL refuses
/// `SUBSCRIBE` and the subscriptions are killed; `w0` is upserted through instance 0
/// (acknowledged; its message reaches nobody); the ACL refuses the tiers' bucket reads, the
/// change log is trimmed (a catch-up must read everything again) and `SUBSCRIBE` is allowed
/// again: each instance subscribes, starts a new generation and cannot read a bucket, so its
/// copy of `w0`'s bucket stays the older generation's, without `w0`. Redis is SIGSTOPped,
/// instance 1 upserts `w0` (a timeout: that copy is marked dirty) and checks it: its
/// fail-open "not listed" must say it is as old as the first break, not as the dirty mark
/// (CI's seed 8 found a dirty mark answering as if such a copy were in sync then).
pub fn row7() -> Schedule {
    let w0 = late_value("w0");
    let check = |slot: usize| Step::Check {
        slot,
        values: vec![w0.clone()],
    };
    let upsert = |slot: usize| Step::Upsert {
        slot,
        values: vec![w0.clone()],
    };
    Schedule {
        name: "row7_own_unknown_write_after_a_missed_one".into(),
        seed: None,
        topology: Topology::Node,
        instances: 2,
        aof: true,
        background: 10_000,
        clients: 0,
        steps: vec![
            // Both tiers loaded (~1 s at the default fetch rate; three on a busy machine).
            Step::Wait(ms(3_000)),
            Step::Fault(Fault::Acl("-subscribe -psubscribe -ssubscribe")),
            Step::Fault(Fault::KillPubsub),
            Step::Wait(ms(200)),
            upsert(0),
            Step::Wait(ms(200)),
            Step::Fault(Fault::Acl("-dump -hgetall")),
            Step::Fault(Fault::TrimLog),
            Step::Fault(Fault::Acl("+subscribe +psubscribe +ssubscribe")),
            // Subscribed again (the back-off is at most a second), a new generation begun.
            Step::Wait(ms(2_000)),
            Step::Fault(Fault::Pause { shard: None }),
            Step::Wait(ms(200)),
            upsert(1),
            check(1),
            Step::Wait(ms(300)),
            check(1),
            Step::Fault(Fault::Resume),
            Step::Fault(Fault::Acl("+dump +hgetall")),
            Step::Wait(ms(1_500)),
            check(0),
            check(1),
        ],
    }
}

pub fn row4() -> Schedule {
    let w0 = late_value("w0");
    let check = |slot: usize| Step::Check {
        slot,
        values: vec![w0.clone()],
    };
    Schedule {
        name: "row4_first_write_after_redis_restarted_empty".into(),
        seed: None,
        topology: Topology::Node,
        instances: 2,
        aof: false,
        background: 0,
        clients: 0,
        steps: vec![
            Step::Upsert {
                slot: 0,
                values: all_uids(),
            },
            Step::Wait(ms(1_500)),
            Step::Fault(Fault::RestartRedisEmpty),
            Step::UpsertUntilAcked {
                slot: 0,
                values: vec![w0.clone()],
            },
            check(0),
            Step::Wait(ms(200)),
            check(0),
            check(1),
            Step::Wait(ms(800)),
            check(0),
            check(1),
        ],
    }
}

/// Faults for `budget` of schedule after a second of warm-up, drawn from `seed`: each an
/// episode that leaves the system whole again (a killed Redis restarted, a paused one
/// resumed, a killed primary's node back as a replica) before the next begins; on one node,
/// now and then a last episode that restarts Redis empty (nothing can restore the keyspace
/// in a run, so the loss comes last); then 2 s of recovery, checks still going.
pub fn random(seed: u64, topology: Topology, budget: Duration) -> Schedule {
    let mut rng = Rng::new(seed);
    let instances = match topology {
        Topology::Node => 3,
        Topology::Cluster => 2,
    };
    let mut steps = vec![Step::Wait(ms(1_000))];
    let mut spent = Duration::ZERO;
    let wait = |rng: &mut Rng, lo, hi| Step::Wait(ms(rng.between(lo, hi)));
    while spent < budget {
        let before = steps.len();
        match (topology, rng.below(4)) {
            (Topology::Node, 0) => {
                steps.push(Step::Fault(Fault::KillRedis));
                steps.push(wait(&mut rng, 200, 1_500));
                steps.push(Step::Fault(Fault::RestartRedis));
            }
            (Topology::Cluster, 0) => {
                let shard = rng.below(3) as usize;
                steps.push(Step::Fault(Fault::KillPrimary { shard }));
                steps.push(wait(&mut rng, 1_000, 2_000));
                steps.push(Step::Fault(Fault::RestartKilledNode));
                spent += ms(2_000); // the failover itself
            }
            (_, 1) => {
                let shard = rng.below(3) as usize;
                let shard = (topology == Topology::Cluster).then_some(shard);
                steps.push(Step::Fault(Fault::Pause { shard }));
                steps.push(wait(&mut rng, 1_000, 3_000));
                steps.push(Step::Fault(Fault::Resume));
            }
            (_, 2) => {
                let slot = rng.below(instances as u64) as usize;
                steps.push(Step::Fault(Fault::RestartInstance(slot)));
                spent += ms(300);
            }
            _ => steps.push(Step::Fault(Fault::KillPubsub)),
        }
        steps.push(wait(&mut rng, 300, 1_200));
        spent += steps[before..]
            .iter()
            .map(|s| match s {
                Step::Wait(d) => *d,
                _ => Duration::ZERO,
            })
            .sum::<Duration>();
    }
    if topology == Topology::Node && rng.chance(30) {
        steps.push(Step::Fault(Fault::KillRedis));
        steps.push(wait(&mut rng, 200, 800));
        steps.push(Step::Fault(Fault::RestartRedisEmpty));
    }
    steps.push(Step::Wait(ms(2_000)));
    Schedule {
        name: format!("random_{}", format!("{topology:?}").to_lowercase()),
        seed: Some(seed),
        topology,
        instances,
        aof: true,
        background: 10_000,
        clients: 4,
        steps,
    }
}
