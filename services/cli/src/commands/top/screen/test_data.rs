//! Records and heartbeats for the unit tests of `mgpu top`'s model and drawing: jobs signed
//! with `U<USER>` keys, NVML and declared heartbeats.

use chrono::Duration;
use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{
    Ending, GpuShare, JobRecord, JobSpec, JobState, Placement, Run, WaitReason, Waiting,
};
use mgpu_protocol::node::{DEFAULT_THRESHOLD, GpuSource, GpuStatus, NodeHeartbeat};

use super::me::Me;

/// Alice as the screen's user: her key signs her jobs.
pub fn alice() -> Me {
    Me {
        user: "alice".into(),
        key: "UALICE".into(),
    }
}

/// `user`'s job `name` in `state`, submitted a minute ago and signed with `U<USER>`.
pub fn job(user: &str, name: &str, state: JobState) -> JobRecord {
    let mut spec = JobSpec::new(vec!["sleep".into(), "300".into()], "/tmp");
    spec.name = Some(name.to_owned());
    JobRecord {
        id: JobId::random(),
        user: user.to_owned(),
        user_key: Some(format!("U{}", user.to_ascii_uppercase())),
        spec,
        submitted_at: mgpu_protocol::now() - Duration::seconds(60),
        attempt: 1,
        state,
        last_request: None,
        preemptions: Vec::new(),
    }
}

pub fn queued() -> JobState {
    JobState::Queued(Waiting::new(WaitReason::Resources))
}

pub fn held(by: &str) -> JobState {
    let mut waiting = Waiting::new(WaitReason::Held);
    waiting.held_by = Some(by.to_owned());
    JobState::Queued(waiting)
}

/// Running on `node`, holding these whole GPUs.
pub fn running(node: &str, gpus: &[u32]) -> JobState {
    let shares = gpus
        .iter()
        .map(|&index| GpuShare {
            index,
            amount: GpuAmount::ONE,
            mem_mib: 0,
        })
        .collect();
    let mut run = Run::assigned(Placement::single(node, shares), mgpu_protocol::now());
    run.started_at = Some(mgpu_protocol::now() - Duration::seconds(30));
    JobState::Running(run)
}

pub fn finished() -> JobState {
    JobState::Cancelled(Ending {
        placement: None,
        started_at: None,
        ended_at: mgpu_protocol::now(),
        exit_code: None,
        signal: None,
        reason: None,
        usage: None,
    })
}

/// A node's fresh heartbeat with `gpus` GPUs of 24 GiB, GPU `i` at `10 × i` % utilisation.
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
                name: "A100".into(),
                memory_total_mib: 24_576,
                memory_used_mib: 1_024 * u64::from(index),
                utilization_pct: 10 * index,
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

/// [`heartbeat`] as NVML reports it: GPU `i` also at `60 + i` °C drawing `250 + 10 × i` W.
pub fn nvml_heartbeat(node: &str, gpus: u32) -> NodeHeartbeat {
    let mut beat = heartbeat(node, gpus);
    beat.gpu_source = GpuSource::Nvml;
    for gpu in &mut beat.gpus {
        gpu.temperature_c = Some(60 + gpu.index);
        gpu.power_w = Some(250 + 10 * gpu.index);
    }
    beat
}
