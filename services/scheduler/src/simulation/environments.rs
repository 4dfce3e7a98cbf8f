//! The environment an array stores once for all its tasks: dropped with the array's last
//! task to leave the live bucket, never before. Checked as the scheduler's commands land: a
//! drop while another task of the array is still live and unfinished in the store, and an
//! assignment of a task whose array's environment is gone (on a real cluster it would run
//! without it, a job's whole environment lost).

use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::JobRecord;

use super::world::World;

impl World {
    /// The CLI's part of an array's submission: its environment stored once, before its
    /// tasks are sent.
    pub(super) fn store_array_environment(&mut self, array: &JobId) {
        self.store.array_environments.insert(array.clone());
    }

    /// `record`, a finished task, moved to history as the last of its array: the array's
    /// environment goes, and no other task of it may still need it.
    pub(super) fn drop_array_environment(&mut self, record: &JobRecord) {
        let Some(member) = &record.spec.array else {
            self.ledger.broken.push(format!(
                "{}: moved to history as the last task of an array it is not part of",
                record.id.short()
            ));
            return;
        };
        let array = &member.array_id;
        let still_needed = self.store.records.values().find(|tracked| {
            let other = &tracked.record;
            other.id != record.id
                && !other.state.is_finished()
                && other
                    .spec
                    .array
                    .as_ref()
                    .is_some_and(|m| &m.array_id == array)
        });
        if let Some(other) = still_needed {
            self.ledger.broken.push(format!(
                "array {}: its environment was dropped with task {} while task {} is still {}",
                array.short(),
                record.id.short(),
                other.record.id.short(),
                other.record.state.name()
            ));
        }
        self.store.array_environments.remove(array);
    }

    /// Before `job`'s assignment goes out: a task of an array that stored its environment
    /// once finds it still stored.
    pub(super) fn check_array_environment(&mut self, job: &JobId) {
        let Some(record) = self.store.records.get(job).map(|t| &t.record) else {
            return;
        };
        let Some(member) = record
            .spec
            .array
            .as_ref()
            .filter(|_| record.spec.private_env)
        else {
            return;
        };
        if !self.store.array_environments.contains(&member.array_id) {
            self.ledger.broken.push(format!(
                "{}: assigned after its array {}'s environment was dropped (it would run without)",
                job.short(),
                member.array_id.short()
            ));
        }
    }
}
