//! Carrying out a pass's decisions: starts (recorded, then assignments sent), new wait
//! reasons, rejections and preemptions; and ending jobs, with their GPU time accounted.

use std::collections::HashMap;

use anyhow::Result;
use futures::StreamExt;

use mgpu_protocol::Timestamp;
use mgpu_protocol::assign::NodeControl;
use mgpu_protocol::event::JobEventKind;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{
    Ending, JobRecord, JobState, Launch, OnTimeout, Placement, Run, WaitReason,
};

use crate::core::Decision;
use crate::outbox::master_port;
use crate::service::Scheduler;

/// Assignments awaiting JetStream's acknowledgement at once when a pass starts many jobs.
const ASSIGNMENTS_IN_FLIGHT: usize = 256;

impl Scheduler {
    /// Carries out a pass's decisions; returns how many changed something. Starts and new
    /// wait reasons, the bulk of a busy pass, are written together (pipelined), then the
    /// assignments sent together; rejections and preemptions, rare, one by one.
    pub(crate) async fn carry_out_all(
        &mut self,
        decisions: Vec<Decision>,
        now: Timestamp,
    ) -> usize {
        let mut starts: HashMap<JobId, Placement> = HashMap::new();
        let mut start_order: Vec<JobId> = Vec::new();
        let mut reasons: HashMap<JobId, WaitReason> = HashMap::new();
        let mut reason_order: Vec<JobId> = Vec::new();
        let mut others = Vec::new();
        for decision in decisions {
            match decision {
                Decision::Start { job, placement } => {
                    let placement = self.with_launch(&job, placement);
                    start_order.push(job.clone());
                    starts.insert(job, placement);
                }
                Decision::Wait { job, reason } => {
                    let unchanged = matches!(
                        self.store.get(&job).map(|r| &r.state),
                        Some(JobState::Queued(w)) if w.reason == reason
                    );
                    if !unchanged {
                        reason_order.push(job.clone());
                        reasons.insert(job, reason);
                    }
                }
                other => others.push(other),
            }
        }
        let mut changes = 0;

        // Recorded first, then sent: if we die in between, the restarted scheduler sees
        // running jobs that never started and sends them again (the message id makes
        // JetStream drop a copy that did go out).
        let recorded = self
            .store
            .update_many(&start_order, |r| {
                if let Some(placement) = starts.get(&r.id) {
                    r.state = JobState::Running(Run::assigned(placement.clone(), now));
                }
            })
            .await;
        let mut started = Vec::with_capacity(recorded.len());
        for result in recorded {
            match result {
                Ok(record) => started.push(record),
                Err(err) => tracing::error!("recording a start: {err:#}"),
            }
        }
        let sent: Vec<Result<()>> = futures::stream::iter(&started)
            .map(|record| self.send_assignment(record))
            .buffered(ASSIGNMENTS_IN_FLIGHT)
            .collect()
            .await;
        for (record, outcome) in started.iter().zip(sent) {
            if let Err(err) = outcome {
                // Recorded as running: the repair timer sends it again.
                tracing::error!("{err:#}");
                continue;
            }
            changes += 1;
            let JobState::Running(run) = &record.state else {
                continue;
            };
            self.publish_event(
                &record.id,
                JobEventKind::Assigned {
                    placement: run.placement.clone(),
                },
            );
            if let Some(end) = self
                .effective_time_limit(&record.spec)
                .and_then(|l| chrono::Duration::from_std(l).ok())
            {
                let end = now + end;
                if record.spec.on_timeout == OnTimeout::Requeue
                    && self.next_slice_end.is_none_or(|next| end < next)
                {
                    self.next_slice_end = Some(end);
                }
            }
        }

        let written = self
            .store
            .update_many_quietly(&reason_order, |r| {
                if let (JobState::Queued(waiting), Some(reason)) =
                    (&mut r.state, reasons.get(&r.id))
                {
                    waiting.reason = *reason;
                }
            })
            .await;
        for (job, result) in reason_order.iter().zip(written) {
            match result {
                Ok(_) => {
                    changes += 1;
                    if let Some(reason) = reasons.get(job) {
                        self.publish_event(job, JobEventKind::Queued { reason: *reason });
                    }
                }
                Err(err) => tracing::error!("recording a wait reason: {err:#}"),
            }
        }

        for decision in others {
            match self.carry_out(decision, now).await {
                Ok(()) => changes += 1,
                Err(err) => tracing::error!("{err:#}"),
            }
        }
        changes
    }

    /// Carries out a rejection or a preemption.
    async fn carry_out(&mut self, decision: Decision, now: Timestamp) -> Result<()> {
        match decision {
            Decision::Start { .. } | Decision::Wait { .. } => Ok(()),
            Decision::Reject { job, reason } => {
                self.finish(&job, |_| {
                    JobState::Failed(Ending {
                        placement: None,
                        started_at: None,
                        ended_at: now,
                        exit_code: None,
                        signal: None,
                        reason: Some(format!("cannot run: {reason}")),
                    })
                })
                .await
            }
            Decision::Preempt { job } => self.preempt(&job).await,
        }
    }

    /// A placement with what a multi-node or distributed job's ranks need to find each other.
    fn with_launch(&self, job: &JobId, mut placement: Placement) -> Placement {
        let Some(spec) = self.store.get(job).map(|r| &r.spec) else {
            return placement;
        };
        if spec.is_multi_node() || spec.distributed {
            placement.launch = Some(Launch {
                distributed: spec.distributed,
                addresses: placement
                    .node_names()
                    .into_iter()
                    .map(|node| self.nodes.address(node).unwrap_or(node).to_owned())
                    .collect(),
                master_port: master_port(job),
            });
        }
        placement
    }

    /// Stops a job whose time slice is over; it comes back to the queue when the agent reports.
    async fn preempt(&mut self, job: &JobId) -> Result<()> {
        let Some(record) = self.store.get(job).cloned() else {
            return Ok(());
        };
        let JobState::Running(run) = &record.state else {
            return Ok(());
        };
        if run.preempt_requested || run.cancel_requested_by.is_some() {
            return Ok(());
        }
        self.store
            .update(job, |r| {
                if let JobState::Running(run) = &mut r.state {
                    run.preempt_requested = true;
                }
            })
            .await?;
        let control = NodeControl::Kill {
            job_id: job.clone(),
            attempt: record.attempt,
            reason: "time slice over while other jobs wait: back to the queue".into(),
            requeue: true,
        };
        self.send_control_to_job(&run.placement, &control, None)
            .await?;
        tracing::info!(job = %job, nodes = %run.placement.nodes_label(), "time slice over; preempting");
        Ok(())
    }

    /// Adds a finished run's GPU time to its user's fair-share usage.
    pub(crate) fn account_usage(&mut self, record: &JobRecord, ended_at: Timestamp) {
        let JobState::Running(run) = &record.state else {
            return;
        };
        let Some(started) = run.started_at else {
            return;
        };
        let seconds = (ended_at - started).num_milliseconds().max(0) as f64 / 1000.0;
        let gpus = run.placement.total_gpus();
        if gpus > 0.0 && seconds > 0.0 {
            self.usage.add(
                &record.user,
                gpus * seconds,
                ended_at,
                self.policy.half_life_secs,
            );
            self.usage_dirty = true;
        }
    }

    /// Moves a job to a finished state built by `ending` from its current record.
    pub(crate) async fn finish(
        &mut self,
        job: &JobId,
        ending: impl Fn(&JobRecord) -> JobState,
    ) -> Result<()> {
        let record = self.store.update(job, |r| r.state = ending(r)).await?;
        let end = record.state.ending();
        self.publish_event(
            job,
            JobEventKind::Finished {
                state: record.state.name().to_owned(),
                exit_code: end.and_then(|e| e.exit_code),
                reason: end.and_then(|e| e.reason.clone()),
            },
        );
        tracing::info!(job = %job, state = record.state.name(), "job finished");
        Ok(())
    }
}
