//! `jobs.submit`: what `mgpu submit` publishes and the scheduler records as a new job.

use serde::{Deserialize, Serialize};

use crate::error::InvalidInput;
use crate::ids::JobId;
use crate::job::JobSpec;

/// The header of a submission naming where its submitter waits for the scheduler's verdict:
/// a subject under the submitter's own inbox (`_INBOX.<their key>.…`); anything else is
/// ignored, so the scheduler cannot be made to write to someone else.
pub const VERDICT_HEADER: &str = "Mgpu-Verdict-To";

/// The scheduler's word on a submission, sent once the job's record is stored: whether it
/// will run it, or why never.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitVerdict {
    pub job: JobId,
    /// Why it will never run (over a limit, asks what no node has); None: queued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// Whether `to` is a place `signer` may be sent a verdict: under their own inbox.
pub fn verdict_subject_of(signer: &str, to: &str) -> bool {
    let prefix = crate::principals::inbox_prefix(signer);
    to.strip_prefix(&prefix).is_some_and(|rest| {
        rest.len() > 1
            && rest.starts_with('.')
            && rest.len() <= 128
            && rest
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_')
            && !rest.contains("..")
    })
}

/// Largest accepted submission, headers aside: a command plus a captured environment fit easily.
pub const MAX_SUBMIT_BYTES: usize = 256 * 1024;

/// Payload of `jobs.submit`. The message's `Nats-Msg-Id` header is the job id, so a
/// submission retried after a lost acknowledgement is stored once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    pub id: JobId,
    /// The submitting user's name.
    pub user: String,
    pub spec: JobSpec,
}

/// Several submissions in one message on `jobs.submit` (protocol 2,
/// [`crate::version::ARRAY_BATCHES`]; the CLI sends an array's tasks so): each is recorded,
/// refused and answered as a submission of its own would be, and the message is
/// acknowledged once every one of them is. Its
/// `Nats-Msg-Id` begins with [`BATCH_MSG_ID_PREFIX`] and its first task's id (the CLI adds a
/// hash of all its tasks' ids).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitBatch {
    pub tasks: Vec<SubmitRequest>,
}

/// Tasks the CLI puts in one [`SubmitBatch`] at most (fewer when they would pass
/// [`MAX_SUBMIT_BYTES`]).
pub const MAX_BATCH_TASKS: usize = 100;

/// Before a batch's first task id, its message id (never a job's id alone, which a single
/// submission's message id is).
pub const BATCH_MSG_ID_PREFIX: &str = "tasks-from-";

/// The submissions a `jobs.submit` message carries: a [`SubmitBatch`]'s tasks, or the one
/// [`SubmitRequest`].
pub fn submissions_in(payload: &[u8]) -> Result<Vec<SubmitRequest>, InvalidInput> {
    // A batch says `tasks` first; a single submission fails this at its first field.
    if let Ok(batch) = serde_json::from_slice::<SubmitBatch>(payload) {
        if payload.len() > MAX_SUBMIT_BYTES {
            return Err(InvalidInput::new(format!(
                "a batch of submissions of {} bytes is larger than the {MAX_SUBMIT_BYTES} allowed",
                payload.len()
            )));
        }
        if batch.tasks.is_empty() {
            return Err(InvalidInput::new(
                "a batch of submissions without a task".to_owned(),
            ));
        }
        return Ok(batch.tasks);
    }
    crate::wire::decode("submission", payload, MAX_SUBMIT_BYTES).map(|one| vec![one])
}

impl SubmitRequest {
    /// Checks what the submission says besides its spec (which [`JobSpec::validate`]
    /// checks, so an invalid spec can still be recorded as a failed job the user sees).
    pub fn validate_sender(&self) -> Result<(), InvalidInput> {
        crate::wire::check_user("user", &self.user)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verdict_goes_only_under_the_signer_s_own_inbox() {
        let alice = "UALICE";
        assert!(verdict_subject_of(alice, "_INBOX.UALICE.verdict.4f2a"));
        // Someone else's inbox, a longer key sharing the prefix, wildcards, empty tokens.
        for to in [
            "_INBOX.UBOB.verdict.4f2a",
            "_INBOX.UALICEX.verdict",
            "_INBOX.UALICE.>",
            "_INBOX.UALICE.*",
            "_INBOX.UALICE..x",
            "_INBOX.UALICE.",
            "_INBOX.UALICE",
            "jobs.submit",
            "_INBOX.UALICE.a b",
        ] {
            assert!(!verdict_subject_of(alice, to), "{to} accepted");
        }
    }

    #[test]
    fn a_message_carries_one_submission_or_a_batch_of_tasks() {
        let one = |n: u8| SubmitRequest {
            id: format!("{n:032x}")
                .parse()
                .unwrap_or_else(|_| JobId::random()),
            user: "alice".into(),
            spec: crate::job::JobSpec::new(vec!["true".into()], "/tmp"),
        };
        let single = serde_json::to_vec(&one(1)).unwrap_or_default();
        assert_eq!(submissions_in(&single).ok(), Some(vec![one(1)]));
        let batch = SubmitBatch {
            tasks: vec![one(1), one(2)],
        };
        let batch = serde_json::to_vec(&batch).unwrap_or_default();
        assert_eq!(submissions_in(&batch).ok(), Some(vec![one(1), one(2)]));
        assert!(
            submissions_in(br#"{"tasks": []}"#).is_err(),
            "a batch of nothing"
        );
        assert!(submissions_in(br#"{"tasks": [], "more": 1}"#).is_err());
        assert!(submissions_in(b"not json").is_err());
    }
}
