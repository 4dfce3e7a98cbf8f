//! A node agent's heartbeat: published on `nodes.heartbeat.<node>` and kept (last one per
//! node) in the `MGPU_NODES` stream, so `mgpu nodes` works without the scheduler.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::Timestamp;
use crate::duration::MAX_TIME_LIMIT;
use crate::error::InvalidInput;
use crate::gpu_amount::{GpuAmount, MAX_GPU_MEMORY_MIB};
use crate::ids::{JobId, validate_node_name};
use crate::wire::{
    MAX_LINE_BYTES, MAX_USER_BYTES, check_count, check_line, check_text, check_user,
};

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
#[serde(deny_unknown_fields)]
pub struct ForeignProcess {
    pub pid: u32,
    pub used_mib: u64,
    /// The Unix account it runs as, where the agent can see it (its `/proc` entry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuStatus {
    /// Physical index (NVML's numbering, the one `CUDA_VISIBLE_DEVICES` gets with PCI_BUS_ID order).
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// Its type as jobs ask for it (`h100`, `a100-80gb`: `gpu_type`), from its model or the
    /// node's configuration; None where the agent could not tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    pub memory_total_mib: u64,
    pub memory_used_mib: u64,
    /// Percent of time a kernel ran over the last sample period.
    pub utilization_pct: u32,
    /// Core temperature in °C, where NVML reads it (None for declared GPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_c: Option<u32>,
    /// Power draw in watts, where NVML reads it (None for declared GPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_w: Option<u32>,
    #[serde(default)]
    pub foreign_processes: Vec<ForeignProcess>,
}

impl GpuStatus {
    fn validate(&self) -> Result<(), InvalidInput> {
        if self.index >= GpuAmount::MAX_GPUS {
            return Err(InvalidInput::new(format!(
                "GPU index {} is absurd",
                self.index
            )));
        }
        check_line("GPU uuid", &self.uuid, MAX_USER_BYTES)?;
        check_line("GPU name", &self.name, MAX_USER_BYTES)?;
        if self.memory_total_mib > MAX_GPU_MEMORY_MIB || self.memory_used_mib > MAX_GPU_MEMORY_MIB {
            return Err(InvalidInput::new(format!(
                "GPU {}: {} MiB total, {} MiB used is not plausible",
                self.index, self.memory_total_mib, self.memory_used_mib
            )));
        }
        if self.temperature_c.is_some_and(|t| t > 200) || self.power_w.is_some_and(|w| w > 100_000)
        {
            return Err(InvalidInput::new(format!(
                "GPU {}: {:?} °C, {:?} W is not plausible",
                self.index, self.temperature_c, self.power_w
            )));
        }
        if self.utilization_pct > 100 {
            return Err(InvalidInput::new(format!(
                "GPU {}: utilisation {}% is above 100%",
                self.index, self.utilization_pct
            )));
        }
        check_count("foreign processes", self.foreign_processes.len(), 4096)?;
        for process in &self.foreign_processes {
            if let Some(user) = &process.user {
                check_line("foreign process owner", user, MAX_USER_BYTES)?;
            }
        }
        if let Some(p) = self
            .foreign_processes
            .iter()
            .find(|p| p.used_mib > MAX_GPU_MEMORY_MIB)
        {
            return Err(InvalidInput::new(format!(
                "GPU {}: process {} using {} MiB is not plausible",
                self.index, p.pid, p.used_mib
            )));
        }
        Ok(())
    }
}

/// A job attempt the agent is running.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunningJob {
    pub id: JobId,
    pub attempt: u32,
    pub pid: u32,
    /// How idle its GPUs are, where its assignment asked for it to be measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<crate::idle::IdleSample>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// How the agent contains its jobs, in words: `cgroup v1 (…)`, or `process group only
    /// (why)`. None from an agent that does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containment: Option<String>,
    /// Whether a job here can open only its own GPUs' device nodes (its cgroup's device
    /// filter); the scheduler's `require_gpu_isolation` places nothing where this is false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gpu_isolation: bool,
    /// CPU cores jobs may be given here (`--cpus` is counted against them); None from an
    /// agent that does not say: not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// Host memory (RAM) in MiB jobs may be given here (`--mem-host`); None: not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_host_mib: Option<u64>,
    pub agent_version: String,
    /// The wire protocol the agent speaks (`version::PROTOCOL`); read first, alone, by the
    /// scheduler, which marks a node of another protocol incompatible.
    #[serde(default = "crate::version::unversioned")]
    pub protocol: u32,
    /// A GPU whose memory used by processes mgpu did not start exceeds this share of its
    /// total is not offered.
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
    /// Operator-given features (`--feature ib`, `feature = ["ib", "nvlink"]`), which jobs select nodes by
    /// (`--constraint`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
}

pub const DEFAULT_THRESHOLD: f64 = 0.8;

/// `runs_jobs_as` of an agent that runs each job as its owner's Unix account.
pub const RUNS_AS_OWNER: &str = "<owner>";

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
    /// The requests stream's sequence of the last drain, resume, pause or resume applied:
    /// one of them delivered again after a later one was applied is not applied again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_request: Option<u64>,
}

/// Who put a node or GPU out of service, when and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminMark {
    pub by: String,
    pub at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
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
        // Saturating: a heartbeat loaded from the stream was not validated, and chrono
        // panics on an overflowing addition.
        let total = chrono::TimeDelta::try_milliseconds(i64::try_from(total).unwrap_or(i64::MAX))
            .unwrap_or(chrono::TimeDelta::MAX);
        Some(
            self.sent_at
                .checked_add_signed(total)
                .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC),
        )
    }

    /// Checks a heartbeat received at `now`: a valid node name, plausible GPUs, thresholds
    /// between 0 and 1, intervals no longer than the longest time limit, and a send time
    /// near `now` (one from the far future would keep the node online forever).
    pub fn validate(&self, now: Timestamp) -> Result<(), InvalidInput> {
        validate_node_name(&self.node)?;
        crate::wire::check_time("sent_at", self.sent_at, now)?;
        let longest = u64::try_from(MAX_TIME_LIMIT.as_millis()).unwrap_or(u64::MAX);
        if self.interval_ms == 0 || self.interval_ms > longest {
            return Err(InvalidInput::new(format!(
                "heartbeat interval of {} ms is outside 1 ms..366 days",
                self.interval_ms
            )));
        }
        for (what, ms) in [
            ("fence_after_ms", self.fence_after_ms.unwrap_or(0)),
            ("kill_grace_ms", self.kill_grace_ms),
        ] {
            if ms > longest {
                return Err(InvalidInput::new(format!(
                    "{what} of {ms} ms is longer than 366 days"
                )));
            }
        }
        for (what, share) in [
            ("mem_threshold", self.mem_threshold),
            ("load_threshold", self.load_threshold),
        ] {
            // NaN fails this test too.
            if !(0.0..=1.0).contains(&share) {
                return Err(InvalidInput::new(format!("{what} {share} is outside 0..1")));
            }
        }
        if let Some(note) = &self.gpu_note {
            check_text("gpu_note", note, crate::wire::MAX_TEXT_BYTES)?;
        }
        check_count("GPUs", self.gpus.len(), GpuAmount::MAX_GPUS as usize)?;
        let mut seen = std::collections::BTreeSet::new();
        for gpu in &self.gpus {
            gpu.validate()?;
            if !seen.insert(gpu.index) {
                return Err(InvalidInput::new(format!(
                    "GPU {} is listed twice",
                    gpu.index
                )));
            }
        }
        check_count("running jobs", self.running.len(), 100_000)?;
        for job in &self.running {
            if let Some(idle) = &job.idle {
                idle.validate()?;
            }
        }
        crate::wire::check_address(&self.address)?;
        check_user("runs_jobs_as", &self.runs_jobs_as)?;
        if let Some(containment) = &self.containment {
            check_line("containment", containment, MAX_LINE_BYTES)?;
        }
        if self.cpus.is_some_and(|cpus| cpus > crate::host::MAX_CPUS)
            || self
                .mem_host_mib
                .is_some_and(|mib| mib > crate::host::MAX_MEM_HOST_MIB)
        {
            return Err(InvalidInput::new(format!(
                "{:?} CPUs and {:?} MiB of host memory are not plausible",
                self.cpus, self.mem_host_mib
            )));
        }
        check_line("agent_version", &self.agent_version, 64)?;
        check_count("labels", self.labels.len(), 64)?;
        for (key, value) in &self.labels {
            check_line("label name", key, 64)?;
            check_line("label value", value, MAX_USER_BYTES)?;
        }
        Ok(())
    }

    /// Online while fewer than [`MISSED_HEARTBEATS_OFFLINE`] heartbeats were missed.
    pub fn liveness(&self, now: Timestamp) -> NodeLiveness {
        self.liveness_after(now, MISSED_HEARTBEATS_OFFLINE)
    }

    /// Online while fewer than `missed` heartbeats were missed (the scheduler's policy).
    pub fn liveness_after(&self, now: Timestamp, missed: u32) -> NodeLiveness {
        // Checked: `Duration * u32` panics on overflow, and an unvalidated interval may be huge.
        let allowed = Duration::from_millis(self.interval_ms.max(1))
            .checked_mul(missed.max(1))
            .unwrap_or(Duration::MAX);
        let age = (now - self.sent_at).to_std().unwrap_or(Duration::ZERO);
        if age <= allowed {
            NodeLiveness::Online
        } else {
            NodeLiveness::Offline
        }
    }
}
