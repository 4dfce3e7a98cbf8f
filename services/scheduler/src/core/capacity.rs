//! Free capacity of the online nodes during one pass, and fitting one job onto it.

use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::host::format_mib;
use mgpu_protocol::job::{GpuShare, NodeShare, Placement};
use mgpu_protocol::priority::PlacementPolicy;

use super::{CoreSettings, FastHash, NodeView, QueuedJob, RunningJob};

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
    pub gpu_type: Option<String>,
}

impl FreeGpu {
    /// Offered to new work now.
    pub fn offered(&self) -> bool {
        self.in_service && self.unbusy
    }
}

#[derive(Clone)]
pub(super) struct FreeNode {
    pub name: String,
    /// Where the node's [`NodeView`] is in the pass's node list.
    pub view: usize,
    pub labels: std::collections::BTreeMap<String, String>,
    pub features: Vec<String>,
    pub gpus: Vec<FreeGpu>,
    /// Node-level switch for CPU-only jobs (a drained node takes nothing).
    pub offered: bool,
    /// CPU cores not booked yet; None: the node does not count them.
    pub cpus_free: Option<u32>,
    /// Host memory (MiB) not booked yet; None: the node does not count it.
    pub mem_host_free_mib: Option<u64>,
}

impl FreeNode {
    /// Whether the node has the cores and host memory `job` needs on it left.
    fn has_host_room_for(&self, job: &QueuedJob) -> bool {
        self.cpus_free.is_none_or(|free| job.cpus <= free)
            && self
                .mem_host_free_mib
                .is_none_or(|free| job.mem_host_mib <= free)
    }
}

/// Whether an adjustment of [`Capacity`] takes room or gives it back.
#[derive(Clone, Copy)]
enum Booking {
    Take,
    Give,
}

impl Booking {
    fn apply(self, free: u64, amount: u64) -> u64 {
        match self {
            Booking::Take => free.saturating_sub(amount),
            Booking::Give => free.saturating_add(amount),
        }
    }
}

#[derive(Clone)]
pub(super) struct Capacity {
    pub nodes: Vec<FreeNode>,
    /// Where each node is in `nodes`: booking 8 000 running jobs by searching 1 000 names
    /// each was the biggest part of a pass on a large cluster.
    positions: std::collections::HashMap<String, usize, FastHash>,
    /// Placements booked so far: a fit that failed stays failed while this is unchanged.
    pub bookings: u64,
}

/// Which GPUs a placement may use.
pub(super) struct Constraints<'a> {
    /// Only GPUs in service: not paused, node not drained (false: to tell why a job waits).
    pub in_service_only: bool,
    /// Only GPUs not busy with foreign work (false: to tell why a job waits).
    pub unbusy_only: bool,
    /// GPUs held for someone else (backfill reservations), by position in
    /// [`Capacity::nodes`] and GPU index.
    pub avoid: &'a dyn Fn(usize, u32) -> bool,
    /// Whether the job may take GPUs of a type (its owner's caps per type).
    pub type_allowed: &'a dyn Fn(Option<&str>) -> bool,
}

impl Capacity {
    pub fn new(nodes: &[NodeView], running: &[&RunningJob]) -> Self {
        let free: Vec<FreeNode> = nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.online)
            .map(|(view, n)| FreeNode {
                name: n.name.clone(),
                view,
                labels: n.labels.clone(),
                features: n.features.clone(),
                offered: !n.drained,
                cpus_free: n.cpus,
                mem_host_free_mib: n.mem_host_mib,
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
                            gpu_type: g.gpu_type.clone(),
                        }
                    })
                    .collect(),
            })
            .collect();
        let positions = free
            .iter()
            .enumerate()
            .map(|(position, node)| (node.name.clone(), position))
            .collect();
        let mut capacity = Capacity {
            nodes: free,
            positions,
            bookings: 0,
        };
        for job in running {
            capacity.book(&job.placement);
        }
        // Utilisation counts against a GPU only while no mgpu job is on it: a GPU shared by
        // two mgpu jobs is governed by their shares, not by how hard they work it.
        for (node, view) in capacity
            .nodes
            .iter_mut()
            .filter_map(|free| nodes.get(free.view).map(|view| (free, view)))
        {
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

    /// Where node `name` is in [`Capacity::nodes`] (online nodes only).
    pub fn position_of(&self, name: &str) -> Option<usize> {
        self.positions.get(name).copied()
    }

    pub fn book(&mut self, placement: &Placement) {
        self.adjust(placement, Booking::Take);
    }

    /// Gives back what `placement` booked (the job ends), as [`Capacity::book`] took it.
    pub fn release(&mut self, placement: &Placement) {
        self.adjust(placement, Booking::Give);
    }

    /// Takes what `placement` holds from its nodes' free room, or gives it back.
    fn adjust(&mut self, placement: &Placement, booking: Booking) {
        self.bookings += 1;
        let (cpus, mem) = (placement.cpus, placement.mem_host_mib);
        for (_, name, shares) in placement.ranks() {
            let Some(node) = self
                .positions
                .get(name)
                .and_then(|&position| self.nodes.get_mut(position))
            else {
                continue;
            };
            node.cpus_free = node.cpus_free.map(|free| {
                u32::try_from(booking.apply(free.into(), cpus.into())).unwrap_or(u32::MAX)
            });
            node.mem_host_free_mib = node.mem_host_free_mib.map(|free| booking.apply(free, mem));
            for share in shares {
                if let Some(gpu) = node.gpus.iter_mut().find(|g| g.index == share.index) {
                    let units = booking.apply(gpu.units.into(), share.amount.units().into());
                    gpu.units = units.min(GpuAmount::UNITS_PER_GPU.into()) as u32;
                    gpu.memory_mib = booking.apply(gpu.memory_mib, share.mem_mib);
                }
            }
        }
    }

    /// The best placement for `job` now under `constraints`, if one exists: all of its
    /// nodes, or nothing. A job that names GPU types gets GPUs of one type, the first of
    /// its list that fits now.
    pub fn place(
        &self,
        job: &QueuedJob,
        constraints: &Constraints<'_>,
        settings: &CoreSettings,
    ) -> Option<Placement> {
        if job.gpu_types.is_empty() || job.gpus.is_zero() {
            return self.place_of_type(job, constraints, settings, None);
        }
        job.gpu_types
            .iter()
            .find_map(|t| self.place_of_type(job, constraints, settings, Some(t)))
    }

    /// [`Capacity::place`] on GPUs of `only_type` (None: any).
    fn place_of_type(
        &self,
        job: &QueuedJob,
        constraints: &Constraints<'_>,
        settings: &CoreSettings,
        only_type: Option<&str>,
    ) -> Option<Placement> {
        // Every node that could take one rank now, with its GPUs and how free it is.
        let mut fitting: Vec<(&FreeNode, Vec<GpuShare>, usize)> = Vec::new();
        for (position, node) in self.nodes.iter().enumerate() {
            if constraints.in_service_only && !node.offered {
                continue;
            }
            if !job.may_use_node(&node.name)
                || !job.selects_node(&node.features)
                || !node.has_host_room_for(job)
            {
                continue;
            }
            let usable: Vec<&FreeGpu> = node
                .gpus
                .iter()
                .filter(|g| only_type.is_none_or(|t| g.gpu_type.as_deref() == Some(t)))
                .filter(|g| (constraints.type_allowed)(g.gpu_type.as_deref()))
                .filter(|g| !constraints.in_service_only || g.in_service)
                .filter(|g| !constraints.unbusy_only || g.unbusy)
                .filter(|g| !(constraints.avoid)(position, g.index))
                .filter(|g| job.may_use_gpu(&node.name, g.index))
                .collect();
            let Some(shares) = fit(&usable, job, job.pinned_on(&node.name)) else {
                continue;
            };
            let free_whole = node
                .gpus
                .iter()
                .filter(|g| g.offered() && g.units == GpuAmount::UNITS_PER_GPU)
                .count();
            fitting.push((node, shares, free_whole));
        }
        // Packing takes the fullest node first, spreading the emptiest; names break ties so a
        // pass is deterministic.
        fitting.sort_by(|a, b| {
            let by_room = match settings.placement {
                PlacementPolicy::FillFirst => a.2.cmp(&b.2),
                PlacementPolicy::Spread => b.2.cmp(&a.2),
            };
            by_room.then_with(|| a.0.name.cmp(&b.0.name))
        });
        let chosen = choose_nodes(
            &fitting.iter().map(|(node, _, _)| *node).collect::<Vec<_>>(),
            job,
            settings.topology_label.as_deref(),
        )?;
        let mut ranks = chosen.into_iter().filter_map(|name| {
            fitting
                .iter()
                .find(|(node, _, _)| node.name == name)
                .map(|(node, shares, _)| (node.name.clone(), shares.clone()))
        });
        let (node, gpus) = ranks.next()?;
        let peers: Vec<NodeShare> = ranks.map(|(node, gpus)| NodeShare { node, gpus }).collect();
        if peers.len() + 1 != job.nodes as usize {
            return None;
        }
        Some(Placement {
            node,
            gpus,
            peers,
            launch: None,
            cpus: job.cpus,
            mem_host_mib: job.mem_host_mib,
        })
    }
}

/// The names of the nodes a job gets, rank order, from `fitting` (the nodes that could take
/// one rank now, best first): its required nodes first, then the best others, preferring a
/// set that shares one value of `topology_label`. None when there are not enough.
fn choose_nodes(
    fitting: &[&FreeNode],
    job: &QueuedJob,
    topology_label: Option<&str>,
) -> Option<Vec<String>> {
    let wanted = job.nodes.max(1) as usize;
    let mut chosen: Vec<String> = Vec::with_capacity(wanted);
    for required in &job.required_nodes {
        if !fitting.iter().any(|n| &n.name == required) {
            return None;
        }
        chosen.push(required.clone());
    }
    let others: Vec<&&FreeNode> = fitting
        .iter()
        .filter(|n| !chosen.contains(&n.name))
        .collect();
    let missing = wanted.saturating_sub(chosen.len());
    if others.len() < missing {
        return None;
    }
    let label_of = |name: &str| -> Option<&String> {
        let label = topology_label?;
        fitting
            .iter()
            .find(|n| n.name == name)
            .and_then(|n| n.labels.get(label))
    };
    // Topology: when the job spans nodes, look for one label value whose nodes can supply
    // everything still missing; the required nodes' value first, then the best-ranked
    // node's. Without such a group the best nodes are taken regardless of label.
    let mut group: Option<&String> = None;
    if wanted > 1 && missing > 0 && topology_label.is_some() {
        let required_values: Vec<Option<&String>> =
            chosen.iter().map(|name| label_of(name)).collect();
        let shared_required = match required_values.first() {
            Some(Some(first)) if required_values.iter().all(|v| *v == Some(*first)) => Some(*first),
            Some(_) => None,
            None => None,
        };
        let supplies = |value: &String| {
            others
                .iter()
                .filter(|n| label_of(&n.name) == Some(value))
                .count()
                >= missing
        };
        group = if chosen.is_empty() {
            others
                .iter()
                .filter_map(|n| label_of(&n.name))
                .find(|value| supplies(value))
        } else {
            shared_required.filter(|value| supplies(value))
        };
    }
    let in_group = |n: &&&FreeNode| group.is_some_and(|value| label_of(&n.name) == Some(value));
    let preferred = others.iter().filter(|n| in_group(n));
    let rest = others.iter().filter(|n| !in_group(n));
    chosen.extend(preferred.chain(rest).take(missing).map(|n| n.name.clone()));
    (chosen.len() == wanted).then_some(chosen)
}

/// The GPUs among `usable` (already limited to those the job may use) that `job` would get,
/// or None when it does not fit. `pinned`: the exact GPU ids it must have on this node.
fn fit(usable: &[&FreeGpu], job: &QueuedJob, pinned: Option<&[u32]>) -> Option<Vec<GpuShare>> {
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
        // Pinned ids are exact, even where nodes of one job get different counts.
        let wanted = pinned.map_or(job.gpus.gpu_count() as usize, <[u32]>::len);
        let chosen: Vec<&&FreeGpu> = match pinned {
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
    if nodes.is_empty() {
        return None;
    }
    let mem = job.mem_mib.unwrap_or(0);
    let can_hold = |node: &NodeView| {
        if !job.may_use_node(&node.name)
            || !job.selects_node(&node.features)
            || !host_could_hold(node, job)
        {
            return false;
        }
        if job.gpus.is_zero() {
            return true;
        }
        let usable: Vec<u32> = node
            .gpus
            .iter()
            .filter(|g| g.memory_total_mib >= mem)
            .filter(|g| job.may_use_gpu(&node.name, g.index))
            .filter(|g| job.takes_type(g.gpu_type.as_deref()))
            .map(|g| g.index)
            .collect();
        match job.pinned_on(&node.name) {
            Some(ids) if job.gpus.is_whole() => ids.iter().all(|id| usable.contains(id)),
            _ => usable.len() >= job.gpus.gpu_count() as usize,
        }
    };
    if job.nodes > 1 || !job.required_nodes.is_empty() {
        return multi_node_impossible_reason(nodes, job, &can_hold);
    }
    if nodes.iter().any(can_hold) {
        return None;
    }
    if let Some(reason) = selection_impossible_reason(nodes, job) {
        return Some(reason);
    }
    if let Some(reason) = host_impossible_reason(nodes, job) {
        return Some(reason);
    }
    if job.gpus.is_zero() {
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
    } else if !job.exclude.is_empty() {
        format!(
            "asks for {} GPUs on one node; no node outside --exclude has that many",
            job.gpus
        )
    } else {
        format!(
            "asks for {} GPUs on one node; the largest node has {most_gpus}",
            job.gpus
        )
    })
}

/// Why no node could ever run `job` for its GPU types or its constraint, if that is why.
fn selection_impossible_reason(nodes: &[NodeView], job: &QueuedJob) -> Option<String> {
    let selected: Vec<&NodeView> = nodes
        .iter()
        .filter(|n| job.selects_node(&n.features))
        .collect();
    if let Some(constraint) = &job.constraint
        && selected.is_empty()
    {
        return Some(format!("no node has the features {constraint}"));
    }
    if job.gpu_types.is_empty() || job.gpus.is_zero() {
        return None;
    }
    let typed = selected
        .iter()
        .flat_map(|n| n.gpus.iter())
        .any(|g| job.takes_type(g.gpu_type.as_deref()));
    (!typed).then(|| {
        let constrained = if job.constraint.is_some() {
            " among the nodes its constraint selects"
        } else {
            ""
        };
        format!(
            "asks for GPU type {}; no node has one{constrained}",
            job.gpu_types.join(" or ")
        )
    })
}

/// Whether `node`, idle, has the cores and host memory `job` needs (a node that does not
/// count them has).
pub(super) fn host_could_hold(node: &NodeView, job: &QueuedJob) -> bool {
    node.cpus.is_none_or(|cpus| job.cpus <= cpus)
        && node.mem_host_mib.is_none_or(|mib| job.mem_host_mib <= mib)
}

/// Why no node could ever give `job` its cores or host memory, if that is why.
fn host_impossible_reason(nodes: &[NodeView], job: &QueuedJob) -> Option<String> {
    let allowed = || {
        nodes
            .iter()
            .filter(|n| job.may_use_node(&n.name) && job.selects_node(&n.features))
    };
    allowed().next()?;
    if allowed().any(|n| n.cpus.is_none_or(|cpus| job.cpus <= cpus)) {
        if allowed().any(|n| host_could_hold(n, job)) {
            return None;
        }
        let most = allowed().filter_map(|n| n.mem_host_mib).max().unwrap_or(0);
        return Some(format!(
            "asks for {} of host memory on one node; the largest node has {}",
            format_mib(job.mem_host_mib),
            format_mib(most)
        ));
    }
    let most = allowed().filter_map(|n| n.cpus).max().unwrap_or(0);
    Some(format!(
        "asks for {} CPU cores on one node; the largest node has {most}",
        job.cpus
    ))
}

/// [`impossible_reason`] for a job that names nodes or spans several. A required node that
/// never joined the cluster is most likely a typo, and is refused like one.
fn multi_node_impossible_reason(
    nodes: &[NodeView],
    job: &QueuedJob,
    can_hold: &dyn Fn(&NodeView) -> bool,
) -> Option<String> {
    for required in &job.required_nodes {
        let Some(node) = nodes.iter().find(|n| &n.name == required) else {
            return Some(format!("node {required} is not known to the cluster"));
        };
        if !can_hold(node) {
            let pinned = job
                .pinned_on(required)
                .map(|ids| format!(" (GPU ids {ids:?})"))
                .unwrap_or_default();
            return Some(format!(
                "node {required} cannot hold {} GPU(s){pinned} of this job",
                job.gpus
            ));
        }
    }
    let able = nodes.iter().filter(|n| can_hold(n)).count();
    if able < job.nodes as usize {
        let per_node = if job.gpus.is_zero() {
            String::new()
        } else {
            format!(" with {} GPU(s) each", job.gpus)
        };
        return Some(format!(
            "asks for {} nodes{per_node}; only {able} known node(s) can hold that",
            job.nodes
        ));
    }
    None
}
