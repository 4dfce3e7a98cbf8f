//! Retention: a finished job leaves the live bucket for the history stream `keep_finished`
//! after it ended, so the live state, and with it the scheduler's start, memory and passes,
//! depend on live jobs only. A job a queued job depends on (`--after`, `--after-any`) stays
//! until that job is no longer queued. Moves go out a batch at a time, every two seconds at
//! most, so a backlog (a first start with months of finished jobs) is moved between the
//! loop's other work.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::JobRecord;

use super::SchedulerState;
use super::messages::{Command, LogLevel};

/// How often the live bucket is looked at for jobs due for history.
const SWEEP_EVERY: Duration = Duration::from_secs(2);
/// How long after an array's latest task was submitted its last tasks may move to history,
/// taking the environment the array stored once: a task of it still to come (delivered again,
/// or sent late) comes within this.
pub const ARRAY_ENVIRONMENT_GRACE: Duration = Duration::from_secs(120);
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
        let (last_of_arrays, held_back) = self.last_of_arrays(&moving, now);
        for id in moving {
            if held_back.contains(&id) {
                continue;
            }
            if let Some(record) = self.jobs.get(&id) {
                self.out.push(Command::Archive {
                    record: Box::new(record.clone()),
                    last_of_array: last_of_arrays.contains(&id),
                });
                self.archiving.insert(id);
            }
        }
    }

    /// Of the jobs `moving` to history, those that leave no other task of their array in the
    /// table (queued, staged, running, finished and not moving now or already): the array's
    /// environment, stored once for all its tasks, goes with the last one of them; and those
    /// held back a while longer, with every other task of their array that is moving now.
    ///
    /// A task can still come after its array's last one known here ended: its submission
    /// delivered again after its record could not be written, or after a standby took over,
    /// or sent late by a CLI retrying through an election. Those come within minutes of their
    /// array's other tasks, so an array's last tasks move (and its environment with them) no
    /// sooner than [`ARRAY_ENVIRONMENT_GRACE`] after its latest task was submitted. A move that
    /// fails is tried again later and asks again.
    fn last_of_arrays(&self, moving: &[JobId], now: Timestamp) -> (HashSet<JobId>, HashSet<JobId>) {
        // Each array's tasks among those moving, in order.
        let mut arrays_moving: HashMap<&JobId, Vec<&JobId>> = HashMap::new();
        for id in moving {
            if let Some(array) = self.jobs.get(id).and_then(shared_environment_array) {
                arrays_moving.entry(array).or_default().push(id);
            }
        }
        let (mut last, mut held_back) = (HashSet::new(), HashSet::new());
        if arrays_moving.is_empty() {
            return (last, held_back);
        }
        let moving: HashSet<&JobId> = moving.iter().collect();
        let mut staying: HashSet<&JobId> = HashSet::new();
        let mut latest_submitted: HashMap<&JobId, Timestamp> = HashMap::new();
        for record in self.jobs.all() {
            let Some(member) = &record.spec.array else {
                continue;
            };
            if !moving.contains(&record.id) && !self.archiving.contains(&record.id) {
                staying.insert(&member.array_id);
            }
            let latest = latest_submitted
                .entry(&member.array_id)
                .or_insert(record.submitted_at);
            *latest = (*latest).max(record.submitted_at);
        }
        let grace = chrono::TimeDelta::from_std(ARRAY_ENVIRONMENT_GRACE).unwrap_or_default();
        for (array, tasks) in arrays_moving {
            if staying.contains(array) {
                continue;
            }
            let settled = latest_submitted
                .get(array)
                .and_then(|latest| latest.checked_add_signed(grace))
                .is_none_or(|settled| settled <= now);
            if !settled {
                held_back.extend(tasks.into_iter().cloned());
            } else if let Some(&final_task) = tasks.last() {
                last.insert(final_task.clone());
            }
        }
        (last, held_back)
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

/// The array of a task whose environment is kept apart: the array may have stored it once
/// for all its tasks (under the array's id), which goes when its last task does.
fn shared_environment_array(record: &JobRecord) -> Option<&JobId> {
    record
        .spec
        .array
        .as_ref()
        .filter(|_| record.spec.private_env)
        .map(|member| &member.array_id)
}
