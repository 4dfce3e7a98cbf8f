//! Scenario 10, web: the dashboard in Debian's Chromium with the fleet of `top` (1 000 nodes ×
//! 8 GPUs, some drained or paused; 6 000 jobs running and 10 000 queued) written straight into a real
//! nats-server's buckets and heartbeat stream as admin (no scheduler, no agents), heartbeats
//! republished every 5 s per node (200 a second) while the page is watched, and one running
//! job printing 10 000 lines a second into its output stream. `mgpu web` serves the page;
//! `services/web/test/browser/bench.mjs` drives the browser and measures: sign-in to every
//! tile drawn, each redraw while heartbeats arrive, the queue drawn, and the tab's JavaScript
//! heap after following the busy output for 10 minutes (1 with --quick).

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use async_nats::HeaderMap;
use mgpu_protocol::subjects;
use mgpu_tests::web::WebServer;
use mgpu_tests::{Cluster, repo_root};
use serde_json::{Value, json};

use crate::common::*;
use crate::top::{GPUS, NODES, RUNNING, heartbeat, job, marks, node_name};

/// Jobs waiting, besides the RUNNING ones: the 10 000 queued jobs.
const QUEUED: usize = 10_000;
/// Every record written: the running jobs first, then the queued ones (`top::job` makes job
/// `n` running below RUNNING, queued from there on).
const JOBS: usize = RUNNING + QUEUED;

/// Lines a second the busy job prints, in chunks of this many lines.
const LINES_PER_SECOND: u64 = 10_000;
const LINES_PER_CHUNK: u64 = 200;

pub fn run(ctx: &Run) -> Result<()> {
    let output_seconds = if ctx.quick { 60 } else { 600 };
    progress(&format!(
        "web: {NODES} nodes × {GPUS} GPUs, {RUNNING} jobs running and {QUEUED} queued, output at {LINES_PER_SECOND} lines/s for {output_seconds} s"
    ));
    let cluster = Cluster::server_only(&[]);
    let admin = cluster.admin_creds();
    let setup = cluster.mgpu_with(&admin, &["admin", "setup"], None);
    if !setup.status.success() {
        bail!(
            "mgpu admin setup: {}",
            String::from_utf8_lossy(&setup.stderr)
        );
    }
    let busy_job = write_fleet(&cluster)?;
    let running = Arc::new(AtomicBool::new(true));
    progress("  heartbeats (200 a second) and the busy output start; Chromium measures");
    let traffic = start_traffic(&cluster, &busy_job, Arc::clone(&running))?;
    let web = WebServer::start(
        &cluster,
        &format!("ws://127.0.0.1:{}", cluster.websocket_port),
    );
    let measured = run_browser(&cluster, &web, &busy_job, output_seconds);
    running.store(false, Ordering::SeqCst);
    let _ = traffic.join();
    report(ctx, &measured?)
}

/// Every job record, node mark and a first heartbeat of each node; the id of the job whose
/// output is busy (a running one).
fn write_fleet(cluster: &Cluster) -> Result<String> {
    let now = mgpu_protocol::now();
    let jobs: Vec<_> = (0..JOBS).map(|n| job(n, now)).collect();
    let busy = jobs
        .first()
        .map(|record| record.id.to_string())
        .context("no jobs")?;
    let marks: Vec<_> = (0..NODES)
        .filter_map(|node| marks(node, now).map(|admin| (node_name(node), admin)))
        .collect();
    cluster.with_nats(&cluster.admin_creds(), |client| async move {
        let js = async_nats::jetstream::new(client);
        let mut writes = Vec::new();
        for record in &jobs {
            writes.push((
                format!("$KV.mgpu-jobs.{}", record.id),
                serde_json::to_vec(record)?,
            ));
        }
        for (node, admin) in &marks {
            writes.push((
                format!("$KV.mgpu-cluster.node.{node}"),
                serde_json::to_vec(admin)?,
            ));
        }
        // Every node's first heartbeat is in the stream before the page opens (the traffic
        // goes round the nodes in 5 s, which the first render would otherwise measure).
        for node in 0..NODES {
            let mut beat = heartbeat(node, now, 0);
            beat.interval_ms = 5_000;
            writes.push((subjects::heartbeat(&beat.node), serde_json::to_vec(&beat)?));
        }
        // A few hundred in flight at a time, each stored before the next batch goes.
        for batch in writes.chunks(256) {
            let mut acks = Vec::with_capacity(batch.len());
            for (subject, payload) in batch {
                acks.push(js.publish(subject.clone(), payload.clone().into()).await?);
            }
            for ack in acks {
                ack.await?;
            }
        }
        anyhow::Ok(())
    })?;
    progress(&format!(
        "  wrote {JOBS} job records, the node marks and a heartbeat of each node"
    ));
    Ok(busy)
}

/// Heartbeats of every node every 5 s, and the busy job's output, until `running` is false.
fn start_traffic(
    cluster: &Cluster,
    busy_job: &str,
    running: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<()>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = runtime.block_on(cluster.connect(&cluster.server_url(), &cluster.admin_creds()));
    let busy_job = busy_job.to_owned();
    Ok(std::thread::spawn(move || {
        runtime.block_on(async move {
            let beats = tokio::spawn(heartbeats(client.clone(), Arc::clone(&running)));
            output(client, &busy_job, running).await;
            let _ = beats.await;
        });
    }))
}

async fn heartbeats(client: async_nats::Client, running: Arc<AtomicBool>) {
    let js = async_nats::jetstream::new(client);
    let mut seq = 0;
    while running.load(Ordering::SeqCst) {
        let started = Instant::now();
        for node in 0..NODES {
            let mut beat = heartbeat(node, mgpu_protocol::now(), seq);
            beat.interval_ms = 5_000;
            let payload = serde_json::to_vec(&beat).unwrap_or_default();
            let _ = js
                .publish(subjects::heartbeat(&beat.node), payload.into())
                .await;
            // 1 000 nodes spread over the 5 s.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        seq += 1;
        tokio::time::sleep(Duration::from_secs(5).saturating_sub(started.elapsed())).await;
    }
}

/// The busy job's output: LINES_PER_SECOND lines a second, numbered, as its agent would
/// publish them (headers and sequence numbers of `jobs.<id>.output`).
async fn output(client: async_nats::Client, job: &str, running: Arc<AtomicBool>) {
    let js = async_nats::jetstream::new(client);
    let subject = format!("jobs.{job}.output");
    let chunks_per_second = LINES_PER_SECOND / LINES_PER_CHUNK;
    let pause = Duration::from_micros(1_000_000 / chunks_per_second);
    let mut line = 0u64;
    let mut seq = 0u64;
    let mut pending = Vec::new();
    while running.load(Ordering::SeqCst) {
        let started = Instant::now();
        let mut text = String::new();
        for _ in 0..LINES_PER_CHUNK {
            line += 1;
            text.push_str(&format!(
                "\u{1b}[32mstep {line}\u{1b}[0m loss=0.{:04}\n",
                line % 10_000
            ));
        }
        seq += 1;
        let mut headers = HeaderMap::new();
        headers.insert("Mgpu-Stream", "stdout");
        headers.insert("Mgpu-Seq", seq.to_string().as_str());
        headers.insert("Mgpu-Rank", "0");
        headers.insert("Mgpu-Attempt", "1");
        if let Ok(ack) = js
            .publish_with_headers(subject.clone(), headers, text.into())
            .await
        {
            pending.push(ack);
        }
        if pending.len() >= 100 {
            for ack in pending.drain(..) {
                let _ = ack.await;
            }
        }
        tokio::time::sleep(pause.saturating_sub(started.elapsed())).await;
    }
}

fn run_browser(cluster: &Cluster, web: &WebServer, busy_job: &str, seconds: u64) -> Result<Value> {
    let web_dir = repo_root().join("services/web");
    let run = Command::new("node")
        .arg(web_dir.join("test/browser/bench.mjs"))
        .current_dir(&web_dir)
        .env("WEB_URL", &web.url)
        .env(
            "CREDS",
            cluster.creds(mgpu_protocol::principals::Role::Viewer, "wall"),
        )
        .env("GPUS", (NODES * GPUS).to_string())
        .env("JOBS", JOBS.to_string())
        .env("RUNNING", RUNNING.to_string())
        .env("OUTPUT_JOB", busy_job)
        .env("OUTPUT_SECONDS", seconds.to_string())
        .stderr(Stdio::inherit())
        .output()
        .context("running node (scripts/setup.sh installs it)")?;
    if !run.status.success() {
        bail!("the browser benchmark failed ({})", run.status);
    }
    let text = String::from_utf8_lossy(&run.stdout);
    let last = text.lines().last().unwrap_or_default();
    serde_json::from_str(last).with_context(|| format!("the browser's results: {last:?}"))
}

fn report(ctx: &Run, measured: &Value) -> Result<()> {
    let number = |path: &str| {
        measured
            .pointer(path)
            .and_then(Value::as_f64)
            .unwrap_or(f64::NAN)
    };
    let first = number("/first_full_render_ms");
    progress(&format!(
        "  every tile drawn and every record read {first:.0} ms after signing in"
    ));
    let single = |value: f64| Summary {
        count: 1,
        min: value,
        median: value,
        p99: value,
        max: value,
    };
    let fleet = json!({"nodes": NODES, "gpus": NODES * GPUS, "jobs": JOBS, "running": RUNNING, "queued": QUEUED});
    ctx.report(
        "web_first_full_render",
        first,
        "ms",
        Target::AtMost(3_000.0),
        true,
        None,
        &single(first),
        "ms from signing in to every GPU tile drawn, every record read and every running job on its tile",
        json!({
            "fleet": fleet,
            "queue_render_ms": number("/queue_render_ms"),
            "milestones": measured["first_render_milestones"],
        }),
    );
    let frames = Summary {
        count: number("/update_frame_ms/count") as usize,
        min: f64::NAN,
        median: number("/update_frame_ms/median"),
        p99: number("/update_frame_ms/p99"),
        max: number("/update_frame_ms/max"),
    };
    progress(&format!(
        "  a redraw takes {:.1} ms (median), {:.1} ms (p99)",
        frames.median, frames.p99
    ));
    ctx.report(
        "web_update_frame",
        frames.median,
        "ms",
        Target::AtMost(16.7),
        frames.p99 <= 50.0,
        Some(
            "<= 16.7 ms a redraw (median; p99 <= 50 ms) while 200 heartbeats a second arrive"
                .into(),
        ),
        &frames,
        "ms per redraw of the cluster view",
        json!({"fleet": fleet}),
    );
    let heap = number("/output/heap_mib_after");
    progress(&format!(
        "  the tab's heap after the busy output: {heap:.0} MiB"
    ));
    ctx.report(
        "web_output_memory",
        heap,
        "MiB",
        Target::AtMost(150.0),
        true,
        Some(format!(
            "<= 150 MiB of JavaScript heap after following {LINES_PER_SECOND} lines/s"
        )),
        &single(heap),
        "MiB of JavaScript heap (after a garbage collection)",
        json!({"output": measured["output"], "lines_per_second": LINES_PER_SECOND}),
    );
    Ok(())
}
