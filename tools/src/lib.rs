//! `namelist-tools`: the operator tools, a crate of their own over the `namelist` library
//! (`src/main.rs` only parses arguments and dispatches). They share the service's
//! normalisation and storage layout (one implementation, never a copy) and never speak to Redis
//! on their own: every Redis call is a typed operation of `namelist::store` (`store::redis::bulk`),
//! and this crate does not even depend on the `redis` crate. It is a library too, so that its
//! tests and benches can drive the tools without the binary.
//!
//! Unlike the service, the tools report errors with `anyhow` and context: they end in a
//! message to an operator, not in an HTTP status.
//!
//! Every tool reads the Redis URL, key prefix and fingerprint key the way the service does
//! (defaults, then the `--config` file, then `NAMELIST_*` variables), and command-line flags
//! override both; so a tool refuses a keyspace exactly when the service would (no key or the
//! wrong key for a keyed keyspace, no key for a new one).
//!
//! * `import/`: bulk load (`input`, `partition`, `write`, `checkpoint`);
//! * `gen_data/`: `gen`, synthetic entries and non-members (no store involved);
//! * `audit/`: memory per entry, fill, problem buckets, the seed layouts compared (`walk`,
//!   `stats`, `compare`, `render`);
//! * `sweep`: expired fields reclaimed, paced and resumable;
//! * `keygen`: a new fingerprint key file;
//! * `keyspace`: `keyspace create`, a new keyspace in place of a lost one;
//! * `pace`, `progress`: the one rate limiter and the one progress-bar setup they share;
//! * [`Global`], here: the options every tool shares, and the store they open.

pub mod audit;
pub mod checkpoint;
pub mod gen_data;
pub mod import;
pub mod keygen;
pub mod keyspace;
pub mod pace;
pub mod progress;
pub mod sweep;

use std::io::{self, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use secrecy::SecretString;

use namelist::config::Settings;
use namelist::store::redis::{RedisOptions, RedisStore};

/// Options every tool shares.
#[derive(Debug, Clone, clap::Args)]
pub struct Global {
    /// TOML configuration file, as the service reads it.
    #[arg(long, global = true, env = "NAMELIST_CONFIG")]
    pub config: Option<PathBuf>,
    /// Redis URL (overrides NAMELIST_REDIS_URL and the config file).
    #[arg(long, global = true)]
    pub redis_url: Option<String>,
    /// Seed URLs of a Redis Cluster, comma-separated (overrides NAMELIST_REDIS_CLUSTER_NODES).
    #[arg(long, global = true, value_delimiter = ',')]
    pub cluster_nodes: Vec<String>,
    /// Key prefix (overrides NAMELIST_KEY_PREFIX and the config file).
    #[arg(long, global = true)]
    pub prefix: Option<String>,
    /// Expected entries of a keyspace this run creates (overrides NAMELIST_EXPECTED_ENTRIES).
    #[arg(long, global = true)]
    pub expected_entries: Option<u64>,
    /// Fingerprint key file (overrides NAMELIST_FINGERPRINT_KEY_FILE and the config file).
    #[arg(long, global = true)]
    pub fingerprint_key_file: Option<PathBuf>,
}

impl Global {
    /// The service's settings with the command-line overrides applied.
    pub fn settings(&self) -> anyhow::Result<Settings> {
        let mut s = Settings::load(self.config.as_deref())?;
        if let Some(url) = &self.redis_url {
            s.redis_url = Some(SecretString::from(url.clone()));
            s.redis_cluster_nodes.clear();
        }
        if !self.cluster_nodes.is_empty() {
            s.redis_cluster_nodes = self.cluster_nodes.clone();
            s.redis_url = None;
        }
        if let Some(p) = &self.prefix {
            s.key_prefix = p.clone();
        }
        if let Some(e) = self.expected_entries {
            s.expected_entries = Some(e);
        }
        if let Some(k) = &self.fingerprint_key_file {
            s.fingerprint_key_file = Some(k.clone());
        }
        Ok(s)
    }

    /// Opens the keyspace the service would open, with generous timeouts for bulk work.
    pub async fn open(&self) -> anyhow::Result<(RedisStore, Settings)> {
        let settings = self.settings()?;
        if settings.redis_url.is_none() && settings.redis_cluster_nodes.is_empty() {
            bail!(
                "no Redis configured: set NAMELIST_REDIS_URL (or NAMELIST_REDIS_CLUSTER_NODES), or pass --redis-url (or --cluster-nodes)"
            );
        }
        // Bulk work: a pipeline of hundreds of buckets may take seconds to answer.
        let options = RedisOptions {
            response_timeout: Duration::from_secs(60),
            ..RedisOptions::from_settings(&settings)?
        };
        let (store, report) = RedisStore::open_configured(options, settings.create_keyspace)
            .await
            .context("opening the keyspace")?;
        if let Some(line) = &report.unkeyed {
            eprintln!("ERROR: {line}");
        }
        for w in &report.warnings {
            eprintln!("WARNING: {w}");
        }
        Ok((store, settings))
    }
}

/// Writes one report (a line, or lines) to standard output. Every tool's report goes through
/// here, not `println!`, which panics when the reader has gone: a reader that stops early
/// (`audit --json | head`) makes this a [`StdoutClosed`], which `main` ends quietly.
pub fn out(text: impl std::fmt::Display) -> anyhow::Result<()> {
    writeln!(io::stdout().lock(), "{text}").map_err(|e| match e.kind() {
        io::ErrorKind::BrokenPipe => anyhow::Error::new(StdoutClosed),
        _ => anyhow::Error::new(e).context("writing to standard output"),
    })
}

/// A report written after standard output's reader had gone: it has what it wanted, so the
/// tool stops without an error. Only [`out`] says so (and `gen`, whose output is stdout or
/// files): a broken pipe anywhere else, say a socket's `io::Error` passed up with `?`, stays
/// an error, so a tool that failed never exits 0.
#[derive(Debug)]
pub struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("standard output was closed by its reader")
    }
}

impl std::error::Error for StdoutClosed {}

/// Whether `e` is (or was caused by) a [`StdoutClosed`].
pub fn stdout_closed(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<StdoutClosed>())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a report's write to a closed stdout ends a tool quietly: any other broken pipe,
    /// a bare `io::Error` or Redis's, is an error.
    #[test]
    fn only_a_closed_stdout_ends_a_tool_quietly() {
        assert!(stdout_closed(
            &anyhow::Error::new(StdoutClosed).context("the audit's report")
        ));
        let pipe = || io::Error::new(io::ErrorKind::BrokenPipe, "Broken pipe");
        assert!(!stdout_closed(
            &anyhow::Error::new(pipe()).context("writing the checkpoint")
        ));
        let redis = redis::RedisError::from(pipe());
        assert!(!stdout_closed(
            &anyhow::Error::new(redis).context("importing")
        ));
    }
}
