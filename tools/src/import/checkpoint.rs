//! Resuming an interrupted import. After every acknowledged batch (at most every 200 ms), the
//! checkpoint file records the bucket below which everything is written, with the identity of
//! the input, the keyspace, and the first run's "now" (so `ttl_seconds` give the same expiries
//! in both parts of a resumed run). `--resume` reads the whole file again (phase 1 is cheap)
//! and skips those buckets; buckets at or past the mark are written again whole, which is
//! idempotent: the end state is what one clean run gives. The file is written to a temporary
//! name and renamed, and removed when the import completes.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use namelist::domain::now_ms;
use namelist::store::{Hashing, Layout};
use serde::{Deserialize, Serialize};

use super::Args;

/// Identity of the input, so a checkpoint is never applied to another file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct InputId {
    path: PathBuf,
    size: u64,
    modified_ms: u128,
    /// The keyspace's keyed hash of the first MiB (`Hashing::import_input`): a small input is
    /// a few rows, which an unkeyed hash would give back. A checkpoint of an older build
    /// (`head_xxh3`) parses, and is then taken for another input.
    #[serde(alias = "head_xxh3")]
    head_hash: u64,
}

fn input_id(path: &Path, hashing: &Hashing) -> anyhow::Result<InputId> {
    let meta = std::fs::metadata(path)?;
    let mut head = vec![0u8; 1 << 20];
    let mut f = File::open(path)?;
    let mut n = 0;
    while n < head.len() {
        let k = f.read(&mut head[n..])?;
        if k == 0 {
            break;
        }
        n += k;
    }
    Ok(InputId {
        path: path.canonicalize()?,
        size: meta.len(),
        modified_ms: meta
            .modified()?
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0),
        head_hash: hashing.import_input(&head[..n]),
    })
}

/// What a checkpoint records.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Checkpoint {
    version: u32,
    input: InputId,
    prefix: String,
    buckets: u32,
    /// Every bucket below this one is written.
    done_below: u32,
    /// "Now" of the first run: `ttl_seconds` count from it, so both parts of a resumed run
    /// write the same expiries.
    now_ms: i64,
}

fn save_checkpoint(path: &Path, cp: &Checkpoint) -> anyhow::Result<()> {
    crate::checkpoint::write(path, cp)
}

/// Where a run starts: from scratch, or from its checkpoint (`--resume`), and where it keeps
/// its own.
pub(super) struct Resume {
    /// The checkpoint file of this run (none for stdin or a dry run).
    path: Option<PathBuf>,
    /// The input's identity (none for stdin).
    input: Option<InputId>,
    /// Buckets below this one are written already.
    pub(super) done_below: u32,
    /// "Now" of the run (of its first part, when resumed).
    pub(super) now_ms: i64,
    /// Whether a checkpoint was resumed from.
    pub(super) resumed: bool,
}

impl Resume {
    /// Reads the checkpoint when `--resume` asks for it and it belongs to this input and
    /// keyspace; a clean start otherwise (with a note when a checkpoint is there unused).
    pub(super) fn prepare(args: &Args, layout: &Layout) -> anyhow::Result<Self> {
        if args.resume && args.input_path().is_none() {
            bail!("--resume needs an input FILE (stdin cannot be read again)");
        }
        let path = args.checkpoint_path().filter(|_| !args.dry_run);
        let input = args
            .input_path()
            .map(|p| input_id(p, layout.hashing()))
            .transpose()?;
        let mut resume = Self {
            path,
            input,
            done_below: 0,
            now_ms: now_ms(),
            resumed: false,
        };
        let existing = resume.path.clone().filter(|p| p.exists());
        match existing {
            Some(path) if args.resume => {
                let cp: Checkpoint = serde_json::from_slice(
                    &std::fs::read(&path)
                        .with_context(|| format!("reading checkpoint {}", path.display()))?,
                )
                .context("parsing the checkpoint")?;
                if Some(&cp.input) != resume.input.as_ref() {
                    bail!(
                        "the checkpoint {} is for another input (or the file changed); run without --resume",
                        path.display()
                    );
                }
                if cp.prefix != layout.prefix() || cp.buckets != layout.buckets() {
                    bail!(
                        "the checkpoint is for keyspace {} with {} buckets, not {} with {}",
                        cp.prefix,
                        cp.buckets,
                        layout.prefix(),
                        layout.buckets()
                    );
                }
                resume.done_below = cp.done_below;
                resume.now_ms = cp.now_ms;
                resume.resumed = true;
            }
            // Nothing to resume (the first attempt of a Job, say): a clean run.
            None if args.resume => {
                eprintln!("note: no checkpoint to resume from; importing from the start");
            }
            Some(path) => eprintln!(
                "note: ignoring the checkpoint {} of an earlier run (pass --resume to use it)",
                path.display()
            ),
            None => {}
        }
        Ok(resume)
    }

    /// Records that every bucket up to `last` is acknowledged (nothing for stdin).
    pub(super) fn save(&self, layout: &Layout, last: u32) -> anyhow::Result<()> {
        let (Some(path), Some(input)) = (&self.path, &self.input) else {
            return Ok(());
        };
        save_checkpoint(
            path,
            &Checkpoint {
                version: 1,
                input: input.clone(),
                prefix: layout.prefix().to_owned(),
                buckets: layout.buckets(),
                done_below: last + 1,
                now_ms: self.now_ms,
            },
        )
    }

    /// The import completed: its checkpoint goes.
    pub(super) fn finish(self) -> anyhow::Result<()> {
        if let Some(p) = self.path.filter(|p| p.exists()) {
            std::fs::remove_file(p)?;
        }
        Ok(())
    }
}
