//! Leadership between scheduler replicas: the active one holds a lease, the key `scheduler`
//! in the `mgpu-leader` KV bucket, whose entries expire after a few seconds. It renews the
//! lease every second with compare-and-set; a standby tries to create the key every half
//! second and becomes active as soon as the key has expired. A replica that fails to renew
//! because someone else holds the key now stops acting at once; one whose key merely expired
//! while NATS could not answer (a server lost, the bucket electing a leader) takes it again
//! if nobody else did, and goes on.

use std::time::Duration;

use anyhow::{Result, anyhow};
use async_nats::jetstream::{self, kv};
use tokio::sync::watch;

use mgpu_protocol::subjects;

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
                    match take_again(&bucket, &holder).await {
                        Retaken::Held(next) => revision = next,
                        Retaken::ByAnother => {
                            tracing::error!("the scheduler lease was taken over: stepping down");
                            let _ = lost_tx.send(true);
                            return;
                        }
                        // The next renewal finds out.
                        Retaken::Unknown => {}
                    }
                }
                // A passing NATS error: try again; the lease outlives a few missed renewals.
                Err(err) => tracing::warn!(%err, "renewing the scheduler lease"),
            }
        }
    });
    Lease { lost, renewer }
}

/// Who holds the lease after a renewal found the key changed or gone.
enum Retaken {
    /// This replica, at this revision.
    Held(u64),
    /// Another replica.
    ByAnother,
    /// NATS did not answer.
    Unknown,
}

/// After a renewal found the key changed or gone. Gone: it expired while NATS could not renew
/// it (the bucket's stream electing a leader takes longer than the lease); creating it again
/// succeeds only if no other replica has taken it since, and then this one simply goes on,
/// where stepping down would restart the scheduler for nothing. Changed but still naming this
/// replica: a renewal landed and its answer was lost.
async fn take_again(bucket: &kv::Store, holder: &str) -> Retaken {
    match bucket
        .create(subjects::LEADER_KEY, holder.to_owned().into())
        .await
    {
        Ok(revision) => {
            tracing::warn!(
                "the scheduler lease expired while it could not be renewed; no other replica had taken it: holding it again"
            );
            return Retaken::Held(revision);
        }
        Err(err) if err.kind() == kv::CreateErrorKind::AlreadyExists => {}
        Err(err) => {
            tracing::warn!(%err, "taking the expired scheduler lease again");
            return Retaken::Unknown;
        }
    }
    match bucket.entry(subjects::LEADER_KEY).await {
        Ok(Some(entry))
            if entry.operation == kv::Operation::Put
                && entry.value.as_ref() == holder.as_bytes() =>
        {
            Retaken::Held(entry.revision)
        }
        Ok(Some(entry)) if entry.operation == kv::Operation::Put => Retaken::ByAnother,
        // Gone again in between: the next renewal finds out.
        Ok(_) => Retaken::Unknown,
        Err(err) => {
            tracing::warn!(%err, "reading the scheduler lease");
            Retaken::Unknown
        }
    }
}
