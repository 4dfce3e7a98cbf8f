//! Hostile input: garbage, oversized and absurd messages on every subject the services read,
//! each published with the credentials of the role allowed to publish there (or, where the
//! server refuses it, that refusal is the pass). Afterwards the scheduler and the agent still
//! run, every job record is as it was, and a new job still runs.

use std::time::Duration;

use async_nats::jetstream;
use mgpu_protocol::principals::Role;
use mgpu_protocol::subjects;
use mgpu_tests::{Cluster, NodeSpec};
use serde_json::{Value, json};

/// Payloads that are not what any handler accepts: not JSON, wrong JSON, huge, absurd.
fn garbage(job: &str, valid: &Value) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = vec![
        Vec::new(),
        b"\x00\xff\xfe not json".to_vec(),
        b"{".to_vec(),
        b"null".to_vec(),
        b"[]".to_vec(),
        b"{}".to_vec(),
        // Larger than every handler's limit, below the server's 1 MiB max_payload.
        format!("{{\"user\":\"{}\"}}", "x".repeat(1000 * 1000)).into_bytes(),
    ];
    let mut unknown = valid.clone();
    unknown["surprise"] = json!(1);
    out.push(unknown.to_string().into_bytes());
    for (field, value) in [
        ("user", json!("bad user\u{1b}[2J")),
        ("user", json!("")),
        ("node", json!("node.*>")),
        ("job_id", json!(format!("{job}.*"))),
        ("attempt", json!(-1)),
        ("gpus", json!(-2)),
        ("interval_ms", json!(u64::MAX)),
        ("fence_after_ms", json!(u64::MAX)),
        ("mem_threshold", json!(1e308)),
        ("at", json!("9999-12-31T23:59:59Z")),
        ("sent_at", json!("9999-12-31T23:59:59Z")),
        ("reason", json!("r".repeat(70_000))),
        ("index", json!(4_000_000_000u64)),
    ] {
        let mut doc = valid.clone();
        if doc.get(field).is_some() {
            doc[field] = value;
            out.push(doc.to_string().into_bytes());
        }
    }
    for (field, value) in [
        ("time_limit_secs", json!(3_153_600_000u64)),
        ("priority", json!(i64::from(i32::MAX))),
        ("gpus", json!(-1)),
        ("command", json!([])),
        ("nodelist", json!(["a b", "c.d"])),
        (
            "env",
            Value::Object((0..5000).map(|i| (format!("V{i}"), json!("x"))).collect()),
        ),
    ] {
        let mut doc = valid.clone();
        if doc.get("spec").is_some() {
            doc["spec"][field] = value;
            out.push(doc.to_string().into_bytes());
        }
    }
    out
}

/// Publishes each payload on `subject` through JetStream with `role`'s credentials; returns
/// how many the server refused (no permission, or too large to store).
fn publish_all(
    cluster: &Cluster,
    role: Role,
    name: &str,
    subject: &str,
    payloads: Vec<Vec<u8>>,
) -> usize {
    let subject = subject.to_owned();
    cluster.with_nats(&cluster.creds(role, name), |client| async move {
        let js = jetstream::new(client.clone());
        let mut refused = 0;
        for payload in payloads {
            let stored = async { js.publish(subject.clone(), payload.into()).await?.await };
            match tokio::time::timeout(Duration::from_secs(5), stored).await {
                Ok(Ok(_)) => {}
                // The server refuses a forbidden publish; the request then times out or fails.
                Ok(Err(_)) | Err(_) => refused += 1,
            }
        }
        refused
    })
}

#[test]
fn garbage_on_every_subject_changes_nothing() {
    let mut cluster = Cluster::start(&[NodeSpec::new("node001", "2x24GiB")]);
    let done = cluster.submit(&["--gpus", "1"], "true");
    cluster.finished_as(&done, "succeeded", Duration::from_secs(30));
    let running = cluster.submit(&["--gpus", "1"], "sleep 300");
    cluster.wait_state(&running, "running", Duration::from_secs(30));
    let queued = cluster.submit(&["--gpus", "2"], "true");
    let held = cluster.submit(&["--gpus", "2"], "true");
    cluster.mgpu_ok(&["hold", &held]);
    std::thread::sleep(Duration::from_secs(1));
    let before: Vec<Value> = [&done, &running, &queued, &held]
        .iter()
        .map(|id| cluster.show(id))
        .collect();

    let submit = json!({"id": "0123456789abcdef0123456789abcdef", "user": "alice",
        "spec": {"command": ["true"], "workdir": "/tmp"}});
    let cancel = json!({"user": "alice", "reason": "why"});
    let hold = json!({"user": "alice"});
    let admin = json!({"action": "pause_gpu", "node": "node001", "index": 0, "by": "admin"});
    let beat = json!({"node": "node001", "sent_at": mgpu_protocol::now(), "interval_ms": 2000,
        "gpu_source": "declared", "gpus": [], "running": [], "address": "h",
        "runs_jobs_as": "u", "agent_version": "0", "mem_threshold": 0.8, "fence_after_ms": 1000});
    let event = json!({"job_id": running, "attempt": 1, "at": mgpu_protocol::now(),
        "source": {"kind": "node", "name": "node001"}, "event": "exited", "exit_code": 1});
    let assign = json!({"job_id": running, "attempt": 1, "user": "alice",
        "spec": {"command": ["true"], "workdir": "/tmp"},
        "placement": {"node": "node001", "gpus": [{"index": 0, "amount": 1}]}});
    let control = json!({"action": "kill", "job_id": running, "attempt": 7, "reason": "x"});

    for id in [&done, &running, &queued, &held] {
        publish_all(
            &cluster,
            Role::User,
            "alice",
            &format!("jobs.{id}.cancel"),
            garbage(id, &cancel),
        );
        for kind in ["hold", "release"] {
            publish_all(
                &cluster,
                Role::User,
                "alice",
                &format!("jobs.{id}.{kind}"),
                garbage(id, &hold),
            );
        }
        publish_all(
            &cluster,
            Role::Node,
            "node001",
            &format!("jobs.{id}.events"),
            garbage(id, &event),
        );
        // Bytes on a job's input go to that job only, whatever they are.
        publish_all(
            &cluster,
            Role::User,
            "alice",
            &format!("jobs.{id}.input"),
            vec![vec![0xff; 1000]],
        );
    }
    publish_all(
        &cluster,
        Role::User,
        "alice",
        subjects::SUBMIT,
        garbage(&running, &submit),
    );
    publish_all(
        &cluster,
        Role::Admin,
        "admin",
        subjects::ADMIN_REQUESTS,
        garbage(&running, &admin),
    );
    publish_all(
        &cluster,
        Role::Node,
        "node001",
        &subjects::heartbeat("node001"),
        garbage(&running, &beat),
    );
    publish_all(
        &cluster,
        Role::Scheduler,
        "scheduler",
        &subjects::assign("node001"),
        garbage(&running, &assign),
    );
    publish_all(
        &cluster,
        Role::Scheduler,
        "scheduler",
        &subjects::control("node001"),
        garbage(&running, &control),
    );
    // A user may not publish what only the scheduler and nodes may: the server refuses it.
    let forbidden: Vec<Vec<u8>> = garbage(&running, &assign).into_iter().take(2).collect();
    let count = forbidden.len();
    assert_eq!(
        publish_all(
            &cluster,
            Role::User,
            "alice",
            &subjects::assign("node001"),
            forbidden
        ),
        count,
        "a user published an assignment"
    );

    std::thread::sleep(Duration::from_secs(3));
    let exited = cluster.exited_components();
    if !exited.is_empty() {
        cluster.dump_logs();
    }
    assert!(exited.is_empty(), "stopped on hostile input: {exited:?}");
    let after: Vec<Value> = [&done, &running, &queued, &held]
        .iter()
        .map(|id| cluster.show(id))
        .collect();
    if before != after {
        cluster.dump_logs();
    }
    assert_eq!(before, after, "job records changed");
    assert!(
        cluster
            .node_admin()
            .values()
            .all(|a| a.paused_gpus.is_empty())
    );
    // A submission whose spec is absurd is recorded as failed, with a `rejected` event
    // (the submitter sees why); nothing garbage ever queues.
    assert!(
        cluster
            .all_jobs()
            .iter()
            .filter(|j| j["id"] == "0123456789abcdef0123456789abcdef")
            .all(|j| j["state"] == "failed"),
        "a garbage submission was queued"
    );

    cluster.mgpu_ok(&["cancel", &running]);
    let fresh = cluster.submit(&["--gpus", "1"], "echo still-here");
    cluster.finished_as(&fresh, "succeeded", Duration::from_secs(30));
}

/// A node that writes (or deletes) another node's name lease is refused by the server: it
/// cannot push that node's agent out, nor let a rogue agent run as it.
#[test]
fn a_node_cannot_touch_another_nodes_name_lease() {
    let cluster = Cluster::start(&[
        NodeSpec::new("node001", "1x24GiB"),
        NodeSpec::new("node002", "1x24GiB"),
    ]);
    cluster.wait_nodes_online(2);
    let (own, other) =
        cluster.with_nats(&cluster.creds(Role::Node, "node002"), |client| async move {
            let js = jetstream::new(client);
            let Ok(leases) = js.get_key_value(subjects::NODE_LEASE_BUCKET).await else {
                panic!("node002 cannot open the lease bucket");
            };
            let write = |key: &'static str| {
                let leases = leases.clone();
                async move {
                    tokio::time::timeout(Duration::from_secs(5), leases.put(key, "rogue".into()))
                        .await
                        .is_ok_and(|put| put.is_ok())
                }
            };
            (write("node002").await, write("node001").await)
        });
    assert!(own, "a node may write its own lease");
    assert!(!other, "node002 wrote node001's lease");
    let log = std::fs::read_to_string(cluster.log_path("node001")).unwrap_or_default();
    assert!(
        !log.contains("another agent took this node's name"),
        "{log}"
    );
}

/// A node cannot end another node's job. node002 (a node with its own key, played by the
/// story) publishes an exit report for the job running on node001: claiming to be node001
/// (signed with its own key), and unsigned. Both are refused and audited; the job keeps
/// running, and ends only when it really does.
#[test]
fn a_node_cannot_report_another_nodes_job_as_ended() {
    use mgpu_protocol::event::{EventSource, JobEvent, JobEventKind};
    use mgpu_protocol::ids::JobId;

    let cluster = Cluster::start(&[
        NodeSpec::new("node001", "1x24GiB"),
        NodeSpec::without_agent("node002"),
    ]);
    cluster.wait_nodes_online(1);
    let id = cluster.submit(&[], "sleep 300");
    cluster.wait_state(&id, "running", Duration::from_secs(20));
    let job: JobId = id.parse().unwrap_or_else(|e| panic!("{id}: {e:?}"));
    let forged = JobEvent {
        job_id: job.clone(),
        attempt: 1,
        at: mgpu_protocol::now(),
        source: EventSource::Node("node001".into()),
        kind: JobEventKind::Exited {
            exit_code: 0,
            signal: None,
            cancelled: false,
            timed_out: false,
            preempted: false,
            lost: false,
            out_of_memory: false,
            usage: None,
        },
    };
    let node002 = cluster.creds(Role::Node, "node002");
    cluster.publish_report(&node002, &forged);
    let unsigned = serde_json::to_vec(&forged).unwrap_or_default();
    let subject = subjects::events(&job);
    cluster.with_nats(&node002, |client| async move {
        jetstream::new(client)
            .publish(subject, unsigned.into())
            .await
            .unwrap_or_else(|e| panic!("publishing: {e}"))
            .await
            .unwrap_or_else(|e| panic!("not stored: {e}"));
    });

    let log_path = cluster.log_path("scheduler");
    mgpu_tests::wait_for("both forgeries refused", Duration::from_secs(20), || {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        let signed = log.contains("node node002 signed a report that says it is from node node001");
        let unsigned = log.contains("a report said to be from node001: ");
        (signed && unsigned).then_some(())
    });
    let audit = cluster.mgpu_ok_with(&cluster.admin_creds(), &["admin", "audit", "--json"]);
    let refused: Vec<Value> = audit
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|record| record["action"] == "report" && record["accepted"] == false)
        .collect();
    assert_eq!(refused.len(), 2, "{audit}");
    assert!(
        refused.iter().any(|r| r["target"] == id.as_str()),
        "{refused:?}"
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        cluster.state(&id),
        "running",
        "the forged exits changed nothing"
    );
    cluster.mgpu_ok(&["cancel", &id]);
    cluster.finished_as(&id, "cancelled", Duration::from_secs(20));
    // `--user` keeps one user's requests: alice's submit and cancel, no report.
    let alices = cluster.mgpu_ok_with(
        &cluster.admin_creds(),
        &["admin", "audit", "--json", "--user", "alice"],
    );
    let actions: Vec<String> = alices
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .map(|record| record["action"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(actions, ["submit", "cancel"], "{alices}");
}
