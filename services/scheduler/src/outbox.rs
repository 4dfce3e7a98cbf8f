//! What the scheduler publishes: assignments and control messages to agents (stored, retried
//! while NATS elects a leader), and job events and audit records for anyone watching (awaited
//! off the hot path). The [`Outbox`] only sends; what to send is decided elsewhere (the job
//! lifecycle's effects, the liveness checks).

use std::time::Duration;

use anyhow::{Result, anyhow};
use async_nats::HeaderMap;
use async_nats::jetstream;
use bytes::Bytes;

use mgpu_protocol::assign::{Assignment, NodeControl};
use mgpu_protocol::audit::AuditRecord;
use mgpu_protocol::event::{EventSource, JobEvent, JobEventKind};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState, OnTimeout, Placement};
use mgpu_protocol::request::Action;
use mgpu_protocol::{now, subjects};

use crate::identity::{Identity, Principals};
use crate::state::Retry;

/// The scheduler's way out to agents and watchers.
pub(crate) struct Outbox {
    js: jetstream::Context,
    /// Where job events and audit records go out, off the hot path.
    background: BackgroundPublisher,
}

impl Outbox {
    pub(crate) fn new(js: jetstream::Context) -> Self {
        Outbox {
            background: BackgroundPublisher::start(js.clone()),
            js,
        }
    }

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

    /// Tells `node` to kill an attempt that should not run there (fencing).
    pub(crate) async fn send_stale_kill(
        &self,
        node: &str,
        job: &JobId,
        attempt: u32,
    ) -> Result<()> {
        let control = NodeControl::Kill {
            job_id: job.clone(),
            attempt,
            reason: "stale attempt: this job was requeued or ended elsewhere".into(),
            requeue: false,
        };
        self.publish_stored(
            subjects::control(node),
            HeaderMap::new(),
            Bytes::from(serde_json::to_vec(&control)?),
        )
        .await
        .map_err(|e| anyhow!("sending a fencing kill to {node}: {e:#}"))
    }

    /// Publishes to a stream until JetStream stored it, retrying while NATS cannot answer (a
    /// server lost, a stream electing its leader) for up to [`crate::state::WRITE_RETRY_FOR`].
    /// Callers whose message may be stored twice give it a `Nats-Msg-Id`.
    async fn publish_stored(
        &self,
        subject: String,
        headers: HeaderMap,
        payload: Bytes,
    ) -> Result<()> {
        let mut retry = Retry::new();
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

    /// Sends a running job's assignment to every node that runs one of its ranks. `limit` is
    /// the time limit it runs under; `principals` say whose input it takes and which Unix
    /// account it runs as.
    pub(crate) async fn send_assignment(
        &self,
        record: &JobRecord,
        limit: Option<Duration>,
        principals: &Principals,
    ) -> Result<()> {
        let JobState::Running(run) = &record.state else {
            return Ok(());
        };
        // The agent enforces hard limits only; time slices (requeue) are the scheduler's.
        let mut spec = crate::private_env::spec_with_env(&self.js.client(), record).await?;
        spec.time_limit_secs = match spec.on_timeout {
            OnTimeout::Fail => limit.map(|l| l.as_secs().max(1)),
            OnTimeout::Requeue => None,
        };
        // Input is accepted from the owner's key and admins'; jobs run as the owner's account.
        let mut input_keys: Vec<String> = record.user_key.iter().cloned().collect();
        input_keys.extend(principals.admin_keys());
        input_keys.dedup();
        let unix_user = principals
            .user_by_name(&record.user)
            .map(|p| p.unix_account().to_owned());
        let output_subject = record
            .spec
            .private_output
            .then(|| subjects::output_of(record));
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
                output_subject: output_subject.clone(),
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

    /// Publishes a state change of `attempt` of `job`. The acknowledgement is awaited off the
    /// hot path: events are for watchers, the record in KV is the truth.
    pub(crate) fn publish_event(&self, job: &JobId, attempt: u32, kind: JobEventKind) {
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

    /// Records a request in the audit stream: its `action`, its `sender`, the job or node it
    /// was about, and its `outcome`: what was done, or why it was refused.
    pub(crate) fn audit(
        &self,
        action: Action,
        sender: &Sender<'_>,
        target: Option<String>,
        outcome: Result<String, String>,
    ) {
        let (by, key) = match sender {
            Sender::Known(identity) => (Some(identity.name.clone()), Some(identity.key.clone())),
            Sender::Unknown { key } => (None, key.clone()),
        };
        let accepted = outcome.is_ok();
        let record = AuditRecord {
            at: now(),
            action: action.as_str().to_owned(),
            by,
            key,
            target,
            accepted,
            detail: outcome.unwrap_or_else(|refused| refused),
        };
        let Ok(payload) = serde_json::to_vec(&record) else {
            return;
        };
        self.background
            .publish(subjects::audit(action.as_str()), payload, "an audit record");
    }

    /// Refuses a request about `job` (with its current attempt): a log line, an event the
    /// requester's CLI shows, and an audit record.
    pub(crate) fn refuse(
        &self,
        action: Action,
        job: Option<(&JobId, u32)>,
        sender: &Sender<'_>,
        reason: String,
    ) {
        let by = match sender {
            Sender::Known(identity) => Some(identity.name.as_str()),
            Sender::Unknown { .. } => None,
        };
        tracing::warn!(
            %action,
            job = job.map(|(id, _)| id.as_str()),
            by,
            "request refused: {reason}"
        );
        if let Some((id, attempt)) = job {
            let said = format!("permission denied: {reason}");
            let kind = if action == Action::Submit {
                JobEventKind::Rejected { reason: said }
            } else {
                JobEventKind::Refused {
                    action: action.as_str().to_owned(),
                    reason: said,
                }
            };
            self.publish_event(id, attempt, kind);
        }
        self.audit(
            action,
            sender,
            job.map(|(id, _)| id.to_string()),
            Err(reason),
        );
    }
}

/// Who sent a request, as the audit trail records them.
pub(crate) enum Sender<'a> {
    /// Their signature checked out.
    Known(&'a Identity),
    /// Refused before they were known: the key the request presented, if any.
    Unknown { key: Option<String> },
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
    fn start(js: jetstream::Context) -> Self {
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
