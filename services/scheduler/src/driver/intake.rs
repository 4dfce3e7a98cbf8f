//! What comes in, read into the machine's inputs: requests (decoded once, the sender's
//! protocol and signature checked against the principals file, the nonce kept in KV before
//! anything is acted on, an inline environment put apart, dependencies in history looked
//! up), agents' reports (the protocol checked, the signer checked against the node named)
//! and heartbeats (decoded, validated, published on their node's own subject). The machine
//! decides what each means; a message it should acknowledge is held here under a token.

use async_nats::jetstream;
use bytes::Bytes;

use mgpu_nats::{job_env, records, signing};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::node::NodeHeartbeat;
use mgpu_protocol::report::AgentReport;
use mgpu_protocol::request::{Action, Request};
use mgpu_protocol::{Timestamp, now, subjects, version, wire};

use super::Driver;
use crate::identity::SeenNonce;
use crate::lifecycle::StreamOrder;
use crate::machine::messages::{Admitted, Input, Refused, Step, steps, submitted_specs};
use crate::metrics::RefusalReason;

/// How long an event of an unreadable protocol waits before it is offered again.
const UNREADABLE_RETRY: std::time::Duration = std::time::Duration::from_secs(30);

impl Driver {
    /// Handles a batch of requests in order: each admitted or refused at the gate, the
    /// admitted ones' nonces kept, then the steps (plain submissions together, any other
    /// request alone) fed to the machine one at a time.
    pub(super) async fn on_requests(&mut self, batch: Vec<jetstream::Message>) {
        let mut admitted = Vec::with_capacity(batch.len());
        for message in batch {
            if Action::of_subject(&message.subject).is_none() {
                tracing::warn!(subject = %message.subject, "ignoring a request on an unexpected subject");
                acknowledge(&message).await;
                continue;
            }
            match self.admit(message) {
                // A batch's tasks each go on as a submission of their own, its nonce with each.
                Ok((requests, nonce)) => {
                    admitted.extend(requests.into_iter().map(|request| (request, nonce.clone())))
                }
                Err(refused) => self.feed(*refused).await,
            }
        }
        if !admitted.is_empty() && !self.lease_confirmed().await {
            // Left unacknowledged: the replica that took over gets them.
            self.held.clear();
            return;
        }
        // Both must be stored before a submission is acted on, and neither waits for the
        // other: each is a write flushed to disk, and a start waits for both.
        let environments = environments_of(&admitted);
        let js = self.js.clone();
        let puts = futures::future::join_all(
            environments
                .iter()
                .map(|found| keep_env_apart(&js, found.as_ref())),
        );
        let (stored, admitted) = futures::join!(puts, self.keep_nonces(admitted));
        // The nonces keep a prefix of the batch: the environments' results line up with it.
        let mut ready = Vec::with_capacity(admitted.len());
        for ((mut admitted, _), stored) in admitted.into_iter().zip(stored) {
            match stored {
                Ok(()) => {
                    if let Request::Submit(request) = &mut admitted.request
                        && !request.spec.env.is_empty()
                    {
                        request.spec.env.clear();
                        request.spec.private_env = true;
                    }
                    ready.push(admitted);
                }
                Err(err) => {
                    // Its environment would otherwise be in a record every user reads: not
                    // recorded now, left unacknowledged, JetStream delivers it again.
                    tracing::error!("keeping a submission's environment apart: {err}");
                    self.held.release(admitted.token);
                }
            }
        }
        self.learn_archived(submitted_specs(&ready)).await;
        for step in steps(ready, |admitted| &admitted.request) {
            let input = match step {
                Step::Record(submissions) => Input::Submissions(submissions),
                Step::CarryOut(admitted) => Input::Request(Box::new(admitted)),
            };
            self.feed(input).await;
            if self.stepped_down {
                break;
            }
            // Between two steps of a burst (seconds each where every write is flushed to
            // disk), the nodes' latest heartbeats: a tick after it must not find them stale.
            self.take_heartbeats().await;
        }
        // What the machine did not acknowledge is delivered again by JetStream.
        self.release_unkept();
    }

    /// Decodes a request and checks its sender; the admitted requests (one, or a batch's
    /// tasks, each under its own token) with the message's nonce, or the machine's input
    /// for a refused or malformed one.
    fn admit(
        &mut self,
        message: jetstream::Message,
    ) -> Result<(Vec<Admitted>, SeenNonce), Box<Input>> {
        let subject = message.subject.to_string();
        // Checked by the caller; a submission's action otherwise.
        let action = Action::of_subject(&subject).unwrap_or(Action::Submit);
        let key = message
            .headers
            .as_ref()
            .and_then(|h| h.get(signing::SIGNER))
            .map(|k| k.as_str().to_owned());
        if let Some(why) = incompatibility(&message, "the mgpu that sent this request") {
            let about = subjects::job_id_of(&subject)
                .and_then(|id| id.parse::<JobId>().ok())
                .or_else(|| version::peek_job_id(&message.payload));
            let token = self.hold(message);
            return Err(Box::new(Input::Refused(Refused {
                token,
                action,
                about,
                key,
                why: RefusalReason::Incompatible,
                reason: why,
            })));
        }
        let decoded = Request::decode_all(&subject, &message.payload);
        let stored_at = stored_at(&message);
        let order = message.info().ok().map(|info| StreamOrder {
            sequence: info.stream_sequence,
            redelivered: info.delivered > 1,
            stored_at,
        });
        let sequence = order.map(|order| order.sequence);
        let verified = signing::verify(
            message.headers.as_ref(),
            &subject,
            &message.payload,
            stored_at,
        );
        let authenticated = self
            .gate
            .authenticate(verified, key.clone(), (stored_at, sequence));
        let (identity, nonce) = match authenticated {
            Ok(admitted) => admitted,
            Err(refusal) => {
                // The job a refused request names, so its submitter hears why.
                let about = subjects::job_id_of(&subject)
                    .and_then(|id| id.parse::<JobId>().ok())
                    .or_else(|| {
                        let first = decoded.as_ref().ok().and_then(|all| all.first());
                        first.and_then(Request::job).cloned()
                    });
                let token = self.hold(message);
                return Err(Box::new(Input::Refused(Refused {
                    token,
                    action,
                    about,
                    key: refusal.key,
                    why: refusal.why,
                    reason: refusal.reason,
                })));
            }
        };
        match decoded {
            Ok(requests) => {
                let verdict_to = message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get(mgpu_protocol::submit::VERDICT_HEADER))
                    .map(|to| to.as_str().to_owned())
                    .filter(|to| mgpu_protocol::submit::verdict_subject_of(&identity.key, to));
                let tokens = self.held.hold(message, requests.len());
                let admitted = tokens
                    .into_iter()
                    .zip(requests)
                    .map(|(token, request)| Admitted {
                        token,
                        identity: identity.clone(),
                        request,
                        order,
                        verdict_to: verdict_to.clone(),
                    })
                    .collect();
                Ok((admitted, nonce))
            }
            Err(err) => {
                let token = self.hold(message);
                Err(Box::new(Input::Refused(Refused {
                    token,
                    action,
                    about: None,
                    key,
                    why: RefusalReason::Malformed,
                    reason: err.to_string(),
                })))
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
        mut admitted: Vec<(Admitted, SeenNonce)>,
    ) -> Vec<(Admitted, SeenNonce)> {
        // A batch's tasks follow one another with their message's nonce: kept once.
        let mut nonces: Vec<&SeenNonce> = Vec::with_capacity(admitted.len());
        let mut nonce_of = Vec::with_capacity(admitted.len());
        for (_, nonce) in &admitted {
            if nonces.last().is_none_or(|last| last.nonce != nonce.nonce) {
                nonces.push(nonce);
            }
            nonce_of.push(nonces.len() - 1);
        }
        let stored = super::store::remember_nonces(&self.js, &nonces).await;
        let lost = stored.iter().position(|stored| !stored);
        let first_lost = lost.and_then(|lost| nonce_of.iter().position(|&n| n == lost));
        if let Some(first_lost) = first_lost {
            tracing::warn!(
                left = admitted.len() - first_lost,
                "could not remember a request's nonce; it and the requests after it are \
                 handled when redelivered"
            );
            for (left, _) in admitted.drain(first_lost..) {
                self.held.release(left.token);
            }
        }
        admitted
    }

    /// Looks up in history how the jobs that `specs` depend on ended, for those the machine
    /// does not know: `--after` a job that left the live bucket resolves as it would have.
    pub(super) async fn learn_archived<'a>(
        &mut self,
        specs: impl IntoIterator<Item = &'a mgpu_protocol::job::JobSpec>,
    ) {
        let unknown = self.machine.unknown_dependencies(specs);
        let mut found = Vec::new();
        for id in unknown {
            match records::archived_job(&self.js, &id, None).await {
                Ok(Some(record)) => found.push((record.id, record.state)),
                // Not recorded yet (submitted in the same batch) or unknown: it waits.
                Ok(None) => {}
                Err(err) => tracing::warn!(job = %id, "looking a dependency up in history: {err}"),
            }
        }
        if !found.is_empty() {
            self.feed(Input::HistoryStates(found)).await;
        }
    }

    /// A message from the events stream: an agent's report goes to the machine; the
    /// scheduler's own events (they come back on the same subjects) and malformed ones are
    /// acknowledged and dropped; one of a protocol this scheduler cannot read is left for a
    /// scheduler that can (the upgraded one, if the agents were upgraded first).
    pub(super) async fn on_event_message(&mut self, message: jetstream::Message) {
        if let Some(why) = incompatibility(&message, "a job event's sender") {
            tracing::warn!(subject = %message.subject, "job event left unread: {why}");
            let later = jetstream::AckKind::Nak(Some(UNREADABLE_RETRY));
            if let Err(err) = message.ack_with(later).await {
                tracing::warn!(%err, "returning an unreadable job event");
            }
            return;
        }
        let report = match AgentReport::decode(message.subject.as_str(), &message.payload, now()) {
            Ok(Some(report)) => report,
            Ok(None) => return acknowledge(&message).await,
            Err(err) => {
                tracing::warn!(subject = %message.subject, %err, "ignoring a malformed job event");
                return acknowledge(&message).await;
            }
        };
        let checked = self.check_reporter(&message, &report);
        let token = self.hold(message);
        let input = match checked {
            Ok(()) => Input::Report { token, report },
            Err((key, why)) => Input::ReportRefused {
                token,
                job: report.job,
                key,
                why,
            },
        };
        self.feed(input).await;
        self.release_unkept();
    }

    /// Lets go of the messages handled and not acknowledged (JetStream delivers them again
    /// after the ack wait), except those a new job acknowledges once its record is stored.
    fn release_unkept(&mut self) {
        let machine = &self.machine;
        self.held.retain(|token| machine.keeps_token(token));
    }

    /// Whether the report is signed by the node it names (or an admin): any node may publish
    /// on `jobs.<id>.events`, so what the payload says of its sender proves nothing. The error
    /// is the signer's key (when there is one) and why the report is refused.
    fn check_reporter(
        &mut self,
        message: &jetstream::Message,
        report: &AgentReport,
    ) -> Result<(), (Option<String>, String)> {
        let signed = signing::verify(
            message.headers.as_ref(),
            message.subject.as_str(),
            &message.payload,
            stored_at(message),
        )
        .map_err(|err| {
            (
                None,
                format!("a report said to be from {}: {err}", report.node),
            )
        })?;
        let signer = signed.signer;
        let principals = &mut self.gate.principals;
        let node = principals.node_by_key(&signer);
        if node.as_ref().is_some_and(|node| node.name == report.node) {
            return Ok(());
        }
        // Admins may speak for any node, as they may cancel any job (the scale benchmark's
        // simulated fleet reports as an admin).
        if principals
            .user_by_key(&signer)
            .is_some_and(|p| p.is_admin())
        {
            return Ok(());
        }
        let why = match node {
            Some(node) => format!(
                "node {} signed a report that says it is from node {}",
                node.name, report.node
            ),
            None => format!(
                "a report said to be from {} is signed by a key of no node",
                report.node
            ),
        };
        Err((Some(signer), why))
    }

    /// A heartbeat arrived on `subject`: checked, then handed to the machine.
    pub(super) async fn on_heartbeat(&mut self, subject: &str, payload: &Bytes) {
        if let Some(input) = heartbeat_input(subject, payload, now()) {
            self.feed(input).await;
        }
    }
}

/// What a heartbeat on `subject` tells the machine, if anything: the version before anything
/// the heartbeat says is used (one this release reads decodes strictly and says its protocol;
/// only one that does not decode is read again for the version alone), then the beat,
/// validated, and only for the node whose subject it came on.
/// An inline environment of a submission, to be moved to the bucket under its signer's key:
/// (owner, job, environment); None for other requests and submissions without one.
type InlineEnvironment = Option<(String, JobId, job_env::Environment)>;

fn environments_of(admitted: &[(Admitted, SeenNonce)]) -> Vec<InlineEnvironment> {
    admitted
        .iter()
        .map(|(admitted, _)| match &admitted.request {
            Request::Submit(request) if !request.spec.env.is_empty() => Some((
                admitted.identity.key.clone(),
                request.id.clone(),
                request.spec.env.clone(),
            )),
            _ => None,
        })
        .collect()
}

/// Stores an inline environment in its bucket (nothing to do without one).
async fn keep_env_apart(
    js: &jetstream::Context,
    found: Option<&(String, JobId, job_env::Environment)>,
) -> Result<(), String> {
    let Some((owner, job, env)) = found else {
        return Ok(());
    };
    job_env::put(js, owner, job, env)
        .await
        .map_err(|err| format!("job {job}: {err}"))
}

pub(crate) fn heartbeat_input(subject: &str, payload: &Bytes, now: Timestamp) -> Option<Input> {
    let strict = wire::decode::<NodeHeartbeat>("heartbeat", payload, wire::MAX_HEARTBEAT_BYTES);
    let protocol = match &strict {
        Ok(beat) => beat.protocol,
        Err(_) => version::peek(payload),
    };
    if let Some(node) = subjects::node_of(subject) {
        let sender = format!("the agent of node {node}");
        if version::incompatibility(&sender, protocol).is_some() {
            return Some(Input::IncompatibleHeartbeat {
                node: node.to_owned(),
                protocol,
            });
        }
    }
    let decoded = strict
        .and_then(|beat| beat.validate(now).map(|()| beat))
        .and_then(|beat| {
            // The server lets a node publish only its own subject; the payload must not
            // speak for another node.
            if subjects::node_of(subject) == Some(beat.node.as_str()) {
                Ok(beat)
            } else {
                Err(wire::InvalidInput::new(format!(
                    "heartbeat for node {} published on {subject}",
                    beat.node
                )))
            }
        });
    match decoded {
        Ok(beat) => Some(Input::Heartbeat(Box::new(beat))),
        Err(err) => {
            tracing::warn!(%err, "ignoring a malformed heartbeat");
            None
        }
    }
}

/// When JetStream stored a message: a signature must be that recent (a replay is not).
fn stored_at(message: &jetstream::Message) -> Timestamp {
    message
        .info()
        .ok()
        .and_then(|info| {
            let nanos = i64::try_from(info.published.unix_timestamp_nanos()).ok()?;
            Some(chrono::DateTime::from_timestamp_nanos(nanos))
        })
        .unwrap_or_else(now)
}

pub(super) async fn acknowledge(message: &jetstream::Message) {
    if let Err(err) = message.ack().await {
        tracing::warn!(%err, "acknowledging a message");
    }
}

/// Why a message cannot be read by this scheduler: `sender` speaks another protocol (the
/// message's version header says which).
fn incompatibility(message: &jetstream::Message, sender: &str) -> Option<String> {
    let protocol = version::of_header(
        message
            .headers
            .as_ref()
            .and_then(|h| h.get(version::HEADER))
            .map(|v| v.as_str()),
    );
    version::incompatibility(sender, protocol)
}
