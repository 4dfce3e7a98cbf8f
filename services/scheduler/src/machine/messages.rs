//! What goes into the scheduler's state machine and what comes out: [`Input`]s (a request
//! admitted or refused at the gate, an agent's report, a heartbeat, a tick of the clock, the
//! result of an operation it asked for) and [`Command`]s (write this record expecting that
//! revision, assign, kill, publish, audit, acknowledge, store, ask). Plain data: the driver
//! and the simulator build the one and carry out the other.

use std::time::Duration;

use mgpu_protocol::Timestamp;
use mgpu_protocol::assign::{Assignment, NodeControl};
use mgpu_protocol::audit::AuditRecord;
use mgpu_protocol::event::JobEvent;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobSpec, JobState};
use mgpu_protocol::node::{NodeAdmin, NodeHeartbeat};
use mgpu_protocol::principals::Registry;
use mgpu_protocol::priority::UsageBook;
use mgpu_protocol::report::AgentReport;
use mgpu_protocol::request::{Action, Request};

use super::jobs::Tracked;
use crate::lifecycle::{Requester, Signer, StreamOrder};
use crate::limits::Limits;
use crate::metrics::{RefusalReason, SubmitOutcome};

/// How long the scheduler's consumers (requests, agents' reports) wait for an
/// acknowledgement before JetStream hands a message out again (`ack_wait`).
pub const ACK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// A message the driver holds until the machine says to acknowledge it (a request, or an
/// agent's report): left unacknowledged, JetStream delivers it again.
pub type Token = u64;

/// An operation the machine asked for and waits to hear the result of.
pub type OpId = u64;

/// The authenticated sender of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub key: String,
    pub admin: bool,
}

impl Identity {
    /// This sender as the job lifecycle sees one who asks for a cancel, hold or release.
    pub fn requester(&self) -> Requester {
        Requester {
            name: self.name.clone(),
            admin: self.admin,
        }
    }

    /// This sender as the signer of a submission.
    pub fn signer(&self) -> Signer {
        Signer {
            name: self.name.clone(),
            key: self.key.clone(),
        }
    }
}

/// A request whose signature checked out and whose nonce is kept.
#[derive(Clone, Debug)]
pub struct Admitted {
    pub token: Token,
    pub identity: Identity,
    pub request: Request,
    /// Where it stands in the requests stream, when the driver knows.
    pub order: Option<StreamOrder>,
    /// Where its submitter waits for the verdict on a submission (checked to be under the
    /// signer's own inbox), if they wait.
    pub verdict_to: Option<String>,
}

/// A request refused at the gate: unsigned, forged, replayed, from an unknown key, of an
/// unreadable protocol, or malformed.
#[derive(Clone, Debug)]
pub struct Refused {
    pub token: Token,
    pub action: Action,
    /// The job it names, so its submitter hears why.
    pub about: Option<JobId>,
    /// The key it presented, if any.
    pub key: Option<String>,
    pub why: RefusalReason,
    pub reason: String,
}

/// What the liveness timer brings every second.
#[derive(Clone, Copy, Debug)]
pub struct Tick {
    /// A monotonic clock reading: a gap of several seconds between two ticks means the
    /// driver's loop stalled, which is not the nodes' silence.
    pub monotonic: Duration,
    /// Whether heartbeats could be seen (the heartbeat stream answered).
    pub heartbeats_visible: bool,
    /// Whether every agent report stored so far was handled.
    pub reports_caught_up: bool,
}

/// How a record write came out, once the driver knows.
#[derive(Clone, Debug, PartialEq)]
pub enum WriteOutcome {
    /// Stored at this revision.
    Stored { revision: u64 },
    /// What is stored is not what the machine expected (another writer changed it, or a
    /// record with that id exists): the stored record, or None when the key is gone.
    Changed { stored: Option<Box<Tracked>> },
    /// The store could not be reached for long enough: nothing is known to have changed.
    Failed { error: String },
}

/// Everything the machine is told.
#[derive(Clone, Debug)]
pub enum Input {
    /// Plain submissions that came together, recorded together (their writes pipelined).
    Submissions(Vec<Admitted>),
    /// Any other admitted request, or a `--dedup` submission, on its own.
    Request(Box<Admitted>),
    /// A request refused at the gate.
    Refused(Refused),
    /// An agent's report, its signer checked.
    Report { token: Token, report: AgentReport },
    /// A report whose signer is not the node it names: audited and dropped.
    ReportRefused {
        token: Token,
        job: JobId,
        key: Option<String>,
        why: String,
    },
    /// A node's heartbeat, decoded and validated, published on its own subject.
    Heartbeat(Box<NodeHeartbeat>),
    /// A heartbeat of a protocol this scheduler cannot read.
    IncompatibleHeartbeat { node: String, protocol: u32 },
    /// The liveness timer.
    Tick(Tick),
    /// A record write asked for by [`Command::Write`] came out.
    Written { op: OpId, outcome: WriteOutcome },
    /// A finished job's move to history ([`Command::Archive`]) came out.
    Archived { id: JobId, moved: bool },
    /// A node's administration ([`Command::StoreAdmin`]) was stored, or not.
    AdminStored { op: OpId, stored: bool },
    /// A reservation ([`Command::StoreReservation`] with an op) was stored, or not.
    ReservationStored { op: OpId, stored: bool },
    /// [`Command::PurgeAssignments`] came out (or not: it is asked for again).
    AssignmentsPurged { node: String, purged: bool },
    /// The answer to [`Command::AskReportsCaughtUp`].
    ReportsCaughtUp { op: OpId, caught_up: bool },
    /// How jobs in history that live jobs depend on ended.
    HistoryStates(Vec<(JobId, JobState)>),
    /// The usage book could not be stored: it is stored again later.
    UsageNotSaved,
    /// Storing the expected starts failed.
    PlanNotSaved,
    /// The per-user limits were read again.
    Limits(Limits),
    /// The principals file was read again.
    Principals(Registry),
    /// The scheduler became active and handled the reports stored while none was: the
    /// assignments recorded and never confirmed go out again (only then is it known which
    /// never reached their node).
    Resumed,
    /// Agents' reports were handed to an earlier scheduler and never acknowledged (it died
    /// handling them): JetStream hands them out again within [`ACK_WAIT`], and until
    /// they were read no node counts as silent (an exit among them must not be taken for a
    /// lost node's job).
    ReportsUnacknowledged,
    /// The scheduler stops: what must be stored is stored now.
    Stop,
}

/// A log line's level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

/// A log line, about a job or a node when it names one.
#[derive(Clone, Debug, PartialEq)]
pub struct LogLine {
    pub level: LogLevel,
    pub job: Option<JobId>,
    pub node: Option<String>,
    pub message: String,
}

/// What the metrics count.
#[derive(Clone, Debug, PartialEq)]
pub enum Count {
    Submitted {
        user: String,
        outcome: SubmitOutcome,
    },
    Refused {
        action: Action,
        why: RefusalReason,
    },
    /// A job started after waiting this long.
    StartedAfter(chrono::Duration),
}

/// One rank's assignment and the node it goes to.
#[derive(Clone, Debug, PartialEq)]
pub struct RankAssignment {
    pub node: String,
    /// The `Nats-Msg-Id` that lets JetStream drop a copy sent again.
    pub msg_id: String,
    pub assignment: Assignment,
}

/// Everything the machine asks for, carried out by the driver in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Store `record` with compare-and-set on `expected` (None: create it, it must not
    /// exist); answered with [`Input::Written`].
    Write {
        op: OpId,
        /// Shared with what waits for the write's result (no copy of the record).
        record: std::sync::Arc<JobRecord>,
        expected: Option<u64>,
    },
    /// Send a running job's assignments, every rank's. Its spec carries no environment when
    /// it is kept apart: the driver fetches it (`env_owner`'s) first. Must get through: a
    /// failure skips the later commands about the same job (the repair timer sends it again).
    Assign {
        job: JobId,
        env_owner: Option<String>,
        ranks: Vec<RankAssignment>,
    },
    /// Send a control message to a node. When `required`, a failure skips the later commands
    /// about the same job (its request is delivered again); else it is only logged.
    Control {
        job: JobId,
        node: String,
        control: NodeControl,
        required: bool,
    },
    /// Publish a job event for watchers (stored off the hot path).
    Event(JobEvent),
    /// Record a request in the audit trail (stored off the hot path).
    Audit(AuditRecord),
    /// Acknowledge a request or report: it was handled. `job` is what it was about: a
    /// required command about that job that failed before it skips it.
    Ack { token: Token, job: Option<JobId> },
    /// Store a node's administration in the cluster bucket; answered with
    /// [`Input::AdminStored`].
    StoreAdmin {
        op: OpId,
        node: String,
        admin: NodeAdmin,
    },
    /// Store a reservation in the cluster bucket; answered with [`Input::ReservationStored`]
    /// when `op` is given (a booking or cancel waits for it; the upkeep's changes do not).
    StoreReservation {
        op: Option<OpId>,
        reservation: std::sync::Arc<mgpu_protocol::reservation::Reservation>,
    },
    /// Delete a reservation long over from the cluster bucket (not answered).
    DropReservation { name: String },
    /// Tell whoever booked or cancelled a reservation, waiting on `to` (their own inbox),
    /// what came of it: published once, not stored.
    ReservationVerdict {
        to: String,
        verdict: mgpu_protocol::reservation::ReservationVerdict,
    },
    /// Drop the assignments that wait on an offline node's subject: its jobs were requeued,
    /// and its agent, back after a crash or a partition, must not start them there while they
    /// run elsewhere. Answered with [`Input::AssignmentsPurged`].
    PurgeAssignments { node: String },
    /// Move a finished job to history (its record published there, its key purged, its
    /// environment dropped); answered with [`Input::Archived`]. With `last_of_array`, the
    /// environment its array stored once for all its tasks is dropped too: no other task of
    /// the array is left in the table.
    Archive {
        record: Box<JobRecord>,
        last_of_array: bool,
    },
    /// Store the fair-share usage book (a failure is answered with [`Input::UsageNotSaved`]).
    SaveUsage(UsageBook),
    /// Store the waiting jobs' expected starts (a failure is answered with
    /// [`Input::PlanNotSaved`]).
    SavePlan(mgpu_protocol::plan::PlanSnapshot),
    /// Ask whether every agent report stored so far was handled; answered with
    /// [`Input::ReportsCaughtUp`].
    AskReportsCaughtUp { op: OpId },
    /// Tell a user about one of their jobs on `subject` (`users.<key>.notices`): published
    /// once, not stored (a user who does not follow them reads the job's record instead).
    Notice {
        subject: String,
        notice: mgpu_protocol::idle::Notice,
    },
    /// Tell a submitter, waiting on `to` (their own inbox), whether their job will run:
    /// published once, not stored (the job's record says the same).
    Verdict {
        to: String,
        verdict: mgpu_protocol::submit::SubmitVerdict,
    },
    /// Count something in the metrics.
    Count(Count),
    /// Say something in the log.
    Log(LogLine),
}

impl Command {
    /// The job a command is about, when it is about one.
    pub fn job(&self) -> Option<&JobId> {
        match self {
            Command::Write { record, .. } => Some(&record.id),
            Command::Archive { record, .. } => Some(&record.id),
            Command::Assign { job, .. } | Command::Control { job, .. } => Some(job),
            Command::Event(event) => Some(&event.job_id),
            Command::Ack { job, .. } => job.as_ref(),
            Command::Log(line) => line.job.as_ref(),
            _ => None,
        }
    }

    /// A log line about `job`.
    pub fn log(level: LogLevel, job: Option<&JobId>, message: impl Into<String>) -> Self {
        Command::Log(LogLine {
            level,
            job: job.cloned(),
            node: None,
            message: message.into(),
        })
    }

    /// A log line about `node`.
    pub fn node_log(level: LogLevel, node: &str, message: impl Into<String>) -> Self {
        Command::Log(LogLine {
            level,
            job: None,
            node: Some(node.to_owned()),
            message: message.into(),
        })
    }
}

/// One step of handling a batch of requests, in the order they came.
#[derive(Debug, PartialEq)]
pub enum Step<T> {
    /// Plain submissions, recorded together (their writes pipelined).
    Record(Vec<T>),
    /// Any other request, or a `--dedup` submission, on its own.
    CarryOut(T),
}

/// The specs of the submissions among `admitted`: the driver looks up in history the
/// dependencies the machine does not know before it hands them over.
pub fn submitted_specs(admitted: &[Admitted]) -> impl Iterator<Item = &JobSpec> {
    admitted.iter().filter_map(|a| match &a.request {
        Request::Submit(submit) => Some(&submit.spec),
        _ => None,
    })
}

/// Groups a batch: consecutive plain submissions are recorded together; any other request
/// (a cancel may name a job submitted just before it), and a `--dedup` submission (it must
/// see every job before it), comes alone, after the submissions before it. The driver feeds
/// the steps one at a time, each once the one before is carried out.
pub fn steps<T>(requests: Vec<T>, request_of: impl Fn(&T) -> &Request) -> Vec<Step<T>> {
    let mut steps = Vec::new();
    let mut submissions = Vec::new();
    for item in requests {
        match request_of(&item) {
            Request::Submit(submit) if !submit.spec.dedup => submissions.push(item),
            _ => {
                if !submissions.is_empty() {
                    steps.push(Step::Record(std::mem::take(&mut submissions)));
                }
                steps.push(Step::CarryOut(item));
            }
        }
    }
    if !submissions.is_empty() {
        steps.push(Step::Record(submissions));
    }
    steps
}

/// What the machine was started with: everything read from the store.
pub struct Loaded {
    pub records: Vec<Tracked>,
    pub heartbeats: Vec<NodeHeartbeat>,
    pub admin: std::collections::BTreeMap<String, NodeAdmin>,
    pub reservations: Vec<mgpu_protocol::reservation::Reservation>,
    pub usage: UsageBook,
    pub principals: Registry,
    pub limits: Limits,
    pub policy: mgpu_protocol::priority::Policy,
    /// When the machine starts: heartbeats stored before were not seen.
    pub now: Timestamp,
}

#[cfg(test)]
mod tests {
    use mgpu_protocol::cancel::CancelRequest;
    use mgpu_protocol::job::JobSpec;
    use mgpu_protocol::submit::SubmitRequest;

    use super::*;

    fn submit(dedup: bool) -> Request {
        let mut spec = JobSpec::new(vec!["true".into()], "/tmp");
        spec.dedup = dedup;
        Request::Submit(Box::new(SubmitRequest {
            id: JobId::random(),
            user: "alice".into(),
            spec,
        }))
    }

    fn cancel() -> Request {
        Request::Cancel {
            job: JobId::random(),
            request: CancelRequest {
                user: "alice".into(),
                reason: None,
            },
        }
    }

    /// The steps, as labels: `[1, 2]` recorded together, `3` carried out alone.
    fn shape(steps: Vec<Step<(u32, Request)>>) -> Vec<Vec<u32>> {
        steps
            .into_iter()
            .map(|step| match step {
                Step::Record(items) => items.into_iter().map(|(label, _)| label).collect(),
                Step::CarryOut((label, _)) => vec![100 + label],
            })
            .collect()
    }

    fn grouped(batch: Vec<(u32, Request)>) -> Vec<Vec<u32>> {
        shape(steps(batch, |(_, request)| request))
    }

    #[test]
    fn consecutive_plain_submissions_are_recorded_together() {
        let batch = vec![(1, submit(false)), (2, submit(false)), (3, submit(false))];
        assert_eq!(grouped(batch), vec![vec![1, 2, 3]]);
    }

    #[test]
    fn a_cancel_comes_after_the_submissions_before_it_and_before_those_after() {
        let batch = vec![
            (1, submit(false)),
            (2, cancel()),
            (3, submit(false)),
            (4, submit(false)),
        ];
        assert_eq!(grouped(batch), vec![vec![1], vec![102], vec![3, 4]]);
    }

    #[test]
    fn a_dedup_submission_comes_alone_after_every_job_before_it() {
        let batch = vec![
            (1, submit(false)),
            (2, submit(false)),
            (3, submit(true)),
            (4, submit(true)),
            (5, submit(false)),
        ];
        assert_eq!(
            grouped(batch),
            vec![vec![1, 2], vec![103], vec![104], vec![5]]
        );
    }

    #[test]
    fn an_empty_batch_has_no_steps() {
        assert!(grouped(Vec::new()).is_empty());
    }
}
