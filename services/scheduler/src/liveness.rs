//! Failures: nodes that stop heartbeating, jobs their agent no longer runs, and attempts
//! that keep running where they are no longer wanted (fencing).
//!
//! - A node offline (more than `missed_heartbeats` missed) loses its running jobs: each goes
//!   back to the queue as its next attempt, or ends `node_failed` (`--no-requeue`, or
//!   `max_attempts` reached): the job lifecycle's `NodeLost`.
//! - A job recorded as started on a node whose fresh heartbeat does not list it was lost
//!   there (the agent restarted): the same.
//! - A heartbeat listing an attempt that is not that job's current attempt on that node gets a
//!   kill for it. When a lost node comes back, its stale attempts die before anything else
//!   can go wrong: no job runs twice at once for longer than one heartbeat.
//!
//! What these checks remember between runs is [`crate::liveness_memory::LivenessMemory`]'s.

use std::time::{Duration, Instant};

use bytes::Bytes;

use mgpu_protocol::assign::NodeControl;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState, Placement};
use mgpu_protocol::node::NodeHeartbeat;
use mgpu_protocol::{Timestamp, now, subjects, version, wire};

use crate::lifecycle::{self, Input};
use crate::liveness_memory::REPAIR_EVERY;
use crate::service::Scheduler;

impl Scheduler {
    /// A heartbeat arrived on `subject`: checked, compared with the records, and kept in the
    /// node table. True when the node table changed in a way a pass should see.
    pub(crate) async fn on_heartbeat(&mut self, subject: &str, payload: &Bytes) -> bool {
        let now = now();
        let strict = wire::decode::<NodeHeartbeat>("heartbeat", payload, wire::MAX_HEARTBEAT_BYTES);
        // The version before anything the heartbeat says is used. One this release reads
        // decodes strictly and says its protocol; only one that does not decode is read again
        // for the version alone (a second parse of every heartbeat would cost every node's).
        let protocol = match &strict {
            Ok(beat) => beat.protocol,
            Err(_) => version::peek(payload),
        };
        if let Some(node) = subjects::node_of(subject) {
            let sender = format!("the agent of node {node}");
            if let Some(why) = version::incompatibility(&sender, protocol) {
                if self.nodes.mark_incompatible(node, protocol, now) {
                    tracing::warn!(node, protocol, "node gets no jobs: {why}");
                }
                return false;
            }
        }
        let decoded = strict
            .and_then(|beat| beat.validate(now).map(|()| beat))
            .and_then(|beat| {
                // The server lets a node publish only its own subject; the payload must not
                // speak for another node.
                if subjects::node_of(subject) == Some(beat.node.as_str()) {
                    Ok(beat)
                } else {
                    Err(wire::InvalidInput::new(format!(
                        "heartbeat for node {} published on {subject}",
                        beat.node
                    )))
                }
            });
        match decoded {
            Ok(beat) => {
                self.reconcile_heartbeat(&beat).await;
                self.nodes.update(beat, now)
            }
            Err(err) => {
                tracing::warn!(%err, "ignoring a malformed heartbeat");
                false
            }
        }
    }

    /// Acts on nodes that went offline. Returns true when something changed (or a job held
    /// for fencing may start now).
    pub(crate) async fn check_liveness(&mut self) -> bool {
        let now = now();
        let released = self.watch.next_release.is_some_and(|t| t <= now);
        // Our own blindness is not the nodes' silence: a stall of this loop (a write retried
        // through a NATS leader election), or a heartbeat stream that cannot answer, restarts
        // every node's allowance.
        let stalled = self.watch.stalled(Instant::now());
        if stalled || !self.heartbeat_stream_answers().await {
            tracing::warn!(
                stalled,
                "could not watch heartbeats for a while; no node counts as silent for that time"
            );
            self.nodes.blind_until(now);
            return released;
        }
        if self.watch.repair_due(Instant::now()) {
            self.repair_lost_messages().await;
        }
        let mut changed = false;
        for node in self.nodes.newly_lost(now) {
            changed |= self.lose_jobs_of(&node, now).await;
        }
        changed || released
    }

    /// The running jobs of a node that went offline are lost. True when it had any.
    async fn lose_jobs_of(&mut self, node: &str, now: Timestamp) -> bool {
        let victims: Vec<JobId> = self
            .store
            .running_on(node)
            .filter(|r| matches!(&r.state, JobState::Running(run) if run.placement.uses_node(node)))
            .map(|r| r.id.clone())
            .collect();
        tracing::warn!(
            node,
            jobs = victims.len(),
            "node offline: its running jobs are lost"
        );
        // The node's agent stops its jobs by itself (self-fencing): a requeued job waits
        // until then, so it never runs twice.
        let dead_by = self.nodes.get(node).and_then(|beat| beat.jobs_dead_by());
        let why = format!("node {node} went offline");
        for job in &victims {
            if let Err(err) = self.lose_job(job, &why, now, dead_by).await {
                tracing::error!("{err:#}");
            }
        }
        !victims.is_empty()
    }

    /// A running job whose node lost it (see [`lifecycle`]'s `NodeLost`).
    pub(crate) async fn lose_job(
        &mut self,
        job: &JobId,
        why: &str,
        at: Timestamp,
        not_before: Option<Timestamp>,
    ) -> anyhow::Result<()> {
        let input = Input::NodeLost {
            why: why.to_owned(),
            at,
            not_before,
        };
        self.apply_input(job, input, None).await
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
            self.store.running().filter_map(pending_stop).collect();
        for (job, attempt, placement, control) in pending {
            if !self.watch.stop_due((job.clone(), attempt), Instant::now()) {
                continue;
            }
            if let Err(err) = self
                .outbox
                .send_control_to_job(&placement, &control, None)
                .await
            {
                tracing::error!(job = %job, "repeating a stop: {err:#}");
            }
        }
        let store = &self.store;
        self.watch.forget_stops(|job| {
            matches!(store.get(job).map(|r| &r.state), Some(JobState::Running(_)))
        });
    }

    /// After a restart: assignments recorded but never confirmed by their agent go out again.
    pub(crate) async fn resend_unconfirmed_assignments(&self) {
        self.resend_assignments_older_than(chrono::Duration::zero())
            .await;
    }

    /// Assignments recorded at least `age` ago and not confirmed go out again (the message id
    /// lets JetStream drop a copy, and an agent never runs an attempt twice). A send that
    /// failed for good, or an agent's report lost, is repaired this way.
    async fn resend_assignments_older_than(&self, age: chrono::Duration) {
        let now = now();
        let unconfirmed: Vec<&JobRecord> = self
            .store
            .running()
            .filter(|r| {
                matches!(&r.state, JobState::Running(run)
                    if run.started_at.is_none() && now - run.assigned_at >= age)
            })
            .collect();
        for record in unconfirmed {
            tracing::info!(job = %record.id, "re-sending an unconfirmed assignment");
            if let Err(err) = self.send_assignment(record).await {
                tracing::error!("{err:#}");
            }
        }
    }

    /// Compares what a node says it runs with what the records say.
    pub(crate) async fn reconcile_heartbeat(&mut self, beat: &NodeHeartbeat) {
        self.kill_stale_attempts(beat).await;
        let missing = self.missing_jobs(beat);
        // An agent drops a job from its heartbeat only once its exit report is stored, but
        // reports come through a stream that may lag behind heartbeats (a NATS leader
        // election): the job is lost only if every stored report has been handled.
        if missing.is_empty() || !self.reports_caught_up().await {
            return;
        }
        let why = format!("node {} no longer runs it (its agent restarted)", beat.node);
        for job in missing {
            if let Err(err) = self.lose_job(&job, &why, beat.sent_at, None).await {
                tracing::error!("{err:#}");
            }
        }
    }

    /// Attempts the node runs that it should not: kill them there.
    async fn kill_stale_attempts(&mut self, beat: &NodeHeartbeat) {
        for running in &beat.running {
            let record = self.store.get(&running.id);
            let current = record.is_some_and(|r| {
                r.attempt == running.attempt
                    && matches!(&r.state, JobState::Running(run) if run.placement.launches_on(&beat.node))
            });
            // A beat sent before the attempt's end arrives after its exit report (they travel
            // separately): it shows the attempt as it was, not one left running.
            let ended_after_beat = record.is_some_and(|r| {
                r.attempt == running.attempt
                    && r.state
                        .ending()
                        .is_some_and(|end| end.ended_at >= beat.sent_at)
            });
            let key = (running.id.clone(), running.attempt);
            if current || ended_after_beat || !self.watch.kill_due(&key, Instant::now()) {
                continue;
            }
            tracing::warn!(job = %running.id, attempt = running.attempt, node = %beat.node, "stale attempt still running: killing it");
            if let Err(err) = self
                .outbox
                .send_stale_kill(&beat.node, &running.id, running.attempt)
                .await
            {
                tracing::error!("{err:#}");
                continue;
            }
            self.watch.kill_sent(key, Instant::now());
        }
    }

    /// Jobs recorded as started on the beat's node that it no longer lists: lost with its
    /// agent (once the beat is surely later than their start).
    fn missing_jobs(&self, beat: &NodeHeartbeat) -> Vec<JobId> {
        // Checked: heartbeats are validated, but chrono panics on overflow, so never risk it.
        let margin = i64::try_from(beat.interval_ms)
            .ok()
            .and_then(|ms| chrono::Duration::try_milliseconds(ms.saturating_mul(2)))
            .unwrap_or(chrono::Duration::MAX);
        self.store
            .running_on(&beat.node)
            .filter(|r| started_and_missing(r, beat, margin))
            .map(|r| r.id.clone())
            .collect()
    }
}

/// Whether `record`'s attempt started on the beat's node at least `margin` before the beat,
/// and the beat does not list it.
fn started_and_missing(record: &JobRecord, beat: &NodeHeartbeat, margin: chrono::Duration) -> bool {
    let JobState::Running(run) = &record.state else {
        return false;
    };
    let rank = run.placement.rank_of(&beat.node);
    // A one-process job started when it reported so; a rank of a distributed job when that
    // rank did (and it is not done yet).
    let started_here = match rank {
        Some(_) if run.placement.launched_ranks().len() < 2 => true,
        Some(rank) => run.ranks_started.contains(&rank) && !run.ranks_done.contains(&rank),
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
            .any(|j| j.id == record.id && j.attempt == record.attempt)
}

/// The kill a running job still needs when a cancel or preemption was recorded for it.
fn pending_stop(record: &JobRecord) -> Option<(JobId, u32, Placement, NodeControl)> {
    let JobState::Running(run) = &record.state else {
        return None;
    };
    if run.cancel_requested_by.is_none() && !run.preempt_requested {
        return None;
    }
    let control = NodeControl::Kill {
        job_id: record.id.clone(),
        attempt: record.attempt,
        reason: match &run.cancel_requested_by {
            Some(by) => format!("cancelled by {by}"),
            None => lifecycle::SLICE_OVER.into(),
        },
        requeue: run.cancel_requested_by.is_none(),
    };
    Some((
        record.id.clone(),
        record.attempt,
        run.placement.clone(),
        control,
    ))
}
