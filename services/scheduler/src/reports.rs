//! What agents report about the processes they run (`started`, `failed_to_start`,
//! `exited`), turned into job state. Reports about an attempt that is no longer current
//! (stale, or from another node) are logged and ignored.

use anyhow::Result;

use mgpu_shared::event::{JobEvent, JobEventKind};
use mgpu_shared::job::{Ending, JobState, WaitReason, Waiting};

use crate::service::Scheduler;

impl Scheduler {
    pub(crate) async fn on_agent_report(&mut self, node: &str, event: JobEvent) -> Result<()> {
        let job = event.job_id.clone();
        let Some(record) = self.store.get(&job) else {
            tracing::warn!(job = %job, node, "report about an unknown job");
            return Ok(());
        };
        let JobState::Running(run) = &record.state else {
            tracing::debug!(job = %job, node, state = record.state.name(), "report about a job that is not running");
            return Ok(());
        };
        if run.placement.node != node || record.attempt != event.attempt {
            tracing::warn!(job = %job, node, attempt = event.attempt, "stale report ignored");
            return Ok(());
        }
        let placement = run.placement.clone();
        let started_at = run.started_at;
        let cancel_requested_by = run.cancel_requested_by.clone();
        match event.kind {
            JobEventKind::Started { pid } => {
                let at = event.at;
                self.store
                    .update(&job, |r| {
                        if let JobState::Running(run) = &mut r.state {
                            run.started_at = Some(at);
                            run.pid = Some(pid);
                        }
                    })
                    .await?;
            }
            JobEventKind::FailedToStart { error } => {
                let at = event.at;
                self.finish(&job, |_| {
                    JobState::Failed(Ending {
                        placement: Some(placement.clone()),
                        started_at: None,
                        ended_at: at,
                        exit_code: None,
                        signal: None,
                        reason: Some(format!("could not start: {error}")),
                    })
                })
                .await?;
            }
            JobEventKind::Exited {
                exit_code,
                signal,
                cancelled,
                timed_out,
                preempted,
                lost,
            } => {
                let at = event.at;
                if lost {
                    let why = format!("its agent on {node} restarted and stopped it");
                    return self.lose_job(&job, &why, at).await;
                }
                if let Some(record) = self.store.get(&job).cloned() {
                    self.account_usage(&record, at);
                }
                if preempted && cancel_requested_by.is_none() {
                    // Back to the end of the queue, as the next attempt.
                    self.store
                        .update(&job, |r| {
                            r.attempt += 1;
                            r.state = JobState::Queued(Waiting {
                                reason: WaitReason::Resources,
                                held_by: None,
                                enqueued_at: Some(at),
                            });
                        })
                        .await?;
                    self.publish_event(
                        &job,
                        JobEventKind::Queued {
                            reason: WaitReason::Resources,
                        },
                    );
                    tracing::info!(job = %job, "requeued after its time slice");
                    return Ok(());
                }
                let ending = |reason: Option<String>| Ending {
                    placement: Some(placement.clone()),
                    started_at: started_at.or(Some(at)),
                    ended_at: at,
                    exit_code: Some(exit_code),
                    signal,
                    reason,
                };
                let state = if cancelled || cancel_requested_by.is_some() {
                    let by = cancel_requested_by
                        .clone()
                        .unwrap_or_else(|| "an administrator".into());
                    JobState::Cancelled(ending(Some(format!("cancelled by {by}"))))
                } else if timed_out {
                    JobState::TimedOut(ending(Some("time limit reached".into())))
                } else if exit_code == 0 {
                    JobState::Succeeded(ending(None))
                } else if let Some(signal) = signal {
                    JobState::Failed(ending(Some(format!("killed by signal {signal}"))))
                } else {
                    JobState::Failed(ending(Some(format!("exit code {exit_code}"))))
                };
                self.finish(&job, |_| state.clone()).await?;
            }
            other => {
                tracing::debug!(job = %job, node, event = ?other, "event not for the scheduler");
            }
        }
        Ok(())
    }
}
