//! Per-user caps on running GPUs within a pass (`max_gpus_running` of the scheduler's
//! `[limits]`, in all and per GPU type): what each capped owner's running jobs hold, and
//! whether one more job stays within its owner's caps. A job past its owner's total cap waits
//! without booking or reserving anything, so it never holds up other users' jobs behind it; a
//! type cap only keeps the job off GPUs of that type.

use std::collections::{BTreeMap, HashMap};

use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::job::Placement;

use super::{NodeView, QueuedJob, RunningJob};

/// Each capped owner's caps per GPU type, in units.
pub type TypeCaps = HashMap<String, BTreeMap<String, u64>>;

/// GPUs (in `GpuAmount` units) held by each owner who has a cap.
pub(super) struct OwnerGpus<'a> {
    caps: &'a HashMap<String, u64>,
    held: HashMap<String, u64>,
    type_caps: &'a TypeCaps,
    /// By owner with type caps, then GPU type.
    held_by_type: HashMap<String, BTreeMap<String, u64>>,
    /// Each node's GPU types by index, for owners with type caps.
    types: HashMap<&'a str, HashMap<u32, &'a str>>,
    /// Each class's cap on what one owner's running jobs of it hold, and what they hold.
    class_caps: &'a HashMap<String, u64>,
    held_by_class: HashMap<(String, String), u64>,
}

/// A job's class by name (`normal` when it names none).
fn class_of(qos: &Option<String>) -> &str {
    mgpu_protocol::qos::class_name(qos.as_deref())
}

impl<'a> OwnerGpus<'a> {
    /// What the running jobs of capped owners hold.
    pub(super) fn new(
        caps: &'a HashMap<String, u64>,
        type_caps: &'a TypeCaps,
        class_caps: &'a HashMap<String, u64>,
        running: &[&RunningJob],
        nodes: &'a [NodeView],
    ) -> Self {
        let mut held: HashMap<String, u64> = HashMap::new();
        if !caps.is_empty() {
            for job in running {
                if caps.contains_key(&job.owner) {
                    *held.entry(job.owner.clone()).or_default() += placement_units(&job.placement);
                }
            }
        }
        let types = if type_caps.is_empty() {
            HashMap::new()
        } else {
            nodes
                .iter()
                .map(|n| {
                    let by_index = n
                        .gpus
                        .iter()
                        .filter_map(|g| Some((g.index, g.gpu_type.as_deref()?)))
                        .collect();
                    (n.name.as_str(), by_index)
                })
                .collect()
        };
        let mut owner_gpus = OwnerGpus {
            caps,
            held,
            type_caps,
            held_by_type: HashMap::new(),
            types,
            class_caps,
            held_by_class: HashMap::new(),
        };
        for job in running {
            owner_gpus.book_types(&job.owner, &job.placement);
            owner_gpus.book_class(&job.owner, class_of(&job.qos), &job.placement);
        }
        owner_gpus
    }

    /// Whether `owner` has caps per GPU type.
    pub(super) fn has_type_caps(&self, owner: &str) -> bool {
        self.type_caps.contains_key(owner)
    }

    /// Whether `job` may take GPUs of `gpu_type` as far as its owner's type caps go: all it
    /// asks for, on all its nodes, could be of that type. (So a job takes no GPU of a type
    /// it could not take all of: simple to explain, and what the pass can check GPU by GPU.)
    pub(super) fn allows_type(&self, job: &QueuedJob, gpu_type: Option<&str>) -> bool {
        let (Some(caps), Some(gpu_type)) = (self.type_caps.get(&job.owner), gpu_type) else {
            return true;
        };
        let Some(cap) = caps.get(gpu_type) else {
            return true;
        };
        let held = self
            .held_by_type
            .get(&job.owner)
            .and_then(|by_type| by_type.get(gpu_type))
            .copied()
            .unwrap_or(0);
        held.saturating_add(job_units(job)) <= *cap
    }

    /// Counts what `placement` holds of each capped type for `owner`.
    fn book_types(&mut self, owner: &str, placement: &Placement) {
        let Some(caps) = self.type_caps.get(owner) else {
            return;
        };
        for (_, node, gpus) in placement.ranks() {
            for share in gpus {
                let gpu_type = self.types.get(node).and_then(|t| t.get(&share.index));
                if let Some(gpu_type) = gpu_type.filter(|t| caps.contains_key(**t)) {
                    *self
                        .held_by_type
                        .entry(owner.to_owned())
                        .or_default()
                        .entry((*gpu_type).to_owned())
                        .or_default() += u64::from(share.amount.units());
                }
            }
        }
    }

    /// Whether `job` may start as far as its owner's cap, and its class's cap on one owner's
    /// jobs of it, go.
    pub(super) fn allows(&self, job: &QueuedJob) -> bool {
        let class = class_of(&job.qos);
        if let Some(cap) = self.class_caps.get(class) {
            let key = (job.owner.clone(), class.to_owned());
            let held = self.held_by_class.get(&key).copied().unwrap_or(0);
            if held.saturating_add(job_units(job)) > *cap {
                return false;
            }
        }
        let Some(cap) = self.caps.get(&job.owner) else {
            return true;
        };
        let held = self.held.get(&job.owner).copied().unwrap_or(0);
        held.saturating_add(job_units(job)) <= *cap
    }

    /// Counts a job of class `qos` started in this pass.
    pub(super) fn book(&mut self, owner: &str, qos: &Option<String>, placement: &Placement) {
        if self.caps.contains_key(owner) {
            *self.held.entry(owner.to_owned()).or_default() += placement_units(placement);
        }
        self.book_types(owner, placement);
        self.book_class(owner, class_of(qos), placement);
    }

    /// Counts what `placement` holds against its class's cap for `owner`.
    fn book_class(&mut self, owner: &str, class: &str, placement: &Placement) {
        if self.class_caps.contains_key(class) {
            *self
                .held_by_class
                .entry((owner.to_owned(), class.to_owned()))
                .or_default() += placement_units(placement);
        }
    }
}

/// Why `job` could never start within its owner's caps per GPU type, though nodes could
/// hold it were it not for them: even running nothing else, too few nodes have enough GPUs
/// of types it may take (uncapped ones, and capped ones whose cap covers all it asks for, as
/// [`OwnerGpus::allows_type`] decides). Jobs pinned to GPU ids are not judged.
pub fn type_caps_impossible_reason(
    nodes: &[NodeView],
    job: &QueuedJob,
    type_caps: &TypeCaps,
) -> Option<String> {
    let caps = type_caps.get(&job.owner)?;
    if job.gpus.is_zero() || job.gpu_ids.is_some() {
        return None;
    }
    let needed = u64::from(job.gpus.gpu_count());
    let asked = job_units(job);
    let mut could_hold = 0;
    let mut within_caps = 0;
    for node in nodes {
        let (all, allowed) = usable_gpus(node, job, |gpu_type| {
            gpu_type
                .and_then(|t| caps.get(t))
                .is_none_or(|cap| *cap >= asked)
        });
        could_hold += u32::from(all >= needed);
        within_caps += u32::from(allowed >= needed);
    }
    let gang = job.nodes.max(1);
    (could_hold >= gang && within_caps < gang).then(|| {
        let named: Vec<String> = caps
            .iter()
            .map(|(t, cap)| {
                let cap = GpuAmount::from_units(u32::try_from(*cap).unwrap_or(u32::MAX));
                format!("{t} = {cap}")
            })
            .collect();
        format!(
            "could never start within its owner's max_gpus_running per GPU type ({}): a job \
             takes GPUs of a capped type only where all it asks for is within the cap",
            named.join(", ")
        )
    })
}

/// The GPUs of `node` that `job` could take, caps aside, and of them those whose type
/// `allowed` accepts.
fn usable_gpus(
    node: &NodeView,
    job: &QueuedJob,
    allowed: impl Fn(Option<&str>) -> bool,
) -> (u64, u64) {
    if !job.may_use_node(&node.name)
        || !job.selects_node(&node.features)
        || !super::capacity::host_could_hold(node, job)
    {
        return (0, 0);
    }
    let mem = job.mem_mib.unwrap_or(0);
    node.gpus
        .iter()
        .filter(|g| {
            g.memory_total_mib >= mem
                && job.may_use_gpu(&node.name, g.index)
                && job.takes_type(g.gpu_type.as_deref())
        })
        .fold((0, 0), |(all, within), gpu| {
            (
                all + 1,
                within + u64::from(allowed(gpu.gpu_type.as_deref())),
            )
        })
}

/// GPU units a placement holds on all its nodes.
pub(super) fn placement_units(placement: &Placement) -> u64 {
    placement
        .ranks()
        .flat_map(|(_, _, gpus)| gpus.iter().map(|g| u64::from(g.amount.units())))
        .sum()
}

/// GPU units a queued job asks for on all its nodes.
fn job_units(job: &QueuedJob) -> u64 {
    u64::from(job.gpus.units()) * u64::from(job.nodes.max(1))
}
