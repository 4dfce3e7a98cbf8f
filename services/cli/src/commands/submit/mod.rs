//! `mgpu submit`: send a job, a job array, or a job file's jobs to the scheduler through
//! JetStream, then (with `-i`) follow the job.
//!
//! Every form goes the same way: its jobs are prepared as a list of submissions
//! ([`plan`]: the spec from [`spec`], an id, a label), the [`pipeline`] checks them, skips
//! duplicates ([`dedup`]) and stores the rest, and the form's printer ([`printer`]) prints what
//! became of each. The forms differ only in how they prepare and what they print; a job file
//! is read in passes, and watched with `--watch` ([`file`]). A command whose first word is a
//! script is a batch script ([`batch_script`]): its content is captured and its `#MGPU`
//! lines are options ([`directives`], split by [`shell_words`]).

mod args;
mod batch_script;
mod dedup;
mod directives;
mod file;
mod pipeline;
mod plan;
mod printer;
mod shell_words;
mod spec;

use std::process::ExitCode;

use anyhow::{Context as _, Result};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::JobSpec;

pub use args::SubmitArgs;
use pipeline::Pipeline;

use crate::client::follow::follower::{self, FollowOptions};
use crate::client::follow::input::InputMode;
use crate::client::follow::output;
use crate::client::session::{ConnectionArgs, Session};
use crate::gpu_profiles::LazyProfiles;
use crate::parse::ArraySpec;

pub async fn run(connection: &ConnectionArgs, args: &SubmitArgs) -> Result<ExitCode> {
    args.check()?;
    if let Some(path) = &args.file {
        // A mistyped path fails before connecting.
        let text = file::read(path)?;
        let session = Session::connect(connection).await?;
        return file::submit(&session, args, path, text).await;
    }
    // A batch script is captured now; its #MGPU lines are options, the command line's win.
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let batch = batch_script::detect(&args.command, &cwd)?;
    let merged = match &batch {
        Some(batch) if !batch.directives.is_empty() => Some(directives::apply(batch, args)?),
        _ => None,
    };
    let args = merged.as_ref().unwrap_or(args);
    // Mistakes in the request are reported before (and without) reaching the server.
    let mut profiles = LazyProfiles::new(args.profiles.clone());
    let mut spec = spec::from_args(args, &mut profiles)?;
    if let Some(batch) = batch {
        batch.attach_to(&mut spec);
    }
    let session = Session::connect(connection).await?;
    spec.after = spec::resolve_ids(&session, &args.after).await?;
    spec.after_any = spec::resolve_ids(&session, &args.after_any).await?;
    match &args.array {
        Some(array) => submit_array(&session, args, &spec, array).await,
        None => submit_one(&session, args, spec).await,
    }
}

/// The command line's job; with `-i`, followed until it ends, its exit status ours.
async fn submit_one(session: &Session, args: &SubmitArgs, spec: JobSpec) -> Result<ExitCode> {
    let prepared = plan::single(spec, &session.user);
    let settled = Pipeline::new(session).run(prepared).await?;
    match printer::single(args, settled)? {
        Some(id) if args.interactive => {
            let input = if args.pty {
                InputMode::keys(false)
            } else {
                InputMode::Lines
            };
            let options = FollowOptions {
                quiet: args.quiet,
                input,
                attaching: false,
                output: output::own_output_subjects(&session.key.public_key(), &id),
            };
            follower::follow(session, &id, options).await
        }
        _ => Ok(ExitCode::SUCCESS),
    }
}

/// One task per index, sharing a fresh array id, stored pipelined so a thousand tasks take
/// about as long as a few. With `--dedup`, a task identical to a waiting or running one (the
/// same index of the same command) is left out, so resubmitting an array queues only the
/// missing tasks.
async fn submit_array(
    session: &Session,
    args: &SubmitArgs,
    spec: &JobSpec,
    array: &ArraySpec,
) -> Result<ExitCode> {
    let array_id = JobId::random();
    let prepared = plan::array(spec, array, &array_id, &session.user);
    let settled = Pipeline::new(session).run(prepared).await?;
    printer::array(args, &array_id, array.max_running, settled)?;
    Ok(ExitCode::SUCCESS)
}
