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

use super::capacity::Capacity;
use super::owner_gpus::OwnerGpus;
use super::reservation::{self, Among, ReleaseTimes, Reservation, ReservedGpus};
use super::{Decision, NodeView, QueuedJob};

/// A pass's decisions and the expected starts it worked out.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub decisions: Vec<Decision>,
    /// Waiting jobs that were given a reservation or an estimate, in queue order.
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
    pub now: Timestamp,
}

/// When each GPU frees up for the jobs dated next: after the running jobs, the reserved
/// jobs and the jobs dated so far, each by its time limit.
pub(super) struct Timeline {
    releases: ReleaseTimes,
    nothing_reserved: ReservedGpus,
}

impl Timeline {
    /// The timeline once the running jobs (`releases`) and the reservations are served.
    pub fn after(capacity: &Capacity, releases: &ReleaseTimes, reserved: &[Reservation]) -> Self {
        let mut releases = releases.clone();
        for reservation in reserved {
            releases.hold_until(capacity, &reservation.gpus, reservation.ends);
        }
        Timeline {
            releases,
            nothing_reserved: ReservedGpus::default(),
        }
    }

    /// When each of `jobs` (waiting, in queue order) could start, each holding the GPUs
    /// it would take on the timeline until it would end; jobs no set of nodes could take
    /// now (a node lost, a type its owner is capped on) are left undated.
    pub fn date(&mut self, jobs: &[&QueuedJob], dates: &Dates<'_>) -> Vec<Reservation> {
        jobs.iter()
            .filter_map(|job| {
                let type_allowed =
                    |gpu_type: Option<&str>| dates.owner_gpus.allows_type(job, gpu_type);
                self.estimate(dates.capacity, dates.nodes, job, &type_allowed, dates.now)
            })
            .collect()
    }

    /// When `job` could start on the GPUs that free up first for it, which it then holds on
    /// the timeline until it would end; None when no set of nodes could ever take it.
    fn estimate(
        &mut self,
        capacity: &Capacity,
        nodes: &[NodeView],
        job: &QueuedJob,
        type_allowed: &dyn Fn(Option<&str>) -> bool,
        now: Timestamp,
    ) -> Option<Reservation> {
        let among = Among {
            reserved: &self.nothing_reserved,
            type_allowed,
        };
        let dated = reservation::reserve(capacity, nodes, &self.releases, job, &among, now)?;
        self.releases.hold_until(capacity, &dated.gpus, dated.ends);
        Some(dated)
    }
}
