//! Stories of components of different releases meeting during an upgrade: every heartbeat and
//! request says which protocol it speaks, and the scheduler reads that first. An agent of
//! another protocol keeps its node alive but gets no job; a request of another protocol is
//! refused with a sentence saying which side to upgrade. Nothing is decoded wrongly.

use std::time::Duration;

use mgpu_protocol::node::{GpuSource, GpuStatus, NodeHeartbeat};
use mgpu_protocol::principals::Role;
use mgpu_protocol::subjects;
use mgpu_tests::{Cluster, NodeSpec, wait_for};

const T: Duration = Duration::from_secs(20);

fn ghost_beat(protocol: u32) -> NodeHeartbeat {
    NodeHeartbeat {
        node: "ghost01".into(),
        sent_at: mgpu_protocol::now(),
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
        running: Vec::new(),
        address: "ghost01".into(),
        runs_jobs_as: "nobody".into(),
        containment: None,
        agent_version: "9.0.0".into(),
        protocol,
        mem_threshold: 1.0,
        load_threshold: 1.0,
        labels: Default::default(),
        fence_after_ms: None,
        kill_grace_ms: 0,
        gpu_isolation: false,
        cpus: None,
        mem_host_mib: None,
        features: Vec::new(),
    }
}

/// Publishes `payload` on `subject` as node ghost01, stored by JetStream.
fn publish_as_ghost(cluster: &Cluster, subject: String, payload: Vec<u8>) {
    cluster.with_nats(&cluster.creds(Role::Node, "ghost01"), |client| async move {
        async_nats::jetstream::new(client)
            .publish(subject, payload.into())
            .await
            .unwrap_or_else(|e| panic!("publishing: {e}"))
            .await
            .unwrap_or_else(|e| panic!("not stored: {e}"));
    });
}

fn scheduler_log(cluster: &Cluster) -> String {
    std::fs::read_to_string(cluster.log_path("scheduler")).unwrap_or_default()
}

/// A node whose agent was upgraded to a protocol this scheduler cannot read (a heartbeat with
/// `protocol: 99` and a field this release does not know) stays online but gets no job, and
/// the scheduler says why; `mgpu nodes` says the same instead of calling it malformed. Once
/// the agent speaks a protocol the scheduler reads, the waiting job starts there.
#[test]
fn an_agent_of_another_protocol_keeps_its_node_but_gets_no_job() {
    let cluster = Cluster::start(&[NodeSpec::without_agent("ghost01")]);
    cluster.publish_heartbeat(&ghost_beat(mgpu_protocol::version::BASELINE));
    cluster.wait_nodes_online(1);

    let mut future = serde_json::to_value(ghost_beat(99)).unwrap_or_default();
    future["field_of_the_future"] = serde_json::json!({"anything": [1, 2]});
    let payload = serde_json::to_vec(&future).unwrap_or_default();
    publish_as_ghost(&cluster, subjects::heartbeat("ghost01"), payload);
    wait_for("the scheduler to name the incompatible agent", T, || {
        let log = scheduler_log(&cluster);
        (log.contains("node ghost01") && log.contains("speaks protocol 99")).then_some(())
    });
    let log = scheduler_log(&cluster);
    assert!(log.contains("upgrade the scheduler first"), "{log}");

    let id = cluster.submit(&[], "true");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        cluster.state(&id),
        "queued",
        "no job for an incompatible node"
    );

    let nodes = cluster.mgpu(&["nodes"]);
    let err = String::from_utf8_lossy(&nodes.stderr);
    assert!(err.contains("speaks protocol 99"), "{err}");

    cluster.publish_heartbeat(&ghost_beat(mgpu_protocol::version::BASELINE));
    cluster.wait_state(&id, "running", T);
    let nodes = cluster.mgpu_ok(&["nodes"]);
    assert!(nodes.contains("protocol 1"), "{nodes}");
}

/// A request from an `mgpu` of another protocol (its `Mgpu-Protocol` header says 99) is
/// refused, not decoded: the job is never recorded, and the scheduler's refusal names the
/// protocols and which side to upgrade.
#[test]
fn a_request_of_another_protocol_is_refused_with_the_reason() {
    let cluster = Cluster::start(&[NodeSpec::new("node001", "1x24GiB")]);
    cluster.wait_nodes_online(1);
    let id = mgpu_protocol::ids::JobId::random();
    let request = mgpu_protocol::submit::SubmitRequest {
        id: id.clone(),
        user: "alice".into(),
        spec: mgpu_protocol::job::JobSpec::new(vec!["true".into()], "/tmp"),
    };
    let payload = serde_json::to_vec(&request).unwrap_or_default();
    cluster.publish_signed(
        &cluster.user_creds("alice"),
        subjects::SUBMIT,
        payload,
        &[(mgpu_protocol::version::HEADER, "99")],
    );
    wait_for("the scheduler to refuse the request", T, || {
        let log = scheduler_log(&cluster);
        log.contains("the mgpu that sent this request speaks protocol 99")
            .then_some(())
    });
    let show = cluster.mgpu(&["show", id.as_str()]);
    assert!(!show.status.success(), "the job was never recorded");
    // The same user's current mgpu is heard as usual.
    let ok = cluster.submit(&[], "true");
    cluster.finished_as(&ok, "succeeded", T);
}
