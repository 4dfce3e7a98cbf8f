//! The simulated fleet of the `scale` scenario (see [`crate::scale`]): many nodes in this
//! process, doing over the wire what agents do and nothing else. Each node publishes a
//! heartbeat every [`HEARTBEAT_EVERY`] listing the jobs it runs; assignments are read from the
//! assignment stream, answered with a `started` report, and after the job's simulated run time
//! (20 to 40 s) with an `exited` report; kills are answered with an `exited` report at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Result, anyhow};
use futures::StreamExt;
use mgpu_protocol::assign::{Assignment, NodeControl};
use mgpu_protocol::event::{EventSource, JobEvent, JobEventKind};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::node::{GpuSource, GpuStatus, NodeHeartbeat, RunningJob};
use mgpu_protocol::subjects;

use crate::common::progress;

/// GPUs of each simulated node.
pub const GPUS_PER_NODE: u32 = 8;
/// The simulated agents' `--heartbeat-interval`: 5 s, as a 1 000-node site would set it (the
/// default 2 s is for small clusters; Slurm's nodes answer every 30 s and are declared down
/// after 300). At 2 s, 500 heartbeats a second on this 2-core machine, next to the scheduler
/// and nats-server, arrived so late that whole racks were declared offline.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);

/// The key every simulated node's report is signed with (set by [`Fleet::start`]).
static SIGNER: std::sync::OnceLock<nkeys::KeyPair> = std::sync::OnceLock::new();

/// The jobs each simulated node runs, by node name.
type Running = Arc<Mutex<HashMap<String, Vec<RunningJob>>>>;

/// The simulated nodes: what each runs, shared by the heartbeat and assignment tasks.
pub struct Fleet {
    running: Running,
    ended: Arc<std::sync::atomic::AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Fleet {
    /// `signer`: the admin key the simulated nodes sign their reports with (the scheduler
    /// takes a report only from the node it names, or from an admin).
    pub async fn start(
        js: async_nats::jetstream::Context,
        heartbeat_client: async_nats::Client,
        nodes: usize,
        signer: nkeys::KeyPair,
    ) -> Result<Fleet> {
        // One fleet per process; a second start keeps the first key, which is the same admin's.
        let _ = SIGNER.set(signer);
        let names: Vec<String> = (1..=nodes).map(|i| format!("sim{i:04}")).collect();
        let running: Running = Arc::new(Mutex::new(
            names.iter().map(|n| (n.clone(), Vec::new())).collect(),
        ));
        let ended = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut tasks = Vec::new();
        tasks.push(tokio::spawn(heartbeats(
            heartbeat_client,
            names,
            running.clone(),
        )));
        let stream = js
            .get_stream(subjects::ASSIGN_STREAM)
            .await
            .map_err(|e| anyhow!("opening the assignment stream: {e}"))?;
        // Assignments and controls (kills), like each agent's consumer but for every node.
        let consumer = stream
            .create_consumer(async_nats::jetstream::consumer::pull::Config {
                ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
                max_ack_pending: 100_000,
                ..Default::default()
            })
            .await
            .map_err(|e| anyhow!("consuming assignments: {e}"))?;
        let messages = consumer
            .messages()
            .await
            .map_err(|e| anyhow!("consuming assignments: {e}"))?;
        tasks.push(tokio::spawn(run_assignments(
            js,
            messages,
            running.clone(),
            ended.clone(),
        )));
        Ok(Fleet {
            running,
            ended,
            tasks,
        })
    }

    pub fn ended(&self) -> u64 {
        self.ended.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn stop(self) {
        for task in &self.tasks {
            task.abort();
        }
        drop(self.running);
    }
}

/// Every node heartbeats once per [`HEARTBEAT_EVERY`], spread evenly over the interval like
/// independent agents would, on a connection of its own.
async fn heartbeats(client: async_nats::Client, names: Vec<String>, running: Running) {
    let slots = 20usize;
    let per_slot = names.len().div_ceil(slots);
    let mut tick = tokio::time::interval(HEARTBEAT_EVERY / slots as u32);
    let mut slot = 0usize;
    loop {
        tick.tick().await;
        for name in names.iter().skip(slot * per_slot).take(per_slot) {
            let jobs = running
                .lock()
                .map(|r| r.get(name).cloned().unwrap_or_default())
                .unwrap_or_default();
            let beat = heartbeat(name, jobs);
            let Ok(payload) = serde_json::to_vec(&beat) else {
                continue;
            };
            // Plain publishes (the heartbeat stream stores them all the same): JetStream
            // publishes share a budget of unacknowledged messages with the thousands of
            // reports below, and heartbeats waiting for it made whole racks look dead.
            let _ = client
                .publish(subjects::heartbeat(name), payload.into())
                .await;
        }
        slot = (slot + 1) % slots;
    }
}

fn heartbeat(name: &str, running: Vec<RunningJob>) -> NodeHeartbeat {
    NodeHeartbeat {
        node: name.to_owned(),
        sent_at: mgpu_protocol::now(),
        interval_ms: HEARTBEAT_EVERY.as_millis() as u64,
        gpu_source: GpuSource::Declared,
        gpu_note: None,
        gpus: (0..GPUS_PER_NODE)
            .map(|index| GpuStatus {
                index,
                uuid: format!("GPU-{name}-{index}"),
                name: "Simulated GPU".into(),
                memory_total_mib: 81_920,
                memory_used_mib: 0,
                utilization_pct: 0,
                temperature_c: None,
                power_w: None,
                foreign_processes: Vec::new(),
                gpu_type: None,
            })
            .collect(),
        running,
        address: name.to_owned(),
        runs_jobs_as: "nobody".into(),
        containment: None,
        agent_version: "bench".into(),
        protocol: mgpu_protocol::version::PROTOCOL,
        mem_threshold: mgpu_protocol::node::DEFAULT_THRESHOLD,
        load_threshold: mgpu_protocol::node::DEFAULT_THRESHOLD,
        fence_after_ms: None,
        kill_grace_ms: 0,
        labels: Default::default(),
        gpu_isolation: false,
        cpus: None,
        mem_host_mib: None,
        features: Vec::new(),
    }
}

/// Answers each assignment like an agent: `started` at once, `exited 0` after the job's run time.
async fn run_assignments(
    js: async_nats::jetstream::Context,
    mut messages: async_nats::jetstream::consumer::pull::Stream,
    running: Running,
    ended: Arc<std::sync::atomic::AtomicU64>,
) {
    let mut count: u64 = 0;
    while let Some(Ok(message)) = messages.next().await {
        let Some(node) = subjects::node_of(message.subject.as_str()).map(str::to_owned) else {
            continue;
        };
        // The assignment stream is a work queue: an acknowledged assignment is gone, as it is
        // once a real agent has taken it.
        let _ = message.ack().await;
        if message.subject.starts_with("nodes.control.") {
            control(&js, &node, &running, &message.payload).await;
            continue;
        }
        let Ok(assignment) = serde_json::from_slice::<Assignment>(&message.payload) else {
            continue;
        };
        count += 1;
        let pid = 10_000 + (count % 50_000) as u32;
        let job = RunningJob {
            id: assignment.job_id.clone(),
            attempt: assignment.attempt,
            pid,
            idle: None,
        };
        if let Ok(mut r) = running.lock() {
            r.entry(node.clone()).or_default().push(job);
        }
        // 20 to 40 s, spread by a cheap hash of the count.
        let run_for = Duration::from_millis(20_000 + (count.wrapping_mul(7919) % 20_000));
        tokio::spawn(run_job(
            js.clone(),
            node,
            assignment,
            pid,
            run_for,
            running.clone(),
            ended.clone(),
        ));
    }
}

/// A control message for `node`: a kill stops the simulated job it names.
async fn control(
    js: &async_nats::jetstream::Context,
    node: &str,
    running: &Running,
    payload: &[u8],
) {
    if let Ok(NodeControl::Kill {
        job_id,
        attempt,
        requeue,
        ..
    }) = serde_json::from_slice::<NodeControl>(payload)
    {
        kill(js, node, running, job_id, attempt, requeue).await;
    }
}

/// One simulated job's life: `started` now, `exited 0` after `run_for` unless it was killed
/// meanwhile; then it leaves its node's running jobs and counts as ended.
async fn run_job(
    js: async_nats::jetstream::Context,
    node: String,
    assignment: Assignment,
    pid: u32,
    run_for: Duration,
    running: Running,
    ended: Arc<std::sync::atomic::AtomicU64>,
) {
    report(
        &js,
        &node,
        &assignment.job_id,
        assignment.attempt,
        JobEventKind::Started { pid },
    )
    .await;
    tokio::time::sleep(run_for).await;
    let still_running = running.lock().is_ok_and(|r| {
        r.get(&node).is_some_and(|jobs| {
            jobs.iter()
                .any(|j| j.id == assignment.job_id && j.attempt == assignment.attempt)
        })
    });
    if !still_running {
        return; // killed meanwhile
    }
    report(
        &js,
        &node,
        &assignment.job_id,
        assignment.attempt,
        JobEventKind::Exited {
            exit_code: 0,
            signal: None,
            cancelled: false,
            timed_out: false,
            preempted: false,
            lost: false,
            out_of_memory: false,
            usage: None,
        },
    )
    .await;
    if let Ok(mut r) = running.lock()
        && let Some(jobs) = r.get_mut(&node)
    {
        jobs.retain(|j| j.id != assignment.job_id || j.attempt != assignment.attempt);
    }
    ended.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Stops a simulated job on request, reporting it as an agent would.
async fn kill(
    js: &async_nats::jetstream::Context,
    node: &str,
    running: &Running,
    job_id: JobId,
    attempt: u32,
    requeue: bool,
) {
    let was_running = running.lock().is_ok_and(|mut r| {
        r.get_mut(node).is_some_and(|jobs| {
            let before = jobs.len();
            jobs.retain(|j| j.id != job_id || j.attempt != attempt);
            jobs.len() < before
        })
    });
    if was_running {
        let kind = JobEventKind::Exited {
            exit_code: 143,
            signal: Some(15),
            cancelled: !requeue,
            timed_out: false,
            preempted: requeue,
            lost: false,
            out_of_memory: false,
            usage: None,
        };
        report(js, node, &job_id, attempt, kind).await;
    }
}

async fn report(
    js: &async_nats::jetstream::Context,
    node: &str,
    job_id: &JobId,
    attempt: u32,
    kind: JobEventKind,
) {
    let event = JobEvent {
        job_id: job_id.clone(),
        attempt,
        at: mgpu_protocol::now(),
        source: EventSource::Node(node.to_owned()),
        kind,
    };
    let Ok(payload) = serde_json::to_vec(&event) else {
        return;
    };
    let subject = subjects::events(job_id);
    let mut headers = async_nats::HeaderMap::new();
    if let Some(signer) = SIGNER.get() {
        let signed = mgpu_nats::signing::sign(
            signer,
            &subject,
            &payload,
            mgpu_protocol::now(),
            &mut headers,
        );
        if let Err(err) = signed {
            progress(&format!("  cannot sign a report: {err}"));
            return;
        }
    }
    match js
        .publish_with_headers(subject, headers, payload.into())
        .await
    {
        Ok(ack) => {
            if let Err(err) = ack.await {
                progress(&format!("  a report was not stored: {err}"));
            }
        }
        Err(err) => progress(&format!("  publishing a report: {err}")),
    }
}
