//! What the scheduler sends to agents about a job, decided here: an assignment per launched
//! rank (the spec with the hard time limit the agent enforces, whose signed input the job
//! takes, the Unix account it runs as, where its output goes, the message id that lets
//! JetStream drop a copy sent again), and kills (for an attempt's ranks, and for stale
//! attempts a node should not run).

use mgpu_protocol::assign::{Assignment, NodeControl};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState, Placement};
use mgpu_protocol::subjects;

use super::SchedulerState;
use super::messages::{Command, RankAssignment};
use crate::lifecycle::{self, Kill};
use crate::time_limits::agent_limit_secs;

/// Why a stale attempt is killed.
pub(crate) const STALE_ATTEMPT: &str = "stale attempt: this job was requeued or ended elsewhere";

impl SchedulerState {
    /// A running job's assignments, every launched rank's (none for a job not running).
    pub(crate) fn assignment_of(&self, record: &JobRecord) -> Option<Command> {
        let JobState::Running(run) = &record.state else {
            return None;
        };
        let mut spec = record.spec.clone();
        spec.time_limit_secs = agent_limit_secs(&self.policy, &record.spec);
        // A limit shorter than the job asked (the cluster's cap) leaves a warning time the
        // agent would refuse the assignment for: warned a second before, at the latest.
        if let (Some(signal), Some(limit)) = (spec.signal.as_mut(), spec.time_limit_secs)
            && signal.seconds >= limit
        {
            signal.seconds = limit.saturating_sub(1);
        }
        // Kept apart from the record: the driver fetches it under its owner's key.
        let env_owner = spec
            .private_env
            .then(|| subjects::history_owner(record).to_owned());
        // Input is accepted from the owner's key and admins'; jobs run as the owner's account.
        let mut input_keys: Vec<String> = record.user_key.iter().cloned().collect();
        input_keys.extend(self.admin_keys().cloned());
        input_keys.dedup();
        let unix_user = self
            .user_by_name(&record.user)
            .map(|p| p.unix_account().to_owned());
        let output_subject = record
            .spec
            .private_output
            .then(|| subjects::output_of(record));
        // Every rank that runs a process gets its own assignment; all are recorded before
        // any is sent (the record), so a job is never half-placed.
        // Measured with or without an `[idle]` policy: idle GPU-hours are accounted anyway.
        let idle_below_pct = self
            .policy
            .idle
            .map_or(mgpu_protocol::idle::DEFAULT_IDLE_BELOW_PCT, |policy| {
                policy.min_util_pct
            });
        let ranks = run
            .placement
            .launched_ranks()
            .into_iter()
            .map(|(rank, node)| RankAssignment {
                node: node.to_owned(),
                msg_id: if rank == 0 {
                    format!("{}-{}", record.id, record.attempt)
                } else {
                    format!("{}-{}-{rank}", record.id, record.attempt)
                },
                assignment: Assignment {
                    job_id: record.id.clone(),
                    attempt: record.attempt,
                    user: record.user.clone(),
                    spec: spec.clone(),
                    placement: run.placement.clone(),
                    rank,
                    input_keys: input_keys.clone(),
                    unix_user: unix_user.clone(),
                    output_subject: output_subject.clone(),
                    previous_stop: run.previous_stop.clone(),
                    idle_below_pct: Some(idle_below_pct),
                },
            })
            .collect();
        Some(Command::Assign {
            job: record.id.clone(),
            env_owner,
            ranks,
        })
    }
}

/// A lifecycle kill as control messages, one to each node where a rank of the attempt runs
/// (but the one it excepts).
pub(crate) fn kill_commands(job: &JobId, kill: &Kill) -> Vec<Command> {
    let control = NodeControl::Kill {
        job_id: job.clone(),
        attempt: kill.attempt,
        reason: kill.reason.clone(),
        requeue: kill.requeue,
        warning: kill.warning,
    };
    controls_to_job(
        job,
        &kill.placement,
        &control,
        kill.except.as_deref(),
        !kill.best_effort,
    )
}

/// `control` to every node where a process of the job runs, but `except`.
pub(crate) fn controls_to_job(
    job: &JobId,
    placement: &Placement,
    control: &NodeControl,
    except: Option<&str>,
    required: bool,
) -> Vec<Command> {
    placement
        .launched_ranks()
        .into_iter()
        .filter(|(_, node)| except != Some(*node))
        .map(|(_, node)| Command::Control {
            job: job.clone(),
            node: node.to_owned(),
            control: control.clone(),
            required,
        })
        .collect()
}

/// A kill for an attempt `node` runs that it should not (fencing).
pub(crate) fn stale_kill(node: &str, job: &JobId, attempt: u32) -> Command {
    Command::Control {
        job: job.clone(),
        node: node.to_owned(),
        control: NodeControl::Kill {
            job_id: job.clone(),
            attempt,
            reason: STALE_ATTEMPT.into(),
            requeue: false,
            warning: None,
        },
        required: false,
    }
}

/// The kill a running job still needs when a cancel or preemption was recorded for it.
pub(crate) fn pending_stop(record: &JobRecord) -> Option<(u32, Placement, NodeControl)> {
    let JobState::Running(run) = &record.state else {
        return None;
    };
    if run.cancel_requested_by.is_none() && !run.preempt_requested {
        return None;
    }
    let control = NodeControl::Kill {
        job_id: record.id.clone(),
        attempt: record.attempt,
        reason: match (&run.cancel_requested_by, &run.preempted_for) {
            (Some(by), _) => format!("cancelled by {by}"),
            (None, Some(preemptor)) => format!("preempted by {preemptor}: back to the queue"),
            (None, None) => lifecycle::SLICE_OVER.into(),
        },
        requeue: run.cancel_requested_by.is_none(),
        // The same warning again: an agent already warning the job changes nothing.
        warning: run
            .stop_warning
            .filter(|_| run.cancel_requested_by.is_none()),
    };
    Some((record.attempt, run.placement.clone(), control))
}

/// The rendezvous port of a multi-node job: derived from its id so every rank agrees without
/// asking, and spread over a range torchrun and MPI leave free by default.
pub(crate) fn master_port(job: &JobId) -> u16 {
    let hash = job
        .as_str()
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    29_500 + (hash % 20_000) as u16
}
