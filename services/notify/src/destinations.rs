//! Every user's destinations and signing secret, as the bucket `mgpu-notify` holds them: read
//! once, then kept current by a watch, so a storm of notices does not read the bucket for each
//! one. A user whose entries have not arrived yet (added a moment ago) is read directly.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use async_nats::jetstream::{self, kv};
use futures::StreamExt as _;

use mgpu_protocol::notify::destination::Destination;
use mgpu_protocol::notify::{self, DESTINATIONS_BUCKET_STREAM};

/// One user's entries.
#[derive(Clone, Debug, Default)]
pub struct UserEntries {
    /// By destination id.
    pub destinations: HashMap<String, Destination>,
    pub secret: Option<String>,
}

/// The entries of every user, by public key.
#[derive(Clone, Default)]
pub struct Destinations {
    users: Arc<RwLock<HashMap<String, UserEntries>>>,
}

impl Destinations {
    /// Starts following `bucket`: its current entries, then every change.
    pub async fn follow(bucket: kv::Store) -> anyhow::Result<Destinations> {
        let destinations = Destinations::default();
        let mut watch = bucket.watch_with_history(">").await?;
        let users = destinations.clone();
        tokio::spawn(async move {
            while let Some(entry) = watch.next().await {
                match entry {
                    Ok(entry) => users.apply(&entry.key, entry.operation, &entry.value),
                    Err(err) => tracing::warn!("watching destinations: {err}"),
                }
            }
            tracing::error!("the watch of destinations ended; restart mgpu-notify");
        });
        Ok(destinations)
    }

    /// One change of key `key` (`<user>.secret`, `<user>.dest.<id>`).
    fn apply(&self, key: &str, operation: kv::Operation, value: &[u8]) {
        let Ok(mut users) = self.users.write() else {
            return;
        };
        let mut parts = key.splitn(3, '.');
        let (Some(user), Some(what)) = (parts.next(), parts.next()) else {
            return;
        };
        let entries = users.entry(user.to_owned()).or_default();
        let present = operation == kv::Operation::Put;
        match (what, parts.next()) {
            ("secret", None) => {
                entries.secret = present.then(|| String::from_utf8_lossy(value).into_owned());
            }
            ("dest", Some(id)) => {
                let decoded = serde_json::from_slice::<Destination>(value).ok();
                match decoded.filter(|_| present) {
                    Some(destination) => {
                        entries.destinations.insert(id.to_owned(), destination);
                    }
                    None => {
                        entries.destinations.remove(id);
                    }
                }
            }
            _ => {}
        }
    }

    /// `user`'s entries; read from the bucket when none are known yet. An error when that
    /// read fails: "no destinations" would have the notice acknowledged, and lost.
    pub async fn of(&self, js: &jetstream::Context, user: &str) -> Result<UserEntries, String> {
        let known = self
            .users
            .read()
            .ok()
            .and_then(|users| users.get(user).cloned());
        if let Some(entries) = known.filter(|e| !e.destinations.is_empty()) {
            return Ok(entries);
        }
        let filter = notify::user_entries(user);
        let read =
            mgpu_nats::reading::last_per_subject(js, DESTINATIONS_BUCKET_STREAM, &filter, false)
                .await;
        match read {
            Ok(messages) => {
                let prefix = format!("$KV.{}.", notify::DESTINATIONS_BUCKET);
                for message in messages {
                    let key = message
                        .subject
                        .as_str()
                        .trim_start_matches(&prefix)
                        .to_owned();
                    let operation = if message.payload.is_empty() {
                        kv::Operation::Delete
                    } else {
                        kv::Operation::Put
                    };
                    self.apply(&key, operation, &message.payload);
                }
            }
            Err(err) => return Err(format!("reading {user}'s destinations: {err}")),
        }
        Ok(self
            .users
            .read()
            .ok()
            .and_then(|users| users.get(user).cloned())
            .unwrap_or_default())
    }
}
