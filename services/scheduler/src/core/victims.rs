//! Stopping running jobs to make room for waiting ones, shared by preemption by class
//! (`preemption.rs`) and idle reclaims (`idle_reclaim.rs`), which differ only in which jobs
//! may be stopped and what the decision says:
//!
//! - a waiter that can start on what is free, or will be once jobs already stopping are gone
//!   (the pass's other stops included), books that room and stops nothing;
//! - otherwise the fewest candidates (in the order given) whose room lets it start, with any
//!   it does not need let go; none when all of them would not be enough;
//! - waiters in queue order, each booking the room it will take, so two never count on the
//!   same jobs.

use std::collections::HashSet;

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;

use super::capacity::Capacity;
use super::{CoreSettings, Decision, QueuedJob, RunningJob, Waiters};

/// What a pass knows when it stops jobs for others.
pub(super) struct Room<'p, 'a> {
    pub capacity: &'p Capacity,
    pub running: &'p [&'a RunningJob],
    pub waiting: &'p Waiters<'p>,
    pub settings: &'p CoreSettings,
    pub now: Timestamp,
}

impl<'p, 'a> Room<'p, 'a> {
    /// The decisions (`decide(victim, waiter)`) that stop jobs for `waiters`: `candidates`
    /// lists, for a waiter, the jobs it may have stopped that are not taken yet, best first;
    /// `already` are the pass's other stops, whose room counts as freed.
    pub(super) fn stop_for(
        &self,
        waiters: &[(&QueuedJob, usize)],
        already: &[Decision],
        candidates: impl Fn(&QueuedJob, &HashSet<&JobId>) -> Vec<&'a RunningJob>,
        decide: impl Fn(JobId, JobId) -> Decision,
    ) -> Vec<Decision> {
        let mut taken: HashSet<&JobId> = already
            .iter()
            .filter_map(|d| match d {
                Decision::Preempt { job, .. } | Decision::Reclaim { job, .. } => Some(job),
                _ => None,
            })
            .collect();
        let mut freed = self.capacity.clone();
        for job in self.running {
            if job.stopping || taken.contains(&job.id) {
                freed.release(&job.placement);
            }
        }
        let (waiting, settings, now) = (self.waiting, self.settings, self.now);
        let mut decisions = Vec::new();
        for &waiter in waiters {
            if let Some(placement) = waiting.placement(waiter, &freed, settings, now) {
                freed.book(&placement);
                continue;
            }
            let candidates = candidates(waiter.0, &taken);
            let Some(victims) = fewest_victims(&freed, &candidates, waiting, waiter, settings, now)
            else {
                continue;
            };
            for victim in &victims {
                freed.release(&victim.placement);
            }
            if let Some(placement) = waiting.placement(waiter, &freed, settings, now) {
                freed.book(&placement);
            }
            for victim in victims {
                taken.insert(&victim.id);
                decisions.push(decide(victim.id.clone(), waiter.0.id.clone()));
            }
        }
        decisions
    }
}

/// The fewest of `candidates` (in their order) whose room lets `waiter` start, with any
/// whose room it does not need let go; None when all of them would not be enough.
fn fewest_victims<'a>(
    freed: &Capacity,
    candidates: &[&'a RunningJob],
    waiting: &Waiters<'_>,
    waiter: (&QueuedJob, usize),
    settings: &CoreSettings,
    now: Timestamp,
) -> Option<Vec<&'a RunningJob>> {
    let fits = |victims: &[&RunningJob]| {
        let mut room = freed.clone();
        for victim in victims {
            room.release(&victim.placement);
        }
        waiting.could_start(waiter, &room, settings, now)
    };
    let mut chosen: Vec<&RunningJob> = Vec::new();
    for candidate in candidates {
        chosen.push(candidate);
        if fits(&chosen) {
            break;
        }
    }
    if chosen.is_empty() || !fits(&chosen) {
        return None;
    }
    // Let go, latest first, every victim the others already make enough room without.
    let mut index = chosen.len();
    while index > 0 {
        index -= 1;
        let mut without = chosen.clone();
        without.remove(index);
        if !without.is_empty() && fits(&without) {
            chosen = without;
        }
    }
    Some(chosen)
}
