//! A job stopped for a job of a class that may preempt: warned, requeued saying by whom,
//! and its next attempt told why the previous one stopped.

use mgpu_protocol::job::{JobState, Placement, WaitReason};
use mgpu_protocol::report::Exit;
use mgpu_protocol::stop::{StopCause, StopWarning};

use super::tests::{alice, exit, kills, on, report, running, step, stored, waiting_of};
use super::{Input, Transition};

fn preempt() -> Input {
    Input::Preempt {
        for_job: "4f2a1b2c3d (bob)".into(),
        warning: StopWarning {
            signal: 10,
            grace_secs: 120,
            cause: StopCause::Preempted,
        },
    }
}

#[test]
fn a_preempted_job_is_warned_once_requeued_saying_by_whom_and_its_next_attempt_told() {
    let job = running(on("node001"));
    let transition = step(&job, preempt(), 10);
    let [kill] = kills(&transition)[..] else {
        panic!("{:?}", transition.effects);
    };
    assert!(kill.requeue);
    assert_eq!(kill.warning.map(|w| w.grace_secs), Some(120));
    let stopping = stored(&transition);
    assert_eq!(
        step(&stopping, preempt(), 11),
        Transition::default(),
        "once per attempt"
    );
    let stopped = exit(Exit {
        exit_code: 0,
        preempted: true,
        ..Exit::default()
    });
    let requeued = stored(&step(
        &stopping,
        report(&stopping, "node001", 60, stopped),
        60,
    ));
    assert_eq!(requeued.attempt, 2);
    let [kept] = &requeued.preemptions[..] else {
        panic!("{:?}", requeued.preemptions);
    };
    assert_eq!((kept.attempt, kept.by.as_str()), (1, "4f2a1b2c3d (bob)"));
    assert!(kept.within_grace && kept.gpu_seconds > 0, "{kept:?}");
    let waiting = waiting_of(&requeued);
    assert_eq!(waiting.reason, WaitReason::Resources);
    assert_eq!(
        waiting.previous_stop.as_deref(),
        Some("preempted by 4f2a1b2c3d (bob)")
    );
    let started = stored(&step(
        &requeued,
        Input::Start {
            placement: Placement::clone(&on("node002")),
        },
        70,
    ));
    let JobState::Running(run) = &started.state else {
        panic!("{:?}", started.state);
    };
    assert_eq!(
        run.previous_stop.as_deref(),
        Some("preempted by 4f2a1b2c3d (bob)")
    );
}

#[test]
fn a_job_being_cancelled_is_not_preempted_and_a_cancel_wins_over_a_preemption() {
    let job = running(on("node001"));
    let cancel = || Input::Cancel {
        by: alice(),
        reason: None,
    };
    let cancelling = stored(&step(&job, cancel(), 5));
    assert_eq!(step(&cancelling, preempt(), 10), Transition::default());
    // Cancelled while its preemption's grace runs: it ends cancelled, not requeued.
    let stopping = stored(&step(&job, preempt(), 10));
    let cancelled = stored(&step(&stopping, cancel(), 12));
    let killed = exit(Exit {
        exit_code: 143,
        signal: Some(15),
        preempted: true,
        ..Exit::default()
    });
    let ended = stored(&step(
        &cancelled,
        report(&cancelled, "node001", 20, killed),
        20,
    ));
    assert!(
        matches!(ended.state, JobState::Cancelled(_)),
        "{:?}",
        ended.state
    );
}

#[test]
fn a_job_at_its_slice_s_end_is_warned_when_it_asked() {
    let mut job = running(on("node001"));
    job.spec.signal = mgpu_protocol::stop::StopSignal::parse("USR2@30").ok();
    let transition = step(&job, Input::SliceEnd, 10);
    let [kill] = kills(&transition)[..] else {
        panic!("{:?}", transition.effects);
    };
    let warning = kill.warning.unwrap_or_else(|| panic!("no warning"));
    assert_eq!((warning.signal, warning.grace_secs), (12, 30));
    assert_eq!(warning.cause, StopCause::TimeLimit);
    job.spec.signal = None;
    let plain = step(&job, Input::SliceEnd, 10);
    assert!(kills(&plain).iter().all(|k| k.warning.is_none()));
}
