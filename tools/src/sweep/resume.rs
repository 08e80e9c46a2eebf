//! Where a sweep is and where it resumes: `--cursor` positions, the buckets visited in this
//! run, and the checkpoint file (`--checkpoint`, `--resume`).

use super::*;

/// Where a sweep (re)starts, as `--cursor` takes it and a stopped run prints it: a SCAN cursor
/// on a single node, or `HOST:PORT/CURSOR` (a cluster primary and its SCAN cursor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Position {
    Cursor(u64),
    Node {
        host: String,
        port: u16,
        cursor: u64,
    },
}

impl std::str::FromStr for Position {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("{s:?} is neither a SCAN cursor nor HOST:PORT/CURSOR");
        match s.rsplit_once('/') {
            None => s.parse().map(Position::Cursor).map_err(|_| bad()),
            Some((addr, cursor)) => {
                let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
                if host.is_empty() {
                    return Err(bad());
                }
                Ok(Position::Node {
                    host: host.to_owned(),
                    port: port.parse().map_err(|_| bad())?,
                    cursor: cursor.parse().map_err(|_| bad())?,
                })
            }
        }
    }
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Position::Cursor(c) => write!(f, "{c}"),
            Position::Node { host, port, cursor } => write!(f, "{host}:{port}/{cursor}"),
        }
    }
}

impl Position {
    /// The position of `cursor` on `target`.
    pub(super) fn at(target: &ScanTarget, cursor: u64) -> Self {
        match target {
            ScanTarget::Only => Position::Cursor(cursor),
            ScanTarget::Primary { host, port } => Position::Node {
                host: host.clone(),
                port: *port,
                cursor,
            },
        }
    }
}

/// Buckets visited in this run (SCAN may return a key twice), a bit per bucket of each kind:
/// 5,000 buckets of entries take 625 B, the event buckets of 10M ids (4 per slot) 8 KiB.
pub(super) struct Visited {
    entries: Bits,
    event_ids: Bits,
}

impl Visited {
    pub(super) fn new(layout: &Layout) -> Self {
        Self {
            entries: Bits::new(u64::from(layout.buckets())),
            event_ids: Bits::new(EventBucket::count(layout)),
        }
    }

    /// Marks `bucket`; whether it was new.
    pub(super) fn insert(&mut self, bucket: &Bucket) -> bool {
        match bucket {
            Bucket::Entries(n) => self.entries.insert(u64::from(*n)),
            Bucket::EventIds(e) => self.event_ids.insert(e.index()),
        }
    }
}

/// A fixed-size bit set.
pub(super) struct Bits(Vec<u64>);

impl Bits {
    pub(super) fn new(len: u64) -> Self {
        Self(vec![0; len.div_ceil(64) as usize])
    }

    /// Marks `n` (below the length); whether it was new.
    pub(super) fn insert(&mut self, n: u64) -> bool {
        let (word, bit) = ((n / 64) as usize, 1u64 << (n % 64));
        let new = self.0[word] & bit == 0;
        self.0[word] |= bit;
        new
    }
}

/// The checkpoint file: the report so far, the nodes walked and the position (node index,
/// the report's `next_cursor`), and the `run_id` of the node the cursor belongs to.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Checkpoint {
    pub(super) version: u32,
    pub(super) server_run_id: Option<String>,
    /// The nodes, in walk order (absent in version 1: the only node).
    #[serde(default)]
    pub(super) targets: Vec<ScanTarget>,
    /// The node `next_cursor` belongs to (`targets[target_index]`).
    #[serde(default)]
    pub(super) target_index: usize,
    pub(super) report: SweepReport,
}

impl Checkpoint {
    /// `None` if there is no file.
    pub(super) fn read(path: &Path) -> anyhow::Result<Option<Self>> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(e).with_context(|| format!("reading checkpoint {}", path.display()));
            }
        };
        let cp: Self = serde_json::from_str(&text)
            .with_context(|| format!("checkpoint {} is not a sweep checkpoint", path.display()))?;
        if cp.version != CHECKPOINT_VERSION && cp.version != 1 {
            bail!(
                "checkpoint {} has format {}, this build writes {CHECKPOINT_VERSION}",
                path.display(),
                cp.version
            );
        }
        Ok(Some(cp))
    }

    /// Replaces the checkpoint at `path`, atomically and durably (`crate::checkpoint`).
    pub(super) fn write(&self, path: &Path) -> anyhow::Result<()> {
        crate::checkpoint::write(path, self)
    }

    pub(super) fn remove(path: &Path) -> anyhow::Result<()> {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("removing checkpoint {}", path.display()))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_mark_once() {
        let mut v = Bits::new(130);
        assert!(v.insert(0));
        assert!(v.insert(129));
        assert!(!v.insert(129));
        assert!(v.insert(64));
        assert!(!v.insert(0));
    }
}
