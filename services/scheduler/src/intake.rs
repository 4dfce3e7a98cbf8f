//! Reading requests off the requests stream: each decoded once into a [`Request`] and its
//! signature checked (a refused request is answered, audited and acknowledged at once);
//! consecutive plain submissions recorded together; every other request handed, in order, to
//! its handler (`submit.rs`, `cancel.rs`, `hold.rs`, `node_admin.rs`); each acknowledged once
//! handled, or left for JetStream to deliver again when storing failed.

use async_nats::jetstream;

use mgpu_nats::signing;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::request::{Action, Request};
use mgpu_protocol::submit::SubmitRequest;
use mgpu_protocol::{now, subjects, version};

use crate::identity::Identity;
use crate::metrics::RefusalReason;
use crate::outbox::Sender;
use crate::replay_memory::SeenNonce;
use crate::service::Scheduler;

/// A request read from the requests stream.
pub(crate) type RequestMessage = jetstream::Message;

/// A request whose signature checked out, with its message and its sender.
struct Admitted {
    message: RequestMessage,
    identity: Identity,
    /// Its nonce, written to the bucket before the request is acted on.
    nonce: SeenNonce,
}

/// One step of handling a batch of requests, in the order they came.
#[derive(Debug, PartialEq)]
enum Step<T> {
    /// Plain submissions, recorded together (their writes pipelined).
    Record(Vec<(T, SubmitRequest)>),
    /// Any other request, or a `--dedup` submission, on its own.
    CarryOut(T, Request),
}

/// Groups a batch: consecutive plain submissions are recorded together; any other request
/// (a cancel may name a job submitted just before it), and a `--dedup` submission (it must
/// see every job before it), comes alone, after the submissions before it.
fn steps<T>(requests: Vec<(T, Request)>) -> Vec<Step<T>> {
    let mut steps = Vec::new();
    let mut submissions = Vec::new();
    for (item, request) in requests {
        match request {
            Request::Submit(submit) if !submit.spec.dedup => submissions.push((item, *submit)),
            request => {
                if !submissions.is_empty() {
                    steps.push(Step::Record(std::mem::take(&mut submissions)));
                }
                steps.push(Step::CarryOut(item, request));
            }
        }
    }
    if !submissions.is_empty() {
        steps.push(Step::Record(submissions));
    }
    steps
}

impl Scheduler {
    /// Handles a batch of requests in order (see [`steps`]).
    pub(crate) async fn on_requests(&mut self, batch: Vec<RequestMessage>) {
        let mut admitted = Vec::with_capacity(batch.len());
        for message in batch {
            if let Some(request) = self.admit(message).await {
                admitted.push(request);
            }
        }
        let admitted = self.keep_nonces(admitted).await;
        for step in steps(admitted) {
            match step {
                Step::Record(submissions) => self.record_submissions(submissions).await,
                Step::CarryOut(admitted, request) => {
                    self.carry_out_request(admitted.message, admitted.identity, request)
                        .await;
                }
            }
        }
    }

    /// Writes the admitted requests' nonces to the bucket, so a copy sent after a restart is
    /// still refused. From the first request whose nonce could not be written on, the batch is
    /// left unacknowledged and not acted on, so requests keep their order (a cancel never
    /// overtakes its job's submission): JetStream redelivers them, and a request's own
    /// redelivery is no replay.
    async fn keep_nonces(
        &mut self,
        mut admitted: Vec<(Admitted, Request)>,
    ) -> Vec<(Admitted, Request)> {
        let nonces: Vec<&SeenNonce> = admitted.iter().map(|(a, _)| &a.nonce).collect();
        let stored = crate::replay_memory::remember(&self.js, &nonces).await;
        if let Some(first_lost) = stored.iter().position(|stored| !stored) {
            tracing::warn!(
                left = admitted.len() - first_lost,
                "could not remember a request's nonce; it and the requests after it are \
                 handled when redelivered"
            );
            admitted.truncate(first_lost);
        }
        admitted
    }

    /// Records plain submissions together and acknowledges those stored.
    async fn record_submissions(&mut self, submissions: Vec<(Admitted, SubmitRequest)>) {
        let mut messages = Vec::with_capacity(submissions.len());
        let mut identities = Vec::with_capacity(submissions.len());
        let mut requests = Vec::with_capacity(submissions.len());
        for (admitted, request) in submissions {
            messages.push(admitted.message);
            identities.push(admitted.identity);
            requests.push(request);
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
    async fn admit(&mut self, message: RequestMessage) -> Option<(Admitted, Request)> {
        let subject = message.subject.to_string();
        let Some(action) = Action::of_subject(&subject) else {
            tracing::warn!(%subject, "ignoring a request on an unexpected subject");
            acknowledge(&message).await;
            return None;
        };
        if let Some(why) = request_incompatibility(&message) {
            let about = subjects::job_id_of(&subject)
                .and_then(|id| id.parse::<JobId>().ok())
                .or_else(|| version::peek_job_id(&message.payload));
            let key = message
                .headers
                .as_ref()
                .and_then(|h| h.get(signing::SIGNER))
                .map(|k| k.as_str().to_owned());
            let sender = Sender::Unknown { key };
            let counted = RefusalReason::Incompatible;
            self.refuse(action, about.as_ref(), &sender, counted, why);
            acknowledge(&message).await;
            return None;
        }
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
        let (identity, nonce) = match self.gate.authenticate(&message, stored_at) {
            Ok(admitted) => admitted,
            Err(refusal) => {
                // The job a refused request names, so its submitter hears why.
                let about = subjects::job_id_of(&subject)
                    .and_then(|id| id.parse::<JobId>().ok())
                    .or_else(|| decoded.as_ref().ok().and_then(Request::job).cloned());
                let sender = Sender::Unknown { key: refusal.key };
                self.refuse(action, about.as_ref(), &sender, refusal.why, refusal.reason);
                acknowledge(&message).await;
                return None;
            }
        };
        match decoded {
            Ok(request) => Some((
                Admitted {
                    message,
                    identity,
                    nonce,
                },
                request,
            )),
            Err(err) => {
                tracing::warn!(%subject, %err, "refusing a malformed {action} request");
                self.metrics
                    .tally()
                    .refused(action, RefusalReason::Malformed);
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

/// Why a request cannot be read by this scheduler: its sender speaks another protocol.
fn request_incompatibility(message: &RequestMessage) -> Option<String> {
    let protocol = version::of_header(
        message
            .headers
            .as_ref()
            .and_then(|h| h.get(version::HEADER))
            .map(|v| v.as_str()),
    );
    version::incompatibility("the mgpu that sent this request", protocol)
}

#[cfg(test)]
mod tests {
    use mgpu_protocol::cancel::CancelRequest;
    use mgpu_protocol::ids::JobId;
    use mgpu_protocol::job::JobSpec;

    use super::*;

    fn submit(dedup: bool) -> Request {
        let mut spec = JobSpec::new(vec!["true".into()], "/tmp");
        spec.dedup = dedup;
        Request::Submit(Box::new(SubmitRequest {
            id: JobId::random(),
            user: "alice".into(),
            spec,
        }))
    }

    fn cancel() -> Request {
        Request::Cancel {
            job: JobId::random(),
            request: CancelRequest {
                user: "alice".into(),
                reason: None,
            },
        }
    }

    /// The steps, as labels: `[1, 2]` recorded together, `3` carried out alone.
    fn shape(steps: Vec<Step<u32>>) -> Vec<Vec<u32>> {
        steps
            .into_iter()
            .map(|step| match step {
                Step::Record(items) => items.into_iter().map(|(label, _)| label).collect(),
                Step::CarryOut(label, _) => vec![100 + label],
            })
            .collect()
    }

    #[test]
    fn consecutive_plain_submissions_are_recorded_together() {
        let batch = vec![(1, submit(false)), (2, submit(false)), (3, submit(false))];
        assert_eq!(shape(steps(batch)), vec![vec![1, 2, 3]]);
    }

    #[test]
    fn a_cancel_comes_after_the_submissions_before_it_and_before_those_after() {
        let batch = vec![
            (1, submit(false)),
            (2, cancel()),
            (3, submit(false)),
            (4, submit(false)),
        ];
        assert_eq!(shape(steps(batch)), vec![vec![1], vec![102], vec![3, 4]]);
    }

    #[test]
    fn a_dedup_submission_comes_alone_after_every_job_before_it() {
        let batch = vec![
            (1, submit(false)),
            (2, submit(false)),
            (3, submit(true)),
            (4, submit(true)),
            (5, submit(false)),
        ];
        assert_eq!(
            shape(steps(batch)),
            vec![vec![1, 2], vec![103], vec![104], vec![5]]
        );
    }

    #[test]
    fn an_empty_batch_has_no_steps() {
        assert!(steps::<u32>(Vec::new()).is_empty());
    }
}
