//! The driver's side of the `mgpu-jobs` bucket and the cluster bucket: loading every live
//! record, carrying out the machine's record writes (each a compare-and-set on the revision
//! the machine expects; many at once pipelined; retried through NATS leader elections, and
//! read back when an answer was lost, so a change is never applied twice), moving finished
//! jobs to history, storing node administration and the usage book, and the nonces of
//! recent requests (`mgpu-nonces`: every admitted request's nonce is written before it is
//! acted on, and a scheduler that becomes active reads them back into its gate, so a request
//! copied and sent again after a restart is refused as replayed).

use std::collections::VecDeque;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use async_nats::HeaderMap;
use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::{self, kv};
use bytes::Bytes;

use mgpu_nats::records;
use mgpu_nats::retry::Retry;
use mgpu_nats::streams::NONCE_VALUE_MAX;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::JobRecord;
use mgpu_protocol::node::NodeAdmin;
use mgpu_protocol::priority::UsageBook;
use mgpu_protocol::signing::nonce_key;
use mgpu_protocol::subjects;

use super::replica::LeaseGate;
use crate::identity::SeenNonce;
use crate::machine::jobs::Tracked;
use crate::machine::messages::{Input, OpId, WriteOutcome};

/// Record writes awaiting their acknowledgement at once: well under async-nats's 5 000
/// acknowledgement permits, and enough to keep the server busy.
const WRITES_IN_FLIGHT: usize = 1_024;

/// How long a record write is retried while NATS cannot answer (a server lost, a stream
/// electing a new leader, which takes about 5 s in a three-server cluster).
pub const WRITE_RETRY_FOR: Duration = Duration::from_secs(20);

/// One write the machine asked for.
pub(crate) struct Write {
    pub op: OpId,
    pub record: std::sync::Arc<JobRecord>,
    pub expected: Option<u64>,
}

pub(crate) struct RecordStore {
    /// For pipelined writes and history, which the KV API does not offer.
    js: jetstream::Context,
    bucket: kv::Store,
    /// The jobs' environments (`mgpu-job-env`), dropped as their jobs move to history.
    env_bucket: kv::Store,
    /// Node administration, policy and usage (`mgpu-cluster`).
    pub(crate) cluster: kv::Store,
    /// Asked before each record is sent, and before each retry: a write sent after a stall
    /// past the lease could create a record the replica that took over never learns of.
    lease: LeaseGate,
}

/// Why a write was not sent.
const NOT_LEADING: &str = "this replica no longer holds the scheduler lease";

impl RecordStore {
    pub(crate) async fn open(js: &jetstream::Context, lease: LeaseGate) -> Result<Self> {
        Ok(RecordStore {
            lease,
            js: js.clone(),
            bucket: records::jobs_bucket(js).await?,
            env_bucket: js
                .get_key_value(subjects::JOB_ENV_BUCKET)
                .await
                .context("opening the environments' bucket")?,
            cluster: records::cluster_bucket(js).await?,
        })
    }

    /// Every live record, with its revision.
    pub(crate) async fn load(&self) -> Result<Vec<Tracked>> {
        let messages = records::last_per_subject(
            &self.js,
            subjects::JOBS_BUCKET_STREAM,
            &format!("$KV.{}.>", subjects::JOBS_BUCKET),
            false,
        )
        .await?;
        let mut loaded = Vec::with_capacity(messages.len());
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
                Ok(record) => loaded.push(Tracked { record, revision }),
                Err(err) => {
                    tracing::error!(subject = %message.subject, %err, "skipping an unreadable job record");
                }
            }
        }
        Ok(loaded)
    }

    /// Carries out writes, all sent before any acknowledgement is awaited: a pass that starts
    /// a thousand jobs costs about one round trip, not a thousand. A write that did not
    /// plainly succeed (a conflict, a lost answer, an election) is redone alone
    /// ([`RecordStore::write_one`]). One result per write, in order.
    pub(crate) async fn write_all(&self, writes: Vec<Write>) -> Vec<Input> {
        let mut results = Vec::with_capacity(writes.len());
        for chunk in writes.chunks(2 * WRITES_IN_FLIGHT) {
            let landed = if chunk.len() > 1 {
                self.write_pipelined(chunk).await
            } else {
                vec![None]
            };
            for (write, landed) in chunk.iter().zip(landed) {
                let outcome = match landed {
                    Some(revision) => WriteOutcome::Stored { revision },
                    None => self.write_one(&write.record, write.expected).await,
                };
                results.push(Input::Written {
                    op: write.op,
                    outcome,
                });
            }
        }
        results
    }

    /// Sends writes with at most [`WRITES_IN_FLIGHT`] unacknowledged; the new revision of
    /// each, or None when it did not plainly succeed.
    async fn write_pipelined(&self, writes: &[Write]) -> Vec<Option<u64>> {
        let prefix = self
            .bucket
            .put_prefix
            .as_ref()
            .unwrap_or(&self.bucket.prefix);
        let mut outcomes: Vec<Option<u64>> = vec![None; writes.len()];
        let mut in_flight: VecDeque<(usize, PublishAckFuture)> = VecDeque::new();
        for (position, write) in writes.iter().enumerate() {
            if in_flight.len() >= WRITES_IN_FLIGHT
                && let Some((done, ack)) = in_flight.pop_front()
            {
                outcomes[done] = ack.await.ok().map(|a| a.sequence);
            }
            // Not sent: redone alone, which waits for the lease to be confirmed.
            if !self.lease.current() {
                continue;
            }
            let Ok(payload) = serde_json::to_vec(write.record.as_ref()) else {
                continue;
            };
            let mut headers = HeaderMap::new();
            // Revision 0: only if the key was never written.
            let expected = write.expected.unwrap_or(0);
            headers.insert(
                async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
                expected.to_string().as_str(),
            );
            let id = &write.record.id;
            match self
                .js
                .publish_with_headers(format!("{prefix}{id}"), headers, payload.into())
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

    /// Stores `record` with compare-and-set on `expected` (None: creates it). A write whose
    /// answer is lost is retried for [`WRITE_RETRY_FOR`]; first the record is read back,
    /// since the write may have landed.
    pub(crate) async fn write_one(
        &self,
        record: &JobRecord,
        expected: Option<u64>,
    ) -> WriteOutcome {
        let id = &record.id;
        let payload = match serde_json::to_vec(record) {
            Ok(payload) => Bytes::from(payload),
            Err(err) => {
                return WriteOutcome::Failed {
                    error: err.to_string(),
                };
            }
        };
        let mut retry = Retry::new(WRITE_RETRY_FOR);
        let mut unanswered = false;
        loop {
            if !self.lease.clone().confirmed().await {
                return WriteOutcome::Failed {
                    error: NOT_LEADING.to_owned(),
                };
            }
            if std::mem::take(&mut unanswered) {
                match self.read_back(id, &payload).await {
                    // Creating, and nothing is stored: the earlier try did not land (a server
                    // lost, a stream electing its leader). Nothing changed: try again.
                    Ok(WriteOutcome::Changed { stored: None }) if expected.is_none() => {
                        let what = format!("job {id} not stored yet");
                        if let Err(gave_up) = retry.wait(&what).await {
                            return WriteOutcome::Failed {
                                error: format!("{gave_up:#}"),
                            };
                        }
                    }
                    Ok(outcome) => return outcome,
                    Err(err) => {
                        if let Err(gave_up) = retry.wait(&format!("{err:#}")).await {
                            return WriteOutcome::Failed {
                                error: format!("{gave_up:#}"),
                            };
                        }
                        unanswered = true;
                        continue;
                    }
                }
            }
            let tried = match expected {
                Some(revision) => self
                    .bucket
                    .update(id.as_str(), payload.clone(), revision)
                    .await
                    .map_err(|err| {
                        (
                            err.kind() == kv::UpdateErrorKind::WrongLastRevision,
                            err.kind() == kv::UpdateErrorKind::InvalidKey,
                            err.to_string(),
                        )
                    }),
                None => self
                    .bucket
                    .create(id.as_str(), payload.clone())
                    .await
                    .map_err(|err| {
                        (
                            err.kind() == kv::CreateErrorKind::AlreadyExists,
                            err.kind() == kv::CreateErrorKind::InvalidKey,
                            err.to_string(),
                        )
                    }),
            };
            match tried {
                Ok(revision) => return WriteOutcome::Stored { revision },
                // Another writer, or (creating) an earlier try that landed without an answer.
                Err((true, _, _)) => {
                    tracing::warn!(job = %id, "job record changed under us; reading it back");
                    unanswered = true;
                }
                Err((_, true, err)) => {
                    return WriteOutcome::Failed {
                        error: format!("storing job {id}: {err}"),
                    };
                }
                Err((_, _, err)) => {
                    if let Err(gave_up) = retry.wait(&format!("storing job {id}: {err}")).await {
                        return WriteOutcome::Failed {
                            error: format!("{gave_up:#}"),
                        };
                    }
                    unanswered = true;
                }
            }
        }
    }

    /// Reads the stored record back after a write whose outcome is unknown: stored at its
    /// revision when the stored value is exactly `payload`, else what is stored.
    async fn read_back(&self, id: &JobId, payload: &Bytes) -> Result<WriteOutcome> {
        let entry = self
            .bucket
            .entry(id.as_str())
            .await
            .map_err(|e| anyhow!("reading job {id} back: {e}"))?;
        let stored = match entry {
            Some(entry) if entry.operation == kv::Operation::Put => {
                if entry.value == payload {
                    return Ok(WriteOutcome::Stored {
                        revision: entry.revision,
                    });
                }
                let record: JobRecord = serde_json::from_slice(&entry.value)
                    .with_context(|| format!("job {id} record is unreadable"))?;
                Some(Box::new(Tracked {
                    record,
                    revision: entry.revision,
                }))
            }
            _ => None,
        };
        Ok(WriteOutcome::Changed { stored })
    }

    /// Moves a finished job to the history stream: its record published on
    /// `history.<user>.<id>` (deduplicated by id, so a move retried after a crash is stored
    /// once), then its key purged from the bucket, leaving no marker behind (a year of moves
    /// must not slow down the next start), then its environment dropped, and with
    /// `last_of_array` the one its array stored for all its tasks.
    pub(crate) async fn archive(&self, record: &JobRecord, last_of_array: bool) -> Result<()> {
        let id = &record.id;
        let payload = Bytes::from(serde_json::to_vec(record)?);
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", id.as_str());
        let subject = subjects::history(subjects::history_owner(record), id);
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
        if record.spec.private_env {
            let owner = subjects::history_owner(record);
            let array = record.spec.array.as_ref().filter(|_| last_of_array);
            // Purged from the stream, not marked purged in the bucket: a task of an array
            // that stored its environment once has none under its own id, and a marker per
            // job would stay for good.
            for key in std::iter::once(id).chain(array.map(|member| &member.array_id)) {
                if let Err(err) = self
                    .env_bucket
                    .stream
                    .purge()
                    .filter(subjects::job_env(owner, key))
                    .await
                {
                    tracing::warn!(job = %id, "dropping the environment of a job in history: {err}");
                }
            }
        }
        Ok(())
    }

    /// Stores a node's administration marks.
    pub(crate) async fn put_admin(&self, node: &str, admin: &NodeAdmin) -> Result<()> {
        self.cluster
            .put(
                subjects::node_admin_key(node),
                Bytes::from(serde_json::to_vec(admin)?),
            )
            .await
            .map_err(|e| anyhow!("storing node {node} administration: {e}"))?;
        Ok(())
    }

    /// Stores a reservation under its name.
    pub(crate) async fn put_reservation(
        &self,
        reservation: &mgpu_protocol::reservation::Reservation,
    ) -> Result<()> {
        let name = &reservation.name;
        self.cluster
            .put(
                subjects::reservation_key(name),
                Bytes::from(serde_json::to_vec(reservation)?),
            )
            .await
            .map_err(|e| anyhow!("storing reservation {name}: {e}"))?;
        Ok(())
    }

    /// Deletes a reservation long over.
    pub(crate) async fn drop_reservation(&self, name: &str) -> Result<()> {
        self.cluster
            .purge(subjects::reservation_key(name))
            .await
            .map_err(|e| anyhow!("dropping reservation {name}: {e}"))?;
        Ok(())
    }

    /// Drops what waits on `node`'s assignment subject (its controls stay: a kill is never
    /// harmful).
    pub(crate) async fn purge_assignments(&self, node: &str) -> Result<()> {
        let subject = subjects::assign(node);
        let purged = self
            .js
            .get_stream(subjects::ASSIGN_STREAM)
            .await
            .map_err(|e| anyhow!("opening the assignment stream: {e}"))?
            .purge()
            .filter(subject)
            .await
            .map_err(|e| anyhow!("dropping node {node}'s waiting assignments: {e}"))?;
        tracing::info!(
            node,
            dropped = purged.purged,
            "assignments waiting for an offline node dropped"
        );
        Ok(())
    }

    /// Stores the waiting jobs' expected starts.
    pub(crate) async fn save_plan(&self, plan: &mgpu_protocol::plan::PlanSnapshot) -> Result<()> {
        let bytes = serde_json::to_vec(plan)?;
        self.cluster
            .put(subjects::PLAN_KEY, bytes.into())
            .await
            .map_err(|e| anyhow!("storing the expected starts: {e}"))?;
        Ok(())
    }

    /// Stores the fair-share usage book.
    pub(crate) async fn save_usage(&self, book: &UsageBook) -> Result<()> {
        let bytes = serde_json::to_vec(book)?;
        self.cluster
            .put(subjects::USAGE_KEY, bytes.into())
            .await
            .map_err(|e| anyhow!("storing usage: {e}"))?;
        Ok(())
    }
}

/// Keeps the nonces of admitted requests, a few in each message (`batch.<the first nonce's
/// key>`, as many as fit in one entry of the bucket): where every message is flushed to disk
/// before it is acknowledged, one flush per request was a fifth of what recording a burst of
/// submissions waited for. One result per nonce: a message not stored loses its nonces
/// together.
pub(crate) async fn remember_nonces(js: &jetstream::Context, seen: &[&SeenNonce]) -> Vec<bool> {
    let mut acks = Vec::new();
    for (first, count, payload) in nonce_messages(seen) {
        let subject = format!("$KV.{}.batch.{}", subjects::NONCE_BUCKET, nonce_key(first));
        acks.push((count, js.publish(subject, payload.into()).await.ok()));
    }
    let mut stored = Vec::with_capacity(seen.len());
    for (count, ack) in acks {
        let landed = match ack {
            Some(ack) => ack.await.is_ok(),
            None => false,
        };
        stored.extend(std::iter::repeat_n(landed, count));
    }
    // A nonce too long to keep (no signer sends one) counts as not kept.
    stored.resize(seen.len(), false);
    stored
}

/// `seen` cut into entries of the nonces' bucket, in order: each its first nonce, how many it
/// holds and its payload (a JSON list no longer than [`NONCE_VALUE_MAX`]). Stops before a
/// nonce that does not fit in an entry alone.
fn nonce_messages<'a>(seen: &[&'a SeenNonce]) -> Vec<(&'a str, usize, Vec<u8>)> {
    let mut messages = Vec::new();
    let mut start = 0;
    while start < seen.len() {
        let mut end = start;
        let mut payload = b"[]".to_vec();
        while end < seen.len() {
            let Ok(longer) = serde_json::to_vec(&seen[start..=end]) else {
                break;
            };
            if longer.len() > NONCE_VALUE_MAX {
                break;
            }
            payload = longer;
            end += 1;
        }
        if end == start {
            break;
        }
        messages.push((seen[start].nonce.as_str(), end - start, payload));
        start = end;
    }
    messages
}

/// Every nonce still kept (those of the last [`subjects::NONCE_TTL_SECS`]).
pub(crate) async fn recall_nonces(js: &jetstream::Context) -> Result<Vec<SeenNonce>> {
    let messages = records::last_per_subject(
        js,
        subjects::NONCE_BUCKET_STREAM,
        &format!("$KV.{}.>", subjects::NONCE_BUCKET),
        false,
    )
    .await
    .context("reading the nonces of recent requests")?;
    Ok(messages
        .iter()
        .flat_map(|message| nonces_of(&message.payload))
        .collect())
}

/// The nonces one message keeps: a batch's, or one (as schedulers before batches kept them).
fn nonces_of(payload: &[u8]) -> Vec<SeenNonce> {
    serde_json::from_slice::<Vec<SeenNonce>>(payload)
        .or_else(|_| serde_json::from_slice::<SeenNonce>(payload).map(|one| vec![one]))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_of_nonces_and_a_nonce_kept_alone_both_read_back() {
        let at = mgpu_protocol::now();
        let seen = |n: u64| SeenNonce {
            nonce: format!("n{n}"),
            signed_at: at,
            sequence: Some(n),
        };
        let batch = serde_json::to_vec(&[seen(1), seen(2)]).unwrap_or_default();
        assert_eq!(nonces_of(&batch), vec![seen(1), seen(2)]);
        let alone = serde_json::to_vec(&seen(3)).unwrap_or_default();
        assert_eq!(nonces_of(&alone), vec![seen(3)]);
        assert!(nonces_of(b"not json").is_empty());
    }

    #[test]
    fn nonces_are_kept_in_entries_the_bucket_accepts_each_once_in_order() {
        let at = mgpu_protocol::now();
        let seen: Vec<SeenNonce> = (0..100)
            .map(|n| SeenNonce {
                nonce: format!("{n:0>32}"),
                signed_at: at,
                sequence: Some(1_000_000 + n),
            })
            .collect();
        let refs: Vec<&SeenNonce> = seen.iter().collect();
        let messages = nonce_messages(&refs);
        assert!(
            messages.len() > 1 && messages.len() < 50,
            "{}",
            messages.len()
        );
        let mut read = Vec::new();
        for (first, count, payload) in &messages {
            assert!(payload.len() <= NONCE_VALUE_MAX);
            let nonces = nonces_of(payload);
            assert_eq!((nonces.len(), nonces[0].nonce.as_str()), (*count, *first));
            read.extend(nonces);
        }
        assert_eq!(read, seen);
    }
}
