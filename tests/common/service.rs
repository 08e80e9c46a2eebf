//! The `namelist` binary in a child process, for the tests that need the real binary (start-up
//! refusals and their messages, logs written by the process, SIGTERM, a crash that must not
//! take the test down): one helper for all of them.
//!
//! A [`ServiceProcess`] runs with the environment the test gives and nothing else
//! (`env_clear`, then `NAMELIST_LISTEN` on a free port and the test's variables), writes its
//! stdout and stderr to a log file, is ready once `GET /readyz` answers 200, and is killed
//! when dropped. A free port can be taken by someone else between the probe and the bind: a
//! start that fails before it is ready is tried again on another port (up to 5 times), except
//! with [`ServiceBuilder::try_start`], whose caller wants to see a refusal.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

/// Starts tried before giving up on finding a free port.
const ATTEMPTS: usize = 5;

/// The `namelist` binary Cargo built for this package's tests. Only the `namelist` package has
/// it: another package's tests, which include these helpers by path, cannot start the service.
pub fn service_bin() -> &'static str {
    match option_env!("CARGO_BIN_EXE_namelist") {
        Some(bin) => bin,
        None => panic!("the namelist binary exists for the namelist package's own tests only"),
    }
}

/// How to start a [`ServiceProcess`].
#[derive(Debug, Clone)]
pub struct ServiceBuilder {
    vars: Vec<(OsString, OsString)>,
    log_dir: Option<PathBuf>,
    ready_within: Duration,
}

/// Why [`ServiceBuilder::try_start`] did not give a running service.
#[derive(Debug)]
pub struct Exited {
    pub status: ExitStatus,
    /// What the process wrote (stdout and stderr).
    pub log: String,
}

/// The service binary, running; killed when dropped.
#[derive(Debug)]
pub struct ServiceProcess {
    child: Option<Child>,
    port: u16,
    log: PathBuf,
    /// The log's directory, when the helper made it.
    _dir: Option<tempfile::TempDir>,
}

impl ServiceProcess {
    /// A builder with no variables but `NAMELIST_LISTEN`, logs in a temporary directory, and 10 s
    /// to get ready.
    pub fn builder() -> ServiceBuilder {
        ServiceBuilder {
            vars: Vec::new(),
            log_dir: None,
            ready_within: Duration::from_secs(10),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The process id (while it runs).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the service was stopped").id()
    }

    /// Everything the process has written so far (stdout and stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Its exit status, if it has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().expect("the child's status"))
    }

    /// Whether it is still running.
    pub fn alive(&mut self) -> bool {
        self.child.is_some() && self.try_wait().is_none()
    }

    /// Sends SIGTERM (what Kubernetes sends first).
    pub fn sigterm(&self) {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -TERM failed");
    }

    /// Waits for it to exit (blocking the thread); `None` if it still runs after `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// Kills it (SIGKILL) and reaps it; the log stays readable.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

impl ServiceBuilder {
    /// Adds an environment variable.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.vars.push((key.into(), value.into()));
        self
    }

    /// Adds environment variables.
    pub fn envs<K, V>(mut self, vars: impl IntoIterator<Item = (K, V)>) -> Self
    where
        K: Into<OsString>,
        V: Into<OsString>,
    {
        self.vars
            .extend(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// Writes the logs into `dir` (kept by the test) rather than a temporary directory.
    pub fn log_dir(mut self, dir: &Path) -> Self {
        self.log_dir = Some(dir.to_owned());
        self
    }

    /// How long a start may take to be ready.
    pub fn ready_within(mut self, limit: Duration) -> Self {
        self.ready_within = limit;
        self
    }

    /// Starts the service and waits until it is ready; tries other ports when a start fails
    /// (the port was taken, most likely); panics with the last log after [`ATTEMPTS`].
    pub async fn start(&self) -> ServiceProcess {
        let mut last = String::new();
        for _ in 0..ATTEMPTS {
            let mut service = self.spawn();
            match service.wait_ready(self.ready_within).await {
                Ok(()) => return service,
                Err(why) => last = format!("{why}:\n{}", service.log()),
            }
        }
        panic!("the namelist binary did not start: {last}");
    }

    /// [`start`](Self::start) from a test that has no Tokio runtime.
    pub fn start_blocking(&self) -> ServiceProcess {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(self.start())
    }

    /// One start: the service once ready, or how it exited when it stops first (a refused
    /// start-up). Panics if it does neither within the limit.
    pub async fn try_start(&self) -> Result<ServiceProcess, Exited> {
        let mut service = self.spawn();
        match service.wait_ready(self.ready_within).await {
            Ok(()) => Ok(service),
            Err(Waited::Exited(status)) => Err(Exited {
                status,
                log: service.log(),
            }),
            Err(Waited::TimedOut) => panic!(
                "the namelist binary neither started nor refused within {:?}:\n{}",
                self.ready_within,
                service.log()
            ),
        }
    }

    fn spawn(&self) -> ServiceProcess {
        let port = free_port();
        let dir = match &self.log_dir {
            Some(_) => None,
            None => Some(tempfile::tempdir().expect("a temporary directory")),
        };
        let log_dir = self
            .log_dir
            .as_deref()
            .or(dir.as_ref().map(|d| d.path()))
            .expect("a log directory");
        let log = log_dir.join(format!("namelist-{port}.log"));
        let out = std::fs::File::create(&log).expect("the log file");
        let child = Command::new(service_bin())
            .env_clear()
            .env("NAMELIST_LISTEN", format!("127.0.0.1:{port}"))
            .envs(self.vars.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("the log file"))
            .stderr(out)
            .spawn()
            .expect("spawning the namelist binary");
        ServiceProcess {
            child: Some(child),
            port,
            log,
            _dir: dir,
        }
    }
}

/// Why a start did not get ready.
#[derive(Debug)]
enum Waited {
    Exited(ExitStatus),
    TimedOut,
}

impl std::fmt::Display for Waited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Waited::Exited(status) => write!(f, "exited {status} before it was ready"),
            Waited::TimedOut => write!(f, "not ready in time"),
        }
    }
}

impl ServiceProcess {
    /// Polls `GET /readyz` until it answers 200; stops (and kills the process when it did not
    /// exit) when the process exits or `limit` passes.
    async fn wait_ready(&mut self, limit: Duration) -> Result<(), Waited> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.try_wait() {
                self.kill();
                return Err(Waited::Exited(status));
            }
            if started.elapsed() > limit {
                self.kill();
                return Err(Waited::TimedOut);
            }
            let addr = self.addr();
            let ready = tokio::task::spawn_blocking(move || readyz(addr))
                .await
                .expect("the readiness probe");
            if ready {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// Whether `GET /readyz` answers 200, over a plain socket with short timeouts.
fn readyz(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
    if s.write_all(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200")
}
