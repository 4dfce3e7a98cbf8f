//! Who sent a request: the signature on every user request (see `mgpu_nats::signing`) is
//! checked against the principals file (`--principals`, the `principals.json` that `mgpu admin`
//! keeps), re-read when it changes, so users added or removed take effect without a restart.
//! A request that is unsigned, forged, replayed or signed by no known user is refused (and
//! audited: `outbox.rs`).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{Context, Result};

use mgpu_nats::signing::{Nonces, SignatureError};
use mgpu_protocol::signing::Signed;
use serde::{Deserialize, Serialize};

use mgpu_protocol::Timestamp;
use mgpu_protocol::principals::{Principal, Registry, Role};

pub use crate::machine::messages::Identity;
use crate::metrics::RefusalReason;

/// The principals file, re-read when it changes.
#[derive(Clone)]
pub struct Principals {
    path: PathBuf,
    registry: Registry,
    modified: Option<SystemTime>,
    /// How many times the file was read: whoever derives something from it (the caps on
    /// running GPUs, from users' groups) knows by this whether to derive it again, whichever
    /// lookup happened to re-read it.
    generation: u64,
}

impl Principals {
    pub fn load(path: &Path) -> Result<Self> {
        let registry = read(path)?;
        Ok(Principals {
            path: path.to_owned(),
            registry,
            modified: modified(path),
            generation: 0,
        })
    }

    /// Re-reads the file if it changed since it was read (a `stat`, cheap enough to make
    /// whenever a key is not known); true when it was read again.
    pub fn refresh(&mut self) -> bool {
        let now_modified = modified(&self.path);
        if now_modified == self.modified {
            return false;
        }
        match read(&self.path) {
            Ok(registry) => {
                tracing::info!(
                    principals = registry.principals.len(),
                    "principals file changed; reloaded"
                );
                self.registry = registry;
                self.modified = now_modified;
                self.generation += 1;
                true
            }
            Err(err) => {
                tracing::warn!("reloading the principals file: {err:#}");
                false
            }
        }
    }

    /// What the file says, as last read.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// How many times the file was read again since it was loaded.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The node a key belongs to. The file is re-read first when it changed, so a node just
    /// added is known and one just removed is not.
    pub fn node_by_key(&mut self, key: &str) -> Option<Principal> {
        self.refresh();
        self.registry
            .by_key(key)
            .filter(|p| p.role == Role::Node)
            .cloned()
    }

    /// The user or admin whose key is `key` (the file re-read first when it changed).
    pub fn user_by_key(&mut self, key: &str) -> Option<Principal> {
        self.refresh();
        self.registry
            .by_key(key)
            .filter(|p| matches!(p.role, Role::User | Role::Admin))
            .cloned()
    }
}

fn read(path: &Path) -> Result<Registry> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "reading the principals file {} (written by `mgpu admin init`; pass --principals)",
            path.display()
        )
    })?;
    serde_json::from_str(&text).with_context(|| format!("{} is not valid", path.display()))
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Why a request was refused before it was looked at.
pub struct Refusal {
    /// The key the request was signed with, when it had one.
    pub key: Option<String>,
    pub reason: String,
    /// The reason as the metrics count it.
    pub why: RefusalReason,
}

/// The gate every request passes: whose signature it carries, and whether it was seen before.
pub struct Gate {
    /// Who may sign requests.
    pub principals: Principals,
    /// Request nonces seen lately, to refuse replays.
    nonces: Nonces,
}

impl Gate {
    pub fn new(principals: Principals) -> Self {
        Gate {
            principals,
            nonces: Nonces::default(),
        }
    }

    /// Decides on a request whose signature was checked (`verified`, by the driver, which
    /// reads the headers): `presented` is the key it presented, `stored_at` when JetStream
    /// stored it (which a replayer cannot choose) and `sequence` its stream sequence.
    pub fn authenticate(
        &mut self,
        verified: Result<Signed, SignatureError>,
        presented: Option<String>,
        (stored_at, sequence): (Timestamp, Option<u64>),
    ) -> Result<(Identity, SeenNonce), Refusal> {
        let refuse = |err: SignatureError| Refusal {
            key: presented.clone(),
            why: RefusalReason::of_signature(&err),
            reason: err.to_string(),
        };
        let signed = verified.map_err(refuse)?;
        // The same stored message delivered again (its handling failed, it is to be handled
        // again) is not a replay; a copy published again is.
        let remembered = match sequence {
            Some(sequence) => self.nonces.check_stored(&signed, stored_at, sequence),
            None => self.nonces.check(&signed, stored_at),
        };
        remembered.map_err(refuse)?;
        let seen = SeenNonce {
            nonce: signed.nonce.clone(),
            signed_at: signed.signed_at,
            sequence,
        };
        let Some(principal) = self.principals.user_by_key(&signed.signer) else {
            return Err(Refusal {
                why: RefusalReason::UnknownKey,
                key: Some(signed.signer),
                reason: "signed by a key that belongs to no user (removed, or never added)".into(),
            });
        };
        let identity = Identity {
            admin: principal.is_admin(),
            name: principal.name,
            key: signed.signer,
        };
        Ok((identity, seen))
    }

    /// Takes back the nonces a scheduler before this one saw (kept in the `mgpu-nonces`
    /// bucket: `driver::store`).
    pub fn restore_nonces(&mut self, seen: Vec<SeenNonce>) {
        for nonce in seen {
            self.nonces
                .restore(nonce.nonce, nonce.signed_at, nonce.sequence);
        }
    }
}

/// One nonce as the gate remembers it: its signing time and the stream sequence of the stored
/// message that carried it (a redelivery of that same message is not a replay).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeenNonce {
    pub nonce: String,
    pub signed_at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
}

#[cfg(test)]
mod tests {
    use mgpu_protocol::signing::nonce_key;

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
