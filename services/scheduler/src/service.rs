//! The scheduler service: turns messages into table updates, runs the core after every
//! change, and turns the core's decisions into KV writes and assignments.
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

use mgpu_shared::assign::NodeControl;
use mgpu_shared::event::{EventSource, JobEvent, JobEventKind};
use mgpu_shared::ids::JobId;
use mgpu_shared::job::{
    Ending, JobRecord, JobSpec, JobState, Launch, OnTimeout, Placement, Run, SubmitRequest,
    WaitReason, Waiting,
};
use mgpu_shared::node::NodeHeartbeat;
use mgpu_shared::priority::{Policy, UsageBook, effective_priority, effective_priority_after};
use mgpu_shared::{Timestamp, now, records, subjects, wire};

use crate::core::{self, CoreSettings, Decision, Dependencies, QueuedJob, RunningJob};
use crate::nodes::NodeTable;
use crate::outbox::master_port;
use crate::state::JobStore;
use crate::status::{PassSample, RECENT_PASSES, Status};

/// Messages handled before a scheduling pass, at most, when a burst arrives.
const BATCH: usize = 512;

/// Changed records after which freed memory is handed back (see
/// [`Scheduler::give_back_memory_after_bursts`]), and the least time between two such.
const TRIM_AFTER_CHANGES: usize = 10_000;
const TRIM_EVERY: Duration = Duration::from_secs(10);

/// Assignments awaiting JetStream's acknowledgement at once when a pass starts many jobs.
const ASSIGNMENTS_IN_FLIGHT: usize = 256;

pub struct Scheduler {
    pub(crate) js: jetstream::Context,
    pub(crate) store: JobStore,
    pub(crate) nodes: NodeTable,
    /// Node administration, policy and usage (`mgpu-cluster` bucket).
    pub(crate) cluster: kv::Store,
    pub(crate) policy: Policy,
    pub(crate) usage: UsageBook,
    usage_dirty: bool,
    status: watch::Sender<Status>,
    passes: u64,
    /// When the next time slice of a running job ends (the loop wakes up then).
    next_slice_end: Option<Timestamp>,
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
    pub(crate) nonces: mgpu_shared::signing::Nonces,
    /// The core's view of each queued job, with the record revision it was built from:
    /// kept between passes so a pass over 100 000 waiting jobs does not copy each request.
    queue_views: Vec<QueueView>,
    /// Where each queued job's view is in `queue_views`.
    queue_slots: HashMap<JobId, usize>,
    /// Records changed since memory was last given back, and when that was.
    churn: usize,
    last_trim: Option<std::time::Instant>,
    /// The latest passes' sizes and durations (for `mgpu.scheduler.status`).
    recent_passes: std::collections::VecDeque<PassSample>,
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
        store,
        nodes,
        cluster,
        policy,
        usage,
        usage_dirty: false,
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
        nonces: mgpu_shared::signing::Nonces::default(),
        queue_views: Vec::new(),
        queue_slots: HashMap::new(),
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
    let mut events = events_consumer
        .messages()
        .await
        .map_err(|e| anyhow!("consuming job events: {e}"))?;
    // Agents' reports written while we were down come first: only then do we know which
    // assignments never reached their node.
    for _ in 0..backlog {
        match tokio::time::timeout(Duration::from_secs(5), events.next()).await {
            Ok(Some(Ok(message))) => scheduler.on_event_message(message).await,
            Ok(Some(Err(err))) => tracing::warn!(%err, "reading a job event"),
            Ok(None) | Err(_) => break,
        }
    }
    scheduler.resend_unconfirmed_assignments().await;

    let mut requests = durable_consumer(
        &js,
        subjects::REQUESTS_STREAM,
        subjects::SCHEDULER_REQUESTS_CONSUMER,
    )
    .await?
    .messages()
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
            _ = shutdown.changed() => break,
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
                if !scheduler.check_liveness().await && !changed {
                    continue;
                }
            }
            // A running job's time slice ends: the pass decides whether to preempt it.
            _ = tokio::time::sleep_until(slice_timer.unwrap_or_else(far_future)), if slice_timer.is_some() => {}
            Some(message) = requests.next() => {
                let mut batch = vec![message];
                for _ in 0..BATCH {
                    match requests.next().now_or_never() {
                        Some(Some(message)) => batch.push(message),
                        _ => break,
                    }
                }
                scheduler.on_requests(batch).await;
            }
            Some(message) = events.next() => {
                match message {
                    Ok(message) => scheduler.on_event_message(message).await,
                    Err(err) => tracing::warn!(%err, "reading a job event"),
                }
                for _ in 0..BATCH {
                    match events.next().now_or_never() {
                        Some(Some(Ok(message))) => scheduler.on_event_message(message).await,
                        Some(Some(Err(err))) => tracing::warn!(%err, "reading a job event"),
                        _ => break,
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

/// A request read from the requests stream.
type RequestMessage =
    Result<jetstream::Message, async_nats::error::Error<consumer::pull::MessagesErrorKind>>;

/// A request whose signature checked out, ready to be carried out.
struct Admitted {
    message: jetstream::Message,
    identity: crate::identity::Identity,
    action: &'static str,
    job: Option<String>,
}

/// A queued job's view for the core, kept between passes, with what refreshing it needs.
struct QueueView {
    /// The job's own priority and owner, from which its effective priority is recomputed.
    priority: i32,
    /// When it joined the queue, in whole seconds since the epoch.
    queued_secs: i64,
    user: String,
    has_dependencies: bool,
    view: QueuedJob,
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
    async fn on_requests(&mut self, batch: Vec<RequestMessage>) {
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
        let message = match message {
            Ok(message) => message,
            Err(err) => {
                tracing::warn!(%err, "reading a request");
                return None;
            }
        };
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

    /// One scheduling pass: ask the core, then carry out what it decided.
    pub(crate) async fn pass(&mut self) {
        let began = std::time::Instant::now();
        let now = now();
        self.refresh_queue_views(now);
        let queue: Vec<&QueuedJob> = self.queue_views.iter().map(|c| &c.view).collect();
        let running: Vec<RunningJob> = self
            .store
            .running()
            .filter_map(|r| match &r.state {
                JobState::Running(run) => Some(self.running_job(r, run)),
                _ => None,
            })
            .collect();
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
        if self.usage_dirty {
            match serde_json::to_vec(&self.usage) {
                Ok(bytes) => match self.cluster.put(subjects::USAGE_KEY, bytes.into()).await {
                    Ok(_) => self.usage_dirty = false,
                    Err(err) => tracing::warn!(%err, "storing usage"),
                },
                Err(err) => tracing::warn!(%err, "encoding usage"),
            }
        }
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

    /// Brings [`Scheduler::queue_views`] up to date. Only jobs whose record changed since
    /// the last pass are looked up (a new view, a dropped one); then every view's effective
    /// priority (it ages) and, for the few jobs with dependencies, whether those are met, are
    /// refreshed in one sweep over views that lie next to each other in memory.
    fn refresh_queue_views(&mut self, now: Timestamp) {
        let changed = self.store.take_changed();
        self.churn += changed.len();
        for id in changed {
            let fresh = self.store.get(&id).and_then(|record| match &record.state {
                JobState::Queued(waiting) => Some(QueueView {
                    priority: record.spec.priority,
                    queued_secs: waiting
                        .enqueued_at
                        .unwrap_or(record.submitted_at)
                        .timestamp(),
                    user: record.user.clone(),
                    has_dependencies: !record.spec.after.is_empty()
                        || !record.spec.after_any.is_empty(),
                    view: self.queued_job(record, waiting, now),
                }),
                _ => None,
            });
            match (self.queue_slots.get(&id).copied(), fresh) {
                (Some(slot), Some(view)) => self.queue_views[slot] = view,
                (Some(slot), None) => {
                    self.queue_slots.remove(&id);
                    self.queue_views.swap_remove(slot);
                    if let Some(moved) = self.queue_views.get(slot) {
                        self.queue_slots.insert(moved.view.id.clone(), slot);
                    }
                }
                (None, Some(view)) => {
                    self.queue_slots.insert(id, self.queue_views.len());
                    self.queue_views.push(view);
                }
                (None, None) => {}
            }
        }
        let mut views = std::mem::take(&mut self.queue_views);
        let now_secs = now.timestamp();
        let mut gpu_hours: HashMap<String, f64> = HashMap::new();
        let mut last_user: Option<(String, f64)> = None;
        for cached in &mut views {
            // Runs of one user's jobs are common: no lookup for those.
            let hours = match &last_user {
                Some((user, hours)) if *user == cached.user => *hours,
                _ => {
                    let hours = match gpu_hours.get(cached.user.as_str()) {
                        Some(hours) => *hours,
                        None => {
                            let hours =
                                self.usage
                                    .gpu_hours(&cached.user, now, self.policy.half_life_secs);
                            gpu_hours.insert(cached.user.clone(), hours);
                            hours
                        }
                    };
                    last_user = Some((cached.user.clone(), hours));
                    hours
                }
            };
            cached.view.effective_priority = effective_priority_after(
                cached.priority,
                now_secs - cached.queued_secs,
                hours,
                &self.policy,
            );
            if cached.has_dependencies
                && let Some(record) = self.store.get(&cached.view.id)
            {
                cached.view.dependencies = self.dependencies(&record.spec);
            }
        }
        self.queue_views = views;
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

    fn queued_job(&self, record: &JobRecord, waiting: &Waiting, now: Timestamp) -> QueuedJob {
        let queued_at = waiting.enqueued_at.unwrap_or(record.submitted_at);
        let gpu_hours = self
            .usage
            .gpu_hours(&record.user, now, self.policy.half_life_secs);
        QueuedJob {
            id: record.id.clone(),
            effective_priority: effective_priority(
                record.spec.priority,
                queued_at,
                gpu_hours,
                &self.policy,
                now,
            ),
            queued_at,
            gpus: record.spec.gpus,
            gpu_ids: record.spec.gpu_ids.clone(),
            allowed_gpus: record.spec.allowed_gpus.clone(),
            mem_mib: record.spec.mem_mib,
            time_limit: self.effective_time_limit(&record.spec),
            held: waiting.held_by.is_some(),
            dependencies: self.dependencies(&record.spec),
            array: record
                .spec
                .array
                .as_ref()
                .map(|a| (a.array_id.clone(), a.max_running)),
            nodes: record.spec.nodes,
            required_nodes: record.spec.required_nodes(),
            exclude: record.spec.exclude.clone(),
            node_gpu_ids: record.spec.node_gpu_ids.clone(),
            not_before: waiting.not_before,
            recorded_reason: Some(waiting.reason),
        }
    }

    fn running_job(&self, record: &JobRecord, run: &Run) -> RunningJob {
        let began = run.started_at.unwrap_or(run.assigned_at);
        let end = self
            .effective_time_limit(&record.spec)
            .and_then(|limit| chrono::Duration::from_std(limit).ok())
            .map(|limit| began + limit);
        let sliced = record.spec.on_timeout == OnTimeout::Requeue && !run.preempt_requested;
        RunningJob {
            id: record.id.clone(),
            placement: run.placement.clone(),
            expected_end: end,
            slice_end: if sliced { end } else { None },
            array_id: record.spec.array.as_ref().map(|a| a.array_id.clone()),
        }
    }

    /// Whether `--after` (must succeed) and `--after-any` (must end) are met.
    fn dependencies(&self, spec: &JobSpec) -> Dependencies {
        let mut waiting = false;
        for id in &spec.after {
            match self.store.get(id).map(|r| &r.state) {
                Some(JobState::Succeeded(_)) => {}
                Some(state) if state.is_finished() => {
                    return Dependencies::Broken(format!(
                        "dependency {} ended {} (--after needs it to succeed)",
                        id.short(),
                        state.name()
                    ));
                }
                Some(_) => waiting = true,
                // Submitted but not recorded yet, or unknown: wait for it.
                None => waiting = true,
            }
        }
        for id in &spec.after_any {
            if !self.store.get(id).is_some_and(|r| r.state.is_finished()) {
                waiting = true;
            }
        }
        if waiting {
            Dependencies::Waiting
        } else {
            Dependencies::Met
        }
    }

    /// Carries out a pass's decisions; returns how many changed something. Starts and new
    /// wait reasons, the bulk of a busy pass, are written together (pipelined), then the
    /// assignments sent together; rejections and preemptions, rare, one by one.
    async fn carry_out_all(&mut self, decisions: Vec<Decision>, now: Timestamp) -> usize {
        let mut starts: HashMap<JobId, Placement> = HashMap::new();
        let mut start_order: Vec<JobId> = Vec::new();
        let mut reasons: HashMap<JobId, WaitReason> = HashMap::new();
        let mut reason_order: Vec<JobId> = Vec::new();
        let mut others = Vec::new();
        for decision in decisions {
            match decision {
                Decision::Start { job, placement } => {
                    let placement = self.with_launch(&job, placement);
                    start_order.push(job.clone());
                    starts.insert(job, placement);
                }
                Decision::Wait { job, reason } => {
                    let unchanged = matches!(
                        self.store.get(&job).map(|r| &r.state),
                        Some(JobState::Queued(w)) if w.reason == reason
                    );
                    if !unchanged {
                        reason_order.push(job.clone());
                        reasons.insert(job, reason);
                    }
                }
                other => others.push(other),
            }
        }
        let mut changes = 0;

        // Recorded first, then sent: if we die in between, the restarted scheduler sees
        // running jobs that never started and sends them again (the message id makes
        // JetStream drop a copy that did go out).
        let recorded = self
            .store
            .update_many(&start_order, |r| {
                if let Some(placement) = starts.get(&r.id) {
                    r.state = JobState::Running(Run::assigned(placement.clone(), now));
                }
            })
            .await;
        let mut started = Vec::with_capacity(recorded.len());
        for result in recorded {
            match result {
                Ok(record) => started.push(record),
                Err(err) => tracing::error!("recording a start: {err:#}"),
            }
        }
        let sent: Vec<Result<()>> = futures::stream::iter(&started)
            .map(|record| self.send_assignment(record))
            .buffered(ASSIGNMENTS_IN_FLIGHT)
            .collect()
            .await;
        for (record, outcome) in started.iter().zip(sent) {
            if let Err(err) = outcome {
                // Recorded as running: the repair timer sends it again.
                tracing::error!("{err:#}");
                continue;
            }
            changes += 1;
            let JobState::Running(run) = &record.state else {
                continue;
            };
            self.publish_event(
                &record.id,
                JobEventKind::Assigned {
                    placement: run.placement.clone(),
                },
            );
            if let Some(end) = self
                .effective_time_limit(&record.spec)
                .and_then(|l| chrono::Duration::from_std(l).ok())
            {
                let end = now + end;
                if record.spec.on_timeout == OnTimeout::Requeue
                    && self.next_slice_end.is_none_or(|next| end < next)
                {
                    self.next_slice_end = Some(end);
                }
            }
        }

        let written = self
            .store
            .update_many(&reason_order, |r| {
                if let (JobState::Queued(waiting), Some(reason)) =
                    (&mut r.state, reasons.get(&r.id))
                {
                    waiting.reason = *reason;
                }
            })
            .await;
        for (job, result) in reason_order.iter().zip(written) {
            match result {
                Ok(_) => {
                    changes += 1;
                    if let Some(reason) = reasons.get(job) {
                        self.publish_event(job, JobEventKind::Queued { reason: *reason });
                    }
                }
                Err(err) => tracing::error!("recording a wait reason: {err:#}"),
            }
        }

        for decision in others {
            match self.carry_out(decision, now).await {
                Ok(()) => changes += 1,
                Err(err) => tracing::error!("{err:#}"),
            }
        }
        changes
    }

    /// Carries out a rejection or a preemption.
    async fn carry_out(&mut self, decision: Decision, now: Timestamp) -> Result<()> {
        match decision {
            Decision::Start { .. } | Decision::Wait { .. } => Ok(()),
            Decision::Reject { job, reason } => {
                self.finish(&job, |_| {
                    JobState::Failed(Ending {
                        placement: None,
                        started_at: None,
                        ended_at: now,
                        exit_code: None,
                        signal: None,
                        reason: Some(format!("cannot run: {reason}")),
                    })
                })
                .await
            }
            Decision::Preempt { job } => self.preempt(&job).await,
        }
    }

    /// A placement with what a multi-node or distributed job's ranks need to find each other.
    fn with_launch(&self, job: &JobId, mut placement: Placement) -> Placement {
        let Some(spec) = self.store.get(job).map(|r| &r.spec) else {
            return placement;
        };
        if spec.is_multi_node() || spec.distributed {
            placement.launch = Some(Launch {
                distributed: spec.distributed,
                addresses: placement
                    .node_names()
                    .into_iter()
                    .map(|node| self.nodes.address(node).unwrap_or(node).to_owned())
                    .collect(),
                master_port: master_port(job),
            });
        }
        placement
    }

    /// Stops a job whose time slice is over; it comes back to the queue when the agent reports.
    async fn preempt(&mut self, job: &JobId) -> Result<()> {
        let Some(record) = self.store.get(job).cloned() else {
            return Ok(());
        };
        let JobState::Running(run) = &record.state else {
            return Ok(());
        };
        if run.preempt_requested || run.cancel_requested_by.is_some() {
            return Ok(());
        }
        self.store
            .update(job, |r| {
                if let JobState::Running(run) = &mut r.state {
                    run.preempt_requested = true;
                }
            })
            .await?;
        let control = NodeControl::Kill {
            job_id: job.clone(),
            attempt: record.attempt,
            reason: "time slice over while other jobs wait: back to the queue".into(),
            requeue: true,
        };
        self.send_control_to_job(&run.placement, &control, None)
            .await?;
        tracing::info!(job = %job, nodes = %run.placement.nodes_label(), "time slice over; preempting");
        Ok(())
    }

    /// Adds a finished run's GPU time to its user's fair-share usage.
    pub(crate) fn account_usage(&mut self, record: &JobRecord, ended_at: Timestamp) {
        let JobState::Running(run) = &record.state else {
            return;
        };
        let Some(started) = run.started_at else {
            return;
        };
        let seconds = (ended_at - started).num_milliseconds().max(0) as f64 / 1000.0;
        let gpus = run.placement.total_gpus();
        if gpus > 0.0 && seconds > 0.0 {
            self.usage.add(
                &record.user,
                gpus * seconds,
                ended_at,
                self.policy.half_life_secs,
            );
            self.usage_dirty = true;
        }
    }

    /// Moves a job to a finished state built by `ending` from its current record.
    pub(crate) async fn finish(
        &mut self,
        job: &JobId,
        ending: impl Fn(&JobRecord) -> JobState,
    ) -> Result<()> {
        let record = self.store.update(job, |r| r.state = ending(r)).await?;
        let end = record.state.ending();
        self.publish_event(
            job,
            JobEventKind::Finished {
                state: record.state.name().to_owned(),
                exit_code: end.and_then(|e| e.exit_code),
                reason: end.and_then(|e| e.reason.clone()),
            },
        );
        tracing::info!(job = %job, state = record.state.name(), "job finished");
        Ok(())
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
