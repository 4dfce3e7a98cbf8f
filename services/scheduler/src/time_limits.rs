//! Time limits and time slices, in one place: the limit a job runs under (its own, capped by
//! the cluster's `max_job_time`), what its assignment tells the agent (a hard limit, or none
//! for a job that requeues: its slice is the scheduler's), and when a running job's time is
//! up (its expected end, and the end of its slice when it runs in slices). The core, the
//! pass, the queue view and the assignment all ask here.

use std::time::Duration;

use mgpu_protocol::Timestamp;
use mgpu_protocol::job::{JobRecord, JobSpec, OnTimeout, Run};
use mgpu_protocol::priority::Policy;

/// The time limit a job runs under: its own, capped by the cluster's `max_job_time`.
pub fn time_limit(policy: &Policy, spec: &JobSpec) -> Option<Duration> {
    let cluster = policy.max_job_time_secs.map(Duration::from_secs);
    match (spec.time_limit(), cluster) {
        (Some(own), Some(max)) => Some(own.min(max)),
        (own, max) => own.or(max),
    }
}

/// What a job does at its time limit. A `--no-requeue` job must not run twice, so for it the
/// limit is a hard one whatever `--on-timeout` says: it is never stopped to run again later
/// as a time slice (the simulator found such a job run twice, as attempts 1 and 2).
pub fn on_timeout(spec: &JobSpec) -> OnTimeout {
    if spec.no_requeue {
        OnTimeout::Fail
    } else {
        spec.on_timeout
    }
}

/// The hard limit, in whole seconds, the agent enforces for a job: none for a job that
/// requeues at its limit (its time slice is the scheduler's to end).
pub fn agent_limit_secs(policy: &Policy, spec: &JobSpec) -> Option<u64> {
    match on_timeout(spec) {
        OnTimeout::Fail => time_limit(policy, spec).map(|l| l.as_secs().max(1)),
        OnTimeout::Requeue => None,
    }
}

/// When a running job's time is up, and when its time slice ends (only for a job that
/// requeues at its limit and was not already asked to yield).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunEnds {
    pub expected_end: Option<Timestamp>,
    pub slice_end: Option<Timestamp>,
}

/// [`RunEnds`] of `record`'s run: counted from its start, or from its assignment until it
/// started.
pub fn run_ends(policy: &Policy, record: &JobRecord, run: &Run) -> RunEnds {
    let began = run.started_at.unwrap_or(run.assigned_at);
    let end = time_limit(policy, &record.spec)
        .and_then(|limit| chrono::Duration::from_std(limit).ok())
        .and_then(|limit| began.checked_add_signed(limit));
    let sliced = on_timeout(&record.spec) == OnTimeout::Requeue && !run.preempt_requested;
    RunEnds {
        expected_end: end,
        slice_end: if sliced { end } else { None },
    }
}

#[cfg(test)]
mod tests {
    use mgpu_protocol::job::{JobSpec, OnTimeout};

    use super::*;

    fn spec(limit_secs: Option<u64>, on_timeout: OnTimeout) -> JobSpec {
        let mut spec = JobSpec::new(vec!["true".into()], "/tmp");
        spec.time_limit_secs = limit_secs;
        spec.on_timeout = on_timeout;
        spec
    }

    #[test]
    fn the_cluster_limit_caps_a_job_limit_and_stands_in_for_a_missing_one() {
        let policy = Policy {
            max_job_time_secs: Some(60),
            ..Policy::default()
        };
        let own = |secs| time_limit(&policy, &spec(secs, OnTimeout::Fail));
        assert_eq!(own(Some(30)), Some(Duration::from_secs(30)));
        assert_eq!(own(Some(90)), Some(Duration::from_secs(60)));
        assert_eq!(own(None), Some(Duration::from_secs(60)));
        assert_eq!(
            time_limit(&Policy::default(), &spec(None, OnTimeout::Fail)),
            None
        );
    }

    #[test]
    fn a_job_that_requeues_gets_no_hard_limit_from_the_agent() {
        let policy = Policy::default();
        assert_eq!(
            agent_limit_secs(&policy, &spec(Some(10), OnTimeout::Fail)),
            Some(10)
        );
        assert_eq!(
            agent_limit_secs(&policy, &spec(Some(10), OnTimeout::Requeue)),
            None
        );
    }

    /// Simulation seed 3 (`scripts/simulate.sh --seed 3`) found a `--no-requeue` job with a
    /// time limit (and the default `--on-timeout requeue`) preempted at its slice's end and
    /// run again as attempt 2.
    #[test]
    fn a_no_requeue_job_is_never_sliced_its_limit_is_a_hard_one() {
        let policy = Policy::default();
        let mut no_requeue = spec(Some(10), OnTimeout::Requeue);
        no_requeue.no_requeue = true;
        assert_eq!(on_timeout(&no_requeue), OnTimeout::Fail);
        assert_eq!(agent_limit_secs(&policy, &no_requeue), Some(10));
    }
}
