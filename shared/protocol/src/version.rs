//! The wire protocol's version, so components of different releases meet with a clear message
//! instead of a message decoded wrongly.
//!
//! Every heartbeat carries `protocol`, and every request from a user or a node carries the
//! [`HEADER`] header. A message without one speaks protocol 1, the protocol of the releases
//! before versions were sent. The scheduler checks the version before it uses anything else
//! a message says (a heartbeat this release's strict decoding reads gives its `protocol`; one
//! it cannot read is read again with [`peek`], which ignores every other field), and refuses
//! what it cannot read:
//! - a heartbeat of another protocol marks its node incompatible: the node stays alive (its
//!   running jobs are not requeued) but gets no job until its agent speaks a protocol the
//!   scheduler accepts;
//! - a request of another protocol is refused, saying which side to upgrade.
//!
//! The scheduler accepts [`OLDEST_ACCEPTED`] to [`PROTOCOL`]. A release that changes the wire
//! format raises [`PROTOCOL`]; one that keeps reading the previous format keeps
//! [`OLDEST_ACCEPTED`] where it was, which is what makes a rolling upgrade possible (the
//! scheduler first, then the agents and the CLIs).
//!
//! A message names the oldest protocol that reads it, not the newest this build speaks: what
//! protocol 1 already said still says [`BASELINE`], so an older scheduler keeps reading this
//! release's heartbeats, reports and requests, and refuses, with the sentence above, only a
//! request that needs a newer one (today a batch of an array's tasks whose environment is
//! stored once for the whole array, [`ARRAY_BATCHES`]), instead of acting on it wrongly.

use serde::Deserialize;

/// The newest protocol this build speaks (and its scheduler reads).
pub const PROTOCOL: u32 = 2;

/// The protocol of a message that says nothing protocol 1 could not: every heartbeat and
/// report, and every request but those naming a newer protocol below.
pub const BASELINE: u32 = 1;

/// Protocol 2: a job array's tasks sent a hundred to a message
/// ([`crate::submit::SubmitBatch`]), their environment stored not under each task's id but
/// once, under the array's (`<owner key>.<array id>` in `mgpu-job-env`). A scheduler of
/// protocol 1 would refuse the batch as malformed at best, or look under a task's id, find
/// nothing and start it without.
pub const ARRAY_BATCHES: u32 = 2;

/// The oldest protocol this build's scheduler still reads.
pub const OLDEST_ACCEPTED: u32 = 1;

/// The header carrying a request's protocol.
pub const HEADER: &str = "Mgpu-Protocol";

/// The protocol of a message that does not say.
pub const UNVERSIONED: u32 = 1;

/// The one field [`peek`] reads; every other field is ignored, whatever it is.
#[derive(Deserialize)]
struct Envelope {
    #[serde(default = "unversioned")]
    protocol: u32,
}

pub(crate) fn unversioned() -> u32 {
    UNVERSIONED
}

/// The protocol a JSON message says it speaks; [`UNVERSIONED`] when it does not say or is no
/// JSON object (the full decode then reports what is wrong with it).
pub fn peek(payload: &[u8]) -> u32 {
    serde_json::from_slice::<Envelope>(payload).map_or(UNVERSIONED, |e| e.protocol)
}

/// The protocol a request's header names; [`UNVERSIONED`] without the header. A header that
/// is no number reads as protocol 0, which no build accepts.
pub fn of_header(value: Option<&str>) -> u32 {
    value.map_or(UNVERSIONED, |v| v.trim().parse().unwrap_or(0))
}

/// The job id a submission names (`"id"`), read without decoding anything else, so that a
/// refused submission of another protocol can still be answered on its job's subjects.
pub fn peek_job_id(payload: &[u8]) -> Option<crate::ids::JobId> {
    #[derive(Deserialize)]
    struct IdOnly {
        id: Option<crate::ids::JobId>,
    }
    serde_json::from_slice::<IdOnly>(payload).ok()?.id
}

/// Why a message of protocol `theirs` from `sender` (`"the agent of node001"`, `"mgpu 0.3"`)
/// cannot be read here; None when it can.
pub fn incompatibility(sender: &str, theirs: u32) -> Option<String> {
    if (OLDEST_ACCEPTED..=PROTOCOL).contains(&theirs) {
        return None;
    }
    let accepted = if OLDEST_ACCEPTED == PROTOCOL {
        format!("protocol {PROTOCOL}")
    } else {
        format!("protocols {OLDEST_ACCEPTED} to {PROTOCOL}")
    };
    let upgrade = if theirs > PROTOCOL {
        "upgrade the scheduler first (then the agents and the CLIs)"
    } else {
        "upgrade it to this scheduler's release"
    };
    Some(format!(
        "{sender} speaks protocol {theirs}, and this scheduler ({}) reads {accepted}: {upgrade}",
        env!("CARGO_PKG_VERSION")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_read_whatever_else_the_message_holds() {
        assert_eq!(
            peek(br#"{"protocol": 7, "field_of_the_future": [1, 2]}"#),
            7
        );
        assert_eq!(peek(br#"{"node": "n1"}"#), UNVERSIONED);
        assert_eq!(peek(b"not json"), UNVERSIONED);
        assert_eq!(of_header(None), UNVERSIONED);
        assert_eq!(of_header(Some(" 3 ")), 3);
        assert_eq!(of_header(Some("three")), 0);
    }

    #[test]
    fn only_the_accepted_range_reads_and_the_message_says_what_to_upgrade() {
        assert_eq!(incompatibility("x", PROTOCOL), None);
        let newer = incompatibility("the agent of node001", PROTOCOL + 1).unwrap_or_default();
        assert!(newer.contains("node001") && newer.contains("upgrade the scheduler first"));
        let older = incompatibility("mgpu", 0).unwrap_or_default();
        assert!(older.contains("upgrade it"), "{older}");
    }
}
