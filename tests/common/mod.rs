//! Test support: real `redis-server` processes on free ports, and the real application on
//! port 0 (in-process, or the binary in a child process: `service.rs`). No mock Redis anywhere.
//!
//! The tools' crate includes this file by path (`tools/tests/*.rs`), so it must compile there
//! too: it names no binary at compile time.
#![allow(dead_code)]

mod service;

// Not every test binary starts the service (the tools' never do).
#[allow(unused_imports)]
pub use service::{Exited, ServiceBuilder, ServiceProcess, service_bin};

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use namelist::config::{LogFormat, Settings};
use namelist::lists::NameLists;
use namelist::startup::Application;
use namelist::store::redis::RedisOptions;
use namelist::store::{FingerprintKey, Hashing};
use secrecy::SecretString;

/// The fingerprint key of the tests (hex, as a key file holds it): every keyspace a test makes
/// is keyed with it unless the test is about format 1 or other keys.
pub const TEST_KEY_HEX: &str = "3b9f1c7e2a6d4058b1e7c3a9f0d2846e5c1a7b3f9e0d2c4a6b8f1e3d5c7a9b0d";

/// The tests' fingerprint key.
pub fn test_key() -> FingerprintKey {
    FingerprintKey::from_hex(TEST_KEY_HEX, "the tests' key").expect("a valid test key")
}

/// Options for a Redis store in tests: one node at `url` (or a cluster: set `cluster_nodes`),
/// keyed with [`test_key`], 1 s to connect, 10 s per response, 1,000 audit records, no
/// replicas waited for; a test changes what it needs with `..redis_options(url, prefix)`.
pub fn redis_options(url: impl Into<String>, prefix: impl Into<String>) -> RedisOptions {
    RedisOptions {
        url: url.into(),
        cluster_nodes: Vec::new(),
        prefix: prefix.into(),
        expected_entries: None,
        default_expected_entries: 1_000_000,
        connect_timeout: Duration::from_secs(1),
        response_timeout: Duration::from_secs(10),
        audit_max_len: 1_000,
        write_replicas: 0,
        write_connections: namelist::store::redis::DEFAULT_WRITE_CONNECTIONS,
        fingerprint_key: Some(test_key()),
        allow_unkeyed: false,
        dedupe_expected_ids: namelist::store::layout::DEFAULT_EXPECTED_EVENT_IDS,
    }
}

/// The tests' hashing: keyed with [`test_key`].
pub fn keyed() -> Hashing {
    Hashing::Keyed(test_key())
}

/// A file holding [`TEST_KEY_HEX`], mode 0600, made once per test process (for the binaries
/// and `Settings::fingerprint_key_file`).
pub fn key_file() -> &'static Path {
    static FILE: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &FILE
        .get_or_init(|| {
            let dir = tempfile::tempdir().expect("temp dir");
            let path = dir.path().join("fingerprint.key");
            write_key_file(&path, TEST_KEY_HEX);
            (dir, path)
        })
        .1
}

/// Writes `hex` to a new key file, mode 0600.
pub fn write_key_file(path: &Path, hex: &str) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| writeln!(f, "{hex}"))
        .expect("writing a key file");
}

/// A valid fingerprint key that is not [`TEST_KEY_HEX`].
pub const WRONG_KEY_HEX: &str = "c0ffee00112233445566778899aabbccddeeff00112233445566778899aabbcc";

/// Key files for start-up tests: the right one, a wrong one, an exposed copy of the right one
/// (mode 0644) and a placeholder; removed when dropped.
pub struct KeyFiles {
    _dir: tempfile::TempDir,
    pub right: PathBuf,
    pub wrong: PathBuf,
    pub exposed: PathBuf,
    pub placeholder: PathBuf,
}

impl KeyFiles {
    pub fn new() -> Self {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = |n: &str| dir.path().join(n);
        let (right, wrong, exposed, placeholder) = (
            path("right.key"),
            path("wrong.key"),
            path("exposed.key"),
            path("placeholder.key"),
        );
        write_key_file(&right, TEST_KEY_HEX);
        write_key_file(&wrong, WRONG_KEY_HEX);
        write_key_file(&exposed, TEST_KEY_HEX);
        std::fs::set_permissions(&exposed, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_key_file(&placeholder, "CHANGE-ME");
        Self {
            _dir: dir,
            right,
            wrong,
            exposed,
            placeholder,
        }
    }
}

/// How a start-up went (the service's or a tool's), with what the process wrote.
#[derive(Debug)]
pub enum Outcome {
    Started(String),
    Refused(String),
}

impl Outcome {
    pub fn started(self) -> String {
        match self {
            Outcome::Started(s) => s,
            Outcome::Refused(s) => panic!("expected a start, refused: {s}"),
        }
    }

    pub fn refused(self) -> String {
        match self {
            Outcome::Refused(s) => s,
            Outcome::Started(s) => panic!("expected a refusal, started: {s}"),
        }
    }
}

/// The `<prefix>meta` hash of a keyspace.
pub fn keyspace_meta(
    redis: &RedisServer,
    prefix: &str,
) -> std::collections::HashMap<String, String> {
    redis::cmd("HGETALL")
        .arg(format!("{prefix}meta"))
        .query(&mut redis.conn())
        .unwrap()
}

/// A `redis-server` of the test's own, killed when dropped.
pub struct RedisServer {
    pub port: u16,
    dir: tempfile::TempDir,
    args: Vec<String>,
    child: Option<Child>,
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The `redis-server` binary: `$REDIS_SERVER` or the one on `PATH`.
pub fn redis_server_bin() -> PathBuf {
    std::env::var_os("REDIS_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("redis-server"))
}

/// Redis's CPU so far (`used_cpu_user + used_cpu_sys` of `INFO cpu`), in seconds; 0 when it
/// does not answer. The benches read it around a run: Redis's time per request.
pub fn redis_cpu_seconds(url: &str) -> f64 {
    let info: String = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .and_then(|mut c| redis::cmd("INFO").arg("cpu").query(&mut c))
        .unwrap_or_default();
    ["used_cpu_user:", "used_cpu_sys:"]
        .iter()
        .filter_map(|k| {
            info.lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .sum()
}

impl RedisServer {
    /// Starts a server with the test defaults (no persistence, DEBUG allowed).
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server on `port` (`None` if it could not start there).
    pub fn start_on(port: u16, extra: &[&str]) -> Option<Self> {
        let mut server = Self {
            port,
            dir: tempfile::tempdir().expect("temp dir"),
            args: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
        };
        server.spawn().then_some(server)
    }

    /// Starts a server with extra `redis-server` arguments (`["--hash-max-listpack-entries", "64"]`).
    pub fn start_with(extra: &[&str]) -> Self {
        let args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        for _ in 0..10 {
            let port = free_port();
            let mut server = Self {
                port,
                dir: tempfile::tempdir().expect("temp dir"),
                args: args.clone(),
                child: None,
            };
            if server.spawn() {
                return server;
            }
        }
        panic!(
            "could not start redis-server ({}); is it installed?",
            redis_server_bin().display()
        );
    }

    fn spawn(&mut self) -> bool {
        let child = Command::new(redis_server_bin())
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--enable-debug-command", "yes"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning redis-server");
        self.child = Some(child);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(5) {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return false; // exited: port taken, most likely
            }
            if let Ok(mut c) = redis::Client::open(self.url()).and_then(|c| c.get_connection())
                && redis::cmd("PING").query::<String>(&mut c).is_ok()
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        false
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A plain synchronous connection, for arranging and inspecting state.
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .expect("client")
            .get_connection()
            .expect("connection")
    }

    /// `ACL SETUSER <user> <rule>`: what `user` may run from now on (`-set`, `+hget`…).
    pub fn acl_setuser(&self, user: &str, rule: &str) {
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(user)
            .arg(rule)
            .query(&mut self.conn())
            .expect("ACL SETUSER");
    }

    /// `CLIENT LIST`: a line per connection, with its last command (`cmd=`) and protocol
    /// (`resp=`), for tests of which connection carried what.
    pub fn client_list(&self) -> String {
        redis::cmd("CLIENT")
            .arg("LIST")
            .query(&mut self.conn())
            .expect("CLIENT LIST")
    }

    /// `DBSIZE`: keys in the server.
    pub fn dbsize(&self) -> u64 {
        redis::cmd("DBSIZE").query(&mut self.conn()).unwrap()
    }

    /// One figure (`calls`, `usec`, `failed_calls`, ...) of one command (a subcommand as
    /// `xinfo|stream`) in `INFO commandstats`, the commands scripts ran included; 0 if it
    /// never ran.
    pub fn command_stat(&self, command: &str, figure: &str) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.conn())
            .expect("INFO commandstats");
        let line = format!("cmdstat_{command}:");
        info.lines()
            .find_map(|l| l.strip_prefix(&line))
            .and_then(|rest| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(figure)?.strip_prefix('=')?.parse().ok())
            })
            .unwrap_or(0)
    }

    /// SIGKILL: the server vanishes mid-conversation, as in a crash.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port (its data is gone, unless its arguments
    /// turned persistence on: then it loads its AOF or RDB file again).
    pub fn restart(&mut self) {
        self.kill();
        for _ in 0..50 {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server did not restart on port {}", self.port);
    }

    /// Starts the server again on the same port with no data, whatever its persistence: its
    /// directory (AOF, RDB; a cluster node's `nodes.conf` too, so it would come back alone)
    /// is emptied first. What a restart without a volume does.
    pub fn restart_empty(&mut self) {
        self.kill();
        for entry in std::fs::read_dir(self.dir.path()).expect("the server's directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                std::fs::remove_dir_all(&path).expect("removing the AOF directory");
            } else {
                std::fs::remove_file(&path).expect("removing a data file");
            }
        }
        self.restart();
    }

    /// Redis stalls for `secs` (`DEBUG SLEEP`, as in a slow fork or a failover), sent from a
    /// thread of its own: the returned handle ends when Redis answers again.
    pub fn debug_sleep(&self, secs: f64) -> std::thread::JoinHandle<()> {
        let mut conn = self.conn();
        std::thread::spawn(move || {
            let _: () = redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg(secs)
                .query(&mut conn)
                .expect("DEBUG SLEEP");
        })
    }

    /// A digest of the whole dataset (`DEBUG DIGEST`): equal digests, equal data.
    pub fn digest(&self) -> String {
        redis::cmd("DEBUG")
            .arg("DIGEST")
            .query(&mut self.conn())
            .expect("DEBUG DIGEST")
    }

    /// Starts a replica of `primary` (`--replicaof`), with `extra` arguments.
    pub fn start_replica_of(primary: &RedisServer, extra: &[&str]) -> Self {
        let port = primary.port.to_string();
        let mut args = vec!["--replicaof", "127.0.0.1", port.as_str()];
        args.extend_from_slice(extra);
        Self::start_with(&args)
    }

    /// Replicas this (primary) node sees online (`INFO replication`): what `WAIT` counts.
    pub fn online_replicas(&self) -> usize {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .and_then(|mut c| {
                redis::cmd("INFO")
                    .arg("replication")
                    .query::<String>(&mut c)
            })
            .map(|info| {
                info.lines()
                    .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                    .count()
            })
            .unwrap_or(0)
    }

    /// Waits until this primary sees `n` replicas online.
    pub fn wait_online_replicas(&self, n: usize, limit: Duration) -> bool {
        let started = Instant::now();
        while started.elapsed() < limit {
            if self.online_replicas() >= n {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Sends a signal to the process (`STOP`, `CONT`).
    fn signal(&self, sig: &str) {
        let child = self.child.as_ref().expect("a running server");
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(child.id().to_string())
            .status()
            .expect("running kill")
            .success();
        assert!(ok, "kill -{sig} {}", child.id());
    }

    /// SIGSTOP: the process freezes with its connections open (its primary still counts it
    /// as a connected replica; it acknowledges nothing).
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// SIGCONT after `pause`.
    pub fn resume(&self) {
        self.signal("CONT");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            // A paused server cannot die of SIGKILL until it runs again.
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(c.id().to_string())
                .status();
        }
        self.kill();
    }
}

/// A local Redis Cluster of 3 primaries and 3 replicas, `redis-server --cluster-enabled yes`
/// joined by `redis-cli --cluster create ... --cluster-replicas 1`.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

/// A port whose cluster-bus port (+10000) is free too.
fn free_cluster_port() -> u16 {
    loop {
        let p = 20_000 + (rand_u16() % 25_000);
        let ok = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if ok(p) && ok(p + 10_000) {
            return p;
        }
    }
}

fn rand_u16() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.finish() as u16
}

impl RedisCluster {
    /// Starts six nodes and joins them (a node timeout of 1 s, so failover is quick).
    pub fn start() -> Self {
        for _ in 0..5 {
            let mut nodes = Vec::new();
            while nodes.len() < 6 {
                let port = free_cluster_port();
                if let Some(n) = RedisServer::start_on(
                    port,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-node-timeout",
                        "1000",
                        "--repl-diskless-sync-delay",
                        "0",
                    ],
                ) {
                    nodes.push(n);
                }
            }
            let addrs: Vec<String> = nodes
                .iter()
                .map(|n| format!("127.0.0.1:{}", n.port))
                .collect();
            let out = Command::new("redis-cli")
                .args(["--cluster", "create"])
                .args(&addrs)
                .args(["--cluster-replicas", "1", "--cluster-yes"])
                .output()
                .expect("running redis-cli --cluster create");
            if !out.status.success() {
                continue;
            }
            let cluster = Self { nodes };
            if cluster.wait_ok(Duration::from_secs(20)) {
                return cluster;
            }
        }
        panic!("could not start a local Redis Cluster");
    }

    /// Waits until every live node reports `cluster_state:ok` and sees every slot covered.
    pub fn wait_ok(&self, limit: Duration) -> bool {
        let started = Instant::now();
        while started.elapsed() < limit {
            let all_ok = self.nodes.iter().filter(|n| n.child.is_some()).all(|n| {
                redis::Client::open(n.url())
                    .and_then(|c| c.get_connection())
                    .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut c))
                    .is_ok_and(|info| {
                        info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
                    })
            });
            if all_ok {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Waits until a replica has taken over from a dead primary: three live primaries again,
    /// and the cluster is ok.
    pub fn wait_failover(&self, limit: Duration) -> bool {
        let started = Instant::now();
        while started.elapsed() < limit {
            let primaries = self.nodes.iter().filter(|n| Self::is_primary(n)).count();
            if primaries == 3 && self.wait_ok(Duration::from_millis(1)) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Waits until every primary has a replica online (synced), so `WAIT 1` succeeds.
    pub fn wait_replicas_online(&self, limit: Duration) -> bool {
        let started = Instant::now();
        while started.elapsed() < limit {
            let all = self.nodes.iter().filter(|n| Self::is_primary(n)).all(|n| {
                redis::Client::open(n.url())
                    .and_then(|c| c.get_connection())
                    .and_then(|mut c| {
                        redis::cmd("INFO")
                            .arg("replication")
                            .query::<String>(&mut c)
                    })
                    .is_ok_and(|i| i.contains("state=online"))
            });
            if all {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// The seed URLs.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// A node currently acting as a primary.
    pub fn primary(&self) -> usize {
        self.nodes
            .iter()
            .position(Self::is_primary)
            .expect("a primary")
    }

    /// The live nodes acting as primaries (`ROLE`), in address order as text: the order in
    /// which the tools walk them (`ScanTarget`s sorted by `host:port`).
    pub fn primaries(&self) -> Vec<&RedisServer> {
        let mut out: Vec<&RedisServer> =
            self.nodes.iter().filter(|n| Self::is_primary(n)).collect();
        out.sort_by_key(|n| format!("127.0.0.1:{}", n.port));
        out
    }

    fn is_primary(node: &RedisServer) -> bool {
        node.child.is_some()
            && redis::Client::open(node.url())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("ROLE").query::<redis::Value>(&mut c))
                .is_ok_and(|v| format!("{v:?}").contains("master"))
    }

    /// A digest of the primaries' data, in port order (equal digests, equal data). Replicas
    /// are left out: they catch up asynchronously.
    pub fn digest(&self) -> String {
        self.nodes
            .iter()
            .filter(|n| Self::is_primary(n))
            .map(RedisServer::digest)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Slot ranges and the port of the primary serving each (`CLUSTER SLOTS` asked of a live
    /// node).
    pub fn slot_map(&self) -> Vec<(u16, u16, u16)> {
        let node = self
            .nodes
            .iter()
            .find(|n| n.child.is_some())
            .expect("a live node");
        let reply: redis::Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut node.conn())
            .expect("CLUSTER SLOTS");
        let redis::Value::Array(ranges) = reply else {
            panic!("CLUSTER SLOTS: {reply:?}")
        };
        ranges
            .iter()
            .map(|r| {
                let redis::Value::Array(r) = r else {
                    panic!("{r:?}")
                };
                let int = |v: &redis::Value| match v {
                    redis::Value::Int(i) => *i,
                    other => panic!("{other:?}"),
                };
                let redis::Value::Array(primary) = &r[2] else {
                    panic!("{r:?}")
                };
                (
                    int(&r[0]) as u16,
                    int(&r[1]) as u16,
                    int(&primary[1]) as u16,
                )
            })
            .collect()
    }

    /// The node (index) serving `slot` as primary.
    pub fn primary_of_slot(&self, slot: u16) -> usize {
        let port = self
            .slot_map()
            .into_iter()
            .find(|(s, e, _)| (*s..=*e).contains(&slot))
            .map(|(_, _, p)| p)
            .expect("every slot served");
        self.nodes
            .iter()
            .position(|n| n.port == port)
            .expect("a node of ours")
    }

    /// A node (index) replicating `primary`, per `ROLE`.
    pub fn replica_of(&self, primary: usize) -> Option<usize> {
        let port = i64::from(self.nodes[primary].port);
        self.nodes.iter().position(|n| {
            n.child.is_some()
                && redis::cmd("ROLE")
                    .query::<redis::Value>(&mut n.conn())
                    .is_ok_and(|v| match v {
                        redis::Value::Array(a) => {
                            format!("{:?}", a.first()).contains("slave")
                                && matches!(a.get(2), Some(redis::Value::Int(p)) if *p == port)
                        }
                        _ => false,
                    })
        })
    }

    /// A cluster connection (sync), for arranging and inspecting state.
    pub fn conn(&self) -> redis::cluster::ClusterConnection {
        redis::cluster::ClusterClient::new(self.urls())
            .expect("cluster client")
            .get_connection()
            .expect("cluster connection")
    }
}

/// A Redis to run a suite on: one node, or a local cluster.
pub enum Backend {
    Node(RedisServer),
    Cluster(RedisCluster),
}

impl Backend {
    /// Test settings (a fresh key prefix) on this Redis.
    pub fn settings(&self) -> Settings {
        match self {
            Backend::Node(r) => redis_settings(r),
            Backend::Cluster(c) => cluster_settings(c),
        }
    }

    /// A digest of all the data (equal digests, equal data).
    pub fn digest(&self) -> String {
        match self {
            Backend::Node(r) => r.digest(),
            Backend::Cluster(c) => c.digest(),
        }
    }
}

/// Test settings on this cluster.
pub fn cluster_settings(cluster: &RedisCluster) -> Settings {
    Settings {
        redis_cluster_nodes: cluster.urls(),
        ..test_settings()
    }
}

static PREFIXES: AtomicU32 = AtomicU32::new(0);

/// A key prefix no other test in this process uses.
pub fn unique_prefix() -> String {
    format!("t{}:", PREFIXES.fetch_add(1, Ordering::Relaxed))
}

/// Test settings: quiet, one worker, port 0, embedded store, the tests' fingerprint key, and a
/// check deadline that a busy CI machine running debug builds meets (tests about deadlines set
/// their own).
pub fn test_settings() -> Settings {
    Settings {
        listen: "127.0.0.1:0".into(),
        workers: Some(1),
        log_format: LogFormat::Text,
        key_prefix: unique_prefix(),
        check_deadline_ms: 500,
        fingerprint_key_file: Some(key_file().to_owned()),
        // Load the local tier as fast as Redis answers: test keyspaces are small.
        local_fetch_rate: 0,
        local_refresh_rate: 0,
        // Tests read a metric right after what moves it.
        metrics_max_age_ms: 0,
        ..Settings::default()
    }
}

/// Test settings on this Redis.
pub fn redis_settings(redis: &RedisServer) -> Settings {
    Settings {
        redis_url: Some(SecretString::from(redis.url())),
        ..test_settings()
    }
}

/// A running application.
pub struct TestApp {
    pub address: String,
    pub port: u16,
    pub client: reqwest::Client,
    pub lists: actix_web::web::Data<NameLists>,
    handle: actix_web::dev::ServerHandle,
    /// The running application: awaited by `stop` (the embedded store's data directory is
    /// released when it ends).
    running: std::sync::Mutex<Option<tokio::task::JoinHandle<std::io::Result<()>>>>,
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.address, path)
    }

    pub async fn post(&self, path: &str, body: &serde_json::Value) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .expect("request")
    }

    pub async fn post_raw(&self, path: &str, body: impl Into<reqwest::Body>) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("request")
    }

    pub async fn delete(&self, path: &str, body: &serde_json::Value) -> reqwest::Response {
        self.client
            .delete(self.url(path))
            .json(body)
            .send()
            .await
            .expect("request")
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(self.url(path))
            .send()
            .await
            .expect("request")
    }

    /// `POST /v1/check`, expecting 200, returning the body.
    pub async fn check(&self, body: &serde_json::Value) -> serde_json::Value {
        let res = self.post("/v1/check", body).await;
        assert_eq!(res.status(), 200, "check failed");
        res.json().await.expect("check body")
    }

    /// The value of one series on `/metrics` (`name` or `name{labels}`, exactly as rendered).
    pub async fn metric(&self, series: &str) -> Option<f64> {
        let text = self.get("/metrics").await.text().await.expect("/metrics");
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    }

    /// Stops the server gracefully and waits until the application has ended.
    pub async fn stop(&self) {
        self.handle.stop(true).await;
        let running = self.running.lock().unwrap().take();
        if let Some(running) = running {
            let _ = running.await;
        }
    }
}

/// Builds and runs the app; returns once it listens, its invalidation subscription is up and
/// its local tier has settled (complete and loaded, for the small keyspaces of tests), so
/// tests start from a known state.
pub async fn spawn_app(settings: Settings) -> TestApp {
    if std::env::var_os("NAMELIST_TEST_LOG").is_some() {
        namelist::telemetry::init(LogFormat::Text);
    }
    let app = Application::build(settings)
        .await
        .expect("application starts");
    let port = app.port();
    let lists = app.lists();
    let handle = app.handle();
    let running = tokio::spawn(app.run_until_stopped());
    let started = Instant::now();
    while !lists.cache().is_trusted() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "invalidation subscription did not come up"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        lists.cache().wait_settled(Duration::from_secs(20)).await,
        "the local tier did not settle (sized and, if complete, loaded)"
    );
    TestApp {
        address: format!("http://127.0.0.1:{port}"),
        port,
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .expect("http client"),
        lists,
        handle,
        running: std::sync::Mutex::new(Some(running)),
    }
}

/// A command for the binary `bin` without the test's own `NAMELIST_*` variables.
pub fn without_namelist_env(bin: &str) -> Command {
    let mut cmd = Command::new(bin);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("NAMELIST_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Writes `StoreBase` for a test's wrapper around a store (a field `inner`), each method
/// answered by the store it wraps: `store_base_from_inner!(LateAnswers);`. (Not every test
/// crate that includes this module wraps a store.)
#[allow(unused_macros)]
macro_rules! store_base_from_inner {
    ($wrapper:ty) => {
        #[async_trait::async_trait]
        impl namelist::store::StoreBase for $wrapper {
            fn kind(&self) -> &'static str {
                self.inner.kind()
            }
            fn layout(&self) -> &namelist::store::layout::Layout {
                self.inner.layout()
            }
            async fn ping(&self) -> namelist::store::StoreResult<()> {
                self.inner.ping().await
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use store_base_from_inner;
