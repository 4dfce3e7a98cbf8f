//! Limits per user, told as stories: `[limits]` in the scheduler's config file caps a user's
//! running GPUs (the jobs over it wait, saying which limit, while other users' jobs start), is
//! re-read when the file changes (raising a cap starts what waited), and refuses at once a
//! submission over a user's queued-jobs limit or over a hard cap, naming the limit; a user's
//! group (`mgpu admin add-user --group`) picks the group's table; a cap per GPU type keeps a
//! user off that type only.

use std::path::{Path, PathBuf};
use std::time::Duration;

use mgpu_tests::{Cluster, NodeSpec, wait_for};
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

fn write_config(path: &Path, limits: &str) {
    // Written whole and renamed, as an editor saves: the scheduler never reads half a file.
    let partial = path.with_extension("partial");
    std::fs::write(&partial, format!("missed_heartbeats = 5\n\n{limits}"))
        .unwrap_or_else(|e| panic!("{e}"));
    std::fs::rename(&partial, path).unwrap_or_else(|e| panic!("{e}"));
}

fn cluster_with_limits(gpus: &str, limits: &str) -> (Cluster, PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let config = dir.path().join("scheduler.toml");
    write_config(&config, limits);
    let path = config.display().to_string();
    let cluster = Cluster::start_with(&[NodeSpec::new("node001", gpus)], &["--config", &path]);
    (cluster, config, dir)
}

fn submit_as(cluster: &Cluster, user: &str, extra: &[&str], command: &str) -> String {
    cluster
        .submit_as(&cluster.user_creds(user), extra, command)
        .0
}

fn states(cluster: &Cluster, ids: &[String]) -> Vec<String> {
    ids.iter().map(|id| cluster.state(id)).collect()
}

#[test]
fn a_user_at_their_gpu_cap_waits_while_others_start_and_a_raised_cap_starts_the_rest() {
    let (cluster, config, dir) =
        cluster_with_limits("8x24GiB", "[limits.default]\nmax_gpus_running = 2\n");
    let alices: Vec<String> = (0..4)
        .map(|_| submit_as(&cluster, "alice", &["--gpus", "1"], "sleep 60"))
        .collect();
    wait_for("two of alice's jobs to run", T, || {
        let running = states(&cluster, &alices)
            .iter()
            .filter(|s| *s == "running")
            .count();
        (running == 2).then_some(())
    });
    for id in &alices {
        if cluster.state(id) == "queued" {
            let job = cluster.wait_reason(
                id,
                "waiting: its owner runs as many GPUs as their max_gpus_running limit allows",
                T,
            );
            assert_eq!(job["user"], "alice", "{job}");
        }
    }
    // The queue says why, in the words a person reads.
    let queue = cluster.mgpu_ok(&["queue"]);
    assert!(queue.contains("max_gpus_running"), "{queue}");

    // Bob's job behind alice's waiting ones starts on the GPUs left.
    let bobs = submit_as(&cluster, "bob", &["--gpus", "1"], "sleep 60");
    cluster.wait_state(&bobs, "running", T);
    std::thread::sleep(Duration::from_secs(1));
    let running = states(&cluster, &alices)
        .iter()
        .filter(|s| *s == "running")
        .count();
    assert_eq!(running, 2, "alice's cap held while bob's job started");

    // Carol, added while the scheduler runs, has the default cap too.
    let carols = add_user_and_submit(&cluster, dir.path(), "carol", 3);
    wait_for("two of carol's jobs to run", T, || {
        let running = states(&cluster, &carols)
            .iter()
            .filter(|s| *s == "running")
            .count();
        (running == 2).then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        states(&cluster, &carols)
            .iter()
            .filter(|s| *s == "running")
            .count(),
        2,
        "carol's cap held"
    );

    // The cap raised in the file, no restart: the rest of alice's and carol's jobs start.
    write_config(&config, "[limits.default]\nmax_gpus_running = 4\n");
    wait_for("all of alice's and carol's jobs to run", T, || {
        states(&cluster, &alices)
            .iter()
            .chain(&states(&cluster, &carols))
            .all(|s| s == "running")
            .then_some(())
    });
    for id in alices.iter().chain(&carols).chain([&bobs]) {
        cluster.mgpu_ok_with(&cluster.admin_creds(), &["cancel", id]);
    }
}

/// Adds `user` while the cluster runs (the server reloads its configuration, as for
/// `scripts/dev-up.sh`), and submits `jobs` one-GPU jobs as them; their ids.
fn add_user_and_submit(cluster: &Cluster, scratch: &Path, user: &str, jobs: usize) -> Vec<String> {
    let auth_dir = cluster.auth_dir();
    cluster.let_admin_reload_server();
    let key = scratch.join(format!("{user}.nk"));
    let (dir, out) = (auth_dir.display().to_string(), key.display().to_string());
    cluster.mgpu_ok_with(
        &cluster.admin_creds(),
        &["admin", "add-user", user, "--dir", &dir, "--out", &out],
    );
    (0..jobs)
        .map(|_| {
            wait_for(&format!("{user} to be let in"), T, || {
                let out = cluster.mgpu_with(
                    &key,
                    &["submit", "-q", "--gpus", "1", "--", "sleep 60"],
                    None,
                );
                out.status
                    .success()
                    .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
            })
        })
        .collect()
}

fn ended_reason(cluster: &Cluster, id: &str) -> String {
    let job: Value = cluster.finished_as(id, "failed", T);
    job["reason"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn submissions_over_a_queued_limit_or_a_hard_cap_are_refused_naming_the_limit() {
    let (cluster, _config, _dir) = cluster_with_limits(
        "1x24GiB",
        r#"
[limits.default]
max_jobs_queued = 1

[limits.group.students]
max_gpus_per_job = 1

[limits.user.alice]
max_time_limit = "1h"
"#,
    );
    let dir = cluster.auth_dir().display().to_string();
    cluster.mgpu_ok_with(
        &cluster.admin_creds(),
        &[
            "admin", "add-user", "alice", "--group", "students", "--dir", &dir,
        ],
    );
    // The scheduler re-reads the principals file when it changes; give it its tick.
    std::thread::sleep(Duration::from_secs(2));

    // A group's hard cap, and the user's own time cap.
    let big = submit_as(&cluster, "alice", &["--gpus", "2"], "true");
    let why = ended_reason(&cluster, &big);
    assert!(
        why.contains("max_gpus_per_job = 1 ([limits.group.students])"),
        "{why}"
    );
    let long = submit_as(&cluster, "alice", &["--time-limit", "2h"], "true");
    let why = ended_reason(&cluster, &long);
    assert!(
        why.contains("max_time_limit = 1h00m ([limits.user.alice])"),
        "{why}"
    );
    // Without a time limit, the job gets the cap.
    let capped = submit_as(&cluster, "alice", &[], "true");
    cluster.finished_as(&capped, "succeeded", T);
    assert_eq!(
        cluster.show(&capped)["record"]["spec"]["time_limit_secs"],
        3600
    );

    // Bob may have one job queued: one runs, one waits, the third is refused.
    let running = submit_as(&cluster, "bob", &[], "sleep 60");
    cluster.wait_state(&running, "running", T);
    let waiting = submit_as(&cluster, "bob", &[], "true");
    cluster.wait_state(&waiting, "queued", T);
    let third = submit_as(&cluster, "bob", &[], "true");
    let why = ended_reason(&cluster, &third);
    assert!(
        why.contains("max_jobs_queued = 1 ([limits.default]): bob has 1 jobs queued"),
        "{why}"
    );
    cluster.mgpu_ok_with(&cluster.admin_creds(), &["cancel", &running]);
    cluster.finished_as(&waiting, "succeeded", T);
}

#[test]
fn a_cap_per_gpu_type_keeps_a_user_to_it_while_other_types_and_users_run() {
    let (cluster, _config, _dir) = {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let config = dir.path().join("scheduler.toml");
        write_config(&config, "[limits.default.max_gpus_running]\nh100 = 1\n");
        let path = config.display().to_string();
        let nodes = [
            NodeSpec::new("node001", "2x80GiB:h100"),
            NodeSpec::new("node002", "1x40GiB:a100"),
        ];
        let cluster = Cluster::start_with(&nodes, &["--config", &path]);
        (cluster, config, dir)
    };
    // Two H100s at once are more than the cap: refused at once, naming it.
    let both = submit_as(&cluster, "alice", &["--gpus", "h100:2"], "true");
    let why = ended_reason(&cluster, &both);
    assert!(
        why.contains("max_gpus_running.h100 = 1 ([limits.default])"),
        "{why}"
    );

    // One H100 runs; her second H100 job waits on her limit, her A100 job and bob's H100 job
    // start.
    let first = submit_as(&cluster, "alice", &["--gpus", "h100:1"], "sleep 60");
    cluster.wait_state(&first, "running", T);
    let second = submit_as(&cluster, "alice", &["--gpus", "h100:1"], "sleep 60");
    let other_type = submit_as(&cluster, "alice", &["--gpu-type", "h100,a100"], "sleep 60");
    let bobs = submit_as(&cluster, "bob", &["--gpus", "h100:1"], "sleep 60");
    cluster.wait_state(&bobs, "running", T);
    let on_a100 = cluster.wait_state(&other_type, "running", T);
    assert_eq!(on_a100["node"], "node002", "{on_a100}");
    cluster.wait_reason(
        &second,
        "waiting: its owner runs as many GPUs as their max_gpus_running limit allows",
        T,
    );
}

#[test]
fn a_class_cap_holds_a_users_jobs_of_that_class_and_not_their_others() {
    let (cluster, _config, _dir) = cluster_with_limits(
        "4x24GiB",
        "[qos.urgent]\nmax_gpus_running = 1\nmax_time_limit = \"30m\"\n",
    );
    let first = submit_as(&cluster, "alice", &["--qos", "urgent"], "sleep 60");
    cluster.wait_state(&first, "running", T);
    // Without a time limit of its own, it got its class's.
    assert_eq!(
        cluster.show(&first)["record"]["spec"]["time_limit_secs"],
        1800
    );
    let second = submit_as(&cluster, "alice", &["--qos", "urgent"], "sleep 60");
    let plain = submit_as(&cluster, "alice", &[], "sleep 60");
    let bobs = submit_as(&cluster, "bob", &["--qos", "urgent"], "sleep 60");
    cluster.wait_state(&plain, "running", T);
    cluster.wait_state(&bobs, "running", T);
    cluster.wait_reason(
        &second,
        "waiting: its owner runs as many GPUs as their max_gpus_running limit allows",
        T,
    );
}
