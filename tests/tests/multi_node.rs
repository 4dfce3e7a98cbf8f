//! Jobs that span nodes, told as stories against real agents: gang allocation (all nodes or
//! none), `--nodelist`, `--exclude` and `--node-gpu-ids`, rack-aware choice of nodes,
//! `--distributed` with the torchrun variables and every rank's output tagged with its rank,
//! and one failing rank stopping the others.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use mgpu_protocol::{output, subjects};
use mgpu_tests::{Cluster, NodeSpec, process_alive, wait_for};
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

fn nodes_of(job: &Value) -> Vec<String> {
    job["nodes"]
        .as_array()
        .map(|nodes| {
            nodes
                .iter()
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// (rank header, payload) of every output message of `id`, end-of-output markers included.
fn output_messages(cluster: &Cluster, id: &str) -> Vec<(String, String, String)> {
    let subject = subjects::output(&id.parse().unwrap_or_else(|e| panic!("job id: {e}")));
    cluster.with_nats(&cluster.admin_creds(), |client| async move {
        let js = async_nats::jetstream::new(client);
        let stream = js
            .get_stream(subjects::OUTPUT_STREAM)
            .await
            .unwrap_or_else(|e| panic!("output stream: {e}"));
        let consumer = stream
            .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
                filter_subject: subject,
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("consumer: {e}"));
        let mut messages = consumer
            .messages()
            .await
            .unwrap_or_else(|e| panic!("messages: {e}"));
        let mut out = Vec::new();
        while let Ok(Some(Ok(message))) =
            tokio::time::timeout(Duration::from_millis(500), messages.next()).await
        {
            let header = |name: &str| {
                message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get(name))
                    .map(|v| v.as_str().to_owned())
                    .unwrap_or_default()
            };
            out.push((
                header(output::RANK),
                header(output::STREAM),
                String::from_utf8_lossy(&message.payload).into_owned(),
            ));
        }
        out
    })
}

#[test]
fn a_distributed_job_runs_once_per_node_with_the_rendezvous_variables() {
    let cluster = Cluster::start(&[
        NodeSpec::new("node001", "2x24GiB"),
        NodeSpec::new("node002", "2x24GiB"),
        NodeSpec::new("node003", "2x24GiB"),
    ]);
    cluster.wait_nodes_online(3);
    let command = r#"echo "rank=$NODE_RANK nnodes=$NNODES master=$MASTER_ADDR:$MASTER_PORT gpn=$GPUS_PER_NODE world=$WORLD_SIZE cuda=$CUDA_VISIBLE_DEVICES node=$MGPU_NODE"; cat "$MGPU_HOSTFILE""#;
    let id = cluster.submit(
        &["--nodes", "2", "--gpus-per-node", "2", "--distributed"],
        command,
    );
    let job = cluster.finished_as(&id, "succeeded", T);
    let nodes = nodes_of(&job);
    assert_eq!(nodes.len(), 2, "{job}");
    assert_ne!(nodes[0], nodes[1]);

    let messages = output_messages(&cluster, &id);
    let mut ranks_seen = BTreeSet::new();
    let mut master = BTreeSet::new();
    for (rank, stream, text) in &messages {
        if stream == output::EOF {
            ranks_seen.insert(rank.clone());
            continue;
        }
        for line in text.lines().filter(|l| l.starts_with("rank=")) {
            assert!(
                line.starts_with(&format!("rank={rank} ")),
                "output tagged rank {rank} says {line}"
            );
            assert!(line.contains("nnodes=2 "), "{line}");
            assert!(line.contains("gpn=2 world=4 "), "{line}");
            assert!(line.contains("cuda=0,1 "), "{line}");
            let node = &nodes[rank.parse::<usize>().unwrap_or(9)];
            assert!(line.ends_with(&format!("node={node}")), "{line}");
            master.insert(line.split("master=").nth(1).map(|m| m.split(' ').next()));
        }
    }
    assert_eq!(
        ranks_seen,
        BTreeSet::from(["0".to_owned(), "1".to_owned()]),
        "both ranks ended their output: {messages:?}"
    );
    assert_eq!(
        master.len(),
        1,
        "every rank has the same master: {master:?}"
    );
    // The hostfile lists both nodes with their GPU count.
    let logs = cluster.mgpu_ok(&["logs", &id]);
    assert_eq!(logs.matches(" slots=2").count(), 4, "{logs}");
}

#[test]
fn one_failing_rank_stops_the_others_and_fails_the_job() {
    let cluster = Cluster::start(&[
        NodeSpec::new("node001", "1x24GiB"),
        NodeSpec::new("node002", "1x24GiB"),
    ]);
    cluster.wait_nodes_online(2);
    let pids = cluster.dir.path().join("pids");
    std::fs::create_dir_all(&pids).unwrap_or_else(|e| panic!("{e}"));
    let command = format!(
        r#"echo $$ > "{dir}/rank$NODE_RANK"; if [ "$NODE_RANK" = 1 ]; then sleep 1; exit 3; fi; sleep 120"#,
        dir = pids.display()
    );
    let id = cluster.submit(&["--nodes", "2", "--distributed"], &command);
    let job = cluster.finished_as(&id, "failed", T);
    let reason = job["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("rank 1") && reason.contains("exit code 3"),
        "{reason}"
    );
    // Rank 0 was stopped, not left sleeping: its process is gone within the kill grace.
    let rank0: i32 = std::fs::read_to_string(pids.join("rank0"))
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("rank 0 pid: {e}"));
    wait_for("rank 0 to be stopped", T, || {
        (!process_alive(rank0)).then_some(())
    });
    // Both nodes are free again.
    let next = cluster.submit(&["--nodes", "2"], "true");
    cluster.finished_as(&next, "succeeded", T);
}

#[test]
fn a_multi_node_job_starts_on_all_its_nodes_or_waits_holding_nothing() {
    let cluster = Cluster::start(&[
        NodeSpec::new("node001", "1x24GiB"),
        NodeSpec::new("node002", "1x24GiB"),
    ]);
    cluster.wait_nodes_online(2);
    let blocker = cluster.submit(
        &[
            "--nodelist",
            "node002",
            "--time-limit",
            "2m",
            "--on-timeout",
            "fail",
        ],
        "sleep 120",
    );
    cluster.wait_state(&blocker, "running", T);
    let gang = cluster.submit(&["--nodes", "2"], "echo $MGPU_NODELIST");
    let waiting = cluster.wait_reason(&gang, "waiting for GPUs to become free", T);
    assert!(nodes_of(&waiting).is_empty(), "{waiting}");
    // node001's GPU is not held by the waiting gang (nothing of it was placed): a short job
    // pinned there runs while the gang waits, since it ends before the gang's reservation
    // begins (when the blocker's time limit frees node002).
    let small = cluster.submit(
        &[
            "--nodelist",
            "node001",
            "--priority",
            "-5",
            "--time-limit",
            "10s",
        ],
        "true",
    );
    cluster.finished_as(&small, "succeeded", T);
    assert_eq!(cluster.state(&gang), "queued");

    cluster.mgpu_ok(&["cancel", &blocker]);
    let job = cluster.finished_as(&gang, "succeeded", T);
    assert_eq!(nodes_of(&job), vec!["node001", "node002"]);
    // Not distributed: the command ran once, on rank 0, and knew every node.
    let logs = cluster.mgpu_ok(&["logs", &gang]);
    assert_eq!(logs.trim(), "node001,node002");
}

#[test]
fn nodelist_exclude_node_gpu_ids_and_racks_choose_the_nodes() {
    let racked = |name: &str, rack: &str| {
        NodeSpec::new(name, "2x24GiB").agent_args(&["--label", &format!("rack={rack}")])
    };
    let cluster = Cluster::start(&[
        racked("node001", "r1"),
        racked("node002", "r2"),
        racked("node003", "r1"),
    ]);
    cluster.wait_nodes_online(3);

    // Seed 000's form: --gpus counts all the GPUs named, and nodes may get different counts.
    let pinned = cluster.submit(
        &[
            "--gpus",
            "3",
            "--node-gpu-ids",
            "node003:1,0;node002:1",
            "--distributed",
        ],
        "echo $NODE_RANK:$MGPU_NODE:$CUDA_VISIBLE_DEVICES:$WORLD_SIZE",
    );
    let job = cluster.finished_as(&pinned, "succeeded", T);
    assert_eq!(nodes_of(&job), vec!["node003", "node002"]);
    let logs = cluster.mgpu_ok(&["logs", &pinned]);
    let mut lines: Vec<&str> = logs.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, vec!["0:node003:1,0:3", "1:node002:1:3"]);
    let bad = cluster.mgpu(&[
        "submit",
        "--gpus",
        "5",
        "--node-gpu-ids",
        "node003:1,0;node002:1",
        "--",
        "true",
    ]);
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("nor the total (3)"), "{stderr}");

    let excluded = cluster.submit(&["--nodes", "2", "--exclude", "node001"], "true");
    let job = cluster.finished_as(&excluded, "succeeded", T);
    assert!(!nodes_of(&job).contains(&"node001".to_owned()), "{job}");

    // Two nodes out of three, one of them on another rack: the pair shares rack r1.
    let racks = cluster.submit(&["--nodes", "2", "--gpus-per-node", "2"], "true");
    let job = cluster.finished_as(&racks, "succeeded", T);
    let mut chosen = nodes_of(&job);
    chosen.sort();
    assert_eq!(chosen, vec!["node001", "node003"]);

    // A node that never joined is refused, not waited for forever.
    let typo = cluster.submit(&["--nodelist", "node001,nodeXYZ"], "true");
    let job = cluster.finished_as(&typo, "failed", T);
    let reason = job["reason"].as_str().unwrap_or("");
    assert!(reason.contains("nodeXYZ is not known"), "{reason}");

    // Bad combinations never reach the scheduler.
    let bad = cluster.mgpu(&[
        "submit",
        "--nodes",
        "1",
        "--nodelist",
        "node001,node002",
        "--",
        "true",
    ]);
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("--nodelist names 2 nodes"), "{stderr}");
    let bad = cluster.mgpu(&["submit", "--node-gpu-ids", "node001", "--", "true"]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("NODE:IDS"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

#[test]
fn losing_one_node_of_a_distributed_job_requeues_it_whole_and_stops_the_other_ranks() {
    let mut cluster = Cluster::start_with(
        &[
            NodeSpec::new("node001", "1x24GiB"),
            NodeSpec::new("node002", "1x24GiB"),
            NodeSpec::new("node003", "1x24GiB"),
        ],
        &["--missed-heartbeats", "3"],
    );
    cluster.wait_nodes_online(3);
    let pids = cluster.dir.path().join("pids");
    std::fs::create_dir_all(&pids).unwrap_or_else(|e| panic!("{e}"));
    let command = format!(
        r#"echo $$ > "{dir}/a$MGPU_ATTEMPT-r$NODE_RANK-$MGPU_NODE"; if [ "$MGPU_ATTEMPT" = 1 ]; then sleep 120; fi"#,
        dir = pids.display()
    );
    let id = cluster.submit(&["--nodes", "2", "--distributed"], &command);
    let running = wait_for("both ranks to start", T, || {
        let job = cluster.show(&id);
        let started = job["record"]["ranks_started"]
            .as_array()
            .map_or(0, Vec::len);
        (started == 2).then_some(job)
    });
    let nodes = nodes_of(&running);
    let pid_of = |attempt: u32, rank: usize| -> i32 {
        let file = pids.join(format!("a{attempt}-r{rank}-{}", nodes[rank]));
        wait_for(&format!("{}", file.display()), T, || {
            std::fs::read_to_string(&file).ok()?.trim().parse().ok()
        })
    };
    let rank0 = pid_of(1, 0);
    cluster.kill_agent(&nodes[1]);
    // The job goes back to the queue as attempt 2; rank 0 of attempt 1 is stopped at once,
    // not left holding its node.
    wait_for("rank 0 of attempt 1 to be stopped", T, || {
        (!process_alive(rank0)).then_some(())
    });
    let job = cluster.finished_as(&id, "succeeded", T);
    assert_eq!(job["attempt"], 2, "{job}");
    let second = nodes_of(&job);
    assert!(
        !second.contains(&nodes[1]),
        "ran again on the lost node: {second:?}"
    );
}
