//! An agent's report on `jobs.<id>.events`: what happened to the process of one attempt of a
//! job on one node (started, could not start, exited). On the wire it is a [`JobEvent`]
//! whose source is the node; [`AgentReport`] is the typed view the scheduler acts on.

use crate::Timestamp;
use crate::error::InvalidInput;
use crate::event::{EventSource, JobEvent, JobEventKind};
use crate::ids::JobId;
use crate::subjects;
use crate::wire::{self, MAX_EVENT_BYTES};

/// What one node says about one attempt of a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentReport {
    pub job: JobId,
    pub attempt: u32,
    pub node: String,
    /// When it happened, by the node's clock (a job's start or end time).
    pub at: Timestamp,
    pub kind: ReportKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReportKind {
    Started { pid: u32 },
    FailedToStart { error: String },
    Exited(Exit),
}

/// How a process ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Exit {
    pub exit_code: i32,
    pub signal: Option<i32>,
    /// Killed on request (a cancel).
    pub cancelled: bool,
    /// Killed at its time limit.
    pub timed_out: bool,
    /// Stopped at the end of its time slice: it goes back to the queue.
    pub preempted: bool,
    /// Found still running by a restarted agent, which stopped it: treated like a lost node.
    pub lost: bool,
    /// The kernel killed a process of it for going over its host memory limit (`--mem-host`).
    pub out_of_memory: bool,
    /// What it used, as its node measured it.
    pub usage: Option<crate::host::JobUsage>,
}

impl Exit {
    /// Ended by itself with exit code 0.
    pub fn is_clean(&self) -> bool {
        self.exit_code == 0
            && !self.cancelled
            && !self.timed_out
            && !self.preempted
            && !self.out_of_memory
    }
}

impl AgentReport {
    /// Decodes an event received on `subject` at `now`: `Ok(None)` for the scheduler's own
    /// events (they come back on the same subjects) and for node events that report nothing
    /// about a process; an error for anything malformed, or naming another job than its subject.
    pub fn decode(
        subject: &str,
        payload: &[u8],
        now: Timestamp,
    ) -> Result<Option<AgentReport>, InvalidInput> {
        let event: JobEvent = wire::decode("job event", payload, MAX_EVENT_BYTES)?;
        if event.source == EventSource::Scheduler {
            return Ok(None);
        }
        event.validate(now)?;
        if subjects::job_id_of(subject) != Some(event.job_id.as_str()) {
            return Err(InvalidInput::new(format!(
                "event for job {} published on {subject}",
                event.job_id
            )));
        }
        Ok(AgentReport::from_event(event))
    }

    /// The report a node's event makes; None for the scheduler's events and for kinds no
    /// agent reports.
    pub fn from_event(event: JobEvent) -> Option<AgentReport> {
        let EventSource::Node(node) = event.source else {
            return None;
        };
        let kind = match event.kind {
            JobEventKind::Started { pid } => ReportKind::Started { pid },
            JobEventKind::FailedToStart { error } => ReportKind::FailedToStart { error },
            JobEventKind::Exited {
                exit_code,
                signal,
                cancelled,
                timed_out,
                preempted,
                lost,
                out_of_memory,
                usage,
            } => ReportKind::Exited(Exit {
                exit_code,
                signal,
                cancelled,
                timed_out,
                preempted,
                lost,
                out_of_memory,
                usage,
            }),
            _ => return None,
        };
        Some(AgentReport {
            job: event.job_id,
            attempt: event.attempt,
            node,
            at: event.at,
            kind,
        })
    }

    /// The event that carries this report.
    pub fn into_event(self) -> JobEvent {
        let kind = match self.kind {
            ReportKind::Started { pid } => JobEventKind::Started { pid },
            ReportKind::FailedToStart { error } => JobEventKind::FailedToStart { error },
            ReportKind::Exited(exit) => JobEventKind::Exited {
                exit_code: exit.exit_code,
                signal: exit.signal,
                cancelled: exit.cancelled,
                timed_out: exit.timed_out,
                preempted: exit.preempted,
                lost: exit.lost,
                out_of_memory: exit.out_of_memory,
                usage: exit.usage,
            },
        };
        JobEvent {
            job_id: self.job,
            attempt: self.attempt,
            at: self.at,
            source: EventSource::Node(self.node),
            kind,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(kind: ReportKind) -> AgentReport {
        AgentReport {
            job: JobId::random(),
            attempt: 2,
            node: "node001".into(),
            at: crate::now(),
            kind,
        }
    }

    #[test]
    fn a_report_survives_the_wire_and_names_its_job() {
        let sent = report(ReportKind::Exited(Exit {
            exit_code: 3,
            signal: Some(9),
            preempted: true,
            ..Exit::default()
        }));
        let event = sent.clone().into_event();
        let payload = serde_json::to_vec(&event).unwrap_or_default();
        let subject = subjects::events(&sent.job);
        assert_eq!(
            AgentReport::decode(&subject, &payload, sent.at),
            Ok(Some(sent.clone()))
        );
        let elsewhere = subjects::events(&JobId::random());
        assert!(AgentReport::decode(&elsewhere, &payload, sent.at).is_err());
    }

    #[test]
    fn the_schedulers_own_events_are_not_reports() {
        let mut event = report(ReportKind::Started { pid: 7 }).into_event();
        event.source = EventSource::Scheduler;
        let payload = serde_json::to_vec(&event).unwrap_or_default();
        let subject = subjects::events(&event.job_id);
        assert_eq!(AgentReport::decode(&subject, &payload, event.at), Ok(None));
    }

    #[test]
    fn only_a_zero_exit_of_its_own_accord_is_clean() {
        assert!(Exit::default().is_clean());
        for exit in [
            Exit {
                exit_code: 1,
                ..Exit::default()
            },
            Exit {
                cancelled: true,
                ..Exit::default()
            },
            Exit {
                timed_out: true,
                ..Exit::default()
            },
            Exit {
                preempted: true,
                ..Exit::default()
            },
        ] {
            assert!(!exit.is_clean(), "{exit:?}");
        }
    }
}
