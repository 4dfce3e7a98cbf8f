//! The audit trail: one record per request the scheduler handled (submit, cancel, hold,
//! release, node and GPU administration), with the identity that signed it and whether it was
//! carried out. Kept in the `MGPU_AUDIT` stream (a year), read with `mgpu admin audit`.

use serde::{Deserialize, Serialize};

use crate::Timestamp;

/// One audited request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    pub at: Timestamp,
    /// `submit`, `cancel`, `hold`, `release` or `admin`.
    pub action: String,
    /// The principal that signed the request; None when the signature was missing or bad.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// The signer's public key, as presented (even when it is unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The job id or node the request was about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// True when the request was carried out (or was a no-op), false when refused.
    pub accepted: bool,
    /// What was done, or why it was refused.
    pub detail: String,
}
