//! What agents report about the processes they run (`started`, `failed_to_start`,
//! `exited`), turned into job state. Reports about an attempt that is no longer current
//! (stale, or from another node) are logged and ignored.
//!
//! A distributed job has one process per node: it succeeds when every rank exited 0, and
//! the first rank that fails, is cancelled or is lost ends it and stops the others.

use anyhow::Result;

use mgpu_protocol::assign::NodeControl;
use mgpu_protocol::event::{JobEvent, JobEventKind};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{Ending, JobState, Placement, WaitReason, Waiting};

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
        if !run.placement.launches_on(node) || record.attempt != event.attempt {
            tracing::warn!(job = %job, node, attempt = event.attempt, "stale report ignored");
            return Ok(());
        }
        let placement = run.placement.clone();
        let rank = placement.rank_of(node).unwrap_or(0);
        let ranks = placement.launched_ranks().len();
        // "rank 1 (node002): " in reasons, where a job has several.
        let which = if ranks > 1 {
            format!("rank {rank} ({node}): ")
        } else {
            String::new()
        };
        let started_at = run.started_at;
        let cancel_requested_by = run.cancel_requested_by.clone();
        let attempt = record.attempt;
        match event.kind {
            JobEventKind::Started { pid } => {
                let at = event.at;
                self.store
                    .update(&job, |r| {
                        if let JobState::Running(run) = &mut r.state {
                            run.started_at.get_or_insert(at);
                            if rank == 0 {
                                run.pid = Some(pid);
                            }
                            if ranks > 1 && !run.ranks_started.contains(&rank) {
                                run.ranks_started.push(rank);
                            }
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
                        reason: Some(format!("{which}could not start: {error}")),
                    })
                })
                .await?;
                self.stop_other_ranks(
                    &job,
                    attempt,
                    &placement,
                    Some(node),
                    "another rank could not start",
                )
                .await;
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
                let clean_exit = exit_code == 0 && !cancelled && !timed_out && !preempted;
                if clean_exit && ranks > 1 && cancel_requested_by.is_none() {
                    // One rank of a distributed job is done; the job is done when all are.
                    let record = self
                        .store
                        .update(&job, |r| {
                            if let JobState::Running(run) = &mut r.state
                                && !run.ranks_done.contains(&rank)
                            {
                                run.ranks_done.push(rank);
                            }
                        })
                        .await?;
                    let all_done = matches!(&record.state, JobState::Running(run) if run.ranks_done.len() >= ranks);
                    if !all_done {
                        tracing::info!(job = %job, rank, node, "rank finished; others still run");
                        return Ok(());
                    }
                }
                // The job ends here (or goes back to the queue): its GPU time counts once.
                if let Some(record) = self.store.get(&job).cloned() {
                    self.account_usage(&record, at);
                }
                if let Some(record) = self.store.get(&job).cloned()
                    && !clean_exit
                {
                    // Whatever ends one rank badly ends the job: stop the others now.
                    let why = if preempted {
                        "the job is being requeued"
                    } else {
                        "another rank of the job ended"
                    };
                    self.stop_other_ranks(&job, record.attempt, &placement, Some(node), why)
                        .await;
                }
                if preempted && cancel_requested_by.is_none() {
                    // Back to the end of the queue, as the next attempt.
                    self.store
                        .update(&job, |r| {
                            r.attempt = r.attempt.saturating_add(1);
                            r.state = JobState::Queued(Waiting {
                                reason: WaitReason::Resources,
                                held_by: None,
                                enqueued_at: Some(at),
                                not_before: None,
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
                    JobState::Failed(ending(Some(format!("{which}killed by signal {signal}"))))
                } else {
                    JobState::Failed(ending(Some(format!("{which}exit code {exit_code}"))))
                };
                self.finish(&job, |_| state.clone()).await?;
            }
            other => {
                tracing::debug!(job = %job, node, event = ?other, "event not for the scheduler");
            }
        }
        Ok(())
    }

    /// Kills a multi-process job's processes on every node but `except` (where its rank
    /// already ended). Failures are logged: heartbeat fencing kills what this misses.
    pub(crate) async fn stop_other_ranks(
        &self,
        job: &JobId,
        attempt: u32,
        placement: &Placement,
        except: Option<&str>,
        why: &str,
    ) {
        if placement.launched_ranks().len() < 2 {
            return;
        }
        let control = NodeControl::Kill {
            job_id: job.clone(),
            attempt,
            reason: why.to_owned(),
            requeue: false,
        };
        if let Err(err) = self.send_control_to_job(placement, &control, except).await {
            tracing::error!(job = %job, "stopping the other ranks: {err:#}");
        }
    }
}
