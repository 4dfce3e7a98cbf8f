//! Backfill reservations: for a job at the head of the line that cannot start, the GPUs that
//! will free up first (judged by running jobs' time limits) and when. Jobs behind it may use
//! those GPUs only if they will be gone before then, so backfill never delays it.

use std::collections::HashMap;

use mgpu_protocol::Timestamp;
use mgpu_protocol::job::Placement;

use super::capacity::{Capacity, FreeNode};
use super::windows::{Guest, WindowIndex};
use super::{FastHash, NodeView, QueuedJob, RunningJob};

#[derive(Clone, Debug, PartialEq)]
pub(super) struct Reservation {
    /// The waiting job the GPUs are held for.
    pub job: mgpu_protocol::ids::JobId,
    /// (node, GPU index) of every GPU held, on one node or, for a multi-node job, several.
    pub gpus: Vec<(String, u32)>,
    /// When the GPUs are expected free; None when a job on them has no time limit.
    pub start: Option<Timestamp>,
    /// When the job would end there at the latest (start + its time limit); None: unknown.
    pub ends: Option<Timestamp>,
}

impl Reservation {
    /// Whether a job that ends by `ends_at` (None: no limit) must keep off GPU `index` of `node`.
    pub fn blocks(&self, node: &str, index: u32, ends_at: Option<Timestamp>) -> bool {
        !ends_before(ends_at, self.start) && self.gpus.iter().any(|(n, i)| n == node && *i == index)
    }
}

/// Whether a job ending by `ends_at` is gone before a reservation starting at `start`.
fn ends_before(ends_at: Option<Timestamp>, start: Option<Timestamp>) -> bool {
    matches!((ends_at, start), (Some(end), Some(start)) if end <= start)
}

/// The GPUs the pass's reservations hold, by (position in [`Capacity::nodes`], GPU index),
/// each with its reservation's start. A GPU is held by one reservation at most ([`reserve`]
/// skips held ones), so whether a reservation keeps a job off a GPU is one lookup, where
/// asking every reservation for every GPU of every search compared names by the million.
#[derive(Clone, Default)]
pub(super) struct ReservedGpus {
    start_of: HashMap<(usize, u32), Option<Timestamp>, FastHash>,
}

impl ReservedGpus {
    pub fn add(&mut self, capacity: &Capacity, reservation: &Reservation) {
        for (node, index) in &reservation.gpus {
            if let Some(position) = capacity.position_of(node) {
                self.start_of.insert((position, *index), reservation.start);
            }
        }
    }

    /// Whether a job that ends by `ends_at` (None: no limit) must keep off this GPU.
    pub fn blocks(&self, position: usize, index: u32, ends_at: Option<Timestamp>) -> bool {
        self.start_of
            .get(&(position, index))
            .is_some_and(|start| !ends_before(ends_at, *start))
    }

    fn holds(&self, position: usize, index: u32) -> bool {
        self.start_of.contains_key(&(position, index))
    }
}

/// When each held GPU frees up (None: a job on it has no time limit), by (position in
/// [`Capacity::nodes`], GPU index): gathered once per pass, when the first reservation is
/// sought, and kept up to date as the pass starts jobs. Gathering it for every reservation
/// went through every running job sixteen times a pass.
#[derive(Clone)]
pub(super) struct ReleaseTimes {
    at: HashMap<(usize, u32), Option<Timestamp>, FastHash>,
    now: Timestamp,
}

impl ReleaseTimes {
    pub fn new<'a>(
        capacity: &Capacity,
        holding: impl IntoIterator<Item = &'a RunningJob>,
        now: Timestamp,
    ) -> Self {
        let mut releases = ReleaseTimes {
            at: HashMap::default(),
            now,
        };
        for held in holding {
            releases.add(capacity, &held.placement, held.expected_end);
        }
        releases
    }

    /// A job now holding `placement` until `expected_end` (None: no limit).
    pub fn add(
        &mut self,
        capacity: &Capacity,
        placement: &Placement,
        expected_end: Option<Timestamp>,
    ) {
        for (_, node, shares) in placement.ranks() {
            let Some(position) = capacity.position_of(node) else {
                continue;
            };
            for share in shares {
                let release = self
                    .at
                    .entry((position, share.index))
                    .or_insert(Some(self.now));
                *release = match (*release, expected_end) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    _ => None,
                };
            }
        }
    }

    /// The GPUs `gpus` (node, index) are taken until `until` (None: no known end), whatever
    /// was expected of them before: what a dated job does to the jobs dated after it.
    pub fn hold_until(
        &mut self,
        capacity: &Capacity,
        gpus: &[(String, u32)],
        until: Option<Timestamp>,
    ) {
        for (node, index) in gpus {
            if let Some(position) = capacity.position_of(node) {
                self.at.insert((position, *index), until);
            }
        }
    }

    fn of(&self, position: usize, index: u32) -> Option<Timestamp> {
        self.at
            .get(&(position, index))
            .copied()
            .unwrap_or(Some(self.now))
    }
}

/// Orders release times: known times first, earliest first; unknown (None) last.
pub(super) fn release_key(release: Option<Timestamp>) -> (bool, Option<Timestamp>) {
    (release.is_none(), release)
}

/// The reservation for `job`, or None when no set of nodes could ever take it under current
/// holdings. Each node that could hold one rank offers the GPUs that free up first there; the
/// job gets its required nodes plus the earliest-ready others, and starts when the last of
/// them is ready.
pub(super) fn reserve(
    capacity: &Capacity,
    nodes: &[NodeView],
    releases: &ReleaseTimes,
    job: &QueuedJob,
    among: &Among<'_>,
    now: Timestamp,
) -> Option<Reservation> {
    if job.gpus.is_zero() {
        return None;
    }
    let mut ready: Vec<Ready<'_>> = (0..capacity.nodes.len())
        .filter_map(|position| offer_at(capacity, nodes, releases, job, among, position, now))
        .collect();
    ready.sort_by(|a, b| release_key(a.2).cmp(&release_key(b.2)).then(a.0.cmp(b.0)));
    pick(job, ready.iter(), now)
}

/// What the node at `position` offers one rank of `job`: the GPUs that free up first there,
/// and when; None when it could never hold a rank.
pub(super) fn offer_at<'a>(
    capacity: &'a Capacity,
    nodes: &[NodeView],
    releases: &ReleaseTimes,
    job: &QueuedJob,
    among: &Among<'_>,
    position: usize,
    now: Timestamp,
) -> Option<Ready<'a>> {
    let node = capacity.nodes.get(position)?;
    if !(node.offered && job.may_use_node(&node.name) && job.selects_node(&node.features)) {
        return None;
    }
    let view = nodes.get(node.view)?;
    let offer = Offer {
        position,
        node,
        view,
        releases,
        reserved: among.reserved,
        type_allowed: among.type_allowed,
        windows: among.windows,
        guest: &among.guest,
    };
    let (gpus, start) = offer.ready(job, now)?;
    Some((node.name.as_str(), gpus, start))
}

/// The reservation `job` gets from the nodes' offers, `sorted` earliest first (then by
/// name): its required nodes, then the earliest-ready others; it starts when the last of
/// them is ready. None when too few nodes offer.
pub(super) fn pick<'r, 'a: 'r>(
    job: &QueuedJob,
    sorted: impl Iterator<Item = &'r Ready<'a>> + Clone,
    now: Timestamp,
) -> Option<Reservation> {
    let mut picked: Vec<&Ready<'_>> = Vec::new();
    for required in &job.required_nodes {
        picked.push(sorted.clone().find(|(name, _, _)| name == required)?);
    }
    let missing = (job.nodes.max(1) as usize).saturating_sub(picked.len());
    let others: Vec<&Ready<'_>> = sorted
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
    let limit = job
        .time_limit
        .and_then(|limit| chrono::Duration::from_std(limit).ok());
    Some(Reservation {
        ends: start.zip(limit).map(|(start, limit)| start + limit),
        job: job.id.clone(),
        gpus: picked
            .iter()
            .flat_map(|(name, gpus, _)| gpus.iter().map(|index| ((*name).to_owned(), *index)))
            .collect(),
        start,
    })
}

/// A node that could hold one rank of a job: its name, the GPUs it would give the job, and
/// when they are all free (None: not before some job without a time limit ends).
pub(super) type Ready<'a> = (&'a str, Vec<u32>, Option<Timestamp>);

/// What one node can offer a waiting job.
struct Offer<'a> {
    position: usize,
    node: &'a FreeNode,
    view: &'a NodeView,
    releases: &'a ReleaseTimes,
    reserved: &'a ReservedGpus,
    type_allowed: &'a dyn Fn(Option<&str>) -> bool,
    windows: &'a WindowIndex<'a>,
    guest: &'a Guest,
}

/// What a reservation may take: GPUs not reserved for jobs ahead, of types the job's owner
/// may still take more of, when reservations' windows let the job have them.
pub(super) struct Among<'a> {
    pub reserved: &'a ReservedGpus,
    pub type_allowed: &'a dyn Fn(Option<&str>) -> bool,
    pub windows: &'a WindowIndex<'a>,
    pub guest: Guest,
}

impl<'a> Offer<'a> {
    /// The GPUs that free up first here, enough for one rank of `job`; None when the node
    /// has too few it could ever use.
    fn ready(&self, job: &QueuedJob, now: Timestamp) -> Option<(Vec<u32>, Option<Timestamp>)> {
        let (node, view) = (self.node, self.view);
        let mem = job.mem_mib.unwrap_or(0);
        let wanted = job
            .pinned_on(&node.name)
            .map_or(job.gpus.gpu_count() as usize, <[u32]>::len);
        // (index, when it is free) for every GPU the job could ever use here.
        let mut candidates: Vec<(u32, Option<Timestamp>)> = node
            .gpus
            .iter()
            .filter(|g| g.offered())
            .filter(|g| !self.reserved.holds(self.position, g.index))
            .filter(|g| job.may_use_gpu(&node.name, g.index))
            .filter(|g| job.takes_type(g.gpu_type.as_deref()))
            .filter(|g| (self.type_allowed)(g.gpu_type.as_deref()))
            .filter(|g| {
                view.gpus.iter().any(|v| {
                    v.index == g.index
                        && v.memory_total_mib.saturating_sub(v.foreign_mem_mib) >= mem
                })
            })
            .filter_map(|g| {
                let release = self.releases.of(self.position, g.index);
                let usable =
                    self.windows
                        .usable_from(self.guest, self.position, g.index, release)?;
                Some((g.index, usable))
            })
            .collect();
        if candidates.len() < wanted {
            return None;
        }
        candidates.sort_by_key(|(index, release)| (release_key(*release), *index));
        let chosen = &candidates[..wanted];
        let start = chosen
            .iter()
            .try_fold(now, |latest, (_, release)| release.map(|r| latest.max(r)));
        Some((chosen.iter().map(|(index, _)| *index).collect(), start))
    }
}
