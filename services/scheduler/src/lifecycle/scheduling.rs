//! What the scheduler itself decides about a job: the core starts it, gives it a wait
//! reason or rejects it; its time slice ends; its node is lost.

use mgpu_protocol::Timestamp;
use mgpu_protocol::event::JobEventKind;
use mgpu_protocol::job::{Ending, JobRecord, JobState, Placement, Run, WaitReason, Waiting};
use mgpu_protocol::stop::StopWarning;

use super::{
    Effect, Kill, Level, Limits, Transition, ended_unstarted, finish, kill_everywhere, log,
    usage_of,
};

/// The reason a preempted job's processes are given.
pub const SLICE_OVER: &str = "time slice over while other jobs wait: back to the queue";

/// A queued job is placed: recorded as running, then its assignment is sent, then watchers
/// hear of it. Recorded first: a scheduler that dies before sending finds the job running and
/// unconfirmed when it comes back, and sends it again.
pub(super) fn start(current: &JobRecord, placement: Placement, now: Timestamp) -> Transition {
    match &current.state {
        JobState::Queued(waiting) if waiting.held_by.is_none() => {}
        JobState::Queued(_) => {
            return Transition::unchanged(Level::Warn, "start of a held job ignored");
        }
        state => {
            return Transition::unchanged(
                Level::Warn,
                format!("start of a {} job ignored", state.name()),
            );
        }
    }
    let previous_stop = match &current.state {
        JobState::Queued(waiting) => waiting.previous_stop.clone(),
        _ => None,
    };
    let mut record = current.clone();
    let mut run = Run::assigned(placement.clone(), now);
    run.previous_stop = previous_stop;
    record.state = JobState::Running(run);
    Transition {
        record: Some(record),
        effects: vec![
            Effect::Assign,
            Effect::Publish(JobEventKind::Assigned { placement }),
        ],
    }
}

/// A queued job keeps waiting, now for `reason`: stored and announced when it changed.
pub(super) fn wait(current: &JobRecord, reason: WaitReason) -> Transition {
    let JobState::Queued(waiting) = &current.state else {
        return Transition::default();
    };
    if waiting.reason == reason {
        return Transition::default();
    }
    let mut record = current.clone();
    if let JobState::Queued(waiting) = &mut record.state {
        waiting.reason = reason;
    }
    Transition {
        record: Some(record),
        effects: vec![Effect::Publish(JobEventKind::Queued { reason })],
    }
}

/// A queued job that can never run ends failed, saying why.
pub(super) fn reject(current: &JobRecord, reason: &str, now: Timestamp) -> Transition {
    if !matches!(current.state, JobState::Queued(_)) {
        return Transition::default();
    }
    finish(
        current,
        JobState::Failed(ended_unstarted(now, format!("cannot run: {reason}"))),
    )
}

/// A running job's time slice is over while others wait: its processes are stopped (warned
/// first when it asked with `--signal SIG@SECONDS`), and it goes back to the queue when its
/// agent reports them gone. Once per attempt; never for a job being cancelled.
pub(super) fn slice_end(current: &JobRecord) -> Transition {
    let JobState::Running(run) = &current.state else {
        return Transition::default();
    };
    if run.preempt_requested || run.cancel_requested_by.is_some() {
        return Transition::default();
    }
    // A job that asked for a warning (`--signal SIG@SECONDS`) gets it that long before.
    let warning = current
        .spec
        .signal
        .filter(|signal| signal.seconds > 0)
        .map(|signal| StopWarning {
            signal: signal.signal,
            grace_secs: signal.seconds,
            cause: mgpu_protocol::stop::StopCause::TimeLimit,
        });
    let said = format!(
        "time slice over; preempting on {}",
        run.placement.nodes_label()
    );
    stop_for_requeue(current, SLICE_OVER.into(), warning, None, said)
}

/// A running job a job of a class that may preempt (`for_job`) starts in place of: warned
/// with `warning`, stopped at its grace's end, then requeued (`report.rs`) saying by whom.
/// Once per attempt; never for a job being cancelled or already being stopped.
pub(super) fn preempt(current: &JobRecord, for_job: &str, warning: StopWarning) -> Transition {
    let JobState::Running(run) = &current.state else {
        return Transition::default();
    };
    if run.preempt_requested || run.cancel_requested_by.is_some() {
        return Transition::default();
    }
    let said = format!(
        "preempted by {for_job}: signal {} now, stopped {} s later",
        mgpu_protocol::stop::signal_name(warning.signal),
        warning.grace_secs
    );
    let reason = format!("preempted by {for_job}: back to the queue");
    stop_for_requeue(current, reason, Some(warning), Some(for_job), said)
}

/// `current`'s processes stopped (warned first when `warning` says so), the job going back
/// to the queue once its agent reports them gone; its record says a stop is under way, with
/// its warning (sent again the same until it stopped) and for whom, if for a job.
pub(super) fn stop_for_requeue(
    current: &JobRecord,
    reason: String,
    warning: Option<StopWarning>,
    preempted_for: Option<&str>,
    said: String,
) -> Transition {
    let JobState::Running(run) = &current.state else {
        return Transition::default();
    };
    let mut record = current.clone();
    if let JobState::Running(stopping) = &mut record.state {
        stopping.preempt_requested = true;
        stopping.preempted_for = preempted_for.map(str::to_owned);
        stopping.stop_warning = warning;
    }
    let mut kill = kill_everywhere(current, &run.placement, reason, true);
    if let Effect::Kill(kill) = &mut kill {
        kill.warning = warning;
    }
    Transition {
        record: Some(record),
        effects: vec![kill, log(Level::Info, said)],
    }
}

/// A running job whose node lost it: back to the queue as the next attempt (keeping its
/// place in line, not before `not_before`), or `node_failed` when it may not be requeued
/// (`--no-requeue`, or `max_attempts` made), or `cancelled` when a cancel was on its way
/// (a job its owner cancelled never runs again).
pub(super) fn node_lost(
    current: &JobRecord,
    why: &str,
    at: Timestamp,
    not_before: Option<Timestamp>,
    limits: &Limits,
) -> Transition {
    let JobState::Running(run) = &current.state else {
        return Transition::default();
    };
    let mut effects: Vec<Effect> = usage_of(current, at).into_iter().collect();
    let out_of_attempts = current.attempt >= limits.max_attempts;
    let ends = run.cancel_requested_by.is_some() || current.spec.no_requeue || out_of_attempts;
    // The job's processes on its other nodes stop with it (fencing would, a heartbeat
    // later): every launched rank of a job over several nodes, even when only one rank runs
    // a process (not `--distributed`) and the node lost held none. A job that ends here gets
    // the kill on the lost node too: its assignment may still wait in that node's stream
    // (the purge failed and the node came back before it was asked again), and an ended job
    // must not run on; the kill stored behind it stops it at once.
    if run.placement.node_count() >= 2 || ends {
        effects.push(Effect::Kill(Kill {
            attempt: current.attempt,
            placement: run.placement.clone(),
            except: None,
            reason: why.to_owned(),
            requeue: false,
            warning: None,
            best_effort: true,
        }));
    }
    let ending = |reason: String| Ending {
        placement: Some(run.placement.clone()),
        started_at: run.started_at,
        ended_at: at,
        exit_code: None,
        signal: None,
        reason: Some(reason),
        usage: None,
    };
    let mut transition = if let Some(by) = &run.cancel_requested_by {
        finish(
            current,
            JobState::Cancelled(ending(format!("cancelled by {by}; {why}"))),
        )
    } else if current.spec.no_requeue || out_of_attempts {
        let reason = if current.spec.no_requeue {
            format!("{why}; not requeued (--no-requeue)")
        } else {
            format!(
                "{why}; not requeued: {} attempt(s) made, max_attempts is {}",
                current.attempt, limits.max_attempts
            )
        };
        finish(current, JobState::NodeFailed(ending(reason)))
    } else {
        let mut record = current.clone();
        record.attempt += 1;
        let mut waiting = Waiting::new(WaitReason::Resources);
        waiting.not_before = not_before.filter(|t| *t > at);
        waiting.previous_stop = Some(why.to_owned());
        record.state = JobState::Queued(waiting);
        let attempt = record.attempt;
        Transition {
            record: Some(record),
            effects: vec![
                Effect::Publish(JobEventKind::Queued {
                    reason: WaitReason::Resources,
                }),
                log(Level::Warn, format!("{why}: requeued as attempt {attempt}")),
            ],
        }
    };
    effects.append(&mut transition.effects);
    transition.effects = effects;
    transition
}
