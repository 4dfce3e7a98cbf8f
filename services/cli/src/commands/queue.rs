//! `mgpu queue`: the jobs and the nodes, read straight from JetStream (works while the
//! scheduler is down).

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use mgpu_shared::Timestamp;
use mgpu_shared::duration::format_duration;
use mgpu_shared::job::{JobRecord, JobState};
use mgpu_shared::node::{GpuSource, NodeHeartbeat, NodeLiveness};
use mgpu_shared::records;
use serde::Serialize;
use serde_json::json;

use crate::cli::GlobalArgs;
use crate::commands::{print, print_json, println};
use crate::errors::plain;
use crate::human;
use crate::session::Session;
use crate::tables::Table;

#[derive(Debug, Args)]
pub struct QueueArgs {
    /// Also list finished jobs.
    #[arg(short, long)]
    pub all: bool,

    /// Print `{"jobs": […], "nodes": […]}` for scripts.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(global: &GlobalArgs, args: &QueueArgs) -> Result<ExitCode> {
    let session = Session::connect(global).await?;
    let mut jobs = records::list_jobs(&session.js).await.map_err(plain)?;
    let nodes = records::list_nodes(&session.js).await.map_err(plain)?;
    let now = mgpu_shared::now();

    // Node usage counts every running job, shown or not.
    let node_rows: Vec<NodeRow> = nodes.iter().map(|n| node_row(n, &jobs, now)).collect();
    if !args.all {
        jobs.retain(|job| !job.state.is_finished());
    }
    sort_jobs(&mut jobs);

    if args.json {
        let summaries: Vec<_> = jobs.iter().map(JobRecord::summary).collect();
        print_json(&json!({ "jobs": summaries, "nodes": node_rows }))?;
        return Ok(ExitCode::SUCCESS);
    }

    if jobs.is_empty() {
        println(if args.all {
            "No jobs."
        } else {
            "No queued or running jobs (mgpu queue --all lists finished ones too)."
        })?;
    } else {
        let mut table = Table::new([
            "ID",
            "USER",
            "NAME",
            "STATE",
            "GPUS",
            "NODE:GPUS",
            "TIME",
            "REASON",
        ]);
        for job in &jobs {
            table.row(job_cells(job, now));
        }
        print(&table.render())?;
    }
    println("")?;
    if node_rows.is_empty() {
        println("No nodes have reported yet.")?;
    } else {
        let mut table = Table::new(["NODE", "STATE", "GPUS", "MEM (MiB)", "SOURCE"]);
        for row in &node_rows {
            table.row(vec![
                row.node.clone(),
                liveness_name(row.state).to_owned(),
                format!("{}/{} free", row.gpus_free, row.gpus_total),
                human::mib_pair(row.mem_used_mib, row.mem_total_mib),
                source_name(row.gpu_source).to_owned(),
            ]);
        }
        print(&table.render())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Running first (longest running first), then queued in the order the scheduler considers
/// them (higher priority, then earlier submission), then finished by end time.
pub fn sort_jobs(jobs: &mut [JobRecord]) {
    jobs.sort_by(compare_jobs);
}

fn compare_jobs(a: &JobRecord, b: &JobRecord) -> Ordering {
    fn group(job: &JobRecord) -> u8 {
        match job.state {
            JobState::Running(_) => 0,
            JobState::Queued(_) => 1,
            _ => 2,
        }
    }
    group(a)
        .cmp(&group(b))
        .then_with(|| match (&a.state, &b.state) {
            (JobState::Running(x), JobState::Running(y)) => x
                .started_at
                .unwrap_or(x.assigned_at)
                .cmp(&y.started_at.unwrap_or(y.assigned_at)),
            (JobState::Queued(_), JobState::Queued(_)) => b
                .spec
                .priority
                .cmp(&a.spec.priority)
                .then(a.submitted_at.cmp(&b.submitted_at)),
            _ => {
                let end = |job: &JobRecord| job.state.ending().map(|e| e.ended_at);
                end(a).cmp(&end(b))
            }
        })
        .then_with(|| a.id.cmp(&b.id))
}

fn job_cells(job: &JobRecord, now: Timestamp) -> Vec<String> {
    let placement = job
        .state
        .placement()
        .map(|p| format!("{}:{}", p.node, human::index_list(&p.gpu_indices())))
        .unwrap_or_else(|| "-".to_owned());
    let (time, reason) = match &job.state {
        JobState::Queued(waiting) => (
            human::elapsed(job.submitted_at, now),
            waiting.reason.describe().to_owned(),
        ),
        JobState::Running(run) => (
            run.started_at
                .map(|s| human::elapsed(s, now))
                .unwrap_or_default(),
            match (&run.cancel_requested_by, run.started_at) {
                (Some(_), _) => "cancelling".to_owned(),
                (None, None) => "starting".to_owned(),
                (None, Some(_)) => String::new(),
            },
        ),
        JobState::Succeeded(end) | JobState::Failed(end) | JobState::Cancelled(end) => (
            end.started_at
                .map(|s| human::elapsed(s, end.ended_at))
                .unwrap_or_default(),
            match (&end.reason, end.exit_code) {
                (Some(reason), _) => reason.clone(),
                (None, Some(code)) => format!("exit {code}"),
                (None, None) => String::new(),
            },
        ),
    };
    vec![
        job.id.short().to_owned(),
        job.user.clone(),
        job.spec.display_name(),
        job.state.name().to_owned(),
        job.spec.gpus.to_string(),
        placement,
        format_duration(time),
        reason,
    ]
}

/// One node as the queue shows it, and as `--json` prints it.
#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct NodeRow {
    pub node: String,
    pub state: NodeLiveness,
    pub last_heartbeat: Timestamp,
    pub gpus_total: usize,
    pub gpus_free: usize,
    #[serde(skip)]
    pub mem_used_mib: u64,
    #[serde(skip)]
    pub mem_total_mib: u64,
    pub gpu_source: GpuSource,
}

/// GPUs of `node` on which a running job holds any share: a shared GPU is not free.
pub fn busy_gpus(node: &str, jobs: &[JobRecord]) -> BTreeSet<u32> {
    jobs.iter()
        .filter_map(|job| match &job.state {
            JobState::Running(run) if run.placement.node == node => Some(&run.placement),
            _ => None,
        })
        .flat_map(|placement| placement.gpus.iter().map(|g| g.index))
        .collect()
}

pub fn node_row(beat: &NodeHeartbeat, jobs: &[JobRecord], now: Timestamp) -> NodeRow {
    let busy = busy_gpus(&beat.node, jobs);
    NodeRow {
        node: beat.node.clone(),
        state: beat.liveness(now),
        last_heartbeat: beat.sent_at,
        gpus_total: beat.gpus.len(),
        gpus_free: beat
            .gpus
            .iter()
            .filter(|g| !busy.contains(&g.index))
            .count(),
        mem_used_mib: beat.gpus.iter().map(|g| g.memory_used_mib).sum(),
        mem_total_mib: beat.gpus.iter().map(|g| g.memory_total_mib).sum(),
        gpu_source: beat.gpu_source,
    }
}

pub fn liveness_name(state: NodeLiveness) -> &'static str {
    match state {
        NodeLiveness::Online => "online",
        NodeLiveness::Offline => "offline",
    }
}

pub fn source_name(source: GpuSource) -> &'static str {
    match source {
        GpuSource::Nvml => "nvml",
        GpuSource::Declared => "declared",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;
    use mgpu_shared::gpu_amount::GpuAmount;
    use mgpu_shared::ids::JobId;
    use mgpu_shared::job::{Ending, GpuShare, JobSpec, Placement, Run, WaitReason, Waiting};
    use mgpu_shared::node::GpuStatus;

    fn job(name: &str, state: JobState, priority: i32, submitted_secs_ago: i64) -> JobRecord {
        let mut spec = JobSpec::new(vec![name.to_owned()], "/tmp");
        spec.priority = priority;
        JobRecord {
            id: JobId::random(),
            user: "alice".into(),
            spec,
            submitted_at: mgpu_shared::now() - Duration::seconds(submitted_secs_ago),
            attempt: 1,
            state,
        }
    }

    fn queued() -> JobState {
        JobState::Queued(Waiting {
            reason: WaitReason::Resources,
        })
    }

    fn placement(node: &str, gpus: &[(u32, GpuAmount)]) -> Placement {
        Placement {
            node: node.into(),
            gpus: gpus
                .iter()
                .map(|&(index, amount)| GpuShare {
                    index,
                    amount,
                    mem_mib: 0,
                })
                .collect(),
        }
    }

    fn running(node: &str, gpus: &[(u32, GpuAmount)]) -> JobState {
        JobState::Running(Run {
            placement: placement(node, gpus),
            assigned_at: mgpu_shared::now(),
            started_at: Some(mgpu_shared::now()),
            pid: Some(1),
            cancel_requested_by: None,
        })
    }

    fn finished(secs_ago: i64) -> JobState {
        JobState::Succeeded(Ending {
            placement: None,
            started_at: None,
            ended_at: mgpu_shared::now() - Duration::seconds(secs_ago),
            exit_code: Some(0),
            signal: None,
            reason: None,
        })
    }

    #[test]
    fn running_then_queued_by_priority_and_age_then_finished_by_end() {
        let mut jobs = vec![
            job("done-late", finished(10), 0, 100),
            job("low-old", queued(), 0, 50),
            job("high-new", queued(), 5, 1),
            job("done-early", finished(60), 0, 100),
            job("low-new", queued(), 0, 5),
            job("run", running("n1", &[(0, GpuAmount::ONE)]), -3, 200),
        ];
        sort_jobs(&mut jobs);
        let names: Vec<String> = jobs.iter().map(|j| j.spec.display_name()).collect();
        assert_eq!(
            names,
            [
                "run",
                "high-new",
                "low-old",
                "low-new",
                "done-early",
                "done-late"
            ]
        );
    }

    fn heartbeat(node: &str, gpus: u32) -> NodeHeartbeat {
        NodeHeartbeat {
            node: node.into(),
            sent_at: mgpu_shared::now(),
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
                    foreign_processes: vec![],
                })
                .collect(),
            running: vec![],
            address: "127.0.0.1".into(),
            runs_jobs_as: "mgpu".into(),
            agent_version: "0".into(),
        }
    }

    #[test]
    fn a_gpu_is_busy_when_any_running_job_holds_a_share_of_it() {
        let half = GpuAmount::from_units(5_000);
        let jobs = vec![
            job("a", running("n1", &[(0, half)]), 0, 1),
            job(
                "b",
                running("n1", &[(2, GpuAmount::ONE), (3, GpuAmount::ONE)]),
                0,
                1,
            ),
            // Other nodes, queued and finished jobs hold nothing here.
            job("c", running("n2", &[(1, GpuAmount::ONE)]), 0, 1),
            job("d", queued(), 0, 1),
            job("e", finished(1), 0, 1),
        ];
        let row = node_row(&heartbeat("n1", 4), &jobs, mgpu_shared::now());
        assert_eq!((row.gpus_free, row.gpus_total), (1, 4));
        assert_eq!((row.mem_used_mib, row.mem_total_mib), (600, 4_000));
        assert_eq!(row.state, NodeLiveness::Online);
        assert_eq!(busy_gpus("n1", &jobs), BTreeSet::from([0, 2, 3]));
    }

    #[test]
    fn a_silent_node_is_offline() {
        let mut beat = heartbeat("n1", 1);
        beat.sent_at = mgpu_shared::now() - Duration::seconds(60);
        assert_eq!(
            node_row(&beat, &[], mgpu_shared::now()).state,
            NodeLiveness::Offline
        );
    }

    #[test]
    fn rows_show_placement_and_reason() {
        let queued_job = job("train", queued(), 0, 90);
        let cells = job_cells(&queued_job, mgpu_shared::now());
        assert_eq!(cells[5], "-");
        assert_eq!(cells[6], "1m30s");
        assert_eq!(cells[7], "waiting for GPUs to become free");
        let running_job = job(
            "train",
            running("node001", &[(0, GpuAmount::ONE), (1, GpuAmount::ONE)]),
            0,
            1,
        );
        assert_eq!(
            job_cells(&running_job, mgpu_shared::now())[5],
            "node001:0,1"
        );
    }
}
