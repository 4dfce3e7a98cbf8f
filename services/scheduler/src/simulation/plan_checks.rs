//! The invariants of the expected starts, checked as each snapshot is stored:
//! - no waiting job is expected to start before the pass that dated it;
//! - no GPU is counted on by two waiting jobs of one pass at once (a reservation or an
//!   estimate holds its GPUs until the job would end by its time limit).
//!
//! That the estimates change nothing a pass decides is a property of the core, tested there.

use mgpu_protocol::plan::PlanSnapshot;

use super::world::World;

impl World {
    /// What storing `plan` breaks, recorded with the ledger's findings.
    pub(super) fn check_plan(&mut self, plan: &PlanSnapshot) {
        let mut broken = Vec::new();
        self.ledger.plans += 1;
        self.ledger.dated += plan.jobs.len() as u64;
        for (id, start) in &plan.jobs {
            if let (Some(at), Some(computed)) = (start.at, plan.computed_at)
                && at < computed
            {
                broken.push(format!(
                    "job {} expected to start at {at}, before the pass that dated it ({computed})",
                    id.short()
                ));
            }
        }
        if let Some(scheduler) = &self.scheduler {
            broken.extend(crate::core::overlapping(
                scheduler.machine.estimates.dated(),
            ));
        }
        self.ledger.broken.extend(broken);
    }
}
