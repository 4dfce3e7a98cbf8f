//! Preemption: a running job past its time slice yields to a waiting job its room lets start
//! ([`slices_over`]); and by quality-of-service class, the running jobs a waiting job of a
//! class that may preempt has stopped, so that it starts in their room. A pure decision of
//! the pass:
//!
//! - only a waiter that cannot start now, even by backfill, may preempt;
//! - only jobs of a preemptible class, of another class than the waiter's, that ran their
//!   class's `min_runtime` and are not being stopped already, may be victims;
//! - victims are taken in order of GPU-hours they would lose (fewest first), then youngest
//!   first, until the waiter fits; then any whose room the waiter does not need is let go,
//!   so never more are stopped than needed; none are stopped when even all of them would not
//!   make room (nothing is preempted for a job that then cannot start);
//! - room that jobs being stopped already will free counts as free: a waiter does not have
//!   more jobs stopped while the ones stopped for it are in their grace;
//! - waiters are served in queue order, each booking the room it will take, so two do not
//!   count on the same victims; only the first `max_reservations` of them in a pass (the head
//!   of the queue), and none when nothing preemptible runs.

use std::collections::HashSet;

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;

use super::capacity::Capacity;
use super::victims::Room;
use super::{CoreSettings, Decision, QueuedJob, RunningJob, Waiters};

/// The jobs to stop for waiting jobs of classes that may preempt; `already` are the pass's
/// other preemptions (time slices), whose room is counted as freed.
pub(super) fn by_class(
    capacity: &Capacity,
    running: &[&RunningJob],
    waiting: &Waiters<'_>,
    settings: &CoreSettings,
    now: Timestamp,
    already: &[Decision],
) -> Vec<Decision> {
    // Nothing preemptible runs (a cluster without such classes): no work at all.
    if !running.iter().any(|job| job.preemptible_from.is_some()) {
        return Vec::new();
    }
    // The head of the queue only, as for reservations: a pass over 100 000 blocked jobs
    // does not search room for each.
    let preemptors: Vec<(&QueuedJob, usize)> = waiting
        .jobs
        .iter()
        .copied()
        .filter(|(job, _)| job.may_preempt)
        .take(settings.max_reservations.max(1))
        .collect();
    let candidates =
        |waiter: &QueuedJob, taken: &HashSet<&JobId>| candidates(running, waiter, taken, now);
    let room = Room {
        capacity,
        running,
        waiting,
        settings,
        now,
    };
    room.stop_for(&preemptors, already, candidates, |job, for_job| {
        Decision::Preempt {
            job,
            for_job: Some(for_job),
        }
    })
}

/// Whether `running`, once requeued, could have `waiter` stopped again at once: its class
/// may preempt, and `waiter`'s, another one, is preemptible.
pub(super) fn may_take_back(running: &RunningJob, waiter: &QueuedJob) -> bool {
    running.may_preempt && waiter.preemptible && running.qos != waiter.qos
}

/// The running jobs `waiter` may have stopped, cheapest first: fewest GPU-hours lost, then
/// youngest, then id.
fn candidates<'a>(
    running: &[&'a RunningJob],
    waiter: &QueuedJob,
    taken: &HashSet<&JobId>,
    now: Timestamp,
) -> Vec<&'a RunningJob> {
    let mut candidates: Vec<&RunningJob> = running
        .iter()
        .copied()
        .filter(|job| job.preemptible_from.is_some_and(|from| from <= now))
        .filter(|job| !job.stopping && !taken.contains(&job.id))
        .filter(|job| job.qos != waiter.qos)
        .collect();
    let lost = |job: &RunningJob| {
        let ran = (now - job.started_at).num_seconds().max(0) as f64;
        job.placement.total_gpus() * ran
    };
    candidates.sort_by(|a, b| {
        lost(a)
            .total_cmp(&lost(b))
            .then(b.started_at.cmp(&a.started_at))
            .then(a.id.cmp(&b.id))
    });
    candidates
}

/// Running jobs past their time slice that yield: each one whose GPUs (and cores, memory)
/// would let a waiting job start that cannot start now and that ranks at least as high as
/// the yielding job would once requeued, reservations for jobs ahead of it kept. A job
/// nobody could use the room of keeps running, however many others wait; so does one whose
/// only takers rank below it (requeued, it would take its room back at once).
pub(super) fn slices_over(
    capacity: &Capacity,
    running: &[&RunningJob],
    waiting: &Waiters<'_>,
    settings: &CoreSettings,
    now: Timestamp,
) -> Vec<Decision> {
    let blocked: Vec<(&QueuedJob, usize)> = waiting
        .jobs
        .iter()
        .copied()
        .filter(|&waiter| !waiting.could_start(waiter, capacity, settings, now))
        .collect();
    if blocked.is_empty() {
        return Vec::new();
    }
    running
        .iter()
        .filter(|job| job.slice_end.is_some_and(|end| end <= now))
        .filter(|job| {
            let mut freed = capacity.clone();
            freed.release(&job.placement);
            // Yielding to a job it may preempt back would only swap them, forever.
            blocked
                .iter()
                .filter(|(waiter, _)| waiter.effective_priority >= job.priority_if_requeued)
                .filter(|(waiter, _)| !may_take_back(job, waiter))
                .any(|&waiter| waiting.could_start(waiter, &freed, settings, now))
        })
        .map(|job| Decision::Preempt {
            job: job.id.clone(),
            for_job: None,
        })
        .collect()
}
