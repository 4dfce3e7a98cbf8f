//! Storing submissions in JetStream: one, or thousands (arrays, job files) pipelined, retried
//! while a stream has no leader; and turning any request's publish failure into advice.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use async_nats::header;
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::{GetStreamErrorKind, PublishAckFuture, PublishErrorKind};
use mgpu_nats::error::StateError;
use mgpu_protocol::subjects;
use mgpu_protocol::submit::{MAX_SUBMIT_BYTES, SubmitRequest};

use crate::errors::plain;
use crate::session::Session;

/// Submissions awaiting their acknowledgement at once. async-nats holds one permit per
/// unawaited acknowledgement (5 000 by default) and blocks the next publish when they run out,
/// so "publish everything, then await" would hang past that many; a window keeps the pipeline
/// full without ever reaching the limit.
const WINDOW: usize = 512;

/// How long a submission keeps being retried while JetStream cannot store it for now. In a
/// NATS cluster a request stream whose leader's server died has no leader until the others
/// elect one (about 5 s, measured with nats-server 2.14): meanwhile a publish gets "no
/// responders" or no acknowledgement. Retrying with the same message id (the job id) is safe:
/// JetStream drops a copy it already stored.
const RETRY_FOR: Duration = Duration::from_secs(20);
const RETRY_PAUSE: Duration = Duration::from_millis(250);

/// A failed publish, with what JetStream said, so a passing failure can be retried.
struct Failure {
    kind: PublishErrorKind,
    error: anyhow::Error,
}

impl Failure {
    /// A failure that is ours, not the server's: it will not pass by retrying.
    fn local(kind: PublishErrorKind) -> impl FnOnce(anyhow::Error) -> Failure {
        move |error| Failure { kind, error }
    }

    fn new(kind: PublishErrorKind, err: &dyn std::fmt::Display) -> Failure {
        Failure {
            kind,
            error: publish_error(kind, err),
        }
    }

    /// No stream answered, or it did not acknowledge: a leader election, or a server that is
    /// gone and a reconnect under way. Anything else (too big, refused) will not change.
    fn may_pass(&self) -> bool {
        matches!(
            self.kind,
            PublishErrorKind::StreamNotFound
                | PublishErrorKind::TimedOut
                | PublishErrorKind::BrokenPipe
        )
    }
}

/// Stores each submission and waits for JetStream's acknowledgements, so every id reported as
/// submitted belongs to a stored job. The job id is the message id: a retry cannot store twice,
/// so those that fail for a passing reason (see [`RETRY_FOR`]) are sent again, as long as
/// mgpu's streams exist at all. Returns one result per request, in order.
pub async fn submit_all(session: &Session, requests: &[SubmitRequest]) -> Vec<Result<()>> {
    let deadline = Instant::now() + RETRY_FOR;
    let mut results: Vec<Result<()>> = requests.iter().map(|_| Ok(())).collect();
    let mut pending: Vec<usize> = (0..requests.len()).collect();
    while !pending.is_empty() {
        let mut again = Vec::new();
        for (index, outcome) in submit_round(session, requests, &pending).await {
            match outcome {
                Ok(()) => results[index] = Ok(()),
                Err(failure) if failure.may_pass() => again.push((index, failure)),
                Err(failure) => results[index] = Err(failure.error),
            }
        }
        let retry = !again.is_empty() && Instant::now() < deadline && streams_exist(session).await;
        pending = again.iter().map(|(index, _)| *index).collect();
        if !retry {
            for (index, failure) in again {
                results[index] = Err(failure.error);
            }
            break;
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
    results
}

/// One pass over the submissions at `indices`, pipelined: first the jobs' environments, then
/// the submissions of the jobs whose environment is stored (a job is never sent without it).
async fn submit_round(
    session: &Session,
    requests: &[SubmitRequest],
    indices: &[usize],
) -> Vec<(usize, std::result::Result<(), Failure>)> {
    let (ready, mut outcomes) = store_envs(session, requests, indices).await;
    let mut in_flight: VecDeque<(usize, PublishAckFuture)> = VecDeque::new();
    for index in ready {
        if in_flight.len() >= WINDOW
            && let Some((done, ack)) = in_flight.pop_front()
        {
            outcomes.push((done, acknowledged(ack).await));
        }
        match send(session, &without_env(&requests[index])).await {
            Ok(ack) => in_flight.push_back((index, ack)),
            Err(failure) => outcomes.push((index, Err(failure))),
        }
    }
    while let Some((done, ack)) = in_flight.pop_front() {
        outcomes.push((done, acknowledged(ack).await));
    }
    outcomes
}

/// Stores the environments of the jobs at `indices` in the `mgpu-job-env` bucket under this
/// user's key, where other users cannot read them (the submission, like the job record made
/// of it, is readable by every user), pipelined. Returns the jobs whose environment is stored
/// (or who have none), and the failures.
async fn store_envs(
    session: &Session,
    requests: &[SubmitRequest],
    indices: &[usize],
) -> (Vec<usize>, Outcomes) {
    let mut ready = Vec::with_capacity(indices.len());
    let mut failed = Vec::new();
    let mut in_flight: VecDeque<(usize, PublishAckFuture)> = VecDeque::new();
    for &index in indices {
        if in_flight.len() >= WINDOW
            && let Some((done, ack)) = in_flight.pop_front()
        {
            match acknowledged(ack).await {
                Ok(()) => ready.push(done),
                Err(failure) => failed.push((done, Err(failure))),
            }
        }
        match put_env(session, &requests[index]).await {
            Ok(Some(ack)) => in_flight.push_back((index, ack)),
            Ok(None) => ready.push(index),
            Err(failure) => failed.push((index, Err(failure))),
        }
    }
    while let Some((done, ack)) = in_flight.pop_front() {
        match acknowledged(ack).await {
            Ok(()) => ready.push(done),
            Err(failure) => failed.push((done, Err(failure))),
        }
    }
    // In the order asked: the submissions keep their order in the queue.
    ready.sort_unstable();
    (ready, failed)
}

type Outcomes = Vec<(usize, std::result::Result<(), Failure>)>;

/// False only when the server says mgpu's job bucket does not exist: then "no responders" means
/// mgpu was never set up here, and waiting would not help. A bucket that does not answer (its
/// leader is being elected too) may well exist.
async fn streams_exist(session: &Session) -> bool {
    match session.js.get_stream(subjects::JOBS_BUCKET_STREAM).await {
        Ok(_) => true,
        Err(err) => !matches!(
            err.kind(),
            GetStreamErrorKind::JetStream(js) if js.error_code() == ErrorCode::STREAM_NOT_FOUND
        ),
    }
}

async fn send(
    session: &Session,
    request: &SubmitRequest,
) -> std::result::Result<PublishAckFuture, Failure> {
    let payload = serde_json::to_vec(request)
        .context("encoding the submission")
        .map_err(Failure::local(PublishErrorKind::Other))?;
    check_size(payload.len(), &request.spec.env)
        .map_err(Failure::local(PublishErrorKind::MaxPayloadExceeded))?;
    let mut headers = session
        .sign(subjects::SUBMIT, &payload)
        .map_err(Failure::local(PublishErrorKind::Other))?;
    headers.insert(header::NATS_MESSAGE_ID, request.id.as_str());
    session
        .js
        .publish_with_headers(subjects::SUBMIT, headers, payload.into())
        .await
        .map_err(|err| Failure::new(err.kind(), &err))
}

/// Publishes the job's environment to its key in `mgpu-job-env`; the acknowledgement to
/// await, or None for a job without one.
async fn put_env(
    session: &Session,
    request: &SubmitRequest,
) -> std::result::Result<Option<PublishAckFuture>, Failure> {
    if request.spec.env.is_empty() {
        return Ok(None);
    }
    let env = serde_json::to_vec(&request.spec.env)
        .context("encoding the environment")
        .map_err(Failure::local(PublishErrorKind::Other))?;
    check_size(env.len(), &request.spec.env)
        .map_err(Failure::local(PublishErrorKind::MaxPayloadExceeded))?;
    let subject = subjects::job_env(&session.key.public_key(), &request.id);
    session
        .js
        .publish(subject, env.into())
        .await
        .map(Some)
        .map_err(|err| Failure::new(err.kind(), &err))
}

/// The submission as sent: without its environment (stored apart), marked so.
fn without_env(request: &SubmitRequest) -> std::borrow::Cow<'_, SubmitRequest> {
    if request.spec.env.is_empty() {
        return std::borrow::Cow::Borrowed(request);
    }
    let mut apart = request.clone();
    apart.spec.env.clear();
    apart.spec.private_env = true;
    std::borrow::Cow::Owned(apart)
}

async fn acknowledged(ack: PublishAckFuture) -> std::result::Result<(), Failure> {
    ack.await
        .map(|_| ())
        .map_err(|err| Failure::new(err.kind(), &err))
}

/// Refuses a submission over the limit, naming the usual culprit.
pub fn check_size(bytes: usize, env: &BTreeMap<String, String>) -> Result<()> {
    if bytes <= MAX_SUBMIT_BYTES {
        return Ok(());
    }
    let env_bytes: usize = env.iter().map(|(k, v)| k.len() + v.len()).sum();
    if env_bytes == 0 {
        bail!(
            "the submission is {} KiB, over the {} KiB limit: shorten the command or the script",
            bytes.div_ceil(1024),
            MAX_SUBMIT_BYTES / 1024
        );
    }
    bail!(
        "the submission is {} KiB, over the {} KiB limit; {} KiB of it is your environment, \
         which the job inherits: unset large environment variables and submit again",
        bytes.div_ceil(1024),
        MAX_SUBMIT_BYTES / 1024,
        env_bytes.div_ceil(1024)
    )
}

/// Turns a JetStream publish failure into advice. "No responders" means no stream listens on
/// the subject: mgpu's streams were never created on this server.
pub fn publish_error(kind: PublishErrorKind, err: &dyn std::fmt::Display) -> anyhow::Error {
    match kind {
        PublishErrorKind::StreamNotFound => plain(StateError::NotSetUp),
        PublishErrorKind::TimedOut => anyhow!(
            "JetStream did not acknowledge the request in time: the server may be overloaded, \
             or your credentials may not allow this request"
        ),
        _ => anyhow!("JetStream refused the request: {err}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversized_submissions_blame_the_environment() {
        let mut env = BTreeMap::new();
        env.insert("BIG".to_owned(), "x".repeat(300 * 1024));
        let err = check_size(301 * 1024, &env)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("301 KiB of it is your environment"), "{err}");
        assert!(check_size(1024, &env).is_ok());
    }
}
