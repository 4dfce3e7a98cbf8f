//! Idle GPUs handed to who waits: which running jobs the `[idle]` policy acts on in a pass.
//! A pure decision, the same shape as preemption by class (both stop jobs through
//! `victims.rs`):
//!
//! - only a job warned for idleness and past its warning's grace is a candidate (the
//!   machine sets `reclaimable_from`), whatever its class;
//! - only for a waiter that cannot start now, even by backfill, and would start in the
//!   candidates' room: nothing is reclaimed while nobody waits, or for a job that then
//!   still could not start;
//! - the fewest candidates that make the room, longest past their grace first; room that
//!   jobs being stopped already will free (other decisions of the pass included) counts as
//!   free, so a waiter does not have more jobs stopped than it needs;
//! - waiters in queue order, each booking the room it will take; only the first
//!   `max_reservations` of them.

use std::collections::HashSet;

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;

use super::capacity::Capacity;
use super::victims::Room;
use super::{CoreSettings, Decision, QueuedJob, RunningJob, Waiters};

/// The idle jobs to act on for waiting jobs; `already` are the pass's other decisions, whose
/// stops are counted as freeing their room.
pub(super) fn reclaim(
    capacity: &Capacity,
    running: &[&RunningJob],
    waiting: &Waiters<'_>,
    settings: &CoreSettings,
    now: Timestamp,
    already: &[Decision],
) -> Vec<Decision> {
    let reclaimable = |job: &RunningJob| job.reclaimable_from.is_some_and(|from| from <= now);
    if !running.iter().any(|job| reclaimable(job)) {
        return Vec::new();
    }
    let waiters: Vec<(&QueuedJob, usize)> = waiting
        .jobs
        .iter()
        .copied()
        .take(settings.max_reservations.max(1))
        .collect();
    let candidates = |_: &QueuedJob, taken: &HashSet<&JobId>| {
        let mut candidates: Vec<&RunningJob> = running
            .iter()
            .copied()
            .filter(|job| reclaimable(job) && !job.stopping && !taken.contains(&job.id))
            .collect();
        candidates.sort_by(|a, b| {
            a.reclaimable_from
                .cmp(&b.reclaimable_from)
                .then(a.id.cmp(&b.id))
        });
        candidates
    };
    let room = Room {
        capacity,
        running,
        waiting,
        settings,
        now,
    };
    room.stop_for(&waiters, already, candidates, |job, for_job| {
        Decision::Reclaim { job, for_job }
    })
}
