//! What the scheduler tells watchers, as commands: job events (`jobs.<id>.events`), audit
//! records (`audit.<action>`), refusals (a log line, an event the requester's CLI shows, an
//! audit record, a count) and log lines.

use mgpu_protocol::Timestamp;
use mgpu_protocol::audit::AuditRecord;
use mgpu_protocol::event::{EventSource, JobEvent, JobEventKind};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::request::Action;

use super::SchedulerState;
use super::messages::{Command, Count, Identity, LogLevel, Refused, Token};
use crate::metrics::RefusalReason;

/// Who sent a request, as the audit trail records them.
pub(crate) enum Sender<'a> {
    /// Their signature checked out.
    Known(&'a Identity),
    /// Refused before they were known (or the scheduler itself): the key presented, if any.
    Unknown { key: Option<String> },
}

impl<'a> Sender<'a> {
    pub(crate) fn of(identity: Option<&'a Identity>) -> Self {
        identity.map_or(Sender::Unknown { key: None }, Sender::Known)
    }
}

impl SchedulerState {
    /// Publishes a state change of `job`, as of its current attempt.
    pub(crate) fn announce(&mut self, now: Timestamp, job: &JobId, kind: JobEventKind) {
        let attempt = self.jobs.get(job).map(|r| r.attempt).unwrap_or(0);
        self.out.push(Command::Event(JobEvent {
            job_id: job.clone(),
            attempt,
            at: now,
            source: EventSource::Scheduler,
            kind,
        }));
    }

    /// Records a request in the audit trail: its `action`, its `sender`, the job or node it
    /// was about, and its `outcome`: what was done, or why it was refused.
    pub(crate) fn audit(
        &mut self,
        now: Timestamp,
        action: Action,
        sender: &Sender<'_>,
        target: Option<String>,
        outcome: Result<String, String>,
    ) {
        let (by, key) = match sender {
            Sender::Known(identity) => (Some(identity.name.clone()), Some(identity.key.clone())),
            Sender::Unknown { key } => (None, key.clone()),
        };
        let accepted = outcome.is_ok();
        self.out.push(Command::Audit(AuditRecord {
            at: now,
            action: action.as_str().to_owned(),
            by,
            key,
            target,
            accepted,
            detail: outcome.unwrap_or_else(|refused| refused),
        }));
    }

    /// Refuses a request about `job` (with its current attempt): a log line, an event the
    /// requester's CLI shows, an audit record, and a count under `why`.
    pub(crate) fn refuse(
        &mut self,
        now: Timestamp,
        action: Action,
        job: Option<&JobId>,
        sender: &Sender<'_>,
        why: RefusalReason,
        reason: String,
    ) {
        self.out
            .push(Command::Count(Count::Refused { action, why }));
        let by = match sender {
            Sender::Known(identity) => format!(", by {}", identity.name),
            Sender::Unknown { .. } => String::new(),
        };
        self.out.push(Command::log(
            LogLevel::Warn,
            job,
            format!("request refused: {reason} ({action}{by})"),
        ));
        if let Some(id) = job {
            let said = format!("permission denied: {reason}");
            let kind = if action == Action::Submit {
                JobEventKind::Rejected { reason: said }
            } else {
                JobEventKind::Refused {
                    action: action.as_str().to_owned(),
                    reason: said,
                }
            };
            self.announce(now, id, kind);
        }
        self.audit(
            now,
            action,
            sender,
            job.map(ToString::to_string),
            Err(reason),
        );
    }

    /// A request the gate refused (or could not read): refused, or only counted when it is
    /// malformed, and acknowledged.
    pub(crate) fn on_refused(&mut self, now: Timestamp, refused: Refused) {
        let Refused {
            token,
            action,
            about,
            key,
            why,
            reason,
        } = refused;
        if why == RefusalReason::Malformed {
            self.out.push(Command::log(
                LogLevel::Warn,
                about.as_ref(),
                format!("refusing a malformed {action} request: {reason}"),
            ));
            self.out
                .push(Command::Count(Count::Refused { action, why }));
        } else {
            let sender = Sender::Unknown { key };
            self.refuse(now, action, about.as_ref(), &sender, why, reason);
        }
        self.ack(Some(token), None);
    }

    /// A report whose signer is not the node it names: audited and dropped.
    pub(crate) fn on_report_refused(
        &mut self,
        now: Timestamp,
        token: Token,
        job: JobId,
        key: Option<String>,
        why: String,
    ) {
        self.out.push(Command::log(
            LogLevel::Warn,
            Some(&job),
            format!("report refused: {why}"),
        ));
        let sender = Sender::Unknown { key };
        self.audit(
            now,
            Action::Report,
            &sender,
            Some(job.to_string()),
            Err(why),
        );
        self.ack(Some(token), None);
    }
}
