//! The `namelist-tools` binary: parses the command line and runs one tool of this crate's
//! library (`namelist_tools`), itself over the service's library (one normalisation, one
//! storage layout). Each subcommand's help says what it costs and whether it is safe against
//! a live store.

use clap::{Parser, Subcommand};
use namelist_tools::{self as tools, Global};

#[derive(Parser)]
#[command(
    version,
    about = "Operator tools for namelist: import, gen, audit, sweep, keygen, keyspace"
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Import(tools::import::Args),
    Gen(tools::gen_data::Args),
    Audit(tools::audit::Args),
    Sweep(tools::sweep::Args),
    Keygen(tools::keygen::Args),
    /// Keyspace administration.
    #[command(subcommand)]
    Keyspace(KeyspaceCommand),
}

#[derive(Subcommand)]
enum KeyspaceCommand {
    Create(tools::keyspace::Args),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    namelist::telemetry::init(namelist::config::LogFormat::Text);
    let result = match cli.command {
        Command::Import(args) => tools::import::run(&cli.global, args).await,
        Command::Gen(args) => tools::gen_data::run(args),
        Command::Audit(args) => tools::audit::run(&cli.global, args).await,
        Command::Sweep(args) => tools::sweep::run(&cli.global, args).await,
        Command::Keygen(args) => tools::keygen::run(&args),
        Command::Keyspace(KeyspaceCommand::Create(args)) => {
            tools::keyspace::run(&cli.global, args).await
        }
    };
    match result {
        // The reader of standard output stopped early (`| head`): it has what it wanted.
        Err(e) if tools::stdout_closed(&e) => Ok(()),
        result => result,
    }
}
