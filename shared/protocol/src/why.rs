//! `mgpu why`: the question a user asks the active scheduler about one job on
//! [`crate::subjects::SCHEDULER_WHY`] (a signed request: owners ask about their own jobs,
//! admins about any), and its answer: one cause per line, with the numbers behind it.

use serde::{Deserialize, Serialize};

use crate::ids::JobId;
use crate::plan::ExpectedStart;

/// What is asked: the job, by full id (the CLI resolves a prefix first).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WhyRequest {
    pub job: JobId,
}

/// The scheduler's answer: why the job is where it is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WhyAnswer {
    pub job: JobId,
    /// Its state's name (`queued`, `running`, `succeeded`…).
    pub state: String,
    /// Where it stands in the queue's order (1: next), and how many wait; None unless queued.
    pub position: Option<usize>,
    pub queued: usize,
    pub effective_priority: Option<i64>,
    pub expected_start: Option<ExpectedStart>,
    /// One cause per line, the main one first.
    pub causes: Vec<Cause>,
}

/// One reason the job waits (or does not).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cause {
    pub kind: CauseKind,
    /// The cause in words, with its numbers.
    pub text: String,
    /// The other jobs it names, as `mgpu queue` shows them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<JobRef>,
}

/// What kind of cause a line is, for scripts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CauseKind {
    /// It does not wait: it runs, or ended.
    NotWaiting,
    Held,
    Dependency,
    ArrayLimit,
    UserLimit,
    /// Jobs ahead of it hold reservations on GPUs it could use.
    JobsAhead,
    /// The GPU types or node features it asks for that no node has free.
    NoFreeGpus,
    /// Its place in line: effective priority, age and fair share.
    FairShare,
    /// When its GPUs free up, by the time limits of the jobs on them.
    ExpectedStart,
    /// A reservation: the one it runs in has not opened, or the GPUs it could use are booked.
    Reservation,
    /// Any other wait reason, in words.
    Other,
}

/// Another job as a cause names it: what `mgpu queue` shows of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobRef {
    pub id: JobId,
    pub user: String,
    pub state: String,
    /// Its effective priority, while it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_priority: Option<i64>,
}
