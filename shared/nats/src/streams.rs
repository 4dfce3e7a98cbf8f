//! The JetStream streams and KV bucket mgpu keeps its state in, and their creation.
//!
//! Creation is idempotent and done by the scheduler at start and by `mgpu admin setup`, so a
//! job can be submitted before the scheduler ever ran.
//!
//! In a NATS cluster each stream and bucket is kept on several servers ([`Replicas`]): with
//! three copies, any one server may die and JetStream elects a new leader among the other two
//! without losing an acknowledged message.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};

use crate::error::StateError;
use mgpu_protocol::subjects;
use mgpu_protocol::submit::MAX_SUBMIT_BYTES;

/// The most copies mgpu asks for: three survive the loss of any one server (a Raft group of
/// three keeps a majority with two); more would only slow every write down.
pub const MAX_AUTO_REPLICAS: usize = 3;

/// How many copies of each stream and bucket to keep: `auto` (the default) or a number.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Replicas {
    /// `min(3, servers in the cluster)`, see [`Replicas::resolve`].
    #[default]
    Auto,
    /// Exactly this many (1 to 5, JetStream's limit).
    Fixed(usize),
}

impl Replicas {
    /// The number of copies for a client given `server` (one URL or a comma-separated list).
    ///
    /// `auto` counts the distinct server URLs the program was given, capped at three. That is
    /// the operator's own statement of the cluster, known before connecting and the same on
    /// every start. The alternative, counting the `connect_urls` a server announces in its
    /// INFO, is not robust: it is empty while routes are still forming just after a cluster
    /// starts (too few copies, for good), it lists a server once per interface address when it
    /// listens on 0.0.0.0 (too many: stream creation then fails for lack of servers), and it is
    /// empty under `no_advertise`. So a program given a single URL of a cluster keeps one copy;
    /// the scheduler says so in its log, and `--replicas N` overrides.
    pub fn resolve(self, server: &str) -> usize {
        match self {
            Replicas::Fixed(n) => n.max(1),
            Replicas::Auto => distinct_servers(server).clamp(1, MAX_AUTO_REPLICAS),
        }
    }
}

/// How many different servers a comma-separated URL list names (`nats://` and a trailing `/`
/// do not make a URL different).
pub fn distinct_servers(server: &str) -> usize {
    crate::connect::server_list(server)
        .iter()
        .map(|url| {
            let url = url.trim_end_matches('/');
            url.strip_prefix("nats://").unwrap_or(url).to_owned()
        })
        .collect::<BTreeSet<_>>()
        .len()
}

impl FromStr for Replicas {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.eq_ignore_ascii_case("auto") {
            return Ok(Replicas::Auto);
        }
        match text.parse::<usize>() {
            Ok(n) if (1..=5).contains(&n) => Ok(Replicas::Fixed(n)),
            _ => Err(format!("`{text}` is not a replica count: auto, or 1 to 5")),
        }
    }
}

impl fmt::Display for Replicas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Replicas::Auto => f.write_str("auto"),
            Replicas::Fixed(n) => write!(f, "{n}"),
        }
    }
}

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
    /// Finished jobs' records kept in history, in bytes; the oldest go first.
    pub history_max_bytes: i64,
    /// What to do when the server has no room to reserve the output stream's `max_bytes`
    /// (JetStream reserves it whole, against its `max_file_store`).
    pub output_when_too_large: WhenTooLarge,
    /// The same for the history stream.
    pub history_when_too_large: WhenTooLarge,
    /// Whether streams that exist keep their sizes and ages (`mgpu admin setup`, which knows
    /// nothing of the sizes the scheduler was started with: the default history size would cut
    /// a larger history's oldest records). New streams get the sizes above either way.
    pub keep_existing_sizes: bool,
}

impl StreamSettings {
    fn when_too_large(&self, stream: &str) -> WhenTooLarge {
        if stream == subjects::HISTORY_STREAM {
            self.history_when_too_large
        } else {
            self.output_when_too_large
        }
    }
}

/// What [`ensure`] does when JetStream cannot reserve a stream's size (error 10047).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WhenTooLarge {
    /// Keep less, saying so: for sizes nobody chose (the defaults), so that a small disk
    /// (a laptop, a CI machine) still runs a cluster.
    #[default]
    Shrink,
    /// Fail, naming the setting: an administrator's own size is kept or refused, never cut.
    Refuse,
}

/// The least [`WhenTooLarge::Shrink`] goes down to for a new stream before it gives up (an
/// existing one is never shrunk below its present size).
const SMALLEST_SHRUNK_BYTES: i64 = 64 * 1024 * 1024;

impl Default for StreamSettings {
    fn default() -> Self {
        StreamSettings {
            replicas: 1,
            output_max_age: Duration::from_secs(7 * 24 * 3600),
            output_max_bytes: 4 * 1024 * 1024 * 1024,
            events_max_age: Duration::from_secs(7 * 24 * 3600),
            history_max_bytes: subjects::HISTORY_MAX_BYTES,
            output_when_too_large: WhenTooLarge::Shrink,
            history_when_too_large: WhenTooLarge::Shrink,
            keep_existing_sizes: false,
        }
    }
}

/// How long a job's environment is kept at most: a job queued or running longer than this
/// runs without it when it is started again.
pub const JOB_ENV_MAX_AGE: Duration = Duration::from_secs(90 * 24 * 3600);

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
                subjects::RESERVATION_REQUESTS.into(),
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
            name: subjects::AUDIT_STREAM.into(),
            description: Some("mgpu audit: every request with the identity that signed it".into()),
            subjects: vec![subjects::ALL_AUDIT.into()],
            retention: stream::RetentionPolicy::Limits,
            max_age: Duration::from_secs(365 * 24 * 3600),
            num_replicas: replicas,
            ..Default::default()
        },
        history_stream_config(replicas, settings.history_max_bytes),
        output_stream_config(settings),
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
        crate::notify_streams::notices_stream_config(replicas),
    ]
}

/// Jobs' output, public (`jobs.<id>.output`) and private (`users.<key>.jobs.<id>.output`),
/// kept `output_max_age` and `output_max_bytes` at most, the oldest going first.
fn output_stream_config(settings: &StreamSettings) -> stream::Config {
    stream::Config {
        name: subjects::OUTPUT_STREAM.into(),
        description: Some("mgpu job output (raw bytes)".into()),
        subjects: vec![
            subjects::ALL_OUTPUT.into(),
            subjects::ALL_PRIVATE_OUTPUT.into(),
        ],
        retention: stream::RetentionPolicy::Limits,
        max_age: settings.output_max_age,
        max_bytes: settings.output_max_bytes,
        discard: stream::DiscardPolicy::Old,
        num_replicas: settings.replicas.max(1),
        ..Default::default()
    }
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

/// The captured environments ([`crate::job_env`]): one value per live job, each at most a
/// submission's size, and [`JOB_ENV_MAX_AGE`] old at most (so that the environment of a
/// submission that never became a job, which nobody drops, does not stay forever).
pub fn job_env_bucket_config(settings: &StreamSettings) -> kv::Config {
    kv::Config {
        bucket: subjects::JOB_ENV_BUCKET.into(),
        description: "mgpu jobs' environments, readable by their owners, admins and the scheduler"
            .into(),
        history: 1,
        max_age: JOB_ENV_MAX_AGE,
        max_value_size: MAX_SUBMIT_BYTES as i32,
        num_replicas: settings.replicas.max(1),
        ..Default::default()
    }
}

/// The largest entry of the nonces' bucket: a few nonces of one batch of requests.
pub const NONCE_VALUE_MAX: usize = 1024;

/// The request nonces seen lately, so that a replay is known after a scheduler restart.
pub fn nonce_bucket_config(settings: &StreamSettings) -> kv::Config {
    kv::Config {
        bucket: subjects::NONCE_BUCKET.into(),
        description: "request nonces the mgpu scheduler saw lately (replays are refused)".into(),
        history: 1,
        max_age: Duration::from_secs(subjects::NONCE_TTL_SECS),
        max_value_size: NONCE_VALUE_MAX as i32,
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

/// Finished jobs' records once they left the live bucket, one message per job under
/// `history.<owner key>.<id>`, kept a year and `max_bytes` at most.
pub fn history_stream_config(replicas: usize, max_bytes: i64) -> stream::Config {
    stream::Config {
        name: subjects::HISTORY_STREAM.into(),
        description: Some("mgpu job history: finished jobs' records, by user".into()),
        subjects: vec![subjects::ALL_HISTORY.into()],
        retention: stream::RetentionPolicy::Limits,
        max_age: Duration::from_secs(subjects::HISTORY_MAX_AGE_SECS),
        max_bytes,
        // One record per job: a move retried after a crash within the hour is stored once.
        duplicate_window: Duration::from_secs(3600),
        allow_direct: true,
        num_replicas: replicas,
        ..Default::default()
    }
}

/// The node-name leases' bucket with `replicas` copies. Agents create it themselves when
/// they start before any scheduler (they may create this one stream and no other).
pub fn node_lease_bucket_config(replicas: usize) -> kv::Config {
    kv::Config {
        bucket: subjects::NODE_LEASE_BUCKET.into(),
        description: "which agent runs as each node name".into(),
        history: 1,
        max_age: Duration::from_secs(subjects::NODE_LEASE_TTL_SECS),
        num_replicas: replicas.max(1),
        ..Default::default()
    }
}

/// Creates every stream and bucket, or brings their settings up to date.
///
/// An existing stream whose number of replicas differs from `settings.replicas` (a single
/// server grown into a cluster, or `--replicas` changed) is updated in place: a clustered
/// JetStream adds or removes copies and fills new ones from the leader in the background,
/// keeping every message. The change is logged, and so is a server that kept another count.
pub async fn ensure(js: &jetstream::Context, settings: &StreamSettings) -> Result<(), StateError> {
    for mut config in stream_configs(settings) {
        let name = config.name.clone();
        let existing = existing_config(js, &name).await;
        if settings.keep_existing_sizes
            && let Some(existing) = &existing
        {
            config.max_bytes = existing.max_bytes;
            config.max_age = existing.max_age;
        }
        let before = existing.map(|existing| existing.num_replicas);
        let info = create_within_storage(js, config, settings.when_too_large(&name)).await?;
        log_replicas(&name, before, info.config.num_replicas, settings.replicas);
    }
    for config in [
        jobs_bucket_config(settings),
        job_env_bucket_config(settings),
        nonce_bucket_config(settings),
        cluster_bucket_config(settings),
        leader_bucket_config(settings),
        node_lease_bucket_config(settings.replicas),
        crate::notify_streams::destinations_bucket_config(settings.replicas),
        crate::notify_streams::sent_bucket_config(settings.replicas),
    ] {
        let bucket = config.bucket.clone();
        let stream = format!("KV_{bucket}");
        let before = replicas_of(js, &stream).await;
        js.create_or_update_key_value(config)
            .await
            .map_err(|e| StateError::JetStream(format!("creating bucket {bucket}: {e}")))?;
        let after = replicas_of(js, &stream).await.unwrap_or(settings.replicas);
        log_replicas(&stream, before, after, settings.replicas);
    }
    Ok(())
}

/// Creates or updates one stream. When the server cannot reserve its `max_bytes`, either
/// halves it until it fits (down to [`SMALLEST_SHRUNK_BYTES`], or the size the stream already
/// has), warning with what was kept and how to get the rest, or fails naming the setting, as
/// `when_too_large` says.
async fn create_within_storage(
    js: &jetstream::Context,
    mut config: stream::Config,
    when_too_large: WhenTooLarge,
) -> Result<stream::Info, StateError> {
    let name = config.name.clone();
    let asked = config.max_bytes;
    loop {
        let error = match js.create_or_update_stream(config.clone()).await {
            Ok(info) => {
                if config.max_bytes != asked {
                    tracing::warn!(
                        stream = %name,
                        asked = %human_bytes(asked),
                        kept = %human_bytes(config.max_bytes),
                        "JetStream has no room to reserve this stream's size: it keeps less \
                         (give nats-server more storage with `jetstream {{ max_file_store }}`, \
                         or set {} to what fits)",
                        size_setting(&name)
                    );
                }
                return Ok(info);
            }
            Err(error) => error,
        };
        let no_room = is_storage_exceeded(&error) && config.max_bytes > 0;
        if no_room && when_too_large == WhenTooLarge::Shrink {
            // Never below what an existing stream already keeps: shrinking that would throw
            // away its oldest messages (history, output) for a reservation it already has.
            let least = existing_max_bytes(js, &name)
                .await
                .unwrap_or(SMALLEST_SHRUNK_BYTES);
            let smaller = (config.max_bytes / 2).max(least);
            if smaller < config.max_bytes {
                config.max_bytes = smaller;
                continue;
            }
        }
        let why = if no_room {
            format!(
                "creating stream {name}: JetStream has no room to reserve {} for it ({error}); \
                 lower {} or give nats-server more storage (`jetstream {{ max_file_store }}`, \
                 by default 75% of the free disk)",
                human_bytes(config.max_bytes),
                size_setting(&name)
            )
        } else {
            format!("creating stream {name}: {error}")
        };
        return Err(StateError::JetStream(why));
    }
}

/// The `max_bytes` of stream `name` as it exists (None: no such stream, or it cannot be read).
async fn existing_max_bytes(js: &jetstream::Context, name: &str) -> Option<i64> {
    Some(existing_config(js, name).await?.max_bytes).filter(|bytes| *bytes > 0)
}

/// Whether JetStream refused a stream for want of room to reserve its size: a single server
/// says so with 10047; a cluster, which looks for peers that each have the room, answers
/// "no suitable peers for placement, insufficient storage" (10005, whose other reasons,
/// such as too few servers for the replicas, shrinking would not cure).
fn is_storage_exceeded(error: &async_nats::jetstream::context::CreateStreamError) -> bool {
    use async_nats::jetstream::ErrorCode;
    use async_nats::jetstream::context::CreateStreamErrorKind;
    match error.kind() {
        CreateStreamErrorKind::JetStream(e) => {
            e.error_code() == ErrorCode::STORAGE_RESOURCES_EXCEEDED
                || (e.error_code() == ErrorCode::CLUSTER_NO_PEERS
                    && e.to_string().contains("insufficient storage"))
        }
        _ => false,
    }
}

/// The scheduler setting that sizes a stream.
fn size_setting(stream: &str) -> &'static str {
    if stream == subjects::HISTORY_STREAM {
        "history_max_gib"
    } else {
        "output_max_mib"
    }
}

/// Bytes as GiB or MiB, whichever reads better.
fn human_bytes(bytes: i64) -> String {
    const MIB: i64 = 1024 * 1024;
    if bytes >= 1024 * MIB && bytes % (1024 * MIB) == 0 {
        format!("{} GiB", bytes / (1024 * MIB))
    } else {
        format!("{} MiB", bytes / MIB)
    }
}

/// The replicas an existing stream has (None when it does not exist yet or cannot be read).
async fn replicas_of(js: &jetstream::Context, stream: &str) -> Option<usize> {
    Some(existing_config(js, stream).await?.num_replicas)
}

/// The configuration of stream `name` as it exists (None when it does not exist yet or cannot
/// be read).
async fn existing_config(js: &jetstream::Context, name: &str) -> Option<stream::Config> {
    let stream = js.get_stream(name).await.ok()?;
    Some(stream.cached_info().config.clone())
}

fn log_replicas(stream: &str, before: Option<usize>, after: usize, wanted: usize) {
    if let Some(before) = before
        && before != after
    {
        tracing::info!(
            stream,
            from = before,
            to = after,
            "changed the number of replicas; JetStream copies the data in the background"
        );
    }
    if after != wanted.max(1) {
        tracing::warn!(
            stream,
            replicas = after,
            wanted,
            "the server kept a different number of replicas"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_replicas_is_the_number_of_servers_given_up_to_three() {
        assert_eq!(Replicas::Auto.resolve("nats://127.0.0.1:4222"), 1);
        assert_eq!(Replicas::Auto.resolve("nats://a:4222,nats://b:4222"), 2);
        assert_eq!(
            Replicas::Auto.resolve("nats://a:4222, b:4222 ,nats://c:4222/"),
            3
        );
        // The same server twice is one server.
        assert_eq!(
            Replicas::Auto.resolve("nats://a:4222,a:4222,nats://a:4222/"),
            1
        );
        assert_eq!(Replicas::Auto.resolve("a,b,c,d,e"), 3);
        assert_eq!(Replicas::Fixed(2).resolve("a,b,c"), 2);
    }

    #[test]
    fn replicas_parse_from_the_command_line() {
        assert_eq!("auto".parse(), Ok(Replicas::Auto));
        assert_eq!("3".parse(), Ok(Replicas::Fixed(3)));
        assert!("0".parse::<Replicas>().is_err());
        assert!("6".parse::<Replicas>().is_err());
        assert!("many".parse::<Replicas>().is_err());
        assert_eq!(Replicas::Fixed(3).to_string(), "3");
    }
}
