//! Records and heartbeats for the unit tests of the read model and the commands: a job in
//! each state, and a node's heartbeat.

use chrono::Duration;
use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{
    Ending, GpuShare, JobRecord, JobSpec, JobState, Placement, Run, WaitReason, Waiting,
};
use mgpu_protocol::node::{DEFAULT_THRESHOLD, GpuSource, GpuStatus, NodeHeartbeat};

/// Alice's job running `name`, submitted `submitted_secs_ago`.
pub fn job(name: &str, state: JobState, priority: i32, submitted_secs_ago: i64) -> JobRecord {
    let mut spec = JobSpec::new(vec![name.to_owned()], "/tmp");
    spec.priority = priority;
    JobRecord {
        id: JobId::random(),
        user: "alice".into(),
        user_key: None,
        spec,
        submitted_at: mgpu_protocol::now() - Duration::seconds(submitted_secs_ago),
        attempt: 1,
        state,
        last_request: None,
        preemptions: Vec::new(),
    }
}

/// Waiting for GPUs.
pub fn queued() -> JobState {
    JobState::Queued(Waiting::new(WaitReason::Resources))
}

/// Started just now on `node`, holding these shares of its GPUs.
pub fn running(node: &str, gpus: &[(u32, GpuAmount)]) -> JobState {
    let placement = Placement::single(
        node,
        gpus.iter()
            .map(|&(index, amount)| GpuShare {
                index,
                amount,
                mem_mib: 0,
            })
            .collect(),
    );
    let mut run = Run::assigned(placement, mgpu_protocol::now());
    run.started_at = Some(mgpu_protocol::now());
    run.pid = Some(1);
    JobState::Running(run)
}

/// Succeeded `secs_ago`.
pub fn finished(secs_ago: i64) -> JobState {
    JobState::Succeeded(Ending {
        placement: None,
        started_at: None,
        ended_at: mgpu_protocol::now() - Duration::seconds(secs_ago),
        exit_code: Some(0),
        signal: None,
        reason: None,
        usage: None,
    })
}

/// A node's fresh heartbeat with `gpus` declared GPUs of 1 000 MiB, GPU `i` using `100 × i`.
pub fn heartbeat(node: &str, gpus: u32) -> NodeHeartbeat {
    NodeHeartbeat {
        node: node.into(),
        sent_at: mgpu_protocol::now(),
        interval_ms: 2_000,
        gpu_source: GpuSource::Declared,
        gpu_note: None,
        gpus: (0..gpus)
            .map(|index| GpuStatus {
                index,
                uuid: format!("GPU-{index}"),
                name: "Fake".into(),
                memory_total_mib: 1_000,
                memory_used_mib: 100 * u64::from(index),
                utilization_pct: 0,
                temperature_c: None,
                power_w: None,
                foreign_processes: vec![],
                gpu_type: None,
            })
            .collect(),
        running: vec![],
        address: "127.0.0.1".into(),
        runs_jobs_as: "mgpu".into(),
        containment: None,
        agent_version: "0".into(),
        protocol: mgpu_protocol::version::PROTOCOL,
        mem_threshold: DEFAULT_THRESHOLD,
        load_threshold: DEFAULT_THRESHOLD,
        labels: Default::default(),
        fence_after_ms: None,
        kill_grace_ms: 0,
        gpu_isolation: false,
        cpus: None,
        mem_host_mib: None,
        features: Vec::new(),
    }
}
