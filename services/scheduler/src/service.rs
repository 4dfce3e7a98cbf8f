//! The scheduler service: the event loop that turns messages into table updates (requests
//! through [`crate::intake`]) and runs a pass after every change: the core's view built
//! ([`crate::queue_view`]), `core::plan`, its decisions carried out ([`crate::decisions`]).
//!
//! Everything is event-driven: a submission, an agent's report or a node's heartbeat wakes
//! the loop; nothing polls. Messages that arrive together are handled as one batch followed
//! by one scheduling pass, so a burst of 1 000 submissions costs a handful of passes.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use async_nats::jetstream::{self, consumer, kv};
use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use tokio::sync::watch;

use mgpu_nats::pull::Pull;
use mgpu_nats::records;
use mgpu_protocol::event::{EventSource, JobEvent};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::JobSpec;
use mgpu_protocol::node::NodeHeartbeat;
use mgpu_protocol::priority::{Policy, UsageBook};
use mgpu_protocol::{Timestamp, now, subjects, wire};

use crate::core::{self, CoreSettings, QueuedJob, RunningJob};
use crate::nodes::NodeTable;
use crate::queue_view::QueueView;
use crate::state::JobStore;
use crate::status::{PassSample, RECENT_PASSES, Status};

/// Messages handled before a scheduling pass, at most, when a burst arrives.
const BATCH: usize = 512;

/// Changed records after which freed memory is handed back (see
/// [`Scheduler::give_back_memory_after_bursts`]), and the least time between two such.
const TRIM_AFTER_CHANGES: usize = 10_000;
const TRIM_EVERY: Duration = Duration::from_secs(10);

/// The least time between two writes of the usage book. Every pass that saw a job end wrote
/// it, a round trip inside the pass; in a burst of short jobs that is most passes. A scheduler
/// killed between two writes loses at most this much of its users' accounted GPU time (a
/// stopped one stores it before it exits).
const USAGE_SAVE_EVERY: Duration = Duration::from_secs(1);

pub struct Scheduler {
    pub(crate) js: jetstream::Context,
    /// Where job events and audit records go out, off the hot path.
    pub(crate) background: crate::outbox::BackgroundPublisher,
    pub(crate) store: JobStore,
    pub(crate) nodes: NodeTable,
    /// Node administration, policy and usage (`mgpu-cluster` bucket).
    pub(crate) cluster: kv::Store,
    pub(crate) policy: Policy,
    pub(crate) usage: UsageBook,
    pub(crate) usage_dirty: bool,
    /// When the usage book was last stored (see [`USAGE_SAVE_EVERY`]).
    pub(crate) usage_saved_at: Option<tokio::time::Instant>,
    pub(crate) status: watch::Sender<Status>,
    pub(crate) passes: u64,
    /// When the next time slice of a running job ends (the loop wakes up then).
    pub(crate) next_slice_end: Option<Timestamp>,
    /// The earliest moment a job held for fencing may start.
    pub(crate) next_release: Option<Timestamp>,
    /// Stale attempts we told a node to kill, and when (so heartbeats do not repeat it).
    pub(crate) kills_sent: HashMap<(JobId, u32), std::time::Instant>,
    /// How many `kills_sent` kept at its last pruning.
    pub(crate) kills_kept: usize,
    /// When a cancel's or preemption's kill was last repeated, by attempt.
    pub(crate) stops_sent: HashMap<(JobId, u32), std::time::Instant>,
    /// When liveness was last checked (a long gap means this loop stalled).
    pub(crate) last_liveness_check: Option<std::time::Instant>,
    /// When possibly lost assignments and kills were last sent again.
    pub(crate) last_repair: Option<std::time::Instant>,
    /// The durable consumer of agents' reports, asked whether every stored report was handled.
    pub(crate) events_consumer: Option<consumer::PullConsumer>,
    /// Who may sign requests.
    pub(crate) principals: crate::identity::Principals,
    /// Request nonces seen lately, to refuse replays.
    pub(crate) nonces: mgpu_nats::signing::Nonces,
    /// The core's view of each queued job, with the record revision it was built from:
    /// kept between passes so a pass over 100 000 waiting jobs does not copy each request.
    pub(crate) queue_views: Vec<QueueView>,
    /// Where each queued job's view is in `queue_views`.
    pub(crate) queue_slots: HashMap<JobId, usize>,
    /// The running jobs as the core sees them, kept between passes like `queue_views`.
    pub(crate) running_views: HashMap<JobId, RunningJob>,
    /// Records changed since memory was last given back, and when that was.
    pub(crate) churn: usize,
    pub(crate) last_trim: Option<std::time::Instant>,
    /// The latest passes' sizes and durations (for `mgpu.scheduler.status`).
    pub(crate) recent_passes: std::collections::VecDeque<PassSample>,
}

/// Runs the scheduler until `shutdown` turns true.
/// Runs the active scheduler until `shutdown` turns true or the lease is lost. The streams
/// must exist (`streams::ensure`).
pub async fn run(
    client: async_nats::Client,
    policy: Policy,
    principals: crate::identity::Principals,
    mut shutdown: watch::Receiver<bool>,
    mut lease_lost: watch::Receiver<bool>,
) -> Result<()> {
    let js = jetstream::new(client.clone());

    let store = JobStore::load(&js).await.context("loading job records")?;
    let nodes = NodeTable::new(
        records::list_nodes(&js)
            .await
            .context("loading node heartbeats")?,
        records::node_admin(&js)
            .await
            .context("loading node administration")?,
        policy.missed_heartbeats,
    );
    // Heartbeats stored while no scheduler was active (or this one was still loading) were
    // not seen: every node gets a full allowance from now before it counts as silent.
    let mut nodes = nodes;
    nodes.blind_until(now());
    let usage = records::usage(&js).await.context("loading usage")?;
    let cluster = records::cluster_bucket(&js).await?;
    // Publish the policy in force, so `mgpu queue` computes the same priorities.
    cluster
        .put(subjects::POLICY_KEY, serde_json::to_vec(&policy)?.into())
        .await
        .map_err(|e| anyhow!("storing the policy: {e}"))?;
    let (status_tx, status_rx) = watch::channel(Status::default());
    let mut scheduler = Scheduler {
        js: js.clone(),
        background: crate::outbox::BackgroundPublisher::start(js.clone()),
        store,
        nodes,
        cluster,
        policy,
        usage,
        usage_dirty: false,
        usage_saved_at: None,
        status: status_tx,
        passes: 0,
        next_slice_end: None,
        next_release: None,
        kills_sent: HashMap::new(),
        kills_kept: 0,
        stops_sent: HashMap::new(),
        last_liveness_check: None,
        last_repair: None,
        events_consumer: None,
        principals,
        nonces: mgpu_nats::signing::Nonces::default(),
        queue_views: Vec::new(),
        queue_slots: HashMap::new(),
        running_views: HashMap::new(),
        churn: 0,
        last_trim: None,
        recent_passes: std::collections::VecDeque::with_capacity(RECENT_PASSES),
    };
    tracing::info!(
        jobs = scheduler.store.total(),
        nodes = scheduler.nodes.len(),
        "state loaded"
    );

    let service_client = client.clone();
    tokio::spawn(async move {
        if let Err(err) = crate::status::serve(service_client, status_rx).await {
            tracing::error!("micro service stopped: {err:#}");
        }
    });

    let mut heartbeats = client
        .subscribe(subjects::ALL_HEARTBEATS)
        .await
        .map_err(|e| anyhow!("subscribing to heartbeats: {e}"))?;
    let events_consumer = durable_consumer(
        &js,
        subjects::EVENTS_STREAM,
        subjects::SCHEDULER_EVENTS_CONSUMER,
    )
    .await?;
    scheduler.events_consumer = Some(events_consumer.clone());
    let backlog = events_consumer
        .clone()
        .info()
        .await
        .map_err(|e| anyhow!("reading the events consumer: {e}"))?
        .num_pending;
    let mut events = Pull::new(events_consumer.clone(), "job events")
        .await
        .map_err(|e| anyhow!("consuming job events: {e}"))?;
    // Agents' reports written while we were down come first: only then do we know which
    // assignments never reached their node.
    for _ in 0..backlog {
        match tokio::time::timeout(Duration::from_secs(5), events.next()).await {
            Ok(message) => scheduler.on_event_message(message).await,
            Err(_) => break,
        }
    }
    scheduler.resend_unconfirmed_assignments().await;

    let requests_consumer = durable_consumer(
        &js,
        subjects::REQUESTS_STREAM,
        subjects::SCHEDULER_REQUESTS_CONSUMER,
    )
    .await?;
    let mut requests = Pull::new(requests_consumer, "requests")
        .await
        .map_err(|e| anyhow!("consuming requests: {e}"))?;

    scheduler.check_liveness().await;
    scheduler.pass().await;
    tracing::info!("scheduler ready");
    // Nodes that stop heartbeating are noticed on this timer (nothing else would wake us).
    let mut liveness = tokio::time::interval(Duration::from_secs(1));
    liveness.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let slice_timer = scheduler.next_slice_end.map(|end| {
            let wait = (end - now()).to_std().unwrap_or(Duration::ZERO);
            tokio::time::Instant::now() + wait + Duration::from_millis(5)
        });
        tokio::select! {
            _ = shutdown.changed() => {
                scheduler.save_usage(true).await;
                break;
            }
            // Not stored after losing the lease: the replica that took it keeps the book now.
            _ = lease_lost.changed() => {
                tracing::error!("lost the scheduler lease: no longer active");
                break;
            }
            _ = liveness.tick() => {
                // Heartbeats that arrived while a long pass ran count before any node is
                // judged silent.
                let mut changed = false;
                while let Some(Some(message)) = heartbeats.next().now_or_never() {
                    changed |= scheduler.on_heartbeat(&message.subject, &message.payload).await;
                }
                // A change no pass stored since (they come too often for that) is stored here.
                scheduler.save_usage(false).await;
                if !scheduler.check_liveness().await && !changed {
                    continue;
                }
            }
            // A running job's time slice ends: the pass decides whether to preempt it.
            _ = tokio::time::sleep_until(slice_timer.unwrap_or_else(far_future)), if slice_timer.is_some() => {}
            message = requests.next() => {
                let mut batch = vec![message];
                for _ in 0..BATCH {
                    match requests.next().now_or_never() {
                        Some(message) => batch.push(message),
                        None => break,
                    }
                }
                scheduler.on_requests(batch).await;
            }
            message = events.next() => {
                scheduler.on_event_message(message).await;
                for _ in 0..BATCH {
                    match events.next().now_or_never() {
                        Some(message) => scheduler.on_event_message(message).await,
                        None => break,
                    }
                }
            }
            Some(message) = heartbeats.next() => {
                let mut changed = scheduler.on_heartbeat(&message.subject, &message.payload).await;
                while let Some(Some(message)) = heartbeats.next().now_or_never() {
                    changed |= scheduler.on_heartbeat(&message.subject, &message.payload).await;
                }
                if !changed {
                    continue;
                }
            }
        }
        scheduler.pass().await;
    }
    // Whoever acts next (this replica again, or a standby) gets what was pulled and not
    // handled at once, not after the acknowledgement wait.
    let given_back = events.give_back().await + requests.give_back().await;
    if given_back > 0 {
        tracing::info!(given_back, "handed back reports and requests not handled");
    }
    tracing::info!("scheduler stopping");
    Ok(())
}

fn micros(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX)
}

fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(86_400)
}

async fn durable_consumer(
    js: &jetstream::Context,
    stream: &str,
    name: &str,
) -> Result<consumer::PullConsumer> {
    let stream = js
        .get_stream(stream)
        .await
        .map_err(|e| anyhow!("opening stream {stream}: {e}"))?;
    stream
        .get_or_create_consumer(
            name,
            consumer::pull::Config {
                durable_name: Some(name.to_owned()),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                max_ack_pending: 10_000,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| anyhow!("opening consumer {name}: {e}"))
}

impl Scheduler {
    async fn on_event_message(&mut self, message: jetstream::Message) {
        let now = now();
        // Only agents' reports are acted on, so only they must pass validation; the
        // scheduler's own events come back here too and are ignored.
        let decoded =
            wire::decode::<JobEvent>("job event", &message.payload, wire::MAX_EVENT_BYTES)
                .and_then(|event| match event.source {
                    EventSource::Node(_) => event.validate(now).map(|()| event),
                    EventSource::Scheduler => Ok(event),
                });
        match decoded {
            Ok(event) => {
                let subject_id = subjects::job_id_of(message.subject.as_str());
                if subject_id != Some(event.job_id.as_str()) {
                    tracing::warn!(subject = %message.subject, "event names another job than its subject; ignored");
                } else if let EventSource::Node(node) = &event.source {
                    let node = node.clone();
                    if let Err(err) = self.on_agent_report(&node, event).await {
                        // Unacknowledged: JetStream redelivers it after the ack wait.
                        tracing::error!("handling a report from {node}: {err:#}");
                        return;
                    }
                }
            }
            Err(err) => {
                tracing::warn!(subject = %message.subject, %err, "ignoring a malformed job event")
            }
        }
        if let Err(err) = message.ack().await {
            tracing::warn!(%err, "acknowledging a job event");
        }
    }

    async fn on_heartbeat(&mut self, subject: &str, payload: &Bytes) -> bool {
        let now = now();
        let decoded =
            wire::decode::<NodeHeartbeat>("heartbeat", payload, wire::MAX_HEARTBEAT_BYTES)
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
            Ok(beat) => {
                self.reconcile_heartbeat(&beat).await;
                self.nodes.update(beat, now)
            }
            Err(err) => {
                tracing::warn!(%err, "ignoring a malformed heartbeat");
                false
            }
        }
    }

    /// Stores the usage book if it changed: at once when `now_anyway` (shutting down) or when
    /// the last write is [`USAGE_SAVE_EVERY`] old, else at a later pass or liveness tick.
    pub(crate) async fn save_usage(&mut self, now_anyway: bool) {
        if !self.usage_dirty
            || (!now_anyway
                && self
                    .usage_saved_at
                    .is_some_and(|at| at.elapsed() < USAGE_SAVE_EVERY))
        {
            return;
        }
        match serde_json::to_vec(&self.usage) {
            Ok(bytes) => match self.cluster.put(subjects::USAGE_KEY, bytes.into()).await {
                Ok(_) => {
                    self.usage_dirty = false;
                    self.usage_saved_at = Some(tokio::time::Instant::now());
                }
                Err(err) => tracing::warn!(%err, "storing usage"),
            },
            Err(err) => tracing::warn!(%err, "encoding usage"),
        }
    }

    /// One scheduling pass: ask the core, then carry out what it decided.
    pub(crate) async fn pass(&mut self) {
        let began = std::time::Instant::now();
        let now = now();
        self.refresh_queue_views(now);
        let queue: Vec<&QueuedJob> = self.queue_views.iter().map(|c| &c.view).collect();
        let running: Vec<&RunningJob> = self.running_views.values().collect();
        // Only slices still to come arm the timer: one already over is acted on by the next
        // pass that finds someone waiting (a submission or an exit wakes the loop anyway).
        self.next_slice_end = running
            .iter()
            .filter_map(|r| r.slice_end)
            .filter(|end| *end > now)
            .min();
        // Jobs held until a lost node surely stopped them: the liveness timer wakes us then.
        self.next_release = queue
            .iter()
            .filter_map(|q| q.not_before)
            .filter(|t| *t > now)
            .min();
        let mut sample = PassSample {
            queued: queue.len(),
            running: running.len(),
            view_us: micros(began.elapsed()),
            ..PassSample::default()
        };
        if !queue.is_empty() {
            let settings = CoreSettings {
                placement: self.policy.placement,
                max_reservations: self.policy.max_reservations,
                topology_label: Some(self.policy.topology_label.clone())
                    .filter(|label| !label.is_empty()),
            };
            let nodes = self.nodes.views(now);
            sample.view_us = micros(began.elapsed());
            let decisions = core::plan(&nodes, &running, &queue, &settings, now);
            sample.plan_us = micros(began.elapsed()) - sample.view_us;
            drop(queue);
            sample.changes = self.carry_out_all(decisions, now).await;
        }
        self.save_usage(false).await;
        self.passes += 1;
        sample.total_us = micros(began.elapsed());
        if self.recent_passes.len() >= RECENT_PASSES {
            self.recent_passes.pop_front();
        }
        self.recent_passes.push_back(sample);
        self.publish_status(now);
        self.give_back_memory_after_bursts();
    }

    /// The time limit a job runs under: its own, capped by the cluster's `max_job_time`.
    pub(crate) fn effective_time_limit(&self, spec: &JobSpec) -> Option<Duration> {
        let cluster = self.policy.max_job_time_secs.map(Duration::from_secs);
        match (spec.time_limit(), cluster) {
            (Some(own), Some(max)) => Some(own.min(max)),
            (own, max) => own.or(max),
        }
    }

    /// After a burst (thousands of records changed: a flood of submissions, a cluster's worth
    /// of starts), hands the heap memory freed since back to the operating system, at most
    /// every [`TRIM_EVERY`]. glibc keeps freed memory in its arenas otherwise: after 100 000
    /// submissions the scheduler held about 130 MiB more than its live data.
    fn give_back_memory_after_bursts(&mut self) {
        if self.churn < TRIM_AFTER_CHANGES
            || self.last_trim.is_some_and(|at| at.elapsed() < TRIM_EVERY)
        {
            return;
        }
        self.churn = 0;
        self.last_trim = Some(std::time::Instant::now());
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim only releases free memory of the allocator's own arenas; it
        // reads no pointer of ours and is thread-safe.
        unsafe {
            libc::malloc_trim(0);
        }
    }

    fn publish_status(&self, now: Timestamp) {
        let mut status = Status {
            passes: self.passes,
            nodes_known: self.nodes.len(),
            nodes_online: self.nodes.online(now),
            recent_passes: self.recent_passes.clone(),
            ..Status::default()
        };
        (status.jobs_queued, status.jobs_running) = self.store.counts();
        status.jobs_total = self.store.total();
        self.status.send_replace(status);
    }
}
