//! Stories and properties of a job's lifecycle.

use std::collections::BTreeMap;

use chrono::TimeZone;
use proptest::prelude::*;

use super::*;
use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{GpuShare, JobSpec, Launch, NodeShare, Run, Waiting};
use mgpu_protocol::report::{Exit, ReportKind};
use mgpu_protocol::submit::SubmitRequest;

// ---------------------------------------------------------------------------------------------
// Builders

fn t0() -> Timestamp {
    chrono::Utc
        .timestamp_opt(1_700_000_000, 0)
        .single()
        .unwrap_or_default()
}

/// `seconds` after [`t0`].
pub(super) fn at(seconds: i64) -> Timestamp {
    t0() + chrono::Duration::seconds(seconds)
}

fn id(n: u32) -> JobId {
    format!("{n:032x}")
        .parse()
        .unwrap_or_else(|_| JobId::random())
}

fn limits() -> Limits {
    Limits { max_attempts: 3 }
}

fn gpus(indices: &[u32]) -> Vec<GpuShare> {
    indices
        .iter()
        .map(|index| GpuShare {
            index: *index,
            amount: GpuAmount::ONE,
            mem_mib: 0,
        })
        .collect()
}

/// One GPU on one node.
pub(super) fn on(node: &str) -> Placement {
    Placement::single(node, gpus(&[0]))
}

/// Two GPUs on each of `nodes`, rank 0 first; `distributed`: a process on every node.
pub(super) fn across(nodes: &[&str], distributed: bool) -> Placement {
    let (first, rest) = nodes.split_first().unwrap_or((&"node001", &[]));
    Placement {
        node: (*first).to_owned(),
        gpus: gpus(&[0, 1]),
        peers: rest
            .iter()
            .map(|node| NodeShare {
                node: (*node).to_owned(),
                gpus: gpus(&[0, 1]),
            })
            .collect(),
        launch: Some(Launch {
            distributed,
            addresses: nodes.iter().map(|n| format!("{n}.cluster")).collect(),
            master_port: 29_500,
        }),
        cpus: 0,
        mem_host_mib: 0,
    }
}

fn spec() -> JobSpec {
    JobSpec::new(vec!["python".into(), "train.py".into()], "/tmp")
}

/// Alice's job, queued for GPUs, first attempt.
fn queued() -> JobRecord {
    JobRecord {
        id: id(1),
        user: "alice".into(),
        user_key: Some("UALICE".into()),
        spec: spec(),
        submitted_at: t0(),
        attempt: 1,
        state: JobState::Queued(Waiting::new(WaitReason::Resources)),
        last_request: None,
        preemptions: Vec::new(),
    }
}

/// Alice's job, assigned to `placement` at [`t0`], not yet confirmed by any agent.
fn assigned(placement: Placement) -> JobRecord {
    JobRecord {
        state: JobState::Running(Run::assigned(placement, t0())),
        ..queued()
    }
}

/// Alice's job, every process of it started at [`t0`] on `placement`.
pub(super) fn running(placement: Placement) -> JobRecord {
    let mut record = assigned(placement);
    if let JobState::Running(run) = &mut record.state {
        run.started_at = Some(t0());
        run.pid = Some(100);
        let launched: Vec<u32> = run
            .placement
            .launched_ranks()
            .iter()
            .map(|(rank, _)| *rank)
            .collect();
        if launched.len() > 1 {
            run.ranks_started = launched;
        }
    }
    record
}

fn person(name: &str) -> Requester {
    Requester {
        name: name.into(),
        admin: false,
    }
}

pub(super) fn alice() -> Requester {
    person("alice")
}

fn bob() -> Requester {
    person("bob")
}

fn root() -> Requester {
    Requester {
        name: "root".into(),
        admin: true,
    }
}

/// What `node` says about `record`'s current attempt, `seconds` after [`t0`].
pub(super) fn report(record: &JobRecord, node: &str, seconds: i64, kind: ReportKind) -> Input {
    Input::Report(AgentReport {
        job: record.id.clone(),
        attempt: record.attempt,
        node: node.into(),
        at: at(seconds),
        kind,
    })
}

fn exit_code(code: i32) -> ReportKind {
    ReportKind::Exited(Exit {
        exit_code: code,
        ..Exit::default()
    })
}

pub(super) fn exit(exit: Exit) -> ReportKind {
    ReportKind::Exited(exit)
}

/// Applies `input` to `record` at `seconds` after [`t0`], with the default [`limits`].
pub(super) fn step(record: &JobRecord, input: Input, seconds: i64) -> Transition {
    apply(record, input, at(seconds), &limits())
}

/// The record a transition stores (it must store one).
pub(super) fn stored(transition: &Transition) -> JobRecord {
    transition
        .record
        .clone()
        .unwrap_or_else(|| panic!("no record stored; effects: {:?}", transition.effects))
}

fn run_of(record: &JobRecord) -> &Run {
    match &record.state {
        JobState::Running(run) => run,
        other => panic!("not running: {other:?}"),
    }
}

pub(super) fn waiting_of(record: &JobRecord) -> &Waiting {
    match &record.state {
        JobState::Queued(waiting) => waiting,
        other => panic!("not queued: {other:?}"),
    }
}

fn ending_of(record: &JobRecord) -> &Ending {
    record
        .state
        .ending()
        .unwrap_or_else(|| panic!("not finished: {:?}", record.state))
}

fn reason_of(record: &JobRecord) -> Option<&str> {
    ending_of(record).reason.as_deref()
}

pub(super) fn kills(transition: &Transition) -> Vec<&Kill> {
    transition
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::Kill(kill) => Some(kill),
            _ => None,
        })
        .collect()
}

fn usages(transition: &Transition) -> Vec<(&str, f64, Timestamp)> {
    transition
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::AccountUsage {
                user,
                gpu_seconds,
                at,
            } => Some((user.as_str(), *gpu_seconds, *at)),
            _ => None,
        })
        .collect()
}

/// The `Finished` events a transition publishes: (state, exit code, reason).
fn finished(transition: &Transition) -> Vec<(&str, Option<i32>, Option<&str>)> {
    transition
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::Publish(JobEventKind::Finished {
                state,
                exit_code,
                reason,
            }) => Some((state.as_str(), *exit_code, reason.as_deref())),
            _ => None,
        })
        .collect()
}

fn only_logs(transition: &Transition) -> bool {
    transition
        .effects
        .iter()
        .all(|e| matches!(e, Effect::Log(_)))
}

fn refusal(action: Action) -> Effect {
    Effect::Refuse {
        action,
        reason: format!("job {} belongs to alice", id(1).short()),
    }
}

// ---------------------------------------------------------------------------------------------
// Cancel, hold and release

#[test]
fn a_queued_job_cancelled_by_its_owner_ends_cancelled_with_their_reason() {
    let cancel = Input::Cancel {
        by: alice(),
        reason: Some("reason".into()),
    };
    let transition = step(&queued(), cancel, 5);
    let record = stored(&transition);
    assert!(matches!(record.state, JobState::Cancelled(_)));
    assert_eq!(reason_of(&record), Some("cancelled by alice: reason"));
    let ending = ending_of(&record);
    assert_eq!(ending.ended_at, at(5));
    assert_eq!((ending.started_at, &ending.placement), (None, &None));
    assert_eq!(
        transition.effects.first(),
        Some(&Effect::Audit {
            action: Action::Cancel,
            accepted: true,
            detail: "was queued".into(),
        })
    );
    assert_eq!(
        finished(&transition),
        vec![("cancelled", None, Some("cancelled by alice: reason"))]
    );
    assert!(kills(&transition).is_empty());
    assert!(usages(&transition).is_empty(), "it never ran");
}

#[test]
fn a_running_job_cancelled_is_killed_then_ends_cancelled_when_its_agent_says_so() {
    let job = running(on("node001"));
    let cancel = Input::Cancel {
        by: alice(),
        reason: Some("no longer needed".into()),
    };
    let transition = step(&job, cancel, 10);
    let cancelling = stored(&transition);
    assert_eq!(
        run_of(&cancelling).cancel_requested_by.as_deref(),
        Some("alice")
    );
    assert!(
        finished(&transition).is_empty(),
        "it ends when its process does"
    );
    assert_eq!(
        kills(&transition),
        vec![&Kill {
            attempt: 1,
            placement: on("node001"),
            except: None,
            reason: "cancelled by alice: no longer needed".into(),
            requeue: false,
            warning: None,
            best_effort: false,
        }]
    );
    assert_eq!(
        transition.effects.first(),
        Some(&Effect::Audit {
            action: Action::Cancel,
            accepted: true,
            detail: "was running".into(),
        })
    );

    // A second cancel while the kill is on its way sends nothing more.
    let again = step(
        &cancelling,
        Input::Cancel {
            by: alice(),
            reason: None,
        },
        11,
    );
    assert_eq!(again.record, None);
    assert!(kills(&again).is_empty());

    let killed = Exit {
        exit_code: 143,
        signal: Some(15),
        cancelled: true,
        ..Exit::default()
    };
    let end = step(
        &cancelling,
        report(&cancelling, "node001", 12, exit(killed)),
        12,
    );
    let ended = stored(&end);
    assert!(matches!(ended.state, JobState::Cancelled(_)));
    assert_eq!(reason_of(&ended), Some("cancelled by alice"));
    assert_eq!(ending_of(&ended).exit_code, Some(143));
    assert_eq!(ending_of(&ended).signal, Some(15));
    assert_eq!(ending_of(&ended).started_at, Some(t0()));
    assert_eq!(
        finished(&end),
        vec![("cancelled", Some(143), Some("cancelled by alice"))]
    );
    assert_eq!(usages(&end), vec![("alice", 12.0, at(12))]);
}

#[test]
fn a_cancelled_job_whose_process_exits_by_itself_still_ends_cancelled() {
    let job = running(on("node001"));
    let cancelling = stored(&step(
        &job,
        Input::Cancel {
            by: alice(),
            reason: None,
        },
        10,
    ));
    let ended = stored(&step(
        &cancelling,
        report(&cancelling, "node001", 11, exit_code(0)),
        11,
    ));
    assert!(matches!(ended.state, JobState::Cancelled(_)));
    assert_eq!(reason_of(&ended), Some("cancelled by alice"));
}

#[test]
fn another_users_cancel_hold_or_release_is_refused() {
    for job in [queued(), running(on("node001"))] {
        let cancel = step(
            &job,
            Input::Cancel {
                by: bob(),
                reason: Some("mine now".into()),
            },
            1,
        );
        assert_eq!(cancel.record, None);
        assert_eq!(cancel.effects, vec![refusal(Action::Cancel)]);
        let hold = step(
            &job,
            Input::Hold {
                by: bob(),
                order: None,
            },
            1,
        );
        assert_eq!(hold.record, None);
        assert_eq!(hold.effects, vec![refusal(Action::Hold)]);
        let release = step(
            &job,
            Input::Release {
                by: bob(),
                order: None,
            },
            1,
        );
        assert_eq!(release.record, None);
        assert_eq!(release.effects, vec![refusal(Action::Release)]);
    }
}

#[test]
fn a_hold_delivered_again_after_a_later_release_is_not_applied() {
    let order = |sequence, redelivered| {
        Some(StreamOrder {
            sequence,
            redelivered,
            stored_at: t0(),
        })
    };
    let hold = |order| Input::Hold { by: root(), order };
    let held = stored(&step(&queued(), hold(order(10, false)), 1));
    assert_eq!(held.last_request, Some(10));
    let release = Input::Release {
        by: root(),
        order: order(12, false),
    };
    let released = stored(&step(&held, release, 2));
    assert_eq!(waiting_of(&released).held_by, None);
    // The hold's acknowledgement was lost: JetStream delivers it again, after the release.
    let again = step(&released, hold(order(10, true)), 3);
    assert_eq!(again.record, None, "{again:?}");
    // A later hold, or a first delivery (a stream created again starts over), applies.
    let later = stored(&step(&released, hold(order(13, true)), 4));
    assert_eq!(waiting_of(&later).held_by.as_deref(), Some("root"));
    let anew = stored(&step(&released, hold(order(3, false)), 5));
    assert_eq!(anew.last_request, Some(3));
    // A release while it runs changes nothing but the sequence: the older hold, delivered
    // again once the job is back in the queue, is not applied.
    let mut job = running(on("node001"));
    job.last_request = Some(10);
    let release = Input::Release {
        by: root(),
        order: order(12, false),
    };
    let noted = stored(&step(&job, release, 6));
    assert_eq!((noted.last_request, &noted.state), (Some(12), &job.state));
    let mut requeued = queued();
    requeued.last_request = noted.last_request;
    assert_eq!(step(&requeued, hold(order(10, true)), 7).record, None);
}

#[test]
fn an_admin_may_cancel_and_hold_anyones_job() {
    let cancelled = stored(&step(
        &queued(),
        Input::Cancel {
            by: root(),
            reason: None,
        },
        1,
    ));
    assert_eq!(reason_of(&cancelled), Some("cancelled by root"));
    let held = stored(&step(
        &queued(),
        Input::Hold {
            by: root(),
            order: None,
        },
        1,
    ));
    assert_eq!(waiting_of(&held).held_by.as_deref(), Some("root"));
    let job = running(on("node001"));
    let cancelling = stored(&step(
        &job,
        Input::Cancel {
            by: root(),
            reason: None,
        },
        1,
    ));
    assert_eq!(
        run_of(&cancelling).cancel_requested_by.as_deref(),
        Some("root")
    );
}

#[test]
fn hold_keeps_a_queued_job_waiting_and_release_lets_it_go() {
    let mut job = queued();
    if let JobState::Queued(waiting) = &mut job.state {
        waiting.enqueued_at = Some(at(3));
    }
    let transition = step(
        &job,
        Input::Hold {
            by: alice(),
            order: None,
        },
        5,
    );
    let held = stored(&transition);
    assert_eq!(
        waiting_of(&held),
        &Waiting {
            reason: WaitReason::Held,
            held_by: Some("alice".into()),
            enqueued_at: Some(at(3)),
            not_before: None,
            previous_stop: None,
        }
    );
    assert_eq!(
        transition.effects.first(),
        Some(&Effect::Audit {
            action: Action::Hold,
            accepted: true,
            detail: "done".into(),
        })
    );
    let transition = step(
        &held,
        Input::Release {
            by: alice(),
            order: None,
        },
        6,
    );
    let released = stored(&transition);
    assert_eq!(waiting_of(&released).held_by, None);
    assert_eq!(
        waiting_of(&released).enqueued_at,
        Some(at(3)),
        "its place in line"
    );
    assert_eq!(
        transition.effects.first(),
        Some(&Effect::Audit {
            action: Action::Release,
            accepted: true,
            detail: "done".into(),
        })
    );
}

#[test]
fn holding_or_releasing_a_job_that_is_not_queued_changes_nothing() {
    let job = running(on("node001"));
    for (input, action) in [
        (
            Input::Hold {
                by: alice(),
                order: None,
            },
            Action::Hold,
        ),
        (
            Input::Release {
                by: alice(),
                order: None,
            },
            Action::Release,
        ),
    ] {
        let transition = step(&job, input, 1);
        assert_eq!(transition.record, None);
        assert_eq!(
            transition.effects.first(),
            Some(&Effect::Audit {
                action,
                accepted: true,
                detail: "not queued: nothing to do".into(),
            })
        );
        assert!(kills(&transition).is_empty());
    }
}

// ---------------------------------------------------------------------------------------------
// Agents' reports

#[test]
fn a_started_report_records_the_start_time_and_its_pid() {
    let job = assigned(on("node001"));
    let started = stored(&step(
        &job,
        report(&job, "node001", 2, ReportKind::Started { pid: 42 }),
        2,
    ));
    let run = run_of(&started);
    assert_eq!(run.started_at, Some(at(2)));
    assert_eq!(run.pid, Some(42));
    assert!(
        run.ranks_started.is_empty(),
        "one process: no ranks to count"
    );
    // A repeated report keeps the first start time.
    let again = stored(&step(
        &started,
        report(&started, "node001", 9, ReportKind::Started { pid: 42 }),
        9,
    ));
    assert_eq!(run_of(&again).started_at, Some(at(2)));
}

#[test]
fn only_rank_0_of_a_distributed_job_sets_its_pid() {
    let job = assigned(across(&["a", "b"], true));
    let rank1 = stored(&step(
        &job,
        report(&job, "b", 2, ReportKind::Started { pid: 7 }),
        2,
    ));
    assert_eq!(run_of(&rank1).started_at, Some(at(2)));
    assert_eq!(run_of(&rank1).pid, None);
    assert_eq!(run_of(&rank1).ranks_started, vec![1]);
    let both = stored(&step(
        &rank1,
        report(&rank1, "a", 3, ReportKind::Started { pid: 5 }),
        3,
    ));
    let run = run_of(&both);
    assert_eq!(run.started_at, Some(at(2)), "the first rank's start");
    assert_eq!(run.pid, Some(5));
    assert_eq!(run.ranks_started, vec![1, 0]);
}

#[test]
fn exit_status_decides_how_the_job_ends() {
    let job = running(on("node001"));
    let cases = [
        (exit_code(0), "succeeded", Some(0), None),
        (exit_code(3), "failed", Some(3), Some("exit code 3")),
        (
            exit(Exit {
                exit_code: 137,
                signal: Some(9),
                ..Exit::default()
            }),
            "failed",
            Some(137),
            Some("killed by signal 9"),
        ),
        (
            exit(Exit {
                exit_code: 143,
                signal: Some(15),
                timed_out: true,
                ..Exit::default()
            }),
            "timed_out",
            Some(143),
            Some("time limit reached"),
        ),
        (
            exit(Exit {
                exit_code: 143,
                signal: Some(15),
                cancelled: true,
                ..Exit::default()
            }),
            "cancelled",
            Some(143),
            Some("cancelled by an administrator"),
        ),
    ];
    for (kind, state, code, reason) in cases {
        let transition = step(&job, report(&job, "node001", 30, kind.clone()), 30);
        let record = stored(&transition);
        assert_eq!(record.state.name(), state, "{kind:?}");
        assert_eq!(reason_of(&record), reason, "{kind:?}");
        assert_eq!(ending_of(&record).exit_code, code);
        assert_eq!(ending_of(&record).placement, Some(on("node001")));
        assert_eq!(ending_of(&record).ended_at, at(30));
        assert_eq!(finished(&transition), vec![(state, code, reason)]);
        assert!(kills(&transition).is_empty(), "one process: nothing left");
    }
}

#[test]
fn a_job_killed_over_its_host_memory_fails_out_of_memory_and_keeps_what_it_used() {
    let job = running(on("node001"));
    let usage = mgpu_protocol::host::JobUsage {
        peak_mem_host_bytes: Some(64 << 20),
        cpu_time_ms: Some(420),
        gpu_peak_mem: Vec::new(),
        idle_gpu_secs: None,
    };
    // Whatever its exit code: a shell whose child was killed may still exit 0.
    for code in [0, 137] {
        let oom = exit(Exit {
            exit_code: code,
            signal: (code == 137).then_some(9),
            out_of_memory: true,
            usage: Some(usage.clone()),
            ..Exit::default()
        });
        let record = stored(&step(&job, report(&job, "node001", 30, oom), 30));
        assert_eq!(record.state.name(), "failed");
        assert_eq!(reason_of(&record), Some("out of memory (host)"));
        assert_eq!(ending_of(&record).usage.as_ref(), Some(&usage));
    }
    // A clean exit keeps its usage too.
    let clean = exit(Exit {
        usage: Some(usage.clone()),
        ..Exit::default()
    });
    let record = stored(&step(&job, report(&job, "node001", 30, clean), 30));
    assert_eq!(record.state.name(), "succeeded");
    assert_eq!(ending_of(&record).usage.as_ref(), Some(&usage));
}

#[test]
fn a_process_that_could_not_start_fails_the_job_saying_why() {
    let job = assigned(on("node001"));
    let transition = step(
        &job,
        report(
            &job,
            "node001",
            2,
            ReportKind::FailedToStart {
                error: "no such directory /data".into(),
            },
        ),
        2,
    );
    let record = stored(&transition);
    assert!(matches!(record.state, JobState::Failed(_)));
    assert_eq!(
        reason_of(&record),
        Some("could not start: no such directory /data")
    );
    assert_eq!(ending_of(&record).started_at, None);
    assert!(usages(&transition).is_empty());
    assert!(kills(&transition).is_empty());
}

#[test]
fn a_rank_that_could_not_start_fails_a_distributed_job_and_stops_the_others() {
    let job = assigned(across(&["a", "b"], true));
    let transition = step(
        &job,
        report(
            &job,
            "b",
            2,
            ReportKind::FailedToStart {
                error: "no shell".into(),
            },
        ),
        2,
    );
    assert_eq!(
        reason_of(&stored(&transition)),
        Some("rank 1 (b): could not start: no shell")
    );
    let kills = kills(&transition);
    assert_eq!(kills.len(), 1);
    assert_eq!(kills[0].except.as_deref(), Some("b"));
    assert!(kills[0].best_effort);
}

/// Found by the simulator: the first rank's `preempted` exit requeued the job while the other
/// ranks were still in their kill grace, and the next attempt started beside them.
#[test]
fn a_distributed_job_at_its_slice_end_is_requeued_only_once_every_rank_stopped() {
    let job = running(across(&["a", "b"], true));
    let preempted = || {
        exit(Exit {
            exit_code: 143,
            signal: Some(15),
            preempted: true,
            ..Exit::default()
        })
    };
    let first = step(&job, report(&job, "a", 10, preempted()), 10);
    let job = stored(&first);
    assert!(
        matches!(job.state, JobState::Running(_)),
        "rank b still runs"
    );
    assert_eq!(job.attempt, 1);
    let second = step(&job, report(&job, "b", 12, preempted()), 12);
    let requeued = stored(&second);
    assert!(matches!(requeued.state, JobState::Queued(_)));
    assert_eq!(requeued.attempt, 2);
}

#[test]
fn a_distributed_job_succeeds_only_when_every_rank_exited_0() {
    let mut job = running(across(&["a", "b", "c"], true));
    for (node, seconds) in [("a", 10), ("a", 11), ("c", 12)] {
        let transition = step(&job, report(&job, node, seconds, exit_code(0)), seconds);
        job = stored(&transition);
        assert!(matches!(job.state, JobState::Running(_)), "after {node}");
        assert!(finished(&transition).is_empty());
        assert!(
            usages(&transition).is_empty(),
            "the job still holds its GPUs"
        );
    }
    assert_eq!(run_of(&job).ranks_done, vec![0, 2], "rank 0 counted once");
    let transition = step(&job, report(&job, "b", 20, exit_code(0)), 20);
    let done = stored(&transition);
    assert!(matches!(done.state, JobState::Succeeded(_)));
    assert_eq!(finished(&transition), vec![("succeeded", Some(0), None)]);
    assert!(kills(&transition).is_empty(), "every rank already ended");
    // Three nodes of two GPUs for 20 seconds.
    assert_eq!(usages(&transition), vec![("alice", 120.0, at(20))]);
}

#[test]
fn a_failing_rank_ends_a_distributed_job_and_kills_the_others() {
    let job = running(across(&["a", "b", "c"], true));
    let done = stored(&step(&job, report(&job, "a", 5, exit_code(0)), 5));
    let transition = step(&done, report(&done, "b", 10, exit_code(3)), 10);
    let record = stored(&transition);
    assert!(matches!(record.state, JobState::Failed(_)));
    assert_eq!(reason_of(&record), Some("rank 1 (b): exit code 3"));
    assert_eq!(
        kills(&transition),
        vec![&Kill {
            attempt: 1,
            placement: across(&["a", "b", "c"], true),
            except: Some("b".into()),
            reason: "another rank of the job ended".into(),
            requeue: false,
            warning: None,
            best_effort: true,
        }]
    );
    assert_eq!(usages(&transition).len(), 1);
}

#[test]
fn a_rank_stopped_at_the_end_of_its_time_slice_requeues_the_job_even_when_it_exits_0() {
    let job = running(across(&["a", "b"], true));
    let preempting = stored(&step(&job, Input::SliceEnd, 10));
    let stopped = || {
        exit(Exit {
            preempted: true,
            ..Exit::default()
        })
    };
    // The slice's end stopped every rank: nothing more to kill, and the job waits for them.
    let transition = step(&preempting, report(&preempting, "b", 12, stopped()), 12);
    let stopping = stored(&transition);
    assert_eq!(stopping.attempt, 1);
    assert!(kills(&transition).is_empty());
    let transition = step(&stopping, report(&stopping, "a", 13, stopped()), 13);
    let requeued = stored(&transition);
    assert_eq!(requeued.attempt, 2);
    assert_eq!(waiting_of(&requeued).enqueued_at, Some(at(13)));
}

#[test]
fn a_rank_killed_on_request_ends_a_distributed_job_cancelled_even_when_it_exits_0() {
    let job = running(across(&["a", "b"], true));
    let killed = exit(Exit {
        cancelled: true,
        ..Exit::default()
    });
    let transition = step(&job, report(&job, "a", 12, killed), 12);
    let ended = stored(&transition);
    assert!(matches!(ended.state, JobState::Cancelled(_)));
    assert_eq!(reason_of(&ended), Some("cancelled by an administrator"));
    assert_eq!(kills(&transition).len(), 1, "the other rank is stopped");
}

#[test]
fn a_multi_node_job_that_is_not_distributed_runs_on_rank_0_only() {
    let job = running(across(&["a", "b"], false));
    let from_peer = step(&job, report(&job, "b", 5, exit_code(0)), 5);
    assert_eq!(from_peer.record, None, "no process runs on b");
    assert!(only_logs(&from_peer));
    let transition = step(&job, report(&job, "a", 5, exit_code(0)), 5);
    assert!(matches!(stored(&transition).state, JobState::Succeeded(_)));
    assert!(kills(&transition).is_empty());
    let transition = step(&job, report(&job, "a", 5, exit_code(1)), 5);
    assert_eq!(reason_of(&stored(&transition)), Some("exit code 1"));
    assert!(
        kills(&transition).is_empty(),
        "a single process: nothing left"
    );
}

#[test]
fn a_report_about_another_attempt_or_node_or_a_job_not_running_changes_nothing() {
    let job = running(on("node001"));
    let mut old = AgentReport {
        job: job.id.clone(),
        attempt: 0,
        node: "node001".into(),
        at: at(5),
        kind: exit_code(1),
    };
    for attempt in [0, 2] {
        old.attempt = attempt;
        let transition = step(&job, Input::Report(old.clone()), 5);
        assert_eq!(transition.record, None, "attempt {attempt}");
        assert!(only_logs(&transition));
    }
    let elsewhere = step(&job, report(&job, "node009", 5, exit_code(1)), 5);
    assert_eq!(elsewhere.record, None);
    assert!(only_logs(&elsewhere));
    for other in [
        queued(),
        stored(&step(&job, report(&job, "node001", 5, exit_code(0)), 5)),
    ] {
        let transition = step(&other, report(&other, "node001", 6, exit_code(1)), 6);
        assert_eq!(transition.record, None, "{}", other.state.name());
        assert!(only_logs(&transition));
    }
}

// ---------------------------------------------------------------------------------------------
// Time slices and lost nodes

#[test]
fn a_preempted_job_goes_back_to_the_queue_as_its_next_attempt() {
    let job = running(on("node001"));
    let transition = step(&job, Input::SliceEnd, 90);
    let preempting = stored(&transition);
    assert!(run_of(&preempting).preempt_requested);
    assert_eq!(
        kills(&transition),
        vec![&Kill {
            attempt: 1,
            placement: on("node001"),
            except: None,
            reason: SLICE_OVER.into(),
            requeue: true,
            warning: None,
            best_effort: false,
        }]
    );
    let stopped = Exit {
        exit_code: 143,
        signal: Some(15),
        preempted: true,
        ..Exit::default()
    };
    let transition = step(
        &preempting,
        report(&preempting, "node001", 100, exit(stopped)),
        100,
    );
    let requeued = stored(&transition);
    assert_eq!(requeued.attempt, 2);
    assert_eq!(
        waiting_of(&requeued),
        &Waiting {
            reason: WaitReason::Resources,
            held_by: None,
            enqueued_at: Some(at(100)),
            not_before: None,
            previous_stop: Some("its time slice ended".into()),
        }
    );
    assert!(
        transition
            .effects
            .contains(&Effect::Publish(JobEventKind::Queued {
                reason: WaitReason::Resources,
            }))
    );
    assert!(finished(&transition).is_empty());
    assert_eq!(usages(&transition), vec![("alice", 100.0, at(100))]);
}

#[test]
fn a_time_slice_ends_once_per_attempt_and_never_for_a_job_being_cancelled() {
    let job = running(on("node001"));
    let preempting = stored(&step(&job, Input::SliceEnd, 10));
    assert_eq!(
        step(&preempting, Input::SliceEnd, 11),
        Transition::default()
    );
    let cancelling = stored(&step(
        &job,
        Input::Cancel {
            by: alice(),
            reason: None,
        },
        10,
    ));
    assert_eq!(
        step(&cancelling, Input::SliceEnd, 11),
        Transition::default()
    );
    for other in [
        queued(),
        stored(&step(&job, report(&job, "node001", 5, exit_code(0)), 5)),
    ] {
        assert_eq!(step(&other, Input::SliceEnd, 11), Transition::default());
    }
    // The next attempt gets its own time slice.
    let stopped = exit(Exit {
        exit_code: 143,
        preempted: true,
        ..Exit::default()
    });
    let requeued = stored(&step(
        &preempting,
        report(&preempting, "node001", 20, stopped),
        20,
    ));
    let again = stored(&step(
        &requeued,
        Input::Start {
            placement: on("node002"),
        },
        30,
    ));
    let transition = step(&again, Input::SliceEnd, 40);
    assert_eq!(kills(&transition).len(), 1);
    assert_eq!(kills(&transition)[0].attempt, 2);
}

#[test]
fn a_cancel_during_a_time_slice_wins_over_the_requeue() {
    let job = running(on("node001"));
    let preempting = stored(&step(&job, Input::SliceEnd, 10));
    let transition = step(
        &preempting,
        Input::Cancel {
            by: alice(),
            reason: None,
        },
        11,
    );
    assert_eq!(kills(&transition).len(), 1);
    assert!(!kills(&transition)[0].requeue);
    let cancelling = stored(&transition);
    let stopped = exit(Exit {
        exit_code: 143,
        signal: Some(15),
        preempted: true,
        ..Exit::default()
    });
    let transition = step(&cancelling, report(&cancelling, "node001", 12, stopped), 12);
    let ended = stored(&transition);
    assert!(matches!(ended.state, JobState::Cancelled(_)));
    assert_eq!(ended.attempt, 1);
    assert_eq!(reason_of(&ended), Some("cancelled by alice"));
    assert_eq!(usages(&transition).len(), 1);
}

#[test]
fn a_process_its_restarted_agent_stopped_is_requeued_as_the_next_attempt() {
    let job = running(on("node001"));
    let lost = exit(Exit {
        exit_code: 137,
        signal: Some(9),
        lost: true,
        ..Exit::default()
    });
    let transition = step(&job, report(&job, "node001", 50, lost), 50);
    let requeued = stored(&transition);
    assert_eq!(requeued.attempt, 2);
    let mut waiting = Waiting::new(WaitReason::Resources);
    waiting.previous_stop = Some("its agent on node001 restarted and stopped it".into());
    assert_eq!(waiting_of(&requeued), &waiting);
    assert!(finished(&transition).is_empty());
    assert_eq!(usages(&transition), vec![("alice", 50.0, at(50))]);
}

#[test]
fn a_job_on_a_lost_node_is_requeued_not_before_its_fence_only_when_that_is_later() {
    let job = running(on("node001"));
    for (fence, expected) in [
        (Some(30), Some(at(130))),
        (Some(0), None),
        (Some(-5), None),
        (None, None),
    ] {
        let lost = Input::NodeLost {
            why: "node001 stopped answering".into(),
            at: at(100),
            not_before: fence.map(|s| at(100 + s)),
        };
        let requeued = stored(&step(&job, lost, 101));
        assert_eq!(requeued.attempt, 2);
        let waiting = waiting_of(&requeued);
        assert_eq!(waiting.reason, WaitReason::Resources);
        assert_eq!(waiting.not_before, expected, "fence {fence:?}");
    }
}

#[test]
fn a_job_lost_at_its_last_attempt_ends_node_failed() {
    let mut job = running(on("node001"));
    job.attempt = 3;
    let lost = Input::NodeLost {
        why: "node001 stopped answering".into(),
        at: at(60),
        not_before: Some(at(90)),
    };
    let transition = step(&job, lost, 61);
    let record = stored(&transition);
    assert!(matches!(record.state, JobState::NodeFailed(_)));
    assert_eq!(record.attempt, 3);
    let reason = "node001 stopped answering; not requeued: 3 attempt(s) made, max_attempts is 3";
    assert_eq!(reason_of(&record), Some(reason));
    assert_eq!(ending_of(&record).ended_at, at(60));
    assert_eq!(
        finished(&transition),
        vec![("node_failed", None, Some(reason))]
    );
    assert_eq!(usages(&transition), vec![("alice", 60.0, at(60))]);
    // Its assignment may still wait on the lost node's stream: a kill follows it there
    // (simulator seed 30671: the purge failed, the node came back, the ended job started).
    assert_eq!(
        kills(&transition),
        vec![&Kill {
            attempt: 3,
            placement: on("node001"),
            except: None,
            reason: "node001 stopped answering".into(),
            requeue: false,
            warning: None,
            best_effort: true,
        }]
    );
    let requeued = running(on("node001"));
    let transition = step(
        &requeued,
        Input::NodeLost {
            why: "gone".into(),
            at: at(60),
            not_before: None,
        },
        61,
    );
    assert!(
        kills(&transition).is_empty(),
        "a requeued job's stale attempt is the heartbeats' to find"
    );

    let lost = exit(Exit {
        exit_code: 137,
        lost: true,
        ..Exit::default()
    });
    let record = stored(&step(&job, report(&job, "node001", 70, lost), 70));
    assert_eq!(
        reason_of(&record),
        Some(
            "its agent on node001 restarted and stopped it; not requeued: 3 attempt(s) made, \
             max_attempts is 3"
        )
    );
}

#[test]
fn a_no_requeue_job_whose_node_is_lost_ends_node_failed() {
    let mut job = running(on("node001"));
    job.spec.no_requeue = true;
    let lost = Input::NodeLost {
        why: "node001 stopped answering".into(),
        at: at(60),
        not_before: None,
    };
    let record = stored(&step(&job, lost, 61));
    assert!(matches!(record.state, JobState::NodeFailed(_)));
    assert_eq!(record.attempt, 1);
    assert_eq!(
        reason_of(&record),
        Some("node001 stopped answering; not requeued (--no-requeue)")
    );
}

#[test]
fn a_distributed_job_that_loses_a_node_stops_its_other_ranks() {
    let job = running(across(&["a", "b"], true));
    let lost = Input::NodeLost {
        why: "b stopped answering".into(),
        at: at(10),
        not_before: None,
    };
    let transition = step(&job, lost, 10);
    assert_eq!(stored(&transition).attempt, 2);
    let kills = kills(&transition);
    assert_eq!(kills.len(), 1);
    assert!(kills[0].best_effort);
    assert_eq!(kills[0].attempt, 1, "the lost attempt, not the next one");
}

#[test]
fn losing_a_node_changes_nothing_for_a_job_that_is_not_running() {
    let lost = Input::NodeLost {
        why: "node001 stopped answering".into(),
        at: at(10),
        not_before: None,
    };
    assert_eq!(step(&queued(), lost, 10), Transition::default());
}

// ---------------------------------------------------------------------------------------------
// Usage

#[test]
fn usage_is_counted_once_when_a_started_job_ends_and_never_for_one_that_never_started() {
    let started = running(across(&["a", "b"], false));
    let transition = step(&started, report(&started, "a", 30, exit_code(1)), 30);
    // Two nodes of two GPUs, all held for 30 seconds.
    assert_eq!(usages(&transition), vec![("alice", 120.0, at(30))]);

    let never = assigned(on("node001"));
    for input in [
        report(&never, "node001", 30, exit_code(1)),
        report(&never, "node001", 30, exit_code(0)),
        Input::NodeLost {
            why: "gone".into(),
            at: at(30),
            not_before: None,
        },
    ] {
        let transition = step(&never, input, 30);
        assert!(transition.record.is_some());
        assert!(usages(&transition).is_empty(), "{:?}", transition.effects);
    }
    let cancelled = step(
        &queued(),
        Input::Cancel {
            by: alice(),
            reason: None,
        },
        30,
    );
    assert!(usages(&cancelled).is_empty());
}

// ---------------------------------------------------------------------------------------------
// What the scheduler decides

#[test]
fn a_job_whose_node_is_lost_while_its_cancel_is_on_the_way_ends_cancelled_and_never_runs_again() {
    let job = running(on("node001"));
    let cancelling = stored(&step(
        &job,
        Input::Cancel {
            by: alice(),
            reason: None,
        },
        5,
    ));
    let lost = Input::NodeLost {
        why: "node node001 went offline".into(),
        at: at(10),
        not_before: None,
    };
    let transition = step(&cancelling, lost, 10);
    let ended = stored(&transition);
    assert!(matches!(ended.state, JobState::Cancelled(_)), "{ended:?}");
    assert_eq!(ended.attempt, 1, "not requeued");
    assert_eq!(
        reason_of(&ended),
        Some("cancelled by alice; node node001 went offline")
    );
    assert_eq!(ending_of(&ended).started_at, Some(t0()));
    assert_eq!(usages(&transition).len(), 1, "its GPU time still counts");
    let restarted = report(
        &cancelling,
        "node001",
        10,
        exit(Exit {
            lost: true,
            ..Exit::default()
        }),
    );
    let ended = stored(&step(&cancelling, restarted, 10));
    assert!(matches!(ended.state, JobState::Cancelled(_)), "{ended:?}");
}

#[test]
fn a_rank_that_could_not_start_after_another_started_counts_the_gpu_time_used() {
    let job = running(across(&["a", "b"], true));
    let failed = report(
        &job,
        "b",
        30,
        ReportKind::FailedToStart {
            error: "no such file".into(),
        },
    );
    let transition = step(&job, failed, 30);
    let ended = stored(&transition);
    assert_eq!(ending_of(&ended).started_at, Some(t0()));
    assert_eq!(usages(&transition).len(), 1);
    let never_started = assigned(across(&["a", "b"], true));
    let failed = report(
        &never_started,
        "b",
        30,
        ReportKind::FailedToStart {
            error: "no such file".into(),
        },
    );
    let transition = step(&never_started, failed, 30);
    assert_eq!(ending_of(&stored(&transition)).started_at, None);
    assert!(usages(&transition).is_empty());
}

#[test]
fn a_held_job_is_not_started_even_if_asked() {
    let held = stored(&step(
        &queued(),
        Input::Hold {
            by: alice(),
            order: None,
        },
        1,
    ));
    let transition = step(
        &held,
        Input::Start {
            placement: on("node001"),
        },
        2,
    );
    assert_eq!(transition.record, None);
    assert!(!transition.effects.contains(&Effect::Assign));
}

#[test]
fn only_a_queued_job_starts_and_it_is_recorded_before_it_is_assigned() {
    let placement = across(&["a", "b"], true);
    let transition = step(
        &queued(),
        Input::Start {
            placement: placement.clone(),
        },
        7,
    );
    let record = stored(&transition);
    assert_eq!(run_of(&record), &Run::assigned(placement.clone(), at(7)));
    assert_eq!(record.attempt, 1);
    assert_eq!(
        transition.effects,
        vec![
            Effect::Assign,
            Effect::Publish(JobEventKind::Assigned {
                placement: placement.clone(),
            }),
        ]
    );
    let job = running(on("node001"));
    let ended = stored(&step(&job, report(&job, "node001", 5, exit_code(0)), 5));
    for other in [job, ended] {
        let transition = step(
            &other,
            Input::Start {
                placement: placement.clone(),
            },
            8,
        );
        assert_eq!(transition.record, None, "{}", other.state.name());
        assert!(only_logs(&transition));
    }
}

#[test]
fn waiting_for_the_reason_already_recorded_changes_nothing() {
    assert_eq!(
        step(
            &queued(),
            Input::Wait {
                reason: WaitReason::Resources
            },
            1
        ),
        Transition::default()
    );
    let transition = step(
        &queued(),
        Input::Wait {
            reason: WaitReason::Priority,
        },
        1,
    );
    assert_eq!(
        waiting_of(&stored(&transition)).reason,
        WaitReason::Priority
    );
    assert_eq!(
        transition.effects,
        vec![Effect::Publish(JobEventKind::Queued {
            reason: WaitReason::Priority,
        })]
    );
    let job = running(on("node001"));
    let wait = Input::Wait {
        reason: WaitReason::Priority,
    };
    assert_eq!(step(&job, wait, 1), Transition::default());
}

#[test]
fn a_queued_job_that_can_never_run_is_rejected_as_failed() {
    let transition = step(
        &queued(),
        Input::Reject {
            reason: "no node has 9 GPUs".into(),
        },
        4,
    );
    let record = stored(&transition);
    assert!(matches!(record.state, JobState::Failed(_)));
    assert_eq!(reason_of(&record), Some("cannot run: no node has 9 GPUs"));
    assert_eq!(finished(&transition).len(), 1);
    let job = running(on("node001"));
    let reject = Input::Reject {
        reason: "no".into(),
    };
    assert_eq!(step(&job, reject, 4), Transition::default());
}

// ---------------------------------------------------------------------------------------------
// Submissions

fn signer() -> Signer {
    Signer {
        name: "alice".into(),
        key: "UALICE".into(),
    }
}

fn submission(user: &str, spec: JobSpec) -> SubmitRequest {
    SubmitRequest {
        id: id(7),
        user: user.into(),
        spec,
    }
}

#[test]
fn a_valid_submission_is_queued_under_its_signer_not_the_name_it_claims() {
    let transition = submit(submission("mallory", spec()), &signer(), None, at(1));
    let record = stored(&transition);
    assert_eq!(
        record,
        JobRecord {
            id: id(7),
            user: "alice".into(),
            user_key: Some("UALICE".into()),
            spec: spec(),
            submitted_at: at(1),
            attempt: 1,
            state: JobState::Queued(Waiting::new(WaitReason::Submitted)),
            last_request: None,
            preemptions: Vec::new(),
        }
    );
    let audit = Effect::Audit {
        action: Action::Submit,
        accepted: true,
        detail: "queued".into(),
    };
    let queued = Effect::Publish(JobEventKind::Queued {
        reason: WaitReason::Submitted,
    });
    let audit_at = transition.effects.iter().position(|e| *e == audit);
    let queued_at = transition.effects.iter().position(|e| *e == queued);
    assert!(
        audit_at.is_some() && audit_at < queued_at,
        "{:?}",
        transition.effects
    );
}

#[test]
fn an_invalid_submission_is_recorded_as_failed_saying_why() {
    let mut bad = spec();
    bad.workdir = "relative/dir".into();
    let transition = submit(submission("alice", bad), &signer(), None, at(1));
    let record = stored(&transition);
    assert!(matches!(record.state, JobState::Failed(_)));
    let reason = reason_of(&record).unwrap_or_default().to_owned();
    assert!(reason.starts_with("invalid submission: "), "{reason}");
    assert!(reason.contains("absolute"), "{reason}");
    assert!(transition.effects.contains(&Effect::Audit {
        action: Action::Submit,
        accepted: false,
        detail: "rejected".into(),
    }));
    assert!(
        transition
            .effects
            .contains(&Effect::Publish(JobEventKind::Rejected { reason }))
    );
}

#[test]
fn a_duplicate_submission_is_recorded_as_failed_naming_its_twin() {
    let twin = id(3);
    let transition = submit(
        submission("alice", spec()),
        &signer(),
        Some(NotAdded::Duplicate(&twin)),
        at(1),
    );
    let record = stored(&transition);
    assert!(matches!(record.state, JobState::Failed(_)));
    let reason = format!("not added: identical to job {} (--dedup)", twin.short());
    assert_eq!(reason_of(&record), Some(reason.as_str()));
    assert!(
        transition
            .effects
            .contains(&Effect::Publish(JobEventKind::Rejected { reason }))
    );
}

#[test]
fn a_submission_over_a_limit_is_recorded_as_failed_naming_the_limit() {
    let why = "over the limit max_jobs_queued = 2 ([limits.default]): alice has 2 jobs queued";
    let over = Some(NotAdded::OverLimit(why.to_owned()));
    let transition = submit(submission("alice", spec()), &signer(), over, at(1));
    let record = stored(&transition);
    assert!(matches!(record.state, JobState::Failed(_)));
    let reason = format!("not added: {why}");
    assert_eq!(reason_of(&record), Some(reason.as_str()));
    assert!(
        transition
            .effects
            .contains(&Effect::Publish(JobEventKind::Rejected { reason }))
    );
}

#[test]
fn a_submission_whose_sender_is_not_a_user_name_makes_no_record() {
    let transition = submit(submission("not a name", spec()), &signer(), None, at(1));
    assert_eq!(transition.record, None);
    let rejected = transition.effects.iter().any(|e| {
        matches!(e, Effect::Publish(JobEventKind::Rejected { reason })
            if reason.starts_with("invalid submission: "))
    });
    assert!(rejected, "{:?}", transition.effects);
    assert!(
        !transition.effects.iter().any(|e| matches!(
            e,
            Effect::Audit { .. } | Effect::Publish(JobEventKind::Queued { .. })
        )),
        "{:?}",
        transition.effects
    );
}

// ---------------------------------------------------------------------------------------------
// Properties

/// Nodes placements are drawn from; reports may also come from `n9`, which never runs a job.
const POOL: [&str; 4] = ["n1", "n2", "n3", "n4"];

fn arb_placement() -> impl Strategy<Value = Placement> {
    (1usize..=3, any::<bool>(), 0usize..POOL.len()).prop_map(|(count, distributed, first)| {
        let names: Vec<&str> = (0..count).map(|i| POOL[(first + i) % POOL.len()]).collect();
        if count == 1 && !distributed {
            on(names[0])
        } else {
            across(&names, distributed)
        }
    })
}

/// A run on `placement`: started or not, being cancelled or preempted, some ranks done.
fn arb_run() -> impl Strategy<Value = Run> {
    (
        arb_placement(),
        any::<bool>(),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.2),
        0usize..3,
    )
        .prop_map(|(placement, started, cancelling, preempting, done)| {
            let mut run = Run::assigned(placement, t0());
            if started {
                let launched: Vec<u32> = run
                    .placement
                    .launched_ranks()
                    .iter()
                    .map(|(rank, _)| *rank)
                    .collect();
                run.started_at = Some(t0());
                run.pid = Some(100);
                if launched.len() > 1 {
                    run.ranks_done = launched
                        .iter()
                        .copied()
                        .take(done.min(launched.len() - 1))
                        .collect();
                    run.ranks_started = launched;
                }
            }
            run.cancel_requested_by = cancelling.then(|| "alice".to_owned());
            run.preempt_requested = preempting;
            run
        })
}

fn arb_ending() -> impl Strategy<Value = Ending> {
    (
        prop::option::of(arb_placement()),
        any::<bool>(),
        prop::option::of(0i32..4),
    )
        .prop_map(|(placement, started, exit_code)| Ending {
            started_at: (started && placement.is_some()).then(t0),
            placement,
            ended_at: t0(),
            exit_code,
            signal: None,
            reason: Some("it ended".into()),
            usage: None,
        })
}

fn arb_state() -> impl Strategy<Value = JobState> {
    prop_oneof![
        2 => (any::<bool>(), any::<bool>()).prop_map(|(held, fenced)| {
            let mut waiting = Waiting::new(if held { WaitReason::Held } else { WaitReason::Resources });
            waiting.held_by = held.then(|| "alice".to_owned());
            waiting.not_before = fenced.then(|| at(15));
            JobState::Queued(waiting)
        }),
        4 => arb_run().prop_map(JobState::Running),
        2 => (0u8..5, arb_ending()).prop_map(|(kind, ending)| match kind {
            0 => JobState::Succeeded(ending),
            1 => JobState::Failed(ending),
            2 => JobState::Cancelled(ending),
            3 => JobState::TimedOut(ending),
            _ => JobState::NodeFailed(ending),
        }),
    ]
}

fn arb_record() -> impl Strategy<Value = JobRecord> {
    (arb_state(), 1u32..=4, prop::bool::weighted(0.2)).prop_map(|(state, attempt, no_requeue)| {
        let mut record = queued();
        record.state = state;
        record.attempt = attempt;
        record.spec.no_requeue = no_requeue;
        record
    })
}

fn arb_exit() -> impl Strategy<Value = Exit> {
    (
        prop::sample::select(vec![0, 0, 0, 1, 3, 137, 143]),
        prop::option::weighted(0.2, prop::sample::select(vec![9, 15])),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.15),
        prop::bool::weighted(0.1),
    )
        .prop_map(
            |(exit_code, signal, cancelled, timed_out, preempted, lost)| Exit {
                exit_code,
                signal,
                cancelled,
                timed_out,
                preempted,
                lost,
                out_of_memory: false,
                usage: None,
            },
        )
}

fn arb_report_kind() -> impl Strategy<Value = ReportKind> {
    prop_oneof![
        2 => (1u32..100_000).prop_map(|pid| ReportKind::Started { pid }),
        1 => Just(ReportKind::FailedToStart { error: "no shell".into() }),
        5 => arb_exit().prop_map(ReportKind::Exited),
    ]
}

/// An input, drawn before the record it applies to is known: [`resolve`] fills in the rest.
#[derive(Clone, Debug)]
enum Step {
    Cancel {
        who: usize,
        reason: bool,
    },
    Hold {
        who: usize,
    },
    Release {
        who: usize,
    },
    /// A report about the current attempt plus `attempt` (-1, 0 or 1), from the record's
    /// `node`th node (any of them, launched or not) or, from 6 on, a node it never ran on.
    Report {
        attempt: i64,
        node: usize,
        kind: ReportKind,
    },
    Start(Placement),
    Wait(WaitReason),
    Reject,
    SliceEnd,
    /// A lost node, with a fence this many seconds after the loss.
    NodeLost {
        fence: Option<i64>,
    },
}

fn arb_who() -> impl Strategy<Value = usize> {
    prop_oneof![4 => Just(0usize), 1 => Just(1usize), 1 => Just(2usize)]
}

fn arb_wait_reason() -> impl Strategy<Value = WaitReason> {
    prop::sample::select(vec![
        WaitReason::Submitted,
        WaitReason::Resources,
        WaitReason::NoNodes,
        WaitReason::Priority,
        WaitReason::Dependency,
        WaitReason::Held,
        WaitReason::GpusPaused,
        WaitReason::GpusBusy,
        WaitReason::ArrayLimit,
        WaitReason::Fencing,
    ])
}

fn arb_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => (arb_who(), any::<bool>()).prop_map(|(who, reason)| Step::Cancel { who, reason }),
        1 => arb_who().prop_map(|who| Step::Hold { who }),
        1 => arb_who().prop_map(|who| Step::Release { who }),
        8 => (
            prop_oneof![6 => Just(0i64), 1 => Just(-1i64), 1 => Just(1i64)],
            0usize..8,
            arb_report_kind(),
        )
            .prop_map(|(attempt, node, kind)| Step::Report { attempt, node, kind }),
        3 => arb_placement().prop_map(Step::Start),
        1 => arb_wait_reason().prop_map(Step::Wait),
        1 => Just(Step::Reject),
        2 => Just(Step::SliceEnd),
        2 => prop::option::of(-10i64..30).prop_map(|fence| Step::NodeLost { fence }),
    ]
}

fn requester(who: usize) -> Requester {
    match who {
        0 => alice(),
        1 => bob(),
        _ => root(),
    }
}

/// The node a drawn report comes from: one of the record's nodes, or `n9`.
fn reporting_node(current: &JobRecord, pick: usize) -> String {
    let nodes: Vec<String> = match &current.state {
        JobState::Running(run) => run
            .placement
            .node_names()
            .into_iter()
            .map(str::to_owned)
            .collect(),
        _ => vec!["n1".to_owned()],
    };
    if pick < 6 {
        nodes[pick % nodes.len()].clone()
    } else {
        "n9".to_owned()
    }
}

fn resolve(current: &JobRecord, step: &Step, now: Timestamp) -> Input {
    match step {
        Step::Cancel { who, reason } => Input::Cancel {
            by: requester(*who),
            reason: reason.then(|| "enough".to_owned()),
        },
        Step::Hold { who } => Input::Hold {
            by: requester(*who),
            order: None,
        },
        Step::Release { who } => Input::Release {
            by: requester(*who),
            order: None,
        },
        Step::Report {
            attempt,
            node,
            kind,
        } => Input::Report(AgentReport {
            job: current.id.clone(),
            attempt: u32::try_from(i64::from(current.attempt) + attempt).unwrap_or(0),
            node: reporting_node(current, *node),
            at: now,
            kind: kind.clone(),
        }),
        Step::Start(placement) => Input::Start {
            placement: placement.clone(),
        },
        Step::Wait(reason) => Input::Wait { reason: *reason },
        Step::Reject => Input::Reject {
            reason: "no node could ever take it".into(),
        },
        Step::SliceEnd => Input::SliceEnd,
        Step::NodeLost { fence } => Input::NodeLost {
            why: "its node stopped answering".into(),
            at: now,
            not_before: fence.map(|s| now + chrono::Duration::seconds(s)),
        },
    }
}

/// The rules every transition keeps, for `input` applied to `current` at `now`.
fn check(
    current: &JobRecord,
    input: &Input,
    transition: &Transition,
    now: Timestamp,
) -> Result<(), TestCaseError> {
    let effects = &transition.effects;
    // (a) Nothing leaves a final state, and nothing is done about a finished job.
    if current.state.is_finished() {
        prop_assert!(
            transition.record.is_none(),
            "a {} job changed",
            current.state.name()
        );
        prop_assert!(
            effects.iter().all(|e| matches!(
                e,
                Effect::Log(_) | Effect::Audit { .. } | Effect::Refuse { .. }
            )),
            "effects for a finished job: {:?}",
            effects
        );
    }
    // (c) A report about another attempt, from a node without a rank, or about a job that
    // does not run changes nothing.
    if let Input::Report(report) = input {
        let live = matches!(&current.state, JobState::Running(run) if run.placement.launches_on(&report.node))
            && report.attempt == current.attempt;
        if !live {
            prop_assert!(
                transition.record.is_none(),
                "a stale report changed the job"
            );
            prop_assert!(only_logs(transition), "a stale report did {:?}", effects);
        }
    }
    // (f) A kill is for the attempt running now, on its placement; only a cancel or a time
    // slice sends one that must get through.
    for kill in kills(transition) {
        prop_assert_eq!(kill.attempt, current.attempt);
        let JobState::Running(run) = &current.state else {
            return Err(TestCaseError::fail(format!(
                "a kill for a {} job",
                current.state.name()
            )));
        };
        prop_assert_eq!(&kill.placement, &run.placement);
        if let Some(except) = &kill.except {
            prop_assert!(run.placement.launches_on(except), "except {}", except);
        }
        if !kill.best_effort {
            prop_assert!(
                matches!(input, Input::Cancel { .. } | Input::SliceEnd),
                "a kill that must get through, for {:?}",
                input
            );
        }
    }
    let assigns = effects.iter().filter(|e| **e == Effect::Assign).count();
    prop_assert!(assigns <= 1);
    if assigns == 1 {
        prop_assert!(
            matches!(input, Input::Start { .. }) && matches!(current.state, JobState::Queued(_)),
            "an assignment for {:?}",
            input
        );
    }
    let usage = usages(transition);
    let ends = finished(transition);
    prop_assert!(usage.len() <= 1, "usage counted twice: {:?}", effects);
    let Some(next) = &transition.record else {
        prop_assert!(usage.is_empty(), "usage without a change: {:?}", effects);
        prop_assert!(ends.is_empty(), "finished without a change: {:?}", effects);
        return Ok(());
    };
    // (b) The attempt only grows, by one, when a run goes back to the queue.
    prop_assert!(next.attempt >= current.attempt, "attempt went down");
    if next.attempt != current.attempt {
        prop_assert_eq!(next.attempt, current.attempt + 1);
    }
    let requeued =
        matches!(current.state, JobState::Running(_)) && matches!(next.state, JobState::Queued(_));
    prop_assert_eq!(requeued, next.attempt > current.attempt);
    // (e) The job stays itself.
    prop_assert_eq!(&next.id, &current.id);
    prop_assert_eq!(&next.user, &current.user);
    prop_assert_eq!(&next.user_key, &current.user_key);
    prop_assert_eq!(&next.spec, &current.spec);
    prop_assert_eq!(next.submitted_at, current.submitted_at);
    // (f) A running job keeps the placement it was started on.
    if let JobState::Running(run) = &next.state {
        match (&current.state, input) {
            (JobState::Running(before), _) => prop_assert_eq!(&run.placement, &before.placement),
            (JobState::Queued(_), Input::Start { placement }) => {
                prop_assert_eq!(&run.placement, placement);
                prop_assert_eq!(run.assigned_at, now);
            }
            _ => prop_assert!(false, "{} became running", current.state.name()),
        }
        prop_assert!(run.placement.node_count() >= 1);
        let launched: Vec<u32> = run
            .placement
            .launched_ranks()
            .iter()
            .map(|(rank, _)| *rank)
            .collect();
        prop_assert!(run.ranks_started.iter().all(|r| launched.contains(r)));
        prop_assert!(run.ranks_done.iter().all(|r| launched.contains(r)));
        let mut done = run.ranks_done.clone();
        done.sort_unstable();
        done.dedup();
        prop_assert_eq!(done.len(), run.ranks_done.len(), "a rank done twice");
        prop_assert!(
            done.is_empty() || done.len() < launched.len(),
            "every rank done but still running"
        );
        // Only a rank that ended cleanly by itself, or stopped for its time slice, counts as
        // done.
        if let JobState::Running(before) = &current.state
            && run.ranks_done.len() > before.ranks_done.len()
        {
            let clean = matches!(
                input,
                Input::Report(AgentReport {
                    kind: ReportKind::Exited(exit),
                    ..
                }) if exit.is_clean() || exit.preempted
            );
            prop_assert!(clean, "a rank counted done after {:?}", input);
        }
    }
    // Every end is announced once, as what was recorded.
    if let Some(ending) = next.state.ending() {
        prop_assert_eq!(
            ends,
            vec![(
                next.state.name(),
                ending.exit_code,
                ending.reason.as_deref()
            )]
        );
    } else {
        prop_assert!(ends.is_empty(), "finished but {}", next.state.name());
    }
    // Usage is counted when a started run ends (or goes back to the queue), and only then.
    let started = match &current.state {
        JobState::Running(run) => run
            .started_at
            .filter(|s| *s < now && run.placement.total_gpus() > 0.0),
        _ => None,
    };
    let left_running = !matches!(next.state, JobState::Running(_));
    if !usage.is_empty() {
        prop_assert!(
            matches!(&current.state, JobState::Running(run) if run.started_at.is_some())
                && left_running,
            "usage of a run that did not end"
        );
        prop_assert_eq!(usage[0].0, current.user.as_str());
        prop_assert_eq!(usage[0].2, now);
    }
    let failed_to_start = matches!(
        input,
        Input::Report(AgentReport {
            kind: ReportKind::FailedToStart { .. },
            ..
        })
    );
    if started.is_some() && left_running && !failed_to_start {
        prop_assert_eq!(
            usage.len(),
            1,
            "a started run ended uncounted: {:?}",
            effects
        );
    }
    Ok(())
}

/// An input of a job whose nodes keep getting lost: it is started, its process starts, its
/// node (or the agent on it) loses it.
#[derive(Clone, Debug)]
enum Loss {
    Start(Placement),
    Started { node: usize },
    NodeLost { fence: Option<i64> },
    LostExit { node: usize },
}

fn arb_loss() -> impl Strategy<Value = Loss> {
    prop_oneof![
        arb_placement().prop_map(Loss::Start),
        (0usize..3).prop_map(|node| Loss::Started { node }),
        prop::option::of(-10i64..30).prop_map(|fence| Loss::NodeLost { fence }),
        (0usize..3).prop_map(|node| Loss::LostExit { node }),
    ]
}

/// A node where `current` runs a process (rank 0's when it does not run).
fn launched_node(current: &JobRecord, pick: usize) -> String {
    match &current.state {
        JobState::Running(run) => {
            let launched = run.placement.launched_ranks();
            launched[pick % launched.len()].1.to_owned()
        }
        _ => "n1".to_owned(),
    }
}

fn resolve_loss(current: &JobRecord, loss: &Loss, now: Timestamp) -> Input {
    let report = |node: &usize, kind: ReportKind| {
        Input::Report(AgentReport {
            job: current.id.clone(),
            attempt: current.attempt,
            node: launched_node(current, *node),
            at: now,
            kind,
        })
    };
    match loss {
        Loss::Start(placement) => Input::Start {
            placement: placement.clone(),
        },
        Loss::Started { node } => report(node, ReportKind::Started { pid: 7 }),
        Loss::NodeLost { fence } => Input::NodeLost {
            why: "its node stopped answering".into(),
            at: now,
            not_before: fence.map(|s| now + chrono::Duration::seconds(s)),
        },
        Loss::LostExit { node } => report(
            node,
            exit(Exit {
                exit_code: 137,
                signal: Some(9),
                lost: true,
                ..Exit::default()
            }),
        ),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn no_sequence_of_inputs_breaks_the_lifecycle_rules(
        record in arb_record(),
        steps in prop::collection::vec(arb_step(), 0..30),
        max_attempts in 1u32..=4,
    ) {
        let limits = Limits { max_attempts };
        let mut current = record;
        let mut usage_by_attempt: BTreeMap<u32, usize> = BTreeMap::new();
        for (i, drawn) in steps.iter().enumerate() {
            let now = at(10 * (i as i64 + 1));
            let input = resolve(&current, drawn, now);
            let transition = apply(&current, input.clone(), now, &limits);
            check(&current, &input, &transition, now)
                .map_err(|e| TestCaseError::fail(format!("step {i}, {input:?} on {current:?}: {e}")))?;
            let counted = usage_by_attempt.entry(current.attempt).or_default();
            *counted += usages(&transition).len();
            prop_assert!(*counted <= 1, "usage of attempt {} counted twice", current.attempt);
            if let Some(next) = transition.record {
                current = next;
            }
        }
    }

    #[test]
    fn a_job_whose_nodes_keep_getting_lost_is_requeued_at_most_max_attempts_minus_1_times(
        max_attempts in 1u32..=5,
        no_requeue in prop::bool::weighted(0.2),
        losses in prop::collection::vec(arb_loss(), 0..30),
    ) {
        let limits = Limits { max_attempts };
        let mut current = queued();
        current.spec.no_requeue = no_requeue;
        let mut requeues = 0u32;
        for (i, loss) in losses.iter().enumerate() {
            let now = at(10 * (i as i64 + 1));
            let input = resolve_loss(&current, loss, now);
            let transition = apply(&current, input.clone(), now, &limits);
            check(&current, &input, &transition, now)
                .map_err(|e| TestCaseError::fail(format!("step {i}, {input:?} on {current:?}: {e}")))?;
            let lost = matches!(loss, Loss::NodeLost { .. } | Loss::LostExit { .. });
            if lost && matches!(current.state, JobState::Running(_)) {
                let next = transition.record.clone().unwrap_or_else(|| current.clone());
                if no_requeue || current.attempt >= max_attempts {
                    prop_assert!(matches!(next.state, JobState::NodeFailed(_)), "{:?}", next.state);
                    let why = reason_of(&next).unwrap_or_default();
                    let expected = if no_requeue {
                        "; not requeued (--no-requeue)".to_owned()
                    } else {
                        format!(
                            "; not requeued: {} attempt(s) made, max_attempts is {max_attempts}",
                            current.attempt
                        )
                    };
                    prop_assert!(why.ends_with(&expected), "{}", why);
                } else {
                    prop_assert!(matches!(next.state, JobState::Queued(_)), "{:?}", next.state);
                    prop_assert_eq!(next.attempt, current.attempt + 1);
                }
            }
            if let Some(next) = transition.record {
                if next.attempt > current.attempt {
                    requeues += 1;
                }
                prop_assert!(next.attempt <= max_attempts, "attempt {} of {}", next.attempt, max_attempts);
                prop_assert!(
                    matches!(next.state, JobState::Queued(_) | JobState::Running(_) | JobState::NodeFailed(_)),
                    "{:?}", next.state
                );
                current = next;
            }
        }
        prop_assert!(requeues < max_attempts, "{} requeues", requeues);
        if no_requeue {
            prop_assert_eq!(requeues, 0);
        }
    }
}

#[test]
fn a_distributed_job_remembers_when_its_latest_rank_started() {
    let job = assigned(across(&["node001", "node002"], true));
    let start = |record: &JobRecord, node: &str, seconds| {
        stored(&step(
            record,
            report(record, node, seconds, ReportKind::Started { pid: 7 }),
            seconds,
        ))
    };
    let one = start(&job, "node001", 1);
    let both = start(&one, "node002", 5);
    let JobState::Running(run) = &both.state else {
        panic!("{both:?}");
    };
    // The job started with its first rank; a heartbeat of node002 sent before 5 s may not
    // list its rank yet, and must not count it missing (liveness).
    assert_eq!(
        (run.started_at, run.last_rank_started_at),
        (Some(at(1)), Some(at(5)))
    );
}
