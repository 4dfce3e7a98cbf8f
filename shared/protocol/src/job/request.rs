//! The payloads users publish about jobs: `jobs.submit`, `jobs.<id>.cancel`, `.hold` and
//! `.release`, with their checks.

use super::*;

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

/// Payload of `jobs.<id>.hold` and `jobs.<id>.release`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HoldRequest {
    /// Who asks.
    pub user: String,
}

/// Payload of `jobs.<id>.cancel`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelRequest {
    /// Who asks.
    pub user: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl HoldRequest {
    pub fn validate(&self) -> Result<(), InvalidInput> {
        crate::wire::check_user("user", &self.user)
    }
}

impl CancelRequest {
    pub fn validate(&self) -> Result<(), InvalidInput> {
        crate::wire::check_user("user", &self.user)?;
        if let Some(reason) = &self.reason {
            crate::wire::check_line("reason", reason, crate::wire::MAX_LINE_BYTES)?;
        }
        Ok(())
    }
}
