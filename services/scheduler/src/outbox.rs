//! What the scheduler publishes: assignments and control messages to agents (stored, retried
//! while NATS elects a leader, sent again while unconfirmed), and job events and audit records
//! for anyone watching (awaited off the hot path).

use anyhow::{Result, anyhow};
use async_nats::HeaderMap;
use async_nats::jetstream;
use bytes::Bytes;

use mgpu_protocol::assign::{Assignment, NodeControl};
use mgpu_protocol::event::{EventSource, JobEvent, JobEventKind};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState, OnTimeout, Placement};
use mgpu_protocol::{now, subjects};

use crate::service::Scheduler;

impl Scheduler {
    /// Sends `control` to every node where a process of the job runs, but `except`.
    pub(crate) async fn send_control_to_job(
        &self,
        placement: &Placement,
        control: &NodeControl,
        except: Option<&str>,
    ) -> Result<()> {
        let payload = Bytes::from(serde_json::to_vec(control)?);
        for (_, node) in placement.launched_ranks() {
            if except == Some(node) {
                continue;
            }
            self.publish_stored(subjects::control(node), HeaderMap::new(), payload.clone())
                .await
                .map_err(|e| anyhow!("sending a control message to {node}: {e:#}"))?;
        }
        Ok(())
    }

    /// Publishes to a stream until JetStream stored it, retrying while NATS cannot answer (a
    /// server lost, a stream electing its leader) for up to [`crate::state::WRITE_RETRY_FOR`].
    /// Callers whose message may be stored twice give it a `Nats-Msg-Id`.
    pub(crate) async fn publish_stored(
        &self,
        subject: String,
        headers: HeaderMap,
        payload: Bytes,
    ) -> Result<()> {
        let mut retry = crate::state::Retry::new();
        loop {
            let stored = async {
                self.js
                    .publish_with_headers(subject.clone(), headers.clone(), payload.clone())
                    .await?
                    .await
            };
            match stored.await {
                Ok(_) => return Ok(()),
                Err(err) => {
                    retry
                        .wait(&format!("publishing on {subject}: {err}"))
                        .await?
                }
            }
        }
    }

    pub(crate) async fn send_assignment(&self, record: &JobRecord) -> Result<()> {
        let JobState::Running(run) = &record.state else {
            return Ok(());
        };
        // The agent enforces hard limits only; time slices (requeue) are the scheduler's.
        let mut spec = record.spec.clone();
        spec.time_limit_secs = match spec.on_timeout {
            OnTimeout::Fail => self.effective_time_limit(&spec).map(|l| l.as_secs().max(1)),
            OnTimeout::Requeue => None,
        };
        // Input is accepted from the owner's key and admins'; jobs run as the owner's account.
        let mut input_keys: Vec<String> = record.user_key.iter().cloned().collect();
        input_keys.extend(self.principals.admin_keys());
        input_keys.dedup();
        let unix_user = self
            .principals
            .user_by_name(&record.user)
            .map(|p| p.unix_account().to_owned());
        // Every rank that runs a process gets its own assignment; all are recorded before
        // any is sent (the record above), so a job is never half-placed.
        for (rank, node) in run.placement.launched_ranks() {
            let assignment = Assignment {
                job_id: record.id.clone(),
                attempt: record.attempt,
                user: record.user.clone(),
                spec: spec.clone(),
                placement: run.placement.clone(),
                rank,
                input_keys: input_keys.clone(),
                unix_user: unix_user.clone(),
            };
            let mut headers = HeaderMap::new();
            let msg_id = if rank == 0 {
                format!("{}-{}", record.id, record.attempt)
            } else {
                format!("{}-{}-{rank}", record.id, record.attempt)
            };
            headers.insert("Nats-Msg-Id", msg_id.as_str());
            self.publish_stored(
                subjects::assign(node),
                headers,
                Bytes::from(serde_json::to_vec(&assignment)?),
            )
            .await
            .map_err(|e| anyhow!("sending job {} to {node}: {e:#}", record.id))?;
        }
        Ok(())
    }

    /// After a restart: assignments recorded but never confirmed by their agent go out again.
    pub(crate) async fn resend_unconfirmed_assignments(&self) {
        self.resend_assignments_older_than(chrono::Duration::zero())
            .await;
    }

    /// Assignments recorded at least `age` ago and not confirmed go out again (the message id
    /// lets JetStream drop a copy, and an agent never runs an attempt twice). A send that
    /// failed for good, or an agent's report lost, is repaired this way.
    pub(crate) async fn resend_assignments_older_than(&self, age: chrono::Duration) {
        let now = now();
        let unconfirmed: Vec<JobRecord> = self
            .store
            .running()
            .filter(|r| {
                matches!(&r.state, JobState::Running(run)
                    if run.started_at.is_none() && now - run.assigned_at >= age)
            })
            .cloned()
            .collect();
        for record in unconfirmed {
            tracing::info!(job = %record.id, "re-sending an unconfirmed assignment");
            if let Err(err) = self.send_assignment(&record).await {
                tracing::error!("{err:#}");
            }
        }
    }

    /// Publishes a state change. The acknowledgement is awaited off the hot path: events are
    /// for watchers, the record in KV is the truth.
    pub(crate) fn publish_event(&self, job: &JobId, kind: JobEventKind) {
        let attempt = self.store.get(job).map(|r| r.attempt).unwrap_or(0);
        let event = JobEvent {
            job_id: job.clone(),
            attempt,
            at: now(),
            source: EventSource::Scheduler,
            kind,
        };
        let Ok(payload) = serde_json::to_vec(&event) else {
            return;
        };
        self.background
            .publish(subjects::events(job), payload, "a job event");
    }
}

/// Job events and audit records on their way to JetStream: for watchers, so a pass does not
/// wait for them, yet each is stored, in the order made. One task publishes them with at most
/// [`BACKGROUND_IN_FLIGHT`] acknowledgements awaited at once; what waits behind is a subject
/// and a payload in a queue, where a task per message meant up to 200 000 tasks during a
/// burst of 100 000 submissions (an event and an audit record each).
#[derive(Clone)]
pub(crate) struct BackgroundPublisher {
    queue: tokio::sync::mpsc::UnboundedSender<Pending>,
}

struct Pending {
    subject: String,
    payload: Bytes,
    /// Names the message in a failure's log line ("a job event").
    what: &'static str,
}

/// Acknowledgements the background publisher awaits at once: well under async-nats's 5 000,
/// and enough to keep the server busy.
const BACKGROUND_IN_FLIGHT: usize = 1_024;

impl BackgroundPublisher {
    /// Starts the publishing task; it ends once every clone is dropped and the queue is empty.
    pub(crate) fn start(js: jetstream::Context) -> Self {
        let (queue, pending) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(publish_pending(js, pending));
        BackgroundPublisher { queue }
    }

    /// Queues `payload` for `subject`; a failure is logged as `what`.
    pub(crate) fn publish(&self, subject: String, payload: Vec<u8>, what: &'static str) {
        let pending = Pending {
            subject,
            payload: payload.into(),
            what,
        };
        if self.queue.send(pending).is_err() {
            tracing::warn!("{what} not published: the publisher has stopped");
        }
    }
}

async fn publish_pending(
    js: jetstream::Context,
    mut pending: tokio::sync::mpsc::UnboundedReceiver<Pending>,
) {
    use futures::StreamExt;
    let mut in_flight = futures::stream::FuturesUnordered::new();
    let mut open = true;
    while open || !in_flight.is_empty() {
        tokio::select! {
            Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
            next = pending.recv(), if open && in_flight.len() < BACKGROUND_IN_FLIGHT => {
                let Some(Pending { subject, payload, what }) = next else {
                    open = false;
                    continue;
                };
                match js.publish(subject, payload).await {
                    Ok(ack) => in_flight.push(async move {
                        if let Err(err) = ack.await {
                            tracing::warn!(%err, "{what} not stored");
                        }
                    }),
                    Err(err) => tracing::warn!(%err, "publishing {what}"),
                }
            }
        }
    }
}

/// The rendezvous port of a multi-node job: derived from its id so every rank agrees without
/// asking, and spread over a range torchrun and MPI leave free by default.
pub(crate) fn master_port(job: &JobId) -> u16 {
    let hash = job
        .as_str()
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    29_500 + (hash % 20_000) as u16
}
