//! `mgpu attach ID`: join a running job's terminal. (Being written.)

use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::Args;

use crate::session::ConnectionArgs;

#[derive(Debug, Args)]
pub struct AttachArgs {
    /// The job (an id prefix is enough).
    pub id: String,
}

pub async fn run(_connection: &ConnectionArgs, _args: &AttachArgs) -> Result<ExitCode> {
    bail!("mgpu attach is not written yet")
}
