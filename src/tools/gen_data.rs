//! `namelist-tools gen` (being written).

/// Placeholder arguments.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("gen is not implemented yet")
}
