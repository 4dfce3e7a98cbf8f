//! Scenario tests: a cluster built by hand, no fault drawn and no user but the test, jobs
//! submitted one by one, the world stepped until something happened. Each one shows a part
//! of the simulation doing what the real system does, with the invariants checked at every
//! step as in a run.

use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{ArrayMember, JobSpec, JobState, WaitReason};
use mgpu_protocol::node_admin::AdminRequest;
use mgpu_protocol::report::ReportKind;
use mgpu_protocol::request::Request;
use mgpu_protocol::submit::SubmitRequest;

use super::agents::SimAgent;
use super::rng::Rng;
use super::world::World;
use super::{Options, admin, checks};

/// No fault of any kind.
fn calm() -> Options {
    Options {
        node_crash: 0,
        partition: 0,
        scheduler_crash: 0,
        scheduler_stall: 0,
        other_writer: 0,
        clock_step: 0,
        write_failure: 0,
        ack_lost: 0,
        duplicate: 0,
        delay: 0,
        heartbeat_drop: 0,
        replay: 0,
        ..Options::default()
    }
}

/// A cluster of nodes with these GPUs, a 3 s fence and a 2 s kill grace.
fn cluster(gpus: &[u32]) -> World {
    let agents = gpus
        .iter()
        .enumerate()
        .map(|(i, gpus)| SimAgent::new(format!("node{i}"), *gpus, 3_000, 2_000))
        .collect();
    World::with_agents(Rng::new(7), calm(), admin::base_limits(), agents)
}

fn id(n: u64) -> JobId {
    format!("{n:032x}")
        .parse()
        .unwrap_or_else(|e| panic!("job id: {e:?}"))
}

/// Submits `spec` as job `n` of `user` (0 alice, 1 bob).
fn submit(world: &mut World, user: usize, n: u64, spec: JobSpec) -> JobId {
    let job = id(n);
    world.submitted.insert(job.clone(), spec.no_requeue);
    world.open.insert(job.clone());
    let identity = world.users[user].clone();
    let request = Request::Submit(Box::new(SubmitRequest {
        id: job.clone(),
        user: identity.name.clone(),
        spec,
    }));
    world.publish_request(identity, request);
    job
}

fn spec(gpus: u32) -> JobSpec {
    let mut spec = JobSpec::new(vec!["train".into()], "/tmp");
    spec.gpus = GpuAmount::whole(gpus);
    spec
}

/// Steps until `done` holds (true) or `until` ms pass (false); any broken invariant fails.
fn step_until(world: &mut World, until: u64, mut done: impl FnMut(&World) -> bool) -> bool {
    while world.now < until {
        if !world.step(until) {
            return false;
        }
        world.due.clear();
        if let Some(broken) = checks::after_step(world) {
            panic!(
                "{broken}\n{}",
                world.trace.iter().cloned().collect::<Vec<_>>().join("\n")
            );
        }
        if done(world) {
            return true;
        }
    }
    false
}

/// The nodes where `attempt` of `job` has a live process.
fn running_on(world: &World, job: &JobId, attempt: u32) -> Vec<usize> {
    (0..world.agents.len())
        .filter(|&n| {
            world.agents[n]
                .processes
                .contains_key(&(job.clone(), attempt))
        })
        .collect()
}

/// Keeps every process of `job` running until stopped.
fn run_forever(world: &mut World, job: &JobId) {
    for agent in &mut world.agents {
        for ((j, _), process) in agent.processes.iter_mut() {
            if j == job {
                process.ends_at = u64::MAX / 2;
            }
        }
    }
}

/// Whether every job submitted has reached its final state.
fn finished(world: &World) -> bool {
    world.submitted.keys().all(|job| {
        world
            .store
            .record(job)
            .is_some_and(|r| r.state.is_finished())
    })
}

fn state_of(world: &World, job: &JobId) -> Option<JobState> {
    world.store.record(job).map(|r| r.state.clone())
}

#[test]
fn a_partitioned_nodes_job_is_fenced_reported_lost_and_runs_elsewhere_only_once_dead() {
    let mut world = cluster(&[1, 1]);
    let job = submit(&mut world, 0, 1, spec(1));
    assert!(step_until(&mut world, 10_000, |w| !running_on(w, &job, 1).is_empty()));
    run_forever(&mut world, &job);
    let node = running_on(&world, &job, 1)[0];
    world.cut_off(node, 20_000);
    let cut_at = world.now;
    let last_stored = world.agents[node].last_stored;
    // The old attempt dies on the cut-off node (its fence), then the new one starts on the
    // other node, and not before.
    let mut dead_at = None;
    let started = step_until(&mut world, cut_at + 30_000, |w| {
        if dead_at.is_none() && running_on(w, &job, 1).is_empty() {
            dead_at = Some(w.now);
        }
        !running_on(w, &job, 2).is_empty()
    });
    assert!(started, "attempt 2 never started");
    let dead_at = dead_at.unwrap_or_else(|| panic!("attempt 1 still runs"));
    assert!(
        dead_at >= last_stored + 3_000,
        "fenced only after --fence-after"
    );
    assert!(
        dead_at < world.now,
        "the new attempt waited for the old one's end"
    );
    assert_eq!(running_on(&world, &job, 2), vec![1 - node]);
    // Its end waits for the heal, then is stored as lost.
    let lost_report = |w: &World| {
        w.reports.messages().any(|r| {
            r.job == job
                && r.attempt == 1
                && matches!(&r.kind, ReportKind::Exited(exit) if exit.lost)
        })
    };
    assert!(!lost_report(&world), "stored while cut off");
    assert!(step_until(&mut world, cut_at + 40_000, lost_report));
    assert!(world.now >= cut_at + 20_000);
}

#[test]
fn an_array_never_runs_more_tasks_than_its_limit() {
    let mut world = cluster(&[2, 2, 2]);
    let array_id = id(99);
    let tasks: Vec<JobId> = (0..5)
        .map(|index| {
            let mut task = spec(1);
            task.array = Some(ArrayMember {
                array_id: array_id.clone(),
                index,
                max_running: Some(2),
            });
            submit(&mut world, 0, u64::from(index) + 1, task)
        })
        .collect();
    let mut most = 0;
    let all_done = step_until(&mut world, 200_000, |w| {
        let running = tasks
            .iter()
            .filter(|t| matches!(state_of(w, t), Some(JobState::Running(_))))
            .count();
        most = most.max(running);
        finished(w)
    });
    assert!(all_done, "{:?}", checks::unfinished(&mut world));
    assert_eq!(most, 2, "two at a time, with room for six");
    assert_eq!(world.ledger.array_starts, 5);
}

#[test]
fn a_gang_starts_whole_on_distinct_nodes_and_only_its_launched_ranks_run() {
    let mut world = cluster(&[1, 1, 1]);
    // Every node heartbeats first: a job no known node could hold is rejected.
    step_until(&mut world, 2_000, |_| false);
    let mut distributed = spec(1);
    distributed.nodes = 2;
    distributed.distributed = true;
    let gang = submit(&mut world, 0, 1, distributed);
    assert!(step_until(&mut world, 10_000, |w| running_on(w, &gang, 1)
        .len()
        == 2));
    let Some(JobState::Running(run)) = state_of(&world, &gang) else {
        panic!("not running");
    };
    assert_eq!(run.placement.node_count(), 2);
    assert_eq!(world.ledger.gang_starts, 1);
    // Without --distributed only rank 0 runs a process; the other node's GPU is held.
    let mut held = spec(1);
    held.nodes = 2;
    let plain = submit(&mut world, 0, 2, held);
    assert!(step_until(&mut world, 60_000, |w| {
        !running_on(w, &plain, 1).is_empty()
    }));
    assert_eq!(running_on(&world, &plain, 1).len(), 1);
    assert!(step_until(&mut world, 200_000, finished));
}

#[test]
fn no_job_starts_on_a_paused_gpu_until_it_is_resumed() {
    let mut world = cluster(&[1]);
    let root = world.users[2].clone();
    let pause = AdminRequest::PauseGpu {
        node: "node0".into(),
        index: 0,
        by: "root".into(),
        reason: None,
    };
    world.publish_request(root.clone(), Request::Admin(pause));
    step_until(&mut world, 1_000, |_| false);
    let job = submit(&mut world, 0, 1, spec(1));
    step_until(&mut world, 15_000, |_| false);
    assert!(matches!(
        state_of(&world, &job),
        Some(JobState::Queued(waiting)) if waiting.reason == WaitReason::GpusPaused
    ));
    let resume = AdminRequest::ResumeGpu {
        node: "node0".into(),
        index: 0,
        by: "root".into(),
    };
    world.publish_request(root, Request::Admin(resume));
    assert!(step_until(&mut world, 30_000, |w| {
        !running_on(w, &job, 1).is_empty()
    }));
}

#[test]
fn a_cap_raised_lets_more_start_and_one_lowered_stops_new_starts_but_no_running_job() {
    let mut world = cluster(&[4]);
    let jobs: Vec<JobId> = (1..=4).map(|n| submit(&mut world, 1, n, spec(1))).collect();
    let running = |w: &World| {
        jobs.iter()
            .filter(|j| !running_on(w, j, 1).is_empty())
            .count()
    };
    assert!(step_until(&mut world, 5_000, |w| running(w) == 2));
    for job in &jobs {
        run_forever(&mut world, job);
    }
    step_until(&mut world, 8_000, |_| false);
    assert_eq!(running(&world), 2, "bob's cap is two");
    world.limits = admin::limits_of(Some(3), Some(1));
    world.limits_changed = true;
    assert!(step_until(&mut world, 12_000, |w| running(w) == 3));
    for job in &jobs {
        run_forever(&mut world, job);
    }
    world.limits = admin::limits_of(Some(1), Some(1));
    world.limits_changed = true;
    step_until(&mut world, 14_000, |_| false);
    // One ends: bob still holds two, over his new cap of one, so the last one waits.
    let first = jobs
        .iter()
        .find(|j| !running_on(&world, j, 1).is_empty())
        .cloned()
        .unwrap_or_else(|| panic!("none runs"));
    for agent in &mut world.agents {
        if let Some(process) = agent.processes.get_mut(&(first.clone(), 1)) {
            process.ends_at = world.now;
        }
    }
    step_until(&mut world, 30_000, |_| false);
    assert_eq!(running(&world), 2, "running jobs stay, nothing new starts");
    assert_eq!(world.ledger.cap("bob"), Some(10_000));
}

/// The simulator once found a `--no-requeue` job with a time limit (and the default
/// `--on-timeout requeue`) preempted at the end of its slice while another job waited, and
/// run again (`time_limits::on_timeout`): its limit is a hard one.
#[test]
fn a_no_requeue_job_with_a_time_limit_runs_once_and_times_out() {
    let mut world = cluster(&[1]);
    let mut once = spec(1);
    once.no_requeue = true;
    once.time_limit_secs = Some(2);
    let job = submit(&mut world, 0, 1, once);
    assert!(step_until(&mut world, 5_000, |w| !running_on(w, &job, 1).is_empty()));
    run_forever(&mut world, &job);
    let waiting = submit(&mut world, 1, 2, spec(1));
    assert!(step_until(&mut world, 60_000, |w| {
        state_of(w, &job).is_some_and(|s| s.is_finished())
    }));
    assert!(matches!(
        state_of(&world, &job),
        Some(JobState::TimedOut(_))
    ));
    assert!(step_until(&mut world, 90_000, |w| {
        state_of(w, &waiting).is_some_and(|s| s.is_finished())
    }));
}

/// A scheduler stalled past its lease (SIGSTOP), woken after a standby took over, pulls a
/// submission the moment it wakes: `acts_without_lease` decides whether it may act on it.
/// The job submitted then, and whether it ever finishes.
fn submission_taken_by_a_woken_scheduler(acts_without_lease: bool) -> (World, JobId, bool) {
    let mut world = cluster(&[1]);
    world.options.acts_without_lease = acts_without_lease;
    step_until(&mut world, 2_000, |_| false);
    world.stall_scheduler(600_000);
    let stall = world.stall_generation;
    let stalled_at = world.now;
    // A standby takes the key once it expired (3 s after the last renewal at most).
    assert!(step_until(&mut world, stalled_at + 10_000, |w| w
        .stalled
        .as_ref()
        .is_some_and(|s| s.superseded)));
    let job = submit(&mut world, 0, 1, spec(1));
    // The stalled one wakes just as the submission can be delivered, before the active one
    // pulls it.
    let available = world.requests.last_available();
    step_until(&mut world, available - 1, |_| false);
    world.now = available;
    world.stalled_scheduler_wakes(stall);
    let finished = step_until(&mut world, available + 60_000, |w| {
        state_of(w, &job).is_some_and(|s| s.is_finished())
    });
    (world, job, finished)
}

#[test]
fn a_scheduler_woken_past_its_lease_writes_nothing_and_the_active_one_runs_the_job() {
    let (_, _, finished) = submission_taken_by_a_woken_scheduler(false);
    assert!(finished);
}

/// What the fault campaign found before the driver had its lease gate: the woken replica
/// records the submission, acknowledges it and starts it, and the active one never learns of
/// the job.
#[test]
fn a_scheduler_that_acts_past_its_lease_loses_a_submission() {
    let (world, job, finished) = submission_taken_by_a_woken_scheduler(true);
    assert!(!finished);
    // Recorded, acknowledged and sent to the node by the woken one; the node's reports are
    // about a job the active one does not know, so the record says running for ever.
    let state = state_of(&world, &job);
    assert!(matches!(state, Some(JobState::Running(_))), "{state:?}");
    assert!(world.requests.all_acked());
    let active = world
        .scheduler
        .as_ref()
        .map(|s| s.machine.job(&job).is_some());
    assert_eq!(
        active,
        Some(false),
        "the active scheduler never learns of it"
    );
}

#[test]
fn a_scheduler_stalled_within_its_lease_goes_on_and_runs_what_came_meanwhile() {
    let mut world = cluster(&[1]);
    step_until(&mut world, 2_000, |_| false);
    world.stall_scheduler(1_500);
    let job = submit(&mut world, 0, 1, spec(1));
    assert!(step_until(&mut world, 60_000, |w| {
        state_of(w, &job).is_some_and(|s| s.is_finished())
    }));
    assert!(world.stalled.is_none());
    let starts = world
        .trace
        .iter()
        .filter(|l| l.contains("scheduler active"));
    assert_eq!(starts.count(), 1, "no standby took over");
}
