//! Accounting over finished jobs, like Slurm's `sreport`: GPU time and how jobs ended, summed
//! by user, node, state or GPU type (each GPU's type as its node reports it now). GPU time is counted as the scheduler's fair-share ledger counts it:
//! the GPUs (and shares) a job held on all its nodes, times the milliseconds from its start
//! to its end (its last attempt; the ledger also counts attempts that were requeued). Idle
//! GPU time is what the job's agent measured of its last attempt (`usage.idle_gpu_secs`): none
//! for a job whose agent did not measure it.

use std::collections::{BTreeMap, HashMap};

use mgpu_protocol::job::{JobRecord, JobState};
use serde::Serialize;

/// GPU-seconds a finished job used (0 for one that never started).
pub fn gpu_seconds(job: &JobRecord) -> f64 {
    let Some(end) = job.state.ending() else {
        return 0.0;
    };
    let (Some(placement), Some(started)) = (&end.placement, end.started_at) else {
        return 0.0;
    };
    let seconds = (end.ended_at - started).num_milliseconds().max(0) as f64 / 1000.0;
    placement.total_gpus() * seconds
}

/// What the report groups jobs by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum GroupBy {
    User,
    Node,
    State,
    /// The GPU type, as each job's GPUs' nodes report it now (`-` where unknown).
    Type,
}

/// Each GPU's type by node and index, from the nodes' latest heartbeats.
pub type GpuTypes = HashMap<(String, u32), String>;

/// The GPU types the nodes' latest heartbeats report.
pub fn gpu_types(nodes: &[mgpu_protocol::node::NodeHeartbeat]) -> GpuTypes {
    nodes
        .iter()
        .flat_map(|beat| {
            beat.gpus.iter().filter_map(|g| {
                let gpu_type = g.gpu_type.clone()?;
                Some(((beat.node.clone(), g.index), gpu_type))
            })
        })
        .collect()
}

/// The jobs of one group and how they ended.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Totals {
    pub jobs: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub cancelled: u64,
    pub timed_out: u64,
    pub node_failed: u64,
    pub gpu_seconds: f64,
    /// Attempts stopped for jobs of a class that may preempt, and the GPU time they had run.
    pub preemptions: u64,
    pub preempted_gpu_seconds: f64,
    /// GPU time the jobs' GPUs sat idle, as their agents measured it.
    pub idle_gpu_seconds: f64,
}

impl Totals {
    /// Counts `job` in this group, with `gpu_seconds` of its GPU time: its whole, or the part
    /// held here (by node or type), its preempted GPU time split alike.
    fn add(&mut self, job: &JobRecord, gpu_seconds: f64) {
        let whole = self::gpu_seconds(job);
        let share = if whole > 0.0 {
            gpu_seconds / whole
        } else {
            1.0
        };
        self.preemptions += job.preemptions.len() as u64;
        self.preempted_gpu_seconds += share
            * job
                .preemptions
                .iter()
                .map(|p| p.gpu_seconds as f64)
                .sum::<f64>();
        self.idle_gpu_seconds += share * idle_gpu_seconds(job);
        self.jobs += 1;
        match job.state {
            JobState::Succeeded(_) => self.succeeded += 1,
            JobState::Failed(_) => self.failed += 1,
            JobState::Cancelled(_) => self.cancelled += 1,
            JobState::TimedOut(_) => self.timed_out += 1,
            JobState::NodeFailed(_) => self.node_failed += 1,
            JobState::Queued(_) | JobState::Running(_) => {}
        }
        self.gpu_seconds += gpu_seconds;
    }

    pub fn gpu_hours(&self) -> f64 {
        self.gpu_seconds / 3600.0
    }

    pub fn preempted_gpu_hours(&self) -> f64 {
        self.preempted_gpu_seconds / 3600.0
    }

    pub fn idle_gpu_hours(&self) -> f64 {
        self.idle_gpu_seconds / 3600.0
    }
}

/// GPU-seconds a finished job's GPUs sat idle in its last attempt, as its agent measured them
/// (0 where it did not).
pub fn idle_gpu_seconds(job: &JobRecord) -> f64 {
    job.state
        .ending()
        .and_then(|end| end.usage.as_ref())
        .and_then(|usage| usage.idle_gpu_secs)
        .map_or(0.0, |secs| secs as f64)
}

/// `jobs` summed by `by`. By node, a job counts once on each node it ran on, with the GPU
/// time of the GPUs it held there.
pub fn totals(jobs: &[JobRecord], by: GroupBy, types: &GpuTypes) -> BTreeMap<String, Totals> {
    let mut groups: BTreeMap<String, Totals> = BTreeMap::new();
    for job in jobs.iter().filter(|job| job.state.is_finished()) {
        match by {
            GroupBy::User => groups
                .entry(job.user.clone())
                .or_default()
                .add(job, gpu_seconds(job)),
            GroupBy::State => groups
                .entry(job.state.name().to_owned())
                .or_default()
                .add(job, gpu_seconds(job)),
            GroupBy::Node => {
                let Some(placement) = job.state.placement() else {
                    groups.entry("-".to_owned()).or_default().add(job, 0.0);
                    continue;
                };
                let total = placement.total_gpus();
                let all = gpu_seconds(job);
                for (_, node, shares) in placement.ranks() {
                    let here: f64 = shares.iter().map(|s| s.amount.as_f64()).sum();
                    let part = if total > 0.0 { all * here / total } else { 0.0 };
                    groups.entry(node.to_owned()).or_default().add(job, part);
                }
            }
            GroupBy::Type => add_by_type(&mut groups, job, types),
        }
    }
    groups
}

/// A job's GPU time split by the type of each GPU it held; the job counts once in each type.
fn add_by_type(groups: &mut BTreeMap<String, Totals>, job: &JobRecord, types: &GpuTypes) {
    let Some(placement) = job.state.placement() else {
        groups.entry("-".to_owned()).or_default().add(job, 0.0);
        return;
    };
    let total = placement.total_gpus();
    let all = gpu_seconds(job);
    let mut parts: BTreeMap<&str, f64> = BTreeMap::new();
    for (_, node, shares) in placement.ranks() {
        for share in shares {
            let gpu_type = types
                .get(&(node.to_owned(), share.index))
                .map_or("-", String::as_str);
            *parts.entry(gpu_type).or_default() += share.amount.as_f64();
        }
    }
    if parts.is_empty() {
        groups.entry("-".to_owned()).or_default().add(job, 0.0);
    }
    for (gpu_type, here) in parts {
        let part = if total > 0.0 { all * here / total } else { 0.0 };
        groups
            .entry(gpu_type.to_owned())
            .or_default()
            .add(job, part);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use mgpu_protocol::gpu_amount::GpuAmount;
    use mgpu_protocol::job::{GpuShare, Placement};

    /// Alice's job that held `gpus` GPUs of `node` for `minutes` and ended `state`.
    fn ran(node: &str, gpus: u32, minutes: i64, failed: bool) -> JobRecord {
        let mut job = fixtures::job("train", fixtures::finished(60), 0, 7200);
        let shares = (0..gpus)
            .map(|index| GpuShare {
                index,
                amount: GpuAmount::ONE,
                mem_mib: 0,
            })
            .collect();
        if let JobState::Succeeded(end) = &mut job.state {
            end.placement = Some(Placement::single(node, shares));
            end.started_at = Some(end.ended_at - chrono::Duration::minutes(minutes));
            if failed {
                job.state = JobState::Failed(end.clone());
            }
        }
        job
    }

    #[test]
    fn gpu_time_is_gpus_times_run_time_summed_by_group() {
        let jobs = [ran("n1", 2, 90, false), ran("n2", 1, 30, true)];
        assert_eq!(gpu_seconds(&jobs[0]), 2.0 * 90.0 * 60.0);
        let by_user = totals(&jobs, GroupBy::User, &GpuTypes::new());
        let alice = &by_user["alice"];
        assert_eq!((alice.jobs, alice.succeeded, alice.failed), (2, 1, 1));
        assert!((alice.gpu_hours() - 3.5).abs() < 1e-9);
        let by_node = totals(&jobs, GroupBy::Node, &GpuTypes::new());
        assert!((by_node["n1"].gpu_hours() - 3.0).abs() < 1e-9);
        assert_eq!(by_node["n2"].failed, 1);
        let by_state = totals(&jobs, GroupBy::State, &GpuTypes::new());
        assert_eq!(by_state["failed"].jobs, 1);
        assert_eq!(by_state["succeeded"].jobs, 1);
        let types: GpuTypes = [(("n1".to_owned(), 0), "h100".to_owned())].into();
        let by_type = totals(&jobs, GroupBy::Type, &types);
        // n1's GPU 0 is an H100; every other GPU's type is unknown.
        assert!(by_type["h100"].gpu_hours() > 0.0, "{by_type:?}");
        let all: f64 = by_type.values().map(Totals::gpu_hours).sum();
        let by_user_all: f64 = by_user.values().map(Totals::gpu_hours).sum();
        assert!(
            (all - by_user_all).abs() < 1e-9,
            "the same hours, split otherwise"
        );
    }

    #[test]
    fn preempted_gpu_time_is_counted_once_whatever_the_grouping() {
        let mut job = ran("n1", 2, 60, false);
        job.preemptions.push(mgpu_protocol::stop::Preemption {
            attempt: 1,
            by: "4f2a1b2c3d (bob)".into(),
            gpu_seconds: 1800,
            within_grace: true,
        });
        let jobs = [job, ran("n2", 1, 30, false)];
        let by_user = totals(&jobs, GroupBy::User, &GpuTypes::new());
        assert_eq!(by_user["alice"].preemptions, 1);
        assert!((by_user["alice"].preempted_gpu_hours() - 0.5).abs() < 1e-9);
        let by_node = totals(&jobs, GroupBy::Node, &GpuTypes::new());
        let split: f64 = by_node.values().map(Totals::preempted_gpu_hours).sum();
        assert!((split - 0.5).abs() < 1e-9, "{by_node:?}");
    }

    #[test]
    fn idle_gpu_time_comes_from_the_usage_and_is_split_like_the_gpu_time() {
        let mut idle = ran("n1", 2, 60, false);
        if let JobState::Succeeded(end) = &mut idle.state {
            end.usage = Some(mgpu_protocol::host::JobUsage {
                idle_gpu_secs: Some(1_800),
                ..mgpu_protocol::host::JobUsage::default()
            });
        }
        let jobs = [idle, ran("n2", 1, 30, false)];
        assert_eq!(idle_gpu_seconds(&jobs[0]), 1_800.0);
        assert_eq!(idle_gpu_seconds(&jobs[1]), 0.0, "not measured: none");
        let by_user = totals(&jobs, GroupBy::User, &GpuTypes::new());
        assert!((by_user["alice"].idle_gpu_hours() - 0.5).abs() < 1e-9);
        let by_node = totals(&jobs, GroupBy::Node, &GpuTypes::new());
        assert!((by_node["n1"].idle_gpu_hours() - 0.5).abs() < 1e-9);
        assert_eq!(by_node["n2"].idle_gpu_seconds, 0.0);
        let types: GpuTypes = [(("n1".to_owned(), 0), "h100".to_owned())].into();
        let by_type = totals(&jobs, GroupBy::Type, &types);
        // One of n1's two GPUs is an H100: half the job's idle time is counted there.
        assert!((by_type["h100"].idle_gpu_hours() - 0.25).abs() < 1e-9);
        let split: f64 = by_type.values().map(Totals::idle_gpu_hours).sum();
        assert!((split - 0.5).abs() < 1e-9, "{by_type:?}");
    }
}
