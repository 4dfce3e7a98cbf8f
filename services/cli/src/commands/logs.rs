//! `mgpu logs`: a job's output as it wrote it, stdout to stdout and stderr to stderr.
//!
//! Output is read from JetStream (see [`crate::client::follow::tail`]), so it is there after
//! the job ended, and `-f` also shows what was written before it started following.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

use crate::client::follow::{output, tail};
use crate::client::session::{ConnectionArgs, Session};
use crate::model::jobs;

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// Job id, or a unique prefix of it.
    #[arg(value_name = "ID")]
    pub id: String,

    /// Keep printing new output until the job ends.
    #[arg(short, long)]
    pub follow: bool,
}

pub async fn run(connection: &ConnectionArgs, args: &LogsArgs) -> Result<ExitCode> {
    let session = Session::connect(connection).await?;
    let record = jobs::find_anywhere(&session, &args.id).await?;
    output::check_output_readable(&session, &record).await?;
    // Public output, or its owner's private subject (which the server lets only them and
    // admins read).
    let subjects = output::output_subjects_of(&record);
    if args.follow {
        tail::print_following(&session, &record.id, &subjects).await?;
    } else {
        tail::print_stored(&session, &subjects).await?;
    }
    Ok(ExitCode::SUCCESS)
}
