//! A node as the listings see it: its state worked out as the scheduler does (offline once
//! more heartbeats are overdue than the policy's `missed_heartbeats`), and its GPUs counted
//! free, busy or paused from the running jobs' records and the admins' marks.

use std::collections::BTreeSet;

use mgpu_protocol::Timestamp;
use mgpu_protocol::job::{JobRecord, JobState};
use mgpu_protocol::node::{GpuSource, NodeAdmin, NodeHeartbeat};
use serde::Serialize;

/// One node as `mgpu queue` shows it, and as its `--json` prints it.
#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct NodeRow {
    pub node: String,
    pub state: NodeState,
    pub last_heartbeat: Timestamp,
    pub gpus_total: usize,
    /// GPUs no running job holds and no admin paused.
    pub gpus_free: usize,
    pub gpus_paused: usize,
    /// Jobs running there (by the records and the node's own report).
    pub jobs_running: usize,
    /// Drained or not, paused GPUs: what `mgpu node` and `mgpu gpu` set.
    pub admin: NodeAdmin,
    #[serde(skip)]
    pub mem_used_mib: u64,
    #[serde(skip)]
    pub mem_total_mib: u64,
    pub gpu_source: GpuSource,
}

impl NodeRow {
    /// The node of `beat`, given the job records (only running ones count) and its admin
    /// marks. `missed_heartbeats` is the scheduler's policy: the node is offline once that
    /// many heartbeats are overdue, exactly when the scheduler gives up on it.
    pub fn new(
        beat: &NodeHeartbeat,
        jobs: &[JobRecord],
        admin: Option<&NodeAdmin>,
        now: Timestamp,
        missed_heartbeats: u32,
    ) -> NodeRow {
        let busy = busy_gpus(&beat.node, jobs);
        let admin = admin.cloned().unwrap_or_default();
        let recorded = jobs
            .iter()
            .filter(|job| {
                matches!(&job.state, JobState::Running(run) if run.placement.uses_node(&beat.node))
            })
            .count();
        let jobs_running = recorded.max(beat.running.len());
        let liveness = beat.liveness_after(now, missed_heartbeats);
        let paused = |index: &u32| admin.paused_gpus.contains_key(index);
        NodeRow {
            node: beat.node.clone(),
            state: NodeState::of(liveness, admin.drained.is_some(), jobs_running),
            last_heartbeat: beat.sent_at,
            gpus_total: beat.gpus.len(),
            gpus_free: beat
                .gpus
                .iter()
                .filter(|g| !busy.contains(&g.index) && !paused(&g.index))
                .count(),
            gpus_paused: beat.gpus.iter().filter(|g| paused(&g.index)).count(),
            jobs_running,
            mem_used_mib: beat.gpus.iter().map(|g| g.memory_used_mib).sum(),
            mem_total_mib: beat.gpus.iter().map(|g| g.memory_total_mib).sum(),
            gpu_source: beat.gpu_source,
            admin,
        }
    }
}

/// GPUs of `node` on which a running job holds any share: a shared GPU is not free.
pub fn busy_gpus(node: &str, jobs: &[JobRecord]) -> BTreeSet<u32> {
    jobs.iter()
        .filter_map(|job| match &job.state {
            JobState::Running(run) => run.placement.gpus_on(node),
            _ => None,
        })
        .flat_map(|gpus| gpus.iter().map(|g| g.index))
        .collect()
}

/// Shared with `mgpu top`, whose screen draws node states the same way.
pub use crate::commands::top::screen::rows::NodeState;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{finished, heartbeat, job, queued, running};
    use chrono::Duration;
    use mgpu_protocol::gpu_amount::GpuAmount;
    use mgpu_protocol::node::AdminMark;

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
        let row = NodeRow::new(&heartbeat("n1", 4), &jobs, None, mgpu_protocol::now(), 3);
        assert_eq!((row.gpus_free, row.gpus_total), (1, 4));
        assert_eq!((row.mem_used_mib, row.mem_total_mib), (600, 4_000));
        assert_eq!(row.state, NodeState::Online);
        assert_eq!(row.jobs_running, 2);
        assert_eq!(busy_gpus("n1", &jobs), BTreeSet::from([0, 2, 3]));
    }

    #[test]
    fn drained_nodes_and_paused_gpus_show() {
        let mark = AdminMark {
            by: "root".into(),
            at: mgpu_protocol::now(),
            reason: None,
        };
        let mut admin = NodeAdmin::default();
        admin.paused_gpus.insert(1, mark.clone());
        let now = mgpu_protocol::now();
        let row = NodeRow::new(&heartbeat("n1", 4), &[], Some(&admin), now, 3);
        assert_eq!((row.gpus_free, row.gpus_paused), (3, 1));
        assert_eq!(row.state, NodeState::Online);
        admin.drained = Some(mark);
        let idle = NodeRow::new(&heartbeat("n1", 4), &[], Some(&admin), now, 3);
        assert_eq!(idle.state, NodeState::Drained);
        let busy = vec![job("a", running("n1", &[(0, GpuAmount::ONE)]), 0, 1)];
        let draining = NodeRow::new(&heartbeat("n1", 4), &busy, Some(&admin), now, 3);
        assert_eq!(draining.state, NodeState::Draining);
        let json = serde_json::to_value(&draining).unwrap_or_default();
        assert_eq!(json["state"], "draining");
        assert_eq!(json["admin"]["drained"]["by"], "root");
        assert_eq!(json["gpus_paused"], 1);
    }

    #[test]
    fn a_silent_node_is_offline_after_the_policys_missed_heartbeats() {
        let now = mgpu_protocol::now();
        let mut beat = heartbeat("n1", 1);
        // Interval 2 s, last heard 5 s ago: two and a half heartbeats missed.
        beat.sent_at = now - Duration::milliseconds(5_000);
        let state =
            |admin: Option<&NodeAdmin>, missed| NodeRow::new(&beat, &[], admin, now, missed).state;
        assert_eq!(state(None, 3), NodeState::Online);
        assert_eq!(state(None, 2), NodeState::Offline);
        // Offline wins over a drain.
        let admin = NodeAdmin {
            drained: Some(AdminMark {
                by: "root".into(),
                at: now,
                reason: None,
            }),
            ..NodeAdmin::default()
        };
        let row = NodeRow::new(&beat, &[], Some(&admin), now, 2);
        assert_eq!(row.state, NodeState::Offline);
        let json = serde_json::to_value(&row).unwrap_or_default();
        assert_eq!(json["state"], "offline");
    }
}
