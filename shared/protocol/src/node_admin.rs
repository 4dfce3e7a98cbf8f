//! `admin.requests`: what `mgpu node drain|resume` and `mgpu gpu pause|resume` publish
//! (admins only) to take nodes and GPUs out of service and back.

use serde::{Deserialize, Serialize};

use crate::error::InvalidInput;
use crate::gpu_amount::GpuAmount;
use crate::ids::validate_node_name;
use crate::wire::{MAX_LINE_BYTES, check_line, check_user};

/// Payload of `admin.requests` (admins only, enforced by the server's permissions).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum AdminRequest {
    DrainNode {
        node: String,
        by: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    ResumeNode {
        node: String,
        by: String,
    },
    PauseGpu {
        node: String,
        index: u32,
        by: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    ResumeGpu {
        node: String,
        index: u32,
        by: String,
    },
}

impl AdminRequest {
    /// Checks the node name (it becomes a KV key), the admin's name and the reason.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        let (node, by, reason) = match self {
            AdminRequest::DrainNode { node, by, reason }
            | AdminRequest::PauseGpu {
                node, by, reason, ..
            } => (node, by, reason.as_deref()),
            AdminRequest::ResumeNode { node, by } | AdminRequest::ResumeGpu { node, by, .. } => {
                (node, by, None)
            }
        };
        validate_node_name(node)?;
        check_user("by", by)?;
        if let Some(reason) = reason {
            check_line("reason", reason, MAX_LINE_BYTES)?;
        }
        if let AdminRequest::PauseGpu { index, .. } | AdminRequest::ResumeGpu { index, .. } = self
            && *index >= GpuAmount::MAX_GPUS
        {
            return Err(InvalidInput::new(format!("GPU index {index} is absurd")));
        }
        Ok(())
    }
}
