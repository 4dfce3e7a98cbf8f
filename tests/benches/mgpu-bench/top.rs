//! Scenario 9, top: drawing `mgpu top` for a large cluster. 1 000 nodes of 8 GPUs (two
//! models, some GPUs paused, some nodes drained) and 10 000 jobs of 100 users (6 000 running
//! on one GPU each, 4 000 waiting, some held), built in memory and fed to the command's own
//! model (`mgpu_cli::top`); no cluster is started. Each frame follows one node's heartbeat,
//! as on a live screen where heartbeats keep arriving, so every frame works the lines out
//! again (the worst case) before drawing a 200×60 screen. Measured: the time per frame, the
//! time to draw a frame when nothing changed, and the time to take in the whole cluster.
//! Writing the frame to a terminal (ratatui's diff and the escape sequences) is not included.

use std::time::Instant;

use anyhow::Result;
use chrono::Duration;
use mgpu_cli::top::model::{Input, Me, Model};
use mgpu_cli::top::view;
use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{GpuShare, JobRecord, JobSpec, JobState, Placement, WaitReason, Waiting};
use mgpu_protocol::node::{AdminMark, GpuSource, GpuStatus, NodeAdmin, NodeHeartbeat};
use serde_json::json;

use crate::common::*;

pub(crate) const NODES: usize = 1_000;
pub(crate) const GPUS: usize = 8;
pub(crate) const JOBS: usize = 10_000;
pub(crate) const RUNNING: usize = 6_000;
const USERS: usize = 100;
const SIZE: (u16, u16) = (200, 60);

pub fn run(ctx: &Run) -> Result<()> {
    let frames = if ctx.quick { 100 } else { 1_000 };
    progress(&format!(
        "top: {NODES} nodes × {GPUS} GPUs, {JOBS} jobs, {frames} frames of {}×{}",
        SIZE.0, SIZE.1
    ));
    let now = mgpu_protocol::now();
    let loading = Instant::now();
    let mut model = cluster(now);
    let load_ms = loading.elapsed().as_secs_f64() * 1000.0;
    let (frame_ms, still_ms) = draw_frames(&mut model, now, frames)?;
    let summary = summarize(&frame_ms)?;
    let still = summarize(&still_ms)?;
    progress(&format!(
        "  {:.2} ms a frame (median; {:.2} ms drawing alone), the cluster loaded in {load_ms:.0} ms",
        summary.median, still.median
    ));
    ctx.report(
        "top_frame_1000_nodes",
        summary.median,
        "ms",
        Target::AtMost(50.0),
        true,
        Some("<= 50 ms a frame (median, lines worked out after a heartbeat, then drawn)".into()),
        &summary,
        "ms per frame (one heartbeat applied, lines worked out, 200×60 drawn)",
        json!({
            "nodes": NODES,
            "gpus": NODES * GPUS,
            "jobs": JOBS,
            "running": RUNNING,
            "size": [SIZE.0, SIZE.1],
            "drawing_alone_ms": {
                "median": round3(still.median),
                "p99": round3(still.p99),
            },
            "load_ms": round3(load_ms),
        }),
    );
    Ok(())
}

/// The whole cluster taken in by the model, as the live screen takes in the buckets.
fn cluster(now: mgpu_protocol::Timestamp) -> Model {
    let me = Me {
        user: user(7),
        key: key(7),
    };
    let mut model = Model::new(me, now, SIZE);
    for node in 0..NODES {
        model.update(Input::heartbeat(heartbeat(node, now, 0)));
        if let Some(marks) = marks(node, now) {
            model.update(Input::Marks {
                node: node_name(node),
                marks: Some(marks),
            });
        }
    }
    for n in 0..JOBS {
        model.update(Input::job(job(n, now)));
    }
    model.settle();
    model
}

/// Milliseconds per frame, each after a heartbeat, and per frame drawn again unchanged.
fn draw_frames(
    model: &mut Model,
    now: mgpu_protocol::Timestamp,
    frames: usize,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let mut buf = view::blank(SIZE);
    let mut frame_ms = Vec::with_capacity(frames);
    let mut still_ms = Vec::with_capacity(frames);
    for frame in 0..frames {
        let beat = heartbeat(frame % NODES, now, frame + 1);
        let started = Instant::now();
        model.update(Input::heartbeat(beat));
        model.settle();
        buf.reset();
        view::render(model, buf.area, &mut buf);
        frame_ms.push(started.elapsed().as_secs_f64() * 1000.0);
        let started = Instant::now();
        model.settle();
        buf.reset();
        view::render(model, buf.area, &mut buf);
        still_ms.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let text = view::to_text(&buf);
    anyhow::ensure!(
        text.contains("1000 nodes") && text.contains(&node_name(0)),
        "the frame does not show the cluster:\n{text}"
    );
    Ok((frame_ms, still_ms))
}

pub(crate) fn node_name(node: usize) -> String {
    format!("node{:04}", node + 1)
}

fn user(n: usize) -> String {
    format!("user{n:03}")
}

fn key(n: usize) -> String {
    format!("UKEY{n:03}")
}

/// Node `node`'s heartbeat number `seq`: utilisation and memory move with it.
pub(crate) fn heartbeat(node: usize, now: mgpu_protocol::Timestamp, seq: usize) -> NodeHeartbeat {
    let model = if node.is_multiple_of(2) {
        "A100-SXM4-80GB"
    } else {
        "H100-80GB-HBM3"
    };
    NodeHeartbeat {
        node: node_name(node),
        sent_at: now + Duration::milliseconds(i64::try_from(seq).unwrap_or(0)),
        interval_ms: 2_000,
        gpu_source: GpuSource::Nvml,
        gpu_note: None,
        gpus: (0..GPUS)
            .map(|gpu| {
                let load = u32::try_from((node * 37 + gpu * 11 + seq * 7) % 101).unwrap_or(0);
                GpuStatus {
                    index: u32::try_from(gpu).unwrap_or(0),
                    uuid: format!("GPU-{node}-{gpu}"),
                    name: model.to_owned(),
                    memory_total_mib: 81_920,
                    memory_used_mib: u64::from(load) * 800,
                    utilization_pct: load,
                    temperature_c: None,
                    power_w: None,
                    foreign_processes: vec![],
                    gpu_type: None,
                }
            })
            .collect(),
        running: vec![],
        address: "10.0.0.1".into(),
        runs_jobs_as: "<owner>".into(),
        containment: None,
        gpu_isolation: true,
        cpus: Some(64),
        mem_host_mib: Some(512 * 1024),
        agent_version: "0".into(),
        protocol: mgpu_protocol::version::PROTOCOL,
        mem_threshold: 0.8,
        load_threshold: 0.8,
        fence_after_ms: None,
        kill_grace_ms: 10_000,
        labels: Default::default(),
        features: Vec::new(),
    }
}

/// Every 100th node drained, and GPU 7 of every 50th paused.
pub(crate) fn marks(node: usize, now: mgpu_protocol::Timestamp) -> Option<NodeAdmin> {
    let mark = AdminMark {
        by: "admin".into(),
        at: now,
        reason: Some("maintenance".into()),
    };
    let mut admin = NodeAdmin::default();
    if node % 100 == 99 {
        admin.drained = Some(mark.clone());
    }
    if node.is_multiple_of(50) {
        admin.paused_gpus.insert(7, mark);
    }
    (admin != NodeAdmin::default()).then_some(admin)
}

/// Job `n`: the first [`RUNNING`] run on one GPU each, node by node; the rest wait, every
/// 20th held, with priorities and ages spread out.
pub(crate) fn job(n: usize, now: mgpu_protocol::Timestamp) -> JobRecord {
    let owner = n % USERS;
    let mut spec = JobSpec::new(vec!["python".into(), "train.py".into()], "/home/work");
    spec.name = Some(format!("train-{n}"));
    spec.priority = i32::try_from(n % 5).unwrap_or(0);
    let submitted_at = now - Duration::seconds(i64::try_from(n % 7_200).unwrap_or(0));
    let state = if n < RUNNING {
        let share = GpuShare {
            index: u32::try_from(n % GPUS).unwrap_or(0),
            amount: GpuAmount::ONE,
            mem_mib: 0,
        };
        // The protocol's `Run` (a running job), not the benchmark's.
        let mut run = mgpu_protocol::job::Run::assigned(
            Placement::single(node_name(n / GPUS), vec![share]),
            now,
        );
        run.started_at = Some(submitted_at);
        JobState::Running(run)
    } else {
        let mut waiting = Waiting::new(WaitReason::Resources);
        if n.is_multiple_of(20) {
            waiting.reason = WaitReason::Held;
            waiting.held_by = Some(user(owner));
        }
        JobState::Queued(waiting)
    };
    JobRecord {
        id: JobId::random(),
        user: user(owner),
        user_key: Some(key(owner)),
        spec,
        submitted_at,
        attempt: 1,
        state,
        last_request: None,
        preemptions: Vec::new(),
    }
}
