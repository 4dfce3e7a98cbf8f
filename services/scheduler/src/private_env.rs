//! Jobs' environments, kept out of the records every user reads (`mgpu_nats::job_env`): a
//! submission that carries its environment inline (an older CLI, a program publishing its own)
//! has it moved to the `mgpu-job-env` bucket before its record is made; an assignment gets
//! it back from there; a job moving to history leaves it behind.

use mgpu_nats::job_env;
use mgpu_protocol::job::{JobRecord, JobSpec};
use mgpu_protocol::subjects;
use mgpu_protocol::submit::SubmitRequest;

use crate::identity::Identity;
use crate::service::Scheduler;

impl Scheduler {
    /// Moves an inline environment of `request` to the bucket, under its signer's key. Should
    /// that fail, the submission is not to be recorded now (its environment would be in a
    /// record every user reads): the error leaves it for JetStream to deliver again.
    pub(crate) async fn keep_env_apart(
        &self,
        request: &mut SubmitRequest,
        identity: &Identity,
    ) -> anyhow::Result<()> {
        if request.spec.env.is_empty() {
            return Ok(());
        }
        let owner = identity.signer().key;
        job_env::put(&self.js, &owner, &request.id, &request.spec.env)
            .await
            .map_err(|err| {
                anyhow::anyhow!("keeping job {}'s environment apart: {err}", request.id)
            })?;
        request.spec.env.clear();
        request.spec.private_env = true;
        Ok(())
    }
}

/// `record`'s spec with its environment in it, as its assignments carry it. A private
/// environment that is gone (its owner deleted it) is an empty one, and said so.
pub(crate) async fn spec_with_env(
    client: &async_nats::Client,
    record: &JobRecord,
) -> anyhow::Result<JobSpec> {
    let mut spec = record.spec.clone();
    if !spec.private_env {
        return Ok(spec);
    }
    let owner = subjects::history_owner(record);
    match job_env::get(client, owner, &record.id).await? {
        Some(env) => spec.env = env,
        None => tracing::warn!(job = %record.id, "its environment is gone; it runs without"),
    }
    spec.private_env = false;
    Ok(spec)
}

/// Drops `owner`'s job `job`'s environment from the bucket (the job moved to history): a
/// purge marker, which reads as no environment.
pub(crate) async fn forget_env(
    bucket: &async_nats::jetstream::kv::Store,
    owner: &str,
    job: &mgpu_protocol::ids::JobId,
) {
    if let Err(err) = bucket.purge(subjects::job_env_key(owner, job)).await {
        tracing::warn!(job = %job, "dropping the environment of a job in history: {err}");
    }
}
