//! A job's lifecycle: why it waits, how it runs, how it ended.

use super::*;

/// Why a queued job is not running yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitReason {
    /// Submitted; the scheduler has not looked at it yet (it may be stopped).
    Submitted,
    /// Not enough free GPUs, GPU memory, CPU cores or host memory on any node right now (the
    /// text says GPUs, the usual case; scripts match it).
    Resources,
    /// No node is online.
    NoNodes,
    /// Jobs ahead of it in line hold a reservation on the GPUs it could use.
    Priority,
    /// Waiting for the jobs named in `--after` / `--after-any`.
    Dependency,
    /// Held with `mgpu hold`; `mgpu release` lets it go.
    Held,
    /// The only GPUs that could take it are paused or their nodes drained.
    GpusPaused,
    /// The only GPUs that could take it are busy with processes mgpu did not start (above the
    /// node's memory or load threshold).
    GpusBusy,
    /// As many tasks of its array run as `%N` allows.
    ArrayLimit,
    /// Starting it would take its owner past their `max_gpus_running` limit (the scheduler's
    /// `[limits]`); it starts when their running jobs end or the limit is raised.
    UserLimit,
    /// Its node went silent while it ran: it waits until that node's agent has surely
    /// stopped the old attempt (its `--fence-after` plus kill grace), so it never runs twice.
    Fencing,
    /// A GPU type it lists first (`--gpu-type h100,a100`) is expected free soon: it waits for
    /// it a while rather than take the next type, free now.
    PreferredType,
    /// It runs in a reservation (`--reservation`) whose window has not opened yet.
    ReservationWindow,
    /// The only GPUs that could take it are booked by a reservation it is not in (or its
    /// time limit does not end before the window opens).
    Reserved,
}

impl WaitReason {
    pub fn describe(self) -> &'static str {
        match self {
            WaitReason::Submitted => "waiting for the scheduler to look at it",
            WaitReason::Resources => "waiting for GPUs to become free",
            WaitReason::NoNodes => "waiting for a node to come online",
            WaitReason::Priority => "waiting behind a higher-priority job's reservation",
            WaitReason::Dependency => "waiting for the jobs it depends on",
            WaitReason::Held => "held: `mgpu release` lets it run",
            WaitReason::GpusPaused => "waiting: the GPUs it could use are paused or drained",
            WaitReason::GpusBusy => {
                "waiting: the GPUs it could use are busy with work outside mgpu"
            }
            WaitReason::ArrayLimit => "waiting: its array runs as many tasks as allowed",
            WaitReason::UserLimit => {
                "waiting: its owner runs as many GPUs as their max_gpus_running limit allows"
            }
            WaitReason::Fencing => {
                "waiting until its lost node has surely stopped the previous attempt"
            }
            WaitReason::PreferredType => {
                "waiting a while for a GPU of a type it prefers, expected free soon"
            }
            WaitReason::ReservationWindow => "waiting for its reservation's window to open",
            WaitReason::Reserved => "waiting: the GPUs it could use are booked by a reservation",
        }
    }
}

/// A queued job's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiting {
    pub reason: WaitReason,
    /// Who holds it (`mgpu hold`), if anyone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
    /// When it (re-)entered the queue; a requeued job goes to the back. None: `submitted_at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enqueued_at: Option<Timestamp>,
    /// Not to start before then: the node that lost its previous attempt is silent, and its
    /// agent stops the attempt by this time (self-fencing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<Timestamp>,
    /// Why its previous attempt stopped (`preempted by 4f2a1b2c3d (bob)`); None before a
    /// first attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_stop: Option<String>,
}

impl Waiting {
    pub fn new(reason: WaitReason) -> Self {
        Waiting {
            reason,
            held_by: None,
            enqueued_at: None,
            not_before: None,
            previous_stop: None,
        }
    }
}

/// A running job's state: assigned to a node, started once the agent confirms.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    pub placement: Placement,
    pub assigned_at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Set once a cancel was asked for and sent to the node; the job ends as cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_requested_by: Option<String>,
    /// Set once its time slice ended while others waited and a requeue kill was sent.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preempt_requested: bool,
    /// Ranks of a multi-node job whose process started.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks_started: Vec<u32>,
    /// Ranks of a distributed job whose process already exited successfully.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks_done: Vec<u32>,
    /// When the latest of a distributed job's ranks started: a heartbeat sent before then
    /// may not list that rank yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rank_started_at: Option<Timestamp>,
    /// The job it is being stopped for (`4f2a1b2c3d (bob)`), when a job of a class that may
    /// preempt takes its room.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempted_for: Option<String>,
    /// The warning its stop carries (sent again, the same, until it stopped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_warning: Option<crate::stop::StopWarning>,
    /// Why its previous attempt stopped, as its queued record said (for the line before
    /// this attempt's output).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_stop: Option<String>,
    /// Set while its owner is warned that its GPUs sit idle (the scheduler's `[idle]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_warning: Option<crate::idle::IdleWarning>,
}

impl Run {
    /// A fresh run on `placement`, assigned at `at`.
    pub fn assigned(placement: Placement, at: Timestamp) -> Self {
        Run {
            placement,
            assigned_at: at,
            started_at: None,
            pid: None,
            cancel_requested_by: None,
            preempt_requested: false,
            ranks_started: Vec::new(),
            ranks_done: Vec::new(),
            last_rank_started_at: None,
            preempted_for: None,
            stop_warning: None,
            previous_stop: None,
            idle_warning: None,
        }
    }
}

/// How a finished job ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ending {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    pub ended_at: Timestamp,
    /// The process's exit status; 128 + N when signal N killed it (the shell's convention).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What its last attempt used (peak host memory, CPU time, peak GPU memory), as its node
    /// measured it; None where nothing was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::host::JobUsage>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum JobState {
    Queued(Waiting),
    Running(Run),
    Succeeded(Ending),
    Failed(Ending),
    Cancelled(Ending),
    /// Stopped at its time limit with `--on-timeout fail`.
    TimedOut(Ending),
    /// Its node was lost while it ran, and it was not requeued (`--no-requeue`, or too many
    /// attempts).
    NodeFailed(Ending),
}

impl JobState {
    pub fn name(&self) -> &'static str {
        match self {
            JobState::Queued(_) => "queued",
            JobState::Running(_) => "running",
            JobState::Succeeded(_) => "succeeded",
            JobState::Failed(_) => "failed",
            JobState::Cancelled(_) => "cancelled",
            JobState::TimedOut(_) => "timed_out",
            JobState::NodeFailed(_) => "node_failed",
        }
    }

    pub fn is_finished(&self) -> bool {
        matches!(
            self,
            JobState::Succeeded(_)
                | JobState::Failed(_)
                | JobState::Cancelled(_)
                | JobState::TimedOut(_)
                | JobState::NodeFailed(_)
        )
    }

    pub fn placement(&self) -> Option<&Placement> {
        match self {
            JobState::Queued(_) => None,
            JobState::Running(run) => Some(&run.placement),
            JobState::Succeeded(end)
            | JobState::Failed(end)
            | JobState::Cancelled(end)
            | JobState::TimedOut(end)
            | JobState::NodeFailed(end) => end.placement.as_ref(),
        }
    }

    pub fn ending(&self) -> Option<&Ending> {
        match self {
            JobState::Succeeded(end)
            | JobState::Failed(end)
            | JobState::Cancelled(end)
            | JobState::TimedOut(end)
            | JobState::NodeFailed(end) => Some(end),
            _ => None,
        }
    }
}
