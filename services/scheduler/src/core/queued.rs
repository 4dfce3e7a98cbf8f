//! A queued job as the core sees it: what it needs (GPUs, their types, memory, cores, nodes
//! and their features, pins), its place in line (and the key a pass sorts by), which nodes
//! and GPUs it may use, and the reasons it waits before its room is looked at.

use std::time::Duration;

use mgpu_protocol::Timestamp;
use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::gpu_type::Constraint;
use mgpu_protocol::ids::JobId;
use std::collections::HashMap;

use mgpu_protocol::job::{NodeGpuIds, WaitReason};

/// Whether a queued job's `--after` / `--after-any` are met.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dependencies {
    Met,
    Waiting,
    /// A dependency ended in a way that means this job can never run.
    Broken(String),
}

/// What a queued job needs, and its place in line.
#[derive(Clone, Debug, PartialEq)]
pub struct QueuedJob {
    pub id: JobId,
    /// The user it belongs to (caps on running GPUs are per user).
    pub owner: String,
    pub effective_priority: i64,
    pub queued_at: Timestamp,
    pub gpus: GpuAmount,
    pub gpu_ids: Option<Vec<u32>>,
    pub allowed_gpus: Option<Vec<u32>>,
    pub mem_mib: Option<u64>,
    /// CPU cores it needs on each node (its `--cpus`, or the cluster's `cpus_per_gpu`); 0:
    /// not counted.
    pub cpus: u32,
    /// Host memory in MiB it needs on each node (`--mem-host`, or `mem_per_gpu`); 0: none.
    pub mem_host_mib: u64,
    /// How long it may run (its own limit, capped by the cluster's); None: unlimited.
    pub time_limit: Option<Duration>,
    pub held: bool,
    pub dependencies: Dependencies,
    /// Its array and the array's `%N`.
    pub array: Option<(JobId, Option<u32>)>,
    /// Nodes it spans (1 for most jobs); `gpus` is per node.
    pub nodes: u32,
    /// Nodes it must run on, in rank order (`--nodelist`, or `--node-gpu-ids`'s nodes).
    pub required_nodes: Vec<String>,
    /// Nodes it must not run on.
    pub exclude: Vec<String>,
    /// GPUs pinned per node (`--node-gpu-ids`); when set, only those nodes may take it.
    pub node_gpu_ids: Vec<NodeGpuIds>,
    /// Not to start before then (its previous attempt's node is fencing itself).
    pub not_before: Option<Timestamp>,
    /// Why it waits according to its record, if known: the pass decides `Wait` only for a
    /// different reason.
    pub recorded_reason: Option<WaitReason>,
    /// The attempt it would start as: above 1, an earlier attempt may still run somewhere.
    pub attempt: u32,
    /// GPU types it takes, preferred first; empty: any. All of a placement's GPUs are of one.
    pub gpu_types: Vec<String>,
    /// The node features it needs.
    pub constraint: Option<Constraint>,
    /// Its quality-of-service class (`--qos`; None: `normal`).
    pub qos: Option<String>,
    /// Its class may stop preemptible jobs for it to start.
    pub may_preempt: bool,
    /// Its class is preemptible: a job past its time slice does not yield to it when it may
    /// preempt it back at once.
    pub preemptible: bool,
    /// How long it runs at least before it may be preempted (its class's `min_runtime`);
    /// None: never preempted (its class is not preemptible, or it is `--no-requeue`).
    pub stoppable_after: Option<Duration>,
    /// The reservation it runs in (`--reservation`); None: none.
    pub reservation: Option<String>,
}

impl QueuedJob {
    /// A job asking for `gpus` on one node, with no other constraint, queued at `queued_at`
    /// (what tests and the benchmark of the core build on).
    pub fn new(id: JobId, gpus: GpuAmount, queued_at: Timestamp) -> Self {
        QueuedJob {
            id,
            owner: String::new(),
            effective_priority: 0,
            queued_at,
            gpus,
            gpu_ids: None,
            allowed_gpus: None,
            mem_mib: None,
            cpus: 0,
            mem_host_mib: 0,
            time_limit: None,
            held: false,
            dependencies: Dependencies::Met,
            array: None,
            nodes: 1,
            required_nodes: Vec::new(),
            exclude: Vec::new(),
            node_gpu_ids: Vec::new(),
            not_before: None,
            recorded_reason: None,
            attempt: 1,
            gpu_types: Vec::new(),
            constraint: None,
            qos: None,
            may_preempt: false,
            preemptible: false,
            stoppable_after: None,
            reservation: None,
        }
    }

    /// The GPU ids pinned on `node` (`--node-gpu-ids`, else `--gpu-ids`), if any.
    pub fn pinned_on(&self, node: &str) -> Option<&[u32]> {
        if self.node_gpu_ids.is_empty() {
            return self.gpu_ids.as_deref();
        }
        self.node_gpu_ids
            .iter()
            .find(|n| n.node == node)
            .map(|n| n.gpu_ids.as_slice())
    }

    /// Whether `node` may hold a part of this job at all.
    pub fn may_use_node(&self, node: &str) -> bool {
        !self.exclude.iter().any(|n| n == node)
            && (self.node_gpu_ids.is_empty() || self.node_gpu_ids.iter().any(|n| n.node == node))
    }

    /// Whether a node with `features` satisfies this job's `--constraint`.
    pub fn selects_node(&self, features: &[String]) -> bool {
        self.constraint
            .as_ref()
            .is_none_or(|constraint| constraint.holds_for(features))
    }

    /// Whether a GPU of `gpu_type` is one of the types this job takes.
    pub fn takes_type(&self, gpu_type: Option<&str>) -> bool {
        self.gpu_types.is_empty()
            || gpu_type.is_some_and(|t| self.gpu_types.iter().any(|wanted| wanted == t))
    }

    /// Whether GPU `index` of `node` is one this job may get: among its pinned ids
    /// (`--gpu-ids`, `--node-gpu-ids`) and its allowed GPUs (job files' `allowed_gpus`).
    pub fn may_use_gpu(&self, node: &str, index: u32) -> bool {
        self.may_use_node(node)
            && self.pinned_on(node).is_none_or(|ids| ids.contains(&index))
            && self
                .allowed_gpus
                .as_ref()
                .is_none_or(|allowed| allowed.contains(&index))
    }
}

/// A queued job's place in line as integers: effective priority (highest first), then queue
/// time; the id breaks ties (see `queue_order` in the tests).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct QueueKey {
    priority: std::cmp::Reverse<i64>,
    queued_secs: i64,
    queued_nanos: u32,
}

impl QueueKey {
    pub(super) fn of(job: &QueuedJob) -> Self {
        QueueKey {
            priority: std::cmp::Reverse(job.effective_priority),
            queued_secs: job.queued_at.timestamp(),
            queued_nanos: job.queued_at.timestamp_subsec_nanos(),
        }
    }
}

/// Why `job` waits (`Ok`) or can never run (`Err`, the reason) before its room is looked at:
/// a hold, its node's fence, its dependencies, its array's `%N`; None when none of them
/// keeps it.
pub(super) fn before_room(
    job: &QueuedJob,
    array_running: &HashMap<JobId, u32>,
    now: Timestamp,
) -> Option<Result<WaitReason, String>> {
    if job.held {
        return Some(Ok(WaitReason::Held));
    }
    if job.not_before.is_some_and(|t| t > now) {
        return Some(Ok(WaitReason::Fencing));
    }
    match &job.dependencies {
        Dependencies::Met => {}
        Dependencies::Waiting => return Some(Ok(WaitReason::Dependency)),
        Dependencies::Broken(reason) => return Some(Err(reason.clone())),
    }
    match &job.array {
        Some((array, Some(limit))) if array_running.get(array).copied().unwrap_or(0) >= *limit => {
            Some(Ok(WaitReason::ArrayLimit))
        }
        _ => None,
    }
}
