//! A job's record as JetStream has it (bucket `mgpu-jobs`): watched, one job or many, from its
//! current value on; and what a finished record says the job's exit status is.

use anyhow::{Context as _, Result};
use async_nats::jetstream::{self, kv};
use futures::StreamExt;
use futures::stream::{BoxStream, SelectAll};
use mgpu_nats::records;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState};

use crate::errors::plain;

/// Keys per watch in [`watch_records`]: one consumer filters on this many jobs.
const WATCH_CHUNK: usize = 200;

/// One job's record: its current value first (when it exists), then every change. `None`
/// items mean the record was deleted.
pub type RecordChanges = BoxStream<'static, Result<Option<JobRecord>>>;

/// Several jobs' records, merged: their current values first, then every change. Items are
/// None for what is no record (a deletion, an unreadable value).
pub type RecordsChanges = SelectAll<BoxStream<'static, Option<JobRecord>>>;

/// Watches the job's record ([`RecordChanges`]).
pub async fn watch_record(js: &jetstream::Context, id: &JobId) -> Result<RecordChanges> {
    let bucket = records::jobs_bucket(js).await.map_err(plain)?;
    // `watch_with_history` delivers the last value before the changes, so there is no gap
    // between reading the record and watching it.
    let watch = records::create_reader("watching the job's record", || {
        bucket.watch_with_history(id.as_str())
    })
    .await
    .map_err(plain)?;
    let key = id.to_string();
    Ok(watch
        .map(move |entry| {
            let entry = entry.map_err(plain).context("watching the job's record")?;
            record_of(&entry).with_context(|| format!("record {key} is not valid"))
        })
        .boxed())
}

/// Watches the records of `ids` ([`RecordsChanges`]), [`WATCH_CHUNK`] keys to a watch.
pub async fn watch_records(js: &jetstream::Context, ids: &[JobId]) -> Result<RecordsChanges> {
    let bucket = records::jobs_bucket(js).await.map_err(plain)?;
    let mut all = SelectAll::new();
    for chunk in ids.chunks(WATCH_CHUNK) {
        let keys: Vec<String> = chunk.iter().map(ToString::to_string).collect();
        let watch = records::create_reader("watching the jobs' records", || {
            bucket.watch_many_with_history(keys.clone())
        })
        .await
        .map_err(plain)?;
        all.push(
            watch
                .map(|entry| {
                    entry
                        .ok()
                        .and_then(|entry| record_of(&entry).ok().flatten())
                })
                .boxed(),
        );
    }
    Ok(all)
}

/// The record an entry of the jobs bucket holds; None for a deletion.
fn record_of(entry: &kv::Entry) -> Result<Option<JobRecord>, serde_json::Error> {
    match entry.operation {
        kv::Operation::Put => serde_json::from_slice::<JobRecord>(&entry.value).map(Some),
        kv::Operation::Delete | kv::Operation::Purge => Ok(None),
    }
}

/// The exit status a process can report: 0..=255. A negative code is not a real status;
/// it becomes 1 rather than 0, so it cannot pass for success.
pub fn clamp_exit_code(code: i32) -> u8 {
    if code < 0 { 1 } else { code.min(255) as u8 }
}

/// The exit status a finished job's record gives a follower: its exit code, else 0 for
/// success and 1 for anything else.
pub fn exit_status(record: &JobRecord) -> u8 {
    match (&record.state, record.exit_code()) {
        (_, Some(code)) => clamp_exit_code(code),
        (JobState::Succeeded(_), None) => 0,
        (_, None) => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use mgpu_protocol::job::Ending;

    #[test]
    fn exit_codes_fit_a_process_status() {
        assert_eq!(clamp_exit_code(0), 0);
        assert_eq!(clamp_exit_code(143), 143);
        assert_eq!(clamp_exit_code(-1), 1);
        assert_eq!(clamp_exit_code(300), 255);
    }

    #[test]
    fn a_record_without_an_exit_code_reads_as_its_state() {
        let ended = |exit_code| Ending {
            placement: None,
            started_at: None,
            ended_at: mgpu_protocol::now(),
            exit_code,
            signal: None,
            reason: None,
            usage: None,
        };
        let status = |state| exit_status(&fixtures::job("train.sh", state, 0, 60));
        assert_eq!(status(JobState::Succeeded(ended(None))), 0);
        assert_eq!(status(JobState::Cancelled(ended(None))), 1);
        assert_eq!(status(JobState::Failed(ended(Some(3)))), 3);
        assert_eq!(status(JobState::TimedOut(ended(Some(-9)))), 1);
    }
}
