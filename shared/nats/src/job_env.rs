//! The environments captured at submit, kept apart from the job records that every user reads:
//! the `mgpu-job-env` bucket, key `<owner key>.<job id>`, or, for the tasks of an array that
//! share one environment, once under `<owner key>.<array id>` (protocol 2). Written by the
//! owner's CLI (or by the scheduler, for a submission that carried its environment inline),
//! read by the owner, admins and the scheduler. Reads are direct gets on the key's own
//! subject, so that a user's permissions can name exactly their own keys and nothing else.

use std::collections::BTreeMap;

use async_nats::jetstream;
use bytes::Bytes;

use crate::error::StateError;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::subjects;

/// A job's environment: variable to value.
pub type Environment = BTreeMap<String, String>;

/// Stores `env` as the environment of `owner`'s job `job`, once JetStream has it.
pub async fn put(
    js: &jetstream::Context,
    owner: &str,
    job: &JobId,
    env: &Environment,
) -> Result<(), StateError> {
    let payload = serde_json::to_vec(env)
        .map_err(|e| StateError::JetStream(format!("encoding job {job}'s environment: {e}")))?;
    js.publish(subjects::job_env(owner, job), payload.into())
        .await
        .map_err(|e| StateError::JetStream(format!("storing job {job}'s environment: {e}")))?
        .await
        .map_err(|e| StateError::JetStream(format!("storing job {job}'s environment: {e}")))?;
    Ok(())
}

/// The direct-get request subject for one job's environment (the key in the subject, the
/// only form a user is allowed).
pub fn get_subject(owner: &str, job: &JobId) -> String {
    format!(
        "$JS.API.DIRECT.GET.{}.{}",
        subjects::JOB_ENV_BUCKET_STREAM,
        subjects::job_env(owner, job)
    )
}

/// The environment `owner`'s job `job` runs with: under its own id, or, for a task of
/// `array`, the one its array stored for all its tasks. Both are read at once (a task has
/// one or the other); its own wins.
pub async fn get_for(
    client: &async_nats::Client,
    owner: &str,
    job: &JobId,
    array: Option<&JobId>,
) -> Result<Option<Environment>, StateError> {
    let Some(array) = array else {
        return get(client, owner, job).await;
    };
    let (own, shared) = tokio::join!(get(client, owner, job), get(client, owner, array));
    match own? {
        Some(env) => Ok(Some(env)),
        None => shared,
    }
}

/// Reads the environment stored under `owner`'s `job` (a job's or an array's id); `None`
/// when there is none (the job had no environment, or it was dropped when the job moved to
/// history).
pub async fn get(
    client: &async_nats::Client,
    owner: &str,
    job: &JobId,
) -> Result<Option<Environment>, StateError> {
    let reply = client
        .request(get_subject(owner, job), Bytes::new())
        .await
        .map_err(|e| StateError::JetStream(format!("reading job {job}'s environment: {e}")))?;
    if let Some(status) = reply.status {
        if status == async_nats::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        return Err(StateError::JetStream(format!(
            "reading job {job}'s environment: {status} {}",
            reply.description.as_deref().unwrap_or_default()
        )));
    }
    let deleted = reply
        .headers
        .as_ref()
        .and_then(|headers| headers.get("KV-Operation"))
        .is_some_and(|operation| operation.as_str() != "PUT");
    if deleted || reply.payload.is_empty() {
        return Ok(None);
    }
    serde_json::from_slice(&reply.payload)
        .map(Some)
        .map_err(|e| StateError::JetStream(format!("job {job}'s environment is unreadable: {e}")))
}
