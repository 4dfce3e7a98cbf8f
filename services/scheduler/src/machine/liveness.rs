//! Failures: nodes that stop heartbeating, jobs their agent no longer runs, attempts that
//! keep running where they are no longer wanted (fencing), and messages that may have been
//! lost on the way (repair).
//!
//! - A node offline (more than `missed_heartbeats` missed) loses its running jobs: each goes
//!   back to the queue as its next attempt, or ends `node_failed` (`--no-requeue`, or
//!   `max_attempts` reached): the job lifecycle's `NodeLost`. A requeued job waits until the
//!   lost node's agent has surely stopped it (self-fencing), so it never runs twice.
//! - A job recorded as started on a node whose fresh heartbeat does not list it was lost
//!   there (the agent restarted): the same, once every stored report was handled (its exit
//!   report may still wait in the stream).
//! - A heartbeat listing an attempt that is not that job's current attempt on that node gets a
//!   kill for it, repeated at most every five seconds while it is listed.
//! - Every five seconds, assignments never confirmed and kills of cancelled or preempted jobs
//!   still running go out again; agents ignore what they already acted on.
//!
//! Time in which the scheduler itself could not see heartbeats (its loop stalled, the
//! heartbeat stream had no leader, it just became active) does not count as a node's silence.

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState};
use mgpu_protocol::node::NodeHeartbeat;
use mgpu_protocol::report::AgentReport;

use super::assignment::{controls_to_job, pending_stop, stale_kill};
use super::messages::{ACK_WAIT, Command, LogLevel, Tick, Token};
use super::pending::{Origin, Pending};
use super::{OpId, SchedulerState};
use crate::lifecycle::Input;
use crate::liveness_memory::REPAIR_EVERY;

impl SchedulerState {
    /// An agent's report about one attempt's process: the lifecycle decides what it means.
    pub(crate) fn on_report(&mut self, now: Timestamp, token: Token, report: AgentReport) {
        let job = report.job.clone();
        if self.jobs.get(&job).is_none() {
            let said = format!("report from {} about an unknown job", report.node);
            self.out
                .push(Command::log(LogLevel::Warn, Some(&job), said));
            self.ack(Some(token), Some(&job));
            return;
        }
        self.apply(
            now,
            &job,
            Input::Report(report),
            Origin::Scheduler,
            Some(token),
        );
    }

    /// A node's heartbeat: compared with the records both ways, then kept in the node table.
    pub(crate) fn on_heartbeat(&mut self, now: Timestamp, beat: NodeHeartbeat) {
        self.watch.heard(&beat.node, self.monotonic);
        self.kill_stale_attempts(&beat);
        let missing = self.missing_jobs(&beat);
        if !missing.is_empty() {
            // An agent drops a job from its heartbeat only once its exit report is stored,
            // but reports come through a stream that may lag behind heartbeats (a NATS
            // leader election): the job is lost only if every stored report was handled.
            let op = self.op();
            self.out.push(Command::AskReportsCaughtUp { op });
            let pending = Pending::Missing {
                node: beat.node.clone(),
                jobs: missing,
                at: beat.sent_at,
            };
            self.pending.insert(op, pending);
        }
        // An attempt gone from the node's list may have held a requeued job back (the pass's
        // `earlier_attempts_still_running`): a pass looks again.
        let gone = self.nodes.get(&beat.node).is_some_and(|old| {
            old.running.iter().any(|was| {
                !beat
                    .running
                    .iter()
                    .any(|is| is.id == was.id && is.attempt == was.attempt)
            })
        });
        if self.nodes.update(beat, now) || gone {
            self.pass_due = true;
        }
    }

    /// A heartbeat of a protocol this scheduler cannot read: the node is alive and takes
    /// no job.
    pub(crate) fn on_incompatible_heartbeat(&mut self, now: Timestamp, node: &str, protocol: u32) {
        if self.nodes.mark_incompatible(node, protocol, now) {
            let sender = format!("the agent of node {node}");
            let why = mgpu_protocol::version::incompatibility(&sender, protocol)
                .unwrap_or_else(|| format!("{sender} speaks protocol {protocol}"));
            let said = format!("node gets no jobs: {why}");
            self.out.push(Command::node_log(LogLevel::Warn, node, said));
        }
    }

    /// Whether every stored report was handled, for the jobs a heartbeat no longer listed.
    pub(crate) fn on_reports_caught_up(&mut self, now: Timestamp, op: OpId, caught_up: bool) {
        let Some(Pending::Missing { node, jobs, at }) = self.pending.remove(&op) else {
            return;
        };
        if !caught_up {
            return;
        }
        let why = format!("node {node} no longer runs it (its agent restarted)");
        for (job, attempt) in jobs {
            // Still the attempt the heartbeat missed: a report handled meanwhile ended it.
            if self.runs_attempt(&job, attempt) {
                self.lose_job(now, &job, &why, at, None);
            }
        }
    }

    /// Every second: the usage book stored if a change waits, finished jobs moved to
    /// history, silent nodes acted on.
    pub(crate) fn on_tick(&mut self, now: Timestamp, tick: Tick) {
        self.save_usage(now, false);
        self.save_plan(now);
        self.sweep_history(now, tick.monotonic);
        self.reservation_upkeep(now);
        let released = self.watch.next_release.is_some_and(|t| t <= now)
            || self
                .watch
                .next_release_monotonic
                .is_some_and(|t| t <= tick.monotonic);
        // Our own blindness is not the nodes' silence: a stall of the driver's loop (a write
        // retried through a NATS leader election), or a heartbeat stream that cannot answer,
        // restarts every node's allowance.
        let stalled = self.watch.stalled(tick.monotonic);
        self.monotonic = tick.monotonic;
        if released {
            self.pass_due = true;
        }
        if stalled || !tick.heartbeats_visible {
            self.out.push(Command::log(
                LogLevel::Warn,
                None,
                format!(
                    "could not watch heartbeats for a while (stalled: {stalled}); no node \
                     counts as silent for that time"
                ),
            ));
            self.nodes.blind_until(now);
            return;
        }
        if self.watch.repair_due(tick.monotonic) {
            self.repair_lost_messages(now, tick.reports_caught_up);
        }
        for node in self.nodes.newly_lost(now) {
            self.lose_jobs_of(&node, now);
        }
        self.watch_idle(now);
    }

    /// The running jobs of a node that went offline are lost, and what waits on its
    /// assignment subject is dropped.
    fn lose_jobs_of(&mut self, node: &str, now: Timestamp) {
        self.out.push(Command::PurgeAssignments {
            node: node.to_owned(),
        });
        let mut victims: Vec<JobId> = self
            .jobs
            .running_on(node)
            .filter(|r| matches!(&r.state, JobState::Running(run) if run.placement.uses_node(node)))
            .map(|r| r.id.clone())
            .collect();
        victims.sort_unstable();
        let said = format!(
            "node offline: its running jobs are lost ({})",
            victims.len()
        );
        self.out.push(Command::node_log(LogLevel::Warn, node, said));
        // The node's agent stops its jobs by itself (self-fencing): a requeued job waits
        // until then, so it never runs twice. A job assigned after the node's last heartbeat
        // may have been taken by the agent since (up to the purge, now): counted from now.
        let beat = self.nodes.get(node);
        let last_beat = beat.map(|beat| beat.sent_at);
        let dead_by = beat.and_then(|beat| beat.jobs_dead_by());
        let fence_span = last_beat
            .zip(dead_by)
            .and_then(|(sent, dead_by)| (dead_by - sent).to_std().ok());
        let why = format!("node {node} went offline");
        for job in &victims {
            let assigned_later = self.jobs.get(job).is_some_and(|r| {
                matches!(&r.state, JobState::Running(run)
                    if last_beat.is_none_or(|sent| run.assigned_at > sent))
            });
            let (not_before, since) = match (assigned_later, fence_span) {
                (true, Some(span)) => {
                    let from_now = chrono::Duration::from_std(span).ok().map(|s| now + s);
                    (dead_by.max(from_now), Some(self.monotonic))
                }
                _ => (dead_by, None),
            };
            self.lose_job(now, job, &why, now, not_before);
            if let Some(span) = fence_span {
                self.watch.hold_until_fenced(job.clone(), node, span, since);
            }
        }
        if !victims.is_empty() {
            self.pass_due = true;
        }
    }

    /// An offline node's assignments were dropped; when that failed, the node counts as
    /// newly lost again at the next tick, which asks again.
    pub(crate) fn on_assignments_purged(&mut self, node: &str, purged: bool) {
        if !purged {
            let said =
                "dropping the assignments waiting for this offline node failed: trying again";
            self.out
                .push(Command::node_log(LogLevel::Error, node, said));
            self.nodes.forget_lost(node);
        }
    }

    /// Reports handed to an earlier scheduler come again within the ack wait: no node counts
    /// as silent before then.
    pub(crate) fn await_redelivered_reports(&mut self, now: Timestamp) {
        let wait =
            chrono::Duration::from_std(ACK_WAIT).unwrap_or_else(|_| chrono::Duration::zero());
        self.nodes.blind_until(now + wait);
        let said = format!(
            "agents' reports handed to an earlier scheduler were never acknowledged; they come \
             again within {ACK_WAIT:?}, and no node counts as silent until then"
        );
        self.out.push(Command::log(LogLevel::Warn, None, said));
    }

    /// A running job whose node lost it (see the lifecycle's `NodeLost`); or, when the
    /// exit report of its attempt came and only its record could not be stored, the exit.
    fn lose_job(
        &mut self,
        now: Timestamp,
        job: &JobId,
        why: &str,
        at: Timestamp,
        not_before: Option<Timestamp>,
    ) {
        if let Some(report) = self.unsettled_exits.remove(job)
            && self.runs_attempt(job, report.attempt)
        {
            let said = format!("{why}, after its exit report came: the exit stands");
            self.out.push(Command::log(LogLevel::Info, Some(job), said));
            self.apply(now, job, Input::Report(report), Origin::Scheduler, None);
            return;
        }
        let input = Input::NodeLost {
            why: why.to_owned(),
            at,
            not_before,
        };
        self.apply(now, job, input, Origin::Scheduler, None);
    }

    /// Sends again what may have been lost on the way: assignments not confirmed within
    /// [`REPAIR_EVERY`] (twelve times that while agents' reports wait to be read: a
    /// `started` may be among them), and kills for jobs still running although a cancel or
    /// preemption was recorded.
    fn repair_lost_messages(&mut self, now: Timestamp, reports_caught_up: bool) {
        let wait = if reports_caught_up {
            REPAIR_EVERY
        } else {
            REPAIR_EVERY * 12
        };
        let age = chrono::Duration::from_std(wait).unwrap_or_else(|_| chrono::Duration::zero());
        self.resend_assignments_older_than(now, age);
        let mut pending: Vec<(JobId, u32, _, _)> = self
            .jobs
            .running()
            .filter_map(|record| {
                pending_stop(record).map(|(attempt, placement, control)| {
                    (record.id.clone(), attempt, placement, control)
                })
            })
            .collect();
        pending.sort_by(|a, b| a.0.cmp(&b.0));
        for (job, attempt, placement, control) in pending {
            if self.watch.stop_due((job.clone(), attempt), self.monotonic) {
                let commands = controls_to_job(&job, &placement, &control, None, false);
                self.out.extend(commands);
            }
        }
        let jobs = &self.jobs;
        self.watch.forget_stops(|job| {
            matches!(jobs.get(job).map(|r| &r.state), Some(JobState::Running(_)))
        });
    }

    /// Assignments recorded at least `age` ago and not confirmed go out again (the message id
    /// lets JetStream drop a copy, and an agent never runs an attempt twice). After a
    /// restart, with `age` zero: every one not confirmed. A multi-node job whose every rank
    /// has not started yet counts as unconfirmed too (one rank's assignment may have been
    /// purged with its silent node, which came back).
    pub fn resend_assignments_older_than(&mut self, now: Timestamp, age: chrono::Duration) {
        let mut unconfirmed: Vec<&JobRecord> = self
            .jobs
            .running()
            .filter(|r| {
                matches!(&r.state, JobState::Running(run)
                    if !every_rank_started(run) && now - run.assigned_at >= age)
            })
            .collect();
        unconfirmed.sort_by(|a, b| a.id.cmp(&b.id));
        let commands: Vec<Command> = unconfirmed
            .into_iter()
            .flat_map(|record| {
                let said = "re-sending an unconfirmed assignment";
                [
                    Some(Command::log(LogLevel::Info, Some(&record.id), said)),
                    self.assignment_of(record),
                ]
            })
            .flatten()
            .collect();
        self.out.extend(commands);
    }

    /// Attempts the node runs that it should not: kill them there.
    fn kill_stale_attempts(&mut self, beat: &NodeHeartbeat) {
        for running in &beat.running {
            let record = self.jobs.get(&running.id);
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
            if current || ended_after_beat || !self.watch.kill_due(&key, self.monotonic) {
                continue;
            }
            let said = format!(
                "stale attempt still running: killing it (attempt {} on node {})",
                running.attempt, beat.node
            );
            self.out
                .push(Command::log(LogLevel::Warn, Some(&running.id), said));
            self.out
                .push(stale_kill(&beat.node, &running.id, running.attempt));
            self.watch.kill_sent(key, self.monotonic);
        }
    }

    /// Jobs (and their attempts) recorded as started on the beat's node that it no longer
    /// lists: lost with its agent (once the beat is surely later than their start).
    fn missing_jobs(&self, beat: &NodeHeartbeat) -> Vec<(JobId, u32)> {
        // Checked: heartbeats are validated, but chrono panics on overflow, so never risk it.
        let margin = i64::try_from(beat.interval_ms)
            .ok()
            .and_then(|ms| chrono::Duration::try_milliseconds(ms.saturating_mul(2)))
            .unwrap_or(chrono::Duration::MAX);
        let mut missing: Vec<(JobId, u32)> = self
            .jobs
            .running_on(&beat.node)
            .filter(|r| started_and_missing(r, beat, margin))
            .map(|r| (r.id.clone(), r.attempt))
            .collect();
        missing.sort_unstable();
        missing
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
    // A distributed job's ranks start apart: counted from the latest one's start.
    run.placement.launches_on(&beat.node)
        && started_here
        && run
            .last_rank_started_at
            .or(run.started_at)
            .and_then(|s| s.checked_add_signed(margin))
            .is_some_and(|deadline| beat.sent_at > deadline)
        && !beat
            .running
            .iter()
            .any(|j| j.id == record.id && j.attempt == record.attempt)
}

/// Whether every launched rank of a run started (a one-node run: its process did).
fn every_rank_started(run: &mgpu_protocol::job::Run) -> bool {
    let ranks = run.placement.launched_ranks();
    match ranks.len() {
        0 | 1 => run.started_at.is_some(),
        _ => ranks
            .iter()
            .all(|(rank, _)| run.ranks_started.contains(rank) || run.ranks_done.contains(rank)),
    }
}
