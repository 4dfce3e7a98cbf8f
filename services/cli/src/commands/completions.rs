//! `mgpu completions SHELL` and `mgpu man`. (Being written.)

use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::Args;

use crate::session::ConnectionArgs;

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// bash, zsh or fish.
    pub shell: String,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// The directory to write the pages to.
    #[arg(long, default_value = ".")]
    pub out: std::path::PathBuf,
}

pub async fn run_completions(
    _connection: &ConnectionArgs,
    _args: &CompletionsArgs,
) -> Result<ExitCode> {
    bail!("mgpu completions is not written yet")
}

pub fn run_man(_args: &ManArgs) -> Result<ExitCode> {
    bail!("mgpu man is not written yet")
}
