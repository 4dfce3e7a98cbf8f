//! Where a job runs: its nodes by rank, the GPUs (or shares) it holds on each, and how a
//! multi-node or distributed job is launched.

use super::*;
use crate::gpu_amount::MAX_GPU_MEMORY_MIB;

/// One GPU (or a share of it) given to a job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuShare {
    /// Physical index on the node (NVML's numbering).
    pub index: u32,
    /// Share of that GPU held by the job (1 for a whole GPU).
    pub amount: GpuAmount,
    /// GPU memory booked for the job on that GPU, in MiB (0 when none was asked for).
    #[serde(default)]
    pub mem_mib: u64,
}

/// Where a job runs: its first node (rank 0) and, for a multi-node job, the others.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    pub node: String,
    pub gpus: Vec<GpuShare>,
    /// Ranks 1.. of a multi-node job, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<NodeShare>,
    /// How a multi-node or distributed job is launched; None for a plain one-node job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch: Option<Launch>,
    /// CPU cores booked for the job on each of its nodes (0: none counted).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub cpus: u32,
    /// Host memory booked for the job on each of its nodes, in MiB, and its cgroup's limit
    /// there (0: none counted, no limit).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub mem_host_mib: u64,
}

fn is_zero_u32(value: &u32) -> bool {
    *value == 0
}

fn is_zero_u64(value: &u64) -> bool {
    *value == 0
}

/// One further node of a multi-node job and the GPUs it holds there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeShare {
    pub node: String,
    pub gpus: Vec<GpuShare>,
}

/// The rendezvous of a multi-node or distributed job, filled in by the scheduler when it
/// places the job, so every rank gets the same values.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Launch {
    /// The command runs once per node (`--distributed`), not only on rank 0.
    pub distributed: bool,
    /// The address each rank's node is reachable at, by rank (`MASTER_ADDR` is the first).
    pub addresses: Vec<String>,
    /// `MASTER_PORT`: chosen from the job id, the same for every rank.
    pub master_port: u16,
}

impl Placement {
    /// Checks a placement another program wrote (an assignment, an `assigned` event): valid
    /// and distinct node names, plausible GPUs, one address per node.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        crate::wire::check_count(
            "nodes in a placement",
            self.node_count(),
            MAX_JOB_NODES as usize,
        )?;
        let mut names: Vec<&str> = Vec::with_capacity(self.node_count());
        for (_, node, gpus) in self.ranks() {
            crate::ids::validate_node_name(node)?;
            if names.contains(&node) {
                return Err(InvalidInput::new(format!(
                    "the placement names node {node} twice"
                )));
            }
            names.push(node);
            crate::wire::check_count("GPUs on a node", gpus.len(), GpuAmount::MAX_GPUS as usize)?;
            for gpu in gpus {
                check_gpu_index(gpu.index)?;
                if gpu.mem_mib > MAX_GPU_MEMORY_MIB {
                    return Err(InvalidInput::new(format!(
                        "{} MiB on GPU {} is not a plausible memory size",
                        gpu.mem_mib, gpu.index
                    )));
                }
            }
        }
        if let Some(launch) = &self.launch {
            if launch.addresses.len() != self.node_count() {
                return Err(InvalidInput::new(format!(
                    "the placement has {} node(s) but {} address(es)",
                    self.node_count(),
                    launch.addresses.len()
                )));
            }
            for address in &launch.addresses {
                crate::wire::check_address(address)?;
            }
        }
        Ok(())
    }

    /// A one-node placement.
    pub fn single(node: impl Into<String>, gpus: Vec<GpuShare>) -> Self {
        Placement {
            node: node.into(),
            gpus,
            peers: Vec::new(),
            launch: None,
            cpus: 0,
            mem_host_mib: 0,
        }
    }

    /// Rank 0's GPU indices.
    pub fn gpu_indices(&self) -> Vec<u32> {
        self.gpus.iter().map(|g| g.index).collect()
    }

    /// Every node with its rank and GPUs, rank 0 first.
    pub fn ranks(&self) -> impl Iterator<Item = (u32, &str, &[GpuShare])> {
        std::iter::once((self.node.as_str(), self.gpus.as_slice()))
            .chain(
                self.peers
                    .iter()
                    .map(|p| (p.node.as_str(), p.gpus.as_slice())),
            )
            .enumerate()
            .map(|(rank, (node, gpus))| (rank as u32, node, gpus))
    }

    pub fn node_count(&self) -> usize {
        1 + self.peers.len()
    }

    pub fn node_names(&self) -> Vec<&str> {
        self.ranks().map(|(_, node, _)| node).collect()
    }

    /// Whether any rank is on `node`.
    pub fn uses_node(&self, node: &str) -> bool {
        self.rank_of(node).is_some()
    }

    pub fn rank_of(&self, node: &str) -> Option<u32> {
        self.ranks().find(|(_, n, _)| *n == node).map(|(r, _, _)| r)
    }

    /// The GPUs held on `node`, if the job holds any there.
    pub fn gpus_on(&self, node: &str) -> Option<&[GpuShare]> {
        self.ranks().find(|(_, n, _)| *n == node).map(|(_, _, g)| g)
    }

    /// Whether the command runs everywhere (`--distributed`) or only on rank 0.
    pub fn distributed(&self) -> bool {
        self.launch.as_ref().is_some_and(|l| l.distributed)
    }

    /// The ranks where a process runs, with their nodes: all of them for a distributed job,
    /// rank 0 otherwise (the other nodes' GPUs are held for it, to use through the hostfile).
    pub fn launched_ranks(&self) -> Vec<(u32, &str)> {
        let everywhere = self.distributed();
        self.ranks()
            .filter(|(rank, _, _)| everywhere || *rank == 0)
            .map(|(rank, node, _)| (rank, node))
            .collect()
    }

    /// Whether a process of this job runs on `node`.
    pub fn launches_on(&self, node: &str) -> bool {
        self.launched_ranks().iter().any(|(_, n)| *n == node)
    }

    /// Nodes for listings: `node001` or `node001,node002`.
    pub fn nodes_label(&self) -> String {
        self.node_names().join(",")
    }

    /// Whole or shared GPUs held on all nodes together.
    pub fn total_gpus(&self) -> f64 {
        self.ranks()
            .flat_map(|(_, _, gpus)| gpus.iter().map(|g| g.amount.as_f64()))
            .sum()
    }
}
