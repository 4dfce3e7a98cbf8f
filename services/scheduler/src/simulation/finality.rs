//! The invariant that an ending is final, checked as records are stored and processes
//! started: a job stored finished (succeeded, failed, cancelled, timed out, node failed)
//! never starts another process, unless a kill for that attempt already follows it on the
//! node's stream (a rank of a multi-node job whose start was never confirmed: the job ends
//! once its started ranks stopped, and the late rank is stopped as soon as it starts); that
//! its record never leaves the final state is the store's check, `SimStore::left_final`. A
//! job whose cancel was stored while attempt N ran
//! is never queued again nor gets attempt N + 1, whatever happens to its node meanwhile (a
//! lost node requeues a job, a cancel must win over that); a single-node job whose attempt
//! ended by itself (not killed: a cancel, a time limit, a slice's end, a fence) and whose
//! exit report was stored is not given another attempt, even when its node is found offline
//! before the scheduler read the report; and a single-node job's attempt that its agent
//! reported lost (stopped by a fence, or gone with a restart) is never recorded `failed`: the
//! node was lost, not the job (requeued, or `node_failed` where it may not run again). A
//! cancel the scheduler acknowledged (its owner's or an admin's) is applied: the job starts
//! no attempt after that acknowledgement (a new job's cancel that came before its record's
//! first write is applied to it before that write, `machine/staging.rs`).

use std::collections::{BTreeMap, BTreeSet};

use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState};
use mgpu_protocol::report::Exit;

/// The endings and cancels seen so far.
#[derive(Default)]
pub struct Finality {
    /// Jobs stored finished: the state they ended in.
    ended: BTreeMap<JobId, &'static str>,
    /// Jobs whose cancel was stored while they ran: the attempt then running.
    cancelled_during: BTreeMap<JobId, u32>,
    /// Attempts of single-node jobs that ended by themselves: when their exit report is in
    /// the reports stream (simulated milliseconds).
    exits_stored: BTreeMap<(JobId, u32), u64>,
    /// Attempts whose exit report said lost.
    reported_lost: BTreeSet<(JobId, u32)>,
    /// Jobs whose cancel was acknowledged: the attempt running then, if one was.
    cancel_acknowledged: BTreeMap<JobId, Option<u32>>,
}

impl Finality {
    /// An agent's exit report for `attempt` of `job` is in the reports stream from `at` on.
    pub fn exit_reported(&mut self, job: &JobId, attempt: u32, exit: &Exit, at: u64) {
        if exit.lost {
            self.reported_lost.insert((job.clone(), attempt));
        }
        let killed = exit.cancelled || exit.timed_out || exit.preempted || exit.lost;
        if !killed {
            self.exits_stored
                .entry((job.clone(), attempt))
                .or_insert(at);
        }
    }

    /// The scheduler acknowledged a cancel of `job` by its owner or an admin, `running`
    /// being the attempt its stored record ran then (None: not running, or not stored).
    pub fn cancel_acknowledged(&mut self, job: &JobId, running: Option<u32>) {
        self.cancel_acknowledged
            .entry(job.clone())
            .or_insert(running);
    }

    /// `record` was stored at `now` over a record of attempt `before` (None: created); what
    /// it breaks, if anything.
    pub fn stored(&mut self, before: Option<u32>, record: &JobRecord, now: u64) -> Option<String> {
        let id = &record.id;
        if let JobState::Running(_) = &record.state
            && let Some(running) = self.cancel_acknowledged.get(id)
            && running.is_none_or(|attempt| record.attempt > attempt)
        {
            return Some(format!(
                "a job started after its cancel was acknowledged: {} attempt {}",
                id.short(),
                record.attempt
            ));
        }
        if let Some(previous) = before.filter(|b| record.attempt > *b && record.spec.nodes <= 1)
            && let Some(at) = self.exits_stored.get(&(id.clone(), previous))
            && *at <= now
        {
            return Some(format!(
                "an ended attempt followed by another: {} attempt {previous}'s exit report was \
                 stored at {at} ms, then attempt {} was stored {}",
                id.short(),
                record.attempt,
                record.state.name()
            ));
        }
        if matches!(record.state, JobState::Failed(_))
            && record.spec.nodes <= 1
            && self.reported_lost.contains(&(id.clone(), record.attempt))
        {
            return Some(format!(
                "a lost attempt recorded failed: {} attempt {}'s agent reported it lost",
                id.short(),
                record.attempt
            ));
        }
        if record.state.is_finished() {
            self.ended.insert(id.clone(), record.state.name());
            return None;
        }
        if let JobState::Running(run) = &record.state
            && run.cancel_requested_by.is_some()
        {
            self.cancelled_during
                .entry(id.clone())
                .or_insert(record.attempt);
        }
        let during = *self.cancelled_during.get(id)?;
        let again = match &record.state {
            JobState::Queued(_) => true,
            _ => record.attempt > during,
        };
        again.then(|| {
            format!(
                "a cancelled job requeued: {} was cancelled during attempt {during}, then \
                 stored {} (attempt {})",
                id.short(),
                record.state.name(),
                record.attempt
            )
        })
    }

    /// An agent started `attempt` of `job`, with a kill of it on its way to that node or
    /// not; what it breaks, if anything.
    pub fn started(&self, job: &JobId, attempt: u32, kill_follows: bool) -> Option<String> {
        if let Some(ended) = self.ended.get(job)
            && !kill_follows
        {
            return Some(format!(
                "an ended job started again: {} ended {ended}, then attempt {attempt} started \
                 with no kill behind it",
                job.short()
            ));
        }
        let during = *self.cancelled_during.get(job)?;
        (attempt > during).then(|| {
            format!(
                "a cancelled job started again: {} was cancelled during attempt {during}, \
                 then attempt {attempt} started",
                job.short()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use mgpu_protocol::job::{Ending, GpuShare, JobSpec, Placement, Run, Waiting};

    use super::*;

    fn at() -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::from_timestamp(0, 0).unwrap_or_default()
    }

    fn job(attempt: u32, state: JobState) -> JobRecord {
        JobRecord {
            id: format!("{:032x}", 7)
                .parse()
                .unwrap_or_else(|e| panic!("job id: {e:?}")),
            user: "alice".into(),
            user_key: None,
            spec: JobSpec::new(vec!["x".into()], "/tmp"),
            submitted_at: at(),
            attempt,
            state,
            last_request: None,
            preemptions: Vec::new(),
        }
    }

    fn running(cancelled: bool) -> JobState {
        let gpu = GpuShare {
            index: 0,
            amount: mgpu_protocol::gpu_amount::GpuAmount::ONE,
            mem_mib: 0,
        };
        let mut run = Run::assigned(Placement::single("n", vec![gpu]), at());
        run.cancel_requested_by = cancelled.then(|| "alice".into());
        JobState::Running(run)
    }

    fn queued() -> JobState {
        JobState::Queued(Waiting::new(mgpu_protocol::job::WaitReason::Resources))
    }

    #[test]
    fn a_requeue_after_a_cancel_or_an_ending_is_caught_and_a_plain_requeue_is_not() {
        let mut finality = Finality::default();
        assert_eq!(finality.stored(None, &job(1, running(false)), 0), None);
        assert_eq!(
            finality.stored(None, &job(2, queued()), 0),
            None,
            "a lost node"
        );
        assert_eq!(finality.started(&JobId::random(), 2, false), None);
        assert_eq!(
            finality.stored(None, &job(2, running(true)), 0),
            None,
            "cancel"
        );
        assert_eq!(
            finality.stored(None, &job(2, running(true)), 0),
            None,
            "same attempt"
        );
        assert_eq!(finality.started(&job(2, queued()).id, 2, false), None);
        assert!(
            finality.stored(None, &job(3, queued()), 0).is_some(),
            "requeued"
        );
        assert!(finality.started(&job(3, queued()).id, 3, false).is_some());
        let ending = Ending {
            placement: None,
            started_at: None,
            ended_at: at(),
            exit_code: None,
            signal: None,
            reason: None,
            usage: None,
        };
        assert_eq!(
            finality.stored(None, &job(2, JobState::Cancelled(ending)), 0),
            None
        );
        assert!(finality.started(&job(2, queued()).id, 2, false).is_some());
        assert_eq!(
            finality.started(&job(2, queued()).id, 2, true),
            None,
            "stopped as it starts"
        );
    }

    #[test]
    fn an_attempt_after_a_stored_exit_is_caught_and_one_after_a_kill_is_not() {
        let mut finality = Finality::default();
        let id = job(1, queued()).id;
        let fenced = Exit {
            lost: true,
            ..Exit::default()
        };
        finality.exit_reported(&id, 1, &fenced, 10);
        assert_eq!(finality.stored(Some(1), &job(2, queued()), 20), None);
        finality.exit_reported(&id, 2, &Exit::default(), 30);
        assert_eq!(
            finality.stored(Some(2), &job(3, queued()), 29),
            None,
            "the report was not in the stream yet"
        );
        assert_eq!(finality.stored(Some(3), &job(3, running(false)), 40), None);
        assert!(finality.stored(Some(2), &job(3, queued()), 30).is_some());
    }

    #[test]
    fn a_lost_attempt_recorded_failed_is_caught_and_one_recorded_node_failed_is_not() {
        let ending = || Ending {
            placement: None,
            started_at: None,
            ended_at: at(),
            exit_code: Some(143),
            signal: None,
            reason: None,
            usage: None,
        };
        let lost = Exit {
            lost: true,
            exit_code: 143,
            ..Exit::default()
        };
        let mut finality = Finality::default();
        let id = job(1, queued()).id;
        finality.exit_reported(&id, 1, &lost, 10);
        assert_eq!(
            finality.stored(Some(1), &job(1, JobState::NodeFailed(ending())), 20),
            None
        );
        let mut finality = Finality::default();
        finality.exit_reported(&id, 1, &lost, 10);
        assert!(
            finality
                .stored(Some(1), &job(1, JobState::Failed(ending())), 20)
                .is_some()
        );
        let mut finality = Finality::default();
        finality.exit_reported(&id, 1, &lost, 10);
        assert_eq!(
            finality.stored(Some(2), &job(2, JobState::Failed(ending())), 20),
            None,
            "a later attempt may fail"
        );
    }
}
