//! Storing submissions in JetStream: one, or thousands (arrays, job files) pipelined.

use std::collections::{BTreeMap, VecDeque};

use anyhow::{Context as _, Result, anyhow, bail};
use async_nats::jetstream::context::{PublishAckFuture, PublishErrorKind};
use async_nats::{HeaderMap, header};
use mgpu_shared::error::StateError;
use mgpu_shared::job::{MAX_SUBMIT_BYTES, SubmitRequest};
use mgpu_shared::subjects;

use crate::errors::plain;
use crate::session::Session;

/// Submissions awaiting their acknowledgement at once. async-nats holds one permit per
/// unawaited acknowledgement (5 000 by default) and blocks the next publish when they run out,
/// so "publish everything, then await" would hang past that many; a window keeps the pipeline
/// full without ever reaching the limit.
const WINDOW: usize = 512;

/// Stores each submission and waits for JetStream's acknowledgements, so every id reported as
/// submitted belongs to a stored job. The job id is the message id: a retry cannot store twice.
/// Returns one result per request, in order.
pub async fn submit_all(session: &Session, requests: &[SubmitRequest]) -> Vec<Result<()>> {
    let mut results: Vec<Result<()>> = requests.iter().map(|_| Ok(())).collect();
    let mut in_flight: VecDeque<(usize, PublishAckFuture)> = VecDeque::new();
    for (index, request) in requests.iter().enumerate() {
        if in_flight.len() >= WINDOW
            && let Some((done, ack)) = in_flight.pop_front()
        {
            results[done] = acknowledged(ack).await;
        }
        match send(session, request).await {
            Ok(ack) => in_flight.push_back((index, ack)),
            Err(err) => results[index] = Err(err),
        }
    }
    while let Some((done, ack)) = in_flight.pop_front() {
        results[done] = acknowledged(ack).await;
    }
    results
}

async fn send(session: &Session, request: &SubmitRequest) -> Result<PublishAckFuture> {
    let payload = serde_json::to_vec(request).context("encoding the submission")?;
    check_size(payload.len(), &request.spec.env)?;
    let mut headers = HeaderMap::new();
    headers.insert(header::NATS_MESSAGE_ID, request.id.as_str());
    session
        .js
        .publish_with_headers(subjects::SUBMIT, headers, payload.into())
        .await
        .map_err(|err| publish_error(err.kind(), &err))
}

async fn acknowledged(ack: PublishAckFuture) -> Result<()> {
    ack.await
        .map(|_| ())
        .map_err(|err| publish_error(err.kind(), &err))
}

/// Refuses a submission over the limit, naming the usual culprit.
pub fn check_size(bytes: usize, env: &BTreeMap<String, String>) -> Result<()> {
    if bytes <= MAX_SUBMIT_BYTES {
        return Ok(());
    }
    let env_bytes: usize = env.iter().map(|(k, v)| k.len() + v.len()).sum();
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
