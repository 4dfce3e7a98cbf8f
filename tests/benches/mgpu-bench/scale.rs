//! Scenario 5, scale: a real nats-server and scheduler, a fleet of simulated nodes (1 000
//! nodes × 8 GPUs, all in this process) and 100 000 queued jobs.
//!
//! The jobs are submitted first; the fleet comes up once the scheduler recorded them all.
//! The simulated fleet ([`crate::fleet`]) does what agents do over the wire and nothing else:
//! each node publishes a heartbeat every 5 s (see [`HEARTBEAT_EVERY`](crate::fleet::HEARTBEAT_EVERY)) listing the jobs it
//! runs; assignments are read from the assignment stream, answered with a `started` report,
//! and after the job's simulated run time (20 to 40 s) with an `exited` report. So the
//! scheduler sees a full cluster with a steady trickle of ends, each of which triggers passes
//! over the whole waiting queue.
//!
//! Reported:
//! - `library_submit_rate`: 100 000 signed submissions published with a window of
//!   acknowledgements (as `submit_pipelined` does), from the first publish to the last
//!   acknowledgement; also how fast the scheduler recorded them.
//! - `scheduling_pass`: the scheduler's own timing of each pass (`mgpu.scheduler.status`
//!   `recent_passes`) during the steady window, with the queue at its full size.
//! - `scheduler_memory`: the scheduler's resident memory (VmRSS, and its peak VmHWM) at the end.

use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use mgpu_protocol::job::JobSpec;
use mgpu_tests::Cluster;
use serde_json::{Value, json};

use crate::common::*;
use crate::fleet::{Fleet, GPUS_PER_NODE};

struct Sizes {
    nodes: usize,
    jobs: usize,
    /// How long the full queue is watched after the scheduler recorded every job.
    steady: Duration,
}

impl Sizes {
    fn of(ctx: &Run) -> Sizes {
        if ctx.quick {
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
        }
    }
}

pub fn run(ctx: &Run) -> Result<()> {
    let sizes = Sizes::of(ctx);
    progress(&format!(
        "scale: {} simulated nodes x {GPUS_PER_NODE} GPUs, {} jobs",
        sizes.nodes, sizes.jobs
    ));
    let cluster = Cluster::start(&[]);
    let pid = *cluster
        .scheduler_pids()
        .first()
        .ok_or_else(|| anyhow!("no scheduler"))?;
    let measured = measure_on(&cluster, &sizes)?;
    let declared_offline = offline_warnings(&cluster);
    report_submit_rate(ctx, &sizes, &measured)?;
    report_passes(ctx, &sizes, &measured, declared_offline)?;
    report_memory(ctx, &sizes, pid)
}

/// Runs the asynchronous part against `cluster` and keeps the scheduler's log; on failure,
/// dumps the cluster's logs.
fn measure_on(cluster: &Cluster, sizes: &Sizes) -> Result<Measured> {
    let key = user_key(&cluster.user_creds("alice"))?;
    let admin_key = user_key(&cluster.admin_creds())?;
    // Two worker threads: the simulated fleet must keep heartbeating on time while it
    // answers thousands of assignments (one thread fell seconds behind).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let measured: Result<Measured> = runtime.block_on(async {
        let client = connect(cluster, &cluster.admin_creds()).await?;
        let heartbeat_client = connect(cluster, &cluster.admin_creds()).await?;
        measure(client, heartbeat_client, (key, admin_key), sizes).await
    });
    keep_log(cluster, "scheduler", "scale");
    if measured.is_err() {
        cluster.dump_logs();
    }
    measured
}

/// Reports `library_submit_rate`: the submissions' wall time, and the scheduler's intake.
fn report_submit_rate(ctx: &Run, sizes: &Sizes, measured: &Measured) -> Result<()> {
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
    Ok(())
}

/// How often the scheduler declared a node offline: the simulated fleet heartbeats on time
/// throughout (its own task, its own connection), so each is a healthy node wrongly taken
/// for dead, and its jobs requeued. It must be 0.
fn offline_warnings(cluster: &Cluster) -> usize {
    std::fs::read_to_string(cluster.log_path("scheduler"))
        .unwrap_or_default()
        .lines()
        .filter(|line| line.contains("node offline"))
        .count()
}

/// Reports `scheduling_pass`: the passes of the steady window, whole and by phase, and the
/// nodes declared offline over the whole run.
fn report_passes(
    ctx: &Run,
    sizes: &Sizes,
    measured: &Measured,
    declared_offline: usize,
) -> Result<()> {
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
            "nodes_declared_offline": declared_offline,
            "window_s": sizes.steady.as_secs(),
        }),
    );
    Ok(())
}

/// Reports `scheduler_memory`: the scheduler's resident memory now, and its peak.
fn report_memory(ctx: &Run, sizes: &Sizes, pid: u32) -> Result<()> {
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
    (key, admin_key): (nkeys::KeyPair, nkeys::KeyPair),
    sizes: &Sizes,
) -> Result<Measured> {
    let js = async_nats::jetstream::new(client.clone());
    let (submit_wall, recorded_after) = submit_all(&js, &client, &key, sizes).await?;
    // The fleet comes up once the queue is full: on two cores, 100 000 signed submissions
    // arriving at 20 000/s leave a thousand simulated agents and the scheduler too little CPU
    // to keep heartbeats on time (whole racks were declared offline), which says more about
    // the machine than about a pass.
    let fleet = Fleet::start(js.clone(), heartbeat_client, sizes.nodes, admin_key).await?;
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
    let passes = passes_since(&status, passes_before);
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

/// Submits every job as alice and waits for the scheduler to record them all; returns the
/// submissions' wall time and the time from the first publish until all were recorded.
async fn submit_all(
    js: &async_nats::jetstream::Context,
    client: &async_nats::Client,
    key: &nkeys::KeyPair,
    sizes: &Sizes,
) -> Result<(Duration, Duration)> {
    let specs: Vec<JobSpec> = (0..sizes.jobs)
        .map(|_| JobSpec::new(vec!["true".into()], "/tmp"))
        .collect();
    let (_, submit_wall) = submit_pipelined(js, key, "alice", specs, 1024).await?;
    progress(&format!(
        "  {} submitted in {:.1} s; waiting for the scheduler to record them",
        sizes.jobs,
        submit_wall.as_secs_f64()
    ));
    let status = wait_for_status(
        "every job recorded",
        Duration::from_secs(900),
        client,
        |s| s["jobs_total"].as_u64().unwrap_or(0) >= sizes.jobs as u64,
    )
    .await?;
    let recorded_after = submit_wall + status.1;
    progress(&format!(
        "  recorded {:.1} s after the first submit; starting the fleet",
        recorded_after.as_secs_f64()
    ));
    Ok((submit_wall, recorded_after))
}

/// The passes the scheduler made since its count was `passes_before`, newest first, from the
/// `recent_passes` of its status.
fn passes_since(status: &Value, passes_before: u64) -> Vec<Pass> {
    let passes_after = status["passes"].as_u64().unwrap_or(0);
    let recent = status["recent_passes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let in_window = usize::try_from(passes_after.saturating_sub(passes_before)).unwrap_or(0);
    recent
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
        .collect()
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
