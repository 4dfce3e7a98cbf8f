//! The gate's nonce step, as the driver runs it on every request (`identity::Gate` over the
//! protocol's `Nonces`; signatures themselves are not simulated): a request stored once and
//! delivered again (its acknowledgement lost, its handling failed, its scheduler dead) passes
//! again; a copy published again with the same nonce (a replay) is refused, and so is one
//! signed longer than the allowed skew before it was stored. Admitted requests' nonces are
//! kept in the store, as the driver keeps them in the `mgpu-nonces` bucket, so a standby
//! refuses a copy of a request its predecessor admitted.
//!
//! Checked here: no stored request is refused as a replay, and no copy is admitted.

use mgpu_protocol::Timestamp;
use mgpu_protocol::request::Request;
use mgpu_protocol::signing::{MAX_SKEW, Nonces, SignatureError, Signed};

use crate::machine::messages::Identity;

/// A request as the requests stream stores it, with what its signature header carries.
#[derive(Clone, Debug)]
pub struct StoredRequest {
    pub identity: Identity,
    pub request: Request,
    /// The further tasks of a batch (an array's tasks in one message, after `request`);
    /// empty for a message of one request.
    pub batch: Vec<Request>,
    pub stored_at: Timestamp,
    pub nonce: String,
    pub signed_at: Timestamp,
    /// A replayed copy: the stream index of the message it copies.
    pub copy_of: Option<usize>,
}

/// What the gate remembers: its nonces, and the ones it kept in the store.
#[derive(Default)]
pub struct SimGate {
    nonces: Nonces,
}

impl SimGate {
    /// A scheduler's gate, with the nonces kept by those before it.
    pub fn restored(kept: &[(String, Timestamp, u64)]) -> Self {
        let mut nonces = Nonces::default();
        for (nonce, signed_at, sequence) in kept {
            nonces.restore(nonce.clone(), *signed_at, Some(*sequence));
        }
        SimGate { nonces }
    }

    /// The gate's verdict on the message at stream `sequence`; what it breaks, if anything.
    pub fn check(
        &mut self,
        stored: &StoredRequest,
        sequence: u64,
    ) -> (Result<(), SignatureError>, Option<String>) {
        let verdict = if stored.stored_at - stored.signed_at > MAX_SKEW {
            Err(SignatureError::Stale(
                "signed too long before it was stored".into(),
            ))
        } else {
            let signed = Signed {
                signer: stored.identity.key.clone(),
                nonce: stored.nonce.clone(),
                signed_at: stored.signed_at,
            };
            self.nonces
                .check_stored(&signed, stored.stored_at, sequence)
        };
        let broken = match (&verdict, stored.copy_of) {
            (Ok(()), Some(original)) => Some(format!(
                "a replayed request admitted: message {sequence} copies message {}",
                original + 1
            )),
            (Err(err), None) => Some(format!(
                "a stored request refused at the gate: message {sequence} ({err})"
            )),
            _ => None,
        };
        (verdict, broken)
    }
}

#[cfg(test)]
mod tests {
    use mgpu_protocol::cancel::CancelRequest;
    use mgpu_protocol::ids::JobId;

    use super::*;

    fn cancel(at: Timestamp) -> StoredRequest {
        StoredRequest {
            identity: Identity {
                name: "alice".into(),
                key: "UALICE".into(),
                admin: false,
            },
            request: Request::Cancel {
                job: JobId::random(),
                request: CancelRequest {
                    user: "alice".into(),
                    reason: None,
                },
            },
            batch: Vec::new(),
            stored_at: at,
            nonce: "nonce-1".into(),
            signed_at: at,
            copy_of: None,
        }
    }

    #[test]
    fn a_redelivery_passes_and_a_copy_is_refused_even_by_the_next_scheduler() {
        let at = chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap_or_default();
        let mut gate = SimGate::default();
        let original = cancel(at);
        assert_eq!(gate.check(&original, 1), (Ok(()), None));
        assert_eq!(gate.check(&original, 1), (Ok(()), None), "delivered again");
        let copy = StoredRequest {
            copy_of: Some(0),
            ..original.clone()
        };
        let (verdict, broken) = gate.check(&copy, 7);
        assert!(verdict.is_err() && broken.is_none());
        let mut next = SimGate::restored(&[("nonce-1".into(), at, 1)]);
        assert!(next.check(&copy, 7).0.is_err(), "kept in the store");
        assert_eq!(next.check(&original, 1), (Ok(()), None));
        let late = StoredRequest {
            stored_at: at + chrono::Duration::minutes(3),
            nonce: "nonce-2".into(),
            ..original
        };
        let (verdict, broken) = SimGate::default().check(&late, 9);
        assert!(verdict.is_err() && broken.is_some(), "stale: {broken:?}");
    }
}
