//! Scenario 5, scale: a real nats-server and scheduler, a fleet of simulated nodes (1 000
//! nodes × 8 GPUs, all in this process) and 100 000 queued jobs.
//!
//! The jobs are submitted first; the fleet comes up once the scheduler recorded them all.
//! The simulated fleet does what agents do over the wire and nothing else: each node publishes
//! a heartbeat every 5 s (see [`HEARTBEAT_EVERY`]) listing the jobs it runs; assignments are read
//! from the assignment stream, answered with a `started` report, and after the job's simulated
//! run time (20 to 40 s) with an `exited` report. So the scheduler sees a full cluster with a
//! steady trickle of ends, each of which triggers passes over the whole waiting queue.
//!
//! Reported:
//! - `library_submit_rate`: 100 000 signed submissions published with a window of
//!   acknowledgements (as `submit_pipelined` does), from the first publish to the last
//!   acknowledgement; also how fast the scheduler recorded them.
//! - `scheduling_pass`: the scheduler's own timing of each pass (`mgpu.scheduler.status`
//!   `recent_passes`) during the steady window, with the queue at its full size.
//! - `scheduler_memory`: the scheduler's resident memory (VmRSS, and its peak VmHWM) at the end.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use futures::StreamExt;
use mgpu_protocol::assign::{Assignment, NodeControl};
use mgpu_protocol::event::{EventSource, JobEvent, JobEventKind};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::JobSpec;
use mgpu_protocol::node::{GpuSource, GpuStatus, NodeHeartbeat, RunningJob};
use mgpu_protocol::subjects;
use mgpu_tests::Cluster;
use serde_json::json;

use crate::common::*;

const GPUS_PER_NODE: u32 = 8;
/// The simulated agents' `--heartbeat-interval`: 5 s, as a 1 000-node site would set it (the
/// default 2 s is for small clusters; Slurm's nodes answer every 30 s and are declared down
/// after 300). At 2 s, 500 heartbeats a second on this 2-core machine, next to the scheduler
/// and nats-server, arrived so late that whole racks were declared offline.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);

struct Sizes {
    nodes: usize,
    jobs: usize,
    /// How long the full queue is watched after the scheduler recorded every job.
    steady: Duration,
}

pub fn run(ctx: &Run) -> Result<()> {
    let sizes = if ctx.quick {
        Sizes {
            nodes: 200,
            jobs: 20_000,
            steady: Duration::from_secs(20),
        }
    } else {
        Sizes {
            nodes: 1000,
            jobs: 100_000,
            steady: Duration::from_secs(60),
        }
    };
    progress(&format!(
        "scale: {} simulated nodes x {GPUS_PER_NODE} GPUs, {} jobs",
        sizes.nodes, sizes.jobs
    ));
    let cluster = Cluster::start(&[]);
    let pid = *cluster
        .scheduler_pids()
        .first()
        .ok_or_else(|| anyhow!("no scheduler"))?;
    let key = user_key(&cluster.user_creds("alice"))?;
    // Two worker threads: the simulated fleet must keep heartbeating on time while it
    // answers thousands of assignments (one thread fell seconds behind).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let measured: Result<Measured> = runtime.block_on(async {
        let client = connect(&cluster, &cluster.admin_creds()).await?;
        let heartbeat_client = connect(&cluster, &cluster.admin_creds()).await?;
        measure(client, heartbeat_client, key, &sizes).await
    });
    keep_log(&cluster, "scheduler", "scale");
    let measured = match measured {
        Ok(m) => m,
        Err(err) => {
            cluster.dump_logs();
            return Err(err);
        }
    };

    let per_job_ms: Vec<f64> =
        vec![measured.submit_wall.as_secs_f64() * 1000.0 / sizes.jobs as f64];
    let rate = sizes.jobs as f64 / measured.submit_wall.as_secs_f64();
    ctx.report(
        "library_submit_rate",
        rate,
        "jobs/s",
        Target::AtLeast(5000.0),
        true,
        None,
        &summarize(&per_job_ms)?,
        "ms per job over the whole run",
        json!({
            "jobs": sizes.jobs,
            "wall_s": round3(measured.submit_wall.as_secs_f64()),
            "recorded_by_scheduler_s": round3(measured.recorded_after.as_secs_f64()),
            "scheduler_intake_jobs_per_s": round3(sizes.jobs as f64 / measured.recorded_after.as_secs_f64()),
        }),
    );

    let passes = &measured.passes;
    let total: Vec<f64> = passes.iter().map(|p| p.total_ms).collect();
    let plan: Vec<f64> = passes.iter().map(|p| p.plan_ms).collect();
    let view: Vec<f64> = passes.iter().map(|p| p.view_ms).collect();
    let summary = summarize(&total)?;
    let plan_summary = summarize(&plan)?;
    let view_summary = summarize(&view)?;
    let queued: Vec<f64> = passes.iter().map(|p| p.queued as f64).collect();
    let queued = summarize(&queued)?;
    ctx.report(
        "scheduling_pass",
        summary.median,
        "ms",
        Target::AtMost(50.0),
        true,
        Some("median <= 50 ms".into()),
        &summary,
        "ms per pass (whole pass, writes included)",
        json!({
            "nodes": sizes.nodes,
            "gpus": sizes.nodes * GPUS_PER_NODE as usize,
            "jobs": sizes.jobs,
            "queued_min": queued.min,
            "queued_max": queued.max,
            "running_at_end": passes.last().map(|p| p.running).unwrap_or(0),
            "plan_ms": {"median": round3(plan_summary.median), "p99": round3(plan_summary.p99), "max": round3(plan_summary.max)},
            "view_ms": {"median": round3(view_summary.median), "p99": round3(view_summary.p99), "max": round3(view_summary.max)},
            "jobs_ended_in_window": measured.ended_in_window,
            "window_s": sizes.steady.as_secs(),
        }),
    );

    let (rss, peak) = memory_of(pid)?;
    let rss_mb = rss as f64 / 1024.0;
    let one = summarize(&[rss_mb])?;
    ctx.report(
        "scheduler_memory",
        rss_mb,
        "MiB",
        Target::AtMost(300.0),
        true,
        None,
        &one,
        "MiB resident at the end",
        json!({
            "peak_mib": round3(peak as f64 / 1024.0),
            "jobs": sizes.jobs,
            "nodes": sizes.nodes,
        }),
    );
    Ok(())
}

/// What the asynchronous part measured.
struct Measured {
    submit_wall: Duration,
    /// From the first publish until the scheduler had recorded every job.
    recorded_after: Duration,
    passes: Vec<Pass>,
    ended_in_window: u64,
}

struct Pass {
    queued: usize,
    running: usize,
    view_ms: f64,
    plan_ms: f64,
    total_ms: f64,
}

async fn measure(
    client: async_nats::Client,
    heartbeat_client: async_nats::Client,
    key: nkeys::KeyPair,
    sizes: &Sizes,
) -> Result<Measured> {
    let js = async_nats::jetstream::new(client.clone());
    let specs: Vec<JobSpec> = (0..sizes.jobs)
        .map(|_| JobSpec::new(vec!["true".into()], "/tmp"))
        .collect();
    let (_, submit_wall) = submit_pipelined(&js, &key, "alice", specs, 1024).await?;
    progress(&format!(
        "  {} submitted in {:.1} s; waiting for the scheduler to record them",
        sizes.jobs,
        submit_wall.as_secs_f64()
    ));
    let status = wait_for_status(
        "every job recorded",
        Duration::from_secs(900),
        &client,
        |s| s["jobs_total"].as_u64().unwrap_or(0) >= sizes.jobs as u64,
    )
    .await?;
    let recorded_after = submit_wall + status.1;
    progress(&format!(
        "  recorded {:.1} s after the first submit; starting the fleet",
        recorded_after.as_secs_f64()
    ));
    // The fleet comes up once the queue is full: on two cores, 100 000 signed submissions
    // arriving at 20 000/s leave a thousand simulated agents and the scheduler too little CPU
    // to keep heartbeats on time (whole racks were declared offline), which says more about
    // the machine than about a pass.
    let fleet = Fleet::start(js.clone(), heartbeat_client, sizes.nodes).await?;
    let (status, _) = wait_for_status(
        "every simulated node online and the GPUs busy",
        Duration::from_secs(120),
        &client,
        |s| {
            s["nodes_online"].as_u64() == Some(sizes.nodes as u64)
                && s["jobs_running"].as_u64() == Some(sizes.nodes as u64 * GPUS_PER_NODE as u64)
        },
    )
    .await?;
    let passes_before = status["passes"].as_u64().unwrap_or(0);
    let ended_before = fleet.ended();
    progress(&format!(
        "  {} nodes online, every GPU busy; watching {} s",
        sizes.nodes,
        sizes.steady.as_secs()
    ));
    tokio::time::sleep(sizes.steady).await;
    let (status, _) =
        wait_for_status("the status", Duration::from_secs(10), &client, |_| true).await?;
    let passes_after = status["passes"].as_u64().unwrap_or(0);
    let recent = status["recent_passes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let in_window = usize::try_from(passes_after.saturating_sub(passes_before)).unwrap_or(0);
    let passes: Vec<Pass> = recent
        .iter()
        .rev()
        .take(in_window)
        .map(|p| Pass {
            queued: p["queued"].as_u64().unwrap_or(0) as usize,
            running: p["running"].as_u64().unwrap_or(0) as usize,
            view_ms: p["view_us"].as_f64().unwrap_or(0.0) / 1000.0,
            plan_ms: p["plan_us"].as_f64().unwrap_or(0.0) / 1000.0,
            total_ms: p["total_us"].as_f64().unwrap_or(0.0) / 1000.0,
        })
        .collect();
    if passes.is_empty() {
        bail!("the scheduler made no pass in the steady window");
    }
    let ended_in_window = fleet.ended() - ended_before;
    fleet.stop();
    Ok(Measured {
        submit_wall,
        recorded_after,
        passes,
        ended_in_window,
    })
}

/// VmRSS and VmHWM of a process, in KiB.
fn memory_of(pid: u32) -> Result<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| anyhow!("no {name} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// The simulated nodes: what each runs, shared by the heartbeat and assignment tasks.
struct Fleet {
    running: Arc<Mutex<HashMap<String, Vec<RunningJob>>>>,
    ended: Arc<std::sync::atomic::AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Fleet {
    async fn start(
        js: async_nats::jetstream::Context,
        heartbeat_client: async_nats::Client,
        nodes: usize,
    ) -> Result<Fleet> {
        let names: Vec<String> = (1..=nodes).map(|i| format!("sim{i:04}")).collect();
        let running: Arc<Mutex<HashMap<String, Vec<RunningJob>>>> = Arc::new(Mutex::new(
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

    fn ended(&self) -> u64 {
        self.ended.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn stop(self) {
        for task in &self.tasks {
            task.abort();
        }
        drop(self.running);
    }
}

/// Every node heartbeats once per [`HEARTBEAT_EVERY`], spread evenly over the interval like
/// independent agents would, on a connection of its own.
async fn heartbeats(
    client: async_nats::Client,
    names: Vec<String>,
    running: Arc<Mutex<HashMap<String, Vec<RunningJob>>>>,
) {
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
                foreign_processes: Vec::new(),
            })
            .collect(),
        running,
        address: name.to_owned(),
        runs_jobs_as: "nobody".into(),
        agent_version: "bench".into(),
        mem_threshold: mgpu_protocol::node::DEFAULT_THRESHOLD,
        load_threshold: mgpu_protocol::node::DEFAULT_THRESHOLD,
        fence_after_ms: None,
        kill_grace_ms: 0,
        labels: Default::default(),
    }
}

/// Answers each assignment like an agent: `started` at once, `exited 0` after the job's run time.
async fn run_assignments(
    js: async_nats::jetstream::Context,
    mut messages: async_nats::jetstream::consumer::pull::Stream,
    running: Arc<Mutex<HashMap<String, Vec<RunningJob>>>>,
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
            if let Ok(NodeControl::Kill {
                job_id,
                attempt,
                requeue,
                ..
            }) = serde_json::from_slice::<NodeControl>(&message.payload)
            {
                kill(&js, &node, &running, job_id, attempt, requeue).await;
            }
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
        };
        if let Ok(mut r) = running.lock() {
            r.entry(node.clone()).or_default().push(job);
        }
        // 20 to 40 s, spread by a cheap hash of the count.
        let run_for = Duration::from_millis(20_000 + (count.wrapping_mul(7919) % 20_000));
        let js = js.clone();
        let running = running.clone();
        let ended = ended.clone();
        tokio::spawn(async move {
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
                },
            )
            .await;
            if let Ok(mut r) = running.lock()
                && let Some(jobs) = r.get_mut(&node)
            {
                jobs.retain(|j| j.id != assignment.job_id || j.attempt != assignment.attempt);
            }
            ended.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
    }
}

/// Stops a simulated job on request, reporting it as an agent would.
async fn kill(
    js: &async_nats::jetstream::Context,
    node: &str,
    running: &Arc<Mutex<HashMap<String, Vec<RunningJob>>>>,
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
    match js.publish(subjects::events(job_id), payload.into()).await {
        Ok(ack) => {
            if let Err(err) = ack.await {
                progress(&format!("  a report was not stored: {err}"));
            }
        }
        Err(err) => progress(&format!("  publishing a report: {err}")),
    }
}
