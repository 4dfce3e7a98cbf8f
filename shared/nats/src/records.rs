//! Reading mgpu's state straight from JetStream: job records from the `mgpu-jobs` bucket and
//! node heartbeats from `MGPU_NODES` (the cluster bucket's readers are `cluster_records.rs`'s,
//! named here too). The CLI uses this, so `mgpu queue` answers while the
//! scheduler is down.

use std::collections::BTreeSet;

use async_nats::jetstream::{self, kv, stream};

use crate::error::StateError;
use crate::reading::{self, bucket, is_deletion};
// The readers the records are read with, for callers that read other streams the same way.
pub use crate::reading::{
    Delivery, create_reader, for_each_last_per_subject, for_each_since, last_per_subject,
    stream_lookup_error,
};
use mgpu_protocol::ids::{JobId, is_job_id_prefix};
use mgpu_protocol::job::{JobRecord, JobState, WaitReason, Waiting};
use mgpu_protocol::node::NodeHeartbeat;
use mgpu_protocol::subjects;

// The cluster bucket's readers, under the names callers have always used.
pub use crate::cluster_records::{
    ClusterState, cluster_bucket, cluster_state, node_admin, plan, reservations, usage,
};

/// The job records bucket.
pub async fn jobs_bucket(js: &jetstream::Context) -> Result<kv::Store, StateError> {
    bucket(js, subjects::JOBS_BUCKET).await
}

/// The job id a record's subject (`$KV.mgpu-jobs.<id>`) names. Called for every record a
/// listing reads, so it allocates nothing.
fn key_of(subject: &str) -> &str {
    subject
        .strip_prefix("$KV.")
        .and_then(|rest| rest.strip_prefix(subjects::JOBS_BUCKET))
        .and_then(|rest| rest.strip_prefix('.'))
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
    // The bucket's stream is looked up while the pending submissions are read: the lookup
    // reads no record, so the records are still read after the submissions.
    let (pending, bucket_stream) = tokio::try_join!(
        pending_submissions(js),
        reading::look_up(js, subjects::JOBS_BUCKET_STREAM)
    )?;
    let mut jobs = recorded_jobs(&bucket_stream, decode).await?;
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
    bucket_stream: &stream::Stream,
    decode: fn(&[u8]) -> serde_json::Result<JobRecord>,
) -> Result<Vec<JobRecord>, StateError> {
    let mut latest = LatestRecords::default();
    reading::for_each_last_per_subject_in(
        bucket_stream,
        &format!("$KV.{}.>", subjects::JOBS_BUCKET),
        false,
        |delivery| {
            let (message, left) = match delivery {
                Delivery::Message(message, left) => (message, left),
                Delivery::StartOver => {
                    latest = LatestRecords::default();
                    return Ok(());
                }
            };
            let key = key_of(message.subject.as_str());
            if is_deletion(&message) {
                if let Ok(id) = key.parse() {
                    latest.remove(&id);
                }
                return Ok(());
            }
            latest.reserve(usize::try_from(left).unwrap_or(0).saturating_add(1));
            let record = decode(&message.payload).map_err(|error| StateError::Corrupt {
                key: key.to_owned(),
                error,
            })?;
            latest.put(record);
            Ok(())
        },
    )
    .await?;
    Ok(latest.into_records())
}

/// The records a read of the bucket delivered, the latest of each job only.
///
/// The read goes on until the consumer has nothing left, so a record the scheduler rewrites
/// while it runs comes twice (its old revision, then the new one at the stream's end), and a
/// job moved to history meanwhile comes, then its deletion. Without this, `mgpu queue` run
/// while jobs start would list such a job twice, queued and running.
#[derive(Default)]
struct LatestRecords {
    records: Vec<JobRecord>,
    /// Where each job's record is in `records`.
    at: std::collections::HashMap<JobId, usize>,
    /// Indices of records deleted after they were delivered; rare, so removed at the end.
    deleted: Vec<usize>,
}

impl LatestRecords {
    fn reserve(&mut self, more: usize) {
        self.records.reserve(more);
        self.at.reserve(more);
    }

    /// Keeps `record`, in place of an earlier one of the same job.
    fn put(&mut self, record: JobRecord) {
        match self.at.get(&record.id) {
            Some(&index) => {
                if let Some(slot) = self.records.get_mut(index) {
                    *slot = record;
                }
                self.deleted.retain(|&deleted| deleted != index);
            }
            None => {
                self.at.insert(record.id.clone(), self.records.len());
                self.records.push(record);
            }
        }
    }

    fn remove(&mut self, id: &JobId) {
        if let Some(&index) = self.at.get(id)
            && !self.deleted.contains(&index)
        {
            self.deleted.push(index);
        }
    }

    fn into_records(mut self) -> Vec<JobRecord> {
        // Highest first: a record swapped into a freed slot is never one still to remove.
        self.deleted.sort_unstable_by(|a, b| b.cmp(a));
        for index in self.deleted {
            self.records.swap_remove(index);
        }
        self.records
    }
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
    // `last_per_subject` hands each record once, as its latest message: a rewrite during the
    // read counts once, and a job that left meanwhile ends as a deletion.
    let mut ids: BTreeSet<&str> = messages
        .iter()
        .filter(|m| !is_deletion(m))
        .map(|m| key_of(m.subject.as_str()))
        .collect();
    ids.extend(pending.iter().map(|p| p.id.as_str()));
    Ok(ids.into_iter().map(str::to_owned).collect())
}

/// Submissions stored in `MGPU_REQUESTS` that the scheduler has not recorded yet (it is
/// stopped, or has not got to them), shown as queued jobs waiting for the scheduler.
pub async fn pending_submissions(js: &jetstream::Context) -> Result<Vec<JobRecord>, StateError> {
    // Usually there is none, and the first direct get says so: no lookup of the stream first.
    let stream = js
        .get_stream_no_info(subjects::REQUESTS_STREAM)
        .await
        .map_err(stream_lookup_error)?;
    let mut pending = Vec::new();
    let mut next = 1;
    loop {
        let message = match stream
            .direct_get_next_for_subject(subjects::SUBMIT, Some(next))
            .await
        {
            Ok(message) => message,
            Err(err) if err.kind() == stream::DirectGetErrorKind::NotFound => break,
            // A stream never set up and a cluster electing its leader both answer "no
            // responders": looking the stream up tells them apart.
            Err(err) if next == 1 => {
                return Err(match js.get_stream(subjects::REQUESTS_STREAM).await {
                    Err(lookup) => stream_lookup_error(lookup),
                    Ok(_) => StateError::jetstream(err),
                });
            }
            Err(err) => return Err(StateError::jetstream(err)),
        };
        next = message.sequence + 1;
        // Malformed submissions are the scheduler's to refuse; they are no job to show. A
        // batch of an array's tasks shows each.
        let submissions = mgpu_protocol::submit::submissions_in(&message.payload);
        for request in submissions.unwrap_or_default() {
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
                last_request: None,
                preemptions: Vec::new(),
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
    if let Some(record) = recorded_job(&bucket, id).await? {
        return Ok(Some(record));
    }
    leader_read_job(js, id).await
}

/// The job's record as the bucket's stream leader has it. A bucket read may be answered by
/// any replica, and one that lags behind a leader election can miss a record stored moments
/// ago (a job just submitted would read as unknown): before saying a job does not exist, the
/// leader is asked.
async fn leader_read_job(
    js: &jetstream::Context,
    id: &JobId,
) -> Result<Option<JobRecord>, StateError> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind;
    let stream = js
        .get_stream_no_info(subjects::JOBS_BUCKET_STREAM)
        .await
        .map_err(StateError::jetstream)?;
    let key = format!("$KV.{}.{id}", subjects::JOBS_BUCKET);
    let message = match stream.get_last_raw_message_by_subject(&key).await {
        Ok(message) => message,
        Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
        Err(error) => return Err(StateError::jetstream(error)),
    };
    // A deleted or purged key leaves a marker with no record in it.
    let removed = message
        .headers
        .get("KV-Operation")
        .is_some_and(|op| op.as_str() != "PUT");
    if removed || message.payload.is_empty() {
        return Ok(None);
    }
    serde_json::from_slice(&message.payload)
        .map(Some)
        .map_err(|error| StateError::Corrupt {
            key: id.to_string(),
            error,
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use mgpu_protocol::job::{Ending, JobSpec};

    fn record(id: &JobId, state: JobState) -> JobRecord {
        JobRecord {
            id: id.clone(),
            user: "alice".into(),
            user_key: None,
            spec: JobSpec::new(vec!["true".into()], "/"),
            submitted_at: mgpu_protocol::now(),
            attempt: 1,
            state,
            last_request: None,
            preemptions: Vec::new(),
        }
    }

    fn queued() -> JobState {
        JobState::Queued(Waiting::new(WaitReason::Resources))
    }

    fn ids(records: &[JobRecord]) -> Vec<&JobId> {
        let mut ids: Vec<&JobId> = records.iter().map(|r| &r.id).collect();
        ids.sort();
        ids
    }

    #[test]
    fn a_record_rewritten_during_the_read_is_kept_once_in_its_latest_state() {
        let (a, b, c) = (JobId::random(), JobId::random(), JobId::random());
        let mut latest = LatestRecords::default();
        latest.put(record(&a, queued()));
        latest.put(record(&b, queued()));
        latest.put(record(&c, queued()));
        // `a` finished while the read went on: its new revision comes at the end.
        let ended = JobState::Succeeded(Ending {
            placement: None,
            started_at: None,
            ended_at: mgpu_protocol::now(),
            exit_code: Some(0),
            signal: None,
            reason: None,
            usage: None,
        });
        latest.put(record(&a, ended.clone()));
        let records = latest.into_records();
        assert_eq!(ids(&records), {
            let mut all = vec![&a, &b, &c];
            all.sort();
            all
        });
        let a_state = records.iter().find(|r| r.id == a).map(|r| &r.state);
        assert_eq!(a_state, Some(&ended));
    }

    #[test]
    fn a_record_deleted_during_the_read_is_left_out() {
        let (a, b, c, d) = (
            JobId::random(),
            JobId::random(),
            JobId::random(),
            JobId::random(),
        );
        let mut latest = LatestRecords::default();
        for id in [&a, &b, &c, &d] {
            latest.put(record(id, queued()));
        }
        // `a` and the last one moved to history; a deletion of a job never delivered (its
        // record went before the read reached it) changes nothing.
        latest.remove(&d);
        latest.remove(&a);
        latest.remove(&a);
        latest.remove(&JobId::random());
        let records = latest.into_records();
        assert_eq!(ids(&records), {
            let mut kept = vec![&b, &c];
            kept.sort();
            kept
        });
    }

    #[test]
    fn a_records_subject_names_its_job() {
        assert_eq!(key_of("$KV.mgpu-jobs.0123abcd"), "0123abcd");
        // Not a record's subject: left as it is.
        assert_eq!(key_of("$KV.mgpu-cluster.policy"), "$KV.mgpu-cluster.policy");
    }
}
