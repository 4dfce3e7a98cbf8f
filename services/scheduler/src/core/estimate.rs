//! When waiting jobs are expected to start: the answer to "when will it run", read off the
//! reservations a pass makes anyway. The first `max_reservations` jobs that cannot start get
//! backfill reservations, which keep later jobs off their GPUs; once the pass decided, up to
//! `max_start_estimates` of the other waiting jobs are dated in queue order on a timeline of
//! the GPUs: each GPU frees up when the job running or started on it would end by its time
//! limit, and again when the job reserved or dated on it would end by its own, so the jobs
//! waiting for one busy node are dated one after another. Dating comes after every decision
//! and keeps no job off any GPU: the estimates change nothing the pass decides.
//!
//! An estimate assumes every running job ends by its time limit and that nothing ahead is
//! submitted or ends early: a job with no time limit on the GPUs in question makes the start
//! unknown (`at` None).

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};

use super::capacity::Capacity;
use super::fast_hash::FastHash;
use super::owner_gpus::OwnerGpus;
use super::reservation::{self, Among, Ready, ReleaseTimes, Reservation, ReservedGpus};
use super::shape::Shape;
use super::windows::WindowIndex;
use super::{Decision, NodeView, QueuedJob};

/// A pass's decisions and the expected starts it worked out.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub decisions: Vec<Decision>,
    /// Waiting jobs that were given a reservation or an estimate: the reservations first,
    /// then the estimates, each in queue order (the order the timeline serves them in).
    pub estimates: Vec<StartEstimate>,
}

/// When a waiting job is expected to start, and where.
#[derive(Clone, Debug, PartialEq)]
pub struct StartEstimate {
    pub job: JobId,
    /// When the GPUs it counts on are all free; None when a job on them has no time limit.
    pub at: Option<Timestamp>,
    /// When it would end at the latest (`at` + its time limit); None: unknown.
    pub until: Option<Timestamp>,
    /// (node, GPU index) of the GPUs it counts on.
    pub gpus: Vec<(String, u32)>,
    /// Its GPUs are reserved for it (backfill keeps later jobs off them), not only counted on.
    pub reserved: bool,
}

impl StartEstimate {
    pub(super) fn of(reservation: Reservation, reserved: bool) -> Self {
        StartEstimate {
            job: reservation.job,
            at: reservation.start,
            until: reservation.ends,
            gpus: reservation.gpus,
            reserved,
        }
    }
}

/// Two dated jobs counting on one GPU at once, if any: a job with an unknown end holds its
/// GPUs for ever, one with an unknown start is not dated on them.
pub fn overlapping(dated: &[StartEstimate]) -> Option<String> {
    for (n, first) in dated.iter().enumerate() {
        for second in &dated[n + 1..] {
            let (Some(a), Some(b)) = (first.at, second.at) else {
                continue;
            };
            let before = |at: Timestamp, until: Option<Timestamp>| until.is_none_or(|u| at < u);
            let shared = first.gpus.iter().find(|g| second.gpus.contains(g));
            if let Some(gpu) = shared
                && before(a, second.until)
                && before(b, first.until)
            {
                return Some(format!("{} and {} both on {gpu:?}", first.job, second.job));
            }
        }
    }
    None
}

/// What dating jobs reads: the pass's capacity and nodes, and what their owners hold.
pub(super) struct Dates<'a> {
    pub capacity: &'a Capacity,
    pub nodes: &'a [NodeView],
    pub owner_gpus: &'a OwnerGpus<'a>,
    pub windows: &'a WindowIndex<'a>,
    pub now: Timestamp,
}

/// When each GPU frees up for the jobs dated next: after the running jobs, the reserved
/// jobs and the jobs dated so far, each by its time limit.
///
/// Dating a job the way a reservation is made looks at every node; done for hundreds of
/// jobs over a thousand nodes it doubled a pass. So each node's offer to a shape of job
/// (what decides where it may go, [`Shape::placement_only`]) is kept, sorted by when it is
/// ready, and only the offers of the nodes a dated job takes are worked out again: dating a
/// job costs a look at every node once per shape, then a few per job.
pub(super) struct Timeline<'a> {
    releases: ReleaseTimes,
    nothing_reserved: ReservedGpus,
    offers: HashMap<Shape<'a>, Offers<'a>, FastHash>,
}

/// Every node's offer to one shape of job, and the offers in the order a reservation takes
/// them (ready first, then by name).
struct Offers<'a> {
    /// A job of the shape, for whom offers are worked out again.
    sample: &'a QueuedJob,
    by_position: Vec<Option<Ready<'a>>>,
    sorted: BTreeSet<(ReleaseKey, &'a str, usize)>,
}

type ReleaseKey = (bool, Option<Timestamp>);

impl<'a> Timeline<'a> {
    /// The timeline once the running jobs (`releases`) and the reservations are served.
    pub fn after(capacity: &Capacity, releases: &ReleaseTimes, reserved: &[Reservation]) -> Self {
        let mut releases = releases.clone();
        for reservation in reserved {
            releases.hold_until(capacity, &reservation.gpus, reservation.ends);
        }
        Timeline {
            releases,
            nothing_reserved: ReservedGpus::default(),
            offers: HashMap::default(),
        }
    }

    /// When each of `jobs` (waiting, in queue order) could start, each holding the GPUs
    /// it would take on the timeline until it would end; jobs no set of nodes could take
    /// now (a node lost, a type its owner is capped on) are left undated.
    pub fn date(&mut self, jobs: &[&'a QueuedJob], dates: &Dates<'a>) -> Vec<Reservation> {
        let mut dated = Vec::new();
        for job in jobs.iter().copied().filter(|job| !job.gpus.is_zero()) {
            let typed = dates.owner_gpus.has_type_caps(&job.owner);
            let windows = !dates.windows.is_empty();
            let shape = Shape::of(job, typed, windows).placement_only(windows);
            let offers = match self.offers.entry(shape) {
                Entry::Occupied(known) => known.into_mut(),
                Entry::Vacant(new) => new.insert(Offers::of(
                    job,
                    &self.releases,
                    &self.nothing_reserved,
                    dates,
                )),
            };
            let sorted = offers
                .sorted
                .iter()
                .filter_map(|(_, _, position)| offers.by_position.get(*position)?.as_ref());
            let Some(made) = reservation::pick(job, sorted, dates.now) else {
                continue;
            };
            self.releases
                .hold_until(dates.capacity, &made.gpus, made.ends);
            let taken: BTreeSet<usize> = made
                .gpus
                .iter()
                .filter_map(|(node, _)| dates.capacity.position_of(node))
                .collect();
            for offers in self.offers.values_mut() {
                for position in &taken {
                    offers.refresh(*position, &self.releases, &self.nothing_reserved, dates);
                }
            }
            dated.push(made);
        }
        dated
    }
}

impl<'a> Offers<'a> {
    /// Every node's offer to jobs like `sample`.
    fn of(
        sample: &'a QueuedJob,
        releases: &ReleaseTimes,
        nothing_reserved: &ReservedGpus,
        dates: &Dates<'a>,
    ) -> Self {
        let mut offers = Offers {
            sample,
            by_position: vec![None; dates.capacity.nodes.len()],
            sorted: BTreeSet::new(),
        };
        for position in 0..dates.capacity.nodes.len() {
            offers.refresh(position, releases, nothing_reserved, dates);
        }
        offers
    }

    /// Works out again what the node at `position` offers.
    fn refresh(
        &mut self,
        position: usize,
        releases: &ReleaseTimes,
        nothing_reserved: &ReservedGpus,
        dates: &Dates<'a>,
    ) {
        let Some(slot) = self.by_position.get_mut(position) else {
            return;
        };
        if let Some((name, _, release)) = slot.take() {
            self.sorted
                .remove(&(reservation::release_key(release), name, position));
        }
        let sample = self.sample;
        let type_allowed = |gpu_type: Option<&str>| dates.owner_gpus.allows_type(sample, gpu_type);
        let among = Among {
            reserved: nothing_reserved,
            type_allowed: &type_allowed,
            windows: dates.windows,
            guest: dates.windows.guest(sample),
        };
        let offer = reservation::offer_at(
            dates.capacity,
            dates.nodes,
            releases,
            sample,
            &among,
            position,
            dates.now,
        );
        if let Some((name, _, release)) = &offer {
            self.sorted
                .insert((reservation::release_key(*release), name, position));
        }
        *slot = offer;
    }
}
