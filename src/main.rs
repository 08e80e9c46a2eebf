//! The `namelist` binary: parse arguments, load configuration, start logging, serve.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use namelist::config::Settings;
use namelist::startup::Application;

/// mimalloc instead of glibc's malloc: a check allocates and frees many small objects on
/// every worker thread (a fifth of the miss path's CPU went to glibc malloc/free in the load
/// harness's profiles).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(version, about = "Name-list lookup service for real-time risk engines")]
struct Cli {
    /// TOML configuration file (settings in NAMELIST_* environment variables override it).
    #[arg(long, global = true, env = "NAMELIST_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API (the default).
    Serve,
    /// Print the OpenAPI document (what `GET /openapi.json` serves) and exit.
    Openapi,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if matches!(cli.command, Some(Command::Openapi)) {
        // A reader that stops early (`| head`) is not an error; any other failure to write is.
        let mut out = std::io::stdout().lock();
        return match writeln!(out, "{}", namelist::routes::openapi::document_json()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            written => written.context("writing the OpenAPI document to stdout"),
        };
    }
    let settings = Settings::load(cli.config.as_deref()).context("loading configuration")?;
    namelist::telemetry::init(settings.log_format);
    let unknown = Settings::unknown_env_vars();
    if !unknown.is_empty() {
        tracing::info!(
            ?unknown,
            "ignoring NAMELIST_* variables that are not settings"
        );
    }
    match cli.command.unwrap_or(Command::Serve) {
        Command::Openapi => unreachable!("answered before the settings are read"),
        Command::Serve => {
            let app = Application::build(settings)
                .await
                .context("starting the service")?;
            app.run_until_stopped().await.context("serving")?;
        }
    }
    Ok(())
}
