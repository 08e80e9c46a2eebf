//! The one progress-bar setup of the tools (`import`, `gen`, `audit`, `sweep`).
//!
//! A bar is drawn on stderr only when stderr is a terminal and the run is not `--quiet`:
//! stdout carries the tools' machine-readable output (`--json`, `gen`'s rows, sweep's report),
//! and a log collector (a Kubernetes Job's log) must get no escape codes. Otherwise the bar is
//! hidden, and still counts: a caller may read its position.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Whether a bar would be drawn (stderr is a terminal); a tool that must report progress
/// either way (sweep, in a CronJob's log) prints lines of its own when it is not.
pub fn drawn() -> bool {
    std::io::stderr().is_terminal()
}

/// A bar of `len` units (`None`: not known yet; `set_length` later) in indicatif's `template`,
/// hidden when `quiet` or when stderr is not a terminal.
pub fn bar(quiet: bool, len: Option<u64>, template: &str) -> ProgressBar {
    if quiet || !drawn() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(len, ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(template)
            .expect("a valid progress template")
            .progress_chars("=> "),
    );
    bar
}
