//! Carrying out what the job lifecycle decided: the new record stored first (compare-and-set),
//! then its effects in order, through the outbox. An effect that must happen (an assignment,
//! a kill that is not best-effort) stops the rest when it fails and the error goes back to the
//! caller, which leaves the request unacknowledged so it comes again; the repair timer sends
//! lost assignments and kills again too.

use anyhow::{Result, anyhow};

use mgpu_protocol::assign::NodeControl;
use mgpu_protocol::event::JobEventKind;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::JobRecord;
use mgpu_protocol::request::Action;

use crate::config::effective_time_limit;
use crate::identity::Identity;
use crate::lifecycle::{Effect, Kill, Level, Limits, Log, Transition};
use crate::outbox::Sender;
use crate::service::Scheduler;

impl Scheduler {
    /// What the lifecycle needs of the policy.
    pub(crate) fn limits(&self) -> Limits {
        Limits {
            max_attempts: self.policy.max_attempts,
        }
    }

    /// Stores `transition`'s record for `job`, then carries out its effects; `by` is who
    /// asked, for the audit trail and refusals.
    pub(crate) async fn carry_out(
        &mut self,
        job: &JobId,
        transition: Transition,
        by: Option<&Identity>,
    ) -> Result<()> {
        let Transition {
            record,
            mut effects,
        } = transition;
        if let Some(record) = record {
            self.store.write(record).await?;
        }
        self.charge_usage(&mut effects);
        self.carry_out_effects(job, effects, by).await
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
                Effect::Audit { action, detail } => {
                    self.outbox
                        .audit(action, &sender, Some(job.to_string()), Ok(detail));
                }
                Effect::Refuse { action, reason } => {
                    self.refuse(action, Some(job), &sender, reason);
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

    /// Refuses a request about `job` (see [`crate::outbox::Outbox::refuse`]).
    pub(crate) fn refuse(
        &self,
        action: Action,
        job: Option<&JobId>,
        sender: &Sender<'_>,
        reason: String,
    ) {
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
