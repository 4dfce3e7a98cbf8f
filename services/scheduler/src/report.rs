//! Agents' reports (`jobs.<id>.events` from a node): decoded once
//! ([`AgentReport::decode`]), then handed to the job lifecycle, which decides what the
//! report means for the job's current attempt.

use async_nats::jetstream;

use mgpu_nats::signing;
use mgpu_protocol::report::AgentReport;
use mgpu_protocol::request::Action;
use mgpu_protocol::{now, version};

use crate::lifecycle::Input;
use crate::outbox::Sender;
use crate::service::Scheduler;

/// How long an event of an unreadable protocol waits before it is offered again.
const UNREADABLE_RETRY: std::time::Duration = std::time::Duration::from_secs(30);

impl Scheduler {
    /// A message from the events stream: an agent's report is acted on, the scheduler's own
    /// events (they come back on the same subjects) and malformed ones are not. Acknowledged
    /// unless handling failed (then JetStream redelivers it after the ack wait).
    pub(crate) async fn on_event_message(&mut self, message: jetstream::Message) {
        // The version first: a report this scheduler cannot read is left for a scheduler that
        // can (the upgraded one, if the agents were upgraded first), not decoded wrongly.
        let protocol = version::of_header(
            message
                .headers
                .as_ref()
                .and_then(|h| h.get(version::HEADER))
                .map(|v| v.as_str()),
        );
        if let Some(why) = version::incompatibility("a job event's sender", protocol) {
            tracing::warn!(subject = %message.subject, "job event left unread: {why}");
            let later = jetstream::AckKind::Nak(Some(UNREADABLE_RETRY));
            if let Err(err) = message.ack_with(later).await {
                tracing::warn!(%err, "returning an unreadable job event");
            }
            return;
        }
        match AgentReport::decode(message.subject.as_str(), &message.payload, now()) {
            Ok(Some(report)) => {
                if let Err((signer, why)) = self.check_reporter(&message, &report) {
                    tracing::warn!(job = %report.job, node = report.node, "report refused: {why}");
                    let sender = Sender::Unknown { key: signer };
                    let target = Some(report.job.to_string());
                    self.outbox.audit(Action::Report, &sender, target, Err(why));
                    if let Err(err) = message.ack().await {
                        tracing::warn!(%err, "acknowledging a job event");
                    }
                    return;
                }
                let node = report.node.clone();
                if let Err(err) = self.on_agent_report(report).await {
                    tracing::error!(node = %node, "handling a report from {node}: {err:#}");
                    return;
                }
            }
            Ok(None) => {}
            Err(err) => {
                tracing::warn!(subject = %message.subject, %err, "ignoring a malformed job event")
            }
        }
        if let Err(err) = message.ack().await {
            tracing::warn!(%err, "acknowledging a job event");
        }
    }

    /// Whether the report is signed by the node it names (or an admin): any node may publish
    /// on `jobs.<id>.events`, so what the payload says of its sender proves nothing. The error
    /// is the signer's key (when there is one) and why the report is refused.
    fn check_reporter(
        &mut self,
        message: &jetstream::Message,
        report: &AgentReport,
    ) -> Result<(), (Option<String>, String)> {
        // When JetStream stored it: the signature must be that recent.
        let stored_at = message
            .info()
            .ok()
            .and_then(|info| {
                let nanos = i64::try_from(info.published.unix_timestamp_nanos()).ok()?;
                Some(chrono::DateTime::from_timestamp_nanos(nanos))
            })
            .unwrap_or_else(now);
        let signed = signing::verify(
            message.headers.as_ref(),
            message.subject.as_str(),
            &message.payload,
            stored_at,
        )
        .map_err(|err| {
            (
                None,
                format!("a report said to be from {}: {err}", report.node),
            )
        })?;
        let signer = signed.signer;
        let node = self.gate.principals.node_by_key(&signer);
        if node.as_ref().is_some_and(|node| node.name == report.node) {
            return Ok(());
        }
        // Admins may speak for any node, as they may cancel any job (the scale benchmark's
        // simulated fleet reports as an admin).
        if self
            .gate
            .principals
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

    pub(crate) async fn on_agent_report(&mut self, report: AgentReport) -> anyhow::Result<()> {
        let job = report.job.clone();
        if self.store.get(&job).is_none() {
            tracing::warn!(job = %job, node = report.node, "report about an unknown job");
            return Ok(());
        }
        self.apply_input(&job, Input::Report(report), None).await
    }
}
