//! Job state transitions, published on `jobs.<id>.events` and kept in `MGPU_EVENTS`.
//!
//! Agents report what happened to a process (`started`, `exited`, `failed_to_start`); the
//! scheduler consumes those durably and publishes the state changes it records.

use serde::{Deserialize, Serialize};

use crate::Timestamp;
use crate::error::InvalidInput;
use crate::ids::JobId;
use crate::job::{Placement, WaitReason};
use crate::wire::{MAX_TEXT_BYTES, check_line, check_text};

/// Who published an event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "kind",
    content = "name",
    rename_all = "snake_case",
    deny_unknown_fields
)]
pub enum EventSource {
    Scheduler,
    Node(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
// Unknown fields are denied here rather than on `JobEvent`, where `flatten` would make the
// attribute refuse every event: the outer fields are taken first, the rest must fit a variant.
#[serde(tag = "event", rename_all = "snake_case", deny_unknown_fields)]
pub enum JobEventKind {
    /// The scheduler accepted the job.
    Queued { reason: WaitReason },
    /// The scheduler placed the job and sent it to the node.
    Assigned { placement: Placement },
    /// The agent started the process.
    Started { pid: u32 },
    /// The agent could not start the process (workdir missing, no shell…).
    FailedToStart { error: String },
    /// The process ended. `cancelled` is true when it was killed on request.
    Exited {
        exit_code: i32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
        #[serde(default)]
        cancelled: bool,
        #[serde(default)]
        timed_out: bool,
        /// Stopped by a Kill with `requeue`: it goes back to the queue.
        #[serde(default)]
        preempted: bool,
        /// Found still running by a restarted agent, which could no longer stream its output
        /// and so stopped it: treated like a lost node (requeued unless `--no-requeue`).
        #[serde(default)]
        lost: bool,
        /// The kernel killed a process of the job because its cgroup was over `--mem-host`.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        out_of_memory: bool,
        /// What the attempt used, measured by its node.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<crate::host::JobUsage>,
    },
    /// The scheduler recorded the job as finished in this state.
    Finished {
        state: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// The scheduler refused the submission.
    Rejected { reason: String },
    /// The scheduler refused a request about the job (`cancel`, `hold`, `release`): not
    /// signed, forged, replayed, or not the owner's.
    Refused { action: String, reason: String },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobEvent {
    pub job_id: JobId,
    pub attempt: u32,
    pub at: Timestamp,
    pub source: EventSource,
    #[serde(flatten)]
    pub kind: JobEventKind,
}

impl JobEvent {
    /// Checks an agent's report received at `now`: the node's name, a time near `now` (it
    /// becomes a job's start or end time), bounded texts and a plausible placement.
    pub fn validate(&self, now: Timestamp) -> Result<(), InvalidInput> {
        if let EventSource::Node(node) = &self.source {
            crate::ids::validate_node_name(node)?;
        }
        crate::wire::check_time("event time", self.at, now)?;
        match &self.kind {
            JobEventKind::Assigned { placement } => placement.validate(),
            JobEventKind::FailedToStart { error } => check_text("error", error, MAX_TEXT_BYTES),
            JobEventKind::Finished { state, reason, .. } => {
                check_line("state", state, 64)?;
                reason
                    .as_deref()
                    .map_or(Ok(()), |r| check_text("reason", r, MAX_TEXT_BYTES))
            }
            JobEventKind::Rejected { reason } => check_text("reason", reason, MAX_TEXT_BYTES),
            JobEventKind::Refused { action, reason } => {
                check_line("action", action, 64)?;
                check_text("reason", reason, MAX_TEXT_BYTES)
            }
            JobEventKind::Exited { usage, .. } => usage.as_ref().map_or(Ok(()), |u| u.validate()),
            JobEventKind::Queued { .. } | JobEventKind::Started { .. } => Ok(()),
        }
    }
}
