//! The job table: every live job record with the KV revision it was read or written at, and
//! the indexes a pass, a heartbeat and the status read (queued, running, running by node).
//! Pure: the driver loads the records and carries out the writes the machine asks for; the
//! table changes only when a write is known to have landed (or what is stored was read back),
//! except for a new job, put in it before its first write (`staging`, revision 0 until then).

use std::collections::{HashMap, HashSet};

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState};

/// A record and the KV revision it was read or written at.
#[derive(Clone, Debug, PartialEq)]
pub struct Tracked {
    pub record: JobRecord,
    pub revision: u64,
}

#[derive(Default)]
pub struct JobTable {
    jobs: HashMap<JobId, Tracked>,
    /// Ids of the queued jobs, and of the running ones: a pass, a heartbeat and the status
    /// look at these, never at every record (finished jobs pile up by the hundred thousand).
    queued: HashSet<JobId>,
    running: HashSet<JobId>,
    /// The running jobs by node: a heartbeat is compared with its node's jobs only (a
    /// thousand nodes heartbeating, each checked against 8 000 running jobs, took a core).
    running_on: HashMap<String, HashSet<JobId>>,
    /// Jobs put or dropped since [`JobTable::take_changed`] was last called.
    changed: HashSet<JobId>,
    /// How jobs in history ended, for the live jobs that depend on them (`--after`): only
    /// those, looked up when such a job is submitted or loaded.
    archived: HashMap<JobId, JobState>,
}

impl JobTable {
    /// A table of the records read from the bucket.
    pub fn new(records: Vec<Tracked>) -> Self {
        let mut table = JobTable {
            jobs: HashMap::with_capacity(records.len()),
            ..JobTable::default()
        };
        for tracked in records {
            table.put(tracked);
        }
        table
    }

    pub fn get(&self, id: &JobId) -> Option<&JobRecord> {
        self.jobs.get(id).map(|t| &t.record)
    }

    /// The record of `id` with its revision.
    pub fn tracked(&self, id: &JobId) -> Option<&Tracked> {
        self.jobs.get(id)
    }

    /// The state of job `id`: its live record's, or the one it ended in if it is in history
    /// (and a live job depends on it).
    pub fn state_of(&self, id: &JobId) -> Option<&JobState> {
        self.get(id)
            .map(|record| &record.state)
            .or_else(|| self.archived.get(id))
    }

    /// Whether the table knows how `id` ended or stands (live, or remembered from history).
    pub fn knows(&self, id: &JobId) -> bool {
        self.jobs.contains_key(id) || self.archived.contains_key(id)
    }

    /// Remembers how a job in history ended, for the live jobs that depend on it.
    pub fn remember_archived(&mut self, id: JobId, state: JobState) {
        if !self.jobs.contains_key(&id) {
            self.changed.insert(id.clone());
        }
        self.archived.insert(id, state);
    }

    /// Finished jobs that ended before `cutoff`, at most `limit`: due for history.
    pub fn ended_before(&self, cutoff: Timestamp, limit: usize) -> Vec<JobId> {
        let mut due: Vec<JobId> = self
            .jobs
            .iter()
            .filter(|(_, tracked)| {
                tracked
                    .record
                    .state
                    .ending()
                    .is_some_and(|end| end.ended_at < cutoff)
            })
            .map(|(id, _)| id.clone())
            .collect();
        // Sorted, so which jobs one sweep moves does not depend on the table's hashing.
        due.sort_unstable();
        due.truncate(limit);
        due
    }

    /// The queued jobs' records, in no particular order.
    pub fn queued(&self) -> impl Iterator<Item = &JobRecord> {
        self.queued.iter().filter_map(|id| self.get(id))
    }

    /// The running jobs' records, in no particular order.
    pub fn running(&self) -> impl Iterator<Item = &JobRecord> {
        self.running.iter().filter_map(|id| self.get(id))
    }

    /// Every record, in no particular order.
    pub fn all(&self) -> impl Iterator<Item = &JobRecord> {
        self.jobs.values().map(|t| &t.record)
    }

    /// The ids of the jobs whose record was put or dropped since the last call (all of them
    /// after loading): what a pass must look at again.
    pub fn take_changed(&mut self) -> HashSet<JobId> {
        std::mem::take(&mut self.changed)
    }

    /// How many jobs are queued and running.
    pub fn counts(&self) -> (usize, usize) {
        (self.queued.len(), self.running.len())
    }

    /// How many records the table holds, finished jobs included.
    pub fn total(&self) -> usize {
        self.jobs.len()
    }

    /// The running jobs with a rank on `node`, in no particular order.
    pub fn running_on<'a>(&'a self, node: &str) -> impl Iterator<Item = &'a JobRecord> {
        self.running_on
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|id| self.get(id))
    }

    /// Takes a job out of the per-node index, by the nodes its current record runs on.
    fn unindex_nodes(&mut self, id: &JobId) {
        let Some(JobState::Running(run)) = self.jobs.get(id).map(|t| &t.record.state) else {
            return;
        };
        for node in run.placement.node_names() {
            if let Some(jobs) = self.running_on.get_mut(node) {
                jobs.remove(id);
                if jobs.is_empty() {
                    self.running_on.remove(node);
                }
            }
        }
    }

    /// Puts a record (just written, or read from the store) in the table, keeping the state
    /// indexes right.
    pub fn put(&mut self, tracked: Tracked) {
        let id = tracked.record.id.clone();
        self.unindex_nodes(&id);
        if let JobState::Running(run) = &tracked.record.state {
            for node in run.placement.node_names() {
                self.running_on
                    .entry(node.to_owned())
                    .or_default()
                    .insert(id.clone());
            }
        }
        match tracked.record.state {
            JobState::Queued(_) => {
                self.running.remove(&id);
                self.queued.insert(id.clone());
            }
            JobState::Running(_) => {
                self.queued.remove(&id);
                self.running.insert(id.clone());
            }
            _ => {
                self.queued.remove(&id);
                self.running.remove(&id);
            }
        }
        self.changed.insert(id.clone());
        self.jobs.insert(id, tracked);
    }

    /// Drops a record (moved to history, or found deleted in the store).
    pub fn forget(&mut self, id: &JobId) {
        self.unindex_nodes(id);
        self.changed.insert(id.clone());
        self.queued.remove(id);
        self.running.remove(id);
        self.jobs.remove(id);
    }
}
