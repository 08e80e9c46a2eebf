//! Building and running the application: open the store, start the service's background
//! tasks, bind the listener and serve. Tests use `Application::build` with port 0.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::middleware::from_fn;
use actix_web::{App, HttpServer, web};

use crate::audit_trail::AuditTrail;
use crate::auth::Tokens;
use crate::config::{ConfigError, DEFAULT_EXPECTED_ENTRIES, LogFormat, Settings};
use crate::instrumented::Instrumented;
use crate::lane::OperatorLane;
use crate::lists::NameLists;
use crate::metrics::{Metrics, StoreOp};
use crate::routes;
use crate::routes::json::BodyLimit;
use crate::routes::limits::{ClassBudgets, Limits};
use crate::store::fingerprint::{self, FingerprintKey, KeyError};
use crate::store::memory::MemoryStore;
use crate::store::redis::{RedisOptions, RedisStore};
use crate::store::{AuditReports, Deadline, Hashing, Layout, Store, StoreError};
use crate::velocity::Velocity;

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Tokens(#[from] crate::auth::TokensError),
    #[error("opening the store: {0}")]
    Store(#[from] StoreError),
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("starting the operator lane: {0}")]
    Lane(std::io::Error),
    #[error("binding {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
}

/// Repeats a start-up warning on stderr for a human at a terminal (text logs), where a log
/// filter could hide it; JSON logs stay one JSON object per line.
fn shout(settings: &Settings, warning: &str) {
    if settings.log_format == LogFormat::Text {
        eprintln!("WARNING: {warning}");
    }
}

/// The opened store, and the embedded one again if that is what it is (for snapshots).
pub struct OpenedStore {
    pub store: Arc<dyn Store>,
    pub memory: Option<Arc<MemoryStore>>,
}

/// Logs the loud line of an unkeyed keyspace (at ERROR, every start-up, like missing auth).
fn unkeyed_loudly(settings: &Settings, line: Option<&str>) {
    if let Some(line) = line {
        tracing::error!("{line}");
        shout(settings, line);
    }
}

/// Opens the configured store: Redis when a URL is set, else the embedded one.
pub async fn open_store(settings: &Settings) -> Result<OpenedStore, StartupError> {
    let cluster = !settings.redis_cluster_nodes.is_empty();
    match (&settings.redis_url, cluster) {
        (Some(_), _) | (None, true) => {
            let (store, report) = RedisStore::open(RedisOptions::from_settings(settings)?).await?;
            tracing::info!(
                store = if cluster { "redis-cluster" } else { "redis" },
                prefix = settings.key_prefix,
                buckets = report.buckets,
                created = report.created,
                format = report.format,
                key_id = report.key_id,
                audit_indexed = report.audit_indexed,
                "keyspace open"
            );
            unkeyed_loudly(settings, report.unkeyed.as_deref());
            for w in &report.warnings {
                tracing::warn!("{w}");
                shout(settings, w);
            }
            // Bookkeeping: a fold that fails (the counts' primary down) is tried again at the
            // next start; the service runs meanwhile.
            match store.fold_old_counts().await {
                Ok(f) if f.pairs > 0 || f.left_alone > 0 => tracing::info!(
                    pairs = f.pairs,
                    left_alone = f.left_alone,
                    "folded the lists' counts of the older layout"
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!(
                    error = %e,
                    "could not fold the lists' counts of the older layout: GET /v1/lists undercounts until a start does"
                ),
            }
            Ok(OpenedStore {
                store: Arc::new(store),
                memory: None,
            })
        }
        (None, false) => {
            let snapshot = match &settings.snapshot_path {
                Some(p) => MemoryStore::snapshot_meta(p)?,
                None => None,
            };
            let key = embedded_key(settings, snapshot.as_ref())?;
            let (hashing, loud) = match &snapshot {
                Some(meta) => fingerprint::open_recorded(
                    &meta.hashing,
                    key.as_ref(),
                    &format!("snapshot {}", snapshot_display(settings)),
                )
                .map_err(StoreError::Keyspace)?,
                None => (
                    Hashing::Keyed(key.expect("a key for every new embedded store")),
                    None,
                ),
            };
            let buckets = match (settings.expected_entries, &snapshot) {
                (Some(e), _) => Layout::buckets_for(e),
                (None, Some(meta)) => meta.buckets,
                (None, None) => Layout::buckets_for(DEFAULT_EXPECTED_ENTRIES),
            };
            let key_id = hashing.key_id().map(str::to_owned);
            let store = Arc::new(MemoryStore::open(
                Layout::new(settings.key_prefix.clone(), buckets, hashing),
                settings.audit_max_len,
                settings.snapshot_path.clone(),
            )?);
            tracing::info!(
                store = "memory",
                buckets,
                snapshot = ?settings.snapshot_path,
                key_id,
                "embedded store open (no NAMELIST_REDIS_URL): for development and tests"
            );
            unkeyed_loudly(settings, loud.as_deref());
            Ok(OpenedStore {
                store: store.clone(),
                memory: Some(store),
            })
        }
    }
}

fn snapshot_display(settings: &Settings) -> String {
    settings
        .snapshot_path
        .as_ref()
        .map_or_else(String::new, |p| p.display().to_string())
}

/// The embedded store's fingerprint key, so that `cargo run` needs no set-up: the configured
/// key file if there is one; else, with a snapshot, the file `<snapshot>.key` beside it (made,
/// mode 0600, with a new snapshot; a keyed snapshot without it is refused); else a new key for
/// this process (its store dies with it). `None` only for an unkeyed (format 1) snapshot.
fn embedded_key(
    settings: &Settings,
    snapshot: Option<&crate::store::memory::SnapshotMeta>,
) -> Result<Option<FingerprintKey>, StartupError> {
    if let Some(key) = settings.fingerprint_key()? {
        return Ok(Some(key));
    }
    let Some(path) = &settings.snapshot_path else {
        return Ok(Some(FingerprintKey::generate(
            "generated for this process",
        )?));
    };
    let mut key_path = path.clone().into_os_string();
    key_path.push(".key");
    let key_path = std::path::PathBuf::from(key_path);
    if key_path.exists() {
        return Ok(Some(FingerprintKey::from_file(&key_path)?));
    }
    match snapshot.map(|m| (m.hashing.format, m.hashing.key_id.as_deref())) {
        None => {
            let key = FingerprintKey::create_file(&key_path)?;
            tracing::info!(
                key_file = %key_path.display(),
                key_id = key.id(),
                "new fingerprint key for the embedded store, kept beside its snapshot"
            );
            Ok(Some(key))
        }
        Some((fingerprint::FORMAT_UNKEYED, _)) => Ok(None),
        Some((_, id)) => Err(StoreError::Keyspace(format!(
            "snapshot {} is keyed (key id {}) but its key file {} is missing: restore that file, \
             or set NAMELIST_FINGERPRINT_KEY_FILE to the key the snapshot was made with, or move the snapshot away",
            path.display(),
            id.unwrap_or("?"),
            key_path.display()
        ))
        .into()),
    }
}

/// A built application, bound and ready to run.
pub struct Application {
    port: u16,
    server: actix_web::dev::Server,
    lists: web::Data<NameLists>,
    memory: Option<Arc<MemoryStore>>,
    snapshotter: Option<tokio::task::JoinHandle<()>>,
    reloader: Option<tokio::task::JoinHandle<()>>,
    audit_reader: tokio::task::JoinHandle<()>,
}

/// Reads the last audit's summary now and every `every`, into the audit gauges. A store that
/// does not answer leaves the gauges as they were.
fn spawn_audit_reader(
    store: Arc<dyn AuditReports>,
    metrics: Arc<Metrics>,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    let store = Instrumented::new(store, metrics.clone());
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let deadline = Deadline::after(Duration::from_secs(5));
            match store
                .call(StoreOp::AuditSummary, deadline, |s| s.audit_summary())
                .await
            {
                Ok(Some(s)) => metrics.set_audit(&s),
                Ok(None) => {}
                Err(e) => tracing::debug!(error = %e, "reading the audit summary failed"),
            }
        }
    })
}

impl Application {
    /// Opens the store and binds the listener (`listen` may use port 0).
    pub async fn build(settings: Settings) -> Result<Self, StartupError> {
        let tokens = Arc::new(Tokens::load(settings.tokens_file.as_deref())?);
        if tokens.is_open() {
            let warning = "NO AUTH: no tokens file (NAMELIST_TOKENS_FILE) is configured, so every \
                           /v1 endpoint is open to anyone who can reach this port";
            tracing::error!("{warning}");
            shout(&settings, warning);
        } else {
            tracing::info!(tokens = tokens.len(), "bearer-token auth on");
        }
        let reloader = tokens.spawn_reloader(Duration::from_secs(10));
        let opened = open_store(&settings).await?;
        let metrics = Arc::new(Metrics::new());
        let audit_reader = spawn_audit_reader(
            opened.store.clone(),
            metrics.clone(),
            Duration::from_secs(settings.audit_refresh_secs),
        );
        let lists = web::Data::new(NameLists::new(
            opened.store.clone(),
            opened.store.clone(),
            settings.list_settings(),
            metrics.clone(),
        ));
        let audit_trail = web::Data::new(AuditTrail::new(
            opened.store.clone(),
            metrics.clone(),
            Duration::from_millis(settings.write_deadline_ms),
        ));
        let velocity = web::Data::from(
            Velocity::new(
                opened.store.clone(),
                opened.store.clone(),
                opened.store,
                settings.velocity_settings(),
                metrics.clone(),
            )
            .await?,
        );
        let listener =
            TcpListener::bind(&settings.listen).map_err(|source| StartupError::Bind {
                addr: settings.listen.clone(),
                source,
            })?;
        let port = listener
            .local_addr()
            .map_err(|source| StartupError::Bind {
                addr: settings.listen.clone(),
                source,
            })?
            .port();
        let metrics = web::Data::from(metrics);
        let limit = web::Data::new(BodyLimit(settings.max_body_bytes));
        let limits = web::Data::new(Limits::new(
            ClassBudgets {
                engine: settings.max_in_flight_requests,
                write: settings.max_in_flight_writes,
                operator: settings.max_in_flight_operator,
            },
            settings.max_buffered_body_bytes,
        ));
        let lane = web::Data::new(
            OperatorLane::start(1, Duration::from_millis(settings.operator_deadline_ms))
                .map_err(StartupError::Lane)?,
        );
        let app_lists = lists.clone();
        let app_tokens = web::Data::from(tokens);
        let mut server = HttpServer::new(move || {
            App::new()
                .app_data(app_tokens.clone())
                .app_data(app_lists.clone())
                .app_data(audit_trail.clone())
                .app_data(velocity.clone())
                .app_data(metrics.clone())
                .app_data(limit.clone())
                .app_data(limits.clone())
                .app_data(lane.clone())
                .wrap(from_fn(routes::observe))
                .configure(routes::configure)
                .default_service(web::to(routes::not_found))
        })
        .shutdown_timeout(25)
        .client_request_timeout(Duration::from_secs(10))
        .client_disconnect_timeout(Duration::from_secs(1))
        .keep_alive(Duration::from_secs(settings.keep_alive_secs));
        let workers = settings.workers.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        });
        // actix counts connections per worker.
        server = server
            .workers(workers)
            .max_connections(settings.max_connections.div_ceil(workers));
        let server = server
            .listen(listener)
            .map_err(|source| StartupError::Bind {
                addr: settings.listen.clone(),
                source,
            })?
            .run();

        let snapshotter = opened
            .memory
            .as_ref()
            .filter(|_| settings.snapshot_path.is_some())
            .map(|m| {
                let m = m.clone();
                let every = Duration::from_secs(settings.snapshot_interval_secs.max(1));
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(every);
                    loop {
                        tick.tick().await;
                        let m = m.clone();
                        match tokio::task::spawn_blocking(move || m.save_snapshot()).await {
                            Ok(Err(e)) => tracing::error!(error = %e, "snapshot failed"),
                            Err(e) => tracing::error!(error = %e, "snapshot task failed"),
                            Ok(Ok(_)) => {}
                        }
                    }
                })
            });
        tracing::info!(port, "listening");
        Ok(Self {
            port,
            server,
            lists,
            memory: opened.memory,
            snapshotter,
            reloader,
            audit_reader,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The service behind the routes (for tests and embedding).
    pub fn lists(&self) -> web::Data<NameLists> {
        self.lists.clone()
    }

    /// A handle that stops the server (gracefully when `graceful`).
    pub fn handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }

    /// Serves until stopped, then writes the embedded store's snapshot. SIGTERM drains
    /// in-flight requests for up to 25 s; SIGINT (Ctrl-C) stops at once (actix treats it as a
    /// forced shutdown).
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let result = self.server.await;
        for t in [self.snapshotter, self.reloader, Some(self.audit_reader)]
            .into_iter()
            .flatten()
        {
            t.abort();
        }
        if let Some(m) = self.memory {
            match m.save_snapshot() {
                Ok(true) => tracing::info!("snapshot written"),
                Ok(false) => {}
                Err(e) => tracing::error!(error = %e, "final snapshot failed"),
            }
        }
        result
    }
}
