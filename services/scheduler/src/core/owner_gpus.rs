//! Per-user caps on running GPUs within a pass (`max_gpus_running` of the scheduler's
//! `[limits]`): what each capped owner's running jobs hold, and whether one more job stays
//! within its owner's cap. A job past its owner's cap waits without booking or reserving
//! anything, so it never holds up other users' jobs behind it.

use std::collections::HashMap;

use mgpu_protocol::job::Placement;

use super::{QueuedJob, RunningJob};

/// GPUs (in `GpuAmount` units) held by each owner who has a cap.
pub(super) struct OwnerGpus<'a> {
    caps: &'a HashMap<String, u64>,
    held: HashMap<String, u64>,
}

impl<'a> OwnerGpus<'a> {
    /// What the running jobs of capped owners hold.
    pub(super) fn new(caps: &'a HashMap<String, u64>, running: &[&RunningJob]) -> Self {
        let mut held: HashMap<String, u64> = HashMap::new();
        if !caps.is_empty() {
            for job in running {
                if caps.contains_key(&job.owner) {
                    *held.entry(job.owner.clone()).or_default() += placement_units(&job.placement);
                }
            }
        }
        OwnerGpus { caps, held }
    }

    /// Whether `job` may start as far as its owner's cap goes.
    pub(super) fn allows(&self, job: &QueuedJob) -> bool {
        let Some(cap) = self.caps.get(&job.owner) else {
            return true;
        };
        let held = self.held.get(&job.owner).copied().unwrap_or(0);
        held.saturating_add(job_units(job)) <= *cap
    }

    /// Counts a job started in this pass.
    pub(super) fn book(&mut self, owner: &str, placement: &Placement) {
        if self.caps.contains_key(owner) {
            *self.held.entry(owner.to_owned()).or_default() += placement_units(placement);
        }
    }
}

/// GPU units a placement holds on all its nodes.
pub(super) fn placement_units(placement: &Placement) -> u64 {
    placement
        .ranks()
        .flat_map(|(_, _, gpus)| gpus.iter().map(|g| u64::from(g.amount.units())))
        .sum()
}

/// GPU units a queued job asks for on all its nodes.
fn job_units(job: &QueuedJob) -> u64 {
    u64::from(job.gpus.units()) * u64::from(job.nodes.max(1))
}
