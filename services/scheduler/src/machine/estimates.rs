//! The expected starts of waiting jobs between passes: what the last pass worked out
//! (`core::plan_with_estimates`), kept for `mgpu why` and stored for `mgpu queue` and
//! `mgpu show` as one [`PlanSnapshot`] in the cluster bucket: written only when it changed,
//! and at most every [`SAVE_PLAN_EVERY`], so a busy scheduler pays one small write every few
//! seconds, not one per pass.

use std::collections::BTreeMap;

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::plan::{ExpectedStart, PlanSnapshot};

use crate::core::StartEstimate;

/// The least time between two writes of the expected starts.
pub const SAVE_PLAN_EVERY: chrono::Duration = chrono::Duration::seconds(2);

/// The last pass's expected starts, and whether the stored ones are behind.
#[derive(Debug, Default)]
pub struct Estimates {
    latest: PlanSnapshot,
    /// The dated jobs as the pass dated them (with the GPUs they count on, which
    /// `mgpu why` names), in queue order.
    dated: Vec<StartEstimate>,
    dirty: bool,
    saved_at: Option<Timestamp>,
}

impl Estimates {
    /// A pass at `now` dated these jobs (none when the queue was empty).
    pub fn update(&mut self, estimates: Vec<StartEstimate>, now: Timestamp) {
        let mut jobs = BTreeMap::new();
        for estimate in &estimates {
            let mut nodes: Vec<String> = estimate.gpus.iter().map(|(n, _)| n.clone()).collect();
            nodes.dedup();
            jobs.insert(
                estimate.job.clone(),
                ExpectedStart {
                    at: estimate.at,
                    nodes,
                    reserved: estimate.reserved,
                },
            );
        }
        // A start already due reads `now` whenever it was computed: moving it to the new
        // pass's time is no change worth a write.
        let due = |start: &ExpectedStart, at: Option<Timestamp>| {
            start.at.is_some_and(|t| at.is_some_and(|at| t <= at))
        };
        let unchanged = jobs.len() == self.latest.jobs.len()
            && jobs.iter().all(|(id, start)| {
                self.latest.jobs.get(id).is_some_and(|before| {
                    before == start
                        || (before.nodes == start.nodes
                            && due(before, self.latest.computed_at)
                            && due(start, Some(now)))
                })
            });
        self.dated = estimates;
        if unchanged {
            return;
        }
        self.latest = PlanSnapshot {
            computed_at: Some(now),
            jobs,
        };
        self.dirty = true;
    }

    /// The snapshot to store now, if it changed since the last write and that write is
    /// [`SAVE_PLAN_EVERY`] old (or `now_anyway`).
    pub fn to_save(&mut self, now: Timestamp, now_anyway: bool) -> Option<PlanSnapshot> {
        let recent = self
            .saved_at
            .is_some_and(|at| now - at < SAVE_PLAN_EVERY && now >= at);
        if !self.dirty || (recent && !now_anyway) {
            return None;
        }
        self.dirty = false;
        self.saved_at = Some(now);
        Some(self.latest.clone())
    }

    /// A write of the snapshot failed: the next chance writes it again.
    pub fn not_saved(&mut self) {
        self.dirty = true;
    }

    /// When `job` is expected to start, if the last pass dated it.
    pub fn of(&self, job: &JobId) -> Option<&ExpectedStart> {
        self.latest.jobs.get(job)
    }

    /// The GPUs the last pass counted on for `job`.
    pub fn gpus_of(&self, job: &JobId) -> &[(String, u32)] {
        self.dated
            .iter()
            .find(|dated| &dated.job == job)
            .map_or(&[], |dated| dated.gpus.as_slice())
    }

    /// The jobs the last pass dated: the reservations, then the estimates, each in queue
    /// order.
    pub fn dated(&self) -> &[StartEstimate] {
        &self.dated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        chrono::DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap_or_default()
    }

    fn estimate(job: &JobId, start: Option<i64>) -> StartEstimate {
        StartEstimate {
            job: job.clone(),
            at: start.map(at),
            until: None,
            gpus: vec![("n1".into(), 0), ("n1".into(), 1)],
            reserved: true,
        }
    }

    #[test]
    fn only_changes_are_saved_and_at_most_every_few_seconds() {
        let job = JobId::random();
        let mut estimates = Estimates::default();
        estimates.update(vec![estimate(&job, Some(100))], at(0));
        let saved = estimates.to_save(at(0), false).unwrap_or_default();
        assert_eq!(saved.jobs[&job].at, Some(at(100)));
        assert_eq!(saved.jobs[&job].nodes, ["n1"]);
        // The same again: nothing to write.
        estimates.update(vec![estimate(&job, Some(100))], at(1));
        assert!(estimates.to_save(at(1), false).is_none());
        // A change within the interval waits for it, then goes out.
        estimates.update(vec![estimate(&job, Some(200))], at(1));
        assert!(estimates.to_save(at(1), false).is_none());
        assert!(estimates.to_save(at(1), true).is_some());
        estimates.update(vec![], at(5));
        assert_eq!(
            estimates.to_save(at(5), false).map(|s| s.jobs.len()),
            Some(0)
        );
        // A failed write is tried again.
        estimates.not_saved();
        assert!(estimates.to_save(at(10), false).is_some());
    }

    #[test]
    fn a_start_already_due_is_not_rewritten_as_time_passes() {
        let job = JobId::random();
        let mut estimates = Estimates::default();
        estimates.update(vec![estimate(&job, Some(0))], at(0));
        assert!(estimates.to_save(at(0), false).is_some());
        estimates.update(vec![estimate(&job, Some(10))], at(10));
        assert!(estimates.to_save(at(20), false).is_none());
        assert_eq!(estimates.gpus_of(&job).len(), 2);
        assert_eq!(estimates.of(&job).and_then(|s| s.at), Some(at(0)));
    }
}
