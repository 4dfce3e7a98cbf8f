//! Publishing what must not be lost: the agent's reports about its jobs' processes
//! (`mgpu_protocol::report`: started, could not start, exited) and the EOF message that ends a
//! job's output. The scheduler learns of starts and exits only through
//! these, so each is retried with backoff until JetStream acknowledges it, or until the agent
//! gives up at the end of a bounded shutdown.
//!
//! Each report carries a `Nats-Msg-Id` naming the attempt, the node and what happened, so a retry after
//! a lost acknowledgement is stored once.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, message::PublishMessage};
use bytes::Bytes;
use mgpu_nats::signing;
use mgpu_protocol::report::{AgentReport, ReportKind};
use mgpu_protocol::{subjects, version};
use tracing::{error, info, warn};

use crate::running::AttemptKey;
use crate::shutdown::Signal;

const FIRST_RETRY_DELAY: Duration = Duration::from_millis(100);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct Reporter {
    js: jetstream::Context,
    node: String,
    /// Fired when shutdown stops waiting for reports; retries end then.
    give_up: Signal,
    /// The node's key: every report is signed, and the scheduler takes a report only from the
    /// node it names (any node may publish on `jobs.<id>.events`).
    signer: Arc<nkeys::KeyPair>,
}

impl Reporter {
    pub fn new(
        js: jetstream::Context,
        node: String,
        give_up: Signal,
        signer: Arc<nkeys::KeyPair>,
    ) -> Self {
        Reporter {
            js,
            node,
            give_up,
            signer,
        }
    }

    /// Publishes a report about an attempt until it is stored. False only when the agent gave
    /// up on it.
    pub async fn report(&self, key: &AttemptKey, kind: ReportKind) -> bool {
        let what = report_name(&kind);
        let event = AgentReport {
            job: key.job_id.clone(),
            attempt: key.attempt,
            node: self.node.clone(),
            at: mgpu_protocol::now(),
            kind,
        }
        .into_event();
        let payload = match serde_json::to_vec(&event) {
            Ok(payload) => Bytes::from(payload),
            Err(err) => {
                // Serialising these plain structs cannot fail; if it ever does, say so loudly.
                error!(job = %key.job_id, attempt = key.attempt, "cannot encode the {what} event: {err}");
                return false;
            }
        };
        let subject = subjects::events(&key.job_id);
        let mut headers = async_nats::HeaderMap::new();
        if let Err(err) = signing::sign(
            &self.signer,
            &subject,
            &payload,
            mgpu_protocol::now(),
            &mut headers,
        ) {
            error!(%key, "cannot sign the {what} report: {err}");
            return false;
        }
        headers.insert(version::HEADER, version::BASELINE.to_string().as_str());
        let message = PublishMessage::build()
            .payload(payload)
            .headers(headers)
            // The node is part of it: each rank of a distributed job reports on its own.
            .message_id(format!(
                "{}-{}-{}-{what}",
                key.job_id, key.attempt, self.node
            ));
        self.publish_until_stored(subject, message, key, what).await
    }

    /// Publishes `message` on `subject` until JetStream stores it. `what` names it in logs.
    pub async fn publish_until_stored(
        &self,
        subject: String,
        message: PublishMessage,
        key: &AttemptKey,
        what: &str,
    ) -> bool {
        let mut delay = FIRST_RETRY_DELAY;
        let mut failures: u32 = 0;
        loop {
            let attempt = async {
                self.js
                    .send_publish(subject.clone(), message.clone())
                    .await?
                    .await
            };
            let result = tokio::select! {
                result = attempt => result,
                () = self.give_up.fired() => {
                    error!(job = %key.job_id, attempt = key.attempt, "gave up publishing the {what} report on {subject}: the agent is stopping");
                    return false;
                }
            };
            match result {
                Ok(_) => {
                    if failures > 0 {
                        info!(job = %key.job_id, attempt = key.attempt, "published the {what} report after {failures} failed tries");
                    }
                    return true;
                }
                Err(err) => {
                    failures += 1;
                    // The first failure and then every tenth: an outage retries every 5 s.
                    if failures == 1 || failures.is_multiple_of(10) {
                        warn!(job = %key.job_id, attempt = key.attempt, "cannot publish the {what} report on {subject} (try {failures}): {err}; retrying");
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = self.give_up.fired() => {
                    error!(job = %key.job_id, attempt = key.attempt, "gave up publishing the {what} report on {subject}: the agent is stopping");
                    return false;
                }
            }
            delay = (delay * 2).min(MAX_RETRY_DELAY);
        }
    }
}

/// The report's event name as it appears in the JSON (`started`, `exited`…), for ids and logs.
fn report_name(kind: &ReportKind) -> &'static str {
    match kind {
        ReportKind::Started { .. } => "started",
        ReportKind::FailedToStart { .. } => "failed_to_start",
        ReportKind::Exited(_) => "exited",
    }
}
