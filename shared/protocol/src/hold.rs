//! `jobs.<id>.hold` and `jobs.<id>.release`: what `mgpu hold` and `mgpu release` publish to
//! keep a queued job from starting, and to let it start again.

use serde::{Deserialize, Serialize};

use crate::error::InvalidInput;

/// Payload of `jobs.<id>.hold` and `jobs.<id>.release`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HoldRequest {
    /// Who asks.
    pub user: String,
}

impl HoldRequest {
    pub fn validate(&self) -> Result<(), InvalidInput> {
        crate::wire::check_user("user", &self.user)
    }
}
