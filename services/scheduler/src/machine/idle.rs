//! The `[idle]` policy's watch over running jobs, once a tick: a job whose GPUs its agents
//! have measured idle for the policy's `after` gets its owner warned (the lifecycle's
//! `IdleWarn`), and a warned job that worked again has the warning withdrawn. Whether a
//! warned job past its grace is reclaimed is the pass's decision (`core::idle_reclaim`),
//! since only the pass knows who waits for its GPUs.
//!
//! What the agents measured is read from the nodes' latest heartbeats: each launched rank's
//! agent reports how long the job's GPUs there have been idle without a break; the job is as
//! idle as its least idle rank.

use mgpu_protocol::Timestamp;
use mgpu_protocol::idle::{IdlePolicy, IdleWarning};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState, Run};

use super::SchedulerState;
use super::pending::Origin;
use crate::lifecycle::Input;
use crate::nodes::NodeTable;

/// How much later a stretch may seem to start than the warning's, from one heartbeat to the
/// next, and still be the same stretch (clock readings rounded to the second on both sides).
const SAME_STRETCH_SLACK_SECS: i64 = 5;

/// What the agents last said about a running job's GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Idleness {
    /// No heartbeat lists it with a measure (not started yet, an older agent, no GPUs).
    Unknown,
    /// A kernel ran, or its memory grew, in the latest sample of at least one rank.
    Busy,
    /// Every launched rank idle since this time at least.
    IdleSince(Timestamp),
}

/// How idle `record`'s current attempt is, by its launched ranks' latest heartbeats.
pub(crate) fn idleness(nodes: &NodeTable, record: &JobRecord, run: &Run) -> Idleness {
    let mut latest_start: Option<Timestamp> = None;
    for (_, node) in run.placement.launched_ranks() {
        let sample = nodes.get(node).and_then(|beat| {
            let entry = beat
                .running
                .iter()
                .find(|r| r.id == record.id && r.attempt == record.attempt)?;
            Some((beat.sent_at, entry.idle?))
        });
        let Some((sent_at, sample)) = sample else {
            return Idleness::Unknown;
        };
        if sample.idle_for_secs == 0 {
            return Idleness::Busy;
        }
        let secs = i64::try_from(sample.idle_for_secs).unwrap_or(i64::MAX);
        let since = sent_at - chrono::Duration::seconds(secs);
        latest_start = Some(latest_start.map_or(since, |t| t.max(since)));
    }
    latest_start.map_or(Idleness::Unknown, Idleness::IdleSince)
}

/// What the policy says of one running job now: warn (with this warning), withdraw its
/// warning, or nothing.
pub(crate) fn judge(
    policy: &IdlePolicy,
    run: &Run,
    idleness: Idleness,
    exempt: bool,
    now: Timestamp,
) -> Option<Input> {
    if run.preempt_requested || run.cancel_requested_by.is_some() {
        return None;
    }
    match (&run.idle_warning, idleness) {
        (None, Idleness::IdleSince(since)) if !exempt => {
            let since = since.min(now);
            let after = chrono::Duration::seconds(i64::try_from(policy.after_secs).ok()?);
            let grace = chrono::Duration::seconds(i64::try_from(policy.grace_secs).ok()?);
            (now - since >= after).then(|| Input::IdleWarn {
                warning: IdleWarning {
                    idle_since: since,
                    warned_at: now,
                    action: policy.action,
                    action_from: now + grace,
                },
            })
        }
        (Some(_), Idleness::Busy) => Some(Input::IdleCleared),
        (Some(warning), Idleness::IdleSince(since))
            if since > warning.idle_since + chrono::Duration::seconds(SAME_STRETCH_SLACK_SECS) =>
        {
            // A new stretch: the job worked between two heartbeats.
            Some(Input::IdleCleared)
        }
        _ => None,
    }
}

impl SchedulerState {
    /// Warns the owners of jobs idle past the policy's `after`, and withdraws the warnings of
    /// jobs that worked again.
    pub(crate) fn watch_idle(&mut self, now: Timestamp) {
        let Some(policy) = self.policy.idle else {
            return;
        };
        let decided: Vec<(JobId, Input)> = self
            .jobs
            .running()
            .filter_map(|record| {
                let JobState::Running(run) = &record.state else {
                    return None;
                };
                let exempt = record.spec.idle_ok
                    && self
                        .policy
                        .qos
                        .of_job(record.spec.qos.as_deref())
                        .allow_idle_ok;
                let idleness = idleness(&self.nodes, record, run);
                let input = judge(&policy, run, idleness, exempt, now)?;
                Some((record.id.clone(), input))
            })
            .collect();
        for (job, input) in decided {
            self.apply(now, &job, input, Origin::Scheduler, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgpu_protocol::idle::IdleAction;
    use mgpu_protocol::job::Placement;

    fn at(seconds: i64) -> Timestamp {
        chrono::DateTime::from_timestamp(1_800_000_000 + seconds, 0).unwrap_or_default()
    }

    fn policy() -> IdlePolicy {
        IdlePolicy {
            after_secs: 600,
            min_util_pct: 5,
            grace_secs: 300,
            action: IdleAction::Requeue,
        }
    }

    fn run() -> Run {
        Run::assigned(Placement::single("node001", Vec::new()), at(0))
    }

    #[test]
    fn a_job_idle_past_after_is_warned_with_its_grace_unless_exempt() {
        let idle = Idleness::IdleSince(at(0));
        assert_eq!(judge(&policy(), &run(), idle, false, at(599)), None);
        let Some(Input::IdleWarn { warning }) = judge(&policy(), &run(), idle, false, at(600))
        else {
            panic!("not warned");
        };
        assert_eq!((warning.idle_since, warning.action_from), (at(0), at(900)));
        assert_eq!(judge(&policy(), &run(), idle, true, at(5000)), None);
        assert_eq!(
            judge(&policy(), &run(), Idleness::Unknown, false, at(5000)),
            None
        );
        assert_eq!(
            judge(&policy(), &run(), Idleness::Busy, false, at(5000)),
            None
        );
    }

    #[test]
    fn a_warning_is_withdrawn_when_the_job_works_or_starts_a_new_stretch_and_kept_otherwise() {
        let mut warned = run();
        warned.idle_warning = Some(IdleWarning {
            idle_since: at(0),
            warned_at: at(600),
            action: IdleAction::Requeue,
            action_from: at(900),
        });
        let same = Idleness::IdleSince(at(3));
        assert_eq!(judge(&policy(), &warned, same, false, at(700)), None);
        assert_eq!(
            judge(&policy(), &warned, Idleness::Unknown, false, at(700)),
            None,
            "a missing heartbeat says nothing"
        );
        assert_eq!(
            judge(&policy(), &warned, Idleness::Busy, false, at(700)),
            Some(Input::IdleCleared)
        );
        let again = Idleness::IdleSince(at(650));
        assert_eq!(
            judge(&policy(), &warned, again, false, at(700)),
            Some(Input::IdleCleared)
        );
        warned.preempt_requested = true;
        assert_eq!(
            judge(&policy(), &warned, Idleness::Busy, false, at(700)),
            None
        );
    }
}
