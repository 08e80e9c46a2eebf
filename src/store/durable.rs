//! The embedded store's durable record: a [redb](https://docs.rs/redb) database, one file
//! (`<data_dir>/namelist.redb`), holding every row of the embedded store's state.
//!
//! The embedded store keeps its whole state in memory (lookups are hash-map steps, as fast as
//! before it was durable) and writes every change here **before it acknowledges it**: an
//! operation changes its in-memory state under the store's lock, queues the rows it changed
//! (in that lock, so the queue's order is the order of the changes), releases the lock and
//! waits for the commit. One thread commits: it takes everything queued, writes it in one
//! redb write transaction and commits with [`redb::Durability::Immediate`] (the commit returns
//! after the file's fsync), then answers every waiter. So a stream of small writes shares one
//! fsync per commit (group commit): the more writers wait, the more each commit carries.
//!
//! What that means at the edges, chosen and tested (`tests/integration/durability.rs`):
//! * `kill -9` at any moment loses nothing acknowledged: an acknowledgement follows the
//!   commit. A write not yet acknowledged is there after a restart or not, whole (one
//!   operation's rows are in one transaction).
//! * A concurrent reader may see a change a moment before it is durable (the same as Redis
//!   with `appendfsync always`: a change is visible when applied, durable when acknowledged).
//! * A commit that fails (disk full, I/O error) fails its waiters with 503 and **stops the
//!   record**: every later write is refused with 503 without being applied, because the
//!   in-memory state now holds changes the file does not. Reads go on. A restart reloads the
//!   file: what was acknowledged.
//!
//! Tables (keys and values are postcard, except where said):
//! * `meta`: `format`, `key_id`, `buckets` of the keyspace (refused on open if they do not
//!   match, as Redis's meta key is), and `snapshot_imported` once an older build's snapshot
//!   file was imported;
//! * `entries`: (bucket, field) as 12 big-endian bytes → (expiry code, scope id), `scopes`:
//!   scope id (4 big-endian bytes) → (list, sandbox), so that the lists' counts change in the
//!   commit of the write that changes them (`EntryStore::counts_itself`); `registries`: (scope,
//!   length) → (); `audit`: seq (8 big-endian bytes, so the trail is in order) → (ms, record);
//!   `counts`: (list, sandbox) → (entries, last change); `definitions`: (kind, id) →
//!   (version, fingerprint, body); `metrics`: metric key → its whole entity; `events`: event
//!   hash → remembered until.
//!
//! The file is locked by redb while open (a second process is refused with
//! `DatabaseAlreadyOpen`), and checked on every open (`set_check_integrity_on_open`: every
//! page's checksum), so a damaged file is refused naming it, never opened as empty.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::oneshot;

use super::{StoreError, StoreResult};

/// The database file's name in the data directory.
pub const DB_FILE: &str = "namelist.redb";

type Rows = TableDefinition<'static, &'static [u8], &'static [u8]>;

/// One table of the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    Meta,
    Entries,
    Registries,
    Audit,
    Counts,
    Definitions,
    Metrics,
    Events,
    Scopes,
}

impl Table {
    pub const ALL: [Table; 9] = [
        Table::Meta,
        Table::Entries,
        Table::Registries,
        Table::Audit,
        Table::Counts,
        Table::Definitions,
        Table::Metrics,
        Table::Events,
        Table::Scopes,
    ];

    fn def(self) -> Rows {
        TableDefinition::new(match self {
            Table::Meta => "meta",
            Table::Entries => "entries",
            Table::Registries => "registries",
            Table::Audit => "audit",
            Table::Counts => "counts",
            Table::Definitions => "definitions",
            Table::Metrics => "metrics",
            Table::Events => "events",
            Table::Scopes => "scopes",
        })
    }
}

/// The rows of one table, as read at open: (key, value).
pub type RowSet = Vec<(Vec<u8>, Vec<u8>)>;

/// One row changed: `Some(value)` put, `None` deleted.
pub type Change = (Table, Vec<u8>, Option<Vec<u8>>);

/// What one operation queued: its rows and who waits for their commit.
struct Queued {
    changes: Vec<Change>,
    done: Box<dyn FnOnce(Result<(), String>) + Send>,
}

/// A wait for one operation's commit.
pub struct Pending(oneshot::Receiver<Result<(), String>>);

impl Pending {
    /// Waits until the rows are durable (or the commit failed).
    pub async fn durable(self) -> StoreResult<()> {
        match self.0.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(StoreError::unavailable(e)),
            Err(_) => Err(StoreError::unavailable(
                "the embedded store's record was closed".into(),
            )),
        }
    }
}

/// Statistics of the committer (for docs/performance.md's figures and tests).
#[derive(Debug, Default, Clone, Copy)]
pub struct CommitStats {
    pub commits: u64,
    pub operations: u64,
}

/// The durable record: the open database and its committing thread.
pub struct Durable {
    path: PathBuf,
    sender: Mutex<Option<mpsc::Sender<Queued>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Set by the committer when a commit failed: the record is stopped.
    failed: Arc<Mutex<Option<String>>>,
    stats: Arc<Mutex<CommitStats>>,
    /// Every row at open, table by table (taken once by the store that loads them).
    loaded: Mutex<Option<Vec<RowSet>>>,
}

impl Durable {
    /// Opens (or creates) `<dir>/namelist.redb`, reads every row, and starts the committer.
    /// Refused: a directory that cannot be made, a file another process has open, a file that
    /// is not a redb database or fails its integrity check (the error names the file).
    pub fn open(dir: &Path) -> StoreResult<Self> {
        std::fs::create_dir_all(dir).map_err(|e| {
            StoreError::Keyspace(format!("data_dir {}: cannot create it: {e}", dir.display()))
        })?;
        let path = dir.join(DB_FILE);
        let named = |what: String| StoreError::Keyspace(format!("{}: {what}", path.display()));
        let db = redb::Builder::new()
            // The whole state is in memory above it: the cache only serves writes' page reads.
            .set_cache_size(64 << 20)
            .set_check_integrity_on_open(true)
            .create(&path)
            .map_err(|e| match e {
                redb::DatabaseError::DatabaseAlreadyOpen => named(
                    "in use by another process (data_dir is locked while a service has it open)"
                        .into(),
                ),
                other => named(format!(
                    "cannot be opened ({other}): refused rather than started empty; restore it from a backup or move it away"
                )),
            })?;
        let mut loaded = Vec::with_capacity(Table::ALL.len());
        {
            let txn = db
                .begin_read()
                .map_err(|e| named(format!("cannot be read: {e}")))?;
            for table in Table::ALL {
                let mut rows = Vec::new();
                match txn.open_table(table.def()) {
                    Ok(t) => {
                        for row in t
                            .iter()
                            .map_err(|e| named(format!("cannot be read: {e}")))?
                        {
                            let (k, v) = row.map_err(|e| named(format!("cannot be read: {e}")))?;
                            rows.push((k.value().to_vec(), v.value().to_vec()));
                        }
                    }
                    Err(redb::TableError::TableDoesNotExist(_)) => {}
                    Err(e) => return Err(named(format!("cannot be read: {e}"))),
                }
                loaded.push(rows);
            }
        }
        let (sender, receiver) = mpsc::channel::<Queued>();
        let failed = Arc::new(Mutex::new(None));
        let stats = Arc::new(Mutex::new(CommitStats::default()));
        let thread = {
            let (failed, stats, path) = (failed.clone(), stats.clone(), path.clone());
            std::thread::Builder::new()
                .name("namelist-commit".into())
                .spawn(move || commit_loop(db, receiver, failed, stats, path))
                .map_err(|e| named(format!("cannot start its committer: {e}")))?
        };
        Ok(Self {
            path,
            sender: Mutex::new(Some(sender)),
            thread: Mutex::new(Some(thread)),
            failed,
            stats,
            loaded: Mutex::new(Some(loaded)),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The rows read at open, in the order of [`Table::ALL`] (once; then empty).
    pub fn take_loaded(&self) -> Vec<RowSet> {
        self.loaded
            .lock()
            .expect("durable lock")
            .take()
            .unwrap_or_else(|| vec![Vec::new(); Table::ALL.len()])
    }

    /// The rows of one table read at open, without taking them (meta before the store opens).
    pub fn loaded_rows(&self, table: Table) -> RowSet {
        let i = Table::ALL.iter().position(|t| *t == table).unwrap_or(0);
        self.loaded
            .lock()
            .expect("durable lock")
            .as_ref()
            .map(|l| l[i].clone())
            .unwrap_or_default()
    }

    /// Refuses a write before it is applied when the record has stopped.
    pub fn check_writable(&self) -> StoreResult<()> {
        if self.sender.lock().expect("durable lock").is_none() {
            return Err(StoreError::unavailable(format!(
                "the embedded store's record {} is closed",
                self.path.display()
            )));
        }
        match &*self.failed.lock().expect("durable lock") {
            None => Ok(()),
            Some(e) => Err(StoreError::unavailable(format!(
                "the embedded store's record {} stopped after a failed commit ({e}): restart the service",
                self.path.display()
            ))),
        }
    }

    /// Queues one operation's rows; call it under the store's lock, right after applying
    /// them, so that the queue's order is the state's. An empty change set still waits for
    /// the commit of everything queued before it.
    pub fn queue(&self, changes: Vec<Change>) -> Pending {
        let (done, wait) = oneshot::channel();
        self.send(changes, Box::new(move |r| drop(done.send(r))));
        Pending(wait)
    }

    /// Queues rows and blocks until they are committed (start-up only: not on a runtime's
    /// worker between awaits).
    pub fn write_now(&self, changes: Vec<Change>) -> StoreResult<()> {
        let (done, wait) = mpsc::channel();
        self.send(changes, Box::new(move |r| drop(done.send(r))));
        match wait.recv() {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(StoreError::unavailable(e)),
            Err(_) => Err(StoreError::unavailable(
                "the embedded store's record was closed".into(),
            )),
        }
    }

    fn send(&self, changes: Vec<Change>, done: Box<dyn FnOnce(Result<(), String>) + Send>) {
        let sender = self.sender.lock().expect("durable lock");
        if let Some(s) = sender.as_ref() {
            // A send fails only when the committer is gone: `done` is dropped with it, and
            // the waiter hears "closed".
            let _ = s.send(Queued { changes, done });
        }
    }

    /// How many commits carried how many operations so far.
    pub fn stats(&self) -> CommitStats {
        *self.stats.lock().expect("durable lock")
    }

    /// Commits what is queued, stops the committer and closes the file (its lock released).
    /// Later writes are refused.
    pub fn close(&self) {
        drop(self.sender.lock().expect("durable lock").take());
        if let Some(t) = self.thread.lock().expect("durable lock").take() {
            let _ = t.join();
            let s = self.stats();
            tracing::info!(
                file = %self.path.display(),
                commits = s.commits,
                operations = s.operations,
                "embedded store closed"
            );
        }
    }
}

impl Drop for Durable {
    fn drop(&mut self) {
        self.close();
    }
}

/// Commits what was queued, as many operations per transaction as waited (at most 4,096),
/// until every sender is gone.
fn commit_loop(
    db: redb::Database,
    receiver: mpsc::Receiver<Queued>,
    failed: Arc<Mutex<Option<String>>>,
    stats: Arc<Mutex<CommitStats>>,
    path: PathBuf,
) {
    while let Ok(first) = receiver.recv() {
        let mut group = vec![first];
        while group.len() < 4096 {
            match receiver.try_recv() {
                Ok(q) => group.push(q),
                Err(_) => break,
            }
        }
        let stopped = failed.lock().expect("durable lock").clone();
        let result = match stopped {
            Some(e) => Err(format!("a commit failed before: {e}")),
            None => commit(&db, &group).map_err(|e| {
                tracing::error!(
                    file = %path.display(),
                    error = %e,
                    "the embedded store's commit failed: writes are refused until a restart"
                );
                *failed.lock().expect("durable lock") = Some(e.clone());
                e
            }),
        };
        if result.is_ok() {
            let mut s = stats.lock().expect("durable lock");
            s.commits += 1;
            s.operations += group.len() as u64;
        }
        for q in group {
            (q.done)(result.clone());
        }
    }
}

fn commit(db: &redb::Database, group: &[Queued]) -> Result<(), String> {
    let txn = db.begin_write().map_err(|e| e.to_string())?;
    {
        let mut open: Vec<Option<redb::Table<'_, &'static [u8], &'static [u8]>>> =
            (0..Table::ALL.len()).map(|_| None).collect();
        for (table, key, value) in group.iter().flat_map(|q| &q.changes) {
            let i = Table::ALL.iter().position(|t| t == table).unwrap_or(0);
            if open[i].is_none() {
                open[i] = Some(txn.open_table(table.def()).map_err(|e| e.to_string())?);
            }
            let t = open[i].as_mut().expect("opened above");
            match value {
                Some(v) => {
                    t.insert(key.as_slice(), v.as_slice())
                        .map_err(|e| e.to_string())?;
                }
                None => {
                    t.remove(key.as_slice()).map_err(|e| e.to_string())?;
                }
            }
        }
    }
    txn.commit().map_err(|e| e.to_string())
}
