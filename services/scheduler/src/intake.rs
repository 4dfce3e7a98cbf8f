//! Reading requests off the requests stream: each signature checked (a refused request is
//! answered, audited and acknowledged at once), consecutive plain submissions recorded
//! together, every other request carried out in order, each acknowledged once handled.

use async_nats::jetstream;
use bytes::Bytes;

use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::SubmitRequest;
use mgpu_protocol::{now, subjects};

use crate::service::Scheduler;

/// A request read from the requests stream.
pub(crate) type RequestMessage = jetstream::Message;

/// A request whose signature checked out, ready to be carried out.
struct Admitted {
    message: jetstream::Message,
    identity: crate::identity::Identity,
    action: &'static str,
    job: Option<String>,
}

/// Just enough of a submission to see whether it asks for `--dedup`.
#[derive(serde::Deserialize)]
struct DedupProbe {
    spec: DedupFlag,
}

#[derive(serde::Deserialize)]
struct DedupFlag {
    #[serde(default)]
    dedup: bool,
}

impl Scheduler {
    /// Handles a batch of requests in order. Consecutive submissions are recorded together,
    /// their writes pipelined; any other request (a cancel may name a job submitted just
    /// before it), and a `--dedup` submission (it must see every job before it), first lets
    /// the submissions before it be recorded.
    pub(crate) async fn on_requests(&mut self, batch: Vec<RequestMessage>) {
        let mut submissions: Vec<Admitted> = Vec::new();
        for message in batch {
            let Some(admitted) = self.admit(message).await else {
                continue;
            };
            let plain_submission = admitted.action == "submit"
                && serde_json::from_slice::<DedupProbe>(&admitted.message.payload)
                    .is_ok_and(|probe| !probe.spec.dedup);
            if plain_submission {
                submissions.push(admitted);
                continue;
            }
            self.record_submissions(std::mem::take(&mut submissions))
                .await;
            self.carry_out_request(admitted).await;
        }
        self.record_submissions(submissions).await;
    }

    /// Records plain submissions together and acknowledges those stored.
    async fn record_submissions(&mut self, submissions: Vec<Admitted>) {
        if submissions.is_empty() {
            return;
        }
        let inputs: Vec<(Bytes, crate::identity::Identity)> = submissions
            .iter()
            .map(|a| (a.message.payload.clone(), a.identity.clone()))
            .collect();
        let results = self.on_submits(&inputs).await;
        for (admitted, result) in submissions.iter().zip(results) {
            match result {
                Ok(()) => {
                    if let Err(err) = admitted.message.ack().await {
                        tracing::warn!(%err, "acknowledging a request");
                    }
                }
                // Unacknowledged: JetStream redelivers it.
                Err(err) => tracing::error!("handling a submission: {err:#}"),
            }
        }
    }

    /// Checks a request's signature; a refused one is answered, audited and acknowledged
    /// here (None).
    async fn admit(&mut self, message: RequestMessage) -> Option<Admitted> {
        let subject = message.subject.to_string();
        let job = subjects::job_id_of(&subject).map(str::to_owned);
        let kind = subject.rsplit('.').next().unwrap_or("");
        let action = match (subject.as_str(), kind) {
            (subjects::SUBMIT, _) => "submit",
            (subjects::ADMIN_REQUESTS, _) => "admin",
            (_, "cancel") => "cancel",
            (_, "hold") => "hold",
            (_, "release") => "release",
            _ => "unknown",
        };
        // When JetStream stored it: the signature must be that recent (a replay is not).
        let stored_at = message
            .info()
            .ok()
            .and_then(|info| {
                let nanos = i64::try_from(info.published.unix_timestamp_nanos()).ok()?;
                Some(chrono::DateTime::from_timestamp_nanos(nanos))
            })
            .unwrap_or_else(now);
        let identity = match self.authenticate(&message, stored_at) {
            Ok(identity) => identity,
            Err(refusal) => {
                // The job a refused submission names, so its submitter hears why.
                let about = job
                    .as_deref()
                    .and_then(|id| id.parse::<JobId>().ok())
                    .or_else(|| {
                        (action == "submit")
                            .then(|| serde_json::from_slice::<SubmitRequest>(&message.payload).ok())
                            .flatten()
                            .map(|r| r.id)
                    });
                self.refuse(action, about.as_ref(), None, refusal.key, refusal.reason);
                if let Err(err) = message.ack().await {
                    tracing::warn!(%err, "acknowledging a request");
                }
                return None;
            }
        };
        Some(Admitted {
            message,
            identity,
            action,
            job,
        })
    }

    /// Carries out an admitted request and acknowledges it once handled.
    async fn carry_out_request(&mut self, admitted: Admitted) {
        let Admitted {
            message,
            identity,
            action,
            job,
        } = admitted;
        let subject = message.subject.to_string();
        let handled = match (action, job) {
            ("submit", _) => self.on_submit(&message.payload, &identity).await,
            ("admin", _) => self.on_admin(&message.payload, &identity).await,
            ("cancel", Some(id)) => self.on_cancel(&id, &message.payload, &identity).await,
            ("hold", Some(id)) => self.on_hold(&id, &message.payload, true, &identity).await,
            ("release", Some(id)) => self.on_hold(&id, &message.payload, false, &identity).await,
            _ => {
                tracing::warn!(%subject, "ignoring a request on an unexpected subject");
                Ok(())
            }
        };
        match handled {
            Ok(()) => {
                if let Err(err) = message.ack().await {
                    tracing::warn!(%err, "acknowledging a request");
                }
            }
            // A failure to persist leaves the request unacknowledged: JetStream redelivers it.
            Err(err) => tracing::error!("handling {subject}: {err:#}"),
        }
    }
}
