//! A job's idle GPUs, told as a story on declared GPUs fed by a `--gpu-samples` file: the
//! agent reports the job idle while its GPU sits at 0 %, working again once the file says
//! 90 %, and its usage at the end carries the idle GPU-seconds; the scheduler's `[idle]` policy
//! acting on that; and a process the file lists outside any job shown with its owner.

use std::path::Path;
use std::time::Duration;

use mgpu_tests::{Cluster, NodeSpec, wait_for};
use serde_json::Value;

const T: Duration = Duration::from_secs(20);

/// Written whole and renamed into place, so the agent never reads half a file.
fn write_samples(path: &Path, utilization_pct: u32) {
    let text = format!(
        r#"{{"gpus": [{{"index": 0, "utilization_pct": {utilization_pct}, "memory_used_mib": 1200}}]}}"#
    );
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text).unwrap_or_else(|e| panic!("writing {partial:?}: {e}"));
    std::fs::rename(&partial, path).unwrap_or_else(|e| panic!("renaming to {path:?}: {e}"));
}

/// The job's `idle` in its node's latest heartbeat, as `mgpu nodes --json` shows it.
fn idle_of(cluster: &Cluster, job: &str) -> Option<Value> {
    let out = cluster.mgpu_with(&cluster.admin_creds(), &["nodes", "--json"], None);
    let nodes: Value = serde_json::from_slice(&out.stdout).ok()?;
    nodes
        .as_array()?
        .iter()
        .flat_map(|node| node["running"].as_array().cloned().unwrap_or_default())
        .find(|running| running["id"] == job)
        .map(|running| running["idle"].clone())
}

#[test]
fn a_job_on_an_idle_gpu_is_reported_idle_until_its_gpu_works_and_its_usage_counts_it() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temporary directory: {e}"));
    let samples = dir.path().join("gpu-samples.json");
    write_samples(&samples, 0);
    let samples_arg = samples.display().to_string();
    let node = NodeSpec::new("node001", "1x24GiB").agent_args(&["--gpu-samples", &samples_arg]);
    let cluster = Cluster::start(&[node]);
    cluster.wait_nodes_online(1);

    let id = cluster.submit(&["--gpus", "1"], "sleep 120");
    cluster.wait_state(&id, "running", T);
    let idle = wait_for("the job to be idle for 2 s", T, || {
        let idle = idle_of(&cluster, &id)?;
        (idle["idle_for_secs"].as_u64()? >= 2).then_some(idle)
    });
    // One whole GPU: its idle GPU-time includes the stretch.
    assert!(idle["idle_gpu_secs"].as_u64() >= Some(2), "{idle}");

    write_samples(&samples, 90);
    wait_for("the job to work again", T, || {
        let idle = idle_of(&cluster, &id)?;
        (idle["idle_for_secs"].as_u64()? == 0).then_some(())
    });

    cluster.mgpu_ok(&["cancel", &id]);
    let ended = cluster.finished_as(&id, "cancelled", T);
    let idle_gpu_secs = ended["usage"]["idle_gpu_secs"].as_u64().unwrap_or(0);
    assert!(idle_gpu_secs >= 2, "{ended}");
}

/// The `[idle]` policy of the scheduler's config file, written where `dir` says.
fn scheduler_config(dir: &Path) -> String {
    let path = dir.join("scheduler.toml");
    let text = r#"
[idle]
after = "2s"
grace = "2s"
action = "requeue"

[qos.notebook]
allow_idle_ok = true
"#;
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("writing {path:?}: {e}"));
    path.display().to_string()
}

#[test]
fn an_idle_job_is_warned_then_requeued_for_a_waiting_one_and_an_idle_ok_job_is_left_alone() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temporary directory: {e}"));
    let samples = dir.path().join("gpu-samples.json");
    let text =
        r#"{"gpus": [{"index": 0, "utilization_pct": 0}, {"index": 1, "utilization_pct": 0}]}"#;
    std::fs::write(&samples, text).unwrap_or_else(|e| panic!("{e}"));
    let samples_arg = samples.display().to_string();
    let config = scheduler_config(dir.path());
    let node = NodeSpec::new("node001", "2x24GiB").agent_args(&["--gpu-samples", &samples_arg]);
    let cluster = Cluster::start_with(&[node], &["--config", &config]);
    cluster.wait_nodes_online(1);

    // --idle-ok where the class does not allow it: refused at submit.
    let refused = cluster.submit(&["--gpus", "1", "--idle-ok"], "sleep 60");
    let ended = cluster.finished_as(&refused, "failed", T);
    assert!(
        ended["reason"]
            .as_str()
            .is_some_and(|r| r.contains("allow_idle_ok")),
        "{ended}"
    );

    // A notebook that may sit idle, and a forgotten job that should not (it leaves on the
    // warning signal, as a job that saves its work would).
    let notebook = cluster.submit(
        &["--gpus", "1", "--qos", "notebook", "--idle-ok"],
        "sleep 300",
    );
    let forgotten = cluster.submit(&["--gpus", "1", "--signal", "USR1@1"], "sleep 300");
    cluster.wait_state(&notebook, "running", T);
    cluster.wait_state(&forgotten, "running", T);
    let warned = wait_for("the forgotten job's owner to be warned", T, || {
        let shown = cluster.show(&forgotten);
        let warning = shown["record"]["idle_warning"].clone();
        (!warning.is_null()).then_some(warning)
    });
    assert_eq!(warned["action"], "requeue", "{warned}");

    // Nobody waits: it keeps its GPU past the grace.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(cluster.state(&forgotten), "running");

    // Someone waits: the forgotten job goes back to the queue saying why, the waiting one
    // starts on its GPU, and the notebook keeps its own.
    let waiting = cluster.submit(&["--gpus", "1"], "sleep 30");
    cluster.wait_state(&waiting, "running", T);
    let requeued = wait_for("the forgotten job to be queued again", T, || {
        let shown = cluster.show(&forgotten);
        (shown["state"] == "queued").then_some(shown)
    });
    assert_eq!(
        requeued["record"]["previous_stop"], "its GPUs sat idle while another job waited",
        "{requeued}"
    );
    let notebook = cluster.show(&notebook);
    assert_eq!(notebook["state"], "running", "{notebook}");
    assert!(notebook["record"]["idle_warning"].is_null(), "{notebook}");
}

#[test]
fn a_gpu_process_mgpu_did_not_start_is_shown_with_its_owner() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temporary directory: {e}"));
    let samples = dir.path().join("gpu-samples.json");
    // A real process outside any job, listed on GPU 0 as NVML would list it.
    let mut outsider = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap_or_else(|e| panic!("starting sleep: {e}"));
    let text = format!(
        r#"{{"gpus": [{{"index": 0, "processes": [{{"pid": {}, "used_mib": 2048}}]}}]}}"#,
        outsider.id()
    );
    std::fs::write(&samples, text).unwrap_or_else(|e| panic!("{e}"));
    let samples_arg = samples.display().to_string();
    let node = NodeSpec::new("node001", "1x24GiB").agent_args(&["--gpu-samples", &samples_arg]);
    let cluster = Cluster::start(&[node]);
    cluster.wait_nodes_online(1);
    let me = std::process::Command::new("id")
        .arg("-un")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .unwrap_or_default();

    let foreign = wait_for("the outsider in the node's heartbeat", T, || {
        let out = cluster.mgpu_with(&cluster.admin_creds(), &["nodes", "--json"], None);
        let nodes: Value = serde_json::from_slice(&out.stdout).ok()?;
        let process = nodes[0]["gpus"][0]["foreign_processes"][0].clone();
        (!process.is_null()).then_some(process)
    });
    assert_eq!(foreign["user"], me.as_str(), "{foreign}");
    assert_eq!(foreign["used_mib"], 2048, "{foreign}");
    let shown = cluster.mgpu_ok(&["nodes"]);
    assert!(shown.contains(&format!("({me})")), "{shown}");
    let _ = outsider.kill();
    let _ = outsider.wait();
}
