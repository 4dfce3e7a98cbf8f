//! Request nonces kept across restarts. Every admitted request's nonce is written to the
//! `mgpu-nonces` bucket before the request is acted on (entries expire once a copy could no
//! longer pass the signature's skew check), and a scheduler that becomes active reads them back
//! into its gate: a request copied and sent again after a restart is refused as replayed, as
//! one sent again while the scheduler ran always was.

use anyhow::{Context, Result};
use async_nats::jetstream;
use serde::{Deserialize, Serialize};

use mgpu_nats::records;
use mgpu_protocol::signing::nonce_key;
use mgpu_protocol::{Timestamp, subjects};

/// One nonce as the gate remembers it: its signing time and the stream sequence of the stored
/// message that carried it (a redelivery of that same message is not a replay).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeenNonce {
    pub nonce: String,
    pub signed_at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
}

/// Writes each nonce, pipelined; says for each whether JetStream stored it.
pub(crate) async fn remember(js: &jetstream::Context, seen: &[&SeenNonce]) -> Vec<bool> {
    let mut acks = Vec::with_capacity(seen.len());
    for nonce in seen {
        let subject = format!("$KV.{}.{}", subjects::NONCE_BUCKET, nonce_key(&nonce.nonce));
        let sent = match serde_json::to_vec(nonce) {
            Ok(payload) => js.publish(subject, payload.into()).await.ok(),
            Err(_) => None,
        };
        acks.push(sent);
    }
    let mut stored = Vec::with_capacity(acks.len());
    for ack in acks {
        stored.push(match ack {
            Some(ack) => ack.await.is_ok(),
            None => false,
        });
    }
    stored
}

/// Every nonce still kept (those of the last [`subjects::NONCE_TTL_SECS`]).
pub(crate) async fn recall(js: &jetstream::Context) -> Result<Vec<SeenNonce>> {
    let messages = records::last_per_subject(
        js,
        subjects::NONCE_BUCKET_STREAM,
        &format!("$KV.{}.>", subjects::NONCE_BUCKET),
        false,
    )
    .await
    .context("reading the nonces of recent requests")?;
    Ok(messages
        .iter()
        .filter_map(|message| serde_json::from_slice(&message.payload).ok())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nonce_reads_back_as_it_was_written() {
        let seen = SeenNonce {
            nonce: "any text.*>".into(),
            signed_at: mgpu_protocol::now(),
            sequence: Some(42),
        };
        let text = serde_json::to_vec(&seen).unwrap_or_default();
        let back: SeenNonce = serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, seen);
        // Whatever the signer chose, the key is one KV accepts.
        assert!(
            nonce_key(&seen.nonce)
                .chars()
                .all(|c| c.is_ascii_hexdigit())
        );
    }
}
