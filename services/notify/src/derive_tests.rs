//! Unit tests of `derive.rs`: which events become which notices, for whom, under which id.

use chrono::Duration;
use mgpu_protocol::Timestamp;
use mgpu_protocol::event::{EventSource, JobEvent, JobEventKind};
use mgpu_protocol::idle::NoticeKind;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{
    ArrayMember, Ending, JobRecord, JobSpec, JobState, Placement, Run, WaitReason, Waiting,
};
use mgpu_protocol::notify::NotifyEvent;

use super::*;

fn placement(node: &str) -> Placement {
    Placement {
        node: node.to_owned(),
        gpus: Vec::new(),
        peers: Vec::new(),
        launch: None,
        cpus: 0,
        mem_host_mib: 0,
    }
}

fn record(notify: &[NotifyEvent], state: JobState) -> JobRecord {
    let mut spec = JobSpec::new(vec!["true".into()], "/tmp");
    spec.notify = notify.to_vec();
    JobRecord {
        id: JobId::random(),
        user: "alice".into(),
        user_key: Some("UALICE".into()),
        spec,
        submitted_at: mgpu_protocol::now(),
        attempt: 1,
        state,
        last_request: None,
        preemptions: Vec::new(),
    }
}

fn running(started: Option<Timestamp>) -> JobState {
    let mut run = Run::assigned(placement("node001"), mgpu_protocol::now());
    run.started_at = started;
    JobState::Running(run)
}

fn ended(state: fn(Ending) -> JobState) -> JobState {
    state(Ending {
        placement: None,
        started_at: None,
        ended_at: mgpu_protocol::now(),
        exit_code: Some(0),
        signal: None,
        reason: None,
        usage: None,
    })
}

fn event(record: &JobRecord, source: EventSource, kind: JobEventKind) -> JobEvent {
    JobEvent {
        job_id: record.id.clone(),
        attempt: 1,
        at: mgpu_protocol::now(),
        source,
        kind,
    }
}

fn node(name: &str) -> EventSource {
    EventSource::Node(name.to_owned())
}

fn finished(state: &str) -> JobEventKind {
    JobEventKind::Finished {
        state: state.to_owned(),
        exit_code: Some(1),
        reason: None,
    }
}

#[test]
fn a_start_is_told_only_when_asked_and_only_from_the_jobs_node() {
    let job = record(&[NotifyEvent::Start], running(None));
    let started = JobEventKind::Started { pid: 7 };
    let told = from_event(&event(&job, node("node001"), started.clone()), &job);
    assert_eq!(
        told.as_ref().map(|d| d.id.clone()),
        Some(format!("{}-1-start", job.id))
    );
    assert_eq!(told.map(|d| d.owner), Some("UALICE".to_owned()));
    // Another node cannot make one up.
    assert!(from_event(&event(&job, node("node002"), started.clone()), &job).is_none());
    let not_asked = record(&[NotifyEvent::End], running(None));
    assert!(from_event(&event(&not_asked, node("node001"), started), &not_asked).is_none());
}

#[test]
fn an_end_goes_to_end_and_a_failure_to_fail_with_one_id() {
    let job = record(&[NotifyEvent::Fail], ended(JobState::Failed));
    let failed = from_event(
        &event(&job, EventSource::Scheduler, finished("failed")),
        &job,
    );
    assert_eq!(
        failed.as_ref().map(|d| d.id.clone()),
        Some(format!("{}-end", job.id))
    );
    let text = failed.map(|d| d.notice.message).unwrap_or_default();
    assert!(text.contains("ended failed (exit code 1)"), "{text}");
    let ok = from_event(
        &event(&job, EventSource::Scheduler, finished("succeeded")),
        &job,
    );
    assert!(ok.is_none());
    // Only the scheduler says a job finished.
    assert!(from_event(&event(&job, node("node001"), finished("failed")), &job).is_none());
}

#[test]
fn a_preemption_is_a_nodes_exit_marked_preempted() {
    let job = record(&[NotifyEvent::Preempt], running(None));
    let exited = |preempted| JobEventKind::Exited {
        exit_code: -1,
        signal: Some(15),
        cancelled: false,
        timed_out: false,
        preempted,
        lost: false,
        out_of_memory: false,
        usage: None,
    };
    let told = from_event(&event(&job, node("node001"), exited(true)), &job);
    assert!(matches!(
        told.map(|d| d.notice.kind),
        Some(NoticeKind::Preempted { attempt: 1 })
    ));
    assert!(from_event(&event(&job, node("node001"), exited(false)), &job).is_none());
}

#[test]
fn an_array_is_told_once_when_its_last_task_ends() {
    let array_id = JobId::random();
    let task = |index, state| {
        let mut r = record(&[NotifyEvent::End], state);
        r.spec.array = Some(ArrayMember {
            array_id: array_id.clone(),
            index,
            max_running: None,
        });
        r
    };
    let first = task(0, ended(JobState::Succeeded));
    let waiting = JobState::Queued(Waiting::new(WaitReason::Resources));
    let second = task(1, waiting);
    let finish = event(&first, EventSource::Scheduler, finished("succeeded"));
    // No notice per task.
    assert!(from_event(&finish, &first).is_none());
    assert!(ends_array_task(&finish, &first));
    let now = mgpu_protocol::now();
    assert!(array_ended(&first, &[first.clone(), second.clone()], now).is_none());
    let second = task(1, ended(JobState::Failed));
    let other = record(&[NotifyEvent::End], ended(JobState::Failed));
    let summary = array_ended(&first, &[first.clone(), second, other], now);
    assert_eq!(
        summary.as_ref().map(|d| d.id.clone()),
        Some(format!("{array_id}-array-end"))
    );
    assert!(matches!(
        summary.map(|d| d.notice.kind),
        Some(NoticeKind::ArrayEnded {
            tasks: 2,
            succeeded: 1,
            failed: 1,
            other: 0,
            ..
        })
    ));
}

#[test]
fn time80_comes_at_four_fifths_of_the_limit_of_a_running_attempt() {
    let now = mgpu_protocol::now();
    let mut job = record(
        &[NotifyEvent::Time80],
        running(Some(now - Duration::seconds(79))),
    );
    job.spec.time_limit_secs = Some(100);
    assert!(time80(&job, now).is_none());
    let told = time80(&job, now + Duration::seconds(1));
    assert_eq!(told.map(|d| d.id), Some(format!("{}-1-time80", job.id)));
    job.spec.notify = vec![NotifyEvent::End];
    assert!(time80(&job, now + Duration::seconds(50)).is_none());
    let unlimited = record(&[NotifyEvent::Time80], running(Some(now)));
    assert!(time80(&unlimited, now + Duration::days(300)).is_none());
}
