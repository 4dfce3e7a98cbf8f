//! The simulated store: the `mgpu-jobs` bucket as a map with compare-and-set on revisions
//! (one sequence for the whole bucket, as a stream's), the history stream, the cluster
//! bucket (node administration, usage) and the nodes' last heartbeats. It also keeps what
//! the checker needs: every record ever written, so a write that leaves a final state is
//! caught where it happens.

use std::collections::{BTreeMap, BTreeSet};

/// The reason another writer's rewrite gives a queued job it cancels.
pub const OTHER_WRITERS_CANCEL: &str = "cancelled by another scheduler";

use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::JobRecord;
use mgpu_protocol::node::{NodeAdmin, NodeHeartbeat};
use mgpu_protocol::priority::UsageBook;

use crate::machine::jobs::Tracked;
use crate::machine::messages::WriteOutcome;

#[derive(Default)]
pub struct SimStore {
    pub records: BTreeMap<JobId, Tracked>,
    /// The bucket's last sequence: every write takes the next one.
    pub sequence: u64,
    pub history: BTreeMap<JobId, JobRecord>,
    pub admin: BTreeMap<String, NodeAdmin>,
    /// Reservations, by name (the cluster bucket's `reservation.<name>` keys).
    pub reservations: BTreeMap<String, mgpu_protocol::reservation::Reservation>,
    pub usage: UsageBook,
    pub heartbeats: BTreeMap<String, NodeHeartbeat>,
    /// Nonces of admitted requests, with their signing time and stream sequence (the
    /// `mgpu-nonces` bucket).
    pub nonces: Vec<(String, mgpu_protocol::Timestamp, u64)>,
    /// Writes that took a job out of a final state (the checker reports them).
    pub left_final: Vec<String>,
    /// The arrays whose environment is stored once for all their tasks (the `mgpu-job-env`
    /// bucket's `<owner>.<array id>` keys), as the CLI stores them before the tasks.
    pub array_environments: BTreeSet<JobId>,
}

impl SimStore {
    /// A write with compare-and-set on `expected` (None: create), as the driver would carry
    /// it out once it knows the outcome (a lost answer is read back by the driver: what
    /// lands is either stored, or found changed).
    pub fn write(&mut self, record: JobRecord, expected: Option<u64>) -> WriteOutcome {
        let current = self.records.get(&record.id);
        let matches = match (expected, current) {
            (None, None) => !self.history.contains_key(&record.id),
            (Some(revision), Some(tracked)) => tracked.revision == revision,
            _ => false,
        };
        if !matches {
            // A create of a record that exists and is exactly ours landed before (its answer
            // lost): the driver's read-back says stored.
            if let Some(tracked) = current
                && expected.is_none()
                && tracked.record == record
            {
                return WriteOutcome::Stored {
                    revision: tracked.revision,
                };
            }
            return WriteOutcome::Changed {
                stored: current.cloned().map(Box::new),
            };
        }
        if let Some(old) = current
            && old.record.state.is_finished()
            && old.record.state != record.state
        {
            self.left_final.push(format!(
                "job {} left its final state {} for {}",
                record.id,
                old.record.state.name(),
                record.state.name()
            ));
        }
        self.sequence += 1;
        let revision = self.sequence;
        self.records
            .insert(record.id.clone(), Tracked { record, revision });
        WriteOutcome::Stored { revision }
    }

    /// Another writer (a scheduler that still believed it held the lease) rewrote `id`: the
    /// next compare-and-set on the old revision finds it changed. A queued job it ends
    /// cancelled (it handled a cancel); any other record it writes again as it was.
    pub fn rewrite(&mut self, id: &JobId, at: mgpu_protocol::Timestamp) -> bool {
        let Some(mut tracked) = self.records.get(id).cloned() else {
            return false;
        };
        if matches!(
            tracked.record.state,
            mgpu_protocol::job::JobState::Queued(_)
        ) {
            tracked.record.state =
                mgpu_protocol::job::JobState::Cancelled(mgpu_protocol::job::Ending {
                    placement: None,
                    started_at: None,
                    ended_at: at,
                    exit_code: None,
                    signal: None,
                    reason: Some(OTHER_WRITERS_CANCEL.into()),
                    usage: None,
                });
        }
        self.sequence += 1;
        let revision = self.sequence;
        self.records.insert(
            id.clone(),
            Tracked {
                record: tracked.record,
                revision,
            },
        );
        true
    }

    /// A finished job moved to history: published there, its key purged.
    pub fn archive(&mut self, record: JobRecord) {
        self.records.remove(&record.id);
        self.history.insert(record.id.clone(), record);
    }

    /// How `id` stands: its live record, or the one in history.
    pub fn record(&self, id: &JobId) -> Option<&JobRecord> {
        self.records
            .get(id)
            .map(|t| &t.record)
            .or_else(|| self.history.get(id))
    }
}
