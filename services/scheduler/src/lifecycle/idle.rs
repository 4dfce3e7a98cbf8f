//! A running job and the `[idle]` policy: its owner warned that its GPUs sit idle, the
//! warning withdrawn when it works again, and, past the warning's grace while another job
//! waits for its GPUs, the policy's action: requeued (warned first, as a preemption is),
//! cancelled, or nothing more than the warning.

use mgpu_protocol::idle::{IdleAction, IdleWarning, NoticeKind};
use mgpu_protocol::job::{JobRecord, JobState};
use mgpu_protocol::stop::StopWarning;

use super::scheduling::stop_for_requeue;
use super::{Effect, Level, Transition, kill_everywhere, log};

/// The job's owner is warned: its record keeps the warning, and a notice tells them.
pub(super) fn warn(current: &JobRecord, warning: IdleWarning) -> Transition {
    let JobState::Running(run) = &current.state else {
        return Transition::default();
    };
    if run.idle_warning.is_some() || run.preempt_requested || run.cancel_requested_by.is_some() {
        return Transition::default();
    }
    let mut record = current.clone();
    if let JobState::Running(warned) = &mut record.state {
        warned.idle_warning = Some(warning.clone());
    }
    let said = format!(
        "GPUs idle since {}: owner warned; {} from {} if another job waits",
        warning.idle_since.format("%H:%M:%S"),
        action_words(warning.action),
        warning.action_from.format("%H:%M:%S")
    );
    Transition {
        record: Some(record),
        effects: vec![
            Effect::Notify {
                kind: NoticeKind::IdleWarning { warning },
                message: said.clone(),
            },
            log(Level::Info, said),
        ],
    }
}

/// The job worked again: its warning is withdrawn.
pub(super) fn clear(current: &JobRecord) -> Transition {
    let JobState::Running(run) = &current.state else {
        return Transition::default();
    };
    if run.idle_warning.is_none() {
        return Transition::default();
    }
    let mut record = current.clone();
    if let JobState::Running(cleared) = &mut record.state {
        cleared.idle_warning = None;
    }
    let said = "its GPUs are in use again: the idle warning is withdrawn".to_owned();
    Transition {
        record: Some(record),
        effects: vec![
            Effect::Notify {
                kind: NoticeKind::IdleCleared,
                message: said.clone(),
            },
            log(Level::Info, said),
        ],
    }
}

/// Past its warning's grace, `for_job` (`4f2a1b2c3d (bob)`) waits for the job's GPUs: the
/// warning's action is taken. Nothing happens to a job not warned, or already stopping.
pub(super) fn reclaim(
    current: &JobRecord,
    for_job: &str,
    for_id: &mgpu_protocol::ids::JobId,
    stop: StopWarning,
) -> Transition {
    let JobState::Running(run) = &current.state else {
        return Transition::default();
    };
    let Some(warning) = &run.idle_warning else {
        return Transition::default();
    };
    if run.preempt_requested || run.cancel_requested_by.is_some() {
        return Transition::default();
    }
    let since = warning.idle_since.format("%H:%M:%S");
    let notice = |said: &str| Effect::Notify {
        kind: NoticeKind::IdleReclaimed {
            action: warning.action,
            for_job: for_id.clone(),
        },
        message: said.to_owned(),
    };
    match warning.action {
        IdleAction::Warn => Transition::default(),
        IdleAction::Requeue => {
            let reason =
                format!("GPUs idle since {since} while {for_job} waited: back to the queue");
            let said = format!(
                "GPUs idle since {since}, {for_job} waits: signal {} now, stopped {} s later, \
                 then queued again",
                mgpu_protocol::stop::signal_name(stop.signal),
                stop.grace_secs
            );
            let mut transition = stop_for_requeue(current, reason, Some(stop), None, said.clone());
            transition.effects.insert(0, notice(&said));
            transition
        }
        IdleAction::Cancel => {
            let mut record = current.clone();
            if let JobState::Running(stopping) = &mut record.state {
                stopping.cancel_requested_by = Some("the idle policy".to_owned());
            }
            let said = format!("GPUs idle since {since} while {for_job} waited: cancelled");
            Transition {
                record: Some(record),
                effects: vec![
                    notice(&said),
                    kill_everywhere(current, &run.placement, said.clone(), false),
                    log(Level::Info, said),
                ],
            }
        }
    }
}

/// What a warning says will happen, in words.
pub fn action_words(action: IdleAction) -> &'static str {
    match action {
        IdleAction::Requeue => "requeued",
        IdleAction::Cancel => "cancelled",
        IdleAction::Warn => "warned only",
    }
}
