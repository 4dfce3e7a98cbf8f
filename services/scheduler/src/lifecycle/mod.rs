//! A job's lifecycle as a pure function: `(current record, input, now) -> (new record,
//! effects)`. No async, no NATS, no clock: the service reads the clock, looks the record
//! up, calls [`apply`] (or [`submit`] for a new job), stores the record it returns and then
//! carries out its [`Effect`]s in order. The same discipline as [`crate::core::plan`], and
//! tested the same way (`tests.rs`: unit stories and properties).
//!
//! The inputs: what people ask ([`submit`], cancel, hold and release: `requests.rs`), what
//! agents report (`report.rs`), and what the scheduler itself decides (a start, a wait
//! reason, a rejection, the end of a time slice, a lost node: `scheduling.rs`), and the idle
//! policy's warnings and reclaims (`idle.rs`).
//!
//! Rules every transition keeps (and the property tests check): nothing leaves a final
//! state; `attempt` only grows; a job lost with its node is requeued at most `max_attempts`
//! times in all; a report about any attempt but the current one changes nothing.

mod idle;
#[cfg(test)]
mod idle_tests;
#[cfg(test)]
mod node_lost_tests;
#[cfg(test)]
mod preemption_tests;
mod report;
mod requests;
mod scheduling;
#[cfg(test)]
mod tests;

use mgpu_protocol::Timestamp;
use mgpu_protocol::event::JobEventKind;
use mgpu_protocol::idle::{IdleWarning, NoticeKind};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{Ending, JobRecord, JobState, Placement, WaitReason};
use mgpu_protocol::report::AgentReport;
use mgpu_protocol::request::Action;
use mgpu_protocol::stop::StopWarning;

pub use requests::{NotAdded, Signer, submit};
pub use scheduling::SLICE_OVER;

/// What the lifecycle needs of the scheduler's policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Attempts a job gets when its nodes keep getting lost; then it ends `node_failed`.
    pub max_attempts: u32,
}

/// Who asks for a cancel, hold or release (the signature decided it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requester {
    pub name: String,
    pub admin: bool,
}

impl Requester {
    /// Whether this requester may act on a job owned by `owner`.
    pub fn may_act_on(&self, owner: &str) -> bool {
        self.admin || self.name == owner
    }
}

/// Where a request stands in the requests stream. JetStream delivers a request again when
/// its acknowledgement was lost, possibly after a later request about the same job or node
/// was applied: such an older one is not applied again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamOrder {
    pub sequence: u64,
    /// Whether the stream delivered it before (only then can it be stale: a first delivery
    /// comes in stream order, and a stream created again starts its sequences over).
    pub redelivered: bool,
    /// When the stream stored it.
    pub stored_at: Timestamp,
}

impl StreamOrder {
    /// Whether this request is a redelivery older than the `last` one applied.
    pub fn is_stale(order: Option<StreamOrder>, last: Option<u64>) -> bool {
        match (order, last) {
            (Some(order), Some(last)) => order.redelivered && order.sequence <= last,
            _ => false,
        }
    }
}

/// What can happen to an existing job.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// `jobs.<id>.cancel`.
    Cancel {
        by: Requester,
        reason: Option<String>,
    },
    /// `jobs.<id>.hold`.
    Hold {
        by: Requester,
        order: Option<StreamOrder>,
    },
    /// `jobs.<id>.release`.
    Release {
        by: Requester,
        order: Option<StreamOrder>,
    },
    /// An agent's report about one attempt's process.
    Report(AgentReport),
    /// The core placed the job: it runs there now.
    Start { placement: Placement },
    /// The core left the job waiting, for this reason.
    Wait { reason: WaitReason },
    /// The core found the job can never run.
    Reject { reason: String },
    /// The job's time slice is over while others wait: it is stopped and requeued.
    SliceEnd,
    /// A job of a class that may preempt (`for_job`: `4f2a1b2c3d (bob)`) starts in this
    /// one's room: it is warned, stopped after the grace, and requeued.
    Preempt {
        for_job: String,
        warning: StopWarning,
    },
    /// Its GPUs have been idle past the `[idle]` policy's `after`: its owner is warned.
    IdleWarn { warning: IdleWarning },
    /// It worked again: the idle warning is withdrawn.
    IdleCleared,
    /// Past its idle warning's grace, `for_job` (`4f2a1b2c3d (bob)`, id `for_id`) waits for
    /// its GPUs: the warning's action is taken (a requeue warned with `stop`).
    Reclaim {
        for_job: String,
        for_id: JobId,
        stop: StopWarning,
    },
    /// The job's node was lost (`at`: when that was seen); a requeued job starts no earlier
    /// than `not_before`, when the lost node's agent has surely stopped it.
    NodeLost {
        why: String,
        at: Timestamp,
        not_before: Option<Timestamp>,
    },
}

/// What the service carries out after storing the new record, in order. An effect that
/// must happen ([`Effect::Assign`], a [`Kill`] that is not best-effort) stops the rest when
/// it fails, and the input is handled again later (a request is redelivered; the repair timer
/// sends assignments and kills again).
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Send the job's assignment to every node that runs one of its ranks.
    Assign,
    /// Stop an attempt's processes.
    Kill(Kill),
    /// Publish a job event for watchers (`jobs.<id>.events`).
    Publish(JobEventKind),
    /// Record the request in the audit trail: carried out (or a no-op) when `accepted`, else
    /// refused for what `detail` says (a submission recorded as failed).
    Audit {
        action: Action,
        accepted: bool,
        detail: String,
    },
    /// Refuse the request: an event the requester sees, an audit record, a log line.
    Refuse { action: Action, reason: String },
    /// Add a run's GPU time to its user's fair-share usage.
    AccountUsage {
        user: String,
        gpu_seconds: f64,
        at: Timestamp,
    },
    /// Tell the job's owner (`users.<key>.notices`).
    Notify { kind: NoticeKind, message: String },
    /// Say what happened in the scheduler's log.
    Log(Log),
}

/// A kill for one attempt of a job, sent to each node where one of its ranks runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Kill {
    pub attempt: u32,
    pub placement: Placement,
    /// The node not to send it to (where the rank already ended).
    pub except: Option<String>,
    pub reason: String,
    /// The job goes back to the queue once stopped (a time slice), rather than ending.
    pub requeue: bool,
    /// Warn it first (a preemption by class): the signal, its stop file, then the grace.
    pub warning: Option<StopWarning>,
    /// A failure is only logged: heartbeat fencing kills what this misses.
    pub best_effort: bool,
}

/// A log line about the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Log {
    pub level: Level,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
}

/// The outcome of one input: the record to store (None: unchanged) and the effects.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Transition {
    pub record: Option<JobRecord>,
    pub effects: Vec<Effect>,
}

impl Transition {
    /// Nothing changes; only a log line says why.
    fn unchanged(level: Level, message: impl Into<String>) -> Self {
        Transition {
            record: None,
            effects: vec![log(level, message)],
        }
    }
}

/// Applies `input` to the job whose record is `current`, at `now`.
pub fn apply(current: &JobRecord, input: Input, now: Timestamp, limits: &Limits) -> Transition {
    match input {
        Input::Cancel { by, reason } => requests::cancel(current, &by, reason.as_deref(), now),
        Input::Hold { by, order } => requests::hold(current, &by, true, order),
        Input::Release { by, order } => requests::hold(current, &by, false, order),
        Input::Report(report) => report::on_report(current, report, limits),
        Input::Start { placement } => scheduling::start(current, placement, now),
        Input::Wait { reason } => scheduling::wait(current, reason),
        Input::Reject { reason } => scheduling::reject(current, &reason, now),
        Input::SliceEnd => scheduling::slice_end(current),
        Input::Preempt { for_job, warning } => scheduling::preempt(current, &for_job, warning),
        Input::IdleWarn { warning } => idle::warn(current, warning),
        Input::IdleCleared => idle::clear(current),
        Input::Reclaim {
            for_job,
            for_id,
            stop,
        } => idle::reclaim(current, &for_job, &for_id, stop),
        Input::NodeLost {
            why,
            at,
            not_before,
        } => scheduling::node_lost(current, &why, at, not_before, limits),
    }
}

fn log(level: Level, message: impl Into<String>) -> Effect {
    Effect::Log(Log {
        level,
        message: message.into(),
    })
}

/// `current` ended in `state` (built from its record): the event every finish publishes.
fn finish(current: &JobRecord, state: JobState) -> Transition {
    let mut record = current.clone();
    record.state = state;
    let end = record.state.ending();
    let effects = vec![
        Effect::Publish(JobEventKind::Finished {
            state: record.state.name().to_owned(),
            exit_code: end.and_then(|e| e.exit_code),
            reason: end.and_then(|e| e.reason.clone()),
        }),
        log(
            Level::Info,
            format!("job finished: {}", record.state.name()),
        ),
    ];
    Transition {
        record: Some(record),
        effects,
    }
}

/// An ending with no process behind it (refused, cancelled while queued, rejected).
fn ended_unstarted(at: Timestamp, reason: String) -> Ending {
    Ending {
        placement: None,
        started_at: None,
        ended_at: at,
        exit_code: None,
        signal: None,
        reason: Some(reason),
        usage: None,
    }
}

/// The GPU time a run used until `ended_at`, for its user's fair share (none if it never
/// started, or used no GPU).
fn usage_of(record: &JobRecord, ended_at: Timestamp) -> Option<Effect> {
    let JobState::Running(run) = &record.state else {
        return None;
    };
    let started = run.started_at?;
    let seconds = (ended_at - started).num_milliseconds().max(0) as f64 / 1000.0;
    let gpus = run.placement.total_gpus();
    (gpus > 0.0 && seconds > 0.0).then(|| Effect::AccountUsage {
        user: record.user.clone(),
        gpu_seconds: gpus * seconds,
        at: ended_at,
    })
}

/// A kill of every process of `current`'s attempt that must get through: `requeue` when the
/// job goes back to the queue once stopped.
fn kill_everywhere(
    current: &JobRecord,
    placement: &Placement,
    reason: String,
    requeue: bool,
) -> Effect {
    Effect::Kill(Kill {
        attempt: current.attempt,
        placement: placement.clone(),
        except: None,
        reason,
        requeue,
        warning: None,
        best_effort: false,
    })
}

/// A best-effort kill of a multi-process job's ranks but `except`'s: none for a job with a
/// single process (its end already stopped everything).
fn stop_other_ranks(
    record: &JobRecord,
    placement: &Placement,
    except: Option<&str>,
    why: &str,
) -> Option<Effect> {
    (placement.launched_ranks().len() >= 2).then(|| {
        Effect::Kill(Kill {
            attempt: record.attempt,
            placement: placement.clone(),
            except: except.map(str::to_owned),
            reason: why.to_owned(),
            requeue: false,
            warning: None,
            best_effort: true,
        })
    })
}
