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
}
