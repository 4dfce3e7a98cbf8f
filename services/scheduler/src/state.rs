//! The scheduler's job table: every job record in memory, mirrored to the `mgpu-jobs` KV
//! bucket. Each write is a compare-and-set on the revision the scheduler last saw, so a
//! stale scheduler can never overwrite a newer record.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use async_nats::HeaderMap;
use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::{self, kv};
use bytes::Bytes;

use mgpu_nats::records;
use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState};
use mgpu_protocol::subjects;

/// A record and the KV revision it was read or written at.
#[derive(Clone, Debug)]
pub struct Tracked {
    pub record: JobRecord,
    pub revision: u64,
}

pub struct JobStore {
    /// For pipelined writes, which the KV API does not offer.
    js: jetstream::Context,
    bucket: kv::Store,
    /// The jobs' environments (`mgpu-job-env`), dropped as their jobs move to history.
    env_bucket: kv::Store,
    jobs: HashMap<JobId, Tracked>,
    /// Ids of the queued jobs, and of the running ones: a pass, a heartbeat and the status
    /// look at these, never at every record (finished jobs pile up by the hundred thousand).
    queued: HashSet<JobId>,
    running: HashSet<JobId>,
    /// The running jobs by node: a heartbeat is compared with its node's jobs only (a
    /// thousand nodes heartbeating, each checked against 8 000 running jobs, took a core).
    running_on: HashMap<String, HashSet<JobId>>,
    /// Jobs put or dropped since [`JobStore::take_changed`] was last called.
    changed: HashSet<JobId>,
    /// How jobs in history ended, for the live jobs that depend on them (`--after`): only
    /// those, looked up when such a job is submitted or loaded.
    archived: HashMap<JobId, JobState>,
}

impl JobStore {
    /// Loads every record from the bucket.
    pub async fn load(js: &jetstream::Context) -> Result<Self> {
        let bucket = records::jobs_bucket(js).await?;
        let env_bucket = js
            .get_key_value(subjects::JOB_ENV_BUCKET)
            .await
            .context("opening the environments' bucket")?;
        let messages = records::last_per_subject(
            js,
            subjects::JOBS_BUCKET_STREAM,
            &format!("$KV.{}.>", subjects::JOBS_BUCKET),
            false,
        )
        .await?;
        let mut store = JobStore {
            js: js.clone(),
            bucket,
            env_bucket,
            jobs: HashMap::with_capacity(messages.len()),
            queued: HashSet::new(),
            changed: HashSet::new(),
            running_on: HashMap::new(),
            running: HashSet::new(),
            archived: HashMap::new(),
        };
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
                    store.put(record.id.clone(), Tracked { record, revision });
                }
                Err(err) => {
                    tracing::error!(subject = %message.subject, %err, "skipping an unreadable job record");
                }
            }
        }
        Ok(store)
    }

    pub fn get(&self, id: &JobId) -> Option<&JobRecord> {
        self.jobs.get(id).map(|t| &t.record)
    }

    /// The state of job `id`: its live record's, or the one it ended in if it is in history
    /// (and a live job depends on it).
    pub fn state_of(&self, id: &JobId) -> Option<&JobState> {
        self.get(id)
            .map(|record| &record.state)
            .or_else(|| self.archived.get(id))
    }

    /// Whether the table knows how `id` ended or stands (live, or remembered from history).
    pub fn knows(&self, id: &JobId) -> bool {
        self.jobs.contains_key(id) || self.archived.contains_key(id)
    }

    /// Remembers how a job in history ended, for the live jobs that depend on it.
    pub fn remember_archived(&mut self, record: JobRecord) {
        self.archived.insert(record.id, record.state);
    }

    /// Finished jobs that ended before `cutoff`, at most `limit`: due for history.
    pub fn ended_before(&self, cutoff: Timestamp, limit: usize) -> Vec<JobId> {
        self.jobs
            .iter()
            .filter(|(_, tracked)| {
                tracked
                    .record
                    .state
                    .ending()
                    .is_some_and(|end| end.ended_at < cutoff)
            })
            .map(|(id, _)| id.clone())
            .take(limit)
            .collect()
    }

    /// Moves a finished job to the history stream: its record published on
    /// `history.<user>.<id>` (deduplicated by id, so a move retried after a crash is stored
    /// once), then its key purged from the bucket, leaving no marker behind: a year of moves
    /// must not slow down the next start. False when it is not a finished job of the table.
    pub async fn archive(&mut self, id: &JobId) -> Result<bool> {
        let Some(tracked) = self.jobs.get(id) else {
            return Ok(false);
        };
        if !tracked.record.state.is_finished() {
            return Ok(false);
        }
        let payload = Bytes::from(serde_json::to_vec(&tracked.record)?);
        let env_owner = (tracked.record.spec.private_env)
            .then(|| subjects::history_owner(&tracked.record).to_owned());
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", id.as_str());
        let subject = subjects::history(subjects::history_owner(&tracked.record), id);
        self.js
            .publish_with_headers(subject, headers, payload)
            .await
            .context("publishing to history")?
            .await
            .context("storing in history")?;
        self.bucket
            .stream
            .purge()
            .filter(format!("$KV.{}.{id}", subjects::JOBS_BUCKET))
            .await
            .context("purging the moved record")?;
        if let Some(owner) = env_owner {
            crate::private_env::forget_env(&self.env_bucket, &owner, id).await;
        }
        self.forget(id);
        Ok(true)
    }

    /// The queued jobs' records, in no particular order.
    pub fn queued(&self) -> impl Iterator<Item = &JobRecord> {
        self.queued.iter().filter_map(|id| self.get(id))
    }

    /// The ids of the jobs whose record was put or dropped since the last call (all of them
    /// after loading): what a pass must look at again.
    pub fn take_changed(&mut self) -> HashSet<JobId> {
        std::mem::take(&mut self.changed)
    }

    /// The running jobs' records, in no particular order.
    pub fn running(&self) -> impl Iterator<Item = &JobRecord> {
        self.running.iter().filter_map(|id| self.get(id))
    }

    /// How many jobs are queued and running.
    pub fn counts(&self) -> (usize, usize) {
        (self.queued.len(), self.running.len())
    }

    /// How many records the table holds, finished jobs included.
    pub fn total(&self) -> usize {
        self.jobs.len()
    }

    /// The running jobs with a rank on `node`, in no particular order.
    pub fn running_on<'a>(&'a self, node: &str) -> impl Iterator<Item = &'a JobRecord> {
        self.running_on
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|id| self.get(id))
    }

    /// Takes a job out of the per-node index, by the nodes its current record runs on.
    fn unindex_nodes(&mut self, id: &JobId) {
        let Some(JobState::Running(run)) = self.jobs.get(id).map(|t| &t.record.state) else {
            return;
        };
        for node in run.placement.node_names() {
            if let Some(jobs) = self.running_on.get_mut(node) {
                jobs.remove(id);
                if jobs.is_empty() {
                    self.running_on.remove(node);
                }
            }
        }
    }

    /// Puts a record just written at `revision` in the table.
    fn keep(&mut self, record: JobRecord, revision: u64) {
        self.put(record.id.clone(), Tracked { record, revision });
    }

    /// Puts a record in the table, keeping the state indexes right.
    fn put(&mut self, id: JobId, tracked: Tracked) {
        self.unindex_nodes(&id);
        if let JobState::Running(run) = &tracked.record.state {
            for node in run.placement.node_names() {
                self.running_on
                    .entry(node.to_owned())
                    .or_default()
                    .insert(id.clone());
            }
        }
        match tracked.record.state {
            JobState::Queued(_) => {
                self.running.remove(&id);
                self.queued.insert(id.clone());
            }
            JobState::Running(_) => {
                self.queued.remove(&id);
                self.running.insert(id.clone());
            }
            _ => {
                self.queued.remove(&id);
                self.running.remove(&id);
            }
        }
        self.changed.insert(id.clone());
        self.jobs.insert(id, tracked);
    }

    fn forget(&mut self, id: &JobId) {
        self.unindex_nodes(id);
        self.changed.insert(id.clone());
        self.queued.remove(id);
        self.running.remove(id);
        self.jobs.remove(id);
    }

    /// Stores a new record. Returns false when a record with that id already exists (a
    /// redelivered submission), leaving it untouched.
    pub async fn create(&mut self, record: JobRecord) -> Result<bool> {
        if self.jobs.contains_key(&record.id) {
            return Ok(false);
        }
        let payload = Bytes::from(serde_json::to_vec(&record)?);
        let mut retry = Retry::new();
        loop {
            match self
                .bucket
                .create(record.id.as_str(), payload.clone())
                .await
            {
                Ok(revision) => {
                    self.put(record.id.clone(), Tracked { record, revision });
                    return Ok(true);
                }
                Err(err) if err.kind() == kv::CreateErrorKind::AlreadyExists => {
                    // Ours, when an earlier try landed but its answer was lost.
                    let ours = self.landed(&record.id, &payload).await?;
                    return Ok(ours.is_some());
                }
                Err(err) if err.kind() == kv::CreateErrorKind::InvalidKey => {
                    return Err(anyhow!("storing job {}: {err}", record.id));
                }
                Err(err) => {
                    retry
                        .wait(&format!("storing job {}: {err}", record.id))
                        .await?
                }
            }
        }
    }

    /// Stores many new records at once, their writes pipelined (see [`JobStore::write_many`]).
    /// One result per record, in order: false for an id already recorded (a redelivered
    /// submission). A write that did not plainly succeed is redone alone with
    /// [`JobStore::create`], which recognises a write that landed without an answer.
    pub async fn create_many(&mut self, records: Vec<JobRecord>) -> Vec<Result<bool>> {
        self.write_batch(records, Batch::Create).await
    }

    /// Stores many changed records (each a job the table holds), all their writes sent before
    /// any acknowledgement is awaited: a pass that starts a thousand jobs or gives a thousand
    /// new jobs their wait reason costs about one round trip, not a thousand. Each write is
    /// still a compare-and-set on the revision the table holds. A write that did not plainly
    /// succeed (a conflict, a lost answer, NATS electing a leader) is redone alone with
    /// [`JobStore::write`], which reads back and retries as needed. One result per record, in
    /// order. Callers pass a bounded number at a time ([`WRITE_CHUNK`]), so what is held at
    /// once (changed copies, their encoded payloads) stays bounded.
    /// True for each record stored; false where the stored record had changed and `redo`,
    /// given the stored record, found nothing to write (or, writing again, found it changed
    /// once more).
    pub async fn write_many(
        &mut self,
        records: Vec<JobRecord>,
        redo: impl Fn(&JobRecord) -> Option<JobRecord>,
    ) -> Vec<Result<bool>> {
        self.write_batch(records, Batch::Replace(&redo)).await
    }

    /// [`JobStore::create_many`] and [`JobStore::write_many`]: true for each record stored.
    async fn write_batch(
        &mut self,
        records: Vec<JobRecord>,
        batch: Batch<'_>,
    ) -> Vec<Result<bool>> {
        let mut results: Vec<Option<Result<bool>>> = Vec::with_capacity(records.len());
        let mut writes = Vec::new();
        for (index, record) in records.iter().enumerate() {
            let expected = match (batch, self.jobs.get(&record.id)) {
                (Batch::Create, Some(_)) => {
                    results.push(Some(Ok(false)));
                    continue;
                }
                // Revision 0: only if the key was never written.
                (Batch::Create, None) => 0,
                (Batch::Replace(_), Some(tracked)) => tracked.revision,
                (Batch::Replace(_), None) => {
                    results.push(Some(Err(anyhow!("job {} is not in the table", record.id))));
                    continue;
                }
            };
            results.push(None);
            match serde_json::to_vec(record) {
                Ok(payload) => {
                    writes.push((index, record.id.clone(), Bytes::from(payload), expected));
                }
                Err(err) => results[index] = Some(Err(err.into())),
            }
        }
        let outcomes = self.write_pipelined(&writes).await;
        let mut records: Vec<Option<JobRecord>> = records.into_iter().map(Some).collect();
        for ((index, ..), outcome) in writes.iter().zip(outcomes) {
            let Some(record) = records[*index].take() else {
                continue;
            };
            let result = match (outcome, batch) {
                (Some(revision), _) => {
                    self.keep(record, revision);
                    Ok(true)
                }
                (None, Batch::Create) => self.create(record).await,
                (None, Batch::Replace(redo)) => self.write_or_redo(record, redo).await,
            };
            results[*index] = Some(result);
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(anyhow!("internal: a record was not written"))))
            .collect()
    }

    /// Sends `(index, id, payload, expected revision)` writes with at most [`WRITES_IN_FLIGHT`]
    /// unacknowledged; the new revision of each, or None when it did not plainly succeed.
    async fn write_pipelined(&self, writes: &[(usize, JobId, Bytes, u64)]) -> Vec<Option<u64>> {
        let context = &self.js;
        let prefix = self
            .bucket
            .put_prefix
            .as_ref()
            .unwrap_or(&self.bucket.prefix);
        let mut outcomes: Vec<Option<u64>> = vec![None; writes.len()];
        let mut in_flight: VecDeque<(usize, PublishAckFuture)> = VecDeque::new();
        for (position, (_, id, payload, revision)) in writes.iter().enumerate() {
            if in_flight.len() >= WRITES_IN_FLIGHT
                && let Some((done, ack)) = in_flight.pop_front()
            {
                outcomes[done] = ack.await.ok().map(|a| a.sequence);
            }
            let mut headers = HeaderMap::new();
            headers.insert(
                async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
                revision.to_string().as_str(),
            );
            match context
                .publish_with_headers(format!("{prefix}{id}"), headers, payload.clone())
                .await
            {
                Ok(ack) => in_flight.push_back((position, ack)),
                Err(err) => tracing::debug!(job = %id, %err, "pipelined write not sent"),
            }
        }
        while let Some((done, ack)) = in_flight.pop_front() {
            outcomes[done] = ack.await.ok().map(|a| a.sequence);
        }
        outcomes
    }

    /// Stores `record` (a job the table holds) with compare-and-set on the revision the table
    /// holds: true once stored; false when the stored record had changed (a write of another
    /// scheduler that acted while this one held the lease), which the table then holds in its
    /// place: the caller decides again from it.
    ///
    /// A write whose answer is lost (a NATS server died, a stream is electing its leader) is
    /// retried for [`WRITE_RETRY_FOR`]; first the record is read back, since the write may
    /// have landed.
    pub async fn write(&mut self, record: JobRecord) -> Result<bool> {
        let id = record.id.clone();
        let payload = Bytes::from(serde_json::to_vec(&record)?);
        let mut retry = Retry::new();
        let mut unanswered = false;
        loop {
            if std::mem::take(&mut unanswered) {
                match self.landed(&id, &payload).await {
                    Ok(Some(revision)) => {
                        self.keep(record, revision);
                        return Ok(true);
                    }
                    // Not ours: the table now holds what is stored.
                    Ok(None) => return Ok(false),
                    Err(err) => {
                        retry.wait(&format!("{err:#}")).await?;
                        unanswered = true;
                        continue;
                    }
                }
            }
            let revision = self
                .jobs
                .get(&id)
                .with_context(|| format!("job {id} is not in the table"))?
                .revision;
            match self
                .bucket
                .update(id.as_str(), payload.clone(), revision)
                .await
            {
                Ok(revision) => {
                    self.keep(record, revision);
                    return Ok(true);
                }
                Err(err) if err.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    tracing::warn!(job = %id, "job record changed under us; reloading it");
                    self.reload(&id).await?;
                    return Ok(false);
                }
                Err(err) if err.kind() == kv::UpdateErrorKind::InvalidKey => {
                    return Err(anyhow!("updating job {id}: {err}"));
                }
                Err(err) => {
                    retry.wait(&format!("updating job {id}: {err}")).await?;
                    unanswered = true;
                }
            }
        }
    }

    /// [`JobStore::write`]; where the stored record had changed, what `redo` makes of it is
    /// written instead (once).
    async fn write_or_redo(
        &mut self,
        record: JobRecord,
        redo: &dyn Fn(&JobRecord) -> Option<JobRecord>,
    ) -> Result<bool> {
        let id = record.id.clone();
        if self.write(record).await? {
            return Ok(true);
        }
        match self.get(&id).and_then(redo) {
            Some(again) => self.write(again).await,
            None => Ok(false),
        }
    }

    /// Reads the stored record back after a write whose outcome is unknown: its revision when
    /// the stored value is exactly `payload` (the write landed); otherwise the table takes the
    /// stored record and None is returned.
    async fn landed(&mut self, id: &JobId, payload: &Bytes) -> Result<Option<u64>> {
        let entry = self
            .bucket
            .entry(id.as_str())
            .await
            .map_err(|e| anyhow!("reading job {id} back: {e}"))?;
        if let Some(entry) = &entry
            && entry.operation == kv::Operation::Put
            && entry.value == payload
        {
            return Ok(Some(entry.revision));
        }
        self.reload(id).await?;
        Ok(None)
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
                self.put(
                    id.clone(),
                    Tracked {
                        record,
                        revision: entry.revision,
                    },
                );
            }
            _ => {
                self.forget(id);
            }
        }
        Ok(())
    }
}

/// What [`JobStore::write_batch`] writes: new records, or new versions of records it holds
/// (with what to write instead when a stored record changed under the scheduler).
#[derive(Clone, Copy)]
enum Batch<'a> {
    Create,
    Replace(&'a dyn Fn(&JobRecord) -> Option<JobRecord>),
}

/// Records [`JobStore::write_many`] should be given at a time: twice the writes in flight,
/// so the pipeline stays full, and a few MB of copies at most.
pub const WRITE_CHUNK: usize = 2 * WRITES_IN_FLIGHT;

/// Record writes awaiting their acknowledgement at once in [`JobStore::write_many`]: well
/// under async-nats's 5 000 acknowledgement permits, and enough to keep the server busy.
const WRITES_IN_FLIGHT: usize = 1_024;

/// How long a record write is retried while NATS cannot answer (a server lost, a stream
/// electing a new leader, which takes about 5 s in a three-server cluster).
pub const WRITE_RETRY_FOR: Duration = Duration::from_secs(20);

/// Backoff between tries of one write, until [`WRITE_RETRY_FOR`] has passed.
pub(crate) struct Retry {
    deadline: Instant,
    delay: Duration,
}

impl Retry {
    pub(crate) fn new() -> Self {
        Retry {
            deadline: Instant::now() + WRITE_RETRY_FOR,
            delay: Duration::from_millis(100),
        }
    }

    /// Waits before the next try, or gives up with `what` when the time is over.
    pub(crate) async fn wait(&mut self, what: &str) -> Result<()> {
        if Instant::now() + self.delay > self.deadline {
            return Err(anyhow!("{what} (gave up after {WRITE_RETRY_FOR:?})"));
        }
        tracing::warn!("{what}; retrying in {:?}", self.delay);
        tokio::time::sleep(self.delay).await;
        self.delay = (self.delay * 2).min(Duration::from_secs(2));
        Ok(())
    }
}
