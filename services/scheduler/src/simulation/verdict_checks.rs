//! The invariants of the verdicts submitters are told, checked as each is sent:
//! - a job is told one verdict, whatever happens to its submission (a write that fails and
//!   is decided again, a redelivery);
//! - a job refused never runs: no attempt of it started before, or starts after (the
//!   ledger's start check asks [`refused`]);
//! - nothing is said about a job (its verdict, its queued or assigned event) before its
//!   record is stored (a request refused at the gate, a replay or a bad signature, names its
//!   job whether or not it is recorded);
//! - a cancel acknowledged is applied (checked by the ledger's finality at each start);
//! - a message carrying a batch of an array's tasks is acknowledged only once every task in
//!   it is recorded or refused (the scheduler would otherwise lose the others in a crash).

use mgpu_protocol::event::{JobEvent, JobEventKind};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::JobState;
use mgpu_protocol::request::Request;
use mgpu_protocol::submit::SubmitVerdict;

use super::world::World;

impl World {
    /// What telling `verdict` breaks, recorded with the ledger's findings.
    pub(super) fn check_verdict(&mut self, verdict: SubmitVerdict) {
        let short = verdict.job.short().to_owned();
        if let Some(earlier) = self.ledger.verdicts.get(&verdict.job)
            && *earlier != verdict.refused
        {
            self.ledger.broken.push(format!(
                "job {short} told {:?} after {earlier:?}",
                verdict.refused
            ));
        }
        if verdict.refused.is_some() && self.ledger.ran_any(&verdict.job) {
            self.ledger
                .broken
                .push(format!("job {short} refused after it ran"));
        }
        self.ledger.verdicts.insert(verdict.job, verdict.refused);
    }

    /// Nothing is said about a job (an event, its verdict) before its record is stored: a
    /// new job's record is created once its first pass decided for it, and what was
    /// decided meanwhile waits for that write.
    pub(super) fn check_stored_before_told(&mut self, job: &JobId, what: &str) {
        if self.store.record(job).is_none() {
            let short = job.short();
            let broken = format!("{what} about job {short} sent before its record was stored");
            self.ledger.broken.push(broken);
        }
    }

    /// An event the scheduler publishes: a job's queued or assigned event only once its
    /// record is stored (a request refused at the gate, a replay or a bad signature, names
    /// its job whether or not it is recorded).
    pub(super) fn check_event(&mut self, event: &JobEvent) {
        if matches!(
            event.kind,
            JobEventKind::Queued { .. } | JobEventKind::Assigned { .. }
        ) {
            self.check_stored_before_told(&event.job_id, "an event");
        }
    }

    /// The scheduler acknowledged the request at `index` of the requests stream, about
    /// `job`: a cancel by the job's owner or an admin is remembered, with the attempt running
    /// then, for the finality check.
    pub(super) fn check_acknowledged_cancel(&mut self, index: usize, job: &JobId) {
        let Some(stored) = self.requests.get(index) else {
            return;
        };
        if !matches!(stored.request, Request::Cancel { .. }) {
            return;
        }
        let Some(record) = self.store.record(job) else {
            return;
        };
        if !(stored.identity.admin || stored.identity.name == record.user) {
            return;
        }
        let running = matches!(record.state, JobState::Running(_)).then_some(record.attempt);
        self.ledger.cancel_acknowledged(job, running);
    }

    /// The request message at `index` is acknowledged: every submission it carries is
    /// recorded, or its submitter was told it is refused.
    pub(super) fn check_acknowledged_batch(&mut self, index: usize) {
        let Some(stored) = self.requests.get(index) else {
            return;
        };
        if stored.batch.is_empty() {
            return;
        }
        let unsettled: Vec<String> = std::iter::once(&stored.request)
            .chain(&stored.batch)
            .filter_map(|request| match request {
                Request::Submit(submit) => Some(&submit.id),
                _ => None,
            })
            .filter(|id| {
                let refused = self.ledger.verdicts.get(*id).is_some_and(Option::is_some);
                self.store.record(id).is_none() && !refused
            })
            .map(|id| id.short().to_owned())
            .collect();
        if !unsettled.is_empty() {
            self.ledger.broken.push(format!(
                "a batch of {} tasks acknowledged with {unsettled:?} neither recorded nor refused",
                stored.batch.len() + 1
            ));
        }
    }
}
