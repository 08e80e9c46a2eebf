//! `namelist-tools keyspace create`: makes a new, empty keyspace at the prefix explicitly: on a
//! new Redis where the service and `import` run with `create_keyspace = false`, and (with
//! `--lost-for-good`) the one way to replace a keyspace that was lost (see the service's
//! docs/operations.md, *A lost keyspace*). Instances running on a lost one keep refusing
//! writes until they restart.

use anyhow::{Context, bail};

use crate::Global;
use namelist::store::redis::{RedisOptions, RedisStore};

/// Make a new, empty keyspace at the prefix where there is none (a new Redis: what the service
/// and `import` refuse to do themselves with `create_keyspace = false`; nothing is done where
/// one is there already). With `--lost-for-good`, even where a running instance saw the
/// previous one vanish (Redis restarted without its data, flushed, failed over to an empty
/// node).
///
/// On a cluster whose meta hash is intact but one shard lost its data (its hash slots'
/// markers are gone: instances refuse to start on it), this accepts the loss instead: those
/// slots are marked again, empty, and the rest of the keyspace is kept.
///
/// `--lost-for-good` only when the lost keyspace cannot be restored (an RDB or AOF brings back its id, and the
/// instances resume by themselves): every list and count it held is gone, so load them again
/// after this (`import`). Instances still running on the lost keyspace refuse writes and
/// answer checks from their own copies until they are restarted, which makes them adopt the
/// new one. Cheap (one script call, and on a cluster one read of the shard markers); with
/// `--lost-for-good` it refuses when a whole keyspace is there already.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Say yes: the lists of the lost keyspace are not coming back (without it, a keyspace
    /// is made only where none was, nor seen lost).
    #[arg(long)]
    pub lost_for_good: bool,
}

/// The CLI entry point.
pub async fn run(global: &Global, args: Args) -> anyhow::Result<()> {
    let settings = global.settings()?;
    if settings.redis_url.is_none() && settings.redis_cluster_nodes.is_empty() {
        bail!("no Redis configured: set NAMELIST_REDIS_URL or pass --redis-url");
    }
    let options = RedisOptions::from_settings(&settings)?;
    let (_, report) = if args.lost_for_good {
        RedisStore::open_anew(options).await
    } else {
        // Whatever create_keyspace says: this is the explicit way to make one.
        RedisStore::open_configured(options, true).await
    }
    .context("making the keyspace")?;
    if !report.created && report.shards_marked > 0 && args.lost_for_good {
        crate::out(format_args!(
            "the keyspace at prefix {} had lost the data of {} hash slot(s) (a shard restarted \
             empty): they are marked again, empty; load the lists again (import), and restart \
             the service's instances if they refuse writes",
            settings.key_prefix, report.shards_marked
        ))?;
        return Ok(());
    }
    if !report.created && !args.lost_for_good {
        crate::out(format_args!(
            "a keyspace is already there at prefix {} ({} buckets): nothing done",
            settings.key_prefix, report.buckets
        ))?;
        return Ok(());
    }
    if !report.created {
        bail!(
            "a keyspace is already there at prefix {} (nothing done)",
            settings.key_prefix
        );
    }
    crate::out(format_args!(
        "made a new keyspace at prefix {} ({} buckets); start the service's instances (restart those running on a lost one to adopt it), then load the lists",
        settings.key_prefix, report.buckets
    ))?;
    Ok(())
}
