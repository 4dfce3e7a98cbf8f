//! What `mgpu top` knows of the cluster: the unfinished jobs' records, each node's last
//! heartbeat, the admins' marks, and the policy and usage effective priorities come from.
//! Changed one message at a time, by pure functions; nothing here reads the network.
//!
//! Finished jobs are dropped as soon as their record says so: the screen shows none, and the
//! jobs bucket keeps finished records for a while, which would otherwise pile up here.

use std::collections::{BTreeMap, HashMap, HashSet};

use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::JobRecord;
use mgpu_protocol::node::{NodeAdmin, NodeHeartbeat};
use mgpu_protocol::priority::{Policy, UsageBook};

#[derive(Debug, Default)]
pub struct Data {
    /// Queued and running jobs, in no order (the rows give the order).
    pub jobs: Vec<JobRecord>,
    /// Where each job is in `jobs`.
    index: HashMap<JobId, usize>,
    /// Jobs shown from their submission alone: the scheduler has not recorded them yet.
    pending: HashSet<JobId>,
    /// Jobs whose record said they finished: a submission read late must not bring one back.
    finished: HashSet<JobId>,
    /// Each node's last heartbeat, by node name.
    pub nodes: Vec<NodeHeartbeat>,
    /// Drained nodes and paused GPUs, by node name.
    pub marks: BTreeMap<String, NodeAdmin>,
    pub policy: Policy,
    pub usage: UsageBook,
}

impl Data {
    pub fn job(&self, id: &JobId) -> Option<&JobRecord> {
        self.index.get(id).and_then(|&at| self.jobs.get(at))
    }

    /// A job's record as the jobs bucket now has it.
    pub fn put_job(&mut self, record: JobRecord) {
        self.pending.remove(&record.id);
        if record.state.is_finished() {
            self.remove_job(&record.id);
            self.finished.insert(record.id);
            return;
        }
        self.insert(record);
    }

    fn insert(&mut self, record: JobRecord) {
        match self.index.get(&record.id) {
            Some(&at) => {
                if let Some(slot) = self.jobs.get_mut(at) {
                    *slot = record;
                }
            }
            None => {
                self.index.insert(record.id.clone(), self.jobs.len());
                self.jobs.push(record);
            }
        }
    }

    /// The submissions the scheduler has not recorded yet, all of them as read now: each is
    /// shown until its record comes (never over one: the record is newer), and one no longer
    /// waiting without a record (refused) leaves.
    pub fn set_pending(&mut self, submissions: Vec<JobRecord>) {
        let waiting: HashSet<&JobId> = submissions.iter().map(|s| &s.id).collect();
        let gone: Vec<JobId> = self
            .pending
            .iter()
            .filter(|id| !waiting.contains(id))
            .cloned()
            .collect();
        for id in gone {
            self.pending.remove(&id);
            self.remove_job(&id);
        }
        for submission in submissions {
            let known =
                self.index.contains_key(&submission.id) && !self.pending.contains(&submission.id);
            if !known && !self.finished.contains(&submission.id) {
                self.pending.insert(submission.id.clone());
                self.insert(submission);
            }
        }
    }

    pub fn remove_job(&mut self, id: &JobId) {
        let Some(at) = self.index.remove(id) else {
            return;
        };
        self.jobs.swap_remove(at);
        // The last job moved into the hole.
        if let Some(moved) = self.jobs.get(at) {
            self.index.insert(moved.id.clone(), at);
        }
    }

    /// A node's heartbeat; an older one than already known (the stored last heartbeat read
    /// after a live one arrived) changes nothing. Returns whether it changed anything.
    pub fn put_heartbeat(&mut self, beat: NodeHeartbeat) -> bool {
        match self
            .nodes
            .binary_search_by(|known| known.node.as_str().cmp(&beat.node))
        {
            Ok(at) => match self.nodes.get_mut(at) {
                Some(known) if known.sent_at <= beat.sent_at => {
                    *known = beat;
                    true
                }
                _ => false,
            },
            Err(at) => {
                self.nodes.insert(at, beat);
                true
            }
        }
    }

    /// A node's admin marks; None: the node has none (the key was deleted).
    pub fn put_marks(&mut self, node: String, marks: Option<NodeAdmin>) {
        match marks {
            Some(marks) => {
                self.marks.insert(node, marks);
            }
            None => {
                self.marks.remove(&node);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::top::screen::test_data::{finished, heartbeat, job, queued};

    #[test]
    fn finished_jobs_leave_and_the_rest_stay_findable() {
        let mut data = Data::default();
        let a = job("alice", "a", queued());
        let b = job("alice", "b", queued());
        let c = job("bob", "c", queued());
        for record in [&a, &b, &c] {
            data.put_job(record.clone());
        }
        let mut done = a.clone();
        done.state = finished();
        data.put_job(done);
        assert_eq!(data.jobs.len(), 2);
        assert!(data.job(&a.id).is_none());
        assert_eq!(data.job(&c.id).map(|r| r.user.as_str()), Some("bob"));
        assert_eq!(data.job(&b.id).map(|r| r.user.as_str()), Some("alice"));
        // A submission never replaces the record, nor brings a finished job back.
        let mut stale = c.clone();
        stale.user = "stale".into();
        data.set_pending(vec![stale, a.clone()]);
        assert_eq!(data.job(&c.id).map(|r| r.user.as_str()), Some("bob"));
        assert!(data.job(&a.id).is_none());
    }

    #[test]
    fn submissions_show_until_recorded_or_gone() {
        let mut data = Data::default();
        let recorded = job("alice", "recorded", queued());
        let refused = job("alice", "refused", queued());
        data.set_pending(vec![recorded.clone(), refused.clone()]);
        assert_eq!(data.jobs.len(), 2);
        let mut record = recorded.clone();
        record.user = "from the bucket".into();
        data.put_job(record);
        // Read again: neither waits any more; the recorded job stays, the refused one goes.
        data.set_pending(Vec::new());
        assert_eq!(data.jobs.len(), 1);
        assert_eq!(
            data.job(&recorded.id).map(|r| r.user.as_str()),
            Some("from the bucket")
        );
    }

    #[test]
    fn heartbeats_keep_the_newest_per_node_in_name_order() {
        let mut data = Data::default();
        let late = heartbeat("n2", 2);
        let mut early = late.clone();
        early.sent_at = late.sent_at - chrono::Duration::seconds(5);
        assert!(data.put_heartbeat(late.clone()));
        assert!(data.put_heartbeat(heartbeat("n1", 1)));
        assert!(!data.put_heartbeat(early));
        let names: Vec<&str> = data.nodes.iter().map(|n| n.node.as_str()).collect();
        assert_eq!(names, ["n1", "n2"]);
        assert_eq!(data.nodes[1].sent_at, late.sent_at);
    }
}
