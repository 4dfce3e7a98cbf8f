//! Idle GPUs: what an agent measures of a job's GPU use (how long it has been idle without a
//! break, and its idle GPU-time in all), and the notices the scheduler sends a job's owner
//! on `users.<key>.notices` when its `[idle]` policy warns about, or reclaims, a job. The
//! same [`Notice`] carries what `mgpu-notify` tells owners of other moments (`--notify`,
//! see [`crate::notify`]): one subject and one type for every notice a user follows.
//!
//! A job is idle while every GPU it holds is below the threshold the scheduler sends with its
//! assignment (`Assignment::idle_below_pct`, the policy's `min_util`) and its memory on them
//! does not grow by more than [`IDLE_MEMORY_GROWTH_MIB`] over the stretch: a job loading data
//! onto its GPU is working even at 0 % compute.

use serde::{Deserialize, Serialize};

use crate::Timestamp;
use crate::error::InvalidInput;
use crate::ids::JobId;

/// The utilisation (percent) below which a GPU counts as idle where the scheduler has no
/// `[idle]` policy: idle GPU-hours are accounted for all the same.
pub const DEFAULT_IDLE_BELOW_PCT: u32 = 5;

/// How much a job's GPU memory may grow (MiB) during an idle stretch before the stretch
/// counts as work and ends.
pub const IDLE_MEMORY_GROWTH_MIB: u64 = 256;

/// A running job's idleness, as its agent measured it: in each heartbeat's `running` entry,
/// and (its total) in the job's usage when it ends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdleSample {
    /// How long the job has been idle without a break, in seconds (0 while it works).
    pub idle_for_secs: u64,
    /// GPU-seconds its GPUs spent idle since the attempt started (a GPU held idle for an hour
    /// is 3 600; a half share of one, 1 800).
    pub idle_gpu_secs: u64,
}

impl IdleSample {
    /// Refuses what no agent could have measured: more than a year idle.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        const YEAR_SECS: u64 = 366 * 24 * 3600;
        if self.idle_for_secs > YEAR_SECS || self.idle_gpu_secs > YEAR_SECS.saturating_mul(4096) {
            return Err(InvalidInput::new(format!(
                "idle for {} s, {} idle GPU-seconds is not plausible",
                self.idle_for_secs, self.idle_gpu_secs
            )));
        }
        Ok(())
    }
}

/// What the `[idle]` policy does to a job idle past its warning's grace, while another job
/// waits for its GPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdleAction {
    /// Stop it (with its `--signal` warning and grace, like a preemption) and queue it again.
    #[default]
    Requeue,
    /// End it as cancelled.
    Cancel,
    /// Only warn its owner.
    Warn,
}

impl IdleAction {
    pub fn as_str(self) -> &'static str {
        match self {
            IdleAction::Requeue => "requeue",
            IdleAction::Cancel => "cancel",
            IdleAction::Warn => "warn",
        }
    }
}

/// The scheduler's `[idle]` policy: a job idle for `after_secs` is warned; `grace_secs` later,
/// while another job waits for its GPUs, `action` is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdlePolicy {
    pub after_secs: u64,
    /// Utilisation (percent) below which a GPU counts as idle.
    pub min_util_pct: u32,
    pub grace_secs: u64,
    pub action: IdleAction,
}

impl Default for IdlePolicy {
    fn default() -> Self {
        IdlePolicy {
            after_secs: 2 * 3600,
            min_util_pct: DEFAULT_IDLE_BELOW_PCT,
            grace_secs: 30 * 60,
            action: IdleAction::Requeue,
        }
    }
}

/// A running job's idle warning, kept in its run's record (`mgpu show`, `mgpu top`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdleWarning {
    /// Since when its GPUs have been idle (as its agent measured).
    pub idle_since: Timestamp,
    /// When its owner was warned.
    pub warned_at: Timestamp,
    /// What happens after the grace, if someone waits for its GPUs.
    pub action: IdleAction,
    /// From when the action may be taken.
    pub action_from: Timestamp,
}

/// What a notice on `users.<key>.notices` tells.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum NoticeKind {
    /// The job has been idle long enough to be warned.
    IdleWarning { warning: IdleWarning },
    /// The job worked again: the warning is withdrawn.
    IdleCleared,
    /// The job was idle past its grace while someone waited: `action` was taken.
    IdleReclaimed { action: IdleAction, for_job: JobId },
    /// Attempt `attempt` started on `node` (`--notify start`; sent by `mgpu-notify`).
    Started { attempt: u32, node: String },
    /// The job ended in `state` (`--notify end`, and `fail` unless it succeeded).
    Ended {
        state: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Attempt `attempt` was stopped to make room and the job queued again (`--notify
    /// preempt`).
    Preempted { attempt: u32 },
    /// Attempt `attempt` has run 80 % of its time limit (`--notify time80`).
    TimeLimit80 { attempt: u32, limit_secs: u64 },
    /// Every task of array `array_id` ended: one summary in place of a notice per task.
    ArrayEnded {
        array_id: JobId,
        tasks: u32,
        succeeded: u32,
        failed: u32,
        /// Cancelled, timed out, lost with their node.
        other: u32,
    },
    /// `mgpu notify test`: goes to every destination of its sender.
    Test,
    /// Reservation `name` can no longer be honoured in full: `node` went down.
    ReservationAtRisk { name: String, node: String },
    /// Reservation `name` gave its GPUs back: no job of it ran `after_secs` into its window.
    ReservationReleased { name: String, after_secs: u64 },
}

/// One notice to a user about one of their jobs, or one of their reservations (not
/// `deny_unknown_fields`, which serde does not support beside a flattened field).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    /// The job it is about; None for a notice about a reservation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobId>,
    /// When the scheduler sent it.
    pub at: Timestamp,
    /// In words, for a person (`mgpu watch`, a chat bridge).
    pub message: String,
    #[serde(flatten)]
    pub kind: NoticeKind,
}

impl Notice {
    /// What it is about in a few words: `job 4f2a1b2c3d`, `reservation deadline`.
    pub fn about(&self) -> String {
        match (&self.job, &self.kind) {
            (Some(job), _) => format!("job {}", job.short()),
            (
                None,
                NoticeKind::ReservationAtRisk { name, .. }
                | NoticeKind::ReservationReleased { name, .. },
            ) => format!("reservation {name}"),
            (None, _) => "mgpu".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_reads_back_as_written_with_its_kind_flattened() {
        let notice = Notice {
            job: Some(JobId::random()),
            at: chrono::Utc::now(),
            message: "idle".to_owned(),
            kind: NoticeKind::IdleReclaimed {
                action: IdleAction::Requeue,
                for_job: JobId::random(),
            },
        };
        let text = serde_json::to_string(&notice).unwrap_or_default();
        assert!(text.contains("\"kind\":\"idle_reclaimed\""), "{text}");
        let back: Option<Notice> = serde_json::from_str(&text).ok();
        assert_eq!(back, Some(notice));
    }

    #[test]
    fn a_year_of_idleness_is_refused() {
        let absurd = IdleSample {
            idle_for_secs: 400 * 24 * 3600,
            idle_gpu_secs: 0,
        };
        assert!(absurd.validate().is_err());
        assert!(IdleSample::default().validate().is_ok());
    }
}
