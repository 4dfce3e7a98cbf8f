//! Agents' reports (`jobs.<id>.events` from a node): decoded once
//! ([`AgentReport::decode`]), then handed to the job lifecycle, which decides what the
//! report means for the job's current attempt.

use async_nats::jetstream;

use mgpu_protocol::now;
use mgpu_protocol::report::AgentReport;

use crate::lifecycle::Input;
use crate::service::Scheduler;

impl Scheduler {
    /// A message from the events stream: an agent's report is acted on, the scheduler's own
    /// events (they come back on the same subjects) and malformed ones are not. Acknowledged
    /// unless handling failed (then JetStream redelivers it after the ack wait).
    pub(crate) async fn on_event_message(&mut self, message: jetstream::Message) {
        match AgentReport::decode(message.subject.as_str(), &message.payload, now()) {
            Ok(Some(report)) => {
                let node = report.node.clone();
                if let Err(err) = self.on_agent_report(report).await {
                    tracing::error!("handling a report from {node}: {err:#}");
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

    pub(crate) async fn on_agent_report(&mut self, report: AgentReport) -> anyhow::Result<()> {
        let job = report.job.clone();
        if self.store.get(&job).is_none() {
            tracing::warn!(job = %job, node = report.node, "report about an unknown job");
            return Ok(());
        }
        self.apply_input(&job, Input::Report(report), None).await
    }
}
