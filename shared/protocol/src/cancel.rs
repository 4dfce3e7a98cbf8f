//! `jobs.<id>.cancel`: what `mgpu cancel` publishes to stop a queued or running job.

use serde::{Deserialize, Serialize};

use crate::error::InvalidInput;

/// Payload of `jobs.<id>.cancel`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelRequest {
    /// Who asks.
    pub user: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
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
