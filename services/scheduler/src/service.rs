//! The scheduler service: the event loop. It decodes what arrives (requests through
//! `intake.rs`, agents' reports through `report.rs`, heartbeats through `liveness.rs`), has
//! the job lifecycle or the core decide, and hands the effects to the outbox
//! (`effects.rs`). After every change it runs a pass: the core's view brought up to date
//! ([`QueueViews`]), `core::plan`, its decisions carried out (`decisions.rs`).
//!
//! Everything is event-driven: a submission, an agent's report or a node's heartbeat wakes
//! the loop; nothing polls. Messages that arrive together are handled as one batch followed
//! by one scheduling pass, so a burst of 1 000 submissions costs a handful of passes.
//!
//! [`Scheduler`] is made of parts that each own their data: the job table ([`JobStore`]),
//! the node table ([`NodeTable`]), the [`Outbox`], the request [`Gate`], the
//! [`UsageLedger`], the core's [`QueueViews`], what the liveness checks remember
//! ([`LivenessMemory`]) and the [`PassStats`]; the [`SchedulerMetrics`] are shared with the
//! metrics endpoint, which asks the loop for the tables' counts at each scrape.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use async_nats::jetstream::{self, consumer, kv};
use futures::{FutureExt, StreamExt};
use tokio::sync::watch;

use mgpu_nats::pull::Pull;
use mgpu_nats::records;
use mgpu_protocol::priority::Policy;
use mgpu_protocol::{Timestamp, now, subjects};

use crate::core::{self, CoreSettings, QueuedJob, RunningJob};
use crate::identity::{Gate, Principals};
use crate::limits::LimitsFile;
use crate::liveness_memory::LivenessMemory;
use crate::metrics::{GaugeRequests, SchedulerMetrics};
use crate::nodes::NodeTable;
use crate::outbox::Outbox;
use crate::passes::{Counts, PassStats};
use crate::queue_view::{QueueViews, Sources};
use crate::state::JobStore;
use crate::status::{PassSample, Status};
use crate::usage::UsageLedger;

/// Messages handled before a scheduling pass, at most, when a burst arrives.
const BATCH: usize = 512;

pub struct Scheduler {
    pub(crate) js: jetstream::Context,
    pub(crate) outbox: Outbox,
    pub(crate) store: JobStore,
    pub(crate) nodes: NodeTable,
    /// Node administration, policy and usage (`mgpu-cluster` bucket).
    pub(crate) cluster: kv::Store,
    pub(crate) policy: Policy,
    pub(crate) usage: UsageLedger,
    pub(crate) gate: Gate,
    pub(crate) views: QueueViews,
    pub(crate) watch: LivenessMemory,
    pub(crate) stats: PassStats,
    /// When the next time slice of a running job ends (the loop wakes up then).
    pub(crate) next_slice_end: Option<Timestamp>,
    /// The durable consumer of agents' reports, asked whether every stored report was handled.
    pub(crate) events_consumer: Option<consumer::PullConsumer>,
    /// When finished jobs were last moved to history.
    pub(crate) history: crate::history::HistoryKeeper,
    /// What the metrics endpoint serves: counted here, read there.
    pub(crate) metrics: Arc<SchedulerMetrics>,
    /// Per-user limits (`[limits]` of the config file), re-read when the file changes.
    pub(crate) limits: LimitsFile,
    /// Each capped user's most GPUs running at once, from `limits` and users' groups, and the
    /// principals file's generation it was derived from.
    pub(crate) gpu_caps: (Arc<HashMap<String, u64>>, u64),
}

/// What wakes the loop: heartbeats (plain subscription), agents' reports and requests
/// (durable pulls).
struct Inputs {
    heartbeats: async_nats::Subscriber,
    events: Pull,
    requests: Pull,
    /// Scrapes asking for the gauges (`metrics.rs`).
    gauge_requests: GaugeRequests,
}

/// Runs the active scheduler until `shutdown` turns true or the lease is lost. The streams
/// must exist (`streams::ensure`).
pub async fn run(
    client: async_nats::Client,
    policy: Policy,
    principals: Principals,
    limits: LimitsFile,
    shutdown: watch::Receiver<bool>,
    lease_lost: watch::Receiver<bool>,
    metrics: Arc<SchedulerMetrics>,
) -> Result<()> {
    // The metrics say this replica leads from here until this function returns.
    let (_term, gauge_requests) = metrics.begin_term();
    // Subscribed (and the server has taken the subscription: the flush's round trip) before
    // the stored heartbeats are read, so a node's beat stored in between is not missed: a
    // node that beats rarely would otherwise wait a whole interval to be seen.
    let heartbeats = client
        .subscribe(subjects::ALL_HEARTBEATS)
        .await
        .map_err(|e| anyhow!("subscribing to heartbeats: {e}"))?;
    client
        .flush()
        .await
        .map_err(|e| anyhow!("subscribing to heartbeats: {e}"))?;
    let (mut scheduler, status) =
        Scheduler::load(&client, policy, (principals, limits), metrics).await?;
    tracing::info!(
        jobs = scheduler.store.total(),
        nodes = scheduler.nodes.len(),
        "state loaded"
    );
    let service_client = client.clone();
    // Dropped when this function returns: the micro service deregisters with the term.
    let (_status_term, status_term_over) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        if let Err(err) = crate::status::serve(service_client, status, status_term_over).await {
            tracing::error!("micro service stopped: {err:#}");
        }
    });
    let mut inputs = scheduler.open_inputs(heartbeats, gauge_requests).await?;
    // Queued jobs depending on jobs already in history learn how those ended.
    let queued: Vec<_> = scheduler.store.queued().map(|r| r.spec.clone()).collect();
    scheduler.learn_archived(queued.iter()).await;
    scheduler.check_liveness().await;
    scheduler.pass().await;
    tracing::info!("scheduler ready");
    scheduler
        .event_loop(&mut inputs, shutdown, lease_lost)
        .await;
    // Whoever acts next (this replica again, or a standby) gets what was pulled and not
    // handled at once, not after the acknowledgement wait.
    let given_back = inputs.events.give_back().await + inputs.requests.give_back().await;
    if given_back > 0 {
        tracing::info!(given_back, "handed back reports and requests not handled");
    }
    tracing::info!("scheduler stopping");
    Ok(())
}

impl Scheduler {
    /// Loads the state (job records, nodes' last heartbeats and administration, usage) and
    /// publishes the policy in force, so `mgpu queue` computes the same priorities.
    async fn load(
        client: &async_nats::Client,
        policy: Policy,
        (principals, limits): (Principals, LimitsFile),
        metrics: Arc<SchedulerMetrics>,
    ) -> Result<(Self, watch::Receiver<Status>)> {
        let js = jetstream::new(client.clone());
        let store = JobStore::load(&js).await.context("loading job records")?;
        let mut nodes = NodeTable::new(
            records::list_nodes(&js)
                .await
                .context("loading node heartbeats")?,
            records::node_admin(&js)
                .await
                .context("loading node administration")?,
            policy.missed_heartbeats,
        );
        nodes.require_gpu_isolation = policy.require_gpu_isolation;
        // Heartbeats stored while no scheduler was active (or this one was still loading)
        // were not seen: every node gets a full allowance from now before it counts as silent.
        nodes.blind_until(now());
        let usage = records::usage(&js).await.context("loading usage")?;
        let cluster = records::cluster_bucket(&js).await?;
        cluster
            .put(subjects::POLICY_KEY, serde_json::to_vec(&policy)?.into())
            .await
            .map_err(|e| anyhow!("storing the policy: {e}"))?;
        let gpu_caps = Arc::new(limits.limits.running_caps(principals.users_with_groups()));
        let mut gate = Gate::new(principals);
        gate.restore_nonces(crate::replay_memory::recall(&js).await?);
        let (status_tx, status_rx) = watch::channel(Status::default());
        let scheduler = Scheduler {
            outbox: Outbox::new(js.clone()),
            usage: UsageLedger::new(usage, cluster.clone()),
            js,
            store,
            nodes,
            cluster,
            policy,
            gate,
            views: QueueViews::default(),
            watch: LivenessMemory::default(),
            stats: PassStats::new(status_tx),
            next_slice_end: None,
            events_consumer: None,
            history: crate::history::HistoryKeeper::default(),
            metrics,
            limits,
            gpu_caps: (gpu_caps, 0),
        };
        Ok((scheduler, status_rx))
    }

    /// Handles the agents' reports written while no scheduler was active (only then is it
    /// known which assignments never reached their node), sends those again, and opens the
    /// requests; `heartbeats` is the subscription made before the state was loaded.
    async fn open_inputs(
        &mut self,
        heartbeats: async_nats::Subscriber,
        gauge_requests: GaugeRequests,
    ) -> Result<Inputs> {
        let events_consumer = durable_consumer(
            &self.js,
            subjects::EVENTS_STREAM,
            subjects::SCHEDULER_EVENTS_CONSUMER,
        )
        .await?;
        self.events_consumer = Some(events_consumer.clone());
        let backlog = events_consumer
            .clone()
            .info()
            .await
            .map_err(|e| anyhow!("reading the events consumer: {e}"))?
            .num_pending;
        let mut events = Pull::new(events_consumer, "job events")
            .await
            .map_err(|e| anyhow!("consuming job events: {e}"))?;
        for _ in 0..backlog {
            match tokio::time::timeout(Duration::from_secs(5), events.next()).await {
                Ok(message) => self.on_event_message(message).await,
                Err(_) => break,
            }
        }
        self.resend_unconfirmed_assignments().await;
        let requests_consumer = durable_consumer(
            &self.js,
            subjects::REQUESTS_STREAM,
            subjects::SCHEDULER_REQUESTS_CONSUMER,
        )
        .await?;
        let requests = Pull::new(requests_consumer, "requests")
            .await
            .map_err(|e| anyhow!("consuming requests: {e}"))?;
        Ok(Inputs {
            heartbeats,
            events,
            requests,
            gauge_requests,
        })
    }

    /// Handles what arrives until shutdown or the lease is lost, with a pass after each change.
    async fn event_loop(
        &mut self,
        inputs: &mut Inputs,
        mut shutdown: watch::Receiver<bool>,
        mut lease_lost: watch::Receiver<bool>,
    ) {
        // Nodes that stop heartbeating are noticed on this timer (nothing else would wake us).
        let mut liveness = tokio::time::interval(Duration::from_secs(1));
        liveness.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let slice_timer = self.next_slice_end.map(|end| {
                let wait = (end - now()).to_std().unwrap_or(Duration::ZERO);
                tokio::time::Instant::now() + wait + Duration::from_millis(5)
            });
            let changed = tokio::select! {
                _ = shutdown.changed() => {
                    self.usage.save(true).await;
                    return;
                }
                // Not stored after losing the lease: the replica that took it keeps the book.
                _ = lease_lost.changed() => {
                    tracing::error!("lost the scheduler lease: no longer active");
                    return;
                }
                _ = liveness.tick() => self.on_liveness_tick(&mut inputs.heartbeats).await,
                // A running job's time slice ends: the pass decides whether to preempt it.
                _ = tokio::time::sleep_until(slice_timer.unwrap_or_else(far_future)), if slice_timer.is_some() => true,
                message = inputs.requests.next() => {
                    let mut batch = vec![message];
                    batch.extend(ready(&mut inputs.requests));
                    self.on_requests(batch).await;
                    true
                }
                message = inputs.events.next() => {
                    self.on_event_message(message).await;
                    for message in ready(&mut inputs.events) {
                        self.on_event_message(message).await;
                    }
                    true
                }
                Some(message) = inputs.heartbeats.next() => {
                    let changed = self.on_heartbeat(&message.subject, &message.payload).await;
                    changed | self.drain_heartbeats(&mut inputs.heartbeats).await
                }
                // A scrape: counted between two inputs, nothing changes.
                Some(reply) = inputs.gauge_requests.recv() => {
                    let _ = reply.send(self.gauges(now()));
                    false
                }
            };
            if changed {
                self.pass().await;
            }
        }
    }

    /// Every second: heartbeats that arrived while a long pass ran count before any node is
    /// judged silent; the usage book is stored if a change waits; silent nodes are acted on.
    /// True when a pass should follow.
    async fn on_liveness_tick(&mut self, heartbeats: &mut async_nats::Subscriber) -> bool {
        let changed = self.drain_heartbeats(heartbeats).await;
        // A change no pass stored since (they come too often for that) is stored here.
        self.usage.save(false).await;
        self.keep_history().await;
        let limits_changed = self.refresh_limits();
        self.check_liveness().await || changed || limits_changed
    }

    /// Re-reads the limits and the users' groups when their files changed; true when the caps
    /// on running GPUs did (a pass then starts what a raised cap lets start).
    fn refresh_limits(&mut self) -> bool {
        let limits_changed = self.limits.refresh();
        self.gate.principals.refresh();
        self.derive_caps(limits_changed)
    }

    /// Derives the caps on running GPUs again when the limits changed or the principals file
    /// was read again since (by any lookup: a request from a user just added re-reads it, and
    /// the pass that follows must already cap that user); true when they changed.
    fn derive_caps(&mut self, limits_changed: bool) -> bool {
        let generation = self.gate.principals.generation();
        if !limits_changed && generation == self.gpu_caps.1 {
            return false;
        }
        let caps = self
            .limits
            .limits
            .running_caps(self.gate.principals.users_with_groups());
        let changed = caps != *self.gpu_caps.0;
        self.gpu_caps = (Arc::new(caps), generation);
        changed
    }

    /// Handles the heartbeats already waiting; true when one changed the node table.
    async fn drain_heartbeats(&mut self, heartbeats: &mut async_nats::Subscriber) -> bool {
        let mut changed = false;
        while let Some(Some(message)) = heartbeats.next().now_or_never() {
            changed |= self.on_heartbeat(&message.subject, &message.payload).await;
        }
        changed
    }

    /// One scheduling pass: ask the core, then carry out what it decided.
    pub(crate) async fn pass(&mut self) {
        let began = std::time::Instant::now();
        let now = now();
        let changed = self.store.take_changed();
        self.stats.add_churn(changed.len());
        let sources = Sources {
            store: &self.store,
            usage: &self.usage,
            policy: &self.policy,
        };
        self.views.refresh(changed, &sources, now);
        self.derive_caps(false);
        let queue: Vec<&QueuedJob> = self.views.queued().collect();
        let running: Vec<&RunningJob> = self.views.running().collect();
        // Only slices still to come arm the timer: one already over is acted on by the next
        // pass that finds someone waiting (a submission or an exit wakes the loop anyway).
        self.next_slice_end = running
            .iter()
            .filter_map(|r| r.slice_end)
            .filter(|end| *end > now)
            .min();
        // Jobs held until a lost node surely stopped them: the liveness timer wakes us then.
        self.watch.next_release = queue
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
                gpu_caps: Arc::clone(&self.gpu_caps.0),
            };
            let nodes = self.nodes.views(now);
            sample.view_us = micros(began.elapsed());
            let decisions = core::plan(&nodes, &running, &queue, &settings, now);
            sample.plan_us = micros(began.elapsed()) - sample.view_us;
            drop((queue, running));
            sample.changes = self.carry_out_all(decisions, now).await;
        }
        self.usage.save(false).await;
        let took = began.elapsed();
        sample.total_us = micros(took);
        self.metrics.tally().pass(took);
        let (jobs_queued, jobs_running) = self.store.counts();
        let counts = Counts {
            jobs_queued,
            jobs_running,
            jobs_total: self.store.total(),
            nodes_known: self.nodes.len(),
            nodes_online: self.nodes.online(now),
        };
        self.stats.record(sample, counts);
        self.stats.give_back_memory_after_bursts();
    }
}

/// The messages of `pull` already waiting, at most [`BATCH`].
fn ready(pull: &mut Pull) -> Vec<jetstream::Message> {
    let mut batch = Vec::new();
    while batch.len() < BATCH {
        match pull.next().now_or_never() {
            Some(message) => batch.push(message),
            None => break,
        }
    }
    batch
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
