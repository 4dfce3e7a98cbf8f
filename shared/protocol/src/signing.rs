//! Signed requests: a user's submit, cancel, hold/release, admin and input messages carry an
//! ed25519 signature made with the user's nkey, so the scheduler (and, for input, the agent)
//! acts on who really sent a message, not on the `user` a payload claims.
//!
//! The signature covers the subject, the signing time, a random nonce and the payload, and
//! travels in headers ([`SIGNER`], [`SIGNED_AT`], [`NONCE`], [`SIGNATURE`]), so the payload stays
//! the plain JSON any NATS tool shows. A verifier rejects a message signed too long before it
//! was stored or received ([`MAX_SKEW`]) and remembers nonces for that long, so a copied
//! message cannot be replayed.
//!
//! This module knows the headers by name only; `mgpu_nats::signing` puts them on and reads them
//! off a NATS message.

use std::collections::HashMap;

use crate::Timestamp;

/// The signer's public nkey (`U…`).
pub const SIGNER: &str = "Mgpu-Signer";
/// When it was signed, in milliseconds since the Unix epoch.
pub const SIGNED_AT: &str = "Mgpu-Signed-At";
/// A random value that makes every signed message unique.
pub const NONCE: &str = "Mgpu-Nonce";
/// The ed25519 signature, in hexadecimal.
pub const SIGNATURE: &str = "Mgpu-Signature";

/// How far apart signing and storing (or receiving) may be: a clock difference between hosts
/// and a slow network, not a replay.
pub const MAX_SKEW: chrono::Duration = chrono::Duration::minutes(2);

/// Why a message's signature was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the message is not signed (no {SIGNATURE} header)")]
    Unsigned,
    #[error("the signature headers are malformed: {0}")]
    Malformed(String),
    #[error("the signature does not match the message and the signer's key (forged or altered)")]
    Forged,
    #[error("the message was signed {0} before it arrived (replayed, or a clock far off)")]
    Stale(String),
    #[error("the message was already received once (replayed)")]
    Replayed,
}

/// What a valid signature proves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    pub signer: String,
    pub nonce: String,
    pub signed_at: Timestamp,
}

fn signed_bytes(subject: &str, signed_at_ms: i64, nonce: &str, payload: &[u8]) -> Vec<u8> {
    let mut bytes = format!("mgpu-request\n{subject}\n{signed_at_ms}\n{nonce}\n").into_bytes();
    bytes.extend_from_slice(payload);
    bytes
}

/// The key a nonce is kept under in a KV bucket: its hex (a nonce is any text its signer
/// chose, and KV keys allow a few characters only).
pub fn nonce_key(nonce: &str) -> String {
    hex(nonce.as_bytes())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

/// Signs `payload` for `subject` with `key`: the signature headers, as (name, value) pairs.
pub fn sign(
    key: &nkeys::KeyPair,
    subject: &str,
    payload: &[u8],
    now: Timestamp,
) -> Result<[(&'static str, String); 4], String> {
    let at = now.timestamp_millis();
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let signature = key
        .sign(&signed_bytes(subject, at, &nonce, payload))
        .map_err(|e| format!("signing the request: {e}"))?;
    Ok([
        (SIGNER, key.public_key()),
        (SIGNED_AT, at.to_string()),
        (NONCE, nonce),
        (SIGNATURE, hex(&signature)),
    ])
}

/// Checks the signature of a message on `subject` that arrived (or was stored) at `arrived`;
/// `header` gives a header's value by name. Replays are caught by [`Nonces`], which the
/// caller keeps.
pub fn verify(
    header: impl Fn(&str) -> Option<String>,
    subject: &str,
    payload: &[u8],
    arrived: Timestamp,
) -> Result<Signed, SignatureError> {
    let header = |name: &str| header(name).map(|v| v.trim().to_owned());
    let Some(signature) = header(SIGNATURE) else {
        return Err(SignatureError::Unsigned);
    };
    let malformed = |what: &str| SignatureError::Malformed(what.to_owned());
    let signer = header(SIGNER).ok_or_else(|| malformed("no signer"))?;
    let nonce = header(NONCE).ok_or_else(|| malformed("no nonce"))?;
    if nonce.is_empty() || nonce.len() > 64 {
        return Err(malformed("bad nonce"));
    }
    let at_ms: i64 = header(SIGNED_AT)
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| malformed("bad signing time"))?;
    let signed_at = chrono::DateTime::from_timestamp_millis(at_ms)
        .ok_or_else(|| malformed("signing time out of range"))?;
    let signature = unhex(&signature).ok_or_else(|| malformed("signature is not hexadecimal"))?;
    let key = nkeys::KeyPair::from_public_key(&signer).map_err(|_| malformed("bad signer key"))?;
    key.verify(&signed_bytes(subject, at_ms, &nonce, payload), &signature)
        .map_err(|_| SignatureError::Forged)?;
    let skew = arrived - signed_at;
    if skew > MAX_SKEW || -skew > MAX_SKEW {
        return Err(SignatureError::Stale(format!("{}s", skew.num_seconds())));
    }
    Ok(Signed {
        signer,
        nonce,
        signed_at,
    })
}

/// Nonces seen within [`MAX_SKEW`]: a second message with one of them is a replay.
#[derive(Debug, Default)]
pub struct Nonces {
    /// Each nonce's signing time, and the stream sequence of the stored message that carried
    /// it (None for a message that was not stored).
    seen: HashMap<String, (Timestamp, Option<u64>)>,
    /// How many were kept by the last pruning: the next one waits until twice as many are
    /// held, so pruning costs O(1) per request on average. Pruning at every request past a
    /// fixed size made a burst of 100 000 submissions quadratic.
    kept: usize,
}

impl Nonces {
    /// Records `signed`'s nonce; an error when it was seen already.
    pub fn check(&mut self, signed: &Signed, now: Timestamp) -> Result<(), SignatureError> {
        self.remember(signed, now, None)
    }

    /// [`Nonces::check`] for a message a stream stored at `sequence`: the same stored message
    /// delivered again (its acknowledgement was lost, or its handling failed and it is to be
    /// handled again) is not a replay; another message with the same nonce is.
    pub fn check_stored(
        &mut self,
        signed: &Signed,
        now: Timestamp,
        sequence: u64,
    ) -> Result<(), SignatureError> {
        self.remember(signed, now, Some(sequence))
    }

    /// Takes back a nonce remembered before a restart (the scheduler keeps them in KV).
    pub fn restore(&mut self, nonce: String, signed_at: Timestamp, sequence: Option<u64>) {
        self.seen.insert(nonce, (signed_at, sequence));
    }

    fn remember(
        &mut self,
        signed: &Signed,
        now: Timestamp,
        sequence: Option<u64>,
    ) -> Result<(), SignatureError> {
        // Forget what can no longer pass the skew check anyway.
        if self.seen.len() > 2 * self.kept.max(1024) {
            let window = MAX_SKEW * 2;
            self.seen
                .retain(|_, (at, _)| now - *at <= window && *at - now <= window);
            self.kept = self.seen.len();
        }
        match self.seen.get(&signed.nonce) {
            Some((_, Some(stored))) if sequence == Some(*stored) => Ok(()),
            Some(_) => Err(SignatureError::Replayed),
            None => {
                self.seen
                    .insert(signed.nonce.clone(), (signed.signed_at, sequence));
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Headers = HashMap<&'static str, String>;

    fn signed(subject: &str, payload: &[u8], at: Timestamp) -> (Headers, String) {
        let key = nkeys::KeyPair::new_user();
        let headers = sign(&key, subject, payload, at).unwrap_or_else(|e| panic!("{e}"));
        (headers.into_iter().collect(), key.public_key())
    }

    fn lookup(headers: Option<&Headers>) -> impl Fn(&str) -> Option<String> + '_ {
        move |name| headers.and_then(|h| h.get(name).cloned())
    }

    #[test]
    fn a_signed_message_verifies_and_names_its_signer() {
        let now = crate::now();
        let (headers, public) = signed("jobs.submit", b"{}", now);
        let ok = verify(lookup(Some(&headers)), "jobs.submit", b"{}", now);
        assert_eq!(ok.map(|s| s.signer), Ok(public));
    }

    #[test]
    fn altered_unsigned_stale_and_replayed_messages_are_refused() {
        let now = crate::now();
        let (headers, _) = signed("jobs.x.cancel", b"{\"user\":\"alice\"}", now);
        assert_eq!(
            verify(
                lookup(Some(&headers)),
                "jobs.x.cancel",
                b"{\"user\":\"bob\"}",
                now
            ),
            Err(SignatureError::Forged)
        );
        assert_eq!(
            verify(
                lookup(Some(&headers)),
                "jobs.y.cancel",
                b"{\"user\":\"alice\"}",
                now
            ),
            Err(SignatureError::Forged),
            "a signature is bound to its subject"
        );
        assert_eq!(
            verify(lookup(None), "jobs.x.cancel", b"{}", now),
            Err(SignatureError::Unsigned)
        );
        let later = now + chrono::Duration::minutes(10);
        assert!(matches!(
            verify(
                lookup(Some(&headers)),
                "jobs.x.cancel",
                b"{\"user\":\"alice\"}",
                later
            ),
            Err(SignatureError::Stale(_))
        ));
        let mut nonces = Nonces::default();
        let first = verify(
            lookup(Some(&headers)),
            "jobs.x.cancel",
            b"{\"user\":\"alice\"}",
            now,
        );
        assert!(first.is_ok());
        let first = first.unwrap_or_else(|_| unreachable!());
        assert_eq!(nonces.check(&first, now), Ok(()));
        assert_eq!(nonces.check(&first, now), Err(SignatureError::Replayed));
    }

    #[test]
    fn a_stored_message_delivered_again_is_not_a_replay_but_a_copy_of_it_is() {
        let now = crate::now();
        let signed = Signed {
            signer: "U".into(),
            nonce: "n1".into(),
            signed_at: now,
        };
        let mut nonces = Nonces::default();
        assert_eq!(nonces.check_stored(&signed, now, 7), Ok(()));
        assert_eq!(
            nonces.check_stored(&signed, now, 7),
            Ok(()),
            "the same stored message, redelivered"
        );
        assert_eq!(
            nonces.check_stored(&signed, now, 8),
            Err(SignatureError::Replayed),
            "the same signature stored again"
        );
        assert_eq!(
            nonces.check(&signed, now),
            Err(SignatureError::Replayed),
            "the same signature outside a stream"
        );
        let plain = Signed {
            nonce: "n2".into(),
            ..signed
        };
        assert_eq!(nonces.check(&plain, now), Ok(()));
        assert_eq!(nonces.check(&plain, now), Err(SignatureError::Replayed));
    }

    #[test]
    fn garbage_headers_are_malformed_not_a_panic() {
        let now = crate::now();
        let headers: Headers = [
            (SIGNATURE, "zz"),
            (SIGNER, "nope"),
            (NONCE, "n"),
            (SIGNED_AT, "99999999999999999999"),
        ]
        .into_iter()
        .map(|(name, value)| (name, value.to_owned()))
        .collect();
        assert!(matches!(
            verify(lookup(Some(&headers)), "s", b"", now),
            Err(SignatureError::Malformed(_))
        ));
    }

    #[test]
    fn replays_are_caught_across_pruning_and_expired_nonces_are_forgotten() {
        let now = crate::now();
        let nonce = |n: usize, at: Timestamp| Signed {
            signer: "U".into(),
            nonce: format!("n{n}"),
            signed_at: at,
        };
        let mut nonces = Nonces::default();
        let long_ago = now - MAX_SKEW * 3;
        for n in 0..3_000 {
            assert_eq!(nonces.check(&nonce(n, long_ago), long_ago), Ok(()));
        }
        for n in 3_000..10_000 {
            assert_eq!(nonces.check(&nonce(n, now), now), Ok(()));
        }
        assert_eq!(
            nonces.check(&nonce(9_000, now), now),
            Err(SignatureError::Replayed),
            "a recent nonce survives pruning"
        );
        assert!(
            nonces.seen.len() <= 7_001 + 1,
            "nonces outside the window were pruned: {} kept",
            nonces.seen.len()
        );
    }
}
