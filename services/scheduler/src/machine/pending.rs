//! What the machine waits for: the operations it asked for and not answered yet, with what
//! follows each once answered (a transition's effects, a new job's submission and what was
//! applied to it before its first write), and who asked.

use std::sync::Arc;

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::JobRecord;
use mgpu_protocol::node::NodeAdmin;
use mgpu_protocol::submit::SubmitVerdict;

use super::messages::{Identity, Token};
use crate::lifecycle::{Effect, Input};
use crate::metrics::SubmitOutcome;

/// Who asked for a change, and what follows once it is stored.
#[derive(Clone, Debug)]
pub(crate) enum Origin {
    /// A request (its sender, for the audit trail and refusals).
    Request(Identity),
    /// A pass decided it; `waited` is how long a started job waited (for the metrics).
    Pass { waited: Option<chrono::Duration> },
    /// An agent's report, a lost node: the scheduler itself.
    Scheduler,
}

impl Origin {
    pub(crate) fn identity(&self) -> Option<&Identity> {
        match self {
            Origin::Request(identity) => Some(identity),
            _ => None,
        }
    }
}

/// An operation asked for, waiting for its result.
pub(crate) enum Pending {
    /// A lifecycle transition's record on its way to the store.
    Transition(PendingTransition),
    /// A new job's record on its way to the store ([`super::staging`]).
    Create { record: Arc<JobRecord>, job: NewJob },
    /// A node's administration on its way to the cluster bucket.
    Admin {
        token: Token,
        node: String,
        admin: NodeAdmin,
        identity: Identity,
        detail: String,
    },
    /// A booked or cancelled reservation on its way to the cluster bucket.
    Reservation {
        token: Token,
        reservation: Arc<mgpu_protocol::reservation::Reservation>,
        identity: Identity,
        detail: String,
        verdict_to: Option<String>,
    },
    /// Jobs missing from a node's heartbeat, lost once every stored report was handled.
    Missing {
        node: String,
        jobs: Vec<(JobId, u32)>,
        at: Timestamp,
    },
}

pub(crate) struct PendingTransition {
    /// Shared with the write command: the driver drops its handle once the write came out,
    /// so taking it back costs no copy.
    pub(crate) record: Arc<JobRecord>,
    pub(crate) input: Input,
    pub(crate) effects: Vec<Effect>,
    pub(crate) origin: Origin,
    pub(crate) token: Option<Token>,
    pub(crate) tries: usize,
    pub(crate) now: Timestamp,
}

/// A submission on its way to its record's first write, and what follows once it is stored.
pub(crate) struct NewJob {
    pub(crate) effects: Vec<Effect>,
    pub(crate) identity: Identity,
    pub(crate) outcome: SubmitOutcome,
    pub(crate) token: Option<Token>,
    /// Where its submitter waits, and what they are told: decided on the record as
    /// submitted (a pass's later rejection is an event, as for any queued job).
    pub(crate) verdict: Option<(String, SubmitVerdict)>,
    /// What was applied to the record while it waited for the write, in order.
    pub(crate) later: Vec<Applied>,
    /// The same submission delivered again meanwhile: acknowledged with it.
    pub(crate) redelivered: Vec<Token>,
}

/// A lifecycle input applied to a staged record: its effects wait for the record's write.
pub(crate) struct Applied {
    pub(crate) input: Input,
    pub(crate) effects: Vec<Effect>,
    pub(crate) origin: Origin,
    pub(crate) token: Option<Token>,
    pub(crate) now: Timestamp,
}
