//! A running job and the idle policy: warned once, the warning withdrawn, and reclaimed by
//! the warning's action only once warned.

use mgpu_protocol::idle::{IdleAction, IdleWarning, NoticeKind};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobState, WaitReason};
use mgpu_protocol::report::Exit;
use mgpu_protocol::stop::{StopCause, StopWarning};

use super::tests::{at, exit, kills, on, report, running, step, stored, waiting_of};
use super::{Effect, Input, Transition};

fn warning(action: IdleAction) -> IdleWarning {
    IdleWarning {
        idle_since: at(0),
        warned_at: at(100),
        action,
        action_from: at(200),
    }
}

fn reclaim() -> Input {
    Input::Reclaim {
        for_job: "4f2a1b2c3d (bob)".into(),
        for_id: JobId::random(),
        stop: StopWarning {
            signal: 10,
            grace_secs: 30,
            cause: StopCause::Idle,
        },
    }
}

fn notices(transition: &Transition) -> Vec<&NoticeKind> {
    transition
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::Notify { kind, .. } => Some(kind),
            _ => None,
        })
        .collect()
}

#[test]
fn a_warned_job_is_told_once_and_the_warning_is_withdrawn_when_it_works_again() {
    let job = running(on("node001"));
    assert_eq!(step(&job, Input::IdleCleared, 50), Transition::default());
    let warn = Input::IdleWarn {
        warning: warning(IdleAction::Requeue),
    };
    let warned_step = step(&job, warn.clone(), 100);
    assert!(matches!(
        notices(&warned_step)[..],
        [NoticeKind::IdleWarning { .. }]
    ));
    let warned = stored(&warned_step);
    assert_eq!(step(&warned, warn, 101), Transition::default(), "once");
    let cleared_step = step(&warned, Input::IdleCleared, 150);
    assert!(matches!(
        notices(&cleared_step)[..],
        [NoticeKind::IdleCleared]
    ));
    let JobState::Running(run) = &stored(&cleared_step).state else {
        panic!("not running");
    };
    assert!(run.idle_warning.is_none());
}

#[test]
fn nothing_is_reclaimed_from_a_job_not_warned_or_only_to_be_warned() {
    let job = running(on("node001"));
    assert_eq!(step(&job, reclaim(), 300), Transition::default());
    let warned = stored(&step(
        &job,
        Input::IdleWarn {
            warning: warning(IdleAction::Warn),
        },
        100,
    ));
    assert_eq!(step(&warned, reclaim(), 300), Transition::default());
}

#[test]
fn a_reclaimed_job_is_warned_stopped_and_requeued_saying_why() {
    let job = running(on("node001"));
    let warned = stored(&step(
        &job,
        Input::IdleWarn {
            warning: warning(IdleAction::Requeue),
        },
        100,
    ));
    let reclaiming = step(&warned, reclaim(), 300);
    let [kill] = kills(&reclaiming)[..] else {
        panic!("{:?}", reclaiming.effects);
    };
    assert!(kill.requeue);
    assert_eq!(kill.warning.map(|w| w.cause), Some(StopCause::Idle));
    assert!(matches!(
        notices(&reclaiming)[..],
        [NoticeKind::IdleReclaimed {
            action: IdleAction::Requeue,
            ..
        }]
    ));
    let stopping = stored(&reclaiming);
    assert_eq!(step(&stopping, reclaim(), 301), Transition::default());
    let stopped = exit(Exit {
        exit_code: 0,
        preempted: true,
        ..Exit::default()
    });
    let requeued = stored(&step(
        &stopping,
        report(&stopping, "node001", 330, stopped),
        330,
    ));
    assert_eq!(requeued.attempt, 2);
    let waiting = waiting_of(&requeued);
    assert_eq!(waiting.reason, WaitReason::Resources);
    assert_eq!(
        waiting.previous_stop.as_deref(),
        Some("its GPUs sat idle while another job waited")
    );
    assert!(requeued.preemptions.is_empty(), "not a preemption");
}

#[test]
fn a_job_the_policy_cancels_ends_cancelled_by_it() {
    let job = running(on("node001"));
    let warned = stored(&step(
        &job,
        Input::IdleWarn {
            warning: warning(IdleAction::Cancel),
        },
        100,
    ));
    let cancelling = step(&warned, reclaim(), 300);
    let [kill] = kills(&cancelling)[..] else {
        panic!("{:?}", cancelling.effects);
    };
    assert!(!kill.requeue);
    let stopping = stored(&cancelling);
    let killed = exit(Exit {
        exit_code: 143,
        signal: Some(15),
        ..Exit::default()
    });
    let ended = stored(&step(
        &stopping,
        report(&stopping, "node001", 310, killed),
        310,
    ));
    let JobState::Cancelled(end) = &ended.state else {
        panic!("{:?}", ended.state);
    };
    assert_eq!(end.reason.as_deref(), Some("cancelled by the idle policy"));
}
