//! The jobs that waited for room in a pass, and where each would start on some capacity
//! (after jobs are stopped for it): what time slices, preemption and idle reclaims ask.

use mgpu_protocol::Timestamp;
use mgpu_protocol::job::Placement;

use super::capacity::{Capacity, Constraints};
use super::owner_gpus::OwnerGpus;
use super::reservation::Reservation;
use super::windows::WindowIndex;
use super::{CoreSettings, QueuedJob};

/// The jobs that waited for room in a pass, each with the number of the pass's reservations
/// made for jobs ahead of it; and what else decides where a job may start: its owner's caps
/// per GPU type (GPUs held once the pass's starts are booked) and the reservations' windows.
pub(super) struct Waiters<'a> {
    pub jobs: &'a [(&'a QueuedJob, usize)],
    pub reservations: &'a [Reservation],
    pub owner_gpus: &'a OwnerGpus<'a>,
    pub windows: &'a WindowIndex<'a>,
}

impl Waiters<'_> {
    /// Whether `job` could start on `capacity`, keeping off what is reserved for jobs ahead of
    /// it (backfill never delays them).
    pub(super) fn could_start(
        &self,
        waiter: (&QueuedJob, usize),
        capacity: &Capacity,
        settings: &CoreSettings,
        now: Timestamp,
    ) -> bool {
        self.placement(waiter, capacity, settings, now).is_some()
    }

    /// Where `job` would start on `capacity`, keeping off what is reserved for jobs ahead of
    /// it; None: it could not.
    pub(super) fn placement(
        &self,
        (job, ahead): (&QueuedJob, usize),
        capacity: &Capacity,
        settings: &CoreSettings,
        now: Timestamp,
    ) -> Option<Placement> {
        let reserved = self.reservations.get(..ahead).unwrap_or_default();
        let ends_at = job
            .time_limit
            .and_then(|limit| chrono::Duration::from_std(limit).ok())
            .map(|limit| now + limit);
        let guest = self.windows.guest(job);
        let avoid = |position: usize, index: u32| {
            self.windows.blocks_now(&guest, position, index)
                || capacity.nodes.get(position).is_some_and(|node| {
                    reserved
                        .iter()
                        .any(|r| r.blocks(&node.name, index, ends_at))
                })
        };
        // A type its owner's cap keeps it off is no room for it: stopping a job there (a
        // slice's end, a preemption) would only see that job start again in its room.
        let type_allowed = |gpu_type: Option<&str>| self.owner_gpus.allows_type(job, gpu_type);
        let constraints = Constraints {
            in_service_only: true,
            unbusy_only: true,
            avoid: &avoid,
            type_allowed: &type_allowed,
        };
        capacity.place(job, &constraints, settings)
    }
}
