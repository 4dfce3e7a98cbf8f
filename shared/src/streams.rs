//! The JetStream streams and KV bucket mgpu keeps its state in, and their creation.
//!
//! Creation is idempotent and done by the scheduler at start and by `mgpu admin setup`, so a
//! job can be submitted before the scheduler ever ran.

use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};

use crate::error::StateError;
use crate::job::MAX_SUBMIT_BYTES;
use crate::subjects;

/// Sizes and lifetimes of what mgpu keeps.
#[derive(Clone, Debug)]
pub struct StreamSettings {
    /// Copies of each stream in a NATS cluster (1 for a single server).
    pub replicas: usize,
    /// How long job output is kept.
    pub output_max_age: Duration,
    /// Total output kept across all jobs; the oldest goes first.
    pub output_max_bytes: i64,
    /// How long job events are kept.
    pub events_max_age: Duration,
}

impl Default for StreamSettings {
    fn default() -> Self {
        StreamSettings {
            replicas: 1,
            output_max_age: Duration::from_secs(7 * 24 * 3600),
            output_max_bytes: 4 * 1024 * 1024 * 1024,
            events_max_age: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// How long JetStream remembers a message id to drop a repeated submission or assignment.
const DEDUP_WINDOW: Duration = Duration::from_secs(120);

pub fn stream_configs(settings: &StreamSettings) -> Vec<stream::Config> {
    let replicas = settings.replicas.max(1);
    vec![
        stream::Config {
            name: subjects::REQUESTS_STREAM.into(),
            description: Some(
                "mgpu submissions and cancellations, until the scheduler took them".into(),
            ),
            subjects: vec![
                subjects::SUBMIT.into(),
                subjects::ALL_CANCELS.into(),
                subjects::ALL_HOLDS.into(),
                subjects::ALL_RELEASES.into(),
                subjects::ADMIN_REQUESTS.into(),
            ],
            retention: stream::RetentionPolicy::WorkQueue,
            duplicate_window: DEDUP_WINDOW,
            max_message_size: (MAX_SUBMIT_BYTES + 64 * 1024) as i32,
            // Readers list submissions the scheduler has not taken yet (`records::pending_submissions`).
            allow_direct: true,
            num_replicas: replicas,
            ..Default::default()
        },
        stream::Config {
            name: subjects::EVENTS_STREAM.into(),
            description: Some("mgpu job state transitions".into()),
            subjects: vec![subjects::ALL_EVENTS.into()],
            retention: stream::RetentionPolicy::Limits,
            max_age: settings.events_max_age,
            num_replicas: replicas,
            ..Default::default()
        },
        stream::Config {
            name: subjects::OUTPUT_STREAM.into(),
            description: Some("mgpu job output (raw bytes)".into()),
            subjects: vec![subjects::ALL_OUTPUT.into()],
            retention: stream::RetentionPolicy::Limits,
            max_age: settings.output_max_age,
            max_bytes: settings.output_max_bytes,
            discard: stream::DiscardPolicy::Old,
            num_replicas: replicas,
            ..Default::default()
        },
        stream::Config {
            name: subjects::NODES_STREAM.into(),
            description: Some("last heartbeat of every mgpu node".into()),
            subjects: vec![subjects::ALL_HEARTBEATS.into()],
            retention: stream::RetentionPolicy::Limits,
            max_messages_per_subject: 1,
            allow_direct: true,
            num_replicas: replicas,
            ..Default::default()
        },
        stream::Config {
            name: subjects::ASSIGN_STREAM.into(),
            description: Some(
                "mgpu assignments and controls, until each node's agent took them".into(),
            ),
            subjects: vec![
                subjects::ALL_ASSIGNMENTS.into(),
                subjects::ALL_CONTROLS.into(),
            ],
            retention: stream::RetentionPolicy::WorkQueue,
            duplicate_window: DEDUP_WINDOW,
            num_replicas: replicas,
            ..Default::default()
        },
    ]
}

pub fn jobs_bucket_config(settings: &StreamSettings) -> kv::Config {
    kv::Config {
        bucket: subjects::JOBS_BUCKET.into(),
        description: "mgpu job records, written by the active scheduler".into(),
        history: 1,
        max_value_size: (MAX_SUBMIT_BYTES + 64 * 1024) as i32,
        num_replicas: settings.replicas.max(1),
        ..Default::default()
    }
}

pub fn cluster_bucket_config(settings: &StreamSettings) -> kv::Config {
    kv::Config {
        bucket: subjects::CLUSTER_BUCKET.into(),
        description: "mgpu node administration, policy and usage, written by the scheduler".into(),
        history: 1,
        num_replicas: settings.replicas.max(1),
        ..Default::default()
    }
}

pub fn leader_bucket_config(settings: &StreamSettings) -> kv::Config {
    kv::Config {
        bucket: subjects::LEADER_BUCKET.into(),
        description: "the active mgpu scheduler's lease".into(),
        history: 1,
        max_age: Duration::from_secs(subjects::LEADER_LEASE_TTL_SECS),
        num_replicas: settings.replicas.max(1),
        ..Default::default()
    }
}

/// Creates every stream and the bucket, or brings their settings up to date.
pub async fn ensure(js: &jetstream::Context, settings: &StreamSettings) -> Result<(), StateError> {
    for config in stream_configs(settings) {
        let name = config.name.clone();
        js.create_or_update_stream(config)
            .await
            .map_err(|e| StateError::JetStream(format!("creating stream {name}: {e}")))?;
    }
    js.create_or_update_key_value(jobs_bucket_config(settings))
        .await
        .map_err(|e| {
            StateError::JetStream(format!("creating bucket {}: {e}", subjects::JOBS_BUCKET))
        })?;
    js.create_or_update_key_value(cluster_bucket_config(settings))
        .await
        .map_err(|e| {
            StateError::JetStream(format!("creating bucket {}: {e}", subjects::CLUSTER_BUCKET))
        })?;
    js.create_or_update_key_value(leader_bucket_config(settings))
        .await
        .map_err(|e| {
            StateError::JetStream(format!("creating bucket {}: {e}", subjects::LEADER_BUCKET))
        })?;
    Ok(())
}
