//! The one path every submission takes, whatever form it came in (see [`super::plan`]): each
//! prepared job is checked, skipped when it duplicates a queued or running job (or an earlier
//! job of this run), and the rest are stored in JetStream, signed and pipelined
//! ([`crate::client::submit`]). What became of each job comes back in plan order, for the form's
//! printer to print.
//!
//! The checks come first: nothing is sent for a job that fails them, and the job list is read
//! for dedup only after them. The dedup keys sent are remembered for the life of the pipeline, so a watched job file's later passes do not
//! submit again what an earlier pass did.

use std::collections::HashMap;

use anyhow::Result;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::submit::SubmitRequest;

use super::dedup::{Existing, Match};
use super::plan::{Label, Prepared};
use crate::client::session::Session;
use crate::client::submit;
use crate::client::verdict::{Verdict, Verdicts};

/// What became of one job.
#[derive(Debug)]
pub enum Outcome {
    /// No spec could be made, or it fails the checks: the message says why.
    Bad(String),
    /// Not submitted: the same job is queued or running, or came earlier in this run.
    Duplicate(Duplicate),
    /// Stored under this id (and queued, or not checked yet: see [`Settled::unchecked`]).
    Submitted(JobId),
    /// Stored under this id, and refused by the scheduler: it will never run, and why.
    Refused(JobId, String),
    /// Sent, but JetStream did not store it.
    NotStored(anyhow::Error),
}

/// What a skipped job duplicates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Duplicate {
    /// A queued or running job of the user.
    Existing(Match),
    /// A job submitted earlier in this run.
    Earlier(Label),
}

impl Duplicate {
    /// `identical to job 1a2b3c4d5e (queued)`, or `identical to line 3`.
    pub fn reason(&self) -> String {
        match self {
            Duplicate::Existing(found) => {
                format!("identical to job {} ({})", found.id.short(), found.state)
            }
            Duplicate::Earlier(label) => format!("identical to {label}"),
        }
    }

    /// The queued or running job it duplicates, if that is what it duplicates.
    pub fn existing_id(&self) -> Option<&JobId> {
        match self {
            Duplicate::Existing(found) => Some(&found.id),
            Duplicate::Earlier(_) => None,
        }
    }
}

/// One job's label and what became of it.
#[derive(Debug)]
pub struct Settled {
    pub label: Label,
    pub outcome: Outcome,
    /// Stored, but no scheduler checked it yet (none runs): it may still be refused.
    pub unchecked: bool,
}

pub struct Pipeline<'s> {
    session: &'s Session,
    triage: Triage,
}

impl<'s> Pipeline<'s> {
    pub fn new(session: &'s Session) -> Pipeline<'s> {
        Pipeline {
            session,
            triage: Triage::default(),
        }
    }

    /// Checks, skips duplicates, stores the rest and waits for JetStream's acknowledgements.
    /// Fails only when the jobs to compare with cannot be read; each job's own failure is its
    /// outcome.
    pub async fn run(&mut self, plan: Vec<Prepared>) -> Result<Vec<Settled>> {
        let checked = check(plan);
        // The job list is read only when a job that passed the checks asks for dedup: it is
        // the slow part of a small submission.
        let wants_dedup = checked
            .iter()
            .any(|(_, request)| request.as_ref().is_ok_and(|r| r.spec.dedup));
        let existing = if wants_dedup {
            Existing::load(self.session).await?
        } else {
            Existing::default()
        };
        let (steps, requests) = self.triage.sort(checked, &existing);
        // Listening before sending, so no verdict is missed; a failure to listen only
        // leaves the jobs unchecked.
        let listening = match requests.is_empty() {
            true => None,
            false => Verdicts::listen(self.session).await.ok(),
        };
        let to = listening.as_ref().map(Verdicts::subject);
        let results = submit::submit_all(self.session, &requests, to).await;
        let mut settled = settle(steps, &requests, results);
        let stored: Vec<JobId> = settled
            .iter()
            .filter_map(|s| match &s.outcome {
                Outcome::Submitted(id) => Some(id.clone()),
                _ => None,
            })
            .collect();
        let verdicts = match listening {
            Some(listening) if !stored.is_empty() => listening.collect(self.session, &stored).await,
            _ => stored
                .into_iter()
                .map(|id| (id, Verdict::Unchecked))
                .collect(),
        };
        for job in &mut settled {
            job.take_verdict(&verdicts);
        }
        Ok(settled)
    }
}

impl Settled {
    /// A stored job as the scheduler judged it.
    fn take_verdict(&mut self, verdicts: &HashMap<JobId, Verdict>) {
        let Outcome::Submitted(id) = &self.outcome else {
            return;
        };
        match verdicts.get(id) {
            Some(Verdict::Refused(why)) => self.outcome = Outcome::Refused(id.clone(), why.clone()),
            Some(Verdict::Unchecked) | None => self.unchecked = true,
            Some(Verdict::Queued) => {}
        }
    }
}

/// Each job's request when its spec passes the checks, else why not, in plan order.
fn check(plan: Vec<Prepared>) -> Vec<(Label, Result<SubmitRequest, String>)> {
    plan.into_iter()
        .map(|Prepared { label, request }| {
            let checked = request.and_then(|request| {
                // The spec's own message says what is wrong and which option to change.
                request.spec.validate().map_err(|e| e.to_string())?;
                Ok(request)
            });
            (label, checked)
        })
        .collect()
}

/// What is decided about a job before anything is sent.
#[derive(Debug)]
enum Step {
    Done(Outcome),
    /// Sent as this request of the batch.
    Send(usize),
}

/// The decisions made before sending, with the dedup keys of the jobs sent so far in this
/// run and the label of the job that sent each.
#[derive(Debug, Default)]
struct Triage {
    sent: HashMap<String, Label>,
}

impl Triage {
    /// Each checked job's step, in plan order, and the requests to send.
    fn sort(
        &mut self,
        checked: Vec<(Label, Result<SubmitRequest, String>)>,
        existing: &Existing,
    ) -> (Vec<(Label, Step)>, Vec<SubmitRequest>) {
        let mut steps = Vec::with_capacity(checked.len());
        let mut requests = Vec::with_capacity(checked.len());
        for (label, checked) in checked {
            let step = match checked {
                Err(message) => Step::Done(Outcome::Bad(message)),
                Ok(request) => match self.duplicate(label, &request, existing) {
                    Some(duplicate) => Step::Done(Outcome::Duplicate(duplicate)),
                    None => {
                        requests.push(request);
                        Step::Send(requests.len() - 1)
                    }
                },
            };
            steps.push((label, step));
        }
        (steps, requests)
    }

    /// What the job duplicates, when it asks for dedup: first a job of this run, then a
    /// queued or running one. A job that is none is remembered as sent.
    fn duplicate(
        &mut self,
        label: Label,
        request: &SubmitRequest,
        existing: &Existing,
    ) -> Option<Duplicate> {
        if !request.spec.dedup {
            return None;
        }
        let key = request.spec.dedup_key();
        if let Some(earlier) = self.sent.get(&key) {
            return Some(Duplicate::Earlier(*earlier));
        }
        if let Some(found) = existing.find(&request.spec) {
            return Some(Duplicate::Existing(found.clone()));
        }
        self.sent.insert(key, label);
        None
    }
}

/// Each job's outcome, in plan order, from the steps and the storing's results (one per
/// request, in order).
fn settle(
    steps: Vec<(Label, Step)>,
    requests: &[SubmitRequest],
    results: Vec<Result<()>>,
) -> Vec<Settled> {
    let mut results: Vec<Option<Result<()>>> = results.into_iter().map(Some).collect();
    steps
        .into_iter()
        .map(|(label, step)| {
            let outcome = match step {
                Step::Done(outcome) => outcome,
                Step::Send(index) => {
                    let result = results.get_mut(index).and_then(Option::take);
                    match (result, requests.get(index)) {
                        (Some(Ok(())), Some(request)) => Outcome::Submitted(request.id.clone()),
                        (Some(Err(err)), _) => Outcome::NotStored(err),
                        // One result per request, so this cannot happen; were it to, the job
                        // must not be reported as stored.
                        _ => Outcome::NotStored(anyhow::anyhow!("no result for this job")),
                    }
                }
            };
            Settled {
                label,
                outcome,
                unchecked: false,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgpu_protocol::job::{JobRecord, JobSpec, JobState, WaitReason, Waiting};

    fn prepared(label: Label, command: &str, dedup: bool) -> Prepared {
        let mut spec = JobSpec::new(vec![command.into()], "/w");
        spec.dedup = dedup;
        Prepared {
            label,
            request: Ok(SubmitRequest {
                id: JobId::random(),
                user: "alice".into(),
                spec,
            }),
        }
    }

    fn queued_job(command: &str) -> JobRecord {
        JobRecord {
            id: JobId::random(),
            user: "alice".into(),
            user_key: None,
            spec: JobSpec::new(vec![command.into()], "/w"),
            submitted_at: mgpu_protocol::now(),
            attempt: 1,
            state: JobState::Queued(Waiting::new(WaitReason::Resources)),
            last_request: None,
            preemptions: Vec::new(),
        }
    }

    /// A step as text, so tests can compare it: `bad: …`, `existing …`, `earlier …`, `send N`.
    fn describe(step: &Step) -> String {
        match step {
            Step::Done(Outcome::Bad(message)) => format!("bad: {message}"),
            Step::Done(Outcome::Duplicate(Duplicate::Existing(found))) => {
                format!("existing {}", found.id)
            }
            Step::Done(Outcome::Duplicate(Duplicate::Earlier(label))) => format!("earlier {label}"),
            Step::Done(other) => format!("{other:?}"),
            Step::Send(index) => format!("send {index}"),
        }
    }

    #[test]
    fn bad_and_duplicate_jobs_are_not_sent() {
        let queued = queued_job("python a.py");
        let existing = Existing::from_jobs(std::slice::from_ref(&queued), "alice", "UALICE");
        let mut bad_spec = prepared(Label::Line(4), "python d.py", true);
        if let Ok(request) = &mut bad_spec.request {
            request.spec.conda_env = Some("bad env!".into());
        }
        let plan = vec![
            prepared(Label::Line(1), "python a.py", true),
            prepared(Label::Line(2), "python b.py", true),
            prepared(Label::Line(3), "python b.py", true),
            bad_spec,
            Prepared {
                label: Label::Line(5),
                request: Err("priority `x` is not a whole number".into()),
            },
            // Without dedup, identical jobs are all sent.
            prepared(Label::Line(6), "python a.py", false),
            prepared(Label::Line(7), "python a.py", false),
        ];
        let mut triage = Triage::default();
        let (steps, requests) = triage.sort(check(plan), &existing);
        let described: Vec<String> = steps.iter().map(|(_, step)| describe(step)).collect();
        assert_eq!(described[0], format!("existing {}", queued.id));
        assert_eq!(described[1], "send 0");
        assert_eq!(described[2], "earlier line 2");
        assert!(
            described[3].starts_with("bad: `bad env!` is not a conda environment name"),
            "{}",
            described[3]
        );
        assert_eq!(described[4], "bad: priority `x` is not a whole number");
        assert_eq!(described[5..], ["send 1", "send 2"]);
        assert_eq!(requests.len(), 3);
        let labels: Vec<Label> = steps.iter().map(|(label, _)| *label).collect();
        assert_eq!(labels, (1..=7).map(Label::Line).collect::<Vec<_>>());

        // A later pass of the same run remembers what was sent.
        let later = vec![prepared(Label::Line(9), "python b.py", true)];
        let (again, requests) = triage.sort(check(later), &existing);
        assert_eq!(describe(&again[0].1), "earlier line 2");
        assert!(requests.is_empty());
    }

    #[test]
    fn outcomes_follow_the_plan_and_the_stores_results() {
        let plan = vec![
            Prepared {
                label: Label::Task(0),
                request: Err("no".into()),
            },
            prepared(Label::Task(1), "x 1", false),
            prepared(Label::Task(2), "x 2", false),
        ];
        let (steps, requests) = Triage::default().sort(check(plan), &Existing::default());
        let stored_id = requests[0].id.clone();
        let settled = settle(
            steps,
            &requests,
            vec![
                Ok(()),
                Err(anyhow::anyhow!("JetStream refused the request")),
            ],
        );
        assert_eq!(settled.len(), 3);
        assert!(matches!(&settled[0].outcome, Outcome::Bad(m) if m == "no"));
        assert!(matches!(&settled[1].outcome, Outcome::Submitted(id) if *id == stored_id));
        assert!(
            matches!(&settled[2].outcome, Outcome::NotStored(e) if e.to_string().contains("refused"))
        );
        assert_eq!(settled[2].label, Label::Task(2));
    }

    #[test]
    fn duplicates_say_what_they_duplicate() {
        let id = JobId::random();
        let existing = Duplicate::Existing(Match {
            id: id.clone(),
            state: "running",
        });
        assert_eq!(
            existing.reason(),
            format!("identical to job {} (running)", id.short())
        );
        assert_eq!(existing.existing_id(), Some(&id));
        let earlier = Duplicate::Earlier(Label::Line(3));
        assert_eq!(earlier.reason(), "identical to line 3");
        assert_eq!(earlier.existing_id(), None);
    }
}
