//! The walk over the keyspace: the node or each cluster primary in turn, and its SCAN cursor.

use super::*;

/// Where a sweep is: the nodes it walks (the node, or every primary in address order), the
/// one it is on and the SCAN cursor there, and that node's `run_id` (a cursor means nothing to
/// another server process).
pub(super) struct Walk {
    pub(super) targets: Vec<ScanTarget>,
    pub(super) cluster: bool,
    /// `targets[index]` is being walked; `targets.len()`: done.
    pub(super) index: usize,
    pub(super) cursor: u64,
    pub(super) run_id: Option<String>,
}

impl Walk {
    /// The targets' names, comma-separated (for messages).
    pub(super) fn names(targets: &[ScanTarget]) -> String {
        targets
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Continues from checkpoint `cp` (read from `path`): its position, unless the topology or
    /// the node's process changed since (then that node, or the whole walk, starts over, with
    /// a warning), and its report so far.
    pub(super) async fn resume(
        &mut self,
        path: &Path,
        cp: Checkpoint,
        opts: &Args,
        layout: &Layout,
        sw: &mut Sweeper<'_>,
    ) -> anyhow::Result<SweepReport> {
        let path = path.display();
        if cp.report.prefix != layout.prefix() {
            bail!(
                "checkpoint {path} is for key prefix {:?}, not {:?}",
                cp.report.prefix,
                layout.prefix()
            );
        }
        if cp.report.dry_run != opts.dry_run {
            bail!(
                "checkpoint {path} is of a {} sweep: resume it with{} --dry-run, or remove it",
                if cp.report.dry_run { "dry-run" } else { "real" },
                if cp.report.dry_run { "" } else { "out" },
            );
        }
        let saved = if cp.targets.is_empty() {
            vec![ScanTarget::Only] // version 1: a single node
        } else {
            cp.targets.clone()
        };
        let targets = &self.targets;
        let (mut index, mut cursor) = (cp.target_index, cp.report.next_cursor);
        if saved != *targets || index >= targets.len() {
            eprintln!(
                "WARNING: checkpoint {path} was taken on another topology (nodes {}; now {}): its position means nothing here; starting the walk over at {}, keeping its totals",
                Self::names(&saved),
                Self::names(targets),
                targets[0]
            );
            (index, cursor) = (0, 0);
        }
        let run_id = sw.run_id(&targets[index]).await;
        // A cursor is only meaningful to the process that returned it.
        if cursor != 0
            && cp.server_run_id.is_some()
            && run_id.is_some()
            && cp.server_run_id != run_id
        {
            if self.cluster {
                eprintln!(
                    "WARNING: checkpoint {path} was written against another Redis process on {} (restart or failover): its cursor means nothing there; starting that primary over at cursor 0",
                    targets[index]
                );
            } else {
                eprintln!(
                    "WARNING: checkpoint {path} was written against another Redis process (restart or failover): its cursor means nothing here; starting over at cursor 0"
                );
            }
            cursor = 0;
        }
        (self.index, self.cursor, self.run_id) = (index, cursor, run_id);
        let mut report = cp.report;
        if let Some(t) = opts.now_ms {
            report.now_ms = t;
        }
        Ok(report)
    }

    /// Starts at `--cursor` (a cursor on a single node, `HOST:PORT/CURSOR` on a cluster), or at
    /// the beginning.
    pub(super) async fn start(
        &mut self,
        position: Option<&Position>,
        sw: &mut Sweeper<'_>,
    ) -> anyhow::Result<()> {
        let targets = &self.targets;
        let (index, cursor) = match (position, self.cluster) {
            (None, _) => (0, 0),
            (Some(Position::Cursor(c)), false) => (0, *c),
            (Some(Position::Cursor(0)), true) => (0, 0),
            (Some(Position::Cursor(c)), true) => bail!(
                "--cursor {c}: on a Redis Cluster a position is HOST:PORT/CURSOR (a primary and its SCAN cursor, as a stopped run prints it); the primaries, in walk order: {}",
                Self::names(targets)
            ),
            (Some(p @ Position::Node { .. }), false) => bail!(
                "--cursor {p} names a cluster primary, but this store is a single Redis node: pass the SCAN cursor alone"
            ),
            (Some(p @ Position::Node { host, port, cursor }), true) => {
                let wanted = ScanTarget::Primary {
                    host: host.clone(),
                    port: *port,
                };
                let Some(i) = targets.iter().position(|t| *t == wanted) else {
                    bail!(
                        "--cursor {p}: {wanted} is not a primary of this cluster (now: {}): the topology changed since that run; start the sweep over without --cursor",
                        Self::names(targets)
                    );
                };
                (i, *cursor)
            }
        };
        self.run_id = sw.run_id(&targets[index]).await;
        (self.index, self.cursor) = (index, cursor);
        Ok(())
    }

    /// Loads the compare-and-delete script on every node the EVALSHAs go to: the node, or
    /// each primary.
    pub(super) async fn load_scripts(&self, sw: &mut Sweeper<'_>) -> anyhow::Result<()> {
        for t in &self.targets {
            sw.pace().await;
            sw.store.load_compare_and_delete(t).await.with_context(|| {
                if self.cluster {
                    format!("loading the compare-and-delete script (SCRIPT LOAD) on {t}")
                } else {
                    "loading the compare-and-delete script (SCRIPT LOAD)".to_owned()
                }
            })?;
        }
        Ok(())
    }

    /// After a SCAN batch returned `next`: the same node at `next`, or (0: this node is done)
    /// the next node from its start.
    pub(super) async fn advance(&mut self, next: u64, sw: &mut Sweeper<'_>) {
        if next == 0 {
            self.index += 1;
            self.cursor = 0;
            if self.index < self.targets.len() {
                self.run_id = sw.run_id(&self.targets[self.index]).await;
            }
        } else {
            self.cursor = next;
        }
    }

    /// Writes the position into `report`: done, the next cursor, node and position.
    pub(super) fn place(&self, report: &mut SweepReport) {
        let (index, cursor) = (self.index, self.cursor);
        report.done = index >= self.targets.len();
        report.next_cursor = if report.done { 0 } else { cursor };
        report.primaries_done = if self.cluster { index as u64 } else { 0 };
        report.next_node = self
            .targets
            .get(index)
            .filter(|_| self.cluster)
            .map(ToString::to_string);
        report.next_position = self
            .targets
            .get(index)
            .map_or(Position::Cursor(0), |t| Position::at(t, cursor))
            .to_string();
    }

    /// Writes the checkpoint at `path` (removes it once the sweep is done).
    pub(super) fn save(&self, path: &Path, report: &SweepReport) -> anyhow::Result<()> {
        if report.done {
            return Checkpoint::remove(path);
        }
        Checkpoint {
            version: CHECKPOINT_VERSION,
            server_run_id: self.run_id.clone(),
            targets: self.targets.clone(),
            target_index: self.index,
            report: report.clone(),
        }
        .write(path)
    }
}
