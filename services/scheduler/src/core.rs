//! The scheduling core: a pure function from (nodes, running placements, queue, clock) to
//! decisions. No NATS, no clock reads, no I/O, so it is unit- and property-tested directly
//! and the service around it stays a thin adapter.
//!
//! Policy today:
//! - order: priority (higher first), then submission time, then id (a total order, so a pass
//!   is deterministic);
//! - each job in that order starts if it fits now; one that does not fit waits and does not
//!   stop smaller jobs behind it from starting;
//! - whole-GPU jobs take GPUs nobody else holds; a share (0.5) fits on a GPU with that much
//!   left, preferring GPUs already partly used so whole GPUs stay free;
//! - among nodes that fit, the one with the fewest free GPUs wins (pack), so large holes stay
//!   open for large jobs;
//! - GPU memory asked with `--mem` is booked per GPU until the job ends;
//! - a request no known node could ever satisfy, even empty, is rejected with the reason.

use std::collections::BTreeMap;

use mgpu_shared::Timestamp;
use mgpu_shared::gpu_amount::GpuAmount;
use mgpu_shared::ids::JobId;
use mgpu_shared::job::{GpuShare, Placement, WaitReason};

/// One GPU of a node as the core sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuCapacity {
    pub index: u32,
    pub memory_total_mib: u64,
}

/// A node that may receive work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    /// Online nodes get new work; offline ones only count when judging what is possible.
    pub online: bool,
    pub gpus: Vec<GpuCapacity>,
}

/// What a queued job needs, and its place in line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedJob {
    pub id: JobId,
    pub priority: i32,
    pub submitted_at: Timestamp,
    pub gpus: GpuAmount,
    pub gpu_ids: Option<Vec<u32>>,
    pub mem_mib: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Start { job: JobId, placement: Placement },
    Wait { job: JobId, reason: WaitReason },
    Reject { job: JobId, reason: String },
}

/// Free capacity of one GPU while a pass places jobs.
#[derive(Clone, Debug)]
struct FreeGpu {
    index: u32,
    units: u32,
    memory_mib: u64,
}

/// Free capacity of every online node, after subtracting what running jobs hold.
struct FreeCapacity {
    nodes: BTreeMap<String, Vec<FreeGpu>>,
}

impl FreeCapacity {
    fn new(nodes: &[NodeView], running: &[Placement]) -> Self {
        let mut free: BTreeMap<String, Vec<FreeGpu>> = nodes
            .iter()
            .filter(|n| n.online)
            .map(|n| {
                let gpus = n
                    .gpus
                    .iter()
                    .map(|g| FreeGpu {
                        index: g.index,
                        units: GpuAmount::UNITS_PER_GPU,
                        memory_mib: g.memory_total_mib,
                    })
                    .collect();
                (n.name.clone(), gpus)
            })
            .collect();
        for placement in running {
            if let Some(gpus) = free.get_mut(&placement.node) {
                for share in &placement.gpus {
                    if let Some(gpu) = gpus.iter_mut().find(|g| g.index == share.index) {
                        gpu.units = gpu.units.saturating_sub(share.amount.units());
                        gpu.memory_mib = gpu.memory_mib.saturating_sub(share.mem_mib);
                    }
                }
            }
        }
        FreeCapacity { nodes: free }
    }

    fn book(&mut self, placement: &Placement) {
        if let Some(gpus) = self.nodes.get_mut(&placement.node) {
            for share in &placement.gpus {
                if let Some(gpu) = gpus.iter_mut().find(|g| g.index == share.index) {
                    gpu.units = gpu.units.saturating_sub(share.amount.units());
                    gpu.memory_mib = gpu.memory_mib.saturating_sub(share.mem_mib);
                }
            }
        }
    }

    fn any_online(&self) -> bool {
        !self.nodes.is_empty()
    }

    /// The best placement for `job` now, if one exists.
    fn place(&self, job: &QueuedJob) -> Option<Placement> {
        let mut best: Option<(usize, Placement)> = None;
        for (name, gpus) in &self.nodes {
            let Some(shares) = fit_on_node(gpus, job) else {
                continue;
            };
            let free_whole = gpus
                .iter()
                .filter(|g| g.units == GpuAmount::UNITS_PER_GPU)
                .count();
            if best.as_ref().is_none_or(|(b, _)| free_whole < *b) {
                best = Some((
                    free_whole,
                    Placement {
                        node: name.clone(),
                        gpus: shares,
                    },
                ));
            }
        }
        best.map(|(_, placement)| placement)
    }
}

/// The GPUs of one node that `job` would get, or None when it does not fit there now.
fn fit_on_node(gpus: &[FreeGpu], job: &QueuedJob) -> Option<Vec<GpuShare>> {
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
        let fits = |g: &&FreeGpu| g.units == GpuAmount::UNITS_PER_GPU && g.memory_mib >= mem;
        let chosen: Vec<&FreeGpu> = match &job.gpu_ids {
            Some(ids) => {
                let chosen: Vec<&FreeGpu> = ids
                    .iter()
                    .filter_map(|id| gpus.iter().find(|g| g.index == *id))
                    .filter(fits)
                    .collect();
                if chosen.len() != ids.len() {
                    return None;
                }
                chosen
            }
            None => gpus
                .iter()
                .filter(fits)
                .take(job.gpus.gpu_count() as usize)
                .collect(),
        };
        if chosen.len() != job.gpus.gpu_count() as usize {
            return None;
        }
        return Some(
            chosen
                .into_iter()
                .map(|g| share(g, GpuAmount::ONE))
                .collect(),
        );
    }
    // A share of one GPU: prefer the fullest GPU that still has room (best fit).
    gpus.iter()
        .filter(|g| {
            job.gpu_ids
                .as_ref()
                .is_none_or(|ids| ids.contains(&g.index))
        })
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
        let usable: Vec<&GpuCapacity> = node
            .gpus
            .iter()
            .filter(|g| g.memory_total_mib >= mem)
            .filter(|g| {
                job.gpu_ids
                    .as_ref()
                    .is_none_or(|ids| ids.contains(&g.index))
            })
            .collect();
        match &job.gpu_ids {
            Some(ids) if job.gpus.is_whole() => {
                ids.iter().all(|id| usable.iter().any(|g| g.index == *id))
            }
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
    Some(if let Some(ids) = &job.gpu_ids {
        format!(
            "no node has GPU id(s) {ids:?}{}",
            if mem > 0 {
                format!(" with {mem} MiB")
            } else {
                String::new()
            }
        )
    } else if mem > most_mem {
        format!("asks for {mem} MiB per GPU; the largest GPU has {most_mem} MiB")
    } else {
        format!(
            "asks for {} GPUs on one node; the largest node has {most_gpus}",
            job.gpus
        )
    })
}

/// Puts jobs in the order they are considered: priority, then age, then id.
pub fn queue_order(queue: &mut [QueuedJob]) {
    queue.sort_by(|a, b| {
        b.priority
            .cmp(&a.priority)
            .then(a.submitted_at.cmp(&b.submitted_at))
            .then(a.id.cmp(&b.id))
    });
}

/// One scheduling pass. `queue` may come in any order; `running` holds the placements of
/// every job that currently holds GPUs. Returns one decision per queued job.
pub fn plan(nodes: &[NodeView], running: &[Placement], queue: &[QueuedJob]) -> Vec<Decision> {
    let mut ordered = queue.to_vec();
    queue_order(&mut ordered);
    let mut free = FreeCapacity::new(nodes, running);
    let mut decisions = Vec::with_capacity(ordered.len());
    for job in ordered {
        if let Some(reason) = impossible_reason(nodes, &job) {
            decisions.push(Decision::Reject {
                job: job.id,
                reason,
            });
            continue;
        }
        if !free.any_online() {
            decisions.push(Decision::Wait {
                job: job.id,
                reason: WaitReason::NoNodes,
            });
            continue;
        }
        match free.place(&job) {
            Some(placement) => {
                free.book(&placement);
                decisions.push(Decision::Start {
                    job: job.id,
                    placement,
                });
            }
            None => decisions.push(Decision::Wait {
                job: job.id,
                reason: WaitReason::Resources,
            }),
        }
    }
    decisions
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn node(name: &str, gpus: u32, mem: u64) -> NodeView {
        NodeView {
            name: name.into(),
            online: true,
            gpus: (0..gpus)
                .map(|index| GpuCapacity {
                    index,
                    memory_total_mib: mem,
                })
                .collect(),
        }
    }

    fn job(n: u8, gpus: GpuAmount) -> QueuedJob {
        QueuedJob {
            id: format!("{n:032x}")
                .parse()
                .unwrap_or_else(|_| JobId::random()),
            priority: 0,
            submitted_at: chrono::Utc
                .timestamp_opt(1_700_000_000 + i64::from(n), 0)
                .single()
                .unwrap_or_default(),
            gpus,
            gpu_ids: None,
            mem_mib: None,
        }
    }

    fn started(decisions: &[Decision]) -> Vec<(&JobId, &Placement)> {
        decisions
            .iter()
            .filter_map(|d| match d {
                Decision::Start { job, placement } => Some((job, placement)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn two_one_gpu_jobs_on_a_one_gpu_node_the_second_waits() {
        let nodes = [node("n1", 1, 24_000)];
        let queue = [job(1, GpuAmount::ONE), job(2, GpuAmount::ONE)];
        let decisions = plan(&nodes, &[], &queue);
        assert_eq!(started(&decisions).len(), 1);
        assert_eq!(started(&decisions)[0].0, &queue[0].id);
        assert!(decisions.contains(&Decision::Wait {
            job: queue[1].id.clone(),
            reason: WaitReason::Resources
        }));
    }

    #[test]
    fn higher_priority_goes_first_even_when_younger() {
        let nodes = [node("n1", 1, 24_000)];
        let mut urgent = job(2, GpuAmount::ONE);
        urgent.priority = 10;
        let queue = [job(1, GpuAmount::ONE), urgent.clone()];
        let decisions = plan(&nodes, &[], &queue);
        assert_eq!(started(&decisions)[0].0, &urgent.id);
    }

    #[test]
    fn running_jobs_hold_their_gpus() {
        let nodes = [node("n1", 2, 24_000)];
        let running = [Placement {
            node: "n1".into(),
            gpus: vec![GpuShare {
                index: 0,
                amount: GpuAmount::ONE,
                mem_mib: 0,
            }],
        }];
        let decisions = plan(&nodes, &running, &[job(1, GpuAmount::ONE)]);
        assert_eq!(started(&decisions)[0].1.gpus[0].index, 1);
    }

    #[test]
    fn exact_ids_are_honoured_and_missing_ids_rejected() {
        let nodes = [node("n1", 4, 24_000)];
        let mut pinned = job(1, GpuAmount::whole(2));
        pinned.gpu_ids = Some(vec![1, 3]);
        let decisions = plan(&nodes, &[], &[pinned]);
        assert_eq!(started(&decisions)[0].1.gpu_indices(), vec![1, 3]);

        let mut missing = job(2, GpuAmount::ONE);
        missing.gpu_ids = Some(vec![7]);
        let decisions = plan(&nodes, &[], &[missing]);
        assert!(matches!(decisions[0], Decision::Reject { .. }));
    }

    #[test]
    fn shares_pack_onto_one_gpu() {
        let nodes = [node("n1", 2, 24_000)];
        let queue = [
            job(1, GpuAmount::from_units(5_000)),
            job(2, GpuAmount::from_units(5_000)),
        ];
        let decisions = plan(&nodes, &[], &queue);
        let starts = started(&decisions);
        assert_eq!(starts.len(), 2);
        assert_eq!(starts[0].1.gpus[0].index, starts[1].1.gpus[0].index);
    }

    #[test]
    fn memory_is_booked_not_reread() {
        let nodes = [node("n1", 1, 24_000)];
        let mut a = job(1, GpuAmount::from_units(2_500));
        a.mem_mib = Some(16_000);
        let mut b = job(2, GpuAmount::from_units(2_500));
        b.mem_mib = Some(16_000);
        let decisions = plan(&nodes, &[], &[a, b]);
        assert_eq!(started(&decisions).len(), 1);
    }

    #[test]
    fn impossible_requests_are_rejected_and_no_nodes_means_waiting() {
        let nodes = [node("n1", 2, 24_000)];
        let decisions = plan(&nodes, &[], &[job(1, GpuAmount::whole(3))]);
        assert!(
            matches!(&decisions[0], Decision::Reject { reason, .. } if reason.contains("largest node has 2"))
        );
        let mut big = job(2, GpuAmount::ONE);
        big.mem_mib = Some(80_000);
        assert!(matches!(
            plan(&nodes, &[], &[big])[0],
            Decision::Reject { .. }
        ));
        let decisions = plan(&[], &[], &[job(3, GpuAmount::ONE)]);
        assert!(matches!(
            decisions[0],
            Decision::Wait {
                reason: WaitReason::NoNodes,
                ..
            }
        ));
    }

    #[test]
    fn offline_nodes_get_nothing() {
        let mut n = node("n1", 1, 24_000);
        n.online = false;
        let decisions = plan(&[n], &[], &[job(1, GpuAmount::ONE)]);
        assert!(matches!(
            decisions[0],
            Decision::Wait {
                reason: WaitReason::NoNodes,
                ..
            }
        ));
    }

    #[test]
    fn packing_prefers_the_node_with_fewer_free_gpus() {
        let nodes = [node("big", 8, 24_000), node("small", 2, 24_000)];
        let decisions = plan(&nodes, &[], &[job(1, GpuAmount::ONE)]);
        assert_eq!(started(&decisions)[0].1.node, "small");
    }

    fn amount() -> impl Strategy<Value = GpuAmount> {
        prop_oneof![
            (0u32..=3).prop_map(GpuAmount::whole),
            prop::sample::select(vec![2_500u32, 5_000, 7_500]).prop_map(GpuAmount::from_units),
        ]
    }

    proptest! {
        #[test]
        fn no_gpu_is_ever_overbooked(
            shapes in prop::collection::vec((amount(), prop::option::of(1_000u64..30_000), -2i32..3), 1..40),
            node_gpus in prop::collection::vec(1u32..5, 1..4),
        ) {
            let nodes: Vec<NodeView> = node_gpus.iter().enumerate()
                .map(|(i, g)| node(&format!("n{i}"), *g, 24_000)).collect();
            let queue: Vec<QueuedJob> = shapes.iter().enumerate().map(|(i, (a, mem, prio))| {
                let mut j = job(i as u8, *a);
                j.mem_mib = if a.is_zero() { None } else { *mem };
                j.priority = *prio;
                j
            }).collect();
            let decisions = plan(&nodes, &[], &queue);
            prop_assert_eq!(decisions.len(), queue.len());
            let mut units: BTreeMap<(String, u32), u32> = BTreeMap::new();
            let mut mem: BTreeMap<(String, u32), u64> = BTreeMap::new();
            for (_, placement) in started(&decisions) {
                for share in &placement.gpus {
                    *units.entry((placement.node.clone(), share.index)).or_default() += share.amount.units();
                    *mem.entry((placement.node.clone(), share.index)).or_default() += share.mem_mib;
                }
            }
            prop_assert!(units.values().all(|u| *u <= GpuAmount::UNITS_PER_GPU));
            prop_assert!(mem.values().all(|m| *m <= 24_000));
        }

        #[test]
        fn a_fitting_higher_priority_job_is_never_passed_over(
            prios in prop::collection::vec(-3i32..3, 2..12),
        ) {
            let nodes = [node("n1", 2, 24_000)];
            let queue: Vec<QueuedJob> = prios.iter().enumerate().map(|(i, p)| {
                let mut j = job(i as u8, GpuAmount::ONE);
                j.priority = *p;
                j
            }).collect();
            let decisions = plan(&nodes, &[], &queue);
            let started_prios: Vec<i32> = started(&decisions).iter()
                .filter_map(|(id, _)| queue.iter().find(|j| &j.id == *id).map(|j| j.priority)).collect();
            let waiting_prios: Vec<i32> = decisions.iter().filter_map(|d| match d {
                Decision::Wait { job, .. } => queue.iter().find(|j| &j.id == job).map(|j| j.priority),
                _ => None,
            }).collect();
            let lowest_started = started_prios.iter().min().copied().unwrap_or(i32::MAX);
            prop_assert!(waiting_prios.iter().all(|w| *w <= lowest_started));
        }
    }
}
