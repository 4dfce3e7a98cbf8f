//! Free capacity of the online nodes during one pass, and fitting one job onto it.

use mgpu_shared::gpu_amount::GpuAmount;
use mgpu_shared::job::{GpuShare, Placement};
use mgpu_shared::priority::PlacementPolicy;

use super::{NodeView, QueuedJob, RunningJob};

/// One GPU's room left while a pass places jobs.
#[derive(Clone, Debug)]
pub(super) struct FreeGpu {
    pub index: u32,
    pub units: u32,
    pub memory_mib: u64,
    /// Not paused and node not drained.
    pub in_service: bool,
    /// Not busy with processes mgpu did not start (memory and load thresholds).
    pub unbusy: bool,
}

impl FreeGpu {
    /// Offered to new work now.
    pub fn offered(&self) -> bool {
        self.in_service && self.unbusy
    }
}

pub(super) struct FreeNode {
    pub name: String,
    pub gpus: Vec<FreeGpu>,
    /// Node-level switch for CPU-only jobs (a drained node takes nothing).
    pub offered: bool,
}

pub(super) struct Capacity {
    pub nodes: Vec<FreeNode>,
}

/// Which GPUs a placement may use.
pub(super) struct Constraints<'a> {
    /// Only GPUs in service: not paused, node not drained (false: to tell why a job waits).
    pub in_service_only: bool,
    /// Only GPUs not busy with foreign work (false: to tell why a job waits).
    pub unbusy_only: bool,
    /// GPUs held for someone else (backfill reservations).
    pub avoid: &'a dyn Fn(&str, u32) -> bool,
}

impl Capacity {
    pub fn new(nodes: &[NodeView], running: &[RunningJob]) -> Self {
        let free: Vec<FreeNode> = nodes
            .iter()
            .filter(|n| n.online)
            .map(|n| FreeNode {
                name: n.name.clone(),
                offered: !n.drained,
                gpus: n
                    .gpus
                    .iter()
                    .map(|g| {
                        let too_much_foreign_memory =
                            g.foreign_mem_mib as f64 > n.mem_threshold * g.memory_total_mib as f64;
                        FreeGpu {
                            index: g.index,
                            units: GpuAmount::UNITS_PER_GPU,
                            memory_mib: g.memory_total_mib.saturating_sub(g.foreign_mem_mib),
                            in_service: !n.drained && !g.paused,
                            unbusy: !too_much_foreign_memory,
                        }
                    })
                    .collect(),
            })
            .collect();
        let mut capacity = Capacity { nodes: free };
        for job in running {
            capacity.book(&job.placement);
        }
        // Utilisation counts against a GPU only while no mgpu job is on it: a GPU shared by
        // two mgpu jobs is governed by their shares, not by how hard they work it.
        for (node, view) in capacity.nodes.iter_mut().filter_map(|free| {
            nodes
                .iter()
                .find(|n| n.name == free.name)
                .map(|view| (free, view))
        }) {
            for gpu in &mut node.gpus {
                let busy_elsewhere = view.gpus.iter().any(|g| {
                    g.index == gpu.index
                        && f64::from(g.utilization_pct) > view.load_threshold * 100.0
                });
                if busy_elsewhere && gpu.units == GpuAmount::UNITS_PER_GPU {
                    gpu.unbusy = false;
                }
            }
        }
        capacity
    }

    pub fn book(&mut self, placement: &Placement) {
        let Some(node) = self.nodes.iter_mut().find(|n| n.name == placement.node) else {
            return;
        };
        for share in &placement.gpus {
            if let Some(gpu) = node.gpus.iter_mut().find(|g| g.index == share.index) {
                gpu.units = gpu.units.saturating_sub(share.amount.units());
                gpu.memory_mib = gpu.memory_mib.saturating_sub(share.mem_mib);
            }
        }
    }

    /// The best placement for `job` now under `constraints`, if one exists.
    pub fn place(
        &self,
        job: &QueuedJob,
        constraints: &Constraints<'_>,
        policy: PlacementPolicy,
    ) -> Option<Placement> {
        let mut best: Option<(usize, Placement)> = None;
        for node in &self.nodes {
            if constraints.in_service_only && !node.offered {
                continue;
            }
            let usable: Vec<&FreeGpu> = node
                .gpus
                .iter()
                .filter(|g| !constraints.in_service_only || g.in_service)
                .filter(|g| !constraints.unbusy_only || g.unbusy)
                .filter(|g| !(constraints.avoid)(&node.name, g.index))
                .filter(|g| job.may_use_gpu(g.index))
                .collect();
            let Some(shares) = fit(&usable, job) else {
                continue;
            };
            let free_whole = node
                .gpus
                .iter()
                .filter(|g| g.offered() && g.units == GpuAmount::UNITS_PER_GPU)
                .count();
            let better = match (&best, policy) {
                (None, _) => true,
                (Some((b, _)), PlacementPolicy::FillFirst) => free_whole < *b,
                (Some((b, _)), PlacementPolicy::Spread) => free_whole > *b,
            };
            if better {
                best = Some((
                    free_whole,
                    Placement {
                        node: node.name.clone(),
                        gpus: shares,
                    },
                ));
            }
        }
        best.map(|(_, placement)| placement)
    }
}

/// The GPUs among `usable` (already limited to those the job may use) that `job` would get,
/// or None when it does not fit.
fn fit(usable: &[&FreeGpu], job: &QueuedJob) -> Option<Vec<GpuShare>> {
    let mem = job.mem_mib.unwrap_or(0);
    if job.gpus.is_zero() {
        return Some(Vec::new());
    }
    let share = |gpu: &FreeGpu, amount: GpuAmount| GpuShare {
        index: gpu.index,
        amount,
        mem_mib: mem,
    };
    if job.gpus.is_whole() {
        let fits = |g: &&&FreeGpu| g.units == GpuAmount::UNITS_PER_GPU && g.memory_mib >= mem;
        let wanted = job.gpus.gpu_count() as usize;
        let chosen: Vec<&&FreeGpu> = match &job.gpu_ids {
            Some(ids) => ids
                .iter()
                .filter_map(|id| usable.iter().find(|g| g.index == *id))
                .filter(fits)
                .collect(),
            None => usable.iter().filter(fits).take(wanted).collect(),
        };
        if chosen.len() != wanted {
            return None;
        }
        return Some(
            chosen
                .into_iter()
                .map(|g| share(g, GpuAmount::ONE))
                .collect(),
        );
    }
    usable
        .iter()
        .filter(|g| g.units >= job.gpus.units() && g.memory_mib >= mem)
        .min_by_key(|g| (g.units, g.index))
        .map(|g| vec![share(g, job.gpus)])
}

/// Why no known node could run `job` even if it were idle, or None when some node could.
pub fn impossible_reason(nodes: &[NodeView], job: &QueuedJob) -> Option<String> {
    if nodes.is_empty() || job.gpus.is_zero() {
        return None;
    }
    let mem = job.mem_mib.unwrap_or(0);
    let can_hold = |node: &NodeView| {
        let usable: Vec<u32> = node
            .gpus
            .iter()
            .filter(|g| g.memory_total_mib >= mem)
            .filter(|g| job.may_use_gpu(g.index))
            .map(|g| g.index)
            .collect();
        match &job.gpu_ids {
            Some(ids) if job.gpus.is_whole() => ids.iter().all(|id| usable.contains(id)),
            _ => usable.len() >= job.gpus.gpu_count() as usize,
        }
    };
    if nodes.iter().any(can_hold) {
        return None;
    }
    let most_gpus = nodes.iter().map(|n| n.gpus.len()).max().unwrap_or(0);
    let most_mem = nodes
        .iter()
        .flat_map(|n| n.gpus.iter().map(|g| g.memory_total_mib))
        .max()
        .unwrap_or(0);
    let with_mem = if mem > 0 {
        format!(" with {mem} MiB")
    } else {
        String::new()
    };
    Some(if let Some(ids) = &job.gpu_ids {
        format!("no node has GPU id(s) {ids:?}{with_mem}")
    } else if mem > most_mem {
        format!("asks for {mem} MiB per GPU; the largest GPU has {most_mem} MiB")
    } else if let Some(allowed) = &job.allowed_gpus {
        format!(
            "no node has {} of the allowed GPUs {allowed:?}{with_mem}",
            job.gpus.gpu_count()
        )
    } else {
        format!(
            "asks for {} GPUs on one node; the largest node has {most_gpus}",
            job.gpus
        )
    })
}
