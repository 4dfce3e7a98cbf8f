//! Leadership between scheduler replicas: the active one holds a lease, the key `scheduler`
//! in the `mgpu-leader` KV bucket, whose entries expire after a few seconds. It renews the
//! lease every second with compare-and-set; a standby tries to create the key every half
//! second and becomes active as soon as the key has expired. A replica that fails to renew
//! (someone else holds the key now) stops acting at once.

use std::time::Duration;

use anyhow::{Result, anyhow};
use async_nats::jetstream::{self, kv};
use tokio::sync::watch;

use mgpu_shared::subjects;

const RENEW_EVERY: Duration = Duration::from_secs(1);
const RETRY_EVERY: Duration = Duration::from_millis(500);

/// A held lease. Dropping it stops renewal (the key then expires).
pub struct Lease {
    /// Turns true when the lease is lost.
    pub lost: watch::Receiver<bool>,
    renewer: tokio::task::JoinHandle<()>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.renewer.abort();
    }
}

/// Waits until this replica holds the lease (or `shutdown` turns true: None).
pub async fn acquire(
    js: &jetstream::Context,
    holder: &str,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Option<Lease>> {
    let bucket = js
        .get_key_value(subjects::LEADER_BUCKET)
        .await
        .map_err(|e| anyhow!("opening the leader bucket: {e}"))?;
    let mut announced = false;
    loop {
        match bucket
            .create(subjects::LEADER_KEY, holder.to_owned().into())
            .await
        {
            Ok(revision) => {
                tracing::info!(holder, "holding the scheduler lease: active");
                return Ok(Some(start_renewing(bucket, holder.to_owned(), revision)));
            }
            Err(err) if err.kind() == kv::CreateErrorKind::AlreadyExists => {
                if !announced {
                    let current = bucket
                        .get(subjects::LEADER_KEY)
                        .await
                        .ok()
                        .flatten()
                        .map(|v| String::from_utf8_lossy(&v).into_owned())
                        .unwrap_or_default();
                    tracing::info!(active = %current, "another scheduler is active: standing by");
                    announced = true;
                }
            }
            Err(err) => tracing::warn!(%err, "trying to take the scheduler lease"),
        }
        tokio::select! {
            _ = shutdown.changed() => return Ok(None),
            _ = tokio::time::sleep(RETRY_EVERY) => {}
        }
    }
}

fn start_renewing(bucket: kv::Store, holder: String, mut revision: u64) -> Lease {
    let (lost_tx, lost) = watch::channel(false);
    let renewer = tokio::spawn(async move {
        loop {
            tokio::time::sleep(RENEW_EVERY).await;
            match bucket
                .update(subjects::LEADER_KEY, holder.clone().into(), revision)
                .await
            {
                Ok(next) => revision = next,
                Err(err) if err.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    tracing::error!("the scheduler lease was taken over: stepping down");
                    let _ = lost_tx.send(true);
                    return;
                }
                // A passing NATS error: try again; the lease outlives a few missed renewals.
                Err(err) => tracing::warn!(%err, "renewing the scheduler lease"),
            }
        }
    });
    Lease { lost, renewer }
}
