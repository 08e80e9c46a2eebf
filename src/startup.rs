//! Building and running the application: open the store, start the service's background
//! tasks, bind the listener and serve. Tests use `Application::build` with port 0.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
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
use crate::store::durable::Durable;
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

/// The opened store, and the embedded one again if that is what it is (closed on shutdown).
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
            let (store, report) = RedisStore::open_configured(
                RedisOptions::from_settings(settings)?,
                settings.create_keyspace,
            )
            .await?;
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
            let (data_dir, import) = embedded_dirs(settings);
            let durable = data_dir.as_deref().map(Durable::open).transpose()?;
            let recorded = match &durable {
                Some(d) => MemoryStore::recorded(d)?,
                None => None,
            };
            // A new data directory takes the keyspace of the snapshot it imports.
            let (meta, place) = match (recorded, &import) {
                (Some(m), _) => (
                    Some(m),
                    durable.as_ref().map(|d| d.path().display().to_string()),
                ),
                (None, Some(p)) => (
                    MemoryStore::snapshot_meta(p)?,
                    Some(format!("snapshot {}", p.display())),
                ),
                (None, None) => (None, None),
            };
            let key = embedded_key(
                settings,
                data_dir.as_deref(),
                import.as_deref(),
                meta.as_ref(),
            )?;
            let (hashing, loud) = match &meta {
                Some(meta) => fingerprint::open_recorded(
                    &meta.hashing,
                    key.as_ref(),
                    place.as_deref().unwrap_or(""),
                )
                .map_err(StoreError::Keyspace)?,
                None => (
                    Hashing::Keyed(key.expect("a key for every new embedded store")),
                    None,
                ),
            };
            let buckets = match (settings.expected_entries, &meta) {
                (Some(e), _) => Layout::buckets_for(e),
                (None, Some(meta)) => meta.buckets,
                (None, None) => Layout::buckets_for(DEFAULT_EXPECTED_ENTRIES),
            };
            let key_id = hashing.key_id().map(str::to_owned);
            let rules = meta
                .as_ref()
                .map_or(crate::domain::LATEST_RULES, |m| m.rules);
            let store = Arc::new(MemoryStore::open(
                Layout::new(settings.key_prefix.clone(), buckets, hashing).with_rules(rules),
                settings.audit_max_len,
                durable,
            )?);
            if let Some(path) = &import
                && let Some(entries) = store.import_snapshot(path)?
            {
                tracing::info!(
                    snapshot = %path.display(),
                    entries,
                    "imported the snapshot of an older build once; the file is left as a backup"
                );
            }
            match &data_dir {
                Some(dir) => tracing::info!(
                    store = "memory",
                    buckets,
                    data_dir = %dir.display(),
                    key_id,
                    "embedded store open, durable (no NAMELIST_REDIS_URL)"
                ),
                None => tracing::warn!(
                    store = "memory",
                    buckets,
                    key_id,
                    "embedded store in memory only: nothing survives a restart (set NAMELIST_DATA_DIR to keep it)"
                ),
            }
            unkeyed_loudly(settings, loud.as_deref());
            Ok(OpenedStore {
                store: store.clone(),
                memory: Some(store),
            })
        }
    }
}

/// The embedded store's data directory and the older build's snapshot file to import into
/// it, if any: `data_dir`; else, with only the deprecated `snapshot_path`, that file's
/// directory (a WARN says so).
fn embedded_dirs(settings: &Settings) -> (Option<PathBuf>, Option<PathBuf>) {
    let import = settings.snapshot_path.clone();
    let dir = match (&settings.data_dir, &import) {
        (Some(d), _) => Some(d.clone()),
        (None, Some(file)) => {
            let dir = file
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
            tracing::warn!(
                snapshot_path = %file.display(),
                data_dir = %dir.display(),
                "snapshot_path is deprecated: set data_dir; using the snapshot's directory as data_dir"
            );
            Some(dir)
        }
        (None, None) => None,
    };
    if import.is_some() && settings.data_dir.is_some() {
        tracing::warn!(
            "snapshot_path is deprecated: its file is imported once into data_dir; remove the setting"
        );
    }
    (dir, import)
}

/// The name of the embedded store's key file in its data directory.
pub const EMBEDDED_KEY_FILE: &str = "fingerprint.key";

/// The embedded store's fingerprint key, so that `cargo run` needs no set-up: the configured
/// key file if there is one; else, with a data directory, its `fingerprint.key` (made, mode
/// 0600, with a new data directory, or copied from `<snapshot>.key` beside the snapshot it
/// imports; a keyed record without it is refused); else a new key for this process (its
/// store dies with it). `None` only for an unkeyed (format 1) record.
fn embedded_key(
    settings: &Settings,
    data_dir: Option<&Path>,
    import: Option<&Path>,
    meta: Option<&crate::store::memory::SnapshotMeta>,
) -> Result<Option<FingerprintKey>, StartupError> {
    if let Some(key) = settings.fingerprint_key()? {
        return Ok(Some(key));
    }
    let Some(dir) = data_dir else {
        return Ok(Some(FingerprintKey::generate(
            "generated for this process",
        )?));
    };
    let key_path = dir.join(EMBEDDED_KEY_FILE);
    if !key_path.exists()
        && let Some(snapshot) = import
    {
        let mut old = snapshot.as_os_str().to_owned();
        old.push(".key");
        let old = PathBuf::from(old);
        if old.exists() {
            std::fs::copy(&old, &key_path).map_err(|e| {
                StoreError::Keyspace(format!(
                    "copying the snapshot's key {} to {}: {e}",
                    old.display(),
                    key_path.display()
                ))
            })?;
        }
    }
    if key_path.exists() {
        return Ok(Some(FingerprintKey::from_file(&key_path)?));
    }
    match meta.map(|m| (m.hashing.format, m.hashing.key_id.as_deref())) {
        None => {
            let key = FingerprintKey::create_file(&key_path)?;
            tracing::info!(
                key_file = %key_path.display(),
                key_id = key.id(),
                "new fingerprint key for the embedded store, kept in its data directory"
            );
            Ok(Some(key))
        }
        Some((fingerprint::FORMAT_UNKEYED, _)) => Ok(None),
        Some((_, id)) => Err(StoreError::Keyspace(format!(
            "the embedded store in {} is keyed (key id {}) but its key file {} is missing: restore that file, \
             or set NAMELIST_FINGERPRINT_KEY_FILE to the key it was made with, or move the data directory away",
            dir.display(),
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
    velocity: web::Data<Velocity>,
    memory: Option<Arc<MemoryStore>>,
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
        metrics.set_scrape_max_age(Duration::from_millis(settings.metrics_max_age_ms));
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
        let audit_trail = web::Data::new(
            AuditTrail::new(
                opened.store.clone(),
                metrics.clone(),
                Duration::from_millis(settings.write_deadline_ms),
            )
            .with_phone_regions(settings.list_settings().phone_regions),
        );
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
        let app_velocity = velocity.clone();
        let app_tokens = web::Data::from(tokens);
        let mut server = HttpServer::new(move || {
            App::new()
                .app_data(app_tokens.clone())
                .app_data(app_lists.clone())
                .app_data(audit_trail.clone())
                .app_data(app_velocity.clone())
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

        tracing::info!(port, "listening");
        Ok(Self {
            port,
            server,
            lists,
            velocity,
            memory: opened.memory,
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

    /// Serves until stopped, then closes the embedded store's record. SIGTERM drains
    /// in-flight requests for up to 25 s; SIGINT (Ctrl-C) stops at once (actix treats it as a
    /// forced shutdown).
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let result = self.server.await;
        self.lists.stop_background().await;
        self.velocity.stop_background().await;
        for t in [self.reloader, Some(self.audit_reader)]
            .into_iter()
            .flatten()
        {
            t.abort();
        }
        if let Some(m) = self.memory {
            // Every acknowledged write is already durable: this only lets the committer
            // finish and releases the data directory's lock.
            m.close();
        }
        result
    }
}
