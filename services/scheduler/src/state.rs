//! The scheduler's job table: every job record in memory, mirrored to the `mgpu-jobs` KV
//! bucket. Each write is a compare-and-set on the revision the scheduler last saw, so a
//! stale scheduler can never overwrite a newer record.

use std::collections::HashMap;

use anyhow::{Context, Result, anyhow};
use async_nats::jetstream::{self, kv};
use bytes::Bytes;

use mgpu_shared::ids::JobId;
use mgpu_shared::job::JobRecord;
use mgpu_shared::{records, subjects};

/// A record and the KV revision it was read or written at.
#[derive(Clone, Debug)]
pub struct Tracked {
    pub record: JobRecord,
    pub revision: u64,
}

pub struct JobStore {
    bucket: kv::Store,
    jobs: HashMap<JobId, Tracked>,
}

impl JobStore {
    /// Loads every record from the bucket.
    pub async fn load(js: &jetstream::Context) -> Result<Self> {
        let bucket = records::jobs_bucket(js).await?;
        let messages = records::last_per_subject(
            js,
            subjects::JOBS_BUCKET_STREAM,
            &format!("$KV.{}.>", subjects::JOBS_BUCKET),
            false,
        )
        .await?;
        let mut jobs = HashMap::with_capacity(messages.len());
        for message in messages {
            let deleted = message
                .headers
                .as_ref()
                .and_then(|h| h.get("KV-Operation"))
                .is_some_and(|op| op.as_str() != "PUT");
            if deleted {
                continue;
            }
            let revision = message
                .info()
                .map_err(|e| anyhow!("reading record metadata: {e}"))?
                .stream_sequence;
            match serde_json::from_slice::<JobRecord>(&message.payload) {
                Ok(record) => {
                    jobs.insert(record.id.clone(), Tracked { record, revision });
                }
                Err(err) => {
                    tracing::error!(subject = %message.subject, %err, "skipping an unreadable job record");
                }
            }
        }
        Ok(JobStore { bucket, jobs })
    }

    pub fn get(&self, id: &JobId) -> Option<&JobRecord> {
        self.jobs.get(id).map(|t| &t.record)
    }

    pub fn records(&self) -> impl Iterator<Item = &JobRecord> {
        self.jobs.values().map(|t| &t.record)
    }

    /// Stores a new record. Returns false when a record with that id already exists (a
    /// redelivered submission), leaving it untouched.
    pub async fn create(&mut self, record: JobRecord) -> Result<bool> {
        if self.jobs.contains_key(&record.id) {
            return Ok(false);
        }
        let payload = Bytes::from(serde_json::to_vec(&record)?);
        match self.bucket.create(record.id.as_str(), payload).await {
            Ok(revision) => {
                self.jobs
                    .insert(record.id.clone(), Tracked { record, revision });
                Ok(true)
            }
            Err(err) if err.kind() == kv::CreateErrorKind::AlreadyExists => {
                self.reload(&record.id).await?;
                Ok(false)
            }
            Err(err) => Err(anyhow!("storing job {}: {err}", record.id)),
        }
    }

    /// Changes a record with `change` and writes it back with compare-and-set. On a revision
    /// conflict the record is reloaded and the change applied once more to the fresh copy.
    pub async fn update(
        &mut self,
        id: &JobId,
        change: impl Fn(&mut JobRecord),
    ) -> Result<JobRecord> {
        for _ in 0..2 {
            let tracked = self
                .jobs
                .get(id)
                .with_context(|| format!("job {id} is not in the table"))?;
            let mut record = tracked.record.clone();
            change(&mut record);
            let payload = Bytes::from(serde_json::to_vec(&record)?);
            match self
                .bucket
                .update(id.as_str(), payload, tracked.revision)
                .await
            {
                Ok(revision) => {
                    self.jobs.insert(
                        id.clone(),
                        Tracked {
                            record: record.clone(),
                            revision,
                        },
                    );
                    return Ok(record);
                }
                Err(err) if err.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    tracing::warn!(job = %id, "job record changed under us; reloading it");
                    self.reload(id).await?;
                }
                Err(err) => return Err(anyhow!("updating job {id}: {err}")),
            }
        }
        Err(anyhow!(
            "job {id}: record keeps changing under the scheduler"
        ))
    }

    async fn reload(&mut self, id: &JobId) -> Result<()> {
        let entry = self
            .bucket
            .entry(id.as_str())
            .await
            .map_err(|e| anyhow!("reading job {id}: {e}"))?;
        match entry {
            Some(entry) if entry.operation == kv::Operation::Put => {
                let record: JobRecord = serde_json::from_slice(&entry.value)
                    .with_context(|| format!("job {id} record is unreadable"))?;
                self.jobs.insert(
                    id.clone(),
                    Tracked {
                        record,
                        revision: entry.revision,
                    },
                );
            }
            _ => {
                self.jobs.remove(id);
            }
        }
        Ok(())
    }
}
