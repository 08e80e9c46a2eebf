//! `namelist-tools keyspace create`: makes a new, empty keyspace at the prefix explicitly, the
//! one way to replace a keyspace that instances saw vanish (see the service's docs/operations.md, *A
//! lost keyspace*). Instances running on the lost one keep refusing writes until they restart.

use anyhow::{Context, bail};

use crate::Global;
use namelist::store::redis::{RedisOptions, RedisStore};

/// Make a new, empty keyspace at the prefix, even where a running instance saw the previous
/// one vanish (Redis restarted without its data, flushed, failed over to an empty node).
///
/// On a cluster whose meta hash is intact but one shard lost its data (its hash slots'
/// markers are gone: instances refuse to start on it), this accepts the loss instead: those
/// slots are marked again, empty, and the rest of the keyspace is kept.
///
/// Only when the lost keyspace cannot be restored (an RDB or AOF brings back its id, and the
/// instances resume by themselves): every list and count it held is gone, so load them again
/// after this (`import`). Instances still running on the lost keyspace refuse writes and
/// answer checks from their own copies until they are restarted, which makes them adopt the
/// new one. Cheap (one script call); refuses when a keyspace is there already.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Say yes: the lists of the lost keyspace are not coming back.
    #[arg(long)]
    pub lost_for_good: bool,
}

/// The CLI entry point.
pub async fn run(global: &Global, args: Args) -> anyhow::Result<()> {
    if !args.lost_for_good {
        bail!(
            "this makes a new, empty keyspace in place of one that was lost: pass --lost-for-good \
             if its data cannot be restored (restoring it is better: instances resume by themselves)"
        );
    }
    let settings = global.settings()?;
    if settings.redis_url.is_none() && settings.redis_cluster_nodes.is_empty() {
        bail!("no Redis configured: set NAMELIST_REDIS_URL or pass --redis-url");
    }
    let (_, report) = RedisStore::open_anew(RedisOptions::from_settings(&settings)?)
        .await
        .context("making the keyspace")?;
    if !report.created && report.shards_marked > 0 {
        crate::out(format_args!(
            "the keyspace at prefix {} had lost the data of {} hash slot(s) (a shard restarted \
             empty): they are marked again, empty; load the lists again (import), and restart \
             the service's instances if they refuse writes",
            settings.key_prefix, report.shards_marked
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
        "made a new keyspace at prefix {} ({} buckets); restart the service's instances to adopt it, then load the lists",
        settings.key_prefix, report.buckets
    ))?;
    Ok(())
}
