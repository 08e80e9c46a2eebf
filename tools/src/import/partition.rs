//! Phase 1's output and phase 3's input: accepted rows as 16-byte records, grouped by ranges
//! of consecutive buckets (partitions). A partition stays in memory until the `--memory-mb`
//! budget of all of them is used, then every partition spills to its own temporary file, so
//! memory stays bounded whatever the input size. [`group`] turns one partition back into
//! bucket writes, ascending, where the last row for an entry wins (as with the API).

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Seek, Write};
use std::path::Path;

use anyhow::Context;
use namelist::store::redis::bulk::BucketWrite;

/// One accepted row: where it goes and its expiry code. 16 bytes, spilled as such.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Rec {
    pub(super) bucket: u32,
    pub(super) code: u32,
    pub(super) field: i64,
}

impl Rec {
    fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&self.bucket.to_le_bytes());
        b[4..8].copy_from_slice(&self.code.to_le_bytes());
        b[8..].copy_from_slice(&self.field.to_le_bytes());
        b
    }

    fn from_bytes(b: &[u8]) -> Self {
        Self {
            bucket: u32::from_le_bytes(b[..4].try_into().expect("4 bytes")),
            code: u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")),
            field: i64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
        }
    }
}

/// The default grouping budget: a quarter of the memory this process may use (the machine's,
/// or the cgroup v2 limit when lower: a container), between 256 MiB and 16 GiB.
pub(super) fn default_budget() -> u64 {
    const MIB: u64 = 1 << 20;
    // SAFETY: sysconf has no preconditions; -1 (unknown) is handled below.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let machine = if pages > 0 && page > 0 {
        pages as u64 * page as u64
    } else {
        4096 * MIB
    };
    let limit = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(u64::MAX);
    (machine.min(limit) / 4).clamp(256 * MIB, 16 * 1024 * MIB)
}

/// Bytes free for an unprivileged user on the file system holding `dir`.
fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid C string and `st` a valid out-pointer for the call.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Room a spill leaves free on its file system: the rest of the import (the partitions read
/// back one at a time, the reject file) needs some too.
const SPILL_MARGIN: u64 = 64 << 20;

/// Records grouped by ranges of buckets, in memory up to a budget, then in temporary files.
pub(super) struct Partitions {
    buckets_per: u32,
    buffers: Vec<Vec<Rec>>,
    files: Vec<Option<BufWriter<File>>>,
    dir: Option<tempfile::TempDir>,
    buffered: usize,
    budget: usize,
}

impl Partitions {
    pub(super) fn new(buckets: u32, budget_bytes: u64) -> Self {
        // ~25,000 buckets ≈ 5M rows at the design fill of 200: one partition for most imports.
        let buckets_per = 25_000u32.min(buckets).max(1);
        let n = buckets.div_ceil(buckets_per) as usize;
        Self {
            buckets_per,
            buffers: vec![Vec::new(); n],
            files: (0..n).map(|_| None).collect(),
            dir: None,
            buffered: 0,
            budget: (budget_bytes / 16).max(1024) as usize,
        }
    }

    pub(super) fn push(&mut self, rec: Rec) -> anyhow::Result<()> {
        self.buffers[(rec.bucket / self.buckets_per) as usize].push(rec);
        self.buffered += 1;
        if self.buffered >= self.budget {
            self.spill()?;
        }
        Ok(())
    }

    fn spill(&mut self) -> anyhow::Result<()> {
        if self.dir.is_none() {
            self.dir = Some(tempfile::tempdir().context("creating a spill directory")?);
        }
        let dir = self.dir.as_ref().expect("just created").path().to_owned();
        // Checked before every spill, not guessed up front (gzip and stdin have no size): a
        // full disk stops the import with the figures, before a write fails half-way.
        let need = self.buffered as u64 * 16;
        let free = free_bytes(&dir)
            .with_context(|| format!("reading the free space of {}", dir.display()))?;
        if free < need + SPILL_MARGIN {
            anyhow::bail!(
                "the spill directory {} has {} MiB free; this spill needs {} MiB (16 B a row past                  --memory-mb) plus {} MiB of margin: point TMPDIR at a larger disk or raise                  --memory-mb (nothing was written to Redis yet)",
                dir.display(),
                free >> 20,
                need.div_ceil(1 << 20),
                SPILL_MARGIN >> 20
            );
        }
        for (i, buf) in self.buffers.iter_mut().enumerate() {
            if buf.is_empty() {
                continue;
            }
            if self.files[i].is_none() {
                // Read back in `take`: opened for both (`File::create` is write-only, and
                // reading it failed with EBADF past ~67M rows at the default budget).
                let path = dir.join(format!("p{i}"));
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(&path)
                    .with_context(|| format!("creating the spill file {}", path.display()))?;
                self.files[i] = Some(BufWriter::new(f));
            }
            let w = self.files[i].as_mut().expect("just created");
            for r in buf.drain(..) {
                w.write_all(&r.to_bytes())?;
            }
            buf.shrink_to_fit();
        }
        self.buffered = 0;
        Ok(())
    }

    pub(super) fn len(&self) -> usize {
        self.buffers.len()
    }

    /// Every record of partition `i`, in input order (spilled ones first: they are older).
    pub(super) fn take(&mut self, i: usize) -> anyhow::Result<Vec<Rec>> {
        let mut out = Vec::new();
        if let Some(w) = self.files[i].take() {
            let mut f = w.into_inner().map_err(|e| e.into_error())?;
            f.rewind()?;
            let mut bytes = Vec::new();
            f.read_to_end(&mut bytes)?;
            out.extend(bytes.chunks_exact(16).map(Rec::from_bytes));
        }
        out.append(&mut self.buffers[i]);
        Ok(out)
    }
}

/// Groups records (input order) into buckets in ascending order; in each bucket the last
/// record for a field wins.
pub(super) fn group(mut recs: Vec<Rec>) -> Vec<BucketWrite> {
    recs.sort_by_key(|r| r.bucket); // stable: input order kept within a bucket
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for run in recs.chunk_by(|a, b| a.bucket == b.bucket) {
        seen.clear();
        let mut pairs: Vec<(i64, i64)> = run
            .iter()
            .rev()
            .filter(|r| seen.insert(r.field))
            .map(|r| (r.field, i64::from(r.code)))
            .collect();
        pairs.reverse();
        out.push(BucketWrite {
            bucket: run[0].bucket,
            pairs,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(i: u32) -> Rec {
        Rec {
            bucket: (i * 7_919) % 60_000,
            code: i,
            field: i64::from(i) * 31 - 1_000_000,
        }
    }

    #[test]
    fn the_default_budget_is_a_share_of_memory_within_bounds() {
        let b = default_budget();
        assert!((256 << 20..=16 << 30).contains(&b), "{b}");
        assert!(free_bytes(&std::env::temp_dir()).unwrap() > 0);
    }

    #[test]
    fn spilled_partitions_come_back_whole_and_in_input_order() {
        // A budget of 1,024 records (the floor) over 60,000 buckets (3 partitions): 10,000
        // records spill about nine times, and the last ones stay in memory.
        let mut p = Partitions::new(60_000, 0);
        for i in 0..10_000 {
            p.push(rec(i)).unwrap();
        }
        assert!(p.dir.is_some(), "the budget was passed: partitions spilled");
        assert_eq!(p.len(), 3);
        let mut all = Vec::new();
        for i in 0..p.len() {
            let part = p.take(i).unwrap();
            assert!(part.iter().all(|r| r.bucket / 25_000 == i as u32));
            assert!(
                part.windows(2).all(|w| w[0].code < w[1].code),
                "input order kept across the spill file and memory"
            );
            all.extend(part);
        }
        all.sort_by_key(|r| r.code);
        assert_eq!(all, (0..10_000).map(rec).collect::<Vec<_>>());
    }
}
