//! Placement and queue policy, told as stories: GPU shares and booked memory, pinned GPUs,
//! spread and fill-first placement, priority, hold and dedup, backfill behind a reservation,
//! time limits that fail or requeue, dependencies, arrays, job files, conda and profiles,
//! drained nodes and paused GPUs, and GPUs busy with other people's processes.
//! Real nats-server, real binaries; only the busy GPUs are described by a test-made heartbeat,
//! since declared GPUs never have foreign processes.

use std::io::Write;
use std::time::{Duration, Instant};

use mgpu_protocol::job::WaitReason;
use mgpu_protocol::node::{ForeignProcess, GpuSource, GpuStatus, NodeHeartbeat};
use mgpu_tests::{Cluster, NodeSpec, bin_dir, gpus_of, time_of, wait_for, write_executable};
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

fn node(gpus: &str) -> Vec<NodeSpec> {
    vec![NodeSpec::new("node001", gpus)]
}

fn two_nodes() -> Vec<NodeSpec> {
    vec![
        NodeSpec::new("node001", "2x24GiB"),
        NodeSpec::new("node002", "2x24GiB"),
    ]
}

fn text<'a>(job: &'a Value, field: &str) -> &'a str {
    job[field].as_str().unwrap_or("")
}

/// Every job whose command contains `tag`, as `mgpu queue --all --json` lists it.
fn tagged(cluster: &Cluster, tag: &str) -> Vec<Value> {
    cluster
        .all_jobs()
        .into_iter()
        .filter(|j| text(j, "command").contains(tag))
        .collect()
}

fn wait_tagged(cluster: &Cluster, tag: &str, timeout: Duration) -> String {
    wait_for(&format!("a job tagged {tag}"), timeout, || {
        tagged(cluster, tag)
            .first()
            .map(|j| text(j, "id").to_owned())
    })
}

fn effective_priority(cluster: &Cluster, id: &str) -> i64 {
    let jobs = cluster.all_jobs();
    let job = jobs
        .iter()
        .find(|j| j["id"] == id)
        .unwrap_or_else(|| panic!("{id} not in the queue"));
    job["effective_priority"]
        .as_i64()
        .unwrap_or_else(|| panic!("no effective_priority in {job}"))
}

/// The largest number of these finished jobs that ran at the same moment.
fn most_at_once(jobs: &[Value]) -> usize {
    let spans: Vec<_> = jobs
        .iter()
        .map(|j| (time_of(j, "started_at"), time_of(j, "ended_at")))
        .collect();
    spans
        .iter()
        .map(|(at, _)| spans.iter().filter(|(s, e)| s <= at && at < e).count())
        .max()
        .unwrap_or(0)
}

/// `conda shell.bash hook` prints the shell function `conda activate` needs; this one knows
/// two environments and exports what a real activation does.
const FAKE_CONDA: &str = r#"#!/bin/sh
if [ "$1" = shell.bash ] && [ "$2" = hook ]; then
  cat <<'HOOK'
conda() {
  case "$1 $2" in
    "activate filenv"|"activate cli-env") export CONDA_DEFAULT_ENV="$2" ;;
    *) echo "EnvironmentNameNotFound: $2" >&2; return 1 ;;
  esac
}
HOOK
fi
"#;

/// Puts a fake `python` (runs its script with sh) and `conda` first on the PATH of every later
/// CLI run; jobs run with the environment captured at submit, so they get them too. Returns a
/// job script that prints its arguments, its GPUs and its conda environment.
fn install_fake_tools(cluster: &mut Cluster) -> String {
    let bin = cluster.dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap_or_else(|e| panic!("{e}"));
    write_executable(&bin.join("python"), "#!/bin/sh\nexec /bin/sh \"$@\"\n");
    write_executable(&bin.join("conda"), FAKE_CONDA);
    let script = cluster.dir.path().join("job.py");
    let body = "echo \"args=$* visible=$CUDA_VISIBLE_DEVICES conda=${CONDA_DEFAULT_ENV:-none}\"\nsleep 1\n";
    std::fs::write(&script, body).unwrap_or_else(|e| panic!("{e}"));
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    cluster.set_cli_env("PATH", &path);
    script.display().to_string()
}

#[test]
fn shares_of_one_gpu_run_side_by_side_and_booked_memory_is_not_given_twice() {
    let cluster = Cluster::start(&node("1x24GiB"));
    let a = cluster.submit(&["--gpus", "0.5"], "sleep 5");
    let b = cluster.submit(&["--gpus", "0.5"], "sleep 5");
    cluster.wait_state(&a, "running", T);
    let b_running = cluster.wait_state(&b, "running", T);
    assert_eq!(cluster.state(&a), "running", "two halves share the GPU");
    assert_eq!(gpus_of(&b_running), vec![0]);
    let c = cluster.submit(&["--gpus", "0.5"], "echo third");
    cluster.wait_reason(&c, WaitReason::Resources.describe(), T);
    let a_done = cluster.finished_as(&a, "succeeded", T);
    let b_done = cluster.finished_as(&b, "succeeded", T);
    let c_done = cluster.finished_as(&c, "succeeded", T);
    let first_end = time_of(&a_done, "ended_at").min(time_of(&b_done, "ended_at"));
    assert!(time_of(&c_done, "started_at") >= first_end);

    // Memory is booked: 16000 MiB twice does not fit 24 GiB, though two halves would.
    let m1 = cluster.submit(&["--gpus", "0.5", "--mem", "16000"], "sleep 3");
    let m1_running = cluster.wait_state(&m1, "running", T);
    assert_eq!(
        m1_running["record"]["placement"]["gpus"][0]["mem_mib"], 16000,
        "{m1_running}"
    );
    let m2 = cluster.submit(&["--gpus", "0.5", "--mem", "16000"], "true");
    cluster.wait_reason(&m2, WaitReason::Resources.describe(), T);
    let m1_done = cluster.finished_as(&m1, "succeeded", T);
    let m2_done = cluster.finished_as(&m2, "succeeded", T);
    assert!(time_of(&m2_done, "started_at") >= time_of(&m1_done, "ended_at"));
}

#[test]
fn pinned_gpu_ids_are_exact_and_impossible_requests_fail_at_once() {
    let cluster = Cluster::start(&node("2x24GiB"));
    // Requests no node could ever satisfy fail at once, saying why.
    let seven = cluster.submit(&["--gpu-ids", "7"], "echo never");
    let huge = cluster.submit(&["--mem", "30000"], "echo never");
    let started = Instant::now();
    for (id, words) in [(&seven, ["GPU id", "7"]), (&huge, ["30000", "MiB"])] {
        let job = cluster.finished_as(id, "failed", T);
        assert!(job["started_at"].is_null(), "{job}");
        let reason = text(&job, "reason");
        assert!(words.iter().all(|w| reason.contains(w)), "{job}");
    }
    assert!(started.elapsed() < Duration::from_secs(10));

    let pinned = cluster.submit(
        &["--gpu-ids", "1"],
        "echo visible=$CUDA_VISIBLE_DEVICES; sleep 4",
    );
    assert_eq!(gpus_of(&cluster.wait_state(&pinned, "running", T)), vec![1]);
    // Pinned to the busy GPU: it waits although GPU 0 is free, which another job takes.
    let same = cluster.submit(&["--gpu-ids", "1"], "echo visible=$CUDA_VISIBLE_DEVICES");
    cluster.wait_reason(&same, WaitReason::Resources.describe(), T);
    let other = cluster.finished_as(&cluster.submit(&[], "true"), "succeeded", T);
    assert_eq!(gpus_of(&other), vec![0]);
    let both = cluster.submit(
        &["--gpus", "2", "--gpu-ids", "0-1"],
        "echo visible=$CUDA_VISIBLE_DEVICES",
    );

    let pinned_done = cluster.finished_as(&pinned, "succeeded", T);
    let same_done = cluster.finished_as(&same, "succeeded", T);
    let both_done = cluster.finished_as(&both, "succeeded", T);
    assert!(time_of(&same_done, "started_at") >= time_of(&pinned_done, "ended_at"));
    assert_eq!(gpus_of(&same_done), vec![1]);
    assert_eq!(gpus_of(&both_done), vec![0, 1]);
    assert_eq!(cluster.mgpu_ok(&["logs", &pinned]), "visible=1\n");
    assert_eq!(cluster.mgpu_ok(&["logs", &same]), "visible=1\n");
    assert_eq!(cluster.mgpu_ok(&["logs", &both]), "visible=0,1\n");
}

#[test]
fn spread_uses_both_nodes_fill_first_packs_one_and_max_job_time_caps_jobs() {
    // Spread and a cluster-wide time limit, from a config file.
    let config_dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let config = config_dir.path().join("scheduler.toml");
    std::fs::write(&config, "placement = \"spread\"\nmax_job_time = \"3s\"\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let config_text = config.display().to_string();
    let cluster = Cluster::start_with(&two_nodes(), &["--config", &config_text]);
    let first = cluster.submit(&[], "sleep 4");
    let first_node = text(&cluster.wait_state(&first, "running", T), "node").to_owned();
    let second = cluster.submit(&[], "sleep 4");
    let second_node = text(&cluster.wait_state(&second, "running", T), "node").to_owned();
    assert_ne!(
        first_node, second_node,
        "spread puts the second job on the idle node"
    );
    // Without a limit, or with a longer one, a job is stopped at max_job_time.
    let unlimited = cluster.submit(&["--on-timeout", "fail"], "sleep 60");
    let longer = cluster.submit(&["--on-timeout", "fail", "--time-limit", "1h"], "sleep 60");
    for id in [&unlimited, &longer] {
        let job = cluster.finished_as(id, "timed_out", T);
        let ran = time_of(&job, "ended_at") - time_of(&job, "started_at");
        assert!(ran.num_seconds() < 15, "ran {ran} despite max_job_time 3s");
    }
    drop(cluster);

    // Fill-first (and the limit as a flag): the second job joins the first on its node.
    let cluster = Cluster::start_with(
        &two_nodes(),
        &["--placement", "fill_first", "--max-job-time", "2s"],
    );
    let first = cluster.submit(&[], "sleep 4");
    let first_node = text(&cluster.wait_state(&first, "running", T), "node").to_owned();
    let second = cluster.submit(&[], "sleep 4");
    let second_node = text(&cluster.wait_state(&second, "running", T), "node").to_owned();
    assert_eq!(first_node, second_node, "fill_first packs the busier node");
    let capped = cluster.finished_as(
        &cluster.submit(&["--on-timeout", "fail"], "sleep 60"),
        "timed_out",
        T,
    );
    assert!((time_of(&capped, "ended_at") - time_of(&capped, "started_at")).num_seconds() < 15);
}

#[test]
fn higher_priority_runs_first_held_jobs_wait_for_release_and_duplicates_are_refused() {
    let cluster = Cluster::start(&node("1x24GiB"));
    // Long enough that everything below is queued (and held) before the GPU frees.
    let blocker = cluster.submit(&[], "sleep 5");
    cluster.wait_state(&blocker, "running", T);
    let low = cluster.submit(&["--priority", "1"], "echo low");
    let high = cluster.submit(&["--priority", "5"], "echo high");
    let held = cluster.submit(&["--priority", "9"], "echo held");
    cluster.mgpu_ok(&["hold", &held]);
    cluster.wait_reason(&held, WaitReason::Held.describe(), T);

    // The same job twice with --dedup: the second is refused, pointing at the first.
    let dedup_command = "echo dedup-me";
    let dup = cluster.submit_json(&["--dedup"], dedup_command);
    let dup_id = dup["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{dup}"))
        .to_owned();
    let again = cluster.submit_json(&["--dedup"], dedup_command);
    assert!(again["id"].is_null(), "{again}");
    assert_eq!(again["duplicate_of"], dup_id.as_str());
    assert_eq!(tagged(&cluster, "dedup-me").len(), 1);

    let jobs = cluster.all_jobs();
    let held_job = jobs.iter().find(|j| j["id"] == held.as_str());
    assert_eq!(held_job.map(|j| &j["held_by"]), Some(&Value::from("alice")));
    assert!(effective_priority(&cluster, &high) > effective_priority(&cluster, &low));
    assert!(effective_priority(&cluster, &low) > effective_priority(&cluster, &dup_id));

    let high_done = cluster.finished_as(&high, "succeeded", T);
    let low_done = cluster.finished_as(&low, "succeeded", T);
    let dup_done = cluster.finished_as(&dup_id, "succeeded", T);
    assert!(time_of(&low_done, "started_at") >= time_of(&high_done, "ended_at"));
    assert!(time_of(&dup_done, "started_at") >= time_of(&low_done, "ended_at"));
    // The held job, highest of all, let everyone pass; released, it runs.
    assert_eq!(cluster.state(&held), "queued");
    cluster.mgpu_ok(&["release", &held]);
    cluster.finished_as(&held, "succeeded", T);
    // Dedup only refuses while the first is queued or running.
    let later = cluster.submit_json(&["--dedup"], dedup_command);
    assert!(
        later["id"].as_str().is_some_and(|id| id != dup_id),
        "{later}"
    );
}

#[test]
fn a_big_job_behind_an_endless_stream_of_small_ones_starts_within_a_bounded_time() {
    let cluster = Cluster::start(&node("2x24GiB"));
    let long = cluster.submit(&["--time-limit", "8s", "--on-timeout", "fail"], "sleep 6");
    cluster.wait_state(&long, "running", T);
    let big = cluster.submit(&["--gpus", "2"], "echo big");
    cluster.wait_reason(&big, WaitReason::Resources.describe(), T);

    // Ends before the big job's reservation begins: it may use the idle GPU meanwhile.
    let short = cluster.submit(&["--time-limit", "2s", "--on-timeout", "fail"], "sleep 1");
    let short_done = cluster.finished_as(&short, "succeeded", T);
    // Unlimited, or longer than the reservation allows: they wait behind the big job.
    let unlimited = cluster.submit(&[], "sleep 2");
    let too_long = cluster.submit(&["--time-limit", "30s", "--on-timeout", "fail"], "sleep 2");
    let behind = WaitReason::Priority.describe();
    cluster.wait_reason(&unlimited, behind, T);
    cluster.wait_reason(&too_long, behind, T);

    let mut stream = vec![unlimited, too_long];
    let deadline = Instant::now() + T;
    while cluster.state(&big) == "queued" {
        assert!(Instant::now() < deadline, "the big job starved");
        stream.push(cluster.submit(&[], "sleep 2"));
        std::thread::sleep(Duration::from_millis(300));
    }
    let big_done = cluster.finished_as(&big, "succeeded", T);
    let long_done = cluster.finished_as(&long, "succeeded", T);
    let big_start = time_of(&big_done, "started_at");
    assert!(big_start >= time_of(&long_done, "ended_at"));
    assert!(big_start >= time_of(&short_done, "ended_at"));
    // Bounded: no later than the running job's time limit (plus scheduling slack).
    let bound = time_of(&long_done, "started_at") + chrono::Duration::seconds(8 + 5);
    assert!(big_start <= bound, "big started {big_start}, bound {bound}");
    for id in &stream {
        let job = cluster.show(id);
        if !job["started_at"].is_null() {
            assert!(
                time_of(&job, "started_at") >= big_start,
                "{job} jumped the queue"
            );
        }
    }
}

#[test]
fn time_limits_either_fail_the_job_or_send_it_back_to_the_queue() {
    let cluster = Cluster::start(&node("1x24GiB"));
    let hard = cluster.submit(&["--time-limit", "2s", "--on-timeout", "fail"], "sleep 60");
    let hard_done = cluster.finished_as(&hard, "timed_out", T);
    let ran = time_of(&hard_done, "ended_at") - time_of(&hard_done, "started_at");
    assert!(ran.num_seconds() < 15, "ran {ran} with a 2s limit");

    let sliced = cluster.submit(
        &["--time-limit", "2s", "--on-timeout", "requeue"],
        r#"echo "restart=$MGPU_RESTART_COUNT attempt=$MGPU_ATTEMPT"; [ "$MGPU_RESTART_COUNT" -ge 1 ] || sleep 60"#,
    );
    cluster.wait_state(&sliced, "running", T);
    // Its slice ends while nobody waits: it keeps running.
    std::thread::sleep(Duration::from_secs(3));
    let still = cluster.show(&sliced);
    assert_eq!(still["state"], "running", "{still}");
    assert_eq!(still["attempt"], 1, "{still}");

    // Someone waits: the job is stopped and goes to the back of the queue as attempt 2.
    let waiting = cluster.submit(&[], "sleep 2; echo waited");
    wait_for("the sliced job to be requeued", T, || {
        let job = cluster.show(&sliced);
        (job["state"] == "queued" && job["attempt"] == 2).then_some(())
    });
    let waiting_done = cluster.finished_as(&waiting, "succeeded", T);
    let sliced_done = cluster.finished_as(&sliced, "succeeded", T);
    assert_eq!(sliced_done["attempt"], 2);
    assert!(time_of(&sliced_done, "started_at") >= time_of(&waiting_done, "ended_at"));
    let logs = cluster.mgpu_ok(&["logs", &sliced]);
    assert!(logs.contains("restart=1 attempt=2"), "{logs}");
}

/// A job past its time slice yields only to a waiter its GPU could let start: not to a 2-GPU
/// job on a 2-GPU node whose other GPU is busy, nor to a 1-GPU job queued behind that one
/// (the GPU is held for the job ahead); once the 2-GPU job is gone, to the 1-GPU job.
#[test]
fn a_sliced_job_yields_only_to_a_waiter_its_gpu_would_let_start() {
    let cluster = Cluster::start(&node("2x24GiB"));
    let busy = cluster.submit(&[], "sleep 1000");
    cluster.wait_state(&busy, "running", T);
    let sliced = cluster.submit(
        &["--time-limit", "1s", "--on-timeout", "requeue"],
        "sleep 1000",
    );
    cluster.wait_state(&sliced, "running", T);
    let big = cluster.submit(&["--gpus", "2"], "true");
    let small = cluster.submit(&[], "true");
    cluster.wait_state(&small, "queued", T);
    // Well past its slice, with both waiting: it keeps running, as attempt 1.
    std::thread::sleep(Duration::from_secs(3));
    let still = cluster.show(&sliced);
    assert_eq!(
        (&still["state"], &still["attempt"]),
        (&"running".into(), &1.into()),
        "{still}"
    );
    // With the 2-GPU job gone, the 1-GPU job could start on its GPU: now it yields.
    cluster.mgpu_ok(&["cancel", &big]);
    wait_for("the sliced job to be requeued", T, || {
        (cluster.show(&sliced)["attempt"] == 2).then_some(())
    });
    cluster.finished_as(&small, "succeeded", T);
    for id in [&busy, &sliced] {
        cluster.mgpu_ok(&["cancel", id]);
    }
}

/// A job past its time slice does not yield to a waiter ranked below it: requeued, it would come
/// first and take its GPU straight back. A waiter ranked as high gets the GPU.
#[test]
fn a_sliced_job_does_not_yield_to_a_waiter_ranked_below_it() {
    let cluster = Cluster::start(&node("1x24GiB"));
    let sliced = cluster.submit(
        &[
            "--priority",
            "5",
            "--time-limit",
            "1s",
            "--on-timeout",
            "requeue",
        ],
        "sleep 1000",
    );
    cluster.wait_state(&sliced, "running", T);
    let lower = cluster.submit(&["--priority", "1"], "true");
    cluster.wait_state(&lower, "queued", T);
    std::thread::sleep(Duration::from_secs(3));
    let still = cluster.show(&sliced);
    assert_eq!(
        (&still["state"], &still["attempt"]),
        (&"running".into(), &1.into()),
        "{still}"
    );
    let equal = cluster.submit(&["--priority", "5"], "true");
    wait_for("the sliced job to be requeued", T, || {
        (cluster.show(&sliced)["attempt"] == 2).then_some(())
    });
    cluster.finished_as(&equal, "succeeded", T);
    // The lower one may have run already, while the requeued job waited to start again.
    let _ = cluster.mgpu(&["cancel", &sliced, &lower]);
}

#[test]
fn dependencies_wait_for_success_or_for_any_end() {
    let cluster = Cluster::start(&node("2x24GiB"));
    let ok = cluster.submit(&[], "sleep 2; echo ok");
    let bad = cluster.submit(&[], "exit 3");
    let after_ok = cluster.submit(&["--after", &ok], "echo after-ok");
    let after_bad = cluster.submit(&["--after", &bad], "echo never");
    let after_any = cluster.submit(&["--after-any", &bad], "echo after-any");
    let after_both = cluster.submit(&["--after", &format!("{ok},{after_ok}")], "true");
    cluster.wait_reason(&after_ok, WaitReason::Dependency.describe(), T);

    let ok_done = cluster.finished_as(&ok, "succeeded", T);
    let bad_done = cluster.finished_as(&bad, "failed", T);
    let after_ok_done = cluster.finished_as(&after_ok, "succeeded", T);
    assert!(time_of(&after_ok_done, "started_at") >= time_of(&ok_done, "ended_at"));
    let after_any_done = cluster.finished_as(&after_any, "succeeded", T);
    assert!(time_of(&after_any_done, "started_at") >= time_of(&bad_done, "ended_at"));
    let both_done = cluster.finished_as(&after_both, "succeeded", T);
    assert!(time_of(&both_done, "started_at") >= time_of(&after_ok_done, "ended_at"));
    // Its dependency failed, so it never can run: it fails, naming the dependency.
    let never = cluster.finished_as(&after_bad, "failed", T);
    assert!(never["started_at"].is_null(), "{never}");
    assert!(text(&never, "reason").contains(&bad[..10]), "{never}");
    assert_eq!(cluster.mgpu_ok(&["logs", &after_bad]), "");
}

#[test]
fn an_array_runs_at_most_its_limit_at_once_and_each_task_sees_its_index() {
    let cluster = Cluster::start(&node("3x24GiB"));
    let (array, ids) = cluster.submit_array(
        "0-5%2",
        &[],
        "echo \"index=$MGPU_ARRAY_INDEX array=$MGPU_ARRAY_ID\"; sleep 1",
    );
    let array_id = text(&array, "array_id").to_owned();
    assert_eq!(ids.len(), 6, "{array}");
    // A GPU is free, yet a task waits: the array runs as many as `%2` allows.
    wait_for("a task to wait for its array", T, || {
        cluster
            .all_jobs()
            .iter()
            .any(|j| {
                ids.iter().any(|id| j["id"] == id.as_str())
                    && text(j, "reason") == WaitReason::ArrayLimit.describe()
            })
            .then_some(())
    });
    let mut done = Vec::new();
    let mut indices = Vec::new();
    for id in &ids {
        let job = cluster.finished_as(id, "succeeded", T);
        let index = job["record"]["spec"]["array"]["index"]
            .as_u64()
            .unwrap_or_else(|| panic!("no array index in {job}"));
        assert_eq!(
            cluster.mgpu_ok(&["logs", id]),
            format!("index={index} array={array_id}\n")
        );
        indices.push(index);
        done.push(job);
    }
    indices.sort_unstable();
    assert_eq!(indices, vec![0, 1, 2, 3, 4, 5]);
    assert!(most_at_once(&done) <= 2, "more than 2 tasks ran at once");
}

/// Kills a `submit --watch` when the story ends, however it ends.
struct Watcher(std::process::Child);

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn job_files_in_csv_and_toml_run_in_their_order_and_a_watched_file_picks_up_new_lines() {
    let mut cluster = Cluster::start(&node("2x24GiB"));
    let script = install_fake_tools(&mut cluster);
    let blocker = cluster.submit(&["--gpus", "2"], "sleep 4");
    cluster.wait_state(&blocker, "running", T);

    // The CSV job format: priority (lower first), script, conda env, arguments, allowed GPUs.
    let csv = cluster.dir.path().join("jobs.txt");
    let lines = format!(
        "# priority,script_path,conda_env,arguments,allowed_gpus\n\
         2,{script},,--tag tag-third --cuda 7,\n\
         0,{script},filenv,--tag tag-first --cuda 7,1\n\
         1,{script},,--tag tag-second --cuda 7,0-1\n"
    );
    std::fs::write(&csv, lines).unwrap_or_else(|e| panic!("{e}"));
    cluster.mgpu_ok(&["submit", "--file", &csv.display().to_string()]);
    let [first, second, third] =
        ["tag-first", "tag-second", "tag-third"].map(|tag| wait_tagged(&cluster, tag, T));
    assert!(effective_priority(&cluster, &first) > effective_priority(&cluster, &second));
    assert!(effective_priority(&cluster, &second) > effective_priority(&cluster, &third));

    let first_done = cluster.finished_as(&first, "succeeded", T);
    let second_done = cluster.finished_as(&second, "succeeded", T);
    let third_done = cluster.finished_as(&third, "succeeded", T);
    assert_eq!(gpus_of(&first_done), vec![1], "allowed_gpus 1 is honoured");
    // `--cuda 7` became the assigned GPU; the conda column was activated.
    assert_eq!(
        cluster.mgpu_ok(&["logs", &first]),
        "args=--tag tag-first --cuda 1 visible=1 conda=filenv\n"
    );
    let second_gpu = gpus_of(&second_done)[0];
    assert_eq!(
        cluster.mgpu_ok(&["logs", &second]),
        format!("args=--tag tag-second --cuda {second_gpu} visible={second_gpu} conda=none\n")
    );
    let first_end = time_of(&first_done, "ended_at").min(time_of(&second_done, "ended_at"));
    assert!(
        time_of(&third_done, "started_at") >= first_end,
        "the lowest number ran last"
    );

    // The same in TOML, with the `{gpus}` placeholder written out.
    let toml = cluster.dir.path().join("jobs.toml");
    let tables = format!(
        "[[job]]\ncommand = \"python {script} --tag tag-toml-a\"\n\n\
         [[job]]\ncommand = \"python {script} --tag tag-toml-b --cuda {{gpus}}\"\n"
    );
    std::fs::write(&toml, tables).unwrap_or_else(|e| panic!("{e}"));
    cluster.mgpu_ok(&["submit", "--file", &toml.display().to_string()]);
    for tag in ["tag-toml-a", "tag-toml-b"] {
        let id = wait_tagged(&cluster, tag, T);
        let job = cluster.finished_as(&id, "succeeded", T);
        let gpu = gpus_of(&job)[0];
        let cuda = if tag == "tag-toml-b" {
            format!(" --cuda {gpu}")
        } else {
            String::new()
        };
        assert_eq!(
            cluster.mgpu_ok(&["logs", &id]),
            format!("args=--tag {tag}{cuda} visible={gpu} conda=none\n")
        );
    }

    // A watched file: a line appended later is submitted, the first line only once.
    let watched = cluster.dir.path().join("watched.txt");
    std::fs::write(&watched, format!("0,{script},,--tag tag-watch-a,\n"))
        .unwrap_or_else(|e| panic!("{e}"));
    let log = std::fs::File::create(cluster.dir.path().join("logs").join("watch.log"))
        .unwrap_or_else(|e| panic!("{e}"));
    let watcher = cluster
        .mgpu_command(
            &cluster.user_creds("alice"),
            &[
                "submit",
                "--file",
                &watched.display().to_string(),
                "--watch",
            ],
        )
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap_or_else(|e| panic!("{e}")))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting the watcher: {e}"));
    let _watcher = Watcher(watcher);
    wait_tagged(&cluster, "tag-watch-a", T);
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&watched)
        .unwrap_or_else(|e| panic!("{e}"));
    writeln!(file, "0,{script},,--tag tag-watch-b,").unwrap_or_else(|e| panic!("{e}"));
    drop(file);
    let b = wait_tagged(&cluster, "tag-watch-b", Duration::from_secs(60));
    cluster.finished_as(&b, "succeeded", T);
    assert_eq!(tagged(&cluster, "tag-watch-a").len(), 1);
}

#[test]
fn conda_environments_and_llm_profiles_shape_the_job() {
    let mut cluster = Cluster::start(&node("1x24GiB"));
    let script = install_fake_tools(&mut cluster);
    let conda = cluster.submit(&["--conda", "cli-env"], "echo conda=$CONDA_DEFAULT_ENV");
    cluster.finished_as(&conda, "succeeded", T);
    assert_eq!(cluster.mgpu_ok(&["logs", &conda]), "conda=cli-env\n");
    // A missing environment stops the job before its command, saying which.
    let missing = cluster.submit(&["--conda", "no-such-env"], "echo ran-anyway");
    let missing_done = cluster.finished_as(&missing, "failed", T);
    assert_eq!(missing_done["exit_code"], 127);
    let logs = cluster.mgpu(&["logs", &missing]);
    assert_eq!(String::from_utf8_lossy(&logs.stdout), "");
    let stderr = String::from_utf8_lossy(&logs.stderr);
    assert!(
        stderr.contains("cannot activate conda environment no-such-env"),
        "{stderr}"
    );

    // `{gpus}` in any command becomes the assigned GPUs.
    let placeholder = cluster.submit(&[], "echo cuda={gpus} visible=$CUDA_VISIBLE_DEVICES");
    cluster.finished_as(&placeholder, "succeeded", T);
    assert_eq!(
        cluster.mgpu_ok(&["logs", &placeholder]),
        "cuda=0 visible=0\n"
    );

    // The profiles file (llm_config.json): `--llm NAME` in the command sets the GPUs wanted.
    let profiles = cluster.dir.path().join("llm_config.json");
    let config = r#"{"default_requirement": 1.0, "models": {"tiny-llm": 0.5, "huge-llm": 2}}"#;
    std::fs::write(&profiles, config).unwrap_or_else(|e| panic!("{e}"));
    let profiles = profiles.display().to_string();
    let with = |extra: &[&str], args: &str| {
        let mut flags = vec!["--profiles", profiles.as_str()];
        flags.extend_from_slice(extra);
        cluster.submit(&flags, &format!("python {script} {args}"))
    };
    let tiny_a = with(&[], "--llm tiny-llm --tag a; sleep 2");
    let tiny_b = with(&[], "--llm tiny-llm --tag b; sleep 2");
    let unknown = with(&[], "--llm other-llm");
    for id in [&tiny_a, &tiny_b] {
        let job = cluster.wait_state(id, "running", T);
        assert_eq!(job["gpus_requested"].as_f64(), Some(0.5), "{job}");
        assert_eq!(job["record"]["spec"]["profile"], "tiny-llm");
    }
    assert_eq!(
        cluster.state(&tiny_a),
        "running",
        "two 0.5 profiles share the GPU"
    );
    assert_eq!(cluster.show(&unknown)["gpus_requested"].as_f64(), Some(1.0));
    // An explicit profile: two GPUs, more than this node has, so it fails at once.
    let huge = with(&["--profile", "huge-llm"], "");
    let huge_done = cluster.finished_as(&huge, "failed", T);
    assert_eq!(huge_done["gpus_requested"].as_f64(), Some(2.0));
    assert!(
        text(&huge_done, "reason").contains("largest node has 1"),
        "{huge_done}"
    );
    cluster.finished_as(&unknown, "succeeded", T);
}

#[test]
fn drained_nodes_and_paused_gpus_take_no_new_work_even_after_a_scheduler_restart() {
    let mut cluster = Cluster::start(&two_nodes());
    let running = cluster.submit(&[], "sleep 6");
    let x = text(&cluster.wait_state(&running, "running", T), "node").to_owned();
    let y = if x == "node001" { "node002" } else { "node001" };
    let y0 = format!("{y}:0");

    // Only admins may take capacity out of service.
    for args in [["node", "drain", x.as_str()], ["gpu", "pause", y0.as_str()]] {
        let out = cluster.mgpu(&args);
        assert_eq!(out.status.code(), Some(1), "alice ran mgpu {args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("permission denied"), "{stderr}");
    }
    admin_ok(&cluster, &["node", "drain", &x, "--reason", "maintenance"]);
    admin_ok(&cluster, &["gpu", "pause", &y0]);
    wait_for("the drain and the pause to be recorded", T, || {
        let admin = cluster.node_admin();
        let drained = admin.get(&x).is_some_and(|a| a.drained.is_some());
        let paused = admin.get(y).is_some_and(|a| a.paused_gpus.contains_key(&0));
        (drained && paused).then_some(())
    });
    assert_eq!(
        cluster.state(&running),
        "running",
        "drained while the job runs"
    );

    // The one GPU still offered takes the next job; one needing two GPUs waits.
    let small = cluster.finished_as(&cluster.submit(&[], "true"), "succeeded", T);
    assert_eq!((text(&small, "node"), gpus_of(&small)), (y, vec![1]));
    let big = cluster.submit(&["--gpus", "2"], "sleep 3");
    let paused_reason = WaitReason::GpusPaused.describe();
    cluster.wait_reason(&big, paused_reason, T);
    // The job already running on the drained node finishes normally.
    assert_eq!(
        cluster.finished_as(&running, "succeeded", T)["node"],
        x.as_str()
    );

    // The restarted scheduler still keeps the drained node and the paused GPU out.
    cluster.kill_scheduler();
    cluster.start_scheduler();
    let small = cluster.finished_as(&cluster.submit(&[], "true"), "succeeded", T);
    assert_eq!((text(&small, "node"), gpus_of(&small)), (y, vec![1]));
    cluster.wait_reason(&big, paused_reason, T);

    // Back in service: the big job runs on the resumed node, and the resumed GPU makes the
    // other node whole again.
    admin_ok(&cluster, &["node", "resume", &x]);
    assert_eq!(cluster.wait_state(&big, "running", T)["node"], x.as_str());
    admin_ok(&cluster, &["gpu", "resume", &y0]);
    let big2 = cluster.finished_as(&cluster.submit(&["--gpus", "2"], "true"), "succeeded", T);
    assert_eq!((text(&big2, "node"), gpus_of(&big2)), (y, vec![0, 1]));
}

fn admin_ok(cluster: &Cluster, args: &[&str]) {
    let out = cluster.mgpu_with(&cluster.admin_creds(), args, None);
    assert!(
        out.status.success(),
        "mgpu {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A heartbeat for `busy01`: GPU 0 mostly filled by someone else's process, GPU 1 working
/// hard for someone else, GPU 2 idle. `interval_ms` is long, so one beat keeps it online.
fn busy_node(mem_threshold: f64, load_threshold: f64) -> NodeHeartbeat {
    let gpu = |index: u32, used: u64, load: u32| GpuStatus {
        index,
        uuid: format!("GPU-busy01-{index}"),
        name: "Fake GPU".into(),
        memory_total_mib: 24_576,
        memory_used_mib: used,
        utilization_pct: load,
        temperature_c: None,
        power_w: None,
        foreign_processes: if used > 0 {
            vec![ForeignProcess {
                pid: 4242,
                used_mib: used,
                user: None,
            }]
        } else {
            Vec::new()
        },
        gpu_type: None,
    };
    NodeHeartbeat {
        node: "busy01".into(),
        sent_at: mgpu_protocol::now(),
        interval_ms: 600_000,
        gpu_source: GpuSource::Nvml,
        gpu_note: None,
        gpus: vec![gpu(0, 20_000, 0), gpu(1, 0, 95), gpu(2, 0, 0)],
        running: Vec::new(),
        address: "busy01".into(),
        runs_jobs_as: "nobody".into(),
        containment: None,
        agent_version: "test".into(),
        protocol: mgpu_protocol::version::PROTOCOL,
        mem_threshold,
        load_threshold,
        labels: Default::default(),
        fence_after_ms: None,
        kill_grace_ms: 0,
        gpu_isolation: false,
        cpus: None,
        mem_host_mib: None,
        features: Vec::new(),
    }
}

#[test]
fn gpus_busy_with_other_peoples_work_are_not_offered_until_the_thresholds_allow() {
    let real = NodeSpec::new("node001", "1x1GiB").agent_args(&[
        "--mem-threshold",
        "0.5",
        "--load-threshold",
        "0.6",
    ]);
    let cluster = Cluster::start_with(&[real, NodeSpec::without_agent("busy01")], &[]);
    // The agent announces its thresholds; nonsense ones are refused at start.
    let nodes: Value = serde_json::from_str(&cluster.mgpu_ok(&["nodes", "--json"]))
        .unwrap_or_else(|e| panic!("{e}"));
    let node001 = nodes
        .as_array()
        .and_then(|all| all.iter().find(|n| n["node"] == "node001"))
        .unwrap_or_else(|| panic!("node001 not in {nodes}"));
    assert_eq!(node001["mem_threshold"].as_f64(), Some(0.5), "{node001}");
    assert_eq!(node001["load_threshold"].as_f64(), Some(0.6), "{node001}");
    let bad = std::process::Command::new(bin_dir().join("mgpu-node"))
        .args(["--print-gpus", "--gpus", "1x1GiB", "--mem-threshold", "80"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("0.0 to 1.0"));

    // busy01 reports for itself (no agent: assigned jobs stay running, never started).
    // `--mem 2000` keeps the jobs off node001's 1 GiB GPU.
    cluster.publish_heartbeat(&busy_node(0.8, 0.8));
    cluster.wait_nodes_online(2);
    let first = cluster.submit(&["--mem", "2000"], "true");
    let placed = cluster.wait_state(&first, "running", T);
    assert_eq!(
        (text(&placed, "node"), gpus_of(&placed)),
        ("busy01", vec![2])
    );
    let second = cluster.submit(&["--mem", "2000"], "true");
    cluster.wait_reason(&second, WaitReason::GpusBusy.describe(), T);

    // 20000 of 24576 MiB is above 80% but below 90%: GPU 0 is offered now.
    cluster.publish_heartbeat(&busy_node(0.9, 0.8));
    assert_eq!(gpus_of(&cluster.wait_state(&second, "running", T)), vec![0]);
    let third = cluster.submit(&["--mem", "2000"], "true");
    cluster.wait_reason(&third, WaitReason::GpusBusy.describe(), T);
    // 95% load is below a 0.99 load threshold: GPU 1 too.
    cluster.publish_heartbeat(&busy_node(0.9, 0.99));
    assert_eq!(gpus_of(&cluster.wait_state(&third, "running", T)), vec![1]);
}
