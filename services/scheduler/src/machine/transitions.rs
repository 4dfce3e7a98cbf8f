//! A job's lifecycle input applied: the lifecycle decides the new record and its effects,
//! the record is written with compare-and-set on the revision the table holds, and only once
//! the write is known to have landed do the effects go out, in order. Where the stored
//! record changed under the scheduler (another writer), the input is applied again to what
//! is stored, a few times at most. Where the store cannot be reached, only the best-effort
//! kills go out (the job's other processes must stop either way) and the request is not
//! acknowledged, so JetStream delivers it again.

use std::sync::Arc;

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState};
use mgpu_protocol::report::ReportKind;

use super::jobs::Tracked;
use super::messages::{Command, Count, Identity, LogLevel, Token, WriteOutcome};
use super::pending::{Origin, Pending, PendingTransition};
use super::{OpId, SchedulerState};
use crate::lifecycle::{self, Effect, Input, Limits, Transition};

/// Times an input is applied when the stored record keeps changing under the scheduler.
const WRITE_TRIES: usize = 3;

impl SchedulerState {
    /// What the lifecycle needs of the policy.
    pub(crate) fn lifecycle_limits(&self) -> Limits {
        Limits {
            max_attempts: self.policy.max_attempts,
        }
    }

    /// Applies `input` to `job` through the lifecycle: the new record written (its effects
    /// follow once it is stored), or, when nothing changes, the effects at once. `token` is
    /// acknowledged once handled.
    pub(crate) fn apply(
        &mut self,
        now: Timestamp,
        job: &JobId,
        input: Input,
        origin: Origin,
        token: Option<Token>,
    ) {
        self.apply_try(now, job, input, origin, token, 0);
    }

    fn apply_try(
        &mut self,
        now: Timestamp,
        job: &JobId,
        input: Input,
        origin: Origin,
        token: Option<Token>,
        tries: usize,
    ) {
        if self.staged.contains(job) {
            self.apply_staged(now, job, (input, origin, token));
            return;
        }
        let Some(tracked) = self.jobs.tracked(job) else {
            self.ack(token, Some(job));
            return;
        };
        let revision = tracked.revision;
        let limits = self.lifecycle_limits();
        let Transition { record, effects } =
            lifecycle::apply(&tracked.record, input.clone(), now, &limits);
        match record {
            Some(record) => {
                let op = self.op();
                let record = Arc::new(record);
                self.out.push(Command::Write {
                    op,
                    record: Arc::clone(&record),
                    expected: Some(revision),
                });
                let pending = PendingTransition {
                    record,
                    input,
                    effects,
                    origin,
                    token,
                    tries: tries + 1,
                    now,
                };
                self.pending.insert(op, Pending::Transition(pending));
            }
            None => {
                self.carry_out(now, job, effects, origin.identity());
                self.ack(token, Some(job));
            }
        }
    }

    /// The result of a write the machine asked for.
    pub(crate) fn on_written(&mut self, op: OpId, outcome: WriteOutcome) {
        match self.pending.remove(&op) {
            Some(Pending::Transition(pending)) => self.transition_written(pending, outcome),
            Some(Pending::Create { record, job }) => self.created(record, outcome, job),
            Some(other) => {
                // Not a write: keep waiting for its own answer.
                self.pending.insert(op, other);
            }
            None => {}
        }
    }

    fn transition_written(&mut self, pending: PendingTransition, outcome: WriteOutcome) {
        let PendingTransition {
            record,
            input,
            mut effects,
            origin,
            token,
            tries,
            now,
        } = pending;
        let id = record.id.clone();
        match outcome {
            WriteOutcome::Stored { revision } => {
                let record = Arc::unwrap_or_clone(record);
                let settled = self.unsettled_exits.get(&id).is_some_and(|report| {
                    record.state.is_finished() || record.attempt != report.attempt
                });
                if settled {
                    self.unsettled_exits.remove(&id);
                }
                self.jobs.put(Tracked { record, revision });
                self.pass_due = true;
                if let Origin::Pass { waited } = &origin {
                    self.pass_changes += 1;
                    if let Some(waited) = waited {
                        self.out.push(Command::Count(Count::StartedAfter(*waited)));
                    }
                    self.arm_slice_timer(&id);
                }
                self.carry_out(now, &id, effects, origin.identity());
                self.ack(token, Some(&id));
            }
            WriteOutcome::Changed { stored } => {
                self.out.push(Command::log(
                    LogLevel::Warn,
                    Some(&id),
                    "job record changed under us; deciding again from what is stored",
                ));
                self.take_stored(&id, stored);
                self.pass_due = true;
                if tries >= WRITE_TRIES {
                    self.out.push(Command::log(
                        LogLevel::Error,
                        Some(&id),
                        "record keeps changing under the scheduler",
                    ));
                    return;
                }
                self.apply_try(now, &id, input, origin, token, tries);
            }
            WriteOutcome::Failed { error } => {
                if let Input::Report(report) = input
                    && matches!(report.kind, ReportKind::Exited(_))
                {
                    self.unsettled_exits.insert(id.clone(), report);
                }
                effects.retain(|e| matches!(e, Effect::Kill(kill) if kill.best_effort));
                self.carry_out(now, &id, effects, origin.identity());
                self.out.push(Command::log(
                    LogLevel::Error,
                    Some(&id),
                    format!("storing its record: {error}"),
                ));
            }
        }
    }
}

/// What a submitter is told about the job `record` as first stored: why it was refused, or
/// nothing (queued).
pub(crate) fn verdict_of(record: &JobRecord) -> mgpu_protocol::submit::SubmitVerdict {
    mgpu_protocol::submit::SubmitVerdict {
        job: record.id.clone(),
        refused: record.state.ending().and_then(|e| e.reason.clone()),
    }
}

impl SchedulerState {
    /// Carries out `effects` about `job` in order, as commands; usage charges are booked.
    pub(crate) fn carry_out(
        &mut self,
        now: Timestamp,
        job: &JobId,
        effects: Vec<Effect>,
        by: Option<&Identity>,
    ) {
        for effect in effects {
            match effect {
                Effect::Assign => {
                    if let Some(record) = self.jobs.get(job) {
                        let assign = self.assignment_of(record);
                        self.out.extend(assign);
                    }
                }
                Effect::Kill(kill) => {
                    let commands = super::assignment::kill_commands(job, &kill);
                    self.out.extend(commands);
                }
                Effect::Publish(kind) => self.announce(now, job, kind),
                Effect::Audit {
                    action,
                    accepted,
                    detail,
                } => {
                    let outcome = if accepted { Ok(detail) } else { Err(detail) };
                    let sender = super::announce::Sender::of(by);
                    self.audit(now, action, &sender, Some(job.to_string()), outcome);
                }
                Effect::Refuse { action, reason } => {
                    // The lifecycle refuses only those who may not act on the job.
                    let sender = super::announce::Sender::of(by);
                    let why = crate::metrics::RefusalReason::NotPermitted;
                    self.refuse(now, action, Some(job), &sender, why, reason);
                }
                Effect::AccountUsage {
                    user,
                    gpu_seconds,
                    at,
                } => self.add_usage(&user, gpu_seconds, at),
                Effect::Notify { kind, message } => {
                    // A job recorded without its owner's key (from before keys were kept)
                    // has no subject to tell them on: its record still says it.
                    let key = self.jobs.get(job).and_then(|r| r.user_key.clone());
                    if let Some(key) = key {
                        let notice = mgpu_protocol::idle::Notice {
                            job: Some(job.clone()),
                            at: now,
                            message,
                            kind,
                        };
                        let subject = mgpu_protocol::subjects::notices(&key);
                        self.out.push(Command::Notice { subject, notice });
                    }
                }
                Effect::Log(log) => {
                    let level = match log.level {
                        lifecycle::Level::Debug => LogLevel::Debug,
                        lifecycle::Level::Info => LogLevel::Info,
                        lifecycle::Level::Warn => LogLevel::Warn,
                    };
                    self.out.push(Command::log(level, Some(job), log.message));
                }
            }
        }
    }

    /// Acknowledges `token`, if there is one.
    pub(crate) fn ack(&mut self, token: Option<Token>, job: Option<&JobId>) {
        if let Some(token) = token {
            self.out.push(Command::Ack {
                token,
                job: job.cloned(),
            });
        }
    }

    /// Whether `job` is running its attempt `attempt` (for checks made after an answer came).
    pub(crate) fn runs_attempt(&self, job: &JobId, attempt: u32) -> bool {
        self.jobs
            .get(job)
            .is_some_and(|r| r.attempt == attempt && matches!(r.state, JobState::Running(_)))
    }
}
