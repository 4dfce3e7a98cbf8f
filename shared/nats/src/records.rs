//! Reading mgpu's state straight from JetStream: job records from the `mgpu-jobs` bucket and
//! node heartbeats from `MGPU_NODES`. The CLI uses this, so `mgpu queue` answers while the
//! scheduler is down.

use async_nats::jetstream::{self, consumer, kv, stream};
use futures::StreamExt;

use crate::error::StateError;
use mgpu_protocol::ids::{JobId, is_job_id_prefix};
use mgpu_protocol::job::{JobRecord, JobState, WaitReason, Waiting};
use mgpu_protocol::node::NodeHeartbeat;
use mgpu_protocol::subjects;
use mgpu_protocol::submit::SubmitRequest;

/// Header JetStream's KV layer puts on deletions.
const KV_OPERATION: &str = "KV-Operation";

/// Maps a failed stream lookup to [`StateError::NotSetUp`] when the stream is missing.
pub fn stream_lookup_error(err: impl std::fmt::Display) -> StateError {
    let text = err.to_string();
    if text.contains("stream not found") || text.contains("10059") {
        StateError::NotSetUp
    } else {
        StateError::JetStream(text)
    }
}

/// How long one try to create a reader (an ordered consumer, a KV watch) may take.
const READER_TRY: std::time::Duration = std::time::Duration::from_secs(1);
/// Tries to create a reader before giving up.
const READER_TRIES: u32 = 10;

/// Runs `create` (which makes an ephemeral reader: an ordered consumer, a KV watch) until it
/// answers within [`READER_TRY`], at most [`READER_TRIES`] times. In a NATS cluster with a
/// server down, the server may place such a consumer on the missing one, and the request
/// then times out (nats-io/natscli#1067); the next try lands elsewhere.
pub async fn create_reader<T, E, F, Fut>(what: &str, mut create: F) -> Result<T, StateError>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut last = String::new();
    for _ in 0..READER_TRIES {
        match tokio::time::timeout(READER_TRY, create()).await {
            Ok(Ok(reader)) => return Ok(reader),
            Ok(Err(err)) => {
                let text = err.to_string();
                // A refusal (stream missing, bad request) will not change on a retry; JetStream
                // "temporarily unavailable" (10008, a cluster that lost a server re-electing
                // its leaders) will.
                let passing = ["timed out", "no responders", "temporarily unavailable"];
                if !passing.iter().any(|why| text.contains(why)) {
                    return Err(StateError::JetStream(format!("{what}: {text}")));
                }
                last = text;
                // An answer that came at once comes again at once: give the election a moment.
                tokio::time::sleep(READER_TRY / 4).await;
            }
            Err(_) => last = format!("no answer within {READER_TRY:?}"),
        }
    }
    Err(StateError::JetStream(format!(
        "{what}: {last} ({READER_TRIES} tries)"
    )))
}

/// The job records bucket.
pub async fn jobs_bucket(js: &jetstream::Context) -> Result<kv::Store, StateError> {
    bucket(js, subjects::JOBS_BUCKET).await
}

/// A KV bucket, asked again while its stream elects a leader and cannot answer.
async fn bucket(js: &jetstream::Context, name: &str) -> Result<kv::Store, StateError> {
    let mut tries = 0;
    loop {
        match js.get_key_value(name).await {
            Ok(store) => return Ok(store),
            Err(err) => {
                let text = err.to_string();
                tries += 1;
                if tries >= READER_TRIES || !text.contains("timed out") {
                    return Err(stream_lookup_error(text));
                }
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
        }
    }
}

/// How long a read of the latest records may wait for its next message, while the consumer
/// says more are due, before it starts over with a new consumer.
const READ_STALL: std::time::Duration = std::time::Duration::from_secs(5);
/// Reads started before giving up.
const READ_ATTEMPTS: u32 = 5;

/// The last message of every subject matching `filter` in `stream_name`, oldest subject first.
/// Returns at once when the stream holds nothing.
pub async fn last_per_subject(
    js: &jetstream::Context,
    stream_name: &str,
    filter: &str,
    headers_only: bool,
) -> Result<Vec<jetstream::Message>, StateError> {
    let mut out = Vec::new();
    for_each_last_per_subject(js, stream_name, filter, headers_only, |delivery| {
        match delivery {
            Delivery::Message(message, left) => {
                out.reserve(usize::try_from(left).unwrap_or(0).saturating_add(1));
                out.push(message);
            }
            Delivery::StartOver => out.clear(),
        }
        Ok(())
    })
    .await?;
    Ok(out)
}

/// What [`for_each_last_per_subject`] hands its reader.
// Moved straight into the reader's callback and never stored: boxing the message would only
// add an allocation for each of up to 100 000 records.
#[allow(clippy::large_enum_variant)]
pub enum Delivery {
    /// The next message, and how many are still to come after it.
    Message(jetstream::Message, u64),
    /// The read starts over from the first message: forget what came so far.
    StartOver,
}

/// [`last_per_subject`], handing each message to `each` as it arrives instead of collecting
/// them: a reader of many large records decodes them while the rest are on their way, and
/// never holds every raw message at once. Stops at the first error `each` returns.
///
/// A read whose consumer is lost (its server died) starts over with a new one, after
/// [`Delivery::StartOver`]. It is not left to async-nats's own recovery of an ordered consumer,
/// which goes on from the last stream sequence seen: that delivers every later message,
/// older revisions of later subjects included, not the last per subject; and a user may not
/// delete consumers, which that recovery tries first.
pub async fn for_each_last_per_subject(
    js: &jetstream::Context,
    stream_name: &str,
    filter: &str,
    headers_only: bool,
    each: impl FnMut(Delivery) -> Result<(), StateError>,
) -> Result<(), StateError> {
    let deliver = consumer::DeliverPolicy::LastPerSubject;
    for_each_delivered(js, (stream_name, filter), headers_only, deliver, each).await
}

/// The messages of `stream_name` on `filter` stored at or after `since` (every one when
/// None), handed to `each` as they arrive, as [`for_each_last_per_subject`] does.
pub async fn for_each_since(
    js: &jetstream::Context,
    stream_name: &str,
    filter: &str,
    since: Option<mgpu_protocol::Timestamp>,
    each: impl FnMut(Delivery) -> Result<(), StateError>,
) -> Result<(), StateError> {
    let nanos = since.and_then(|t| t.timestamp_nanos_opt()).map(i128::from);
    let deliver = match nanos.and_then(|n| time::OffsetDateTime::from_unix_timestamp_nanos(n).ok())
    {
        Some(start_time) => consumer::DeliverPolicy::ByStartTime { start_time },
        None => consumer::DeliverPolicy::All,
    };
    for_each_delivered(js, (stream_name, filter), false, deliver, each).await
}

async fn for_each_delivered(
    js: &jetstream::Context,
    (stream_name, filter): (&str, &str),
    headers_only: bool,
    deliver: consumer::DeliverPolicy,
    mut each: impl FnMut(Delivery) -> Result<(), StateError>,
) -> Result<(), StateError> {
    let stream: stream::Stream = js
        .get_stream(stream_name)
        .await
        .map_err(stream_lookup_error)?;
    let mut why = String::new();
    for attempt in 0..READ_ATTEMPTS {
        if attempt > 0 {
            tracing::warn!("reading {stream_name} starts over: {why}");
            each(Delivery::StartOver)?;
        }
        let read = (filter, headers_only, deliver);
        match read_delivered(&stream, read, &mut each).await? {
            Read::Done => return Ok(()),
            Read::Lost(reason) => why = reason,
        }
    }
    Err(StateError::JetStream(format!(
        "reading {stream_name}: {why} ({READ_ATTEMPTS} tries)"
    )))
}

/// How one read of [`for_each_last_per_subject`] ended.
enum Read {
    Done,
    /// The consumer stopped delivering, or was replaced: start over.
    Lost(String),
}

async fn read_delivered(
    stream: &stream::Stream,
    (filter, headers_only, deliver): (&str, bool, consumer::DeliverPolicy),
    each: &mut impl FnMut(Delivery) -> Result<(), StateError>,
) -> Result<Read, StateError> {
    let consumer = create_reader("reading the latest records", || {
        stream.create_consumer(consumer::pull::OrderedConfig {
            // Named, so the request names its filter (`CONSUMER.CREATE.<stream>.<name>.<filter>`)
            // and the server's permissions can limit what a reader may filter on: a user
            // reads their own history only.
            name: Some(format!("mgpu-read-{}", JobId::random())),
            deliver_policy: deliver,
            filter_subject: filter.to_owned(),
            headers_only,
            ..Default::default()
        })
    })
    .await?;
    // The answer to the creation already says how many messages wait: no second round trip.
    if consumer.cached_info().num_pending == 0 {
        return Ok(Read::Done);
    }
    let mut messages = match consumer.messages().await {
        Ok(messages) => messages,
        Err(err) => return Ok(Read::Lost(err.to_string())),
    };
    // async-nats replaces a lost ordered consumer by itself, and the replacement numbers its
    // deliveries from 1 again: a number out of turn means this read's consumer is gone.
    let mut expected = 1;
    loop {
        let message = match tokio::time::timeout(READ_STALL, messages.next()).await {
            Err(_) => return Ok(Read::Lost(format!("no message for {READ_STALL:?}"))),
            Ok(None) => return Ok(Read::Lost("the consumer ended".to_owned())),
            Ok(Some(Err(err))) => return Ok(Read::Lost(err.to_string())),
            Ok(Some(Ok(message))) => message,
        };
        let info = message.info().map_err(StateError::jetstream)?;
        let (sequence, left) = (info.consumer_sequence, info.pending);
        if sequence != expected {
            return Ok(Read::Lost(format!(
                "the consumer was replaced (delivery {sequence}, {expected} expected)"
            )));
        }
        expected += 1;
        each(Delivery::Message(message, left))?;
        if left == 0 {
            return Ok(Read::Done);
        }
    }
}

fn is_deletion(message: &jetstream::Message) -> bool {
    message
        .headers
        .as_ref()
        .and_then(|h| h.get(KV_OPERATION))
        .is_some_and(|op| op.as_str() != "PUT")
}

fn key_of(subject: &str) -> &str {
    subject
        .strip_prefix(&format!("$KV.{}.", subjects::JOBS_BUCKET))
        .unwrap_or(subject)
}

/// Every job: the records in the bucket, plus submissions the scheduler has not taken yet.
///
/// A job moves from the pending submissions to the bucket (recorded first, then removed from
/// the queue), so reading in that same order never misses one that moves in between.
pub async fn list_jobs(js: &jetstream::Context) -> Result<Vec<JobRecord>, StateError> {
    list_jobs_decoded(js, |bytes| serde_json::from_slice(bytes)).await
}

/// [`list_jobs`] for listings: each record decoded by [`JobRecord::from_listing_json`], which
/// leaves out the parts of the spec no listing shows (the environment, above all). The
/// records are for showing only.
pub async fn list_jobs_for_listing(js: &jetstream::Context) -> Result<Vec<JobRecord>, StateError> {
    list_jobs_decoded(js, JobRecord::from_listing_json).await
}

async fn list_jobs_decoded(
    js: &jetstream::Context,
    decode: fn(&[u8]) -> serde_json::Result<JobRecord>,
) -> Result<Vec<JobRecord>, StateError> {
    let pending = pending_submissions(js).await?;
    let mut jobs = recorded_jobs(js, decode).await?;
    // Usually the scheduler has taken every submission: no set of 100 000 ids to build then.
    if !pending.is_empty() {
        let known: std::collections::HashSet<&JobId> = jobs.iter().map(|j| &j.id).collect();
        let missing: Vec<JobRecord> = pending
            .into_iter()
            .filter(|p| !known.contains(&p.id))
            .collect();
        jobs.extend(missing);
    }
    Ok(jobs)
}

/// Every record in the jobs bucket, decoded as it arrives.
async fn recorded_jobs(
    js: &jetstream::Context,
    decode: fn(&[u8]) -> serde_json::Result<JobRecord>,
) -> Result<Vec<JobRecord>, StateError> {
    let mut jobs = Vec::new();
    for_each_last_per_subject(
        js,
        subjects::JOBS_BUCKET_STREAM,
        &format!("$KV.{}.>", subjects::JOBS_BUCKET),
        false,
        |delivery| {
            let (message, left) = match delivery {
                Delivery::Message(message, left) => (message, left),
                Delivery::StartOver => {
                    jobs.clear();
                    return Ok(());
                }
            };
            if is_deletion(&message) {
                return Ok(());
            }
            jobs.reserve(usize::try_from(left).unwrap_or(0).saturating_add(1));
            let record = decode(&message.payload).map_err(|error| StateError::Corrupt {
                key: key_of(message.subject.as_str()).to_owned(),
                error,
            })?;
            jobs.push(record);
            Ok(())
        },
    )
    .await?;
    Ok(jobs)
}

/// Every job id (recorded or pending), without reading the records.
pub async fn list_job_ids(js: &jetstream::Context) -> Result<Vec<String>, StateError> {
    // Pending first: see `list_jobs` on why the order matters.
    let pending = pending_submissions(js).await?;
    let messages = last_per_subject(
        js,
        subjects::JOBS_BUCKET_STREAM,
        &format!("$KV.{}.>", subjects::JOBS_BUCKET),
        true,
    )
    .await?;
    let mut ids: Vec<String> = messages
        .iter()
        .filter(|m| !is_deletion(m))
        .map(|m| key_of(m.subject.as_str()).to_owned())
        .collect();
    for pending in pending {
        if !ids.iter().any(|id| id == pending.id.as_str()) {
            ids.push(pending.id.to_string());
        }
    }
    Ok(ids)
}

/// Submissions stored in `MGPU_REQUESTS` that the scheduler has not recorded yet (it is
/// stopped, or has not got to them), shown as queued jobs waiting for the scheduler.
pub async fn pending_submissions(js: &jetstream::Context) -> Result<Vec<JobRecord>, StateError> {
    let stream = js
        .get_stream(subjects::REQUESTS_STREAM)
        .await
        .map_err(stream_lookup_error)?;
    // Looking the stream up fetched its state already.
    let info = stream.cached_info();
    if info.state.messages == 0 {
        return Ok(Vec::new());
    }
    let mut pending = Vec::new();
    let mut next = info.state.first_sequence;
    loop {
        let message = match stream
            .direct_get_next_for_subject(subjects::SUBMIT, Some(next))
            .await
        {
            Ok(message) => message,
            Err(err) if err.kind() == stream::DirectGetErrorKind::NotFound => break,
            Err(err) => return Err(StateError::jetstream(err)),
        };
        next = message.sequence + 1;
        // Malformed submissions are the scheduler's to refuse; they are no job to show.
        if let Ok(request) = serde_json::from_slice::<SubmitRequest>(&message.payload) {
            let nanos = i64::try_from(message.time.unix_timestamp_nanos()).unwrap_or(0);
            pending.push(JobRecord {
                id: request.id,
                user: request.user,
                user_key: message
                    .headers
                    .get(mgpu_protocol::signing::SIGNER)
                    .map(|k| k.as_str().to_owned()),
                spec: request.spec,
                submitted_at: chrono::DateTime::from_timestamp_nanos(nanos),
                attempt: 1,
                state: JobState::Queued(Waiting::new(WaitReason::Submitted)),
            });
        }
    }
    Ok(pending)
}

/// One job's record (or its pending submission), if it exists.
pub async fn get_job(js: &jetstream::Context, id: &JobId) -> Result<Option<JobRecord>, StateError> {
    let bucket = jobs_bucket(js).await?;
    if let Some(record) = recorded_job(&bucket, id).await? {
        return Ok(Some(record));
    }
    if let Some(pending) = pending_submissions(js)
        .await?
        .into_iter()
        .find(|p| &p.id == id)
    {
        return Ok(Some(pending));
    }
    // The scheduler may have recorded it between the two reads above.
    recorded_job(&bucket, id).await
}

/// The record of a finished job that left the live bucket for the history stream, if it is
/// there (a stream not made yet holds nothing): among `owner`'s jobs, or anyone's (None; only
/// the scheduler and admins may read everyone's history).
pub async fn archived_job(
    js: &jetstream::Context,
    id: &JobId,
    owner: Option<&str>,
) -> Result<Option<JobRecord>, StateError> {
    if js.get_stream(subjects::HISTORY_STREAM).await.is_err() {
        return Ok(None);
    }
    let filter = owner.map_or_else(
        || subjects::history_of(id),
        |owner| subjects::history(owner, id),
    );
    let messages = last_per_subject(js, subjects::HISTORY_STREAM, &filter, false).await?;
    messages
        .last()
        .map(|message| {
            serde_json::from_slice(&message.payload).map_err(|error| StateError::Corrupt {
                key: id.to_string(),
                error,
            })
        })
        .transpose()
}

async fn recorded_job(bucket: &kv::Store, id: &JobId) -> Result<Option<JobRecord>, StateError> {
    let value = bucket
        .get(id.as_str())
        .await
        .map_err(StateError::jetstream)?;
    value
        .map(|bytes| {
            serde_json::from_slice(&bytes).map_err(|error| StateError::Corrupt {
                key: id.to_string(),
                error,
            })
        })
        .transpose()
}

/// Turns what a person typed (a full id or a unique prefix) into a job id.
pub async fn resolve_job(js: &jetstream::Context, typed: &str) -> Result<JobId, StateError> {
    let typed = typed.trim();
    if !is_job_id_prefix(typed) {
        return Err(StateError::NotAnId(typed.to_owned()));
    }
    if let Ok(id) = typed.parse::<JobId>() {
        return match get_job(js, &id).await? {
            Some(_) => Ok(id),
            None => Err(StateError::UnknownJob(typed.to_owned())),
        };
    }
    let matches: Vec<String> = list_job_ids(js)
        .await?
        .into_iter()
        .filter(|id| id.starts_with(typed))
        .collect();
    match matches.as_slice() {
        [] => Err(StateError::UnknownJob(typed.to_owned())),
        [one] => one
            .parse()
            .map_err(|_| StateError::UnknownJob(typed.to_owned())),
        many => Err(StateError::AmbiguousJob {
            prefix: typed.to_owned(),
            count: many.len(),
            examples: many
                .iter()
                .take(3)
                .map(|id| id[..JobId::SHORT_LEN].to_owned())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// The last heartbeat of every node that ever reported, by node name.
pub async fn list_nodes(js: &jetstream::Context) -> Result<Vec<NodeHeartbeat>, StateError> {
    let messages =
        last_per_subject(js, subjects::NODES_STREAM, subjects::ALL_HEARTBEATS, false).await?;
    let mut nodes: Vec<NodeHeartbeat> = messages
        .iter()
        .filter_map(|m| match serde_json::from_slice(&m.payload) {
            Ok(beat) => Some(beat),
            Err(err) => {
                // Another release's heartbeat is named as such, not called malformed.
                let protocol = mgpu_protocol::version::peek(&m.payload);
                let sender = format!("the agent heartbeating on {}", m.subject);
                match mgpu_protocol::version::incompatibility(&sender, protocol) {
                    Some(why) => tracing::warn!("node left out: {why}"),
                    None => {
                        tracing::warn!(subject = %m.subject, %err, "ignoring a malformed heartbeat")
                    }
                }
                None
            }
        })
        .collect();
    nodes.sort_by(|a: &NodeHeartbeat, b| a.node.cmp(&b.node));
    Ok(nodes)
}

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

/// The scheduling policy the scheduler last ran with (defaults if it never ran).
pub async fn policy(
    js: &jetstream::Context,
) -> Result<mgpu_protocol::priority::Policy, StateError> {
    Ok(cluster_value(js, subjects::POLICY_KEY)
        .await?
        .unwrap_or_default())
}

/// Users' decayed GPU usage, for fair share.
pub async fn usage(
    js: &jetstream::Context,
) -> Result<mgpu_protocol::priority::UsageBook, StateError> {
    Ok(cluster_value(js, subjects::USAGE_KEY)
        .await?
        .unwrap_or_default())
}

/// Drained nodes and paused GPUs, by node name.
pub async fn node_admin(
    js: &jetstream::Context,
) -> Result<std::collections::BTreeMap<String, mgpu_protocol::node::NodeAdmin>, StateError> {
    let prefix = format!("$KV.{}.node.", subjects::CLUSTER_BUCKET);
    let messages = last_per_subject(
        js,
        subjects::CLUSTER_BUCKET_STREAM,
        &format!("{prefix}*"),
        false,
    )
    .await?;
    Ok(messages
        .iter()
        .filter(|m| !is_deletion(m))
        .filter_map(|m| {
            let node = m.subject.as_str().strip_prefix(&prefix)?.to_owned();
            serde_json::from_slice(&m.payload)
                .ok()
                .map(|admin| (node, admin))
        })
        .collect())
}
