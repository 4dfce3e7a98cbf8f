//! `mgpu cancel`: ask the scheduler to stop jobs, then wait (briefly) to see them stop.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::Args;
use futures::future::join_all;
use mgpu_nats::records;
use mgpu_protocol::cancel::CancelRequest;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::subjects;

use crate::client::answer::{Answer, Answers};
use crate::client::request::{self, Request};
use crate::client::session::{ConnectionArgs, Session};
use crate::console::{self, println};
use crate::errors::plain;
use crate::human;
use crate::model::jobs;

/// How long to watch a cancelled job stop before leaving it to finish on its own.
const WAIT_FOR_STOP: Duration = Duration::from_secs(15);

#[derive(Debug, Args)]
pub struct CancelArgs {
    /// Job ids, or unique prefixes of them.
    #[arg(required = true, value_name = "ID")]
    pub ids: Vec<String>,
}

/// What became of one cancel request.
pub(crate) enum Outcome {
    Stopped(JobId),
    StillStopping(JobId),
}

pub async fn run(connection: &ConnectionArgs, args: &CancelArgs) -> Result<ExitCode> {
    let session = Session::connect(connection).await?;
    // All jobs are cancelled at once, so ten jobs take one wait, not ten.
    let outcomes = join_all(args.ids.iter().map(|typed| cancel_one(&session, typed))).await;
    let mut failed = false;
    for outcome in outcomes {
        match outcome {
            Ok(Outcome::Stopped(id)) => println(&format!("Cancelled job {}", id.short()))?,
            Ok(Outcome::StillStopping(id)) => println(&format!(
                "Cancel requested for job {}; it is still stopping",
                id.short()
            ))?,
            Err(err) => {
                failed = true;
                console::stderr_line(&format!("error: {err:#}"));
            }
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

pub(crate) async fn cancel_one(session: &Session, typed: &str) -> Result<Outcome> {
    let id = jobs::resolve(&session.js, typed).await?;
    // Listening from before the request, so a quick stop (or the scheduler's refusal: not the
    // owner, not an admin) cannot be missed.
    let mut answers = Answers::listen(session, &id).await?;
    if let Some(record) = records::get_job(&session.js, &id).await.map_err(plain)?
        && record.state.is_finished()
    {
        bail!(
            "job {} already finished ({})",
            id.short(),
            human::state_words(&record.state)
        );
    }

    let body = CancelRequest {
        user: session.user.clone(),
        reason: None,
    };
    request::publish(session, &Request::fresh(subjects::cancel(&id), &body)?).await?;

    let stopped = tokio::time::timeout(WAIT_FOR_STOP, async {
        loop {
            match answers.next().await {
                Answer::Record(Ok(Some(record))) if record.state.is_finished() => return Ok(true),
                Answer::Record(_) | Answer::Rejected(_) => {}
                Answer::WatchEnded => return Ok(false),
                Answer::Refused(reason) => bail!("{reason}"),
            }
        }
    })
    .await
    .unwrap_or(Ok(false))?;
    Ok(if stopped {
        Outcome::Stopped(id)
    } else {
        Outcome::StillStopping(id)
    })
}
