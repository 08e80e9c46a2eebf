//! Phases 2 and 3, writing, and the run's record.
//!
//! 2. **Register**: the IP prefix lengths the file has ranges of are added to their registries
//!    (and running services told) before any entry is written, so a check never misses a range.
//! 3. **Write**, bucket by bucket in ascending order, `--batch-buckets` buckets per pipeline,
//!    `--in-flight` pipelines at once, paced to `--max-rows-per-sec`. A bucket that does not
//!    exist yet is built here as a listpack and sent with `RESTORE` (no `REPLACE`: a bucket
//!    created meanwhile by the live service makes `RESTORE` fail with `BUSYKEY`, and that
//!    bucket falls back to `HSET`); an existing one gets one multi-field `HSET`
//!    (`RedisStore::write_buckets`). Pipelines complete in order, so after each one every
//!    bucket up to its last is acknowledged: that is what the checkpoint records. Running
//!    services are told to drop cached misses every 2 s and at the end (`Invalidation::Bulk`).
//!
//! **A connection that stops answering** (the cluster client can stall, see the service's
//! `store::redis::heal`) must not stop a run of minutes: every pipeline is bounded by
//! [`WRITE_TIMEOUT`] and tried up to [`ATTEMPTS`] times (a write is idempotent: a bucket a
//! first try `RESTORE`d exists now and gets the same fields by `HSET`; only the created-entry
//! count, which feeds the lists' approximate counts, may come out lower). The notice every 2 s
//! is best effort within [`PUBLISH_TIMEOUT`] (the end's notice is the one that must land, and
//! is retried the same way). An abandoned request counts as unanswered, so the store rebuilds
//! a silent cluster connection and the next try goes out on a new one. 50M rows on a local
//! 6-node cluster failed after a 60 s silence of the notice's connection before this.
//!
//! The run ends with one audit record (counts, not rows).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use namelist::domain::now_ms;
use namelist::store::InvalidationBus;
use namelist::store::redis::RedisStore;
use namelist::store::redis::bulk::{BucketWrite, BulkError};
use namelist::store::redis::dump::DumpFormat;
use namelist::store::{
    AuditRecord, CountChange, Deadline, EntryStore, Invalidation, Layout, PrefixLen, Scope,
    StoreError,
};

use super::checkpoint::Resume;
use super::partition::{Partitions, group};
use super::{Args, ImportSummary};
use crate::pace::Pace;
use crate::progress;

/// Phase 2: registers the prefix lengths of the file's ranges and tells running services;
/// how many were registered.
pub(super) async fn register_prefixes(
    store: &RedisStore,
    prefixes: &HashSet<(Scope, PrefixLen)>,
) -> anyhow::Result<u64> {
    if prefixes.is_empty() {
        return Ok(0);
    }
    let registered: Vec<(Scope, PrefixLen)> = prefixes.iter().cloned().collect();
    let mut scopes: Vec<(String, String)> = registered
        .iter()
        .map(|(scope, _)| (scope.list.to_string(), scope.sandbox.to_string()))
        .collect();
    store
        .register_prefix_lengths(&registered)
        .await
        .context("registering prefix lengths")?;
    scopes.sort();
    scopes.dedup();
    store.publish(&Invalidation::Scopes(scopes)).await?;
    Ok(prefixes.len() as u64)
}

/// The `RESTORE` format this server takes (proved against an `HSET`-built twin), or `None`:
/// every bucket by `HSET` (`--no-restore`, or the proof failed).
pub(super) async fn restore_format(store: &RedisStore, args: &Args) -> Option<DumpFormat> {
    if args.no_restore {
        return None;
    }
    match store.prove_restore().await {
        Ok(f) => Some(f),
        Err(e) => {
            eprintln!("WARNING: RESTORE path disabled, writing every bucket with HSET: {e:#}");
            None
        }
    }
}

/// Phase 3: writes every partition's buckets not done yet; adds to `summary` the buckets and
/// entries written or skipped. Returns the distinct entries of the file (written or skipped).
pub(super) async fn write_partitions(
    store: &RedisStore,
    layout: &Layout,
    args: &Args,
    partitions: &mut Partitions,
    resume: &Resume,
    summary: &mut ImportSummary,
) -> anyhow::Result<u64> {
    let format = restore_format(store, args).await;
    summary.restore_used = format.is_some();
    let started = Instant::now();
    let bar = progress::bar(
        args.quiet,
        Some(u64::from(layout.buckets())),
        "writing {bar:30} {pos}/{len} buckets eta {eta} {msg}",
    );
    let mut distinct = 0u64;
    let mut last_publish = Instant::now();
    let mut publish_warned = false;
    let mut last_checkpoint = Instant::now();
    let batch_buckets = args.batch_buckets.max(1);
    let pace = Pace::per_sec(args.max_rows_per_sec);
    for p in 0..partitions.len() {
        let buckets = group(partitions.take(p)?);
        distinct += buckets.iter().map(|b| b.pairs.len() as u64).sum::<u64>();
        let (skip, todo): (Vec<BucketWrite>, Vec<BucketWrite>) = buckets
            .into_iter()
            .partition(|b| b.bucket < resume.done_below);
        summary.buckets_skipped += skip.len() as u64;
        summary.entries_written += skip.iter().map(|b| b.pairs.len() as u64).sum::<u64>();
        let mut batches = Vec::new();
        let mut it = todo.into_iter().peekable();
        while it.peek().is_some() {
            batches.push(it.by_ref().take(batch_buckets).collect::<Vec<_>>());
        }
        let mut writes = futures::stream::iter(batches.into_iter().map(|batch| {
            let pace = &pace;
            let last = batch.last().map_or(0, |b| b.bucket);
            let rows: u64 = batch.iter().map(|b| b.pairs.len() as u64).sum();
            async move {
                pace.take(rows).await;
                with_retries("writing buckets", WRITE_TIMEOUT, || {
                    store.write_buckets(format, &batch)
                })
                .await
                .map(|o| (last, o))
            }
        }))
        .buffered(args.in_flight.max(1));
        while let Some(done) = writes.next().await {
            let (last, o) = done?;
            summary.buckets_restored += o.restored;
            summary.buckets_hset += o.hset;
            summary.entries_written += o.entries;
            summary.entries_created += o.created;
            bar.set_position(u64::from(last) + 1);
            bar.set_message(format!(
                "{} entries, {:.0}/s",
                summary.entries_written,
                summary.entries_written as f64 / started.elapsed().as_secs_f64().max(1e-9)
            ));
            // Batches complete in order: everything up to `last` is acknowledged.
            if last_checkpoint.elapsed() > Duration::from_millis(200) {
                resume.save(layout, last)?;
                last_checkpoint = Instant::now();
            }
            if last_publish.elapsed() > Duration::from_secs(2) {
                // Best effort: the end's notice is the one that must land.
                let told =
                    tokio::time::timeout(PUBLISH_TIMEOUT, store.publish(&Invalidation::Bulk)).await;
                if !matches!(told, Ok(Ok(()))) && !publish_warned {
                    // Once a run: the notice is sent again every 2 s and at the end.
                    eprintln!(
                        "WARNING: telling running services to drop cached misses failed ({}); \
                         trying again every 2 s and at the end",
                        match told {
                            Ok(Err(e)) => e.to_string(),
                            _ => format!("no answer within {PUBLISH_TIMEOUT:?}"),
                        }
                    );
                    publish_warned = true;
                }
                last_publish = Instant::now();
            }
        }
    }
    bar.finish_and_clear();
    summary.write_seconds = started.elapsed().as_secs_f64();
    Ok(distinct)
}

/// Longest one pipeline of buckets may take before it is tried again.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(15);

/// Longest the notice to running services may take (every 2 s, and at the end per try).
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(2);

/// Tries of a pipeline of buckets, and of the end's notice.
pub const ATTEMPTS: u32 = 4;

/// `op` until it succeeds, each try bounded by `limit`, at most [`ATTEMPTS`] tries (a short
/// pause between them); the last error (or time-out) otherwise, saying `what` it was. An
/// error that trying again cannot pass (`StoreError::may_pass_again`: a lost keyspace, a
/// refused command) ends it at once.
async fn with_retries<T, E, F, Fut>(what: &str, limit: Duration, mut op: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    E: MayPassAgain + std::error::Error + Send + Sync + 'static,
{
    let mut last = None;
    for attempt in 1..=ATTEMPTS {
        match tokio::time::timeout(limit, op()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if !e.may_pass_again() => {
                return Err(anyhow::Error::new(e).context(format!("{what} (not tried again)")));
            }
            Ok(Err(e)) => last = Some(anyhow::Error::new(e)),
            Err(_) => last = Some(anyhow::anyhow!("no answer within {limit:?}")),
        }
        if attempt < ATTEMPTS {
            eprintln!(
                "WARNING: {what}: try {attempt} of {ATTEMPTS} failed ({:#}); trying again",
                last.as_ref().expect("set above")
            );
            tokio::time::sleep(Duration::from_millis(250 * u64::from(attempt))).await;
        }
    }
    Err(last
        .expect("at least one try")
        .context(format!("{what}: {ATTEMPTS} tries failed")))
}

/// The errors `with_retries` may try again after.
trait MayPassAgain {
    fn may_pass_again(&self) -> bool;
}

impl MayPassAgain for StoreError {
    fn may_pass_again(&self) -> bool {
        StoreError::may_pass_again(self)
    }
}

impl MayPassAgain for BulkError {
    fn may_pass_again(&self) -> bool {
        BulkError::may_pass_again(self)
    }
}

/// Adds what the run created to the lists' approximate counts (`GET /v1/lists`). The store
/// says how many fields a run created, not whose they were, so each (list, sandbox) gets its
/// share of them by its accepted rows: exact for a run of one scope, or of new entries only.
/// A failure is reported and does not fail the run (the entries are written).
pub(super) async fn count_entries(
    store: &RedisStore,
    rows_by_scope: &[(Scope, u64)],
    accepted: u64,
    summary: &ImportSummary,
) {
    if accepted == 0 || summary.entries_created == 0 {
        return;
    }
    let share = summary.entries_created as f64 / accepted as f64;
    let changes: Vec<CountChange> = rows_by_scope
        .iter()
        .map(|(scope, rows)| CountChange {
            scope: scope.clone(),
            delta: (*rows as f64 * share).round() as i64,
        })
        .collect();
    let deadline = Deadline::after(Duration::from_secs(10));
    if let Err(e) = store.count_changes(&changes, now_ms(), deadline).await {
        eprintln!(
            "WARNING: the lists' counts were not updated (GET /v1/lists will undercount this run): {e}"
        );
    }
}

/// The end of a run: running services drop cached misses, and the run's audit record.
pub(super) async fn record_run(
    store: &RedisStore,
    args: &Args,
    summary: &ImportSummary,
) -> anyhow::Result<()> {
    with_retries("telling running services", PUBLISH_TIMEOUT, || {
        store.publish(&Invalidation::Bulk)
    })
    .await?;
    let mut fields = vec![
        ("at".to_owned(), now_ms().to_string()),
        ("who".to_owned(), args.actor.clone()),
        ("op".to_owned(), "import".to_owned()),
        (
            "source".to_owned(),
            args.input_path()
                .map_or("stdin".into(), |p| p.display().to_string()),
        ),
        ("rows_read".to_owned(), summary.rows_read.to_string()),
        (
            "rows_rejected".to_owned(),
            summary.rows_rejected.to_string(),
        ),
        (
            "entries_written".to_owned(),
            summary.entries_written.to_string(),
        ),
        (
            "buckets_restored".to_owned(),
            summary.buckets_restored.to_string(),
        ),
        ("buckets_hset".to_owned(), summary.buckets_hset.to_string()),
        ("resumed".to_owned(), summary.resumed.to_string()),
        ("seconds".to_owned(), format!("{:.3}", summary.seconds)),
    ];
    if let Some(r) = &args.reason {
        fields.push(("reason".to_owned(), r.clone()));
    }
    store
        .append_audit(&AuditRecord { fields })
        .await
        .context("writing the audit record")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A try that never answers is abandoned at the limit and the next one is made; one that
    /// keeps failing ends the run with its last error after `ATTEMPTS` tries.
    #[tokio::test(start_paused = true)]
    async fn a_silent_try_is_abandoned_and_made_again() {
        let tries = AtomicU32::new(0);
        let got = with_retries("writing buckets", WRITE_TIMEOUT, || {
            let n = tries.fetch_add(1, Ordering::Relaxed);
            async move {
                if n == 0 {
                    std::future::pending::<()>().await;
                }
                Ok::<_, StoreError>(n)
            }
        })
        .await
        .unwrap();
        assert_eq!((got, tries.load(Ordering::Relaxed)), (1, 2));

        let tries = AtomicU32::new(0);
        let err = with_retries("telling running services", PUBLISH_TIMEOUT, || {
            tries.fetch_add(1, Ordering::Relaxed);
            async { Err::<(), _>(StoreError::unavailable("refused".into())) }
        })
        .await
        .unwrap_err();
        assert_eq!(tries.load(Ordering::Relaxed), ATTEMPTS);
        let text = format!("{err:#}");
        assert!(
            text.contains("4 tries failed") && text.contains("refused"),
            "{text}"
        );
    }

    /// An error that trying again cannot pass (a lost keyspace, a command the ACL refuses)
    /// ends the run at the first try, not after four tries and their pauses.
    #[tokio::test(start_paused = true)]
    async fn an_error_that_would_come_again_is_not_tried_again() {
        let noperm = || {
            StoreError::unavailable_from(redis::RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm),
                "NOPERM",
                "this user has no permissions to run the 'restore' command".to_owned(),
            )))
        };
        for (error, tried) in [
            (StoreError::Lost("gone".into()), 1),
            (noperm(), 1),
            (StoreError::Timeout(Duration::from_millis(5)), ATTEMPTS),
        ] {
            let tries = AtomicU32::new(0);
            let error = std::sync::Mutex::new(Some(error));
            let failed = with_retries("writing buckets", WRITE_TIMEOUT, || {
                tries.fetch_add(1, Ordering::Relaxed);
                let e = error.lock().unwrap().clone().unwrap();
                async move { Err::<(), _>(e) }
            })
            .await;
            assert!(failed.is_err());
            assert_eq!(tries.load(Ordering::Relaxed), tried);
        }
    }
}
