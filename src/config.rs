//! Configuration: defaults, then an optional TOML file (`--config` or `NAMELIST_CONFIG`), then
//! `NAMELIST_*` environment variables, layered by figment. Unknown keys in the file are an
//! error (a typo must not silently fall back to a default). Environment variables are read
//! by name (`NAMELIST_<KEY>` for each key below); other `NAMELIST_*` variables are ignored,
//! because Kubernetes injects `<SERVICE>_PORT`-style variables for a Service named
//! `namelist`, and are reported at start-up.
//!
//! Secrets (the Redis URL may carry a password) are kept in `SecretString` and never printed;
//! the fingerprint key is read from its own file (`fingerprint_key_file`), never from the
//! configuration itself.

use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Deserializer, Serialize};

use crate::lists::{FailMode, ListSettings};
use crate::store::redis::RedisOptions;
use crate::store::{FingerprintKey, KeyError};

/// Every setting of the service and the tools.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// `host:port` to listen on.
    pub listen: String,
    /// One Redis (`redis://` or `rediss://`). Unset with no cluster nodes: embedded store.
    #[serde(serialize_with = "redact")]
    pub redis_url: Option<SecretString>,
    /// Seed URLs of a Redis Cluster, comma-separated in the environment.
    #[serde(deserialize_with = "comma_list")]
    pub redis_cluster_nodes: Vec<String>,
    /// Prefix of every key the service writes.
    pub key_prefix: String,
    /// File holding the fingerprint key (at least 64 hex digits, as `namelist-tools keygen`
    /// writes): every field, bucket, fingerprint and velocity key of a keyspace is a keyed
    /// function of its value under it. Needed to create a keyspace on Redis and to open a
    /// keyed one.
    pub fingerprint_key_file: Option<PathBuf>,
    /// Without a key, create an unkeyed (format 1) keyspace instead of refusing: development
    /// only, said at ERROR level at every start-up.
    pub allow_unkeyed: bool,
    /// Whether the service (and `namelist-tools import`) may make a keyspace where Redis has
    /// none. `false` for production: an emptied Redis (restarted without persistence, flushed)
    /// with every instance down looks like a new one, and a keyspace made there would answer
    /// "not listed" for everything; then only `namelist-tools keyspace create` makes one.
    pub create_keyspace: bool,
    /// Sizes the bucket count of a new keyspace (`ceil(n / 200)`). Unset: an existing
    /// keyspace's recorded count is adopted and a new one is sized for 1,000,000 entries.
    pub expected_entries: Option<u64>,
    /// The longest a cached prefix registry answers after it was read. For the local tier's
    /// copies and filters it is that bound only where the invalidation feed gives no proofs
    /// of delivery; over Redis (proofs every 25 ms) they answer while the feed is unbroken
    /// and proven, whatever their age, and this is the shortest period of the safety-net
    /// re-reads (`local_refresh_rate`).
    pub cache_ttl_ms: u64,
    /// Most buckets the local tier holds (each ~200 entries); 0 turns the tier off. The
    /// memory budget (`local_memory_mb`) usually binds first.
    pub cache_capacity: u64,
    /// Memory budget of the local tier (whole buckets held in memory), in MiB (fractions
    /// allowed); 0 turns it off. When the keyspace fits, every bucket is held.
    pub local_memory_mb: f64,
    /// Buckets the local tier reads per second in the background (start-up load, refresh);
    /// 0: unpaced.
    pub local_fetch_rate: u64,
    /// Buckets the local tier re-reads per second, on average, only because of their age: a
    /// safety net against a change whose message never reached the feed (a writer that died
    /// between its write and its message on a cluster). Its Redis cost stays this many reads
    /// a second whatever the keyspace; a full pass takes `buckets / local_refresh_rate`
    /// seconds (at least `cache_ttl_ms / 2`). 0: every `cache_ttl_ms / 2`.
    pub local_refresh_rate: u64,
    /// `open`: answer from the local tier, flagged degraded, when the store is slow or down;
    /// `closed`: answer 503.
    pub fail_mode: FailMode,
    /// Deadline of a check's (or a lookup's) store work.
    pub check_deadline_ms: u64,
    /// Deadline of a write's store work.
    pub write_deadline_ms: u64,
    /// Timeout of one connection attempt to Redis.
    pub connect_timeout_ms: u64,
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
    /// Approximate cap of the audit stream, in records.
    pub audit_max_len: usize,
    /// Embedded store only: the directory its durable record lives in (`namelist.redb`, the
    /// fingerprint key `fingerprint.key`). Unset: in memory only, nothing survives a restart.
    pub data_dir: Option<PathBuf>,
    /// Deprecated (builds before `data_dir`): an older build's snapshot file. Imported once
    /// into `data_dir` (its directory when `data_dir` is unset) and left there as a backup.
    pub snapshot_path: Option<PathBuf>,
    /// Deprecated and ignored: every write is durable when acknowledged.
    pub snapshot_interval_secs: u64,
    /// The region (ISO 3166) a phone number without its country code is read in, under
    /// normalisation rules 2 (`domain::rules`).
    pub phone_default_region: String,
    /// Per sandbox, another region than `phone_default_region` (`{ intl = "SG" }`).
    pub sandbox_phone_regions: std::collections::BTreeMap<String, String>,
    /// HTTP worker threads; unset: one per CPU.
    pub workers: Option<usize>,
    /// `json` (one object per line) or `text`.
    pub log_format: LogFormat,
    /// Most members a COUNT_DISTINCT entity keeps (the oldest go first); reads at the cap are
    /// reported.
    pub distinct_cap: u32,
    /// How long an event id is remembered, in seconds, so that a replay of the event is not
    /// counted again: at most this, and no longer than the event can still count in one of
    /// its metrics (`ts` + the longest window). A replay older than this is counted again.
    pub dedupe_window_secs: u64,
    /// Event ids remembered at once (`dedupe_window_secs` × events with ids per second) the
    /// buckets of ids are sized for (`ceil(n / 50)`), fixed when a keyspace first records
    /// them (Redis; the embedded store needs no sizing).
    pub dedupe_expected_ids: u64,
    /// Most metrics, and most rules, that may be defined: each costs every instance a parse
    /// whenever any definition changes (`velocity::DefinitionLimits`).
    pub max_definitions: usize,
    /// Most metrics one event type may feed: each is one more update in every event of that
    /// type, all of them in one script call.
    pub max_metrics_per_event: usize,
    /// Writes are acknowledged only once this many replicas have them (`WAIT`), so an
    /// acknowledged write survives a failover. 0: once the primary has them.
    pub write_replicas: u32,
    /// Redis connections (connection sets on a cluster) of the write pool. With
    /// `write_replicas > 0` each carries one write at a time, so they bound the writes in
    /// flight: one instance applies at most `write_connections` / (a write's round trips
    /// with its `WAIT`) writes a second.
    pub write_connections: usize,
    /// TOML file of `[[tokens]]` (`name`, `role`, `token`); unset: no auth (said loudly).
    pub tokens_file: Option<PathBuf>,
    /// The risk engine's requests (`check`, `features`, `evaluate`) handled at once by this
    /// instance, once their bodies are read; more are answered 503 `overloaded` at once.
    pub max_in_flight_requests: usize,
    /// Writes (entries, events) handled at once; more: 503 `overloaded`.
    pub max_in_flight_writes: usize,
    /// Operators' requests (lists, lookups, audit, definitions) being worked on at once, on
    /// the operator lane; more: 503 `overloaded`.
    pub max_in_flight_operator: usize,
    /// Deadline of an operator's store work (a page of list counts, a lookup, an audit
    /// page): longer than a check's, since it runs on the operator lane at a lower priority.
    pub operator_deadline_ms: u64,
    /// Request-body bytes buffered at once over all requests; a body that does not fit is
    /// answered 503 `overloaded`. Bounds the memory of bodies in flight; at least
    /// `max_body_bytes`.
    pub max_buffered_body_bytes: usize,
    /// Open client connections, over all workers; more wait in the listen backlog.
    pub max_connections: usize,
    /// How long an idle keep-alive connection stays open.
    pub keep_alive_secs: u64,
    /// A `/metrics` scrape within this many ms of the last render is served that render
    /// again (0: render every scrape). Bounds what one client pipelining scrapes costs.
    pub metrics_max_age_ms: u64,
    /// How often the service reads the last audit's summary for its gauges.
    pub audit_refresh_secs: u64,
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Json,
    Text,
}

/// The number of entries a new keyspace is sized for when nothing is configured.
pub const DEFAULT_EXPECTED_ENTRIES: u64 = 1_000_000;

impl Default for Settings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            redis_url: None,
            redis_cluster_nodes: Vec::new(),
            key_prefix: "nl:".into(),
            fingerprint_key_file: None,
            allow_unkeyed: false,
            create_keyspace: true,
            expected_entries: None,
            cache_ttl_ms: 30_000,
            cache_capacity: 1_000_000,
            local_memory_mb: 256.0,
            local_fetch_rate: 5_000,
            local_refresh_rate: 100,
            fail_mode: FailMode::Open,
            check_deadline_ms: 20,
            write_deadline_ms: 2_000,
            connect_timeout_ms: 1_000,
            max_body_bytes: 8 * 1024 * 1024,
            audit_max_len: 100_000,
            data_dir: None,
            snapshot_path: None,
            snapshot_interval_secs: 10,
            phone_default_region: crate::domain::rules::DEFAULT_PHONE_REGION.to_owned(),
            sandbox_phone_regions: std::collections::BTreeMap::new(),
            workers: None,
            log_format: LogFormat::Json,
            distinct_cap: 10_000,
            dedupe_window_secs: 86_400,
            dedupe_expected_ids: crate::store::layout::DEFAULT_EXPECTED_EVENT_IDS,
            max_definitions: crate::velocity::DefinitionLimits::default().definitions,
            max_metrics_per_event: crate::velocity::DefinitionLimits::default().metrics_per_event,
            write_replicas: 0,
            write_connections: crate::store::redis::DEFAULT_WRITE_CONNECTIONS,
            tokens_file: None,
            max_in_flight_requests: 4096,
            max_in_flight_writes: 256,
            max_in_flight_operator: 16,
            operator_deadline_ms: 2_000,
            max_buffered_body_bytes: 256 * 1024 * 1024,
            max_connections: 20_000,
            keep_alive_secs: 30,
            metrics_max_age_ms: 1_000,
            audit_refresh_secs: 60,
        }
    }
}

fn redact<S: serde::Serializer>(v: &Option<SecretString>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(_) => s.serialize_some("[redacted]"),
        None => s.serialize_none(),
    }
}

/// Accepts `"a,b"` (environment) or `["a", "b"]` (file).
fn comma_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => s
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        OneOrMany::Many(v) => v,
    })
}

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Invalid(String),
}

/// The keys `Settings` has, as environment variables read them.
const KEYS: &[&str] = &[
    "listen",
    "redis_url",
    "redis_cluster_nodes",
    "key_prefix",
    "fingerprint_key_file",
    "allow_unkeyed",
    "create_keyspace",
    "expected_entries",
    "cache_ttl_ms",
    "cache_capacity",
    "local_memory_mb",
    "local_fetch_rate",
    "local_refresh_rate",
    "fail_mode",
    "check_deadline_ms",
    "write_deadline_ms",
    "connect_timeout_ms",
    "max_body_bytes",
    "audit_max_len",
    "data_dir",
    "snapshot_path",
    "snapshot_interval_secs",
    "phone_default_region",
    "sandbox_phone_regions",
    "workers",
    "log_format",
    "distinct_cap",
    "dedupe_window_secs",
    "dedupe_expected_ids",
    "max_definitions",
    "max_metrics_per_event",
    "write_replicas",
    "write_connections",
    "tokens_file",
    "max_in_flight_requests",
    "max_in_flight_writes",
    "max_in_flight_operator",
    "operator_deadline_ms",
    "max_buffered_body_bytes",
    "max_connections",
    "keep_alive_secs",
    "metrics_max_age_ms",
    "audit_refresh_secs",
];

/// Most write connections an instance may open (`write_connections`): each is a Redis client
/// on every node it reaches.
const MAX_WRITE_CONNECTIONS: usize = 256;

/// Variables that are not settings but are read elsewhere.
const OTHER_VARS: &[&str] = &["config"];

impl Settings {
    /// Loads defaults → `file` (if any) → `NAMELIST_*` environment.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let mut fig = Figment::from(Serialized::defaults(Settings::default()));
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError::Invalid(format!(
                    "config file {} does not exist",
                    path.display()
                )));
            }
            fig = fig.merge(Toml::file(path));
        }
        fig = fig.merge(Env::prefixed("NAMELIST_").only(KEYS));
        let settings: Settings = fig
            .extract()
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        settings.validate()?;
        Ok(settings)
    }

    /// `NAMELIST_*` variables that are neither settings nor known to the service.
    pub fn unknown_env_vars() -> Vec<String> {
        std::env::vars()
            .filter_map(|(k, _)| k.strip_prefix("NAMELIST_").map(str::to_ascii_lowercase))
            .filter(|k| !KEYS.contains(&k.as_str()) && !OTHER_VARS.contains(&k.as_str()))
            .map(|k| format!("NAMELIST_{}", k.to_ascii_uppercase()))
            .collect()
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.key_prefix.is_empty() || self.key_prefix.contains(['{', '}']) {
            return bad("key_prefix must be non-empty and hold no braces".into());
        }
        if self.check_deadline_ms == 0
            || self.write_deadline_ms == 0
            || self.operator_deadline_ms == 0
        {
            return bad("deadlines must be at least 1 ms".into());
        }
        if self.cache_ttl_ms == 0 {
            return bad("cache_ttl_ms must be at least 1".into());
        }
        if !self.local_memory_mb.is_finite() || self.local_memory_mb < 0.0 {
            return bad("local_memory_mb must be a number of MiB, 0 or more".into());
        }
        if self.max_body_bytes < 1024 {
            return bad("max_body_bytes must be at least 1024".into());
        }
        if self.max_buffered_body_bytes < self.max_body_bytes {
            return bad("max_buffered_body_bytes must be at least max_body_bytes".into());
        }
        if self.max_in_flight_requests == 0
            || self.max_in_flight_writes == 0
            || self.max_in_flight_operator == 0
            || self.max_connections == 0
        {
            return bad(
                "max_in_flight_requests, max_in_flight_writes, max_in_flight_operator and max_connections must be at least 1"
                    .into(),
            );
        }
        if let Err(e) = self.phone_regions() {
            return bad(e);
        }
        for sandbox in self.sandbox_phone_regions.keys() {
            if crate::domain::Sandbox::try_from(sandbox.clone()).is_err() {
                return bad(format!(
                    "sandbox_phone_regions: {} is not a sandbox name",
                    crate::domain::shown_key(sandbox)
                ));
            }
        }
        if self.audit_refresh_secs == 0 {
            return bad("audit_refresh_secs must be at least 1".into());
        }
        if self.dedupe_window_secs == 0 || self.dedupe_expected_ids == 0 {
            return bad("dedupe_window_secs and dedupe_expected_ids must be at least 1".into());
        }
        if self.max_definitions == 0 || self.max_metrics_per_event == 0 {
            return bad("max_definitions and max_metrics_per_event must be at least 1".into());
        }
        if !(1..=MAX_WRITE_CONNECTIONS).contains(&self.write_connections) {
            return bad(format!(
                "write_connections must be 1 to {MAX_WRITE_CONNECTIONS}"
            ));
        }
        if self.redis_url.is_some() && !self.redis_cluster_nodes.is_empty() {
            return bad("set redis_url or redis_cluster_nodes, not both".into());
        }
        if let Some(url) = &self.redis_url {
            let u = url.expose_secret();
            if !(u.starts_with("redis://")
                || u.starts_with("rediss://")
                || u.starts_with("unix://"))
            {
                return bad("redis_url must start with redis://, rediss:// or unix://".into());
            }
        }
        Ok(())
    }

    /// The fingerprint key named by `fingerprint_key_file`, read and checked; `None` when no
    /// file is configured.
    pub fn fingerprint_key(&self) -> Result<Option<FingerprintKey>, KeyError> {
        self.fingerprint_key_file
            .as_deref()
            .map(FingerprintKey::from_file)
            .transpose()
    }

    /// The velocity service's tuning.
    pub fn velocity_settings(&self) -> crate::velocity::VelocitySettings {
        crate::velocity::VelocitySettings {
            read_deadline: Duration::from_millis(self.check_deadline_ms),
            write_deadline: Duration::from_millis(self.write_deadline_ms),
            fail_mode: self.fail_mode,
            distinct_cap: self.distinct_cap.max(1),
            dedupe_window: Duration::from_secs(self.dedupe_window_secs),
            limits: crate::velocity::DefinitionLimits {
                metrics_per_event: self.max_metrics_per_event,
                definitions: self.max_definitions,
            },
        }
    }

    /// The name-list service's tuning.
    pub fn list_settings(&self) -> ListSettings {
        ListSettings {
            check_deadline: Duration::from_millis(self.check_deadline_ms),
            operator_deadline: Duration::from_millis(self.operator_deadline_ms),
            write_deadline: Duration::from_millis(self.write_deadline_ms),
            fail_mode: self.fail_mode,
            cache_ttl: Duration::from_millis(self.cache_ttl_ms),
            cache_capacity: self.cache_capacity,
            local_memory_bytes: (self.local_memory_mb * 1024.0 * 1024.0) as u64,
            local_fetch_rate: self.local_fetch_rate,
            local_refresh_rate: self.local_refresh_rate,
            phone_regions: self.phone_regions().unwrap_or_default(),
        }
    }

    /// The phone regions (checked by `validate`).
    pub fn phone_regions(&self) -> Result<crate::domain::PhoneRegions, String> {
        crate::domain::PhoneRegions::new(&self.phone_default_region, &self.sandbox_phone_regions)
    }
}

impl RedisOptions {
    /// The Redis store's options as the settings give them: the one place a `RedisOptions` is
    /// built from `Settings` (the service at start-up, and every `namelist-tools` command, which
    /// then only lengthens `response_timeout` for bulk work). It lives here rather than in
    /// `store::redis` so that the store never imports the configuration above it.
    pub fn from_settings(settings: &Settings) -> Result<Self, KeyError> {
        Ok(Self {
            url: settings
                .redis_url
                .as_ref()
                .map(|u| u.expose_secret().to_owned())
                .unwrap_or_default(),
            cluster_nodes: settings.redis_cluster_nodes.clone(),
            prefix: settings.key_prefix.clone(),
            expected_entries: settings.expected_entries,
            default_expected_entries: DEFAULT_EXPECTED_ENTRIES,
            connect_timeout: Duration::from_millis(settings.connect_timeout_ms),
            response_timeout: Duration::from_millis(settings.write_deadline_ms),
            audit_max_len: settings.audit_max_len,
            write_replicas: settings.write_replicas,
            write_connections: settings.write_connections,
            fingerprint_key: settings.fingerprint_key()?,
            allow_unkeyed: settings.allow_unkeyed,
            dedupe_expected_ids: settings.dedupe_expected_ids,
        })
    }
}

#[cfg(test)]
// figment's Jail closures return its own (large) error type.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;

    #[test]
    fn file_then_env() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "n.toml",
                "listen = \"0.0.0.0:9000\"\ncache_ttl_ms = 5\nredis_cluster_nodes = [\"redis://a:1\"]",
            )?;
            jail.set_env("NAMELIST_CACHE_TTL_MS", "7");
            jail.set_env("NAMELIST_FAIL_MODE", "closed");
            jail.set_env("NAMELIST_SERVICE_HOST", "10.0.0.1");
            let s = Settings::load(Some(Path::new("n.toml"))).unwrap();
            assert_eq!(s.listen, "0.0.0.0:9000");
            assert_eq!(s.cache_ttl_ms, 7, "the environment overrides the file");
            assert_eq!(s.fail_mode, FailMode::Closed);
            assert_eq!(s.redis_cluster_nodes, vec!["redis://a:1"]);
            assert!(Settings::unknown_env_vars().contains(&"NAMELIST_SERVICE_HOST".to_owned()));
            Ok(())
        });
    }

    #[test]
    fn cluster_nodes_from_env_are_comma_separated() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("NAMELIST_REDIS_CLUSTER_NODES", "redis://a:1, redis://b:2");
            let s = Settings::load(None).unwrap();
            assert_eq!(s.redis_cluster_nodes, vec!["redis://a:1", "redis://b:2"]);
            Ok(())
        });
    }

    #[test]
    fn unknown_file_keys_and_bad_values_are_refused() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("typo.toml", "cache_tll_ms = 5")?;
            let err = Settings::load(Some(Path::new("typo.toml"))).unwrap_err();
            assert!(err.to_string().contains("cache_tll_ms"), "{err}");
            jail.set_env("NAMELIST_FAIL_MODE", "sideways");
            assert!(Settings::load(None).is_err());
            Ok(())
        });
    }

    #[test]
    fn write_connections_are_bounded_and_reach_the_store() {
        figment::Jail::expect_with(|jail| {
            assert_eq!(Settings::load(None).unwrap().write_connections, 8);
            jail.set_env("NAMELIST_WRITE_CONNECTIONS", "32");
            let s = Settings::load(None).unwrap();
            let opts = RedisOptions::from_settings(&Settings {
                allow_unkeyed: true,
                ..s
            })
            .unwrap();
            assert_eq!(opts.write_connections, 32);
            for bad in ["0", "257"] {
                jail.set_env("NAMELIST_WRITE_CONNECTIONS", bad);
                let err = Settings::load(None).unwrap_err();
                assert!(err.to_string().contains("write_connections"), "{err}");
            }
            Ok(())
        });
    }

    #[test]
    fn secrets_are_not_printed() {
        let s = Settings {
            redis_url: Some(SecretString::from("redis://:hunter2@h:6379")),
            ..Settings::default()
        };
        assert!(!format!("{s:?}").contains("hunter2"));
        assert!(!serde_json::to_string(&s).unwrap().contains("hunter2"));
    }
}
