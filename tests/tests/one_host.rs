//! The whole path on one host, told as stories: submit, schedule, run, stream, queue, cancel,
//! with the scheduler stopped, killed and restarted. Real nats-server, real binaries.

use std::time::{Duration, Instant};

use mgpu_tests::{Cluster, NodeSpec, process_alive, wait_for};
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

fn one_gpu_node() -> Vec<NodeSpec> {
    vec![NodeSpec::new("node001", "1x24GiB")]
}

fn time_of(job: &Value, field: &str) -> chrono::DateTime<chrono::Utc> {
    job[field]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{field} missing in {job}"))
}

#[test]
fn two_one_gpu_jobs_on_a_one_gpu_node_the_second_waits_then_runs() {
    let cluster = Cluster::start(&one_gpu_node());
    let first = cluster.submit(&["--gpus", "1"], "sleep 2; echo first");
    cluster.wait_state(&first, "running", T);
    let second = cluster.submit(&["--gpus", "1"], "echo second");

    // While the first holds the only GPU, the second waits and says why.
    let waiting = cluster.wait_for_reason(&second);
    assert_eq!(waiting["state"], "queued");
    let queue: Value = serde_json::from_str(&cluster.mgpu_ok(&["queue", "--json"]))
        .unwrap_or_else(|e| panic!("queue --json: {e}"));
    let jobs = queue["jobs"].as_array().cloned().unwrap_or_default();
    assert_eq!(jobs.len(), 2, "{queue}");
    assert!(
        jobs.iter()
            .any(|j| j["id"] == first.as_str() && j["state"] == "running")
    );
    assert!(
        jobs.iter()
            .any(|j| j["id"] == second.as_str() && j["state"] == "queued")
    );
    // The scheduler's status tells how its passes went, the one that left `second` waiting
    // among them.
    let status: Value = cluster.with_nats(&cluster.admin_creds(), |client| async move {
        let answer = client
            .request(mgpu_protocol::subjects::SCHEDULER_STATUS, "".into())
            .await
            .unwrap_or_else(|e| panic!("status request: {e}"));
        serde_json::from_slice(&answer.payload).unwrap_or_else(|e| panic!("status: {e}"))
    });
    assert_eq!(status["jobs_queued"], 1, "{status}");
    assert_eq!(status["jobs_running"], 1, "{status}");
    let passes = status["recent_passes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        passes
            .iter()
            .any(|p| p["queued"] == 1 && p["running"] == 1 && p["total_us"].as_u64() > Some(0)),
        "{status}"
    );

    let first_done = cluster.wait_finished(&first, T);
    let second_done = cluster.wait_finished(&second, T);
    assert_eq!(first_done["state"], "succeeded");
    assert_eq!(second_done["state"], "succeeded");
    assert_eq!(second_done["node"], "node001");
    assert_eq!(second_done["gpus"], serde_json::json!([0]));
    assert!(
        time_of(&second_done, "started_at") >= time_of(&first_done, "ended_at"),
        "the second job started before the first released the GPU"
    );
}

#[test]
fn stdout_and_stderr_arrive_in_order_with_the_exit_code() {
    let cluster = Cluster::start(&one_gpu_node());
    let script = "echo out1; sleep 0.2; echo err1 >&2; sleep 0.2; echo out2; sleep 0.2; echo err2 >&2; exit 3";
    let out = cluster.mgpu(&["submit", "-i", "--", script]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "interactive submit exits with the job's code"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).matches("out").count(),
        2
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("out1\nout2\n"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("err1\nerr2\n"));

    // The same output replays from JetStream after the job ended, separated by stream.
    let id = latest_job_id(&cluster);
    let job = cluster.wait_finished(&id, T);
    assert_eq!(job["state"], "failed");
    assert_eq!(job["exit_code"], 3);
    let logs = cluster.mgpu(&["logs", &id]);
    assert!(logs.status.success());
    assert_eq!(String::from_utf8_lossy(&logs.stdout), "out1\nout2\n");
    assert_eq!(String::from_utf8_lossy(&logs.stderr), "err1\nerr2\n");
}

#[test]
fn logs_follow_prints_all_output_of_a_running_job_and_stops_when_it_ends() {
    let cluster = Cluster::start(&one_gpu_node());
    // Many messages in a row (`seq`), each stream's in order, and stderr between them, while
    // `logs -f` follows from before the job writes anything.
    let script = "sleep 1; echo out1; echo err1 >&2; seq 1 50000; echo err2 >&2; echo last";
    let id = cluster.submit(&[], script);
    let follow = cluster.mgpu(&["logs", "-f", &id]);
    assert!(follow.status.success(), "{follow:?}");
    let numbers: String = (1..=50000).map(|n| format!("{n}\n")).collect();
    assert_eq!(
        String::from_utf8_lossy(&follow.stdout),
        format!("out1\n{numbers}last\n")
    );
    assert_eq!(String::from_utf8_lossy(&follow.stderr), "err1\nerr2\n");
    assert_eq!(cluster.wait_finished(&id, T)["state"], "succeeded");
}

fn latest_job_id(cluster: &Cluster) -> String {
    let queue: Value = serde_json::from_str(&cluster.mgpu_ok(&["queue", "--all", "--json"]))
        .unwrap_or_else(|e| panic!("queue --json: {e}"));
    queue["jobs"]
        .as_array()
        .and_then(|jobs| {
            jobs.iter()
                .max_by_key(|j| j["submitted_at"].as_str().map(str::to_owned))
        })
        .and_then(|j| j["id"].as_str())
        .unwrap_or_else(|| panic!("no job in {queue}"))
        .to_owned()
}

#[test]
fn the_job_runs_where_and_with_what_it_was_given() {
    let cluster = Cluster::start(&[NodeSpec::new("node001", "2x24GiB")]);
    let workdir = cluster.dir.path().join("work");
    std::fs::create_dir_all(&workdir).unwrap_or_else(|e| panic!("{e}"));
    let workdir_text = workdir.display().to_string();
    let id = cluster.submit(
        &[
            "--gpu-ids",
            "1",
            "--name",
            "envcheck",
            "--workdir",
            &workdir_text,
            "--env-setup-cmd",
            "export FROM_SETUP=yes",
        ],
        "echo \"$FROM_SETUP|$CUDA_VISIBLE_DEVICES|$CUDA_DEVICE_ORDER|$MGPU_JOB_ID|$MGPU_NODE|$(pwd)\"",
    );
    let job = cluster.wait_finished(&id, T);
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["name"], "envcheck");
    let logs = cluster.mgpu_ok(&["logs", &id]);
    assert_eq!(
        logs.trim(),
        format!("yes|1|PCI_BUS_ID|{id}|node001|{workdir_text}")
    );
}

#[test]
fn cancel_a_queued_and_a_running_job() {
    let cluster = Cluster::start(&one_gpu_node());
    // A process group with a background child, to show the whole group goes.
    let bg_file = cluster.dir.path().join("bg.pid");
    let running = cluster.submit(
        &[],
        &format!(
            "sleep 300 & echo $! > {}; sleep 300; wait",
            bg_file.display()
        ),
    );
    cluster.wait_state(&running, "running", T);
    let pid = wait_for("the job's pid", T, || {
        cluster.show(&running)["record"]["pid"].as_i64()
    });
    let bg_pid: i32 = wait_for("the background child's pid", T, || {
        std::fs::read_to_string(&bg_file).ok()?.trim().parse().ok()
    });
    assert!(process_alive(pid as i32));
    assert!(process_alive(bg_pid));
    let queued = cluster.submit(&[], "echo should-never-run");
    cluster.wait_for_reason(&queued);

    // By a unique prefix, as people type it.
    let out = cluster.mgpu(&["cancel", &queued[..8]]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let queued_job = cluster.wait_finished(&queued, T);
    assert_eq!(queued_job["state"], "cancelled");
    assert!(
        queued_job["started_at"].is_null(),
        "a cancelled queued job never ran"
    );

    let out = cluster.mgpu(&["cancel", &running]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let running_job = cluster.wait_finished(&running, T);
    assert_eq!(running_job["state"], "cancelled");
    wait_for("the job's process to be gone", T, || {
        (!process_alive(pid as i32)).then_some(())
    });
    wait_for("the background child to be gone", T, || {
        (!process_alive(bg_pid)).then_some(())
    });
    assert!(cluster.mgpu_ok(&["logs", &queued]).is_empty());

    // Cancelling a finished job again is a clear error.
    let again = cluster.mgpu(&["cancel", &running]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already finished"));
}

#[test]
fn queue_answers_while_the_scheduler_is_stopped() {
    let mut cluster = Cluster::start(&one_gpu_node());
    let id = cluster.submit(&[], "sleep 1");
    cluster.wait_state(&id, "running", T);
    cluster.kill_scheduler();
    let queue: Value = serde_json::from_str(&cluster.mgpu_ok(&["queue", "--json"]))
        .unwrap_or_else(|e| panic!("queue --json: {e}"));
    let jobs = queue["jobs"].as_array().cloned().unwrap_or_default();
    assert!(jobs.iter().any(|j| j["id"] == id.as_str()), "{queue}");
    let nodes = cluster.mgpu_ok(&["nodes", "--json"]);
    assert!(nodes.contains("node001"));
    // The human table too.
    assert!(cluster.mgpu_ok(&["queue"]).contains(&id[..10]));
}

#[test]
fn a_job_submitted_while_the_scheduler_is_down_runs_once_it_starts() {
    let nodes = one_gpu_node();
    let mut cluster = Cluster::server_only(&nodes);
    // The streams exist before any scheduler ran.
    let setup = cluster.mgpu_with(&cluster.admin_creds(), &["admin", "setup"], None);
    assert!(
        setup.status.success(),
        "{}",
        String::from_utf8_lossy(&setup.stderr)
    );
    cluster.start_agent("node001");
    let id = cluster.submit(&[], "echo ran");
    std::thread::sleep(Duration::from_millis(500));
    cluster.start_scheduler();
    let job = cluster.wait_finished(&id, T);
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(cluster.mgpu_ok(&["logs", &id]), "ran\n");
}

#[test]
fn scheduler_killed_and_restarted_mid_job_loses_nothing_and_runs_nothing_twice() {
    let mut cluster = Cluster::start(&one_gpu_node());
    let marker = cluster.dir.path().join("runs");
    let marker_text = marker.display().to_string();
    let id = cluster.submit(
        &[],
        &format!("echo run >> {marker_text}; sleep 2; echo done"),
    );
    cluster.wait_state(&id, "running", T);
    wait_for("the job to start", T, || marker.exists().then_some(()));
    cluster.kill_scheduler();
    // Submitted while the scheduler is dead: must not be lost.
    let later = cluster.submit(&[], "echo later");
    std::thread::sleep(Duration::from_millis(300));
    cluster.start_scheduler();

    let job = cluster.wait_finished(&id, T);
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["attempt"], 1);
    assert_eq!(cluster.wait_finished(&later, T)["state"], "succeeded");
    let runs = std::fs::read_to_string(&marker).unwrap_or_default();
    assert_eq!(runs, "run\n", "the job ran more than once");
    assert_eq!(cluster.mgpu_ok(&["logs", &id]), "done\n");
}

#[test]
fn bad_input_gets_a_clear_error() {
    let cluster = Cluster::start(&one_gpu_node());
    let cases: [(&[&str], &str); 7] = [
        (&["submit", "--gpus", "-1", "--", "true"], "0 or more"),
        (
            &["submit", "--gpus", "abc", "--", "true"],
            "not a GPU count",
        ),
        (
            &["submit", "--time-limit", "soon", "--", "true"],
            "not a duration",
        ),
        (&["cancel", "0123abcd"], "no job matches"),
        (&["show", "not-an-id"], "not a job id"),
        // A full id nobody submitted: asked of the bucket, its stream's leader, then history.
        (
            &["show", "0123456789abcdef0123456789abcdef"],
            "no job matches",
        ),
        (&["logs", "fffffff"], "no job matches"),
    ];
    for (args, expected) in cases {
        let out = cluster.mgpu(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "mgpu {args:?} succeeded");
        // The first line says what is wrong; nothing panics or prints a backtrace.
        let first = stderr.lines().next().unwrap_or("");
        assert!(
            first.starts_with("error:") && first.contains(expected),
            "mgpu {args:?}: {stderr}"
        );
        assert!(
            !stderr.contains("panicked") && !stderr.contains("backtrace"),
            "{stderr}"
        );
    }
    // A request no node can satisfy fails at once with the reason, instead of waiting forever.
    let id = cluster.submit(&["--gpus", "4"], "true");
    let job = cluster.wait_finished(&id, T);
    assert_eq!(job["state"], "failed");
    assert!(
        job["reason"]
            .as_str()
            .unwrap_or("")
            .contains("largest node has 1"),
        "{job}"
    );
}

#[test]
fn cannot_reach_or_authenticate_is_one_clear_line() {
    let cluster = Cluster::start(&one_gpu_node());
    let stranger = cluster.dir.path().join("stranger.nk");
    let pair = nkeys::KeyPair::new_user();
    std::fs::write(&stranger, pair.seed().unwrap_or_default()).unwrap_or_else(|e| panic!("{e}"));
    let out = cluster.mgpu_with(&stranger, &["queue"], None);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("authentication failed"), "{stderr}");

    let started = Instant::now();
    let out = std::process::Command::new(mgpu_tests::bin_dir().join("mgpu"))
        .args(["--server", "nats://127.0.0.1:1", "queue"])
        .env("MGPU_CREDS", cluster.user_creds("alice"))
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot reach NATS at nats://127.0.0.1:1"),
        "{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(15));
}

trait WaitReason {
    fn wait_for_reason(&self, id: &str) -> Value;
}

impl WaitReason for Cluster {
    /// Waits until the scheduler has looked at a queued job and said why it waits.
    fn wait_for_reason(&self, id: &str) -> Value {
        wait_for(&format!("job {id} to wait for resources"), T, || {
            let job = self.show(id);
            let reason = job["reason"].as_str().unwrap_or("");
            (job["state"] == "queued" && reason.contains("GPUs")).then_some(job)
        })
    }
}

#[test]
fn interactive_jobs_stream_live_and_ctrl_c_detaches_without_stopping_the_job() {
    let cluster = Cluster::start(&one_gpu_node());
    let mut attached = std::process::Command::new(mgpu_tests::bin_dir().join("mgpu"))
        .args([
            "submit",
            "-i",
            "--",
            "echo started; sleep 20; echo finished",
        ])
        .env("MGPU_SERVER", cluster.server_url())
        .env("MGPU_CREDS", cluster.user_creds("alice"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    // Output arrives live, while the job still runs.
    let mut stdout = attached
        .stdout
        .take()
        .unwrap_or_else(|| panic!("no stdout"));
    let mut first_line = String::new();
    {
        use std::io::BufRead;
        let mut reader = std::io::BufReader::new(&mut stdout);
        reader
            .read_line(&mut first_line)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    assert_eq!(first_line, "started\n");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(attached.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let out = attached
        .wait_with_output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(0), "detaching is not an error");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Detached") && stderr.contains("mgpu logs -f"),
        "{stderr}"
    );
    let id = latest_job_id(&cluster);
    assert_eq!(
        cluster.state(&id),
        "running",
        "the job keeps running after a detach"
    );
}

/// A burst of short jobs does not write for every start and end: out-of-turn heartbeats come
/// at most one per 100 ms (the periodic ones every 200 ms in these tests), and the scheduler
/// stores its usage book at most once a second, yet soon.
#[test]
fn a_burst_of_short_jobs_writes_heartbeats_and_usage_at_a_bounded_rate() {
    use mgpu_protocol::subjects;

    const JOBS: usize = 100;
    let cluster = Cluster::start(&[NodeSpec::new("node001", "8x24GiB")]);
    let stored = |stream_name: &'static str| {
        cluster.with_nats(&cluster.admin_creds(), |client| async move {
            let js = async_nats::jetstream::new(client);
            let mut stream = js
                .get_stream(stream_name)
                .await
                .unwrap_or_else(|e| panic!("stream {stream_name}: {e}"));
            stream
                .info()
                .await
                .unwrap_or_else(|e| panic!("stream {stream_name} info: {e}"))
                .state
                .last_sequence
        })
    };
    let heartbeats_stored = || stored(subjects::NODES_STREAM);
    // Only the usage book is written to the cluster bucket while jobs run.
    let usage_writes = || stored(subjects::CLUSTER_BUCKET_STREAM);

    let before = heartbeats_stored();
    let usage_before = usage_writes();
    let began = Instant::now();
    let (submitted, ids) = cluster.submit_array(&format!("0-{}", JOBS - 1), &[], "true");
    assert_eq!(ids.len(), JOBS, "{submitted}");
    let burst = wait_for(
        "every job of the burst to succeed",
        Duration::from_secs(120),
        || {
            let queue: Value =
                serde_json::from_str(&cluster.mgpu_ok(&["queue", "--all", "--json"]))
                    .unwrap_or_else(|e| panic!("queue --json: {e}"));
            let done: Vec<Value> = queue["jobs"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|j| {
                    ids.iter().any(|id| j["id"] == id.as_str()) && j["state"] == "succeeded"
                })
                .collect();
            (done.len() == JOBS).then_some(done)
        },
    );
    let took = began.elapsed();
    let sent = heartbeats_stored() - before;
    let usage_written = usage_writes() - usage_before;

    // Every 200 ms, plus at most one out of turn every 100 ms, plus the slack of a second.
    let bound = (took.as_millis() / 200 + took.as_millis() / 100) as u64 + 15;
    assert!(
        sent <= bound,
        "{sent} heartbeats for {JOBS} jobs in {took:?} (at most {bound} expected)"
    );
    let bound = took.as_secs() + 2;
    assert!(
        usage_written <= bound,
        "the usage book written {usage_written} times in {took:?} (at most {bound} expected)"
    );
    // The GPU time of the whole burst, the last jobs' included, is stored within a second or so.
    let burst_gpu_seconds: f64 = burst
        .iter()
        .map(|j| (time_of(j, "ended_at") - time_of(j, "started_at")).num_milliseconds() as f64)
        .sum::<f64>()
        / 1000.0;
    wait_for(
        "the burst's GPU time to be stored",
        Duration::from_secs(10),
        || {
            let usage = cluster.with_nats(&cluster.admin_creds(), |client| async move {
                let js = async_nats::jetstream::new(client);
                mgpu_nats::records::usage(&js)
                    .await
                    .unwrap_or_else(|e| panic!("reading usage: {e}"))
            });
            let stored = usage
                .users
                .get("alice")
                .map(|u| u.gpu_seconds)
                .unwrap_or(0.0);
            // Usage decays (a half-life of days): a second of it is far below 1 %.
            (stored >= 0.99 * burst_gpu_seconds).then_some(())
        },
    );
}

/// Every job starts under its guard: `mgpu-job-guard` where it is installed beside the agent
/// (as scripts/setup.sh does), else the agent's built-in one (`--job-guard builtin`). Both
/// run a simple command without a shell, and end the way the job ended.
#[test]
fn both_job_guards_run_jobs_and_end_the_way_the_job_ended() {
    for (guard, agent_args, comm) in [
        ("slim", &[][..], "mgpu-job-guard"),
        ("builtin", &["--job-guard", "builtin"][..], "mgpu-node"),
    ] {
        let mut cluster =
            Cluster::start(&[NodeSpec::new("node001", "1x24GiB").agent_args(agent_args)]);
        let logs = |id: &str| {
            let out = cluster.mgpu(&["logs", id]);
            (
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        };

        // A shell job: its parent is the guard, and its exit code is the job's.
        let id = cluster.submit(&[], "cat /proc/$PPID/comm; exit 3");
        let job = cluster.wait_finished(&id, T);
        assert_eq!(
            (&job["state"], &job["exit_code"]),
            (&"failed".into(), &3.into()),
            "{guard}: {job}"
        );
        assert_eq!(
            logs(&id).0,
            format!("{comm}\n"),
            "{guard}: the job's parent"
        );

        // A simple command runs without a shell, in its directory, with PWD set as a shell would.
        let id = cluster.submit(&[], "env");
        assert_eq!(
            cluster.wait_finished(&id, T)["state"],
            "succeeded",
            "{guard}"
        );
        let (env, _) = logs(&id);
        let workdir = cluster.dir.path().display().to_string();
        assert!(
            env.lines().any(|l| l == format!("PWD={workdir}")),
            "{guard}: {env}"
        );
        // A shell would have counted itself in SHLVL (the submitter's, captured at submit).
        let shlvl: Vec<&str> = env.lines().filter(|l| l.starts_with("SHLVL=")).collect();
        let submitters = std::env::var("SHLVL").map(|level| format!("SHLVL={level}"));
        assert_eq!(
            shlvl,
            submitters.as_deref().into_iter().collect::<Vec<_>>(),
            "{guard}: no shell ran"
        );

        // A command that is not there: 127 and the shell's sentence.
        let id = cluster.submit(&[], "no-such-command-here --flag");
        let job = cluster.wait_finished(&id, T);
        assert_eq!(job["exit_code"], 127, "{guard}: {job}");
        assert_eq!(
            logs(&id).1,
            "mgpu: no-such-command-here: command not found\n",
            "{guard}"
        );

        // A script without `#!` runs under /bin/sh, as a shell would run it.
        let script = cluster.dir.path().join("no-shebang");
        mgpu_tests::write_executable(&script, "echo ran with \"$1\"\n");
        let id = cluster.submit(&[], &format!("{} word", script.display()));
        assert_eq!(
            cluster.wait_finished(&id, T)["state"],
            "succeeded",
            "{guard}"
        );
        assert_eq!(logs(&id).0, "ran with word\n", "{guard}");

        // A job killed by a signal: the guard dies the same way and the agent says so.
        let id = cluster.submit(&[], "kill -USR1 $$");
        let job = cluster.wait_finished(&id, T);
        assert_eq!(job["state"], "failed", "{guard}: {job}");
        assert!(
            job.to_string().contains("signal 10") || job.to_string().contains("SIGUSR1"),
            "{guard}: {job}"
        );

        // The agent dies: the guard stops the job's whole group.
        let pid_file = cluster.dir.path().join("job.pid");
        let id = cluster.submit(
            &[],
            &format!(
                "echo $$ > {}.tmp && mv {0}.tmp {0} && exec sleep 60",
                pid_file.display()
            ),
        );
        let pid: i32 = wait_for(&format!("{guard}: job {id} to write its pid"), T, || {
            std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
        });
        cluster.kill_agent("node001");
        wait_for(
            &format!("{guard}: the job to stop when its agent died"),
            T,
            || (!mgpu_tests::process_running(pid)).then_some(()),
        );
    }
}
