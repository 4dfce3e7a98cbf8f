//! One module per subcommand. Each takes its parsed arguments whole and returns the exit
//! status; failures come back as errors for `main` to print.

pub mod admin;
pub mod attach;
pub mod cancel;
pub mod hold;
pub mod logs;
pub mod node_admin;
pub mod nodes;
pub mod queue;
pub mod show;
pub mod submit;

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::Result;
use serde::Serialize;

use crate::cli::{Cli, Command};

pub async fn run(cli: Cli) -> Result<ExitCode> {
    match &cli.command {
        Command::Submit(args) => submit::run(&cli.global, args).await,
        Command::Queue(args) => queue::run(&cli.global, args).await,
        Command::Cancel(args) => cancel::run(&cli.global, args).await,
        Command::Hold(args) => hold::run(&cli.global, args, hold::Action::Hold).await,
        Command::Release(args) => hold::run(&cli.global, args, hold::Action::Release).await,
        Command::Logs(args) => logs::run(&cli.global, args).await,
        Command::Show(args) => show::run(&cli.global, args).await,
        Command::Nodes(args) => nodes::run(&cli.global, args).await,
        Command::Node(args) => node_admin::run_node(&cli.global, args).await,
        Command::Gpu(args) => node_admin::run_gpu(&cli.global, args).await,
        Command::Admin(args) => admin::run(&cli.global, args).await,
    }
}

/// Writes text to stdout. Errors (a closed pipe) are returned rather than panicking as
/// `print!` would.
pub fn print(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// Writes one line to stdout.
pub fn println(text: &str) -> std::io::Result<()> {
    print(&format!("{text}\n"))
}

/// Writes a value as pretty JSON on stdout, for scripts.
pub fn print_json(value: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    println(&text)?;
    Ok(())
}
