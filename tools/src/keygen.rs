//! `namelist-tools keygen`: a new fingerprint key file. The one tool that needs neither Redis
//! nor a key; it never replaces an existing file (a keyspace cannot be read without the key it
//! was made with, so losing one by an overwrite loses the keyspace).

use std::path::PathBuf;

use anyhow::Context;

use namelist::store::FingerprintKey;

/// Write a new fingerprint key (32 random bytes from the OS, as 64 hex digits) to a new file,
/// mode 0600.
///
/// Point NAMELIST_FINGERPRINT_KEY_FILE at it for the service and every tool of the keyspace
/// (in Kubernetes: a Secret mounted as a file, see k8s/README.md), and keep a copy in your
/// secret store: a keyspace made with it can never be read without it. Prints the key's id
/// (what `<prefix>meta` records), never the key. Touches no store; refuses to overwrite.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The key file to create (must not exist).
    #[arg(long)]
    pub out: PathBuf,
}

/// The CLI entry point.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let key = FingerprintKey::create_file(&args.out).context("keygen")?;
    crate::out(format_args!(
        "wrote a new fingerprint key to {} (mode 0600), key id {}",
        args.out.display(),
        key.id()
    ))?;
    eprintln!(
        "set NAMELIST_FINGERPRINT_KEY_FILE={} for the service and the tools, and keep a copy in your secret store",
        args.out.display()
    );
    Ok(())
}
