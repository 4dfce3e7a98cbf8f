//! Retention: a finished job leaves the live bucket for the history stream `keep_finished`
//! after it ended, so the live state, and with it the scheduler's start, memory and passes,
//! depend on live jobs only. A job a queued job depends on (`--after`, `--after-any`) stays
//! until that job is no longer queued. Moves go out a batch at a time, every two seconds at
//! most, so a backlog (a first start with months of finished jobs) is moved between the
//! loop's other work.

use std::collections::HashSet;
use std::time::Duration;

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;

use super::SchedulerState;
use super::messages::{Command, LogLevel};

/// How often the live bucket is looked at for jobs due for history.
const SWEEP_EVERY: Duration = Duration::from_secs(2);
/// Jobs moved in one sweep at most: each move is a few round trips to the server, made while
/// the loop waits.
const SWEEP_BATCH: usize = 200;

impl SchedulerState {
    /// Asks for the finished jobs that are due to move to history, unless a sweep ran a
    /// moment ago (`monotonic` is the tick's clock reading).
    pub(crate) fn sweep_history(&mut self, now: Timestamp, monotonic: Duration) {
        if monotonic < self.next_sweep {
            return;
        }
        self.next_sweep = monotonic + SWEEP_EVERY;
        let keep = i64::try_from(self.policy.keep_finished_secs).unwrap_or(i64::MAX);
        let Some(cutoff) =
            chrono::TimeDelta::try_seconds(keep).and_then(|k| now.checked_sub_signed(k))
        else {
            return;
        };
        let due = self.jobs.ended_before(cutoff, SWEEP_BATCH);
        if due.is_empty() {
            return;
        }
        let depended: HashSet<&JobId> = self
            .jobs
            .queued()
            .flat_map(|record| record.spec.after.iter().chain(&record.spec.after_any))
            .collect();
        let moving: Vec<JobId> = due
            .into_iter()
            .filter(|id| {
                !depended.contains(id) && !self.archiving.contains(id) && !self.staged.contains(id)
            })
            .collect();
        for id in moving {
            if let Some(record) = self.jobs.get(&id) {
                self.out.push(Command::Archive {
                    record: Box::new(record.clone()),
                });
                self.archiving.insert(id);
            }
        }
    }

    /// A finished job's move to history came out: the table forgets it once it moved.
    pub(crate) fn on_archived(&mut self, id: &JobId, moved: bool) {
        self.archiving.remove(id);
        if moved {
            self.jobs.forget(id);
            self.unsettled_exits.remove(id);
        } else {
            let said = "moving a finished job to history failed; tried again later";
            self.out.push(Command::log(LogLevel::Warn, Some(id), said));
        }
    }
}
