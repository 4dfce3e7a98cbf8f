//! Failures: nodes that stop heartbeating, jobs their agent no longer runs, and attempts
//! that keep running where they are no longer wanted (fencing).
//!
//! - A node offline (more than `missed_heartbeats` missed) loses its running jobs: each goes
//!   back to the queue as its next attempt, or ends `node_failed` (`--no-requeue`, or
//!   `max_attempts` reached).
//! - A job recorded as started on a node whose fresh heartbeat does not list it was lost
//!   there (the agent restarted): the same.
//! - A heartbeat listing an attempt that is not that job's current attempt on that node gets a
//!   kill for it. When a lost node comes back, its stale attempts die before anything else
//!   can go wrong: no job runs twice at once for longer than one heartbeat.

use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use bytes::Bytes;

use mgpu_protocol::assign::NodeControl;
use mgpu_protocol::event::JobEventKind;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{Ending, JobState, Placement, WaitReason, Waiting};
use mgpu_protocol::node::NodeHeartbeat;
use mgpu_protocol::{Timestamp, now, subjects};

use crate::service::Scheduler;

/// A kill for a stale attempt is repeated at most this often while heartbeats still list it.
const KILL_REPEAT: Duration = Duration::from_secs(5);
/// The liveness check runs every second; a longer gap means this loop was stalled.
const LIVENESS_STALL: Duration = Duration::from_secs(3);
/// How often assignments and kills that may have been lost are sent again.
const REPAIR_EVERY: Duration = Duration::from_secs(5);

impl Scheduler {
    /// Acts on nodes that went offline. Returns true when something changed (or a job held
    /// for fencing may start now).
    pub(crate) async fn check_liveness(&mut self) -> bool {
        let now = now();
        let released = self.next_release.is_some_and(|t| t <= now);
        // Our own blindness is not the nodes' silence: a stall of this loop (a write retried
        // through a NATS leader election), or a heartbeat stream that cannot answer, restarts
        // every node's allowance.
        let stalled = self
            .last_liveness_check
            .replace(Instant::now())
            .is_some_and(|last| last.elapsed() > LIVENESS_STALL);
        if stalled || !self.heartbeat_stream_answers().await {
            tracing::warn!(
                stalled,
                "could not watch heartbeats for a while; no node counts as silent for that time"
            );
            self.nodes.blind_until(now);
            return released;
        }
        if self
            .last_repair
            .is_none_or(|last| last.elapsed() >= REPAIR_EVERY)
        {
            self.last_repair = Some(Instant::now());
            self.repair_lost_messages().await;
        }
        let lost_nodes = self.nodes.newly_lost(now);
        let mut changed = false;
        for node in lost_nodes {
            let victims: Vec<JobId> = self
                .store
                .running_on(&node)
                .filter(
                    |r| matches!(&r.state, JobState::Running(run) if run.placement.uses_node(&node)),
                )
                .map(|r| r.id.clone())
                .collect();
            tracing::warn!(
                node,
                jobs = victims.len(),
                "node offline: its running jobs are lost"
            );
            // The node's agent stops its jobs by itself (self-fencing): a requeued job waits
            // until then, so it never runs twice.
            let dead_by = self.nodes.get(&node).and_then(|beat| beat.jobs_dead_by());
            for job in victims {
                if let Err(err) = self
                    .lose_job_until(&job, &format!("node {node} went offline"), now, dead_by)
                    .await
                {
                    tracing::error!("{err:#}");
                }
                changed = true;
            }
        }
        changed || released
    }

    /// Whether every agent report stored so far was handled (none waits in the consumer and
    /// none is delivered but unacknowledged). False when that cannot be told.
    async fn reports_caught_up(&mut self) -> bool {
        let Some(consumer) = self.events_consumer.as_mut() else {
            return false;
        };
        match tokio::time::timeout(Duration::from_secs(1), consumer.info()).await {
            Ok(Ok(info)) => info.num_pending == 0 && info.num_ack_pending == 0,
            _ => false,
        }
    }

    /// Whether the heartbeat stream answers now (it does not while a NATS cluster elects its
    /// leader, and then heartbeats cannot be stored or seen).
    async fn heartbeat_stream_answers(&self) -> bool {
        matches!(
            tokio::time::timeout(
                Duration::from_secs(1),
                self.js.get_stream(subjects::NODES_STREAM)
            )
            .await,
            Ok(Ok(_))
        )
    }

    /// Sends again what may have been lost on the way: assignments not confirmed within
    /// [`REPAIR_EVERY`], and kills for jobs still running although a cancel or preemption was
    /// recorded. Agents ignore what they already acted on.
    async fn repair_lost_messages(&mut self) {
        // While agents' reports wait to be read, an assignment's `started` may be among them:
        // under that load only assignments far older count as lost.
        let wait = if self.reports_caught_up().await {
            REPAIR_EVERY
        } else {
            REPAIR_EVERY * 12
        };
        let age = chrono::Duration::from_std(wait).unwrap_or_else(|_| chrono::Duration::zero());
        self.resend_assignments_older_than(age).await;
        let pending: Vec<(JobId, u32, Placement, NodeControl)> =
            self.store
                .running()
                .filter_map(|r| match &r.state {
                    JobState::Running(run)
                        if run.cancel_requested_by.is_some() || run.preempt_requested =>
                    {
                        let control = NodeControl::Kill {
                            job_id: r.id.clone(),
                            attempt: r.attempt,
                            reason: match &run.cancel_requested_by {
                                Some(by) => format!("cancelled by {by}"),
                                None => "time slice over while other jobs wait: back to the queue"
                                    .into(),
                            },
                            requeue: run.cancel_requested_by.is_none(),
                        };
                        Some((r.id.clone(), r.attempt, run.placement.clone(), control))
                    }
                    _ => None,
                })
                .collect();
        for (job, attempt, placement, control) in pending {
            let key = (job.clone(), attempt);
            if self
                .stops_sent
                .get(&key)
                .is_some_and(|sent| sent.elapsed() < REPAIR_EVERY)
            {
                continue;
            }
            self.stops_sent.insert(key, Instant::now());
            if let Err(err) = self.send_control_to_job(&placement, &control, None).await {
                tracing::error!(job = %job, "repeating a stop: {err:#}");
            }
        }
        self.stops_sent.retain(|(job, _), _| {
            matches!(
                self.store.get(job).map(|r| &r.state),
                Some(JobState::Running(_))
            )
        });
    }

    /// Compares what a node says it runs with what the records say.
    pub(crate) async fn reconcile_heartbeat(&mut self, beat: &NodeHeartbeat) {
        // Attempts the node runs that it should not: kill them there.
        for running in &beat.running {
            let current = self.store.get(&running.id).is_some_and(|r| {
                r.attempt == running.attempt
                    && matches!(&r.state, JobState::Running(run) if run.placement.launches_on(&beat.node))
            });
            // A beat sent before the attempt's end arrives after its exit report (they travel
            // separately): it shows the attempt as it was, not one left running.
            let ended_after_beat = self.store.get(&running.id).is_some_and(|r| {
                r.attempt == running.attempt
                    && r.state
                        .ending()
                        .is_some_and(|end| end.ended_at >= beat.sent_at)
            });
            if current || ended_after_beat {
                continue;
            }
            let key = (running.id.clone(), running.attempt);
            if self
                .kills_sent
                .get(&key)
                .is_some_and(|sent| sent.elapsed() < KILL_REPEAT)
            {
                continue;
            }
            tracing::warn!(job = %running.id, attempt = running.attempt, node = %beat.node, "stale attempt still running: killing it");
            if let Err(err) = self
                .send_kill(&beat.node, &running.id, running.attempt)
                .await
            {
                tracing::error!("{err:#}");
                continue;
            }
            self.kills_sent.insert(key, Instant::now());
        }
        // Pruned once it doubled since the last pruning: this runs for every heartbeat, and a
        // thousand nodes heartbeat several hundred times a second.
        if self.kills_sent.len() > 2 * self.kills_kept.max(64) {
            self.kills_sent
                .retain(|_, sent| sent.elapsed() < KILL_REPEAT * 12);
            self.kills_kept = self.kills_sent.len();
        }

        // Jobs recorded as started there that the node no longer lists: lost with its agent.
        // Checked: heartbeats are validated, but chrono panics on overflow, so never risk it.
        let margin = i64::try_from(beat.interval_ms)
            .ok()
            .and_then(|ms| chrono::Duration::try_milliseconds(ms.saturating_mul(2)))
            .unwrap_or(chrono::Duration::MAX);
        let missing: Vec<JobId> = self
            .store
            .running_on(&beat.node)
            .filter(|r| match &r.state {
                JobState::Running(run) => {
                    let rank = run.placement.rank_of(&beat.node);
                    // A one-process job started when it reported so; a rank of a
                    // distributed job when that rank did (and it is not done yet).
                    let started_here = match rank {
                        Some(_) if run.placement.launched_ranks().len() < 2 => true,
                        Some(rank) => {
                            run.ranks_started.contains(&rank) && !run.ranks_done.contains(&rank)
                        }
                        None => false,
                    };
                    run.placement.launches_on(&beat.node)
                        && started_here
                        && run
                            .started_at
                            .and_then(|s| s.checked_add_signed(margin))
                            .is_some_and(|deadline| beat.sent_at > deadline)
                        && !beat
                            .running
                            .iter()
                            .any(|j| j.id == r.id && j.attempt == r.attempt)
                }
                _ => false,
            })
            .map(|r| r.id.clone())
            .collect();
        // An agent drops a job from its heartbeat only once its exit report is stored, but
        // reports come through a stream that may lag behind heartbeats (a NATS leader
        // election): the job is lost only if every stored report has been handled.
        if !missing.is_empty() && !self.reports_caught_up().await {
            return;
        }
        for job in missing {
            let why = format!("node {} no longer runs it (its agent restarted)", beat.node);
            if let Err(err) = self.lose_job(&job, &why, beat.sent_at).await {
                tracing::error!("{err:#}");
            }
        }
    }

    async fn send_kill(&self, node: &str, job: &JobId, attempt: u32) -> Result<()> {
        let control = NodeControl::Kill {
            job_id: job.clone(),
            attempt,
            reason: "stale attempt: this job was requeued or ended elsewhere".into(),
            requeue: false,
        };
        self.publish_stored(
            subjects::control(node),
            async_nats::HeaderMap::new(),
            Bytes::from(serde_json::to_vec(&control)?),
        )
        .await
        .map_err(|e| anyhow!("sending a fencing kill to {node}: {e:#}"))
    }

    /// A running job whose node lost it: back to the queue as the next attempt (keeping its
    /// place in line), or `node_failed` when it may not be requeued.
    pub(crate) async fn lose_job(&mut self, job: &JobId, why: &str, at: Timestamp) -> Result<()> {
        self.lose_job_until(job, why, at, None).await
    }

    /// [`Scheduler::lose_job`], the requeued job not starting before `not_before` (when its
    /// silent node's agent has surely stopped it).
    pub(crate) async fn lose_job_until(
        &mut self,
        job: &JobId,
        why: &str,
        at: Timestamp,
        not_before: Option<Timestamp>,
    ) -> Result<()> {
        let Some(record) = self.store.get(job).cloned() else {
            return Ok(());
        };
        let JobState::Running(run) = &record.state else {
            return Ok(());
        };
        self.account_usage(&record, at);
        // The job's other ranks, where it has any, stop with it (fencing would, a heartbeat later).
        self.stop_other_ranks(job, record.attempt, &run.placement, None, why)
            .await;
        let out_of_attempts = record.attempt >= self.policy.max_attempts;
        if record.spec.no_requeue || out_of_attempts {
            let reason = if record.spec.no_requeue {
                format!("{why}; not requeued (--no-requeue)")
            } else {
                format!(
                    "{why}; not requeued: {} attempt(s) made, max_attempts is {}",
                    record.attempt, self.policy.max_attempts
                )
            };
            let ending = Ending {
                placement: Some(run.placement.clone()),
                started_at: run.started_at,
                ended_at: at,
                exit_code: None,
                signal: None,
                reason: Some(reason),
            };
            return self
                .finish(job, |_| JobState::NodeFailed(ending.clone()))
                .await;
        }
        self.store
            .update(job, |r| {
                r.attempt += 1;
                let mut waiting = Waiting::new(WaitReason::Resources);
                waiting.not_before = not_before.filter(|t| *t > at);
                r.state = JobState::Queued(waiting);
            })
            .await?;
        self.publish_event(
            job,
            JobEventKind::Queued {
                reason: WaitReason::Resources,
            },
        );
        tracing::warn!(job = %job, attempt = record.attempt + 1, "{why}: requeued");
        Ok(())
    }
}
