//! `namelist-tools sweep` (being written).

use super::Global;

/// Placeholder arguments.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(_global: &Global, _args: Args) -> anyhow::Result<()> {
    anyhow::bail!("sweep is not implemented yet")
}
