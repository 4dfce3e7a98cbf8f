//! `--dedup` and job files: finding a queued or running job of the same user that is the same
//! job ([`JobSpec::dedup_key`]), so submitting twice queues the work once.
//!
//! The check reads the job list once; two submissions racing each other both pass it, which is
//! why the spec also carries `dedup = true` for the scheduler to refuse the second.

use std::collections::HashMap;

use anyhow::Result;
use mgpu_nats::records;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobSpec, JobState};

use crate::client::session::Session;
use crate::errors::plain;

/// A job that makes a submission redundant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Match {
    pub id: JobId,
    pub state: &'static str,
}

/// The submitter's queued and running jobs, by dedup key.
#[derive(Debug, Default)]
pub struct Existing {
    by_key: HashMap<String, Match>,
}

impl Existing {
    pub async fn load(session: &Session) -> Result<Existing> {
        let jobs = records::list_jobs(&session.js).await.map_err(plain)?;
        Ok(Existing::from_jobs(
            &jobs,
            &session.user,
            &session.key.public_key(),
        ))
    }

    /// The queued and running jobs of the user holding `key` (records from before requests
    /// were signed carry no key: those count by `user` name).
    pub fn from_jobs(jobs: &[JobRecord], user: &str, key: &str) -> Existing {
        let by_key = jobs
            .iter()
            .filter(|job| match &job.user_key {
                Some(owner) => owner == key,
                None => job.user == user,
            })
            .filter(|job| matches!(job.state, JobState::Queued(_) | JobState::Running(_)))
            .map(|job| {
                let found = Match {
                    id: job.id.clone(),
                    state: job.state.name(),
                };
                (job.spec.dedup_key(), found)
            })
            .collect();
        Existing { by_key }
    }

    pub fn find(&self, spec: &JobSpec) -> Option<&Match> {
        self.by_key.get(&spec.dedup_key())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgpu_protocol::job::{Ending, WaitReason, Waiting};

    fn record(user: &str, command: &str, state: JobState) -> JobRecord {
        JobRecord {
            id: JobId::random(),
            user: user.into(),
            user_key: None,
            spec: JobSpec::new(vec![command.into()], "/w"),
            submitted_at: mgpu_protocol::now(),
            attempt: 1,
            state,
            last_request: None,
            preemptions: Vec::new(),
        }
    }

    #[test]
    fn only_the_users_waiting_or_running_jobs_count() {
        let queued = || JobState::Queued(Waiting::new(WaitReason::Resources));
        let done = JobState::Succeeded(Ending {
            placement: None,
            started_at: None,
            ended_at: mgpu_protocol::now(),
            exit_code: Some(0),
            signal: None,
            reason: None,
            usage: None,
        });
        let mine = record("alice", "python a.py", queued());
        let jobs = vec![
            mine.clone(),
            record("bob", "python b.py", queued()),
            record("alice", "python c.py", done),
        ];
        let existing = Existing::from_jobs(&jobs, "alice", "UALICE");
        let mut same = JobSpec::new(vec!["python a.py".into()], "/w");
        // The captured environment differs between shells and does not make a job different.
        same.env.insert("TERM".into(), "xterm".into());
        assert_eq!(
            existing.find(&same),
            Some(&Match {
                id: mine.id,
                state: "queued"
            })
        );
        assert_eq!(
            existing.find(&JobSpec::new(vec!["python b.py".into()], "/w")),
            None
        );
        assert_eq!(
            existing.find(&JobSpec::new(vec!["python c.py".into()], "/w")),
            None
        );
        assert_eq!(
            existing.find(&JobSpec::new(vec!["python a.py".into()], "/x")),
            None
        );
    }
}
