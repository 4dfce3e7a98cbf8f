//! The invariants of the `[idle]` policy, checked as kills are sent and notices published,
//! against what the simulated agents know (which processes really sit idle):
//! - a job is warned only while its GPUs really sit idle;
//! - a job is stopped by the policy only while its GPUs really sit idle, once warned and past
//!   its warning's grace, and never one whose owner said `--idle-ok` in a class allowing it;
//! - it is done only for a job that waits at that moment, or that another writer ended
//!   behind the scheduler's back (which it learns at its next write of that record).

use mgpu_protocol::Timestamp;
use mgpu_protocol::assign::NodeControl;
use mgpu_protocol::idle::{Notice, NoticeKind};
use mgpu_protocol::job::{JobRecord, JobState};
use mgpu_protocol::qos::QosClasses;
use mgpu_protocol::stop::StopCause;

/// The name a job cancelled by the idle policy is recorded as cancelled by.
const IDLE_POLICY: &str = "the idle policy";

/// What sending `control` about `record` breaks, when it is the idle policy's stop;
/// `really_idle` says whether the process it stops sits idle (None: it is gone already).
pub fn kill_sent(
    record: &JobRecord,
    control: &NodeControl,
    classes: &QosClasses,
    really_idle: Option<bool>,
    now: Timestamp,
) -> Option<String> {
    let NodeControl::Kill {
        attempt, warning, ..
    } = control;
    let JobState::Running(run) = &record.state else {
        return None;
    };
    let by_policy = warning.is_some_and(|w| w.cause == StopCause::Idle)
        || run.cancel_requested_by.as_deref() == Some(IDLE_POLICY);
    if !by_policy || *attempt != record.attempt {
        return None;
    }
    let short = record.id.short();
    if really_idle == Some(false) {
        return Some(format!(
            "the idle policy stopped {short}, which was working"
        ));
    }
    let Some(warned) = &run.idle_warning else {
        return Some(format!(
            "the idle policy stopped {short} without warning it"
        ));
    };
    if warned.action_from > now {
        return Some(format!(
            "the idle policy stopped {short} before its grace ended ({} > {now})",
            warned.action_from
        ));
    }
    let class = classes.of_job(record.spec.qos.as_deref());
    (record.spec.idle_ok && class.allow_idle_ok)
        .then(|| format!("the idle policy stopped {short}, whose owner said --idle-ok"))
}

impl super::world::World {
    /// A notice the machine published: counted, and an idle one checked against what its
    /// job really does (a reservation's notice has no job: counted only).
    pub(super) fn check_notice(&mut self, notice: &Notice) {
        match notice.kind {
            NoticeKind::IdleWarning { .. } => self.ledger.idle_warnings += 1,
            NoticeKind::IdleReclaimed { .. } => self.ledger.idle_reclaims += 1,
            // The other job kinds are mgpu-notify's, never the machine's.
            _ => {}
        }
        let Some(job) = notice.job.clone() else {
            self.ledger.reservation_notices += 1;
            return;
        };
        let attempt = self.store.record(&job).map(|r| r.attempt);
        let really_idle = attempt.and_then(|attempt| {
            let key = (job.clone(), attempt);
            self.agents
                .iter()
                .find_map(|agent| agent.processes.get(&key).map(|p| p.idle))
        });
        let records = &self.store;
        let broken = notice_sent(notice, |id| records.record(id), really_idle);
        self.ledger.broken.extend(broken);
    }
}

/// What publishing `notice` breaks: a warning about a job that works, or a reclaim for a
/// job that does not wait. `record_of` finds a job's record; `really_idle` whether a job's
/// current process sits idle (None: not known to any agent).
pub fn notice_sent<'a>(
    notice: &Notice,
    record_of: impl Fn(&mgpu_protocol::ids::JobId) -> Option<&'a JobRecord>,
    really_idle: Option<bool>,
) -> Option<String> {
    let short = notice.about();
    match &notice.kind {
        NoticeKind::IdleWarning { .. } if really_idle == Some(false) => {
            Some(format!("{short} warned for idleness while it worked"))
        }
        NoticeKind::IdleReclaimed { for_job, .. } => {
            let waits = record_of(for_job).is_some_and(|r| match &r.state {
                JobState::Queued(_) => true,
                state => state
                    .ending()
                    .and_then(|end| end.reason.as_deref())
                    .is_some_and(|why| why == super::store::OTHER_WRITERS_CANCEL),
            });
            (!waits).then(|| {
                format!(
                    "{short} reclaimed for {}, which does not wait",
                    for_job.short()
                )
            })
        }
        _ => None,
    }
}
