//! Reading requests off the requests stream: each decoded once into a [`Request`] and its
//! signature checked (a refused request is answered, audited and acknowledged at once);
//! consecutive plain submissions recorded together; every other request handed, in order, to
//! its handler (`submit.rs`, `cancel.rs`, `hold.rs`, `node_admin.rs`); each acknowledged once
//! handled, or left for JetStream to deliver again when storing failed.

use async_nats::jetstream;

use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::SubmitRequest;
use mgpu_protocol::request::{Action, Request};
use mgpu_protocol::{now, subjects};

use crate::identity::Identity;
use crate::outbox::Sender;
use crate::service::Scheduler;

/// A request read from the requests stream.
pub(crate) type RequestMessage = jetstream::Message;

/// A request whose signature checked out, ready to be carried out.
struct Admitted {
    message: RequestMessage,
    identity: Identity,
    request: Request,
}

/// A plain submission waiting to be recorded with the others of its batch.
struct Pending {
    message: RequestMessage,
    identity: Identity,
    request: SubmitRequest,
}

impl Scheduler {
    /// Handles a batch of requests in order. Consecutive plain submissions are recorded
    /// together, their writes pipelined; any other request (a cancel may name a job submitted
    /// just before it), and a `--dedup` submission (it must see every job before it), first
    /// lets the submissions before it be recorded.
    pub(crate) async fn on_requests(&mut self, batch: Vec<RequestMessage>) {
        let mut submissions: Vec<Pending> = Vec::new();
        for message in batch {
            let Some(admitted) = self.admit(message).await else {
                continue;
            };
            let Admitted {
                message,
                identity,
                request,
            } = admitted;
            match request {
                Request::Submit(request) if !request.spec.dedup => {
                    submissions.push(Pending {
                        message,
                        identity,
                        request: *request,
                    });
                }
                request => {
                    self.record_submissions(std::mem::take(&mut submissions))
                        .await;
                    self.carry_out_request(message, identity, request).await;
                }
            }
        }
        self.record_submissions(submissions).await;
    }

    /// Records plain submissions together and acknowledges those stored.
    async fn record_submissions(&mut self, submissions: Vec<Pending>) {
        if submissions.is_empty() {
            return;
        }
        let mut messages = Vec::with_capacity(submissions.len());
        let mut identities = Vec::with_capacity(submissions.len());
        let mut requests = Vec::with_capacity(submissions.len());
        for pending in submissions {
            messages.push(pending.message);
            identities.push(pending.identity);
            requests.push(pending.request);
        }
        let inputs = requests.into_iter().zip(identities.iter()).collect();
        let results = self.on_submits(inputs).await;
        for (message, result) in messages.iter().zip(results) {
            match result {
                Ok(()) => acknowledge(message).await,
                // Unacknowledged: JetStream redelivers it.
                Err(err) => tracing::error!("handling a submission: {err:#}"),
            }
        }
    }

    /// Decodes a request and checks its signature; a refused or malformed one is handled and
    /// acknowledged here (None).
    async fn admit(&mut self, message: RequestMessage) -> Option<Admitted> {
        let subject = message.subject.to_string();
        let Some(action) = Action::of_subject(&subject) else {
            tracing::warn!(%subject, "ignoring a request on an unexpected subject");
            acknowledge(&message).await;
            return None;
        };
        let decoded = Request::decode(&subject, &message.payload);
        // When JetStream stored it: the signature must be that recent (a replay is not).
        let stored_at = message
            .info()
            .ok()
            .and_then(|info| {
                let nanos = i64::try_from(info.published.unix_timestamp_nanos()).ok()?;
                Some(chrono::DateTime::from_timestamp_nanos(nanos))
            })
            .unwrap_or_else(now);
        let identity = match self.gate.authenticate(&message, stored_at) {
            Ok(identity) => identity,
            Err(refusal) => {
                // The job a refused request names, so its submitter hears why.
                let about = subjects::job_id_of(&subject)
                    .and_then(|id| id.parse::<JobId>().ok())
                    .or_else(|| decoded.as_ref().ok().and_then(Request::job).cloned());
                let sender = Sender::Unknown { key: refusal.key };
                self.refuse(action, about.as_ref(), &sender, refusal.reason);
                acknowledge(&message).await;
                return None;
            }
        };
        match decoded {
            Ok(request) => Some(Admitted {
                message,
                identity,
                request,
            }),
            Err(err) => {
                tracing::warn!(%subject, %err, "refusing a malformed {action} request");
                acknowledge(&message).await;
                None
            }
        }
    }

    /// Carries out an admitted request and acknowledges it once handled.
    async fn carry_out_request(
        &mut self,
        message: RequestMessage,
        identity: Identity,
        request: Request,
    ) {
        let handled = match request {
            Request::Submit(request) => self.on_submit(*request, &identity).await,
            Request::Cancel { job, request } => self.on_cancel(&job, request, &identity).await,
            Request::Hold { job, .. } => self.on_hold(&job, true, &identity).await,
            Request::Release { job, .. } => self.on_hold(&job, false, &identity).await,
            Request::Admin(request) => self.on_node_admin(request, &identity).await,
        };
        match handled {
            Ok(()) => acknowledge(&message).await,
            // A failure to persist leaves the request unacknowledged: JetStream redelivers it.
            Err(err) => tracing::error!("handling {}: {err:#}", message.subject),
        }
    }
}

async fn acknowledge(message: &RequestMessage) {
    if let Err(err) = message.ack().await {
        tracing::warn!(%err, "acknowledging a request");
    }
}
