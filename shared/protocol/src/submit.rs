//! `jobs.submit`: what `mgpu submit` publishes and the scheduler records as a new job.

use serde::{Deserialize, Serialize};

use crate::error::InvalidInput;
use crate::ids::JobId;
use crate::job::JobSpec;

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
