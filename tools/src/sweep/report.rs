//! What a sweep tells: its report (the JSON line, the table) and its progress on stderr.

use super::*;

/// What a sweep did. With `--resume`, the counts cover every run of the sweep.
///
/// The bucket and field counts and the bytes are of the buckets of entries; the `event_`
/// counts are of the buckets of remembered event ids; `keys_skipped`, `scan_batches`, `ops`
/// and `seconds` are of the whole walk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SweepReport {
    /// The keyspace's key prefix.
    pub prefix: String,
    pub dry_run: bool,
    /// The time swept as of (Unix ms).
    pub now_ms: i64,
    /// Buckets of entries of this keyspace visited (each once per run).
    pub buckets_scanned: u64,
    /// Keys matching the sweep's pattern (`<prefix>[be][:{]*`) that are not buckets of this
    /// keyspace, of entries or of event ids (or not hashes).
    pub keys_skipped: u64,
    /// Fields of the scanned buckets.
    pub fields_scanned: u64,
    /// Fields holding an expired code.
    pub expired_found: u64,
    /// Expired fields deleted (0 in a dry run).
    pub fields_reclaimed: u64,
    /// Expired fields that held another value at the delete (refreshed meanwhile): kept.
    pub skipped_refreshed: u64,
    /// Expired fields already deleted by someone else (lazy expiry, a delete) meanwhile.
    pub already_gone: u64,
    /// Fields or values that are not what the layout writes: never deleted.
    pub unparseable: u64,
    /// `MEMORY USAGE` of the buckets with expired fields, before their delete.
    pub bytes_before: u64,
    /// ... and after it (0 for a bucket the delete emptied; = before in a dry run).
    pub bytes_after: u64,
    /// `bytes_before - bytes_after`.
    pub bytes_freed: i64,
    // The event-id counts: absent from a checkpoint of a build that swept only entries.
    /// Buckets of remembered event ids of this keyspace visited (each once per run).
    #[serde(default)]
    pub event_buckets_scanned: u64,
    /// Remembered event ids (fields) of those buckets.
    #[serde(default)]
    pub event_ids_scanned: u64,
    /// Event ids holding an expired code.
    #[serde(default)]
    pub event_ids_expired_found: u64,
    /// Expired event ids deleted (0 in a dry run).
    #[serde(default)]
    pub event_ids_deleted: u64,
    /// Expired event ids that held another value at the delete (remembered again
    /// meanwhile): kept.
    #[serde(default)]
    pub event_ids_skipped_refreshed: u64,
    /// Expired event ids already deleted by someone else (the service trims a full bucket).
    #[serde(default)]
    pub event_ids_already_gone: u64,
    /// Fields or values of event buckets that are not what the layout writes: never deleted.
    #[serde(default)]
    pub event_ids_unparseable: u64,
    /// `MEMORY USAGE` freed in the buckets of event ids (before minus after the deletes).
    #[serde(default)]
    pub event_bytes_freed: i64,
    /// SCAN calls made.
    pub scan_batches: u64,
    /// Redis commands sent (what `--max-ops-per-sec` paces).
    pub ops: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// The SCAN cursor to continue at (on `next_node` on a cluster); 0 when done.
    pub next_cursor: u64,
    /// Whether the SCAN of every node completed.
    pub done: bool,
    /// On a Redis Cluster: the primaries walked, in order (empty on a single node).
    #[serde(default)]
    pub primaries: Vec<String>,
    /// On a Redis Cluster: how many of `primaries` are done.
    #[serde(default)]
    pub primaries_done: u64,
    /// On a Redis Cluster: the primary whose SCAN continues at `next_cursor` (none when done).
    #[serde(default)]
    pub next_node: Option<String>,
    /// What `--cursor` takes to continue: `next_cursor` on a single node, `HOST:PORT/CURSOR`
    /// on a cluster; `0` when done.
    #[serde(default)]
    pub next_position: String,
}

impl SweepReport {
    /// Counts one swept bucket: into the entries' totals or the event ids'.
    pub(super) fn add(&mut self, bucket: &Bucket, b: &BucketOutcome) {
        match bucket {
            Bucket::Entries(_) => {
                self.buckets_scanned += 1;
                self.fields_scanned += b.fields_scanned;
                self.expired_found += b.expired_found;
                self.fields_reclaimed += b.cas.deleted;
                self.skipped_refreshed += b.cas.refreshed;
                self.already_gone += b.already_gone;
                self.unparseable += b.unparseable;
                self.bytes_before += b.bytes_before;
                self.bytes_after += b.bytes_after;
                self.bytes_freed = self.bytes_before as i64 - self.bytes_after as i64;
            }
            Bucket::EventIds(_) => {
                self.event_buckets_scanned += 1;
                self.event_ids_scanned += b.fields_scanned;
                self.event_ids_expired_found += b.expired_found;
                self.event_ids_deleted += b.cas.deleted;
                self.event_ids_skipped_refreshed += b.cas.refreshed;
                self.event_ids_already_gone += b.already_gone;
                self.event_ids_unparseable += b.unparseable;
                self.event_bytes_freed += b.bytes_before as i64 - b.bytes_after as i64;
            }
        }
    }

    /// The human-readable table printed on stderr.
    pub fn table(&self) -> String {
        let mut rows: Vec<(&str, String)> = vec![
            ("prefix", self.prefix.clone()),
            ("as of (Unix ms)", self.now_ms.to_string()),
            ("dry run", self.dry_run.to_string()),
            ("buckets scanned", self.buckets_scanned.to_string()),
            ("keys skipped", self.keys_skipped.to_string()),
            ("fields scanned", self.fields_scanned.to_string()),
            ("expired found", self.expired_found.to_string()),
            ("fields reclaimed", self.fields_reclaimed.to_string()),
            ("skipped (refreshed)", self.skipped_refreshed.to_string()),
            ("already gone", self.already_gone.to_string()),
            ("unparseable (kept)", self.unparseable.to_string()),
            ("bytes before", self.bytes_before.to_string()),
            ("bytes after", self.bytes_after.to_string()),
            ("bytes freed", self.bytes_freed.to_string()),
            (
                "event buckets scanned",
                self.event_buckets_scanned.to_string(),
            ),
            ("event ids scanned", self.event_ids_scanned.to_string()),
            (
                "event ids expired",
                self.event_ids_expired_found.to_string(),
            ),
            ("event ids deleted", self.event_ids_deleted.to_string()),
            (
                "event ids refreshed",
                self.event_ids_skipped_refreshed.to_string(),
            ),
            ("event ids gone", self.event_ids_already_gone.to_string()),
            (
                "event ids unparseable",
                self.event_ids_unparseable.to_string(),
            ),
            ("event bytes freed", self.event_bytes_freed.to_string()),
            ("SCAN batches", self.scan_batches.to_string()),
            ("Redis commands", self.ops.to_string()),
            ("seconds", format!("{:.3}", self.seconds)),
        ];
        if !self.primaries.is_empty() {
            rows.push((
                "primaries swept",
                format!("{} of {}", self.primaries_done, self.primaries.len()),
            ));
        }
        rows.push(if self.done {
            ("next cursor", "0 (done)".to_owned())
        } else {
            (
                "next cursor",
                format!(
                    "{} (resume with --cursor {})",
                    self.next_position, self.next_position
                ),
            )
        });
        rows.iter()
            .map(|(k, v)| format!("  {k:<22}{v:>20}\n"))
            .collect()
    }
}

/// Progress on stderr: a bar on a terminal, else a line every [`PROGRESS_EVERY`].
pub(super) struct Progress {
    bar: Option<indicatif::ProgressBar>,
    last_line: Instant,
}

impl Progress {
    pub(super) fn new(buckets: u32) -> Self {
        let bar = progress::drawn().then(|| {
            progress::bar(
                false,
                Some(u64::from(buckets)),
                "{elapsed_precise} [{bar:30}] {pos}/{len} buckets {msg}",
            )
        });
        Self {
            bar,
            last_line: Instant::now(),
        }
    }

    pub(super) fn update(&mut self, r: &SweepReport) {
        let msg = format!(
            "{} reclaimed, {} bytes freed, {} event ids deleted, next cursor {}",
            r.fields_reclaimed, r.bytes_freed, r.event_ids_deleted, r.next_position
        );
        match &self.bar {
            Some(bar) => {
                bar.set_position(r.buckets_scanned.min(bar.length().unwrap_or(u64::MAX)));
                bar.set_message(msg);
            }
            None if self.last_line.elapsed() >= PROGRESS_EVERY => {
                self.last_line = Instant::now();
                eprintln!(
                    "sweep: {} buckets, {} expired found, {msg}",
                    r.buckets_scanned, r.expired_found
                );
            }
            None => {}
        }
    }

    pub(super) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
