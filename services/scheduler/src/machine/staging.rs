//! New jobs wait in the table, unwritten, for the pass that follows their submission; the
//! pass's decision (a wait reason, or running on a placement) is applied to the waiting
//! record and the record is then created once, where it used to be created queued and
//! written again by the pass. With every stored message flushed to disk on its own
//! (`sync_interval: always`), that is one flush fewer per job on the jobs bucket, the stream
//! a burst of submissions waits on most, and one fewer on a lone job's way to its start.
//!
//! Nothing about a staged job leaves the scheduler before its record is stored: what is
//! applied to it meanwhile (the pass's decision; a cancel, hold or release that came in the
//! same burst) changes the staged record, and its effects and acknowledgements wait with the
//! submission's for the write. A scheduler that stops meanwhile acknowledged nothing, so
//! JetStream delivers the submission again; a write that fails drops the job from the table,
//! unacknowledged, for the same reason.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState};

use super::SchedulerState;
use super::jobs::{JobTable, Tracked};
use super::messages::{Command, Count, LogLevel, Token, WriteOutcome};
use super::pending::{Applied, NewJob, Origin, Pending};
use crate::lifecycle::{self, Input, Transition};

/// The staged jobs, in the order they were submitted.
#[derive(Default)]
pub(crate) struct Staged {
    jobs: HashMap<JobId, NewJob>,
    order: Vec<JobId>,
    /// Every token a staged job will acknowledge: the driver keeps those messages.
    tokens: HashSet<Token>,
}

impl Staged {
    pub(crate) fn contains(&self, id: &JobId) -> bool {
        self.jobs.contains_key(id)
    }

    /// Whether a staged job will acknowledge `token` once its record is stored.
    pub(crate) fn holds(&self, token: Token) -> bool {
        self.tokens.contains(&token)
    }

    /// How many jobs are staged, and how many of them are queued (the others were
    /// cancelled meanwhile).
    pub(crate) fn count(&self, table: &JobTable) -> (usize, usize) {
        let queued = (self.order.iter())
            .filter(|id| matches!(table.get(id).map(|r| &r.state), Some(JobState::Queued(_))))
            .count();
        (self.jobs.len(), queued)
    }

    fn keep(&mut self, token: Option<Token>) {
        self.tokens.extend(token);
    }
}

impl SchedulerState {
    /// Puts a new queued job's `record` in the table, unwritten until the next pass.
    pub(crate) fn stage(&mut self, record: JobRecord, job: NewJob) {
        let id = record.id.clone();
        self.staged.keep(job.token);
        self.jobs.put(Tracked {
            record,
            revision: 0,
        });
        self.staged.order.push(id.clone());
        self.staged.jobs.insert(id, job);
        self.pass_due = true;
    }

    /// The same submission, delivered again while its job is staged.
    pub(crate) fn staged_again(&mut self, id: &JobId, token: Token) -> bool {
        let Some(job) = self.staged.jobs.get_mut(id) else {
            return false;
        };
        job.redelivered.push(token);
        self.staged.tokens.insert(token);
        true
    }

    /// Applies `input` to a staged job's record; its effects and `token` wait for the write.
    pub(crate) fn apply_staged(
        &mut self,
        now: Timestamp,
        job: &JobId,
        (input, origin, token): (Input, Origin, Option<Token>),
    ) {
        let Some(record) = self.jobs.get(job) else {
            return;
        };
        let limits = self.lifecycle_limits();
        let Transition { record, effects } = lifecycle::apply(record, input.clone(), now, &limits);
        if let Some(record) = record {
            self.jobs.put(Tracked {
                record,
                revision: 0,
            });
        }
        self.staged.keep(token);
        let applied = Applied {
            input,
            effects,
            origin,
            token,
            now,
        };
        if let Some(staged) = self.staged.jobs.get_mut(job) {
            staged.later.push(applied);
        }
    }

    /// Creates the record of every staged job, as the pass left it.
    pub(crate) fn write_staged(&mut self) {
        let order = std::mem::take(&mut self.staged.order);
        self.staged.tokens.clear();
        for id in order {
            let Some(job) = self.staged.jobs.remove(&id) else {
                continue;
            };
            let Some(record) = self.jobs.get(&id) else {
                continue;
            };
            let record = Arc::new(record.clone());
            let op = self.op();
            self.out.push(Command::Write {
                op,
                record: Arc::clone(&record),
                expected: None,
            });
            self.pending.insert(op, Pending::Create { record, job });
        }
    }

    /// A new record's write came out.
    pub(crate) fn created(&mut self, record: Arc<JobRecord>, outcome: WriteOutcome, job: NewJob) {
        let id = record.id.clone();
        match outcome {
            WriteOutcome::Stored { revision } => {
                let record = Arc::unwrap_or_clone(record);
                self.jobs.put(Tracked { record, revision });
                self.pass_due = true;
                self.after_created(&id, job);
            }
            WriteOutcome::Changed { stored: None } | WriteOutcome::Failed { .. } => {
                // Not recorded, so not acknowledged either: JetStream delivers it again.
                let said = match outcome {
                    WriteOutcome::Failed { error } => format!("handling a submission: {error}"),
                    _ => "submission not stored; handled again when delivered again".to_owned(),
                };
                self.out.push(Command::log(LogLevel::Warn, Some(&id), said));
                self.jobs.forget(&id);
                self.drop_decisions_left();
            }
            WriteOutcome::Changed { stored } => {
                // A redelivered submission: recorded before, its effects went out then.
                self.take_stored(&id, stored);
                self.drop_decisions_left();
                let said = "submission already recorded";
                self.out
                    .push(Command::log(LogLevel::Debug, Some(&id), said));
                self.ack(job.token, Some(&id));
                for token in job.redelivered {
                    self.ack(Some(token), Some(&id));
                }
                // What a request asked meanwhile is applied to what is stored; a pass's
                // decision is made again by the next pass.
                for applied in job.later {
                    if !matches!(applied.origin, Origin::Pass { .. }) {
                        let Applied {
                            input,
                            origin,
                            token,
                            now,
                            ..
                        } = applied;
                        self.apply(now, &id, input, origin, token);
                    }
                }
            }
        }
    }

    /// The rest of the last pass's decisions, made with a new job in mind whose record did
    /// not turn out as the pass saw it: the next pass decides again.
    fn drop_decisions_left(&mut self) {
        self.decisions_left.clear();
        self.pass_due = true;
    }

    /// A new job's record is stored: the submission's effects, its verdict and
    /// acknowledgement, then what was applied to it meanwhile, in order.
    fn after_created(&mut self, id: &JobId, job: NewJob) {
        let NewJob {
            effects,
            identity,
            outcome,
            token,
            verdict,
            later,
            redelivered,
        } = job;
        let at = self
            .jobs
            .get(id)
            .map_or(self.decided_at, |r| r.submitted_at);
        self.after_submit(at, id, effects, &identity, outcome);
        if let Some((to, verdict)) = verdict {
            self.out.push(Command::Verdict { to, verdict });
        }
        self.ack(token, Some(id));
        for token in redelivered {
            self.ack(Some(token), Some(id));
        }
        for applied in later {
            let Applied {
                effects,
                origin,
                token,
                now,
                ..
            } = applied;
            if let Origin::Pass { waited } = &origin {
                self.pass_changes += 1;
                if let Some(waited) = waited {
                    self.out.push(Command::Count(Count::StartedAfter(*waited)));
                }
                self.arm_slice_timer(id);
            }
            self.carry_out(now, id, effects, origin.identity());
            self.ack(token, Some(id));
        }
    }
}
