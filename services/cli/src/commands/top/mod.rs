//! `mgpu top`: the whole cluster live, full screen. (Being written.)

use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::Args;

use crate::session::ConnectionArgs;

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Print one frame and exit (for scripts and tests).
    #[arg(long)]
    pub once: bool,
}

pub async fn run(_connection: &ConnectionArgs, _args: &TopArgs) -> Result<ExitCode> {
    bail!("mgpu top is not written yet")
}
