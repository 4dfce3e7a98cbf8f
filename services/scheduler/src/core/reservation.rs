//! Backfill reservations: for a job at the head of the line that cannot start, the GPUs that
//! will free up first (judged by running jobs' time limits) and when. Jobs behind it may use
//! those GPUs only if they will be gone before then, so backfill never delays it.

use std::collections::HashMap;

use mgpu_shared::Timestamp;

use super::capacity::Capacity;
use super::{NodeView, QueuedJob, RunningJob};

#[derive(Clone, Debug, PartialEq)]
pub(super) struct Reservation {
    /// The waiting job the GPUs are held for.
    pub job: mgpu_shared::ids::JobId,
    /// (node, GPU index) of every GPU held, on one node or, for a multi-node job, several.
    pub gpus: Vec<(String, u32)>,
    /// When the GPUs are expected free; None when a job on them has no time limit.
    pub start: Option<Timestamp>,
}

impl Reservation {
    /// Whether a job that ends by `ends_at` (None: no limit) must keep off GPU `index` of `node`.
    pub fn blocks(&self, node: &str, index: u32, ends_at: Option<Timestamp>) -> bool {
        let ends_in_time =
            matches!((ends_at, self.start), (Some(end), Some(start)) if end <= start);
        !ends_in_time && self.holds(node, index)
    }

    fn holds(&self, node: &str, index: u32) -> bool {
        self.gpus.iter().any(|(n, i)| n == node && *i == index)
    }
}

/// Orders release times: known times first, earliest first; unknown (None) last.
fn release_key(release: Option<Timestamp>) -> (bool, Option<Timestamp>) {
    (release.is_none(), release)
}

/// The reservation for `job`, or None when no set of nodes could ever take it under current
/// holdings. Each node that could hold one rank offers the GPUs that free up first there; the
/// job gets its required nodes plus the earliest-ready others, and starts when the last of
/// them is ready.
pub(super) fn reserve(
    capacity: &Capacity,
    nodes: &[NodeView],
    holding: &[RunningJob],
    job: &QueuedJob,
    existing: &[Reservation],
    now: Timestamp,
) -> Option<Reservation> {
    if job.gpus.is_zero() {
        return None;
    }
    let mem = job.mem_mib.unwrap_or(0);
    // When each held GPU frees up (None: a job on it has no limit), gathered once: looking
    // through every running job for every GPU costs GPUs x jobs (64 million on a 1 000-node
    // cluster) per reservation.
    let mut releases: HashMap<(&str, u32), Option<Timestamp>> = HashMap::new();
    for held in holding {
        for (_, node, shares) in held.placement.ranks() {
            for share in shares {
                let release = releases.entry((node, share.index)).or_insert(Some(now));
                *release = match (*release, held.expected_end) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    _ => None,
                };
            }
        }
    }
    let views: HashMap<&str, &NodeView> = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    // GPUs already held for jobs ahead, gathered once rather than searched for every GPU.
    let reserved: std::collections::HashSet<(&str, u32)> = existing
        .iter()
        .flat_map(|r| r.gpus.iter().map(|(node, index)| (node.as_str(), *index)))
        .collect();
    // (node, its GPUs for the job, when they are all free) for every node that could hold a rank.
    let mut ready: Vec<(&str, Vec<u32>, Option<Timestamp>)> = Vec::new();
    for node in capacity
        .nodes
        .iter()
        .filter(|n| n.offered && job.may_use_node(&n.name))
    {
        let Some(view) = views.get(node.name.as_str()) else {
            continue;
        };
        let wanted = job
            .pinned_on(&node.name)
            .map_or(job.gpus.gpu_count() as usize, <[u32]>::len);
        // (index, when it is free) for every GPU the job could ever use here.
        let mut candidates: Vec<(u32, Option<Timestamp>)> = node
            .gpus
            .iter()
            .filter(|g| g.offered())
            .filter(|g| !reserved.contains(&(node.name.as_str(), g.index)))
            .filter(|g| job.may_use_gpu(&node.name, g.index))
            .filter(|g| {
                view.gpus.iter().any(|v| {
                    v.index == g.index
                        && v.memory_total_mib.saturating_sub(v.foreign_mem_mib) >= mem
                })
            })
            .map(|g| {
                let release = releases
                    .get(&(node.name.as_str(), g.index))
                    .copied()
                    .unwrap_or(Some(now));
                (g.index, release)
            })
            .collect();
        if candidates.len() < wanted {
            continue;
        }
        candidates.sort_by_key(|(index, release)| (release_key(*release), *index));
        let chosen = &candidates[..wanted];
        let start = chosen
            .iter()
            .try_fold(now, |latest, (_, release)| release.map(|r| latest.max(r)));
        ready.push((
            node.name.as_str(),
            chosen.iter().map(|(index, _)| *index).collect(),
            start,
        ));
    }
    ready.sort_by(|a, b| release_key(a.2).cmp(&release_key(b.2)).then(a.0.cmp(b.0)));
    let mut picked: Vec<&(&str, Vec<u32>, Option<Timestamp>)> = Vec::new();
    for required in &job.required_nodes {
        picked.push(ready.iter().find(|(name, _, _)| name == required)?);
    }
    let missing = (job.nodes.max(1) as usize).saturating_sub(picked.len());
    let others: Vec<&(&str, Vec<u32>, Option<Timestamp>)> = ready
        .iter()
        .filter(|(name, _, _)| !job.required_nodes.iter().any(|r| r == name))
        .take(missing)
        .collect();
    if others.len() < missing {
        return None;
    }
    picked.extend(others);
    let start = picked.iter().try_fold(now, |latest, (_, _, release)| {
        release.map(|r| latest.max(r))
    });
    Some(Reservation {
        job: job.id.clone(),
        gpus: picked
            .iter()
            .flat_map(|(name, gpus, _)| gpus.iter().map(|index| ((*name).to_owned(), *index)))
            .collect(),
        start,
    })
}
