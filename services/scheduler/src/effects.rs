//! Carrying out what the job lifecycle decided: the new record stored first (compare-and-set),
//! then its effects in order, through the outbox. An effect that must happen (an assignment,
//! a kill that is not best-effort) stops the rest when it fails and the error goes back to the
//! caller, which leaves the request unacknowledged so JetStream delivers it again (the gate
//! knows the same stored message from a replay); the repair timer sends lost assignments and
//! kills again too.

use anyhow::{Result, anyhow};

use mgpu_protocol::assign::NodeControl;
use mgpu_protocol::event::JobEventKind;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::JobRecord;
use mgpu_protocol::now;
use mgpu_protocol::request::Action;

use crate::config::effective_time_limit;
use crate::identity::Identity;
use crate::lifecycle::{self, Effect, Input, Kill, Level, Limits, Log, Transition};
use crate::metrics::RefusalReason;
use crate::outbox::Sender;
use crate::service::Scheduler;

/// Times an input is applied when the stored record keeps changing under the scheduler.
const WRITE_TRIES: usize = 3;

impl Scheduler {
    /// What the lifecycle needs of the policy.
    pub(crate) fn limits(&self) -> Limits {
        Limits {
            max_attempts: self.policy.max_attempts,
        }
    }

    /// Applies `input` to `job` through the lifecycle and carries the transition out: the
    /// new record stored, then its effects; `by` is who asked, for the audit trail and
    /// refusals. Where the stored record changed under the scheduler, the input is applied
    /// again to what is stored. Where the record cannot be stored, only the best-effort kills
    /// go out (the job's other processes must stop either way) and the error comes back.
    pub(crate) async fn apply_input(
        &mut self,
        job: &JobId,
        input: Input,
        by: Option<&Identity>,
    ) -> Result<()> {
        let limits = self.limits();
        let now = now();
        for _ in 0..WRITE_TRIES {
            let Some(current) = self.store.get(job) else {
                return Ok(());
            };
            let Transition {
                record,
                mut effects,
            } = lifecycle::apply(current, input.clone(), now, &limits);
            if let Some(record) = record {
                match self.store.write(record).await {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(err) => {
                        effects.retain(|e| matches!(e, Effect::Kill(kill) if kill.best_effort));
                        self.carry_out_effects(job, effects, by).await?;
                        return Err(err);
                    }
                }
            }
            self.charge_usage(&mut effects);
            return self.carry_out_effects(job, effects, by).await;
        }
        Err(anyhow!(
            "job {job}: record keeps changing under the scheduler"
        ))
    }

    /// Takes the usage charges out of `effects` and books them (in memory: the ledger is
    /// stored at most once a second).
    pub(crate) fn charge_usage(&mut self, effects: &mut Vec<Effect>) {
        let half_life = self.policy.half_life_secs;
        effects.retain(|effect| match effect {
            Effect::AccountUsage {
                user,
                gpu_seconds,
                at,
            } => {
                self.usage.add(user, *gpu_seconds, *at, half_life);
                false
            }
            _ => true,
        });
    }

    /// Carries out `effects` about `job` in order (usage charges taken out before).
    pub(crate) async fn carry_out_effects(
        &self,
        job: &JobId,
        effects: Vec<Effect>,
        by: Option<&Identity>,
    ) -> Result<()> {
        let sender = by.map_or(Sender::Unknown { key: None }, Sender::Known);
        for effect in effects {
            match effect {
                Effect::Assign => {
                    let record = self
                        .store
                        .get(job)
                        .ok_or_else(|| anyhow!("job {job} is not in the table"))?;
                    self.send_assignment(record).await?;
                }
                Effect::Kill(kill) => self.kill(job, kill).await?,
                Effect::Publish(kind) => self.announce(job, kind),
                Effect::Audit {
                    action,
                    accepted,
                    detail,
                } => {
                    let outcome = if accepted { Ok(detail) } else { Err(detail) };
                    self.outbox
                        .audit(action, &sender, Some(job.to_string()), outcome);
                }
                Effect::Refuse { action, reason } => {
                    // The lifecycle refuses only those who may not act on the job.
                    let why = RefusalReason::NotPermitted;
                    self.refuse(action, Some(job), &sender, why, reason);
                }
                Effect::AccountUsage { user, .. } => {
                    tracing::error!(job = %job, user, "internal: a usage charge was not booked");
                }
                Effect::Log(log) => write_log(job, &log),
            }
        }
        Ok(())
    }

    /// Sends a running job's assignment to its nodes.
    pub(crate) async fn send_assignment(&self, record: &JobRecord) -> Result<()> {
        let limit = effective_time_limit(&self.policy, &record.spec);
        self.outbox
            .send_assignment(record, limit, &self.gate.principals)
            .await
    }

    async fn kill(&self, job: &JobId, kill: Kill) -> Result<()> {
        let control = NodeControl::Kill {
            job_id: job.clone(),
            attempt: kill.attempt,
            reason: kill.reason,
            requeue: kill.requeue,
        };
        let sent = self
            .outbox
            .send_control_to_job(&kill.placement, &control, kill.except.as_deref())
            .await;
        match sent {
            Ok(()) => Ok(()),
            Err(err) if kill.best_effort => {
                tracing::error!(job = %job, "stopping the other ranks: {err:#}");
                Ok(())
            }
            Err(err) => Err(anyhow!("sending kill for {job}: {err:#}")),
        }
    }

    /// Publishes a state change of `job`, as of its current attempt.
    pub(crate) fn announce(&self, job: &JobId, kind: JobEventKind) {
        let attempt = self.store.get(job).map(|r| r.attempt).unwrap_or(0);
        self.outbox.publish_event(job, attempt, kind);
    }

    /// Refuses a request about `job` (see [`crate::outbox::Outbox::refuse`]), counted in the
    /// metrics under `why`.
    pub(crate) fn refuse(
        &self,
        action: Action,
        job: Option<&JobId>,
        sender: &Sender<'_>,
        why: RefusalReason,
        reason: String,
    ) {
        self.metrics.tally().refused(action, why);
        let about = job.map(|id| (id, self.store.get(id).map(|r| r.attempt).unwrap_or(0)));
        self.outbox.refuse(action, about, sender, reason);
    }
}

fn write_log(job: &JobId, log: &Log) {
    let message = &log.message;
    match log.level {
        Level::Debug => tracing::debug!(job = %job, "{message}"),
        Level::Info => tracing::info!(job = %job, "{message}"),
        Level::Warn => tracing::warn!(job = %job, "{message}"),
    }
}
