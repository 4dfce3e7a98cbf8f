//! GPU types and node features, end to end: agents declare typed GPUs and features, jobs ask
//! for types in order of preference (waiting for a preferred one only when it frees up soon)
//! and for features, and what no node has is refused at submit, naming what the cluster has; `mgpu report --by type` splits GPU time by type.

use std::time::Duration;

use mgpu_tests::{Cluster, NodeSpec};
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

fn text<'a>(job: &'a Value, field: &str) -> &'a str {
    job[field].as_str().unwrap_or("")
}

#[test]
fn jobs_get_the_gpu_types_and_node_features_they_ask_for() {
    let nodes = [
        NodeSpec::new("node001", "1x80GiB:h100").agent_args(&["--feature", "ib"]),
        NodeSpec::new("node002", "2x40GiB").agent_args(&["--gpu-type", "a100-40gb"]),
    ];
    let cluster = Cluster::start(&nodes);

    // The H100 for the first, the A100 (its second choice) for the second while it is busy.
    let first = cluster.submit(&["--gpus", "h100:1"], "sleep 3");
    let on_h100 = cluster.wait_state(&first, "running", T);
    assert_eq!(text(&on_h100, "node"), "node001", "{on_h100}");
    let second = cluster.submit(&["--gpu-type", "h100,a100-40gb"], "true");
    let on_a100 = cluster.finished_as(&second, "succeeded", T);
    assert_eq!(text(&on_a100, "node"), "node002", "{on_a100}");
    // Only node001 has `ib`: this one waits for it.
    let fast = cluster.submit(&["--constraint", "ib"], "true");
    let done = cluster.finished_as(&fast, "succeeded", T);
    assert_eq!(text(&done, "node"), "node001", "{done}");
    let shown: Value = serde_json::from_str(&cluster.mgpu_ok(&["show", &fast, "--json"]))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(shown["record"]["spec"]["constraint"], "ib", "{shown}");
    let typed: Value = serde_json::from_str(&cluster.mgpu_ok(&["show", &second, "--json"]))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        typed["record"]["spec"]["gpu_types"],
        serde_json::json!(["h100", "a100-40gb"])
    );

    // GPU time by type, from the nodes' types.
    cluster.finished_as(&first, "succeeded", T);
    let report: Value =
        serde_json::from_str(&cluster.mgpu_ok(&["report", "--mine", "--by", "type", "--json"]))
            .unwrap_or_else(|e| panic!("{e}"));
    let types: Vec<&str> = report["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g["type"].as_str())
        .collect();
    assert_eq!(types, ["a100-40gb", "h100"], "{report}");

    // What no node has is refused at once, naming what there is.
    let refused = [
        (
            cluster.submit(&["--gpu-type", "rtx-4090"], "true"),
            "no node has GPU type rtx-4090 (the cluster has: a100-40gb, h100)",
        ),
        (
            cluster.submit(&["--constraint", "ib&nvlink"], "true"),
            "no node has the feature nvlink (the cluster has: ib)",
        ),
    ];
    for (id, says) in refused {
        let job = cluster.finished_as(&id, "failed", T);
        assert!(text(&job, "reason").contains(says), "{job}");
    }
    // A malformed one never leaves the command line.
    let out = cluster.mgpu(&["submit", "--constraint", "ib&", "--", "true"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("expected a feature name"),
        "{out:?}"
    );
}

#[test]
fn a_job_waits_for_its_preferred_type_when_one_frees_up_soon() {
    let nodes = [
        NodeSpec::new("node001", "1x80GiB:h100"),
        NodeSpec::new("node002", "1x40GiB:a100"),
    ];
    let cluster = Cluster::start(&nodes);
    // The H100 is held by a job due to end within minutes: worth waiting for.
    let holder = cluster.submit(
        &[
            "--gpus",
            "h100:1",
            "--time-limit",
            "5m",
            "--on-timeout",
            "fail",
        ],
        "sleep 300",
    );
    cluster.wait_state(&holder, "running", T);
    let waiter = cluster.submit(&["--gpu-type", "h100,a100"], "sleep 30");
    cluster.wait_reason(
        &waiter,
        "waiting a while for a GPU of a type it prefers, expected free soon",
        T,
    );
    // Once it is free, the H100 is the waiter's; the A100 was left alone.
    cluster.mgpu_ok(&["cancel", &holder]);
    let started = cluster.wait_state(&waiter, "running", T);
    assert_eq!(text(&started, "node"), "node001", "{started}");
}
