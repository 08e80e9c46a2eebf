//! The scenario runner: starts Redis (one node, or a local cluster), the instances (the real
//! binary, `ServiceProcess`), the background entries and the clients; the driver takes the
//! schedule's steps (faults, and a named row's own writes and checks); every operation is
//! recorded (`model`) and the history goes to the checker. On a violation it prints the
//! seed, the schedule, the faults as carried out and the smallest violating pieces, keeps
//! the instances' logs, and panics.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};

use crate::common::{RedisCluster, RedisServer, ServiceBuilder, ServiceProcess, key_file};
use crate::history::checker::{self, Rule};
use crate::history::model::{
    Answer, Check, FaultEvent, History, Instance, Micros, Op, Outcome, Reply, Request, Sender,
    Staleness, Write, WriteKind,
};
use crate::history::schedule::{Fault, Rng, Schedule, Step, Topology, UIDS, background_value, uid};

/// A request's bound, past the service's own deadlines (a write's is 2 s by default).
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);
/// Entries per background upsert (the API's maximum).
const BULK: usize = 10_000;

/// The history being written, on one clock.
struct Recorder {
    t0: Instant,
    ops: Mutex<Vec<Op>>,
    faults: Mutex<Vec<FaultEvent>>,
}

impl Recorder {
    fn now(&self) -> Micros {
        self.t0.elapsed().as_micros() as Micros
    }
}

/// Where an instance slot answers, and whether it is up.
#[derive(Debug, Clone, Copy)]
struct Endpoint {
    port: u16,
    instance: Instance,
    up: bool,
}

/// What the clients and the driver share.
#[derive(Clone)]
struct Net {
    http: reqwest::Client,
    rec: Arc<Recorder>,
    endpoints: Arc<RwLock<Vec<Endpoint>>>,
}

fn entries(values: &[String]) -> Json {
    let list: Vec<Json> = values
        .iter()
        .map(|v| json!({"dimension": "uid", "value": v}))
        .collect();
    json!({ "entries": list })
}

/// A transport error, in words that cannot be taken for a status.
fn transport(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connection failed"
    } else {
        "connection error"
    };
    format!("no answer ({kind})")
}

fn code_of(body: &Json) -> String {
    body["error"]["code"].as_str().unwrap_or("-").to_owned()
}

impl Net {
    async fn write(
        &self,
        sender: Sender,
        ep: Endpoint,
        kind: WriteKind,
        values: Vec<String>,
    ) -> Outcome {
        let url = format!("http://127.0.0.1:{}/v1/lists/black/entries", ep.port);
        let req = match kind {
            WriteKind::Upsert => self.http.post(url),
            WriteKind::Delete => self.http.delete(url),
        }
        .json(&entries(&values));
        let start = self.rec.now();
        let (outcome, detail) = match req.send().await {
            Err(e) => (Outcome::Unknown, transport(&e)),
            Ok(res) => {
                let status = res.status().as_u16();
                let body: Json = res.json().await.unwrap_or(Json::Null);
                let code = code_of(&body);
                let outcome = match (status, code.as_str()) {
                    (200, _) => Outcome::Ok,
                    (503, "keyspace_lost" | "replicas_unavailable" | "overloaded") => {
                        Outcome::NotWritten
                    }
                    (400..=499, _) => Outcome::NotWritten,
                    _ => Outcome::Unknown,
                };
                let detail = if status == 200 {
                    "200".to_owned()
                } else {
                    format!("{status} {code}")
                };
                (outcome, detail)
            }
        };
        let end = self.rec.now();
        self.rec.ops.lock().unwrap().push(Op {
            sender,
            instance: ep.instance,
            start,
            end,
            request: Request::Write(Write {
                kind,
                values,
                outcome,
                detail,
            }),
        });
        outcome
    }

    async fn check(&self, sender: Sender, ep: Endpoint, values: Vec<String>) {
        let url = format!("http://127.0.0.1:{}/v1/check", ep.port);
        let body = json!({"lists": ["black"], "subjects": {"uid": values}});
        let start = self.rec.now();
        let reply = match self.http.post(url).json(&body).send().await {
            Err(e) => Reply::NoClaim(transport(&e)),
            Ok(res) => {
                let status = res.status().as_u16();
                let text = res.text().await.unwrap_or_default();
                let body: Json = serde_json::from_str(&text).unwrap_or(Json::Null);
                match status {
                    200 => match parse_answer(&body, &values) {
                        Ok(a) => Reply::Answer(a),
                        Err(why) => Reply::Unexpected(format!("200 {why}: {text}")),
                    },
                    503 => Reply::NoClaim(format!("503 {}", code_of(&body))),
                    s => Reply::Unexpected(format!("{s} {}", code_of(&body))),
                }
            }
        };
        let end = self.rec.now();
        self.rec.ops.lock().unwrap().push(Op {
            sender,
            instance: ep.instance,
            start,
            end,
            request: Request::Check(Check { values, reply }),
        });
    }

    /// The endpoint of `slot` now.
    fn endpoint(&self, slot: usize) -> Endpoint {
        self.endpoints.read().unwrap()[slot]
    }
}

/// A check's 200 body as an [`Answer`]; `unanswered` indexes are within the check's uids.
fn parse_answer(body: &Json, values: &[String]) -> Result<Answer, String> {
    let degraded = body["degraded"].as_bool().ok_or("without degraded")?;
    let hits = body["hits"]
        .as_array()
        .ok_or("without hits")?
        .iter()
        .map(|h| h["value"].as_str().map(str::to_owned))
        .collect::<Option<BTreeSet<String>>>()
        .ok_or("a hit without a value")?;
    let staleness = match (degraded, body.get("stale_ms").and_then(Json::as_u64)) {
        (false, _) => Staleness::Fresh,
        (true, Some(s)) => Staleness::Stale(s),
        (true, None) => Staleness::Unbounded,
    };
    let mut unanswered = BTreeSet::new();
    for u in body["unanswered"].as_array().into_iter().flatten() {
        let index = u["index"]
            .as_u64()
            .ok_or("an unanswered lookup without an index")?;
        if u["dimension"] != "uid" {
            return Err("an unanswered lookup of another dimension".into());
        }
        let v = values
            .get(index as usize)
            .ok_or("an unanswered index past the check's values")?;
        unanswered.insert(v.clone());
    }
    Ok(Answer {
        staleness,
        hits,
        unanswered,
    })
}

/// One client: random upserts, deletes and checks over the uids, each against a random
/// instance that is up, until `stop`.
async fn client(id: usize, seed: u64, net: Net, background: usize, stop: Arc<AtomicBool>) {
    let mut rng = Rng::new(seed ^ (id as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let ep = {
            let eps = net.endpoints.read().unwrap();
            eps[rng.below(eps.len() as u64) as usize]
        };
        if !ep.up {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        let sender = Sender::Client(id);
        let pick = |rng: &mut Rng| uid(rng.below(UIDS as u64) as usize);
        match rng.below(100) {
            0..35 => {
                let mut values = vec![pick(&mut rng)];
                if rng.chance(10) {
                    values.push(pick(&mut rng));
                    values.dedup();
                }
                net.write(sender, ep, WriteKind::Upsert, values).await;
            }
            35..55 => {
                net.write(sender, ep, WriteKind::Delete, vec![pick(&mut rng)])
                    .await;
            }
            _ => {
                let mut values: Vec<String> = Vec::new();
                for _ in 0..rng.between(1, 4) {
                    let v = pick(&mut rng);
                    if !values.contains(&v) {
                        values.push(v);
                    }
                }
                if background > 0 {
                    values.push(background_value(rng.below(background as u64) as usize));
                }
                values.push(format!("never-{id}-{n}"));
                net.check(sender, ep, values).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.between(5, 25))).await;
    }
}

enum Store {
    Node(RedisServer),
    Cluster(RedisCluster),
}

/// Everything a run owns.
struct Run {
    schedule: Schedule,
    store: Store,
    /// The node paused (SIGSTOP), killed (cluster), by index in the cluster's nodes.
    paused: Option<usize>,
    killed: Option<usize>,
    builder: ServiceBuilder,
    services: Vec<ServiceProcess>,
    net: Net,
    logs: tempfile::TempDir,
}

impl Run {
    async fn start(schedule: Schedule) -> Self {
        let logs = tempfile::tempdir().expect("a log directory");
        let store = match schedule.topology {
            Topology::Node => {
                let args: &[&str] = if schedule.aof {
                    &["--appendonly", "yes", "--appendfsync", "always"]
                } else {
                    &[]
                };
                Store::Node(tokio::task::block_in_place(|| {
                    RedisServer::start_with(args)
                }))
            }
            Topology::Cluster => Store::Cluster(tokio::task::block_in_place(|| {
                let c = RedisCluster::start();
                assert!(
                    c.wait_replicas_online(Duration::from_secs(30)),
                    "cluster replicas online"
                );
                c
            })),
        };
        // Default settings, but for the store and the key; and text logs for a reader.
        let mut builder = ServiceProcess::builder()
            .env("NAMELIST_FINGERPRINT_KEY_FILE", key_file())
            .env("NAMELIST_LOG_FORMAT", "text")
            .log_dir(logs.path())
            .ready_within(Duration::from_secs(30));
        builder = match &store {
            Store::Node(r) => builder.env("NAMELIST_REDIS_URL", r.url()),
            Store::Cluster(c) => builder
                .env("NAMELIST_REDIS_CLUSTER_NODES", c.urls().join(","))
                .env("NAMELIST_WRITE_REPLICAS", "1"),
        };
        let net = Net {
            http: reqwest::Client::builder()
                .timeout(HTTP_TIMEOUT)
                .build()
                .expect("an HTTP client"),
            rec: Arc::new(Recorder {
                t0: Instant::now(),
                ops: Mutex::new(Vec::new()),
                faults: Mutex::new(Vec::new()),
            }),
            endpoints: Arc::new(RwLock::new(Vec::new())),
        };
        let mut run = Self {
            schedule,
            store,
            paused: None,
            killed: None,
            builder,
            services: Vec::new(),
            net,
            logs,
        };
        for _ in 0..run.schedule.instances {
            run.start_instance().await;
        }
        run
    }

    async fn start_instance(&mut self) {
        let service = self.builder.start().await;
        let slot = self.services.len();
        self.net.endpoints.write().unwrap().push(Endpoint {
            port: service.port(),
            instance: Instance {
                slot,
                incarnation: 0,
            },
            up: true,
        });
        self.services.push(service);
    }

    async fn restart_instance(&mut self, slot: usize) {
        let old = {
            let mut eps = self.net.endpoints.write().unwrap();
            eps[slot].up = false;
            eps[slot]
        };
        tokio::task::block_in_place(|| self.services[slot].kill());
        let service = self.builder.start().await;
        self.net.endpoints.write().unwrap()[slot] = Endpoint {
            port: service.port(),
            instance: Instance {
                slot,
                incarnation: old.instance.incarnation + 1,
            },
            up: true,
        };
        self.services[slot] = service;
    }

    /// The background entries, through instance 0, each chunk acknowledged.
    async fn load_background(&self) {
        let n = self.schedule.background;
        for from in (0..n).step_by(BULK) {
            let values: Vec<String> = (from..(from + BULK).min(n)).map(background_value).collect();
            // Set-up, not the history: an upsert is idempotent, so one that was not acknowledged
            // on a machine still busy starting the cluster (a `WAIT` for the replica past the
            // write deadline is a 503) is sent again, for up to a minute.
            let started = Instant::now();
            let mut tries = 0;
            loop {
                tries += 1;
                let outcome = self
                    .net
                    .write(
                        Sender::Driver,
                        self.net.endpoint(0),
                        WriteKind::Upsert,
                        values.clone(),
                    )
                    .await;
                if outcome == Outcome::Ok {
                    break;
                }
                if started.elapsed() > Duration::from_secs(60) {
                    let last =
                        self.net
                            .rec
                            .ops
                            .lock()
                            .unwrap()
                            .last()
                            .map(|op| match &op.request {
                                Request::Write(w) => w.detail.clone(),
                                _ => String::new(),
                            });
                    panic!(
                        "loading the background entries: {tries} tries in {:?}, the last {outcome:?} ({})",
                        started.elapsed(),
                        last.unwrap_or_default()
                    );
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }

    /// The index (in the cluster's nodes) of the current primary of `shard` (by address).
    fn primary_of(cluster: &RedisCluster, shard: usize) -> usize {
        let primaries = cluster.primaries();
        let port = primaries[shard % primaries.len()].port;
        cluster.nodes.iter().position(|n| n.port == port).unwrap()
    }

    async fn fault(&mut self, fault: &Fault) {
        let start = self.net.rec.now();
        let mut lost_slots = Vec::new();
        match (fault, &mut self.store) {
            (Fault::KillRedis, Store::Node(r)) => tokio::task::block_in_place(|| r.kill()),
            (Fault::RestartRedis, Store::Node(r)) => tokio::task::block_in_place(|| r.restart()),
            (Fault::RestartRedisEmpty, Store::Node(r)) => {
                tokio::task::block_in_place(|| r.restart_empty())
            }
            (Fault::Pause { .. }, Store::Node(r)) => {
                r.pause();
                self.paused = Some(0);
            }
            (Fault::Resume, Store::Node(r)) => {
                r.resume();
                self.paused = None;
            }
            (Fault::Pause { shard }, Store::Cluster(c)) => {
                let shard = shard.unwrap_or(0);
                let node = tokio::task::block_in_place(|| Self::primary_of(c, shard));
                c.nodes[node].pause();
                self.paused = Some(node);
            }
            (Fault::Resume, Store::Cluster(c)) => {
                let node = self.paused.take().expect("a paused node");
                c.nodes[node].resume();
                // Whole again (a pause past the node timeout was a failover) before the next.
                let ok = tokio::task::block_in_place(|| c.wait_ok(Duration::from_secs(30)));
                assert!(ok, "the cluster is ok again after SIGCONT");
            }
            (Fault::KillPrimary { shard }, Store::Cluster(c)) => {
                let node = tokio::task::block_in_place(|| Self::primary_of(c, *shard));
                tokio::task::block_in_place(|| {
                    c.nodes[node].kill();
                    assert!(
                        c.wait_failover(Duration::from_secs(30)),
                        "the replica was promoted"
                    );
                });
                self.killed = Some(node);
            }
            (Fault::RestartKilledNode, Store::Cluster(c)) => {
                let node = self.killed.take().expect("a killed node");
                tokio::task::block_in_place(|| {
                    c.nodes[node].restart();
                    assert!(c.wait_ok(Duration::from_secs(30)), "the node rejoined");
                });
            }
            (Fault::FlushShard, Store::Cluster(c)) => {
                lost_slots = tokio::task::block_in_place(|| {
                    let meta = namelist::store::layout::key_slot(
                        namelist::store::Layout::meta_key_of("nl:").as_bytes(),
                    );
                    let keeper = c.nodes[c.primary_of_slot(meta)].port;
                    let node = c
                        .primaries()
                        .into_iter()
                        .find(|n| n.port != keeper)
                        .expect("another primary");
                    let slots: Vec<u16> = c
                        .slot_map()
                        .into_iter()
                        .filter(|(_, _, port)| *port == node.port)
                        .flat_map(|(s, e, _)| s..=e)
                        .collect();
                    let () = redis::cmd("FLUSHALL").query(&mut node.conn()).unwrap();
                    slots
                });
            }
            (Fault::RestartInstance(slot), _) => self.restart_instance(*slot).await,
            (Fault::StartInstance, _) => self.start_instance().await,
            (Fault::KillPubsub | Fault::TrimLog, store) => {
                let urls = match store {
                    Store::Node(r) => vec![r.url()],
                    Store::Cluster(c) => c.urls(),
                };
                let trim = matches!(fault, Fault::TrimLog);
                tokio::task::block_in_place(|| {
                    if trim {
                        for url in &urls {
                            trim_log(url);
                        }
                    }
                    for url in urls {
                        kill_pubsub(&url);
                    }
                });
            }
            (Fault::Acl(rules), Store::Node(r)) => {
                tokio::task::block_in_place(|| acl_setuser(&r.url(), rules));
            }
            (f, _) => panic!("{f} is not a fault of a {:?}", self.schedule.topology),
        }
        let end = self.net.rec.now();
        self.net.rec.faults.lock().unwrap().push(FaultEvent {
            what: fault.to_string(),
            start,
            end,
            loses_keyspace: *fault == Fault::RestartRedisEmpty,
            lost_slots,
        });
    }

    async fn step(&mut self, step: &Step) {
        match step {
            Step::Wait(d) => tokio::time::sleep(*d).await,
            Step::Fault(f) => self.fault(f).await,
            Step::Upsert { slot, values } => {
                let ep = self.net.endpoint(*slot);
                self.net
                    .write(Sender::Driver, ep, WriteKind::Upsert, values.clone())
                    .await;
            }
            Step::UpsertUntilAcked { slot, values } => {
                let started = Instant::now();
                loop {
                    let ep = self.net.endpoint(*slot);
                    let outcome = self
                        .net
                        .write(Sender::Driver, ep, WriteKind::Upsert, values.clone())
                        .await;
                    // A refusal (`keyspace_lost`, what the contract wants after a loss) is an
                    // answer: nothing was written, and the checks after have nothing to miss.
                    // Only a store still coming back is tried again.
                    if outcome != Outcome::Unknown || started.elapsed() > Duration::from_secs(10) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            Step::Check { slot, values } => {
                let ep = self.net.endpoint(*slot);
                self.net.check(Sender::Driver, ep, values.clone()).await;
            }
        }
    }
}

/// `CLIENT KILL TYPE pubsub` on the node at `url` (a killed node refuses the connection:
/// nothing to kill there).
fn kill_pubsub(url: &str) {
    let conn = redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)));
    if let Ok(mut conn) = conn {
        let _: redis::RedisResult<i64> = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("pubsub")
            .query(&mut conn);
    }
}

/// `ACL SETUSER default <rules>` on the node at `url`.
fn acl_setuser(url: &str, rules: &str) {
    let mut conn = redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
        .expect("connect to change the ACL");
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER").arg("default");
    for rule in rules.split_whitespace() {
        cmd.arg(rule);
    }
    let _: () = cmd.query(&mut conn).expect("ACL SETUSER");
}

/// Trims every audit part (the change log) on the node at `url` to nothing; a replica (or a
/// node down) refuses, and is left alone.
fn trim_log(url: &str) {
    let conn = redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)));
    let Ok(mut conn) = conn else { return };
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*audit:{*}")
        .query(&mut conn)
        .unwrap_or_default();
    for k in keys {
        let _: redis::RedisResult<i64> = redis::cmd("XTRIM")
            .arg(&k)
            .arg("MAXLEN")
            .arg(0)
            .query(&mut conn);
    }
}

/// How the instances up at the end caught up after resubscribing, summed:
/// `namelist_tier_catch_ups_total` by `how` (`replayed`, `full`).
#[derive(Debug, Default)]
pub struct CatchUps {
    pub replayed: u64,
    pub full: u64,
}

async fn catch_ups(net: &Net) -> CatchUps {
    let ports: Vec<u16> = net
        .endpoints
        .read()
        .unwrap()
        .iter()
        .filter(|e| e.up)
        .map(|e| e.port)
        .collect();
    let mut out = CatchUps::default();
    for port in ports {
        let Ok(res) = net
            .http
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .send()
            .await
        else {
            continue;
        };
        let text = res.text().await.unwrap_or_default();
        let count = |how: &str| -> u64 {
            let series = format!("namelist_tier_catch_ups_total{{how=\"{how}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&series))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0) as u64
        };
        out.replayed += count("replayed");
        out.full += count("full");
    }
    out
}

/// What a run that kept the contract leaves: how the instances caught up after their
/// subscriptions broke, and the history itself.
pub struct Ran {
    pub caught_up: CatchUps,
    pub history: History,
}

/// Runs `schedule` and checks its history; panics, after printing the report, on a violation.
pub async fn run(schedule: Schedule) -> Ran {
    let began = Instant::now();
    eprint!("{schedule}");
    let mut run = Run::start(schedule).await;
    run.load_background().await;
    let stop = Arc::new(AtomicBool::new(false));
    let seed = run.schedule.seed.unwrap_or(0);
    let clients: Vec<_> = (0..run.schedule.clients)
        .map(|id| {
            tokio::spawn(client(
                id,
                seed,
                run.net.clone(),
                run.schedule.background,
                stop.clone(),
            ))
        })
        .collect();
    let steps = run.schedule.steps.clone();
    let steps_began = run.net.rec.now();
    for step in &steps {
        run.step(step).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.expect("a client");
    }
    let mut history = History {
        ops: std::mem::take(&mut *run.net.rec.ops.lock().unwrap()),
        faults: std::mem::take(&mut *run.net.rec.faults.lock().unwrap()),
    };
    history.ops.sort_by_key(|op| (op.start, op.end));
    let violations = checker::check(&history);
    if std::env::var_os("HISTORY_VERBOSE").is_some() {
        for (i, op) in history.ops.iter().enumerate() {
            let (s, e) = (
                crate::history::model::rel(op.start, 0),
                crate::history::model::rel(op.end, 0),
            );
            eprintln!("  #{i:<5} {s} .. {e}  {op}");
        }
        for f in &history.faults {
            let (s, e) = (
                crate::history::model::rel(f.start, 0),
                crate::history::model::rel(f.end, 0),
            );
            eprintln!("  fault  {s} .. {e}  {}", f.what);
        }
    }
    let caught_up = catch_ups(&run.net).await;
    eprintln!(
        "{}; catch-ups: {caught_up:?}",
        summary(&history, began.elapsed())
    );
    if violations.is_empty() {
        if std::env::var_os("HISTORY_KEEP_LOGS").is_some() {
            let Run { logs, services, .. } = run;
            drop(services); // the logs are complete
            eprintln!("the instances' logs are kept in {}", logs.keep().display());
        }
        return Ran { caught_up, history };
    }
    eprintln!(
        "\n{}",
        report(&run.schedule, steps_began, &history, &violations)
    );
    let Run {
        logs,
        services,
        schedule,
        ..
    } = run;
    drop(services); // the logs are complete
    let kept = logs.keep();
    eprintln!("the instances' logs are kept in {}", kept.display());
    let rules: BTreeSet<Rule> = violations.iter().map(|v| v.rule).collect();
    panic!(
        "{} violation(s) of the contract ({rules:?}) in {} (seed {seed}); the report is above",
        violations.len(),
        schedule.name
    );
}

/// Counts of what happened, printed whatever the verdict.
fn summary(h: &History, took: Duration) -> String {
    let mut writes: BTreeMap<&str, usize> = BTreeMap::new();
    let mut checks: BTreeMap<&str, usize> = BTreeMap::new();
    for op in &h.ops {
        match &op.request {
            Request::Write(w) => {
                *writes
                    .entry(match w.outcome {
                        Outcome::Ok => "ok",
                        Outcome::NotWritten => "not written",
                        Outcome::Unknown => "unknown",
                    })
                    .or_default() += 1
            }
            Request::Check(c) => {
                *checks
                    .entry(match &c.reply {
                        Reply::Answer(a) => match a.staleness {
                            Staleness::Fresh => "fresh",
                            Staleness::Stale(_) => "stale",
                            Staleness::Unbounded => "stale_ms null",
                        },
                        Reply::NoClaim(_) => "no claim",
                        Reply::Unexpected(_) => "unexpected",
                    })
                    .or_default() += 1
            }
        }
    }
    format!(
        "history: {} ops in {:.1} s; writes {writes:?}; checks {checks:?}; {} faults",
        h.ops.len(),
        took.as_secs_f64(),
        h.faults.len()
    )
}

/// The seed, the schedule, the faults as carried out, the count of violations by rule, and
/// for each rule its smallest violating piece of history (the earliest of the smallest).
fn report(
    schedule: &Schedule,
    steps_began: Micros,
    h: &History,
    violations: &[checker::Violation],
) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "=== HISTORY VIOLATION: {} (seed {}) ===\n{schedule}the steps began at {} (after \
         the setup), faults as carried out:\n",
        schedule.name,
        schedule
            .seed
            .map(|s| s.to_string())
            .unwrap_or_else(|| "none: a named schedule".into()),
        crate::history::model::rel(steps_began, 0)
    ));
    for f in &h.faults {
        out.push_str(&format!(
            "  {} .. {}  {}\n",
            crate::history::model::rel(f.start, 0),
            crate::history::model::rel(f.end, 0),
            f.what
        ));
    }
    let mut by_rule: BTreeMap<Rule, Vec<&checker::Violation>> = BTreeMap::new();
    for v in violations {
        by_rule.entry(v.rule).or_default().push(v);
    }
    for (rule, vs) in &by_rule {
        let checks: BTreeSet<usize> = vs.iter().map(|v| v.op).collect();
        out.push_str(&format!(
            "\n{} {rule:?} violation(s) in {} operation(s); the smallest:\n",
            vs.len(),
            checks.len()
        ));
        // The fewest operations; among those, the write the check missed closest to it.
        let gap = |v: &checker::Violation| {
            let latest = v.must.iter().map(|&m| h.ops[m].end).max().unwrap_or(0);
            h.ops[v.op].start.saturating_sub(latest)
        };
        let smallest = vs.iter().min_by_key(|v| (v.size(), gap(v))).unwrap();
        out.push_str(&checker::render(h, smallest));
        if std::env::var_os("HISTORY_ALL").is_some() {
            for v in vs {
                out.push_str(&checker::render(h, v));
            }
        }
    }
    if let Some(seed) = schedule.seed {
        let topology = format!("{:?}", schedule.topology).to_lowercase();
        out.push_str(&format!(
            "\nreplay: HISTORY_REPLAY={topology}:{seed} cargo nextest run -p namelist --test integration history::more_seeds\n"
        ));
    }
    out
}
