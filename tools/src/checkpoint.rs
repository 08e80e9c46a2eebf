//! The one way the tools write a checkpoint (`import --resume`, `sweep --resume`): the JSON
//! into `<path>.tmp`, synced, renamed over `<path>`, and the directory synced, so that after a
//! crash or a power cut the file is the old checkpoint or the new one, never a torn one, and a
//! checkpoint the run went on from is on disk.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;

/// Writes `value` as pretty JSON to `path`, atomically and durably.
pub fn write(path: &Path, value: &impl Serialize) -> anyhow::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        serde_json::to_writer_pretty(&mut f, value)?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        // The rename is durable once the directory holding it is.
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        std::fs::File::open(dir)?.sync_all()
    };
    write().with_context(|| format!("writing checkpoint {}", path.display()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_checkpoint_replaces_the_last_one_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.checkpoint");
        super::write(&path, &serde_json::json!({"done_below": 1})).unwrap();
        super::write(&path, &serde_json::json!({"done_below": 2})).unwrap();
        let read: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(read["done_below"], 2);
        assert!(!dir.path().join("run.checkpoint.tmp").exists());
        assert!(super::write(&dir.path().join("no/such/dir/cp"), &1).is_err());
    }
}
