//! `mgpu hold` and `mgpu release`: keep queued jobs from starting, and let them go again.
//!
//! The request goes through JetStream to the scheduler, which records `held_by` on the job;
//! the command then watches the record (up to [`WAIT`]) to report what actually happened.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use clap::Args;
use futures::future::join_all;
use mgpu_protocol::hold::HoldRequest;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState};
use mgpu_protocol::subjects;

use crate::client::answer::{Answer, Answers};
use crate::client::request::{self, Request};
use crate::client::session::{ConnectionArgs, Session};
use crate::console::{self, println};
use crate::human;
use crate::model::jobs;

/// How long to wait for the scheduler to record the change.
const WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, Args)]
pub struct HoldArgs {
    /// Job ids, or unique prefixes of them.
    #[arg(required = true, value_name = "ID")]
    pub ids: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Hold,
    Release,
}

impl Action {
    fn verb(self) -> &'static str {
        match self {
            Action::Hold => "hold",
            Action::Release => "release",
        }
    }

    fn participle(self) -> &'static str {
        match self {
            Action::Hold => "held",
            Action::Release => "released",
        }
    }

    fn subject(self, id: &JobId) -> String {
        match self {
            Action::Hold => subjects::hold(id),
            Action::Release => subjects::release(id),
        }
    }
}

/// What became of one request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Held(JobId),
    Released(JobId),
    AlreadyHeld(JobId, String),
    NotHeld(JobId),
}

impl Outcome {
    pub(crate) fn sentence(&self) -> String {
        match self {
            Outcome::Held(id) => format!(
                "Held job {short}; `mgpu release {short}` lets it run",
                short = id.short()
            ),
            Outcome::Released(id) => format!("Released job {}", id.short()),
            Outcome::AlreadyHeld(id, by) => {
                format!("Job {} is already held by {by}", id.short())
            }
            Outcome::NotHeld(id) => format!("Job {} is not held", id.short()),
        }
    }
}

pub async fn run(connection: &ConnectionArgs, args: &HoldArgs, action: Action) -> Result<ExitCode> {
    let session = Session::connect(connection).await?;
    // All at once, so ten jobs take one wait, not ten.
    let outcomes = join_all(args.ids.iter().map(|typed| one(&session, typed, action))).await;
    let mut failed = false;
    for outcome in outcomes {
        match outcome {
            Ok(outcome) => println(&outcome.sentence())?,
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

pub(crate) async fn one(session: &Session, typed: &str, action: Action) -> Result<Outcome> {
    let record = jobs::find(&session.js, typed).await?;
    let id = record.id.clone();
    if let Some(outcome) = settled_before(&record, action)? {
        return Ok(outcome);
    }

    // Listening from before the request, so a quick answer cannot be missed.
    let mut answers = Answers::listen(session, &id).await?;
    let body = HoldRequest {
        user: session.user.clone(),
    };
    request::publish(session, &Request::fresh(action.subject(&id), &body)?).await?;

    let wait = async {
        loop {
            match answers.next().await {
                Answer::Record(change) => {
                    let Some(record) = change? else {
                        bail!("job {} was removed", id.short());
                    };
                    if let Some(outcome) = settled_after(&record, action)? {
                        return Ok(outcome);
                    }
                }
                Answer::WatchEnded => bail!("lost the watch on job {}'s record", id.short()),
                Answer::Rejected(reason) => bail!(
                    "the scheduler refused to {} job {}: {reason}",
                    action.verb(),
                    id.short()
                ),
                Answer::Refused(reason) => bail!("{reason}"),
            }
        }
    };
    tokio::time::timeout(WAIT, wait).await.unwrap_or_else(|_| {
        Err(anyhow!(
            "the scheduler did not {} job {} within {} s: it may be down (the request waits \
             for it in JetStream), or you may not be allowed to",
            action.verb(),
            id.short(),
            WAIT.as_secs()
        ))
    })
}

/// Before asking: an error when the job is not queued, an outcome when nothing is to be done.
fn settled_before(record: &JobRecord, action: Action) -> Result<Option<Outcome>> {
    let id = record.id.clone();
    match (&record.state, action) {
        (JobState::Queued(waiting), Action::Hold) => Ok(waiting
            .held_by
            .clone()
            .map(|by| Outcome::AlreadyHeld(id, by))),
        (JobState::Queued(waiting), Action::Release) => {
            Ok(waiting.held_by.is_none().then_some(Outcome::NotHeld(id)))
        }
        (JobState::Running(_), _) => bail!(
            "job {} is running: only queued jobs can be {} (`mgpu cancel` stops it)",
            id.short(),
            action.participle()
        ),
        (state, _) => bail!(
            "job {} already finished ({}): only queued jobs can be {}",
            id.short(),
            human::state_words(state),
            action.participle()
        ),
    }
}

/// After asking: the outcome once the record shows it, an error when the job moved on first.
fn settled_after(record: &JobRecord, action: Action) -> Result<Option<Outcome>> {
    let id = record.id.clone();
    match (&record.state, action) {
        (JobState::Queued(waiting), Action::Hold) => {
            Ok(waiting.held_by.is_some().then_some(Outcome::Held(id)))
        }
        (JobState::Queued(waiting), Action::Release) => {
            Ok(waiting.held_by.is_none().then_some(Outcome::Released(id)))
        }
        // Released and started at once: that is what releasing is for.
        (JobState::Running(_), Action::Release) => Ok(Some(Outcome::Released(id))),
        (JobState::Running(_), Action::Hold) => bail!(
            "job {} started before the hold took effect (`mgpu cancel` stops it)",
            id.short()
        ),
        (state, _) => bail!(
            "job {} finished ({}) before the {} took effect",
            id.short(),
            human::state_words(state),
            action.verb()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgpu_protocol::job::{Ending, JobSpec, WaitReason, Waiting};

    fn record(state: JobState) -> JobRecord {
        JobRecord {
            id: JobId::random(),
            user: "alice".into(),
            user_key: None,
            spec: JobSpec::new(vec!["true".into()], "/"),
            submitted_at: mgpu_protocol::now(),
            attempt: 1,
            state,
            last_request: None,
            preemptions: Vec::new(),
        }
    }

    fn queued(held_by: Option<&str>) -> JobState {
        let mut waiting = Waiting::new(WaitReason::Held);
        waiting.held_by = held_by.map(str::to_owned);
        JobState::Queued(waiting)
    }

    #[test]
    fn only_queued_jobs_can_be_held() {
        let free = record(queued(None));
        assert_eq!(settled_before(&free, Action::Hold).ok(), Some(None));
        assert_eq!(
            settled_before(&free, Action::Release).ok(),
            Some(Some(Outcome::NotHeld(free.id.clone())))
        );
        let held = record(queued(Some("bob")));
        assert_eq!(
            settled_before(&held, Action::Hold).ok(),
            Some(Some(Outcome::AlreadyHeld(held.id.clone(), "bob".into())))
        );
        let done = record(JobState::TimedOut(Ending {
            placement: None,
            started_at: None,
            ended_at: mgpu_protocol::now(),
            exit_code: None,
            signal: None,
            reason: Some("time limit".into()),
            usage: None,
        }));
        let err = settled_before(&done, Action::Hold)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("already finished (timed out)"), "{err}");
    }

    #[test]
    fn the_record_tells_when_the_request_took_effect() {
        let held = record(queued(Some("alice")));
        assert_eq!(
            settled_after(&held, Action::Hold).ok(),
            Some(Some(Outcome::Held(held.id.clone())))
        );
        assert_eq!(settled_after(&held, Action::Release).ok(), Some(None));
        let free = record(queued(None));
        assert_eq!(settled_after(&free, Action::Hold).ok(), Some(None));
    }
}
