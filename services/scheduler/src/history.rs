//! Retention: a finished job leaves the live bucket for the history stream (`MGPU_HISTORY`,
//! `history.<user>.<id>`) `keep_finished` after it ended, so the live state, and with it the
//! scheduler's start, memory and passes, depend on live jobs only. A job a queued job depends
//! on (`--after`, `--after-any`) stays until that job is no longer queued; a job submitted (or
//! found at start) depending on one already in history learns from there how it ended.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use mgpu_nats::records;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::JobSpec;
use mgpu_protocol::now;

use crate::service::Scheduler;

/// How often the live bucket is looked at for jobs due for history.
const SWEEP_EVERY: Duration = Duration::from_secs(2);
/// Jobs moved in one sweep at most: each move is a few round trips to the server, made while
/// the loop waits, so a backlog (a first start with months of finished jobs) is moved a batch
/// at a time between the loop's other work.
const SWEEP_BATCH: usize = 200;

/// When the live bucket was last swept.
#[derive(Debug)]
pub struct HistoryKeeper {
    next_sweep: Instant,
}

impl Default for HistoryKeeper {
    fn default() -> Self {
        HistoryKeeper {
            next_sweep: Instant::now(),
        }
    }
}

/// The jobs `spec` waits for.
fn dependencies(spec: &JobSpec) -> impl Iterator<Item = &JobId> {
    spec.after.iter().chain(&spec.after_any)
}

impl Scheduler {
    /// Moves the finished jobs that are due to history, unless one was moved a moment ago.
    pub(crate) async fn keep_history(&mut self) {
        if Instant::now() < self.history.next_sweep {
            return;
        }
        self.history.next_sweep = Instant::now() + SWEEP_EVERY;
        let keep = i64::try_from(self.policy.keep_finished_secs).unwrap_or(i64::MAX);
        let Some(cutoff) =
            chrono::TimeDelta::try_seconds(keep).and_then(|k| now().checked_sub_signed(k))
        else {
            return;
        };
        let due = self.store.ended_before(cutoff, SWEEP_BATCH);
        if due.is_empty() {
            return;
        }
        let depended: HashSet<JobId> = self
            .store
            .queued()
            .flat_map(|record| dependencies(&record.spec))
            .cloned()
            .collect();
        let mut moved = 0usize;
        for id in due {
            if depended.contains(&id) {
                continue;
            }
            match self.store.archive(&id).await {
                Ok(true) => moved += 1,
                Ok(false) => {}
                Err(err) => {
                    tracing::warn!(job = %id, "moving a finished job to history: {err:#}");
                    break;
                }
            }
        }
        if moved > 0 {
            tracing::info!(moved, "moved finished jobs to history");
        }
    }

    /// Looks up in history how the jobs that `specs` depend on ended, for those the table
    /// does not know: `--after` a job that left the live bucket resolves as it would have.
    pub(crate) async fn learn_archived<'a>(&mut self, specs: impl Iterator<Item = &'a JobSpec>) {
        let unknown: HashSet<JobId> = specs
            .flat_map(dependencies)
            .filter(|id| !self.store.knows(id))
            .cloned()
            .collect();
        for id in unknown {
            match records::archived_job(&self.js, &id, None).await {
                Ok(Some(record)) => self.store.remember_archived(record),
                // Not recorded yet (submitted in the same batch) or unknown: it waits.
                Ok(None) => {}
                Err(err) => tracing::warn!(job = %id, "looking a dependency up in history: {err}"),
            }
        }
    }
}
