//! The invariant of time slices, checked when a yield is stored: a job past its time slice
//! yields its GPUs only when a waiting job could use them. Checked against a deliberately
//! generous reading of "could use", so that every yield the scheduler is right to make
//! passes: some waiting job, not held and not waiting for a job that has not ended, asks for
//! no more than is free on one of the yielding job's nodes once its GPUs are released
//! (whole GPUs counted for whole ones, one GPU's free share for a share; a node of a type it
//! did not list does not count; a job over several nodes always could). Pins, memory,
//! reservations, caps and priorities are left out: each only narrows what the scheduler may
//! do, so a yield this check refuses the scheduler should have refused too.

use std::collections::{BTreeMap, BTreeSet};

use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState, Run};
use mgpu_protocol::stop::StopCause;

use super::agents::SimAgent;
use crate::machine::jobs::Tracked;

/// The yields seen, so each is checked once (its record is stored again while it stops).
#[derive(Default)]
pub struct SliceYields {
    seen: BTreeSet<(JobId, u32)>,
    /// Yields checked, for the run's counts.
    pub yields: u64,
}

impl SliceYields {
    /// `record` was stored; `records` is the bucket after the write. Says what it breaks:
    /// a yield at the slice's end no waiting job could use.
    pub fn stored(
        &mut self,
        record: &JobRecord,
        records: &BTreeMap<JobId, Tracked>,
        nodes: &[SimAgent],
    ) -> Option<String> {
        let JobState::Running(run) = &record.state else {
            return None;
        };
        if !yielding(run) || !self.seen.insert((record.id.clone(), record.attempt)) {
            return None;
        }
        self.yields += 1;
        let free = free_after_release(record, run, records, nodes);
        let somebody = records
            .values()
            .map(|tracked| &tracked.record)
            .filter(|waiter| waiter.id != record.id && may_start(waiter, records))
            .any(|waiter| could_use(waiter, &free));
        (!somebody).then(|| {
            format!(
                "job {} yielded at its slice's end (attempt {}) with no waiting job able to \
                 use what it frees ({:?})",
                record.id.short(),
                record.attempt,
                free.iter()
                    .map(|node| (node.name, &node.free_units))
                    .collect::<Vec<_>>()
            )
        })
    }
}

/// A stop for a requeue that is nobody's preemption nor the idle policy's: the slice's end.
fn yielding(run: &Run) -> bool {
    let idle = run
        .stop_warning
        .is_some_and(|warning| warning.cause == StopCause::Idle);
    run.preempt_requested
        && run.preempted_for.is_none()
        && run.cancel_requested_by.is_none()
        && !idle
}

/// What is free on one of the yielding job's nodes once its GPUs are released.
struct Freed<'a> {
    name: &'a str,
    gpu_type: &'a str,
    /// Free units of each GPU.
    free_units: Vec<u32>,
}

fn free_after_release<'a>(
    yielding: &JobRecord,
    run: &Run,
    records: &BTreeMap<JobId, Tracked>,
    nodes: &'a [SimAgent],
) -> Vec<Freed<'a>> {
    let on: BTreeSet<&str> = run.placement.ranks().map(|(_, node, _)| node).collect();
    let mut freed: Vec<Freed<'a>> = nodes
        .iter()
        .filter(|node| on.contains(node.name.as_str()))
        .map(|node| Freed {
            name: &node.name,
            gpu_type: &node.gpu_type,
            free_units: vec![GpuAmount::UNITS_PER_GPU; node.gpus as usize],
        })
        .collect();
    let holders = records
        .values()
        .map(|tracked| &tracked.record)
        .filter(|other| other.id != yielding.id);
    for other in holders {
        let JobState::Running(held) = &other.state else {
            continue;
        };
        for node in &mut freed {
            for share in held.placement.gpus_on(node.name).unwrap_or_default() {
                if let Some(free) = node.free_units.get_mut(share.index as usize) {
                    *free = free.saturating_sub(share.amount.units());
                }
            }
        }
    }
    freed
}

/// Whether `waiter` waits for room: queued, not held, no job it waits for still unended.
fn may_start(waiter: &JobRecord, records: &BTreeMap<JobId, Tracked>) -> bool {
    let JobState::Queued(waiting) = &waiter.state else {
        return false;
    };
    let unended = |id: &JobId| {
        records
            .get(id)
            .is_some_and(|dep| !dep.record.state.is_finished())
    };
    let spec = &waiter.spec;
    waiting.held_by.is_none() && !spec.after.iter().chain(&spec.after_any).any(unended)
}

/// Whether `waiter` asks for no more than one of the nodes has free.
fn could_use(waiter: &JobRecord, freed: &[Freed<'_>]) -> bool {
    let spec = &waiter.spec;
    if spec.nodes > 1 || spec.gpus.is_zero() {
        return true;
    }
    freed.iter().any(|node| {
        let typed_out = !spec.gpu_types.is_empty()
            && !spec
                .gpu_types
                .iter()
                .any(|t| t.eq_ignore_ascii_case(node.gpu_type));
        if typed_out {
            return false;
        }
        let units = spec.gpus.units();
        if !spec.gpus.is_whole() && units > GpuAmount::UNITS_PER_GPU {
            return true;
        }
        if units < GpuAmount::UNITS_PER_GPU {
            return node.free_units.iter().any(|free| *free >= units);
        }
        let whole_free = node
            .free_units
            .iter()
            .filter(|free| **free == GpuAmount::UNITS_PER_GPU)
            .count();
        whole_free as u64 >= u64::from(spec.gpus.gpu_count())
    })
}
