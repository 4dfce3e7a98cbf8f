//! Job ids and node names.
//!
//! A job id is 32 lowercase hex digits from a random UUID: unique without coordination (the CLI
//! makes it before the scheduler has seen the job, so it doubles as the JetStream dedup id), valid
//! as a single NATS subject token, and typed by any unique prefix (`mgpu cancel 3f9a`), as with git
//! or docker. Listings show the first [`JobId::SHORT_LEN`] digits.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::InvalidInput;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct JobId(String);

impl JobId {
    pub const LEN: usize = 32;
    pub const SHORT_LEN: usize = 10;

    pub fn random() -> Self {
        JobId(uuid::Uuid::new_v4().simple().to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The prefix shown in listings.
    pub fn short(&self) -> &str {
        &self.0[..Self::SHORT_LEN.min(self.0.len())]
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for JobId {
    type Err = InvalidInput;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() == Self::LEN && is_job_id_prefix(s) {
            Ok(JobId(s.to_owned()))
        } else {
            Err(InvalidInput::new(format!(
                "`{s}` is not a job id (32 lowercase hex digits)"
            )))
        }
    }
}

impl TryFrom<String> for JobId {
    type Error = InvalidInput;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<JobId> for String {
    fn from(id: JobId) -> String {
        id.0
    }
}

/// True when `s` could be the start of a job id: non-empty, lowercase hex, not too long.
pub fn is_job_id_prefix(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= JobId::LEN
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Checks a node name: it becomes a subject token and a consumer name, so only
/// letters, digits, `-` and `_`, at most 64 of them.
pub fn validate_node_name(name: &str) -> Result<(), InvalidInput> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(InvalidInput::new(format!(
            "`{name}` is not a valid node name: use 1-64 letters, digits, `-` or `_`"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ids_parse_back_and_are_one_subject_token() {
        let id = JobId::random();
        assert_eq!(id.as_str().len(), JobId::LEN);
        assert!(!id.as_str().contains(['.', '*', '>', ' ']));
        assert_eq!(id.as_str().parse::<JobId>().ok(), Some(id.clone()));
        assert_eq!(id.short().len(), JobId::SHORT_LEN);
    }

    #[test]
    fn bad_ids_and_names_are_refused() {
        assert!("abc".parse::<JobId>().is_err());
        assert!("x".repeat(32).parse::<JobId>().is_err());
        assert!(validate_node_name("node.1").is_err());
        assert!(validate_node_name("node*").is_err());
        assert!(validate_node_name("").is_err());
        assert!(validate_node_name("gpu-box_01").is_ok());
        assert!(!is_job_id_prefix("3F"));
        assert!(is_job_id_prefix("3f"));
    }
}
