//! The stream and buckets of notifications (see `mgpu_protocol::notify`): the notices stream
//! `mgpu-notify` delivers from, users' destinations, and what the service has sent. Created
//! with the others by [`crate::streams::ensure`] (the scheduler at start, `mgpu admin setup`),
//! and by `mgpu-notify` itself, which may start first.
//!
//! Kept apart from `streams.rs`, which lists them, so that file stays about the job streams;
//! it takes the replica count, not the settings, so the two files do not import each other.

use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};

use crate::error::StateError;
use mgpu_protocol::notify::{self, MAX_NOTICE_BYTES};
use mgpu_protocol::subjects;

/// How long a notice's message id is remembered: a notice published again within it (the
/// service restarted after publishing it, before acknowledging the event) is stored once.
const NOTICE_DEDUP_WINDOW: Duration = Duration::from_secs(120);

/// Every notice on `users.*.notices`, kept until well after the service delivered it.
pub fn notices_stream_config(replicas: usize) -> stream::Config {
    stream::Config {
        name: notify::NOTICES_STREAM.into(),
        description: Some("mgpu notices to users, until mgpu-notify delivered them".into()),
        subjects: vec![subjects::ALL_NOTICES.into()],
        retention: stream::RetentionPolicy::Limits,
        max_age: Duration::from_secs(notify::NOTICES_MAX_AGE_SECS),
        max_messages: notify::NOTICES_MAX_MSGS,
        max_message_size: MAX_NOTICE_BYTES as i32,
        discard: stream::DiscardPolicy::Old,
        duplicate_window: NOTICE_DEDUP_WINDOW,
        num_replicas: replicas.max(1),
        ..Default::default()
    }
}

/// Users' destinations and webhook secrets, one value per key.
pub fn destinations_bucket_config(replicas: usize) -> kv::Config {
    kv::Config {
        bucket: notify::DESTINATIONS_BUCKET.into(),
        description: "mgpu users' notice destinations, readable by their owners, admins and \
                      mgpu-notify"
            .into(),
        history: 1,
        max_value_size: 4096,
        num_replicas: replicas.max(1),
        ..Default::default()
    }
}

/// What mgpu-notify sent, by user, destination and notice, forgotten after a week and a day.
pub fn sent_bucket_config(replicas: usize) -> kv::Config {
    kv::Config {
        bucket: notify::SENT_BUCKET.into(),
        description: "notices mgpu-notify delivered (so none is sent twice)".into(),
        history: 1,
        max_age: Duration::from_secs(notify::SENT_MAX_AGE_SECS),
        max_value_size: 256,
        num_replicas: replicas.max(1),
        ..Default::default()
    }
}

/// Creates (or updates) the notices stream and both buckets: what `mgpu-notify` needs before
/// it reads anything.
pub async fn ensure(js: &jetstream::Context, replicas: usize) -> Result<(), StateError> {
    js.create_or_update_stream(notices_stream_config(replicas))
        .await
        .map_err(|e| {
            StateError::JetStream(format!("creating stream {}: {e}", notify::NOTICES_STREAM))
        })?;
    for config in [
        destinations_bucket_config(replicas),
        sent_bucket_config(replicas),
    ] {
        let bucket = config.bucket.clone();
        js.create_or_update_key_value(config)
            .await
            .map_err(|e| StateError::JetStream(format!("creating bucket {bucket}: {e}")))?;
    }
    Ok(())
}
