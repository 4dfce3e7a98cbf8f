//! Every line a job prints is kept, told as a story on a cluster of three nats-servers: while
//! a job prints numbered lines, the server leading the output stream is frozen for longer than
//! a publish waits for its acknowledgement (SIGSTOP, then SIGCONT). The agent offers each chunk
//! JetStream did not confirm again, and `mgpu logs` puts a chunk stored late back in its place:
//! the job's output holds every line, once, in order.

use std::time::Duration;

use mgpu_protocol::subjects;
use mgpu_tests::{Cluster, NodeSpec, wait_for};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const LINES: u32 = 150;

#[test]
fn a_job_printing_while_the_output_streams_leader_is_frozen_keeps_every_line_in_order() {
    // The frozen server may lead the heartbeat stream too: neither the scheduler (100 missed
    // beats of 200 ms) nor the agent's fence (30 s) may give the node up meanwhile.
    let cluster = Cluster::start_on_nats_cluster(
        3,
        &[NodeSpec::new("node001", "1x24GiB").agent_args(&["--fence-after", "30s"])],
        &["--missed-heartbeats", "100"],
    );
    let job = cluster.submit(
        &[],
        &format!("for i in $(seq 1 {LINES}); do echo \"line $i\"; sleep 0.04; done"),
    );
    cluster.wait_state(&job, "running", Duration::from_secs(30));
    let leader = wait_for(
        "the output stream's leader",
        Duration::from_secs(10),
        || {
            cluster
                .stream_leaders()
                .get(subjects::OUTPUT_STREAM)
                .cloned()
        },
    );
    let pid = cluster
        .nats_server_pid(&leader)
        .unwrap_or_else(|| panic!("{leader} does not run"));
    let pid = Pid::from_raw(i32::try_from(pid).unwrap_or(0));
    std::thread::sleep(Duration::from_millis(500));
    kill(pid, Signal::SIGSTOP).unwrap_or_else(|e| panic!("{e}"));
    // Longer than a publish waits for its acknowledgement (5 s).
    std::thread::sleep(Duration::from_secs(7));
    kill(pid, Signal::SIGCONT).unwrap_or_else(|e| panic!("{e}"));
    cluster.finished_as(&job, "succeeded", Duration::from_secs(90));
    let logs = cluster.mgpu_ok(&["logs", &job]);
    let numbers: Vec<u32> = logs
        .lines()
        .filter_map(|line| line.strip_prefix("line "))
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let expected: Vec<u32> = (1..=LINES).collect();
    assert_eq!(numbers, expected, "the job's output:\n{logs}");
}
