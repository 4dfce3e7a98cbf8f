//! What each running job holds here: whose it is, which of this node's GPUs it was given,
//! and its cgroup. Filled when a job starts and emptied when it ends (`job.rs`), read by the
//! metrics endpoint (`metrics.rs`), which reports per GPU the job and user holding it and
//! per job the CPU and host memory its cgroup counts.
//!
//! Kept apart from the running table (`running.rs`), which the heartbeat, the fence and
//! shutdown share and which knows nothing of users or cgroups.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::cgroup::JobCgroup;
use crate::running::AttemptKey;

/// One running attempt's owner, GPUs and cgroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding {
    pub user: String,
    /// Indices of the GPUs it was given on this node.
    pub gpus: Vec<u32>,
    /// None where jobs are not contained.
    pub cgroup: Option<JobCgroup>,
}

/// The holdings of the running attempts, shared between the jobs and the metrics endpoint.
#[derive(Clone, Debug, Default)]
pub struct Holdings {
    inner: Arc<Mutex<HashMap<AttemptKey, Holding>>>,
}

impl Holdings {
    fn lock(&self) -> MutexGuard<'_, HashMap<AttemptKey, Holding>> {
        // Inserts and removals cannot panic half-way: a poisoned map is still whole.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// An attempt of `user` started with these GPUs and this cgroup.
    pub fn started(&self, key: &AttemptKey, user: &str, gpus: &[u32], cgroup: Option<&JobCgroup>) {
        let holding = Holding {
            user: user.to_owned(),
            gpus: gpus.to_vec(),
            cgroup: cgroup.cloned(),
        };
        self.lock().insert(key.clone(), holding);
    }

    /// An attempt ended.
    pub fn remove(&self, key: &AttemptKey) {
        self.lock().remove(key);
    }

    /// Every running attempt's holding, ordered by job and attempt (so the exposition keeps
    /// its order between scrapes).
    pub fn snapshot(&self) -> Vec<(AttemptKey, Holding)> {
        let mut held: Vec<(AttemptKey, Holding)> = self
            .lock()
            .iter()
            .map(|(key, holding)| (key.clone(), holding.clone()))
            .collect();
        held.sort_by(|(a, _), (b, _)| (&a.job_id, a.attempt).cmp(&(&b.job_id, b.attempt)));
        held
    }
}

#[cfg(test)]
mod tests {
    use mgpu_protocol::ids::JobId;

    use super::*;

    #[test]
    fn a_holding_lasts_from_start_to_end() {
        let holdings = Holdings::default();
        let key = AttemptKey {
            job_id: JobId::random(),
            attempt: 1,
        };
        holdings.started(&key, "alice", &[0, 1], None);
        let holding = Holding {
            user: "alice".into(),
            gpus: vec![0, 1],
            cgroup: None,
        };
        assert_eq!(holdings.snapshot(), vec![(key.clone(), holding)]);
        holdings.remove(&key);
        assert!(holdings.snapshot().is_empty());
    }
}
