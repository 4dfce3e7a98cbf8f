//! The node's heartbeat on `nodes.heartbeat.<node>`: GPUs, running jobs, address, and the
//! thresholds above which a GPU busy with others' work is not offered. Published at start,
//! every interval, soon after a job starts or ends (at most one per [`OUT_OF_TURN_GAP`]), and
//! a last time at shutdown.
//!
//! JetStream keeps the last one per node (stream `MGPU_NODES`), which exists only once the
//! scheduler or `mgpu admin setup` created the streams; until then failures are logged sparingly
//! and the agent carries on.

use std::sync::{Arc, Mutex, TryLockError};
use std::time::Duration;

use anyhow::{Context, anyhow};
use async_nats::jetstream::{self, context::PublishErrorKind};
use bytes::Bytes;
use mgpu_protocol::node::{GpuSource, GpuStatus, NodeHeartbeat};
use mgpu_protocol::subjects;
use tokio::sync::{Notify, watch};
use tokio::time::MissedTickBehavior;
use tracing::{info, warn};

use crate::fence::Contact;
use crate::gpu::GpuProbe;
use crate::gpu_peaks::{AttemptMemory, GpuPeaks, attempt_of_process, sum_by_attempt};
use crate::running::RunningTable;
use crate::shutdown::Signal;
use crate::throttle::{Throttle, Verdict};

/// How often an unchanged failure is logged again.
const REPEAT_WARNING_EVERY: Duration = Duration::from_secs(60);

/// The least time between a heartbeat and one sent out of turn. A job starting or ending asks
/// for one at once, so the scheduler and `mgpu nodes` see the GPUs it took or freed; in a burst
/// of short jobs that was two heartbeats per job, each stored, delivered and handled by the
/// scheduler (a tenth of all JetStream writes in the drain benchmark).
const OUT_OF_TURN_GAP: Duration = Duration::from_millis(100);

/// The facts about this agent that do not change while it runs.
pub struct Identity {
    pub node: String,
    pub address: String,
    pub runs_jobs_as: String,
    /// How jobs are contained here, in words (`cgroup.rs`).
    pub containment: Option<String>,
    /// Whether jobs here can open only their own GPUs.
    pub gpu_isolation: bool,
    /// The cores and host memory (MiB) the scheduler may hand out here.
    pub cpus: Option<u32>,
    pub mem_host_mib: Option<u64>,
    pub interval: Duration,
    pub thresholds: Thresholds,
    /// `--label` values, sent in every heartbeat.
    pub labels: std::collections::BTreeMap<String, String>,
    /// `--feature` values, sorted and each once, sent in every heartbeat.
    pub features: Vec<String>,
    /// `--fence-after`, announced so the scheduler knows when a silent node's jobs are dead.
    pub fence_after: Option<Duration>,
    pub kill_grace: Duration,
}

/// When a GPU busy with work mgpu did not start stops being offered (`--mem-threshold`,
/// `--load-threshold`): shares of 0.0..=1.0. The agent only announces them; the scheduler,
/// which sees every node's GPUs, applies them when placing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Thresholds {
    pub mem: f64,
    pub load: f64,
}

/// One GPU sample with what the jobs' idleness is measured from.
struct Sampled {
    gpus: Vec<GpuStatus>,
    /// When it was taken.
    at: std::time::Instant,
    /// Each attempt's processes' memory per GPU.
    own: AttemptMemory,
    /// The GPUs whose processes the probe could list.
    listed_gpus: Vec<u32>,
}

pub struct Heartbeater {
    js: jetstream::Context,
    identity: Identity,
    /// Behind a mutex because sampling runs on a blocking thread.
    probe: Arc<Mutex<Box<dyn GpuProbe>>>,
    source: GpuSource,
    note: Option<String>,
    table: RunningTable,
    /// Told of every stored heartbeat, for self-fencing.
    contact: Contact,
    /// Where each sample's GPU processes are added to their jobs' peak GPU memory. Each
    /// sample also updates the jobs' idleness in `table`, so idleness is measured at the
    /// heartbeat interval.
    peaks: GpuPeaks,
    /// The last GPU sample, reused when a new one cannot be taken.
    last_gpus: Vec<GpuStatus>,
    /// Each new sample, for the metrics endpoint (which then never samples itself).
    readings: watch::Sender<Vec<GpuStatus>>,
    publish_failures: Throttle,
    sample_failures: Throttle,
}

impl Heartbeater {
    pub fn new(
        js: jetstream::Context,
        identity: Identity,
        probe: Box<dyn GpuProbe>,
        table: RunningTable,
        contact: Contact,
        peaks: GpuPeaks,
    ) -> Self {
        let source = probe.source();
        let note = probe.note();
        Heartbeater {
            js,
            identity,
            probe: Arc::new(Mutex::new(probe)),
            source,
            note,
            table,
            contact,
            peaks,
            last_gpus: Vec::new(),
            readings: watch::channel(Vec::new()).0,
            publish_failures: Throttle::new(REPEAT_WARNING_EVERY),
            sample_failures: Throttle::new(REPEAT_WARNING_EVERY),
        }
    }

    /// The GPUs as the latest heartbeat sampled them, updated at each heartbeat.
    pub fn readings(&self) -> watch::Receiver<Vec<GpuStatus>> {
        self.readings.subscribe()
    }

    /// Heartbeats until `stop` fires, then sends a last one. `now` asks for one out of turn.
    pub async fn run(mut self, now: Arc<Notify>, stop: Signal) {
        let mut ticker = tokio::time::interval(self.identity.interval);
        // After a stall (a slow ack), carry on at the normal pace rather than in a burst.
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut last_beat = tokio::time::Instant::now();
        loop {
            tokio::select! {
                biased;
                () = stop.fired() => break,
                // The first tick is immediate: the scheduler hears of the node at once.
                _ = ticker.tick() => {}
                () = now.notified() => {
                    // At most one heartbeat per gap, however many jobs start or end.
                    tokio::select! {
                        biased;
                        () = stop.fired() => break,
                        () = tokio::time::sleep_until(last_beat + OUT_OF_TURN_GAP) => {}
                    }
                    ticker.reset();
                }
            }
            self.beat().await;
            last_beat = tokio::time::Instant::now();
        }
        self.beat().await;
    }

    async fn beat(&mut self) {
        // The scheduler's offline timer counts from the heartbeat's `sent_at`: so does the fence.
        let taken = tokio::time::Instant::now();
        let job_pgids = self.table.process_groups();
        match self.sample(job_pgids).await {
            Ok(Sampled {
                gpus,
                at,
                own,
                listed_gpus,
            }) => {
                if self.sample_failures.success() {
                    info!("reading GPUs works again");
                }
                self.table.record_idle(at, &gpus, &own, &listed_gpus);
                self.last_gpus = gpus;
                self.readings.send_replace(self.last_gpus.clone());
            }
            Err(err) => {
                if let Verdict::Log { suppressed } =
                    self.sample_failures.failure(&format!("{err:#}"))
                {
                    warn!(
                        suppressed,
                        "cannot read the GPUs, reporting the last known state: {err:#}"
                    );
                }
            }
        }
        let heartbeat = NodeHeartbeat {
            node: self.identity.node.clone(),
            sent_at: mgpu_protocol::now(),
            interval_ms: u64::try_from(self.identity.interval.as_millis()).unwrap_or(u64::MAX),
            gpu_source: self.source,
            gpu_note: self.note.clone(),
            gpus: self.last_gpus.clone(),
            running: self.table.snapshot(),
            address: self.identity.address.clone(),
            runs_jobs_as: self.identity.runs_jobs_as.clone(),
            containment: self.identity.containment.clone(),
            gpu_isolation: self.identity.gpu_isolation,
            cpus: self.identity.cpus,
            mem_host_mib: self.identity.mem_host_mib,
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
            protocol: mgpu_protocol::version::BASELINE,
            mem_threshold: self.identity.thresholds.mem,
            load_threshold: self.identity.thresholds.load,
            labels: self.identity.labels.clone(),
            fence_after_ms: self
                .identity
                .fence_after
                .map(|f| u64::try_from(f.as_millis()).unwrap_or(u64::MAX)),
            kill_grace_ms: u64::try_from(self.identity.kill_grace.as_millis()).unwrap_or(u64::MAX),
            features: self.identity.features.clone(),
        };
        match self.publish(&heartbeat).await {
            Ok(()) => {
                self.contact.stored(taken);
                if self.publish_failures.success() {
                    info!("heartbeats are stored again");
                }
            }
            Err(err) => {
                if let Verdict::Log { suppressed } =
                    self.publish_failures.failure(&format!("{err:#}"))
                {
                    warn!(suppressed, "heartbeat not stored: {err:#}");
                }
            }
        }
    }

    /// Samples the GPUs on a blocking thread (NVML calls into the driver), bounded in time so
    /// a stuck driver delays no heartbeat.
    async fn sample(&self, job_pgids: Vec<u32>) -> anyhow::Result<Sampled> {
        let probe = Arc::clone(&self.probe);
        let peaks = self.peaks.clone();
        let groups = self.table.attempt_groups();
        let task = tokio::task::spawn_blocking(move || {
            let mut probe = match probe.try_lock() {
                Ok(probe) => probe,
                // A panic in an earlier sample leaves the probe usable.
                Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
                Err(TryLockError::WouldBlock) => {
                    return Err(anyhow!("the previous GPU sample has not finished"));
                }
            };
            let mut gpus = probe.sample(&job_pgids)?;
            let at = std::time::Instant::now();
            let own = sum_by_attempt(&probe.processes(), |pid| attempt_of_process(pid, &groups));
            peaks.record(&own);
            // From /proc and passwd (NSS may ask a server): blocking work, done here too, and
            // after `at` so a slow lookup does not skew when the sample was taken.
            crate::process_owner::name_foreign_owners(&mut gpus);
            Ok(Sampled {
                gpus,
                at,
                own,
                listed_gpus: probe.listed_gpus(),
            })
        });
        let limit = self.identity.interval.max(Duration::from_secs(2));
        tokio::time::timeout(limit, task)
            .await
            .map_err(|_| anyhow!("sampling the GPUs took longer than {limit:?}"))?
            .context("the GPU sampling task failed")?
    }

    async fn publish(&self, heartbeat: &NodeHeartbeat) -> anyhow::Result<()> {
        let payload = Bytes::from(serde_json::to_vec(heartbeat).context("encoding the heartbeat")?);
        let subject = subjects::heartbeat(&self.identity.node);
        let ack_limit = self
            .identity
            .interval
            .clamp(Duration::from_secs(1), Duration::from_secs(5));
        let ack = self
            .js
            .publish(subject, payload)
            .await
            .context("publishing the heartbeat")?;
        let stored = tokio::time::timeout(ack_limit, ack.into_future())
            .await
            .map_err(|_| anyhow!("no acknowledgement within {ack_limit:?}"))?;
        match stored {
            Ok(_) => {}
            Err(err) if err.kind() == PublishErrorKind::StreamNotFound => {
                return Err(anyhow!(
                    "stream {} does not exist yet (start mgpu-scheduler or run `mgpu admin setup`)",
                    subjects::NODES_STREAM
                ));
            }
            Err(err) => return Err(anyhow!(err).context("JetStream refused it")),
        }
        Ok(())
    }
}
