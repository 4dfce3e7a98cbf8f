//! `mgpu wait ID…`: block until jobs end. (Being written.)

use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::Args;

use crate::session::ConnectionArgs;

#[derive(Debug, Args)]
pub struct WaitArgs {
    /// The jobs (id prefixes are enough).
    #[arg(required = true)]
    pub ids: Vec<String>,
}

pub async fn run(_connection: &ConnectionArgs, _args: &WaitArgs) -> Result<ExitCode> {
    bail!("mgpu wait is not written yet")
}
