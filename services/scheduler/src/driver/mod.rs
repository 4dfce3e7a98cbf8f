//! The driver: the only part of the scheduler that does I/O while it is active. It owns the
//! NATS connection's inputs (heartbeats, the durable pulls of requests and agents' reports,
//! the liveness timer, the time-slice timer, metrics scrapes), reads each into an input of
//! the machine ([`crate::machine::SchedulerState`]), carries the commands it gets back out
//! (record writes, assignments, kills, events, audit records, acknowledgements, moves to
//! history) and feeds their results back, until the machine asks for nothing more; then,
//! when the machine says a pass is due, it runs one the same way.
//!
//! Messages that arrive together are handled as one batch followed by one scheduling pass,
//! so a burst of 1 000 submissions costs a handful of passes. Nothing polls: a submission, an
//! agent's report or a node's heartbeat wakes the loop.
//!
//! # Layout
//! - this file: loading, the event loop, carrying commands out.
//! - [`intake`]: requests, reports and heartbeats read into inputs (signatures, nonces,
//!   environments kept apart, dependencies in history).
//!   Heartbeats are read by a task of their own, the latest of each node kept until the loop
//!   takes them ([`mgpu_nats::latest_per_subject`]: a loop held up by a burst never reads
//!   stale ones).
//! - [`store`]: record writes (compare-and-set, pipelined, retried), history, the cluster
//!   bucket.
//! - [`outbox`]: the machine's commands carried out: assignments, control messages, events
//!   and audit records sent, acknowledgements, stores, answers fed back.
//! - [`replica`]: the lease, the status micro service, the metrics endpoint.

mod held;
mod intake;
pub(crate) mod outbox;
pub mod replica;
pub(crate) mod store;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use async_nats::jetstream::{self, consumer};
use futures::FutureExt;
use tokio::sync::{mpsc, watch};

use mgpu_nats::pull::Pull;
use mgpu_nats::records;
use mgpu_protocol::priority::Policy;
use mgpu_protocol::{now, subjects};

use crate::identity::{Gate, Principals};
use crate::limits_file::LimitsFile;
use crate::machine::SchedulerState;
use crate::machine::messages::{ACK_WAIT, Input, Loaded, Tick, Token};
use crate::passes::{Counts, PassStats};
use crate::status::Status;
use mgpu_nats::latest_per_subject::{self, LatestPerSubject};
use outbox::Outbox;
use replica::{GaugeRequests, SchedulerMetrics};
use store::RecordStore;

/// Messages handled before a scheduling pass, at most, when a burst arrives.
const BATCH: usize = 512;

/// How long a burst of requests may keep arriving before the pass it made due runs: long
/// enough that a pass covers thousands of submissions, short enough that a job of a burst
/// starts a fraction of a second after it was recorded.
const BURST_BEFORE_PASS: Duration = Duration::from_millis(250);

/// The active scheduler: the machine, and what carries its commands out.
pub struct Driver {
    js: jetstream::Context,
    machine: SchedulerState,
    store: RecordStore,
    outbox: Outbox,
    /// The principals file and replay protection every request passes.
    gate: Gate,
    /// The principals file's generation the machine was last given.
    principals_seen: u64,
    /// Per-user limits (`[limits]` of the config file), re-read when the file changes.
    limits: LimitsFile,
    /// What the metrics endpoint serves: counted here, read there.
    metrics: Arc<SchedulerMetrics>,
    stats: PassStats,
    /// Where the status micro service reads the latest status from.
    status: watch::Sender<Status>,
    /// The durable consumer of agents' reports, asked whether every stored report was handled.
    events_consumer: Option<consumer::PullConsumer>,
    /// Messages the machine may ask to acknowledge, by token.
    held: held::Held,
    /// The origin of the monotonic clock the machine's ticks read.
    started: Instant,
    /// The nodes' latest heartbeats, waiting to be handled.
    heartbeats: LatestPerSubject,
    /// Asked before anything is written, acknowledged or sent: a replica stalled past its
    /// lease must not act on what it held before a standby took over.
    lease: replica::LeaseGate,
    /// Set when the gate found the lease lost: the loop stops after the current input.
    stepped_down: bool,
}

/// What wakes the loop: heartbeats (their own reader), agents' reports and requests
/// (durable pulls), metrics scrapes.
struct Inputs {
    /// Reads the heartbeats into [`Driver::heartbeats`] while the loop runs.
    _heartbeat_reader: latest_per_subject::Reader,
    events: Pull,
    requests: Pull,
    gauge_requests: GaugeRequests,
    /// `mgpu why` questions, from the micro service.
    why_asks: mpsc::Receiver<replica::WhyAsk>,
}

/// Runs the active scheduler until `shutdown` turns true or the lease is lost. The streams
/// must exist (`streams::ensure`).
pub async fn run(
    client: async_nats::Client,
    policy: Policy,
    (principals, limits): (Principals, LimitsFile),
    (shutdown, lease): (watch::Receiver<bool>, replica::LeaseGate),
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
    // Read from now on, while the state loads (a long while for a big queue).
    let (heartbeats, heartbeat_reader) = LatestPerSubject::follow(heartbeats, "heartbeats");
    let lease_lost = lease.lost();
    let (mut driver, status) =
        Driver::load(&client, policy, (principals, limits), (metrics, lease)).await?;
    driver.heartbeats = heartbeats;
    let (queued, running, total) = driver.machine.counts();
    tracing::info!(jobs = total, queued, running, "state loaded");
    let service_client = client.clone();
    // Dropped when this function returns: the micro service deregisters with the term.
    let (_status_term, status_term_over) = tokio::sync::oneshot::channel::<()>();
    let (why_asks, why_asked) = mpsc::channel(16);
    tokio::spawn(async move {
        let served = replica::serve_status(service_client, status, why_asks, status_term_over);
        if let Err(err) = served.await {
            tracing::error!("micro service stopped: {err:#}");
        }
    });
    let mut inputs = driver
        .open_inputs(heartbeat_reader, (gauge_requests, why_asked))
        .await?;
    // Queued jobs depending on jobs already in history learn how those ended.
    let queued: Vec<_> = driver.machine.queued_specs().into_iter().cloned().collect();
    driver.learn_archived(queued.iter()).await;
    driver.tick().await;
    driver.pass().await;
    tracing::info!("scheduler ready");
    driver.event_loop(&mut inputs, shutdown, lease_lost).await;
    // Whoever acts next (this replica again, or a standby) gets what was pulled and not
    // handled at once, not after the acknowledgement wait.
    let given_back = inputs.events.give_back().await + inputs.requests.give_back().await;
    if given_back > 0 {
        tracing::info!(given_back, "handed back reports and requests not handled");
    }
    tracing::info!("scheduler stopping");
    Ok(())
}

impl Driver {
    /// Loads the state (job records, nodes' last heartbeats and administration, usage) into
    /// a new machine, and publishes the policy in force, so `mgpu queue` computes the same
    /// priorities.
    async fn load(
        client: &async_nats::Client,
        policy: Policy,
        (principals, limits): (Principals, LimitsFile),
        (metrics, lease): (Arc<SchedulerMetrics>, replica::LeaseGate),
    ) -> Result<(Self, watch::Receiver<Status>)> {
        let js = jetstream::new(client.clone());
        let store = RecordStore::open(&js, lease.clone()).await?;
        let records = store.load().await.context("loading job records")?;
        let heartbeats = records::list_nodes(&js)
            .await
            .context("loading node heartbeats")?;
        let admin = records::node_admin(&js)
            .await
            .context("loading node administration")?;
        let usage = records::usage(&js).await.context("loading usage")?;
        let reservations = records::reservations(&js)
            .await
            .context("loading reservations")?;
        store
            .cluster
            .put(subjects::POLICY_KEY, serde_json::to_vec(&policy)?.into())
            .await
            .map_err(|e| anyhow!("storing the policy: {e}"))?;
        let mut gate = Gate::new(principals);
        gate.restore_nonces(store::recall_nonces(&js).await?);
        let machine = SchedulerState::new(Loaded {
            records,
            heartbeats,
            admin,
            reservations,
            usage,
            principals: gate.principals.registry().clone(),
            limits: limits.limits.clone(),
            policy,
            now: now(),
        });
        let (status_tx, status_rx) = watch::channel(Status::default());
        let driver = Driver {
            outbox: Outbox::new(js.clone(), lease.clone()),
            principals_seen: gate.principals.generation(),
            js,
            machine,
            store,
            gate,
            limits,
            metrics,
            stats: PassStats::new(),
            status: status_tx,
            events_consumer: None,
            held: held::Held::default(),
            started: Instant::now(),
            heartbeats: LatestPerSubject::default(),
            lease,
            stepped_down: false,
        };
        Ok((driver, status_rx))
    }

    /// Handles the agents' reports written while no scheduler was active (only then is it
    /// known which assignments never reached their node), sends those again, and opens the
    /// requests; `heartbeat_reader` reads the subscription made before the state was loaded.
    async fn open_inputs(
        &mut self,
        heartbeat_reader: latest_per_subject::Reader,
        (gauge_requests, why_asks): (GaugeRequests, mpsc::Receiver<replica::WhyAsk>),
    ) -> Result<Inputs> {
        let events_consumer = durable_consumer(
            &self.js,
            subjects::EVENTS_STREAM,
            subjects::SCHEDULER_EVENTS_CONSUMER,
        )
        .await?;
        self.events_consumer = Some(events_consumer.clone());
        let info = events_consumer
            .clone()
            .info()
            .await
            .map_err(|e| anyhow!("reading the events consumer: {e}"))?
            .clone();
        let backlog = info.num_pending;
        if info.num_ack_pending > 0 {
            self.feed(Input::ReportsUnacknowledged).await;
        }
        let mut events = Pull::new(events_consumer, "job events")
            .await
            .map_err(|e| anyhow!("consuming job events: {e}"))?;
        for _ in 0..backlog {
            match tokio::time::timeout(Duration::from_secs(5), events.next()).await {
                Ok(message) => self.on_event_message(message).await,
                Err(_) => break,
            }
        }
        self.feed(Input::Resumed).await;
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
            _heartbeat_reader: heartbeat_reader,
            events,
            requests,
            gauge_requests,
            why_asks,
        })
    }

    /// Handles what arrives until shutdown or the lease is lost, with a pass after each
    /// change.
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
            let slice_timer = self.machine.next_slice_end().map(|end| {
                let wait = (end - now()).to_std().unwrap_or(Duration::ZERO);
                tokio::time::Instant::now() + wait + Duration::from_millis(5)
            });
            tokio::select! {
                _ = shutdown.changed() => {
                    self.feed(Input::Stop).await;
                    return;
                }
                // Not stored after losing the lease: the replica that took it keeps the book.
                _ = lease_lost.changed() => {
                    tracing::error!("lost the scheduler lease: no longer active");
                    return;
                }
                _ = liveness.tick() => {
                    self.take_heartbeats().await;
                    self.tick().await;
                }
                // A running job's time slice ends: the pass decides whether to preempt it.
                _ = tokio::time::sleep_until(slice_timer.unwrap_or_else(far_future)), if slice_timer.is_some() => {
                    self.machine.slice_over();
                }
                message = inputs.requests.next() => {
                    let began = Instant::now();
                    let mut batch = vec![message];
                    batch.extend(ready(&mut inputs.requests));
                    self.on_requests(batch).await;
                    // A burst: what arrived while that batch was recorded is taken before
                    // the pass, for up to BURST_BEFORE_PASS. A pass over a long queue costs
                    // milliseconds and decides for every new job (a write each): one per
                    // handful of submissions held 10 000 of them to about 100 a second.
                    while began.elapsed() < BURST_BEFORE_PASS {
                        let more = ready(&mut inputs.requests);
                        if more.is_empty() {
                            break;
                        }
                        self.on_requests(more).await;
                    }
                }
                message = inputs.events.next() => {
                    self.on_event_message(message).await;
                    for message in ready(&mut inputs.events) {
                        self.on_event_message(message).await;
                    }
                }
                () = self.heartbeats.arrived() => self.take_heartbeats().await,
                // A scrape: counted between two inputs, nothing changes.
                Some(reply) = inputs.gauge_requests.recv() => {
                    let _ = reply.send(self.machine.gauges(now()));
                }
                // A `mgpu why`: read off the tables between two inputs, nothing changes.
                Some(ask) = inputs.why_asks.recv() => {
                    let _ = ask.reply.send(self.machine.explain(&ask.job, &ask.asker, now()));
                }
            };
            if self.machine.pass_due() && !self.stepped_down {
                self.pass().await;
            }
            if self.stepped_down {
                tracing::error!("lost the scheduler lease while stalled: no longer active");
                return;
            }
        }
    }

    /// Whether this replica may still write, acknowledge and send (waiting for the lease to
    /// be confirmed again after a stall); false once it is known lost, from then on.
    async fn lease_confirmed(&mut self) -> bool {
        if !self.stepped_down && !self.lease.confirmed().await {
            self.stepped_down = true;
        }
        !self.stepped_down
    }

    /// Handles the heartbeats waiting, each node's latest.
    async fn take_heartbeats(&mut self) {
        let (beats, superseded) = self.heartbeats.take();
        if superseded > 0 {
            tracing::debug!(
                superseded,
                "heartbeats replaced by newer ones before the loop took them"
            );
        }
        for (subject, payload) in beats {
            self.on_heartbeat(&subject, &payload).await;
        }
    }

    /// The liveness timer: the limits and principals files read again if they changed, what
    /// the machine needs to know of the streams asked, and the tick handed over.
    async fn tick(&mut self) {
        // Both clocks are read before the questions below, which may wait a second while NATS
        // cannot answer: the gap between two ticks must measure the loop, not that wait, and
        // a blind spot ends where the tick began (the node cut off with NATS is then found
        // offline by the first tick that sees NATS back, before its agent's reports come in).
        let monotonic = self.started.elapsed();
        let began = now();
        if self.limits.refresh() {
            let limits = self.limits.limits.clone();
            self.feed(Input::Limits(limits)).await;
        }
        self.gate.principals.refresh();
        let heartbeats_visible = self.heartbeat_stream_answers().await;
        // Asked only when NATS answers: while it does not, a second question would wait
        // another second, and the tick that sees NATS back would come that much later (the
        // node cut off with it must be found offline before its agent's reports come in).
        let reports_caught_up = heartbeats_visible && self.reports_caught_up().await;
        let tick = Tick {
            monotonic,
            heartbeats_visible,
            reports_caught_up,
        };
        self.feed_at(began, Input::Tick(tick)).await;
    }

    /// One scheduling pass: the machine decides, its commands are carried out.
    async fn pass(&mut self) {
        let began = Instant::now();
        let mut lap = || micros(began.elapsed());
        let (commands, mut sample, churn) = self.machine.pass(now(), &mut lap);
        self.stats.add_churn(churn);
        self.carry_out(commands).await;
        sample.changes = self.machine.take_pass_changes();
        let took = began.elapsed();
        sample.total_us = micros(took);
        self.metrics.tally().pass(took);
        let (jobs_queued, jobs_running, jobs_total) = self.machine.counts();
        let (nodes_known, nodes_online) = self.machine.node_counts(now());
        let counts = Counts {
            jobs_queued,
            jobs_running,
            jobs_total,
            nodes_known,
            nodes_online,
        };
        self.status.send_replace(self.stats.record(sample, counts));
        if self.stats.trim_due(Instant::now()) {
            give_back_memory();
        }
    }

    /// Hands `input` to the machine and carries out what it asks for, results fed back, until
    /// it asks for nothing more. Messages the machine did not acknowledge are left for
    /// JetStream to deliver again.
    async fn feed(&mut self, input: Input) {
        self.feed_at(now(), input).await;
    }

    /// [`Driver::feed`], as of `at`.
    async fn feed_at(&mut self, at: mgpu_protocol::Timestamp, input: Input) {
        let commands = self.machine.handle(at, input);
        self.carry_out(commands).await;
        // The principals file may have been read again by a lookup of the gate.
        let generation = self.gate.principals.generation();
        if generation != self.principals_seen {
            self.principals_seen = generation;
            let registry = self.gate.principals.registry().clone();
            let commands = self.machine.handle(now(), Input::Principals(registry));
            self.carry_out(commands).await;
        }
    }

    /// Holds a message the machine may ask to acknowledge; its token.
    fn hold(&mut self, message: jetstream::Message) -> Token {
        self.held.hold(message, 1)[0]
    }

    /// Whether every agent report stored so far was handled (none waits in the consumer and
    /// none is delivered but unacknowledged). False when that cannot be told.
    async fn reports_caught_up(&mut self) -> bool {
        let Some(consumer) = self.events_consumer.as_mut() else {
            return false;
        };
        match tokio::time::timeout(Duration::from_secs(1), consumer.info()).await {
            Ok(Ok(info)) => info.num_pending == 0 && info.num_ack_pending == 0,
            _ => false,
        }
    }

    /// Whether the heartbeat stream answers now (it does not while a NATS cluster elects its
    /// leader, and then heartbeats cannot be stored or seen).
    async fn heartbeat_stream_answers(&self) -> bool {
        matches!(
            tokio::time::timeout(
                Duration::from_secs(1),
                self.js.get_stream(subjects::NODES_STREAM)
            )
            .await,
            Ok(Ok(_))
        )
    }
}

/// Hands the heap memory freed since back to the operating system (glibc keeps it in its
/// arenas otherwise).
fn give_back_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator's own arenas; it reads no
    // pointer of ours and is thread-safe.
    unsafe {
        libc::malloc_trim(0);
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
                ack_wait: ACK_WAIT,
                max_ack_pending: 10_000,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| anyhow!("opening consumer {name}: {e}"))
}
