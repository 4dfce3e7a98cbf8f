//! `mgpu attach ID`: join a job from any machine, as `screen -r` joins a session. For a job on
//! a terminal (`--pty`) this terminal becomes a window on the job's: the screen so far (its
//! output replayed), then live, keys passed on, the window's size followed, and `Ctrl+]`
//! detaches. Any other job is followed as `mgpu submit -i` follows it (output, and this
//! terminal's input when it was submitted interactive). Either way the exit status is the
//! job's once it ends.
//!
//! Several viewers may attach at once; the last one to attach types (see
//! `mgpu_protocol::terminal`), and `--read-only` watches without taking the keyboard. Only the
//! owner's (or an admin's) keys reach a job: the node drops anyone else's.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use mgpu_protocol::job::JobRecord;

use crate::client::follow::follower::{FollowOptions, follow};
use crate::client::follow::input::InputMode;
use crate::client::follow::{output, record};
use crate::client::session::{ConnectionArgs, Session};
use crate::console;
use crate::human;
use crate::model::jobs;

#[derive(Debug, Args)]
pub struct AttachArgs {
    /// The job (an id prefix is enough).
    pub id: String,

    /// Watch only: send no keys, and leave the keyboard and the window size to the others.
    #[arg(short, long)]
    pub read_only: bool,

    /// Print nothing but the job's own output (no status lines).
    #[arg(short, long)]
    pub quiet: bool,
}

pub async fn run(connection: &ConnectionArgs, args: &AttachArgs) -> Result<ExitCode> {
    let session = Session::connect(connection).await?;
    let record = jobs::find_anywhere(&session, &args.id).await?;
    output::check_output_readable(&session, &record).await?;
    if record.state.is_finished() {
        return Ok(ended(&record));
    }
    let mine = record
        .user_key
        .as_deref()
        .is_some_and(|key| key == session.key.public_key());
    let input = input_mode(&record, args.read_only);
    if !mine && input != InputMode::None && !args.quiet {
        console::stderr_line(&format!(
            "mgpu: job {} is {}'s: what you type reaches it only if you are an admin",
            record.id.short(),
            record.user
        ));
    }
    let options = FollowOptions {
        quiet: args.quiet,
        input,
        attaching: true,
        output: output::output_subjects_of(&record),
    };
    follow(&session, &record.id, options).await
}

/// A terminal job is always a viewer's (typing or watching); another job takes this
/// terminal's input only when it was submitted interactive.
fn input_mode(record: &JobRecord, read_only: bool) -> InputMode {
    match (
        record.spec.pty.is_some(),
        record.spec.interactive && !read_only,
    ) {
        (true, _) => InputMode::keys(read_only),
        (false, true) => InputMode::Lines,
        (false, false) => InputMode::None,
    }
}

/// A job that has ended has nothing to join: say how it ended, where its output is, and end
/// the way it did.
fn ended(record: &JobRecord) -> ExitCode {
    let code = record::exit_status(record);
    console::stderr_line(&format!(
        "mgpu: job {short} has ended ({state}, exit status {code}); its output: mgpu logs {short}",
        short = record.id.short(),
        state = human::state_words(&record.state),
    ));
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgpu_protocol::terminal::TermSize;

    fn record(pty: bool, interactive: bool) -> JobRecord {
        let mut job = crate::fixtures::job("bash", crate::fixtures::queued(), 0, 1);
        job.spec.pty = pty.then(TermSize::default);
        job.spec.interactive = interactive;
        job
    }

    #[test]
    fn terminal_jobs_get_keys_and_others_lines_only_when_interactive() {
        assert!(matches!(
            input_mode(&record(true, false), false),
            InputMode::Keys {
                read_only: false,
                ..
            }
        ));
        assert!(matches!(
            input_mode(&record(true, false), true),
            InputMode::Keys {
                read_only: true,
                ..
            }
        ));
        assert_eq!(input_mode(&record(false, true), false), InputMode::Lines);
        assert_eq!(input_mode(&record(false, true), true), InputMode::None);
        assert_eq!(input_mode(&record(false, false), false), InputMode::None);
    }
}
