//! The simulated job bucket's writes as the driver's store makes them: failed now and then
//! (an injected fault), and every record that lands checked at once by the ledger (an ending
//! stays final, slices, preemption, the start checks of a running record).

use mgpu_protocol::job::JobState;

use super::world::World;
use crate::machine::messages::WriteOutcome;

impl World {
    /// A record write, failed now and then; a start it stores is checked as it lands.
    pub(super) fn write(
        &mut self,
        record: mgpu_protocol::job::JobRecord,
        expected: Option<u64>,
    ) -> WriteOutcome {
        if self.chance_of_fault(self.options.write_failure, |_| {
            format!("write of {} fails", record.id.short())
        }) {
            return WriteOutcome::Failed {
                error: "store unavailable".into(),
            };
        }
        let before = self.store.records.get(&record.id).map(|t| {
            (
                matches!(t.record.state, JobState::Running(_)),
                t.record.attempt,
            )
        });
        let running = matches!(record.state, JobState::Running(_)).then(|| record.clone());
        let id = record.id.clone();
        let outcome = self.store.write(record, expected);
        if let (Some(stored), WriteOutcome::Stored { .. }) = (self.store.records.get(&id), &outcome)
        {
            self.ledger
                .settled(before.map(|(_, attempt)| attempt), &stored.record, self.now);
            let broken =
                (self.ledger.slices).stored(&stored.record, &self.store.records, &self.agents);
            self.ledger.broken.extend(broken);
            let wall = self.wall();
            let broken = super::preemption_checks::stored(&stored.record, &self.policy.qos, wall);
            self.ledger.broken.extend(broken);
            if let JobState::Running(run) = &stored.record.state
                && run.preempted_for.is_some()
            {
                let attempt = (stored.record.id.clone(), stored.record.attempt);
                self.ledger.preempted.insert(attempt);
            }
            if let JobState::Queued(waiting) = &stored.record.state
                && waiting.reason == mgpu_protocol::job::WaitReason::PreferredType
            {
                self.ledger.preferred_type_waits += 1;
            }
        }
        if let (Some(record), WriteOutcome::Stored { .. }) = (running, &outcome) {
            let agents = &self.agents;
            let memory_of = |node: &str| {
                agents
                    .iter()
                    .find(|a| a.name == node)
                    .map_or(0, |a| a.memory_mib)
            };
            self.ledger
                .stored(before, &record, &self.store.records, memory_of);
            let node_of = |node: &str| agents.iter().find(|a| a.name == node);
            let selection = super::ledger::selection_broken(&record, |node| {
                node_of(node).map(|a| (a.gpu_type.as_str(), a.features.as_slice()))
            });
            if let Some(broken) = selection {
                self.ledger.broken.push(broken);
            }
            // At a start, as the total cap is checked (a cap changed later binds later starts).
            if before != Some((true, record.attempt)) {
                let type_of = |node: &str| node_of(node).map(|a| a.gpu_type.as_str());
                self.ledger
                    .check_type_caps(&record, &self.store.records, type_of);
                self.ledger.check_class_caps(&record, &self.store.records);
                self.check_priority(&record);
            }
        }
        outcome
    }
}
