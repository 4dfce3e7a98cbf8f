//! Reading the cluster bucket (`mgpu-cluster`): node administration, the policy in force,
//! fair-share usage, the last pass's expected starts and the reservations, each alone or all
//! at once ([`cluster_state`]), as `mgpu queue`, `mgpu nodes`, `mgpu reservations` and the
//! scheduler at start read them.

use std::collections::BTreeMap;

use async_nats::jetstream::{self, kv};

use crate::error::StateError;
use crate::reading::{bucket, is_deletion, last_per_subject};
use mgpu_protocol::node::NodeAdmin;
use mgpu_protocol::priority::{Policy, UsageBook};
use mgpu_protocol::subjects;

/// The cluster bucket (node administration, policy, usage).
pub async fn cluster_bucket(js: &jetstream::Context) -> Result<kv::Store, StateError> {
    bucket(js, subjects::CLUSTER_BUCKET).await
}

/// Reads one JSON value from the cluster bucket; None when the key was never written.
async fn cluster_value<T: serde::de::DeserializeOwned>(
    js: &jetstream::Context,
    key: &str,
) -> Result<Option<T>, StateError> {
    let bucket = cluster_bucket(js).await?;
    match bucket.get(key).await.map_err(StateError::jetstream)? {
        Some(bytes) => {
            serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|error| StateError::Corrupt {
                    key: key.to_owned(),
                    error,
                })
        }
        None => Ok(None),
    }
}

/// When the scheduler expects waiting jobs to start (empty where it never said, or said what
/// this version cannot read).
pub async fn plan(
    js: &jetstream::Context,
) -> Result<mgpu_protocol::plan::PlanSnapshot, StateError> {
    Ok(cluster_value(js, subjects::PLAN_KEY)
        .await
        .unwrap_or_default()
        .unwrap_or_default())
}

/// Users' decayed GPU usage, for fair share.
pub async fn usage(js: &jetstream::Context) -> Result<UsageBook, StateError> {
    Ok(cluster_value(js, subjects::USAGE_KEY)
        .await?
        .unwrap_or_default())
}

/// Drained nodes and paused GPUs, by node name.
pub async fn node_admin(
    js: &jetstream::Context,
) -> Result<BTreeMap<String, NodeAdmin>, StateError> {
    let (prefix, messages) = keys_under(js, NODE_ADMIN_PREFIX).await?;
    Ok(messages
        .iter()
        .filter_map(|m| node_admin_entry(m.subject.as_str().strip_prefix(&prefix)?, m))
        .collect())
}

/// The latest value of every cluster-bucket key that starts with `key_prefix` (deletions left
/// out), with the subject prefix those keys' messages carry.
async fn keys_under(
    js: &jetstream::Context,
    key_prefix: &str,
) -> Result<(String, Vec<jetstream::Message>), StateError> {
    let prefix = format!("$KV.{}.{key_prefix}", subjects::CLUSTER_BUCKET);
    let filter = format!("{prefix}*");
    let messages = last_per_subject(js, subjects::CLUSTER_BUCKET_STREAM, &filter, false).await?;
    let kept = messages.into_iter().filter(|m| !is_deletion(m)).collect();
    Ok((prefix, kept))
}

/// How the cluster bucket's keys of node administration begin (`node.<name>`).
const NODE_ADMIN_PREFIX: &str = "node.";

/// One node's admin marks; a malformed entry is left out, as if the node had none.
fn node_admin_entry(node: &str, message: &jetstream::Message) -> Option<(String, NodeAdmin)> {
    let admin = serde_json::from_slice(&message.payload).ok()?;
    Some((node.to_owned(), admin))
}

/// What the cluster bucket holds, read at once: [`policy`], [`usage`], [`node_admin`] and the
/// expected starts.
#[derive(Debug, Default)]
pub struct ClusterState {
    /// None where the scheduler never wrote one.
    pub policy: Option<Policy>,
    /// None where the scheduler never wrote one.
    pub usage: Option<UsageBook>,
    pub node_admin: BTreeMap<String, NodeAdmin>,
    /// The expected starts of waiting jobs; empty where the scheduler never wrote them, or
    /// wrote what this version cannot read (a listing goes on without them).
    pub plan: mgpu_protocol::plan::PlanSnapshot,
    /// Reservations kept (booked, and those over for a few days), by name.
    pub reservations: BTreeMap<String, mgpu_protocol::reservation::Reservation>,
}

/// The whole cluster bucket in one read: one consumer, where reading its three parts apart
/// takes three lookups and three reads, on every `mgpu queue` and `mgpu nodes`.
pub async fn cluster_state(js: &jetstream::Context) -> Result<ClusterState, StateError> {
    let prefix = format!("$KV.{}.", subjects::CLUSTER_BUCKET);
    let filter = format!("{prefix}>");
    let messages = last_per_subject(js, subjects::CLUSTER_BUCKET_STREAM, &filter, false).await?;
    let mut state = ClusterState::default();
    for message in messages.iter().filter(|m| !is_deletion(m)) {
        let Some(key) = message.subject.as_str().strip_prefix(&prefix) else {
            continue;
        };
        let corrupt = |error| StateError::Corrupt {
            key: key.to_owned(),
            error,
        };
        if key == subjects::POLICY_KEY {
            state.policy = Some(serde_json::from_slice(&message.payload).map_err(corrupt)?);
        } else if key == subjects::USAGE_KEY {
            state.usage = Some(serde_json::from_slice(&message.payload).map_err(corrupt)?);
        } else if key == subjects::PLAN_KEY {
            state.plan = serde_json::from_slice(&message.payload).unwrap_or_default();
        } else if let Some(node) = key.strip_prefix(NODE_ADMIN_PREFIX)
            && let Some((node, admin)) = node_admin_entry(node, message)
        {
            state.node_admin.insert(node, admin);
        } else if key.starts_with(subjects::RESERVATION_KEY_PREFIX)
            && let Some(reservation) = reservation_entry(message)
        {
            state
                .reservations
                .insert(reservation.name.clone(), reservation);
        }
    }
    Ok(state)
}

/// Every reservation the cluster bucket keeps (the scheduler loads them when it starts).
pub async fn reservations(
    js: &jetstream::Context,
) -> Result<Vec<mgpu_protocol::reservation::Reservation>, StateError> {
    let (_, messages) = keys_under(js, subjects::RESERVATION_KEY_PREFIX).await?;
    Ok(messages.iter().filter_map(reservation_entry).collect())
}

/// One reservation's record; a malformed one is left out (and logged), as if never booked.
fn reservation_entry(
    message: &jetstream::Message,
) -> Option<mgpu_protocol::reservation::Reservation> {
    match serde_json::from_slice(&message.payload) {
        Ok(reservation) => Some(reservation),
        Err(err) => {
            tracing::warn!(subject = %message.subject, "an unreadable reservation: {err}");
            None
        }
    }
}
