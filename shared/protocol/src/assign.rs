//! Scheduler → agent messages, on `nodes.assign.<node>` and `nodes.control.<node>`.

use serde::{Deserialize, Serialize};

use crate::error::InvalidInput;
use crate::ids::JobId;
use crate::job::{JobSpec, Placement};

/// Run this attempt of this job on these GPUs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Assignment {
    pub job_id: JobId,
    pub attempt: u32,
    pub user: String,
    pub spec: JobSpec,
    pub placement: Placement,
    /// Which of the job's nodes this assignment is for (0 for a one-node job).
    #[serde(default)]
    pub rank: u32,
    /// Public keys whose signed input the job accepts (its owner, and admins).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub input_keys: Vec<String>,
    /// The Unix account the job runs as, where the agent runs as root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unix_user: Option<String>,
    /// Where the job's output goes when it is private (`users.<owner key>.jobs.<id>.output`);
    /// None: the public `jobs.<id>.output`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_subject: Option<String>,
    /// Why the job's previous attempt stopped (`preempted by 4f2a… (bob)`), for the line the
    /// agent writes before this attempt's output; None for a first attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_stop: Option<String>,
    /// The utilisation (percent) below which the job's GPUs count as idle (the scheduler's
    /// `[idle] min_util`); None: the agent measures no idleness for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_below_pct: Option<u32>,
}

impl Assignment {
    /// The subject the job's output goes to.
    pub fn output_subject(&self) -> String {
        self.output_subject
            .clone()
            .unwrap_or_else(|| crate::subjects::output(&self.job_id))
    }
}

/// Control messages for a node's agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum NodeControl {
    /// Stop a job attempt: SIGTERM to its process group, SIGKILL after the grace period.
    Kill {
        job_id: JobId,
        attempt: u32,
        reason: String,
        /// The job is being put back in the queue (its time slice ended while others wait),
        /// not cancelled: the agent reports `preempted` instead of `cancelled`.
        #[serde(default)]
        requeue: bool,
        /// Warn the job first (its `--signal`, its stop file), SIGTERM only after the grace.
        /// Absent: SIGTERM at once. Agents older than the field refuse a kill carrying it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        warning: Option<crate::stop::StopWarning>,
    },
}

impl Assignment {
    /// What an agent checks before running anything: a real attempt, a user name, a spec
    /// that passes [`JobSpec::validate`] (a time limit of 100 years would overflow the
    /// agent's clock arithmetic), a valid placement and a rank inside it.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        if self.attempt == 0 {
            return Err(InvalidInput::new(
                "attempt 0 does not exist (attempts start at 1)",
            ));
        }
        crate::wire::check_user("user", &self.user)?;
        self.spec.validate()?;
        self.placement.validate()?;
        if self.rank as usize >= self.placement.node_count() {
            return Err(InvalidInput::new(format!(
                "rank {} of a job on {} node(s)",
                self.rank,
                self.placement.node_count()
            )));
        }
        if let Some(subject) = &self.output_subject {
            let wanted = format!(".jobs.{}.output", self.job_id);
            let owner = subject
                .strip_prefix("users.")
                .and_then(|rest| rest.strip_suffix(&wanted));
            let valid = owner.is_some_and(|key| {
                !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric())
            });
            if !valid {
                return Err(InvalidInput::new(format!(
                    "output subject `{subject}` is not users.<key>{wanted}"
                )));
            }
        }
        if let Some(why) = &self.previous_stop {
            crate::wire::check_count(
                "bytes of the previous attempt's stop",
                why.len(),
                crate::wire::MAX_TEXT_BYTES,
            )?;
        }
        Ok(())
    }
}

impl NodeControl {
    /// Checks a control message. A kill is never refused for its wording: only the attempt
    /// and the size of the reason are checked (a refused kill would leave a job running); an
    /// agent bounds a warning's signal and grace itself.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        match self {
            NodeControl::Kill {
                attempt, reason, ..
            } => {
                if *attempt == 0 {
                    return Err(InvalidInput::new("attempt 0 does not exist"));
                }
                crate::wire::check_count(
                    "bytes of reason",
                    reason.len(),
                    crate::wire::MAX_TEXT_BYTES,
                )
            }
        }
    }
}
