//! Failures, told as stories: agents SIGKILLed with their jobs running (requeued elsewhere,
//! orphans stopped when the agent returns), `--no-requeue` and `--max-attempts` ending a job
//! `node_failed`, a frozen agent whose job its guard stops (self-fencing) before the job runs
//! elsewhere, the active scheduler SIGKILLed with a standby taking over, a heartbeat
//! overtaken by the exit it preceded, and a job record another scheduler changed.
//!
//! Real nats-server, real binaries, real signals: an agent is SIGKILLed (its job keeps running
//! as an orphan, as after a crash) or SIGSTOPped. Agents heartbeat every 200 ms and the
//! scheduler gives up on a node after 3 missed heartbeats, so a node is lost within about two
//! seconds (its checker runs every second).
//!
//! Jobs append `start N` when attempt N begins, `stop N` when SIGTERM stops it and `end N` when
//! it finishes, to a marker file: the file tells which attempts ran, which were stopped and in
//! what order. Jobs write nothing on stdout: an orphan's output pipe died with its agent, and a
//! write would kill it with SIGPIPE before the story could show who stops it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mgpu_tests::{Cluster, NodeSpec, process_running, time_of, wait_for};
use nix::sys::signal::Signal;
use serde_json::Value;

const T: Duration = Duration::from_secs(30);
/// Flags every scheduler of these stories gets: a node is lost after 3 missed heartbeats.
const MISSED: [&str; 2] = ["--missed-heartbeats", "3"];

fn one_node() -> Vec<NodeSpec> {
    vec![NodeSpec::new("node001", "1x24GiB")]
}

fn two_nodes() -> Vec<NodeSpec> {
    vec![
        NodeSpec::new("node001", "1x24GiB"),
        NodeSpec::new("node002", "1x24GiB"),
    ]
}

fn start(nodes: &[NodeSpec], extra: &[&str]) -> Cluster {
    let args: Vec<&str> = MISSED.iter().chain(extra).copied().collect();
    Cluster::start_with(nodes, &args)
}

fn text<'a>(job: &'a Value, field: &str) -> &'a str {
    job[field].as_str().unwrap_or("")
}

/// A job that marks its attempts in `marker`: attempt 1 runs `first_secs`, later ones
/// `later_secs`. Its SIGTERM trap is set before it marks its start, so once `start N` is in
/// the file a stop is marked too (see [`wait_marked`]).
fn marked_job(marker: &Path, first_secs: u32, later_secs: u32) -> String {
    format!(
        r#"m='{m}'; trap 'echo "stop $MGPU_ATTEMPT" >> "$m"; exit 143' TERM; echo "start $MGPU_ATTEMPT" >> "$m"; if [ "$MGPU_ATTEMPT" = 1 ]; then s={first_secs}; else s={later_secs}; fi; sleep "$s" & wait $!; echo "end $MGPU_ATTEMPT" >> "$m""#,
        m = marker.display()
    )
}

fn marker(cluster: &Cluster, name: &str) -> PathBuf {
    cluster.dir.path().join(format!("{name}.marks"))
}

fn marks(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Waits until the job's process runs (the agent reported its start), returning its node and
/// the pid of its main process, which leads its process group.
fn wait_started(cluster: &Cluster, id: &str) -> (String, i32) {
    wait_for(&format!("job {id} to start"), T, || {
        let job = cluster.show(id);
        let pid = job["record"]["pid"].as_i64()?;
        (job["state"] == "running").then(|| (text(&job, "node").to_owned(), pid as i32))
    })
}

/// Waits until `line` is in `marker`. The agent reports a start once it spawned the job's
/// shell, which may not have run its first command yet: a story that kills the job must wait
/// for its mark, or the shell dies before it marks (or traps) anything.
fn wait_marked(marker: &Path, line: &str) {
    wait_for(&format!("{line:?} in {}", marker.display()), T, || {
        marks(marker).iter().any(|l| l == line).then_some(())
    });
}

fn other(node: &str) -> &'static str {
    if node == "node001" {
        "node002"
    } else {
        "node001"
    }
}

/// The node's state as `mgpu nodes --json` says it (`online`, `offline`, …).
fn node_state(cluster: &Cluster, node: &str) -> String {
    let out = cluster.mgpu_ok(&["nodes", "--json"]);
    let nodes: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{out}: {e}"));
    nodes
        .as_array()
        .and_then(|all| all.iter().find(|n| n["node"] == node))
        .map(|n| text(n, "state").to_owned())
        .unwrap_or_default()
}

fn wait_node_state(cluster: &Cluster, node: &str, state: &str) {
    wait_for(&format!("{node} to be {state}"), T, || {
        (node_state(cluster, node) == state).then_some(())
    });
}

fn wait_gone(pid: i32, why: &str) {
    wait_for(why, T, || (!process_running(pid)).then_some(()));
}

/// The `exited` events of a job, as (attempt, node, lost) — the agents' own reports.
fn exits(cluster: &Cluster, id: &str) -> Vec<(u64, String, bool)> {
    cluster
        .job_events(id)
        .iter()
        .filter(|e| e["event"] == "exited")
        .map(|e| {
            (
                e["attempt"].as_u64().unwrap_or(0),
                text(&e["source"], "name").to_owned(),
                e["lost"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

/// Waits until a restarted agent has reported what it reconciled (its state file is empty
/// again) and gives the scheduler a moment to act on the report, which it must ignore.
fn wait_reconciled(cluster: &Cluster, node: &str) {
    wait_for(&format!("{node}'s state file to be cleared"), T, || {
        cluster.state_file_attempts(node).is_empty().then_some(())
    });
    std::thread::sleep(Duration::from_secs(1));
}

#[test]
fn a_killed_agents_job_runs_again_elsewhere_and_its_orphan_dies_when_the_agent_returns() {
    let mut cluster = start(&two_nodes(), &[]);
    let marks_file = marker(&cluster, "a");
    let id = cluster.submit(&[], &marked_job(&marks_file, 60, 2));
    let (node_a, pid) = wait_started(&cluster, &id);
    wait_marked(&marks_file, "start 1");
    let node_b = other(&node_a);
    let recorded = cluster.state_file_attempts(&node_a);
    assert_eq!(
        recorded.len(),
        1,
        "the agent records what it runs: {recorded:?}"
    );
    assert_eq!(recorded[0]["pid"].as_i64(), Some(i64::from(pid)));

    cluster.kill_agent(&node_a);
    // The job's guard stops it as soon as its agent is gone, before anything can run it again.
    wait_gone(pid, "attempt 1 to stop when its agent died");

    // Its node is lost: the job goes back to the queue as attempt 2 and runs on the other node.
    let done = cluster.finished_as(&id, "succeeded", T);
    assert_eq!(done["attempt"], 2, "{done}");
    assert_eq!(text(&done, "node"), node_b, "{done}");
    wait_node_state(&cluster, &node_a, "offline");
    let listing = cluster.mgpu_ok(&["nodes"]);
    assert!(
        listing.contains(&format!("{node_a}  offline  last heartbeat ")),
        "{listing}"
    );

    // The agent returns: it finds attempt 1 in its state file, already gone, and reports it lost.
    cluster.start_agent(&node_a);
    wait_node_state(&cluster, &node_a, "online");
    wait_reconciled(&cluster, &node_a);
    assert_eq!(
        exits(&cluster, &id),
        vec![(2, node_b.to_owned(), false), (1, node_a.clone(), true)],
        "attempt 2 exited on {node_b}; attempt 1 was reported lost by {node_a}'s new agent"
    );
    // The late report of attempt 1 changes nothing, and the job never starts a third time.
    let after = cluster.show(&id);
    assert_eq!(
        (text(&after, "state"), &after["attempt"]),
        ("succeeded", &2.into())
    );
    let marks = marks(&marks_file);
    assert_eq!(
        marks,
        ["start 1", "stop 1", "start 2", "end 2"],
        "attempt 1 stopped when its agent died, before attempt 2 started: never two at once"
    );
}

#[test]
fn a_no_requeue_job_on_a_lost_node_ends_node_failed() {
    let mut cluster = start(&one_node(), &[]);
    let marks_file = marker(&cluster, "b");
    let id = cluster.submit(&["--no-requeue"], &marked_job(&marks_file, 60, 1));
    let (_, pid) = wait_started(&cluster, &id);
    wait_marked(&marks_file, "start 1");
    assert!(cluster.mgpu_ok(&["show", &id]).contains("no requeue:"));

    cluster.kill_agent("node001");
    let failed = cluster.finished_as(&id, "node_failed", T);
    assert_eq!(failed["attempt"], 1, "{failed}");
    assert!(text(&failed, "reason").contains("--no-requeue"), "{failed}");
    let queue = cluster.mgpu_ok(&["queue", "--all"]);
    assert!(queue.contains("node_failed"), "{queue}");

    // The returning agent stops the orphan; its lost report does not bring the job back.
    cluster.start_agent("node001");
    wait_gone(pid, "the orphan to be stopped");
    wait_reconciled(&cluster, "node001");
    let after = cluster.show(&id);
    assert_eq!(
        (text(&after, "state"), &after["attempt"]),
        ("node_failed", &1.into())
    );
    assert_eq!(marks(&marks_file), ["start 1", "stop 1"]);
}

/// A job assigned to a node that has just crashed waits in the node's stream; the node is
/// found offline and the job requeued. When the agent comes back it must not start the old
/// attempt (the job may run elsewhere by then): the scheduler dropped what waited for the node.
#[test]
fn an_assignment_waiting_for_a_crashed_node_is_dropped_and_only_the_next_attempt_runs() {
    // 15 missed heartbeats of 200 ms: the crashed node counts as online for 3 s, long enough
    // for the job to be assigned to it.
    let mut cluster = Cluster::start_with(&one_node(), &["--missed-heartbeats", "15"]);
    let marks_file = marker(&cluster, "w");
    cluster.kill_agent("node001");
    let id = cluster.submit(&[], &marked_job(&marks_file, 1, 1));
    // Stored is not yet scheduled: the scheduler places it within moments, while the node
    // still counts as online (never later: once it is offline, nothing is assigned to it).
    let assigned = wait_for("the job to be assigned", Duration::from_secs(10), || {
        let shown = cluster.show(&id);
        (text(&shown, "state") != "queued").then_some(shown)
    });
    assert_eq!(
        (text(&assigned, "state"), &assigned["attempt"]),
        ("running", &1.into()),
        "assigned to the crashed node while it still counted as online: {assigned}"
    );
    wait_node_state(&cluster, "node001", "offline");
    wait_for("the job to be requeued as attempt 2", T, || {
        (cluster.show(&id)["attempt"] == 2).then_some(())
    });

    cluster.start_agent("node001");
    let done = cluster.finished_as(&id, "succeeded", T);
    assert_eq!(done["attempt"], 2, "{done}");
    assert_eq!(marks(&marks_file), ["start 2", "end 2"]);
}

#[test]
fn a_job_out_of_attempts_on_a_lost_node_ends_node_failed_saying_so() {
    let mut cluster = start(&one_node(), &["--max-attempts", "1"]);
    let marks_file = marker(&cluster, "c");
    let id = cluster.submit(&[], &marked_job(&marks_file, 60, 1));
    let (_, pid) = wait_started(&cluster, &id);
    wait_marked(&marks_file, "start 1");

    cluster.kill_agent("node001");
    let failed = cluster.finished_as(&id, "node_failed", T);
    assert_eq!(failed["attempt"], 1, "{failed}");
    let reason = text(&failed, "reason");
    assert!(
        reason.contains("attempt"),
        "the reason names the attempts: {reason}"
    );

    cluster.start_agent("node001");
    wait_gone(pid, "the orphan to be stopped");
    wait_reconciled(&cluster, "node001");
    assert_eq!(cluster.state(&id), "node_failed");
}

#[test]
fn a_frozen_agents_job_is_stopped_by_its_guard_before_it_runs_elsewhere() {
    let cluster = start(&two_nodes(), &[]);
    let marks_file = marker(&cluster, "d");
    let id = cluster.submit(&[], &marked_job(&marks_file, 60, 3));
    let (node_a, pid) = wait_started(&cluster, &id);
    wait_marked(&marks_file, "start 1");
    let node_b = other(&node_a);

    // Frozen long enough to be declared offline: attempt 1's guard sees no heartbeat stored
    // for longer than the fence and stops it, and only then (the scheduler waits for the
    // fence and the kill grace) does attempt 2 start on the other node.
    cluster.signal_agent(&node_a, Signal::SIGSTOP);
    let moved = wait_for("the job to run again on the other node", T, || {
        let job = cluster.show(&id);
        (job["attempt"] == 2 && job["state"] == "running" && job["record"]["pid"].is_i64())
            .then_some(job)
    });
    assert_eq!(text(&moved, "node"), node_b, "{moved}");
    assert_eq!(node_state(&cluster, &node_a), "offline");
    assert!(
        !process_running(pid),
        "attempt 1 still ran under its frozen agent when attempt 2 started"
    );
    let order = wait_for("attempt 2 to mark its start", T, || {
        let order = marks(&marks_file);
        order.iter().any(|m| m == "start 2").then_some(order)
    });
    assert_eq!(
        order,
        vec!["start 1", "stop 1", "start 2"],
        "attempt 1 is stopped before attempt 2 begins"
    );

    // Thawed, the agent reports attempt 1 as it ended; the scheduler ignores the stale report.
    cluster.signal_agent(&node_a, Signal::SIGCONT);
    let done = cluster.finished_as(&id, "succeeded", T);
    assert_eq!((&done["attempt"], text(&done, "node")), (&2.into(), node_b));
    wait_node_state(&cluster, &node_a, "online");
    let marks = marks(&marks_file);
    assert_eq!(
        marks.iter().filter(|m| m.starts_with("end")).count(),
        1,
        "{marks:?}"
    );
    for expected in ["start 1", "start 2", "stop 1", "end 2"] {
        assert!(
            marks.iter().any(|m| m == expected),
            "{expected} missing: {marks:?}"
        );
    }
    // The killed attempt's exit report is ignored: the job stays succeeded, attempt 2.
    std::thread::sleep(Duration::from_secs(1));
    let after = cluster.show(&id);
    assert_eq!(
        (text(&after, "state"), &after["attempt"]),
        ("succeeded", &2.into())
    );
}

#[test]
fn an_agent_restarted_under_its_running_job_stops_the_orphan_and_the_job_runs_once_more() {
    let mut cluster = start(&one_node(), &[]);
    let marks_file = marker(&cluster, "e");
    let id = cluster.submit(&[], &marked_job(&marks_file, 60, 1));
    let (_, pid) = wait_started(&cluster, &id);
    wait_marked(&marks_file, "start 1");

    cluster.kill_agent("node001");
    cluster.start_agent("node001");
    wait_gone(pid, "the orphan to be stopped by the restarted agent");
    let done = cluster.finished_as(&id, "succeeded", T);
    assert_eq!(done["attempt"], 2, "{done}");
    // One node: the next attempt started only once the orphan was gone.
    assert_eq!(
        marks(&marks_file),
        ["start 1", "stop 1", "start 2", "end 2"]
    );
    assert_eq!(
        exits(&cluster, &id),
        vec![
            (1, "node001".to_owned(), true),
            (2, "node001".to_owned(), false)
        ]
    );

    // Nothing counted twice: the job is listed once and the GPU is free again.
    let jobs: Vec<Value> = cluster
        .all_jobs()
        .into_iter()
        .filter(|j| j["id"] == id.as_str())
        .collect();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    wait_for("the GPU to be free again", T, || {
        let out = cluster.mgpu_ok(&["queue", "--json"]);
        let queue: Value = serde_json::from_str(&out).ok()?;
        let node = queue["nodes"].as_array()?.first()?.clone();
        (node["gpus_free"] == 1 && node["jobs_running"] == 0 && node["state"] == "online")
            .then_some(())
    });
    assert!(cluster.state_file_attempts("node001").is_empty());
}

/// A cluster with one node of `gpus`, its scheduler holding the lease, and a standby
/// replica standing by: the cluster, the active replica's lease holder, the standby's name.
fn with_standby(gpus: &str) -> (Cluster, String, String) {
    let mut cluster = start(&[NodeSpec::new("node001", gpus)], &[]);
    let first = wait_for("the scheduler to hold the lease", T, || {
        cluster.scheduler_lease()
    });
    let standby = cluster.start_standby_scheduler();
    let standby_log = cluster.dir.path().join(format!("logs/{standby}.log"));
    wait_for("the second scheduler to stand by", T, || {
        let log = std::fs::read_to_string(&standby_log).unwrap_or_default();
        log.contains("standing by").then_some(())
    });
    (cluster, first, standby)
}

#[test]
fn a_standby_scheduler_takes_over_when_the_active_one_is_killed() {
    let (mut cluster, first, standby) = with_standby("2x24GiB");
    assert_eq!(cluster.scheduler_lease().as_deref(), Some(first.as_str()));

    let long = cluster.submit(&[], "sleep 6");
    wait_started(&cluster, &long);

    // SIGKILL the active replica (the first: it took the lease before the standby started).
    let killed_at = chrono::Utc::now();
    let clock = Instant::now();
    cluster.kill_scheduler_named("scheduler");
    // Submissions are stored by JetStream whoever is active, and run once the standby is.
    let quick = cluster.submit(&[], "true");
    let quick_job = wait_for("the job submitted after the kill to start", T, || {
        let job = cluster.show(&quick);
        job["started_at"].is_string().then_some(job)
    });
    let takeover = (time_of(&quick_job, "started_at") - killed_at)
        .to_std()
        .unwrap_or_default();
    eprintln!(
        "takeover: the job submitted right after the SIGKILL started {:.2}s after it ({:.2}s of wall clock to see it)",
        takeover.as_secs_f64(),
        clock.elapsed().as_secs_f64()
    );
    assert!(
        takeover < Duration::from_secs(8),
        "the standby took {takeover:?} to take over (target: 5 s)"
    );
    let holder = wait_for("the standby to hold the lease", T, || {
        cluster.scheduler_lease().filter(|h| *h != first)
    });
    assert_ne!(holder, first);
    cluster.finished_as(&quick, "succeeded", T);

    // The job that ran across the failover finished once, as its first attempt.
    let long_done = cluster.finished_as(&long, "succeeded", T);
    assert_eq!(long_done["attempt"], 1, "{long_done}");
    let listed = cluster
        .all_jobs()
        .iter()
        .filter(|j| j["id"] == long.as_str())
        .count();
    assert_eq!(listed, 1);
    assert_eq!(
        exits(&cluster, &long),
        vec![(1, "node001".to_owned(), false)]
    );
    assert_eq!(cluster.scheduler_names(), vec![standby]);
}

/// The split brain the fault campaign found (docs/reliability.md): a scheduler frozen past
/// its lease, whose pull is handed submissions while a standby acts (11 of these 12 here),
/// must record none of them once thawed (a record the active scheduler never loaded would
/// stay `running` for ever); it hands them back, and every job runs once. On an idle machine
/// the thawed replica's renewal finds the key taken before its event loop gets to the
/// submissions, with or without the lease check (tried), so this shows the handing back; the
/// race itself is the simulator's scenario
/// `a_scheduler_that_acts_past_its_lease_loses_a_submission`, and the fault campaign's.
#[test]
fn a_scheduler_thawed_after_a_standby_took_over_records_nothing_and_every_job_runs() {
    let (cluster, first, _standby) = with_standby("4x24GiB");
    let frozen = nix::unistd::Pid::from_raw(cluster.scheduler_pid("scheduler") as i32);
    nix::sys::signal::kill(frozen, Signal::SIGSTOP).unwrap_or_else(|e| panic!("SIGSTOP: {e}"));
    wait_for("the standby to take the lease", T, || {
        cluster.scheduler_lease().filter(|h| *h != first)
    });
    // Both replicas' pulls wait at the server: some of these go to the frozen one.
    let jobs: Vec<String> = (0..12).map(|_| cluster.submit(&[], "true")).collect();
    nix::sys::signal::kill(frozen, Signal::SIGCONT).unwrap_or_else(|e| panic!("SIGCONT: {e}"));
    for job in &jobs {
        let done = cluster.finished_as(job, "succeeded", T);
        assert_eq!(done["attempt"], 1, "{done}");
    }
    let log =
        std::fs::read_to_string(cluster.dir.path().join("logs/scheduler.log")).unwrap_or_default();
    assert!(log.contains("stepping down"), "{log}");
    assert_ne!(cluster.scheduler_lease(), Some(first));
}

#[test]
fn agents_cut_off_from_nats_stop_their_jobs_which_run_again_once_it_is_back() {
    let mut cluster = start(&one_node(), &[]);
    let marks_file = marker(&cluster, "e");
    let id = cluster.submit(&[], &marked_job(&marks_file, 60, 1));
    let (_, pid) = wait_started(&cluster, &id);
    wait_marked(&marks_file, "start 1");

    // No heartbeat can be stored: after --fence-after (3 intervals) the agent stops the job,
    // since the scheduler would count the node offline and run the job elsewhere.
    cluster.kill_nats();
    wait_gone(pid, "the cut-off agent to stop its job");
    assert_eq!(marks(&marks_file), vec!["start 1", "stop 1"]);

    // Back: the agent reports the job lost, and it runs again as attempt 2.
    cluster.restart_nats();
    let done = cluster.finished_as(&id, "succeeded", T);
    assert_eq!(done["attempt"], 2, "{done}");
    assert_eq!(
        marks(&marks_file),
        vec!["start 1", "stop 1", "start 2", "end 2"]
    );
}

/// A heartbeat and an exit report travel separately: a beat taken just before a job ended can
/// arrive after its exit was recorded. It shows the attempt as it was, so the scheduler sends
/// no kill for it (and logs no stale attempt); a beat sent after the end that still lists the
/// attempt does get one. ghost01 is played by the story itself, which decides what each
/// message says and when it is sent.
#[test]
fn a_heartbeat_sent_before_a_jobs_exit_kills_nothing_when_it_arrives_after() {
    use mgpu_protocol::event::{EventSource, JobEvent, JobEventKind};
    use mgpu_protocol::ids::JobId;
    use mgpu_protocol::node::{GpuSource, GpuStatus, NodeHeartbeat, RunningJob};

    let cluster = start(&[NodeSpec::without_agent("ghost01")], &[]);
    let beat = |sent_at, running: Vec<RunningJob>| NodeHeartbeat {
        node: "ghost01".into(),
        sent_at,
        // Online for the whole story without another beat.
        interval_ms: 600_000,
        gpu_source: GpuSource::Declared,
        gpu_note: None,
        gpus: vec![GpuStatus {
            index: 0,
            uuid: "GPU-ghost01-0".into(),
            name: "Declared GPU".into(),
            memory_total_mib: 24_576,
            memory_used_mib: 0,
            utilization_pct: 0,
            temperature_c: None,
            power_w: None,
            foreign_processes: Vec::new(),
            gpu_type: None,
        }],
        running,
        address: "ghost01".into(),
        runs_jobs_as: "nobody".into(),
        containment: None,
        agent_version: "test".into(),
        protocol: mgpu_protocol::version::PROTOCOL,
        mem_threshold: 1.0,
        load_threshold: 1.0,
        labels: Default::default(),
        fence_after_ms: None,
        kill_grace_ms: 0,
        gpu_isolation: false,
        cpus: None,
        mem_host_mib: None,
        features: Vec::new(),
    };
    cluster.publish_heartbeat(&beat(mgpu_protocol::now(), Vec::new()));
    cluster.wait_nodes_online(1);
    let id = cluster.submit(&[], "true");
    cluster.wait_state(&id, "running", T);
    let job: JobId = id.parse().unwrap_or_else(|e| panic!("{id}: {e:?}"));
    let report = |kind: JobEventKind| {
        let event = JobEvent {
            job_id: job.clone(),
            attempt: 1,
            at: mgpu_protocol::now(),
            source: EventSource::Node("ghost01".into()),
            kind,
        };
        cluster.publish_report(
            &cluster.creds(mgpu_protocol::principals::Role::Node, "ghost01"),
            &event,
        );
    };
    let running = |id: &JobId| {
        vec![RunningJob {
            id: id.clone(),
            attempt: 1,
            pid: 4242,
            idle: None,
        }]
    };
    report(JobEventKind::Started { pid: 4242 });
    // The beat is taken while the job runs; the job exits; the beat arrives last.
    let taken_while_running = mgpu_protocol::now();
    std::thread::sleep(Duration::from_millis(50));
    report(JobEventKind::Exited {
        exit_code: 0,
        signal: None,
        cancelled: false,
        timed_out: false,
        preempted: false,
        lost: false,
        out_of_memory: false,
        usage: None,
    });
    cluster.finished_as(&id, "succeeded", T);
    cluster.publish_heartbeat(&beat(taken_while_running, running(&job)));
    // Beats are handled in order: once a later beat's kill of an attempt nobody knows is
    // logged, the early beat was handled too.
    let unknown = JobId::random();
    cluster.publish_heartbeat(&beat(mgpu_protocol::now(), running(&unknown)));
    let log = cluster.log_path("scheduler");
    let kills = |of: &JobId| {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|line| {
                line.contains("stale attempt still running") && line.contains(of.as_str())
            })
            .count()
    };
    wait_for("the kill of the unknown attempt", T, || {
        (kills(&unknown) > 0).then_some(())
    });
    assert_eq!(kills(&job), 0, "the beat taken before the exit got a kill");

    // Taken after the end and still listing the attempt: that one was left running.
    cluster.publish_heartbeat(&beat(mgpu_protocol::now(), running(&job)));
    wait_for("the kill of the attempt left running", T, || {
        (kills(&job) > 0).then_some(())
    });
}

/// Two schedulers acting at once (one stalled past its lease while the other took over) both
/// write job records. A write whose record changed under it must not put back what it
/// computed from the old one: the scheduler reads what is stored and decides again.
#[test]
fn a_record_another_scheduler_changed_is_decided_again_from_what_is_stored() {
    use mgpu_protocol::hold::HoldRequest;
    use mgpu_protocol::ids::JobId;
    use mgpu_protocol::job::{Ending, JobRecord, JobState};
    use mgpu_protocol::principals::Role;
    use mgpu_protocol::subjects;

    let cluster = start(&one_node(), &[]);
    let blocker = cluster.submit(&[], "sleep 60");
    cluster.wait_state(&blocker, "running", T);
    let waiting = cluster.submit(&[], "true");
    cluster.wait_state(&waiting, "queued", T);
    let id: JobId = waiting.parse().unwrap_or_else(|e| panic!("{e}"));

    // "Another scheduler" ends the waiting job: the record changes behind this one's back.
    let ended_elsewhere = "ended by another scheduler";
    cluster.with_nats(&cluster.creds(Role::Scheduler, "scheduler"), |client| {
        let id = id.clone();
        async move {
            let js = async_nats::jetstream::new(client);
            let bucket = js
                .get_key_value(subjects::JOBS_BUCKET)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let stored = bucket
                .get(id.as_str())
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .unwrap_or_else(|| panic!("no record"));
            let mut record: JobRecord =
                serde_json::from_slice(&stored).unwrap_or_else(|e| panic!("{e}"));
            record.state = JobState::Failed(Ending {
                placement: None,
                started_at: None,
                ended_at: mgpu_protocol::now(),
                exit_code: None,
                signal: None,
                reason: Some(ended_elsewhere.into()),
                usage: None,
            });
            let payload = serde_json::to_vec(&record).unwrap_or_default();
            bucket
                .put(id.as_str(), payload.into())
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
    });

    // Its owner holds it: the scheduler's write of a held, queued job meets the change.
    let payload = serde_json::to_vec(&HoldRequest {
        user: "alice".into(),
    })
    .unwrap_or_default();
    cluster.publish_signed(
        &cluster.user_creds("alice"),
        &subjects::hold(&id),
        payload,
        &[],
    );
    wait_for("the hold in the audit trail", T, || {
        let audit = cluster.mgpu_ok_with(&cluster.admin_creds(), &["admin", "audit", "--json"]);
        audit
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .find(|r| r["action"] == "hold" && r["target"] == waiting.as_str())
    });
    let job = cluster.show(&waiting);
    assert_eq!(job["state"], "failed", "{job}");
    assert_eq!(job["reason"], ended_elsewhere, "{job}");
    cluster.mgpu_ok(&["cancel", &blocker]);
}

/// A second agent started under a name an agent on this host already runs as refuses to
/// start, saying why, and the first one serves on.
#[test]
fn a_second_agent_with_the_same_node_name_refuses_to_start() {
    let mut cluster = start(&one_node(), &[]);
    let job = cluster.submit(&[], "sleep 1000");
    cluster.wait_state(&job, "running", T);
    cluster.start_agent("node001");
    wait_for("the second agent to exit", T, || {
        cluster
            .exited_components()
            .contains(&"node001".to_owned())
            .then_some(())
    });
    let log = std::fs::read_to_string(cluster.log_path("node001")).unwrap_or_default();
    assert!(
        log.contains("another mgpu-node for node `node001` is running on this host"),
        "{log}"
    );
    cluster.mgpu_ok(&["cancel", &job]);
    cluster.finished_as(&job, "cancelled", T);
}

/// A second agent under a name a running agent holds, with a state directory of its own (as
/// on another host): it finds the node-name lease renewed and refuses to start, saying who
/// holds it; the first serves on. An agent SIGKILLed and started again takes its own
/// predecessor's lease over at once.
#[test]
fn a_second_agent_under_a_held_node_name_refuses_and_a_restarted_one_takes_it_over() {
    let mut cluster = start(&one_node(), &[]);
    let job = cluster.submit(&[], "sleep 1000");
    cluster.wait_state(&job, "running", T);
    let elsewhere = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = elsewhere.path().join("second.log");
    let mut second = std::process::Command::new(mgpu_tests::bin_dir().join("mgpu-node"))
        .args(["--node", "node001", "--gpus", "1x24GiB", "--state-dir"])
        .arg(elsewhere.path())
        .env("MGPU_SERVER", cluster.server_url())
        .env(
            "MGPU_CREDS",
            cluster.creds(mgpu_protocol::principals::Role::Node, "node001"),
        )
        .stderr(std::fs::File::create(&log).unwrap_or_else(|e| panic!("{e}")))
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let deadline = Instant::now() + T;
    let status = loop {
        match second.try_wait() {
            Ok(Some(status)) => break Some(status),
            _ if Instant::now() > deadline => break None,
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let _ = second.kill();
    let _ = second.wait();
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.is_some_and(|s| !s.success()), "{said}");
    assert!(said.contains("node name `node001` is taken"), "{said}");
    assert_eq!(cluster.state(&job), "running");

    // Restarted after a crash, on this host: its predecessor's process is gone, so it takes
    // the lease over instead of waiting for it to expire.
    cluster.kill_agent("node001");
    cluster.start_agent("node001");
    wait_for("the restarted agent to take its lease over", T, || {
        std::fs::read_to_string(cluster.log_path("node001"))
            .ok()
            .filter(|log| log.contains("took over the node-name lease of a stopped agent"))
    });
    cluster.wait_nodes_online(1);
}
