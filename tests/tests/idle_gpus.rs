//! A job's idle GPUs, told as a story on declared GPUs fed by a `--gpu-samples` file: the
//! agent reports the job idle while its GPU sits at 0 %, working again once the file says
//! 90 %, and its usage at the end carries the idle GPU-seconds.

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
