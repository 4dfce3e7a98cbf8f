//! The node's inbox: the durable pull consumer `node-<node>` on `MGPU_ASSIGN`, filtered to
//! `nodes.assign.<node>` and `nodes.control.<node>`. Assignments start jobs; controls stop them.
//!
//! Messages are taken through a continuous pull ([`mgpu_nats::pull::start`]), which keeps a
//! request waiting at the server, so an assignment reaches the agent as soon as it is stored:
//! no polling anywhere on the submit → start path. Its short idle heartbeat notices within
//! seconds that the server holding that request died, and the pull is set up again. A bad message is logged, terminated (so it is not
//! redelivered forever) and never stops the loop.

use std::time::Duration;

use async_nats::jetstream::{
    self, AckKind, ErrorCode,
    consumer::{AckPolicy, PullConsumer, pull},
    context::GetStreamErrorKind,
};
use futures::StreamExt;
use mgpu_protocol::assign::{Assignment, NodeControl};
use mgpu_protocol::error::InvalidInput;
use mgpu_protocol::report::ReportKind;
use mgpu_protocol::{subjects, wire};
use tokio::task::JoinSet;
use tracing::{error, info, warn};

use crate::job::{self, JobContext};
use crate::running::{AttemptKey, AttemptStatus, StopReason, StopRequest};
use crate::shutdown::Signal;
use crate::throttle::{Throttle, Verdict};

/// Redelivery delay of an unacknowledged assignment: long enough to spawn a process and
/// publish a report, short enough that a crashed agent's work is picked up soon after restart.
const ACK_WAIT: Duration = Duration::from_secs(30);
/// Pause before retrying to set up the consumer.
const RETRY_SETUP_AFTER: Duration = Duration::from_secs(1);
/// Pauses while the streams do not exist yet (the agent started before the scheduler created
/// them): from the first, doubling up to the last. The node shows online as soon as a
/// heartbeat is stored, and a job assigned to it waits until the consumer exists, so the agent
/// looks often; a thousand agents waiting on a new cluster still make only 4 000 requests/s.
const FIRST_WAIT_FOR_STREAMS: Duration = Duration::from_millis(50);
const MAX_WAIT_FOR_STREAMS: Duration = Duration::from_millis(250);

pub struct Dispatcher {
    ctx: JobContext,
    assign_subject: String,
    control_subject: String,
    setup_failures: Throttle,
    stream_failures: Throttle,
    /// Job supervisors and failure reports; returned at shutdown so they can be awaited.
    tasks: JoinSet<()>,
}

impl Dispatcher {
    pub fn new(ctx: JobContext) -> Self {
        Dispatcher {
            assign_subject: subjects::assign(&ctx.node),
            control_subject: subjects::control(&ctx.node),
            ctx,
            setup_failures: Throttle::new(Duration::from_secs(60)),
            stream_failures: Throttle::new(Duration::from_secs(60)),
            tasks: JoinSet::new(),
        }
    }

    /// Takes assignments and controls until `shutdown` fires; returns the tasks of the jobs
    /// still running, for shutdown to wait on.
    pub async fn run(mut self, shutdown: Signal) -> JoinSet<()> {
        while let Some(consumer) = self.consumer(&shutdown).await {
            let messages = tokio::select! {
                () = shutdown.fired() => break,
                messages = mgpu_nats::pull::start(&consumer) => messages,
            };
            match messages {
                Ok(messages) => {
                    info!("taking assignments");
                    if self.consume(messages, &shutdown).await.is_break() {
                        break;
                    }
                }
                Err(err) => self.setup_failed(&format!("cannot start pulling assignments: {err}")),
            }
            tokio::select! {
                () = shutdown.fired() => break,
                () = tokio::time::sleep(RETRY_SETUP_AFTER) => {}
            }
        }
        self.tasks
    }

    /// Gets the stream and the node's durable consumer, creating the consumer if needed.
    /// Returns `None` once shutdown fires.
    async fn consumer(&mut self, shutdown: &Signal) -> Option<PullConsumer> {
        let name = subjects::node_consumer(&self.ctx.node);
        let mut said_waiting = false;
        let mut pause = RETRY_SETUP_AFTER;
        loop {
            let attempt = async {
                let stream = self.ctx.js.get_stream(subjects::ASSIGN_STREAM).await?;
                let config = pull::Config {
                    durable_name: Some(name.clone()),
                    description: Some(format!(
                        "assignments and controls of node {}",
                        self.ctx.node
                    )),
                    // One filter: the create request then names it in its subject, the
                    // only form a node is allowed (so it cannot filter another's).
                    filter_subject: subjects::node_assignment_filter(&self.ctx.node),
                    ack_policy: AckPolicy::Explicit,
                    ack_wait: ACK_WAIT,
                    ..Default::default()
                };
                let consumer = stream.get_or_create_consumer(&name, config).await?;
                Ok::<_, async_nats::Error>(consumer)
            };
            let result = tokio::select! {
                () = shutdown.fired() => return None,
                result = attempt => result,
            };
            match result {
                Ok(consumer) => {
                    if self.setup_failures.success() || said_waiting {
                        info!("the assignment stream is available");
                    }
                    self.check_filters(&consumer);
                    return Some(consumer);
                }
                Err(err) if is_stream_missing(&*err) => {
                    if !said_waiting {
                        info!(
                            "waiting for mgpu streams (start mgpu-scheduler or run `mgpu admin setup`)"
                        );
                        said_waiting = true;
                        pause = FIRST_WAIT_FOR_STREAMS;
                    } else {
                        pause = (pause * 2).min(MAX_WAIT_FOR_STREAMS);
                    }
                }
                Err(err) => {
                    pause = RETRY_SETUP_AFTER;
                    self.setup_failed(&format!(
                        "cannot set up consumer {name} on stream {}: {err}",
                        subjects::ASSIGN_STREAM
                    ))
                }
            }
            tokio::select! {
                () = shutdown.fired() => return None,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// A consumer made earlier (by an operator, or an older agent) may filter differently. It is
    /// used as it is rather than overwritten, but a missing subject means lost work, so say so.
    fn check_filters(&self, consumer: &PullConsumer) {
        let config = &consumer.cached_info().config;
        let mut filters: Vec<&str> = config.filter_subjects.iter().map(String::as_str).collect();
        if !config.filter_subject.is_empty() {
            filters.push(&config.filter_subject);
        }
        // No filter at all would take the node's subjects too (and other nodes').
        if filters.is_empty() {
            return;
        }
        for wanted in [&self.assign_subject, &self.control_subject] {
            if !filters
                .iter()
                .any(|filter| subjects::subject_matches(filter, wanted))
            {
                warn!(
                    consumer = %config.durable_name.as_deref().unwrap_or_default(),
                    ?filters,
                    "the existing consumer does not deliver {wanted}; delete it so the agent can create it as it needs"
                );
            }
        }
    }

    fn setup_failed(&mut self, message: &str) {
        if let Verdict::Log { suppressed } = self.setup_failures.failure(message) {
            warn!(suppressed, "{message}; retrying");
        }
    }

    /// Handles messages until shutdown (`Break`) or until the consumer must be set up again.
    async fn consume(
        &mut self,
        mut messages: pull::Stream,
        shutdown: &Signal,
    ) -> std::ops::ControlFlow<()> {
        use std::ops::ControlFlow;
        loop {
            tokio::select! {
                biased;
                () = shutdown.fired() => return ControlFlow::Break(()),
                Some(finished) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    if let Err(err) = finished {
                        error!("a job supervisor failed: {err}");
                    }
                }
                next = messages.next() => match next {
                    Some(Ok(message)) => {
                        if self.stream_failures.success() {
                            info!("receiving assignments again");
                        }
                        self.handle(message).await;
                    }
                    Some(Err(err)) => {
                        // No responders or missed heartbeats: the consumer has no leader yet
                        // (just created in a NATS cluster), or the server leading it died
                        // while this agent is connected to another one. Set it up again
                        // rather than wait on a pull nobody will answer.
                        let fatal = mgpu_nats::pull::must_restart(err.kind());
                        let text = format!("assignment consumer: {err}");
                        if let Verdict::Log { suppressed } = self.stream_failures.failure(&text) {
                            warn!(suppressed, "{text}");
                        }
                        if fatal {
                            return ControlFlow::Continue(());
                        }
                    }
                    None => {
                        warn!("the assignment stream ended; setting up the consumer again");
                        return ControlFlow::Continue(());
                    }
                },
            }
        }
    }

    async fn handle(&mut self, message: jetstream::Message) {
        let subject = message.subject.as_str();
        if subject == self.assign_subject {
            self.on_assignment(message).await;
        } else if subject == self.control_subject {
            self.on_control(message).await;
        } else {
            error!(subject, "message on an unexpected subject; dropping it");
            terminate(&message).await;
        }
    }

    async fn on_assignment(&mut self, message: jetstream::Message) {
        let assignment = match decode_assignment(&message.payload) {
            Ok(assignment) => assignment,
            Err(err) => {
                error!(subject = %message.subject, "malformed assignment, dropping it: {err}");
                terminate(&message).await;
                return;
            }
        };
        let key = AttemptKey {
            job_id: assignment.job_id.clone(),
            attempt: assignment.attempt,
        };
        match self.ctx.table.status(&key) {
            AttemptStatus::Unknown => {}
            status => {
                info!(job = %key.job_id, attempt = key.attempt, ?status, "assignment delivered again; it already ran here, ignoring it");
                acknowledge(&message).await;
                return;
            }
        }
        let for_this_node = assignment
            .placement
            .launched_ranks()
            .iter()
            .any(|(rank, node)| *rank == assignment.rank && *node == self.ctx.node);
        let started = if for_this_node {
            job::start(&self.ctx, &assignment).await
        } else {
            Err(format!(
                "the assignment for rank {} (nodes {}) reached node {}",
                assignment.rank,
                assignment.placement.nodes_label(),
                self.ctx.node
            ))
        };
        match started {
            Ok(job) => {
                acknowledge(&message).await;
                self.ctx.heartbeat_now.notify_one();
                self.tasks.spawn(job.supervise());
            }
            Err(reason) => {
                warn!(job = %key.job_id, attempt = key.attempt, "job failed to start: {reason}");
                // Remembered as finished so a redelivery during the report does not retry it.
                self.ctx.table.finish(&key);
                let reporter = self.ctx.reporter.clone();
                self.tasks.spawn(async move {
                    // Acknowledged only once reported: if the agent dies first, the redelivered
                    // assignment gets another chance to be reported.
                    if reporter
                        .report(&key, ReportKind::FailedToStart { error: reason })
                        .await
                    {
                        acknowledge(&message).await;
                    }
                });
            }
        }
    }

    async fn on_control(&mut self, message: jetstream::Message) {
        let control = match decode_control(&message.payload) {
            Ok(control) => control,
            Err(err) => {
                error!(subject = %message.subject, "malformed control message, dropping it: {err}");
                terminate(&message).await;
                return;
            }
        };
        match control {
            NodeControl::Kill {
                job_id,
                attempt,
                reason,
                requeue,
                warning,
            } => {
                let key = AttemptKey { job_id, attempt };
                let stop = StopRequest {
                    reason: if requeue {
                        StopReason::Requeued
                    } else {
                        StopReason::Cancelled
                    },
                    warning,
                };
                let warned = warning.map(|w| w.grace_secs);
                if self.ctx.table.request(&key, stop) {
                    info!(job = %key.job_id, attempt = key.attempt, reason, requeue, ?warned, "kill requested");
                } else {
                    info!(job = %key.job_id, attempt = key.attempt, reason, requeue, "kill requested for a job attempt not running here; nothing to do");
                }
            }
        }
        acknowledge(&message).await;
    }
}

/// Decodes and checks an assignment. A malformed or absurd one (a time limit of a century
/// would overflow the job's deadline) is refused before anything runs.
fn decode_assignment(payload: &[u8]) -> Result<Assignment, InvalidInput> {
    wire::decode::<Assignment>("assignment", payload, wire::MAX_ASSIGNMENT_BYTES)
        .and_then(|a| a.validate().map(|()| a))
}

fn decode_control(payload: &[u8]) -> Result<NodeControl, InvalidInput> {
    wire::decode::<NodeControl>("control message", payload, wire::MAX_CONTROL_BYTES)
        .and_then(|c| c.validate().map(|()| c))
}

/// True when the error says the stream `MGPU_ASSIGN` does not exist (yet).
fn is_stream_missing(err: &(dyn std::error::Error + 'static)) -> bool {
    let Some(err) = err.downcast_ref::<jetstream::context::GetStreamError>() else {
        return false;
    };
    matches!(
        err.kind(),
        GetStreamErrorKind::JetStream(inner) if inner.error_code() == ErrorCode::STREAM_NOT_FOUND
    )
}

async fn acknowledge(message: &jetstream::Message) {
    if let Err(err) = message.ack().await {
        warn!(subject = %message.subject, "cannot acknowledge a message (it will come again): {err}");
    }
}

/// Tells JetStream never to deliver this message again.
async fn terminate(message: &jetstream::Message) {
    if let Err(err) = message.ack_with(AckKind::Term).await {
        warn!(subject = %message.subject, "cannot terminate a bad message (it will come again): {err}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_nats::jetstream::context::GetStreamError;

    fn server_error(json: &str) -> async_nats::Error {
        let Ok(error) = serde_json::from_str::<jetstream::Error>(json) else {
            panic!("bad test JSON: {json}");
        };
        Box::new(GetStreamError::new(GetStreamErrorKind::JetStream(error)))
    }

    #[test]
    fn only_stream_not_found_means_waiting_for_setup() {
        let missing =
            server_error(r#"{"code":404,"err_code":10059,"description":"stream not found"}"#);
        assert!(is_stream_missing(&*missing));
        let other = server_error(r#"{"code":503,"err_code":10008,"description":"unavailable"}"#);
        assert!(!is_stream_missing(&*other));
        let request: async_nats::Error = Box::new(GetStreamError::new(GetStreamErrorKind::Request));
        assert!(!is_stream_missing(&*request));
    }

    /// Fuzz targets: what the agent reads from its inbox. Anything must give a clean error
    /// or a value whose script and environment can be built without a panic.
    mod fuzz {
        use std::collections::BTreeMap;

        use mgpu_protocol::fuzzing::payloads;
        use mgpu_protocol::gpu_amount::GpuAmount;
        use mgpu_protocol::ids::JobId;
        use mgpu_protocol::job::{GpuShare, JobSpec, Placement};
        use proptest::prelude::*;

        use super::super::*;
        use crate::environment::job_environment;
        use crate::running::AttemptKey;
        use crate::script::build_script;

        fn assignment() -> serde_json::Value {
            let mut spec = JobSpec::new(vec!["python".into(), "a.py".into()], "/tmp");
            spec.time_limit_secs = Some(60);
            spec.env = BTreeMap::from([("PATH".into(), "/usr/bin".into())]);
            spec.env_setup_cmd = Some("true".into());
            let placement = Placement::single(
                "node001",
                vec![GpuShare {
                    index: 0,
                    amount: GpuAmount::ONE,
                    mem_mib: 0,
                }],
            );
            serde_json::to_value(Assignment {
                job_id: JobId::random(),
                attempt: 1,
                user: "alice".into(),
                spec,
                placement,
                rank: 0,
                input_keys: Vec::new(),
                unix_user: None,
                output_subject: None,
                previous_stop: None,
                idle_below_pct: None,
            })
            .unwrap_or_default()
        }

        proptest! {
            #[test]
            fn fuzz_assignment(payload in payloads(assignment())) {
                if let Ok(a) = decode_assignment(&payload) {
                    prop_assert!(a.validate().is_ok());
                    let gpus: Vec<u32> = a
                        .placement
                        .gpus_on("node001")
                        .unwrap_or_default()
                        .iter()
                        .map(|g| g.index)
                        .collect();
                    let key = AttemptKey { job_id: a.job_id.clone(), attempt: a.attempt };
                    let _ = build_script(&a.spec, &gpus);
                    let stop_file = std::path::Path::new("/tmp/stop");
                    let _ = job_environment(&a.spec, &key, "node001", &gpus, stop_file, None);
                    // The deadline the supervisor computes must not overflow.
                    let limit = a.spec.time_limit().unwrap_or_default();
                    prop_assert!(tokio::time::Instant::now().checked_add(limit).is_some());
                }
            }

            #[test]
            fn fuzz_control(payload in payloads(serde_json::to_value(NodeControl::Kill {
                job_id: JobId::random(),
                attempt: 2,
                reason: "cancelled by alice".into(),
                requeue: false,
                warning: None,
            }).unwrap_or_default())) {
                if let Ok(control) = decode_control(&payload) {
                    prop_assert!(control.validate().is_ok());
                }
            }

            #[test]
            fn fuzz_job_input(payload in prop::collection::vec(any::<u8>(), 0..4096)) {
                match crate::input::classify(&payload) {
                    crate::input::Input::EndOfInput => prop_assert!(payload.is_empty()),
                    crate::input::Input::Bytes(bytes) => prop_assert_eq!(bytes, &payload[..]),
                }
            }
        }
    }
}
