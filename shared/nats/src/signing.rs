//! Request signatures on the wire: `mgpu_protocol::signing` says what is signed and checks
//! it; this module puts the signature headers on a NATS message and reads them off one.

use async_nats::HeaderMap;

use mgpu_protocol::Timestamp;
pub use mgpu_protocol::signing::{
    MAX_SKEW, NONCE, Nonces, SIGNATURE, SIGNED_AT, SIGNER, SignatureError, Signed,
};

/// Signs `payload` for `subject` with `key`, adding the signature headers to `headers`.
pub fn sign(
    key: &nkeys::KeyPair,
    subject: &str,
    payload: &[u8],
    now: Timestamp,
    headers: &mut HeaderMap,
) -> Result<(), String> {
    for (name, value) in mgpu_protocol::signing::sign(key, subject, payload, now)? {
        headers.insert(name, value.as_str());
    }
    Ok(())
}

/// Checks the signature a message on `subject` carries in its headers; it arrived (or was
/// stored) at `arrived`. Replays are caught by [`Nonces`], which the caller keeps.
pub fn verify(
    headers: Option<&HeaderMap>,
    subject: &str,
    payload: &[u8],
    arrived: Timestamp,
) -> Result<Signed, SignatureError> {
    let header = |name: &str| {
        headers
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_owned())
    };
    mgpu_protocol::signing::verify(header, subject, payload, arrived)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_signed_here_verify_here_and_an_altered_payload_does_not() {
        let key = nkeys::KeyPair::new_user();
        let now = mgpu_protocol::now();
        let mut headers = HeaderMap::new();
        assert_eq!(sign(&key, "jobs.submit", b"{}", now, &mut headers), Ok(()));
        let signed = verify(Some(&headers), "jobs.submit", b"{}", now);
        assert_eq!(signed.map(|s| s.signer), Ok(key.public_key()));
        assert_eq!(
            verify(Some(&headers), "jobs.submit", b"{ }", now),
            Err(SignatureError::Forged)
        );
        assert_eq!(
            verify(None, "jobs.submit", b"{}", now),
            Err(SignatureError::Unsigned)
        );
    }
}
