//! Backfill reservations: for a job at the head of the line that cannot start, the GPUs that
//! will free up first (judged by running jobs' time limits) and when. Jobs behind it may use
//! those GPUs only if they will be gone before then, so backfill never delays it.

use mgpu_shared::Timestamp;

use super::capacity::Capacity;
use super::{NodeView, QueuedJob, RunningJob};

#[derive(Clone, Debug, PartialEq)]
pub(super) struct Reservation {
    /// The waiting job the GPUs are held for.
    pub job: mgpu_shared::ids::JobId,
    pub node: String,
    pub gpus: Vec<u32>,
    /// When the GPUs are expected free; None when a job on them has no time limit.
    pub start: Option<Timestamp>,
}

impl Reservation {
    /// Whether a job that ends by `ends_at` (None: no limit) must keep off GPU `index` of `node`.
    pub fn blocks(&self, node: &str, index: u32, ends_at: Option<Timestamp>) -> bool {
        let ends_in_time =
            matches!((ends_at, self.start), (Some(end), Some(start)) if end <= start);
        self.node == node && self.gpus.contains(&index) && !ends_in_time
    }
}

/// Orders release times: known times first, earliest first; unknown (None) last.
fn release_key(release: Option<Timestamp>) -> (bool, Option<Timestamp>) {
    (release.is_none(), release)
}

/// The reservation for `job`, or None when no node could ever take it under current holdings.
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
    let wanted = job.gpus.gpu_count() as usize;
    let mut best: Option<Reservation> = None;
    for node in capacity.nodes.iter().filter(|n| n.offered) {
        let Some(view) = nodes.iter().find(|n| n.name == node.name) else {
            continue;
        };
        // (index, when it is free) for every GPU the job could ever use here.
        let mut candidates: Vec<(u32, Option<Timestamp>)> = node
            .gpus
            .iter()
            .filter(|g| g.offered())
            .filter(|g| {
                !existing
                    .iter()
                    .any(|r| r.node == node.name && r.gpus.contains(&g.index))
            })
            .filter(|g| job.may_use_gpu(g.index))
            .filter(|g| {
                view.gpus.iter().any(|v| {
                    v.index == g.index
                        && v.memory_total_mib.saturating_sub(v.foreign_mem_mib) >= mem
                })
            })
            .map(|g| {
                let mut release = Some(now);
                for held in holding.iter().filter(|h| {
                    h.placement.node == node.name
                        && h.placement.gpus.iter().any(|s| s.index == g.index)
                }) {
                    release = match (release, held.expected_end) {
                        (Some(a), Some(b)) => Some(a.max(b)),
                        _ => None,
                    };
                }
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
        let reservation = Reservation {
            job: job.id.clone(),
            node: node.name.clone(),
            gpus: chosen.iter().map(|(index, _)| *index).collect(),
            start,
        };
        let better = match &best {
            None => true,
            Some(current) => release_key(reservation.start) < release_key(current.start),
        };
        if better {
            best = Some(reservation);
        }
    }
    best
}
