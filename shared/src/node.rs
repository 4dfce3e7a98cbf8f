//! A node agent's heartbeat: published on `nodes.heartbeat.<node>` and kept (last one per
//! node) in the `MGPU_NODES` stream, so `mgpu nodes` works without the scheduler.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::Timestamp;
use crate::ids::JobId;

/// Where the agent's GPU list comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuSource {
    /// Read from the NVIDIA driver through NVML.
    Nvml,
    /// Declared by the operator (`--gpus 2x24GiB`), because NVML is not available or was overridden.
    Declared,
}

/// A process using a GPU that mgpu did not start (a colleague's notebook, say).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForeignProcess {
    pub pid: u32,
    pub used_mib: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuStatus {
    /// Physical index (NVML's numbering, the one `CUDA_VISIBLE_DEVICES` gets with PCI_BUS_ID order).
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total_mib: u64,
    pub memory_used_mib: u64,
    /// Percent of time a kernel ran over the last sample period.
    pub utilization_pct: u32,
    #[serde(default)]
    pub foreign_processes: Vec<ForeignProcess>,
}

/// A job attempt the agent is running.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningJob {
    pub id: JobId,
    pub attempt: u32,
    pub pid: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeHeartbeat {
    pub node: String,
    pub sent_at: Timestamp,
    /// How often the agent heartbeats; the node counts as offline after a few missed ones.
    pub interval_ms: u64,
    pub gpu_source: GpuSource,
    /// Set when NVML could not be used, saying why (shown by `mgpu nodes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_note: Option<String>,
    pub gpus: Vec<GpuStatus>,
    pub running: Vec<RunningJob>,
    /// Address other nodes can reach this one at.
    pub address: String,
    /// The Unix account jobs run as.
    pub runs_jobs_as: String,
    pub agent_version: String,
    /// A GPU whose memory used by processes mgpu did not start exceeds this share of its
    /// total is not offered (seed 004's `--mem-threshold`).
    #[serde(default = "default_threshold")]
    pub mem_threshold: f64,
    /// A GPU running no mgpu job whose utilisation exceeds this share is not offered.
    #[serde(default = "default_threshold")]
    pub load_threshold: f64,
    /// The agent stops its jobs when it could not store a heartbeat for this long (its
    /// `--fence-after`); None when it does not fence itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence_after_ms: Option<u64>,
    /// How long a stopped job gets between SIGTERM and SIGKILL on this node.
    #[serde(default)]
    pub kill_grace_ms: u64,
    /// Operator-given labels (`--label rack=r1`): multi-node jobs prefer nodes that share
    /// the value of the scheduler's topology label.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
}

pub const DEFAULT_THRESHOLD: f64 = 0.8;

fn default_threshold() -> f64 {
    DEFAULT_THRESHOLD
}

/// Administrative state of a node, kept by the scheduler under `node.<name>` in the cluster
/// bucket so it survives restarts of every component.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAdmin {
    /// Set while the node is drained: running jobs finish, nothing new lands there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained: Option<AdminMark>,
    /// Paused GPUs by index: running jobs finish, nothing new lands on them.
    #[serde(default)]
    pub paused_gpus: std::collections::BTreeMap<u32, AdminMark>,
}

/// Who put a node or GPU out of service, when and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminMark {
    pub by: String,
    pub at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Payload of `admin.requests` (admins only, enforced by the server's permissions).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum AdminRequest {
    DrainNode {
        node: String,
        by: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    ResumeNode {
        node: String,
        by: String,
    },
    PauseGpu {
        node: String,
        index: u32,
        by: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    ResumeGpu {
        node: String,
        index: u32,
        by: String,
    },
}

/// Heartbeats missed before a node counts as offline.
pub const MISSED_HEARTBEATS_OFFLINE: u32 = 3;

/// What listings say about a node's liveness.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeLiveness {
    Online,
    Offline,
}

impl NodeHeartbeat {
    /// When every job this node ran is surely dead if the node went silent after this
    /// heartbeat: its agent fenced itself and the kill grace passed (plus one interval for
    /// the fence check). None when the agent does not fence itself.
    pub fn jobs_dead_by(&self) -> Option<Timestamp> {
        let fence = self.fence_after_ms?;
        // The guards fence half an interval after the agent and look every 100 ms at most;
        // the half second on top covers that and a slow final SIGKILL.
        let total = fence
            .saturating_add(self.kill_grace_ms)
            .saturating_add(self.interval_ms)
            .saturating_add(500);
        Some(
            self.sent_at + chrono::Duration::milliseconds(i64::try_from(total).unwrap_or(i64::MAX)),
        )
    }

    /// Online while fewer than [`MISSED_HEARTBEATS_OFFLINE`] heartbeats were missed.
    pub fn liveness(&self, now: Timestamp) -> NodeLiveness {
        self.liveness_after(now, MISSED_HEARTBEATS_OFFLINE)
    }

    /// Online while fewer than `missed` heartbeats were missed (the scheduler's policy).
    pub fn liveness_after(&self, now: Timestamp, missed: u32) -> NodeLiveness {
        let allowed = Duration::from_millis(self.interval_ms.max(1)) * missed.max(1);
        let age = (now - self.sent_at).to_std().unwrap_or(Duration::ZERO);
        if age <= allowed {
            NodeLiveness::Online
        } else {
            NodeLiveness::Offline
        }
    }
}
