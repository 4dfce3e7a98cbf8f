//! Reservations, end to end: the real `mgpu reserve`, `mgpu reservations` and `mgpu submit
//! --reservation` against a real scheduler, agents and nats-server.
//!
//! 1. Alice books a node's only GPU for a window 20 s ahead: a clashing booking of
//!    bob's is refused naming hers, the listing shows it booked and the audit trail has it. Bob
//!    may not run jobs in it, alice's job without a time limit is refused, and hers with one
//!    waits for the window, then runs on the booked GPU. Before the window a job of bob's that
//!    ends in time runs on that GPU; one of ten minutes waits, and keeps waiting inside the
//!    window even with the GPU idle. Bob cannot cancel alice's booking; her cancel frees the
//!    GPU at once and the listing says `cancelled`.
//! 2. A booking survives the scheduler's SIGKILL: listed while no scheduler runs, still
//!    listed and still enforced by the restarted one (a job without a time limit keeps off
//!    its GPU, a clashing booking is refused) until its owner cancels it.
//! 3. A window nobody uses is released after `[reservations] release_unused_after`: its state
//!    says `released` and why, its owner gets a `reservation_released` notice, and a waiting
//!    job of someone else's takes the GPU.
//! 4. A node holding a booking goes down: its owner and the admin each get one
//!    `reservation_at_risk` notice naming the node.
//!
//! Notices are read back from the `MGPU_NOTICES` stream (which stores everything published
//! on `users.*.notices`), as an admin, so none is missed for subscribing late.

use std::path::Path;
use std::time::{Duration, Instant};

use mgpu_tests::{Cluster, NodeSpec, gpus_of, time_of, wait_for};
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

/// The wait reasons `mgpu show --json` gives (`WaitReason::describe`).
const WINDOW_REASON: &str = "waiting for its reservation's window to open";
const RESERVED_REASON: &str = "waiting: the GPUs it could use are booked by a reservation";

/// `at` as `--start` takes an RFC 3339 time.
fn rfc3339(at: chrono::DateTime<chrono::Utc>) -> String {
    at.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// `mgpu reserve ARGS --json` with `creds`, asserting success: the reservation as stored.
fn reserve(cluster: &Cluster, creds: &Path, args: &[&str]) -> Value {
    let mut full = vec!["reserve"];
    full.extend_from_slice(args);
    full.push("--json");
    let out = cluster.mgpu_ok_with(creds, &full);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("mgpu {full:?} printed {out:?}: {e}"))
}

/// `mgpu ARGS` with `creds`, asserting it fails with exit status 1: its stderr.
fn refused(cluster: &Cluster, creds: &Path, args: &[&str]) -> String {
    let out = cluster.mgpu_with(creds, args, None);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(1),
        "mgpu {args:?} was not refused: {}{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

/// `mgpu reservations [--all] --json`, as alice.
fn reservations(cluster: &Cluster, all: bool) -> Vec<Value> {
    let args: &[&str] = if all {
        &["reservations", "--all", "--json"]
    } else {
        &["reservations", "--json"]
    };
    let out = cluster.mgpu_ok(args);
    let listed: Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?} printed {out:?}: {e}"));
    listed
        .as_array()
        .unwrap_or_else(|| panic!("{args:?} printed no array: {out}"))
        .clone()
}

/// Reservation `name` as `mgpu reservations --all --json` lists it, if it does.
fn listed(cluster: &Cluster, name: &str) -> Option<Value> {
    reservations(cluster, true)
        .into_iter()
        .find(|r| r["name"] == name)
}

/// Waits until reservation `name` is listed in `state`, returning its row.
fn wait_listed_as(cluster: &Cluster, name: &str, state: &str, timeout: Duration) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let row = listed(cluster, name);
        if let Some(row) = row.as_ref().filter(|r| r["state"] == state) {
            return row.clone();
        }
        assert!(
            Instant::now() < deadline,
            "reservation {name} never listed as {state}; last seen: {row:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every notice sent to the user whose key is `key` (`users.<key>.notices`), oldest first,
/// read from the `MGPU_NOTICES` stream with admin credentials.
fn notices_to(cluster: &Cluster, key: &str) -> Vec<Value> {
    let subject = mgpu_protocol::subjects::notices(key);
    cluster.stream_json(mgpu_protocol::notify::NOTICES_STREAM, &subject)
}

/// The notices of `kind` about reservation `name` sent to `key`.
fn notices_of(cluster: &Cluster, key: &str, kind: &str, name: &str) -> Vec<Value> {
    notices_to(cluster, key)
        .into_iter()
        .filter(|n| n["kind"] == kind && n["name"] == name)
        .collect()
}

/// Waits until the restarted scheduler has logged its `scheduler ready` for the `nth` time.
fn wait_scheduler_ready(cluster: &Cluster, nth: usize) {
    let log = cluster.log_path("scheduler");
    wait_for("the restarted scheduler to be ready", T, || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        (text.matches("scheduler ready").count() >= nth).then_some(())
    });
}

/// A job field `mgpu show --json` gives as a string (`node`, `state`).
fn text(job: &Value, field: &str) -> String {
    job[field].as_str().unwrap_or_default().to_owned()
}

#[test]
fn a_booked_gpu_takes_only_its_members_jobs_inside_the_window_until_cancelled() {
    let cluster = Cluster::start(&[NodeSpec::new("node001", "1x24GiB")]);
    cluster.wait_nodes_online(1);
    let alice = cluster.user_creds("alice");
    let bob = cluster.user_creds("bob");

    // The window opens in 20 s: time enough to show what happens before it (about 2 s on an
    // idle machine), on a busy one too.
    let opens = chrono::Utc::now() + chrono::Duration::seconds(20);
    let start = rfc3339(opens);
    let booked = reserve(
        &cluster,
        &alice,
        &[
            "paper",
            "--gpus",
            "1",
            "--nodelist",
            "node001",
            "--start",
            &start,
            "--for",
            "2m",
        ],
    );
    assert_eq!(booked["name"], "paper", "{booked}");
    assert_eq!(booked["owner"], "alice", "{booked}");
    let gpus = booked["gpus"]
        .as_array()
        .unwrap_or_else(|| panic!("no gpus in {booked}"));
    assert_eq!(gpus.len(), 1, "{booked}");
    assert_eq!(
        (&gpus[0]["node"], &gpus[0]["index"]),
        (&"node001".into(), &0.into()),
        "{booked}"
    );
    let window_start = time_of(&booked, "start");
    assert_eq!(rfc3339(window_start), start, "{booked}");

    // Before the window, a job of bob's that ends before it opens runs on the booked GPU.
    let short = cluster
        .submit_as(
            &bob,
            &["--time-limit", "5s", "--on-timeout", "fail"],
            "sleep 1",
        )
        .0;
    let ran = cluster.finished_as(&short, "succeeded", T);
    assert!(
        time_of(&ran, "ended_at") < window_start,
        "the short job ended after the window opened: {ran}"
    );
    assert_eq!(
        (text(&ran, "node"), gpus_of(&ran)),
        ("node001".to_owned(), vec![0])
    );

    // Bob's booking of the same GPU, overlapping: refused, naming alice's.
    let later = rfc3339(opens + chrono::Duration::seconds(60));
    let said = refused(
        &cluster,
        &bob,
        &[
            "reserve",
            "clash",
            "--gpus",
            "1",
            "--nodelist",
            "node001",
            "--start",
            &later,
            "--for",
            "5m",
        ],
    );
    assert!(
        said.contains("reservation clash refused") && said.contains("paper"),
        "{said}"
    );

    // Listed as booked, its window ahead.
    let listing = reservations(&cluster, false);
    assert_eq!(listing.len(), 1, "{listing:?}");
    assert_eq!(listing[0]["name"], "paper", "{listing:?}");
    assert_eq!(listing[0]["state"], "booked", "{listing:?}");
    assert_eq!(listing[0]["gpus_in_use"], Value::Null, "{listing:?}");
    let table = cluster.mgpu_ok(&["reservations"]);
    assert!(
        table.contains("paper") && table.contains("node001:0") && table.contains("booked"),
        "{table}"
    );

    // The booking and the refusal are in the audit trail.
    let records = wait_for("the booking in the audit trail", T, || {
        let records = cluster.audit_records();
        records
            .iter()
            .any(|r| {
                r["action"] == "reserve"
                    && r["target"] == "reservation paper"
                    && r["accepted"] == true
                    && r["by"] == "alice"
            })
            .then_some(records)
    });
    assert!(
        records.iter().any(|r| r["action"] == "reserve"
            && r["accepted"] == false
            && r["by"] == "bob"
            && r["detail"].as_str().is_some_and(|d| d.contains("paper"))),
        "no refused booking of bob's in the audit: {records:?}"
    );

    // Who may run in it: not bob; alice only with a time limit.
    let (_, why) = cluster.submit_as(
        &bob,
        &["--reservation", "paper", "--time-limit", "30s"],
        "true",
    );
    let why = why.unwrap_or_else(|| panic!("bob's job in alice's reservation was accepted"));
    assert!(
        why.contains("bob is not among the users of reservation paper"),
        "{why}"
    );
    let (_, why) = cluster.submit_as(&alice, &["--reservation", "paper"], "true");
    let why = why.unwrap_or_else(|| panic!("a job without a time limit was accepted"));
    assert!(why.contains("needs a time limit"), "{why}");

    // Alice's job with a time limit waits for the window.
    let member = cluster
        .submit_as(
            &alice,
            &["--reservation", "paper", "--time-limit", "30s"],
            "sleep 8",
        )
        .0;
    cluster.wait_reason(&member, WINDOW_REASON, T);
    let queue: Value = serde_json::from_str(&cluster.mgpu_ok(&["queue", "--json"]))
        .unwrap_or_else(|e| panic!("queue --json: {e}"));
    let row = queue["jobs"]
        .as_array()
        .and_then(|jobs| jobs.iter().find(|j| j["id"] == member.as_str()))
        .cloned()
        .unwrap_or_else(|| panic!("{member} not in {queue}"));
    assert_eq!(row["reservation"], "paper", "{row}");

    // A ten-minute job of bob's cannot end before the window: it keeps off the GPU.
    let long = cluster
        .submit_as(&bob, &["--time-limit", "10m"], "sleep 600")
        .0;
    cluster.wait_reason(&long, RESERVED_REASON, T);
    assert!(
        chrono::Utc::now() < window_start,
        "the steps before the window took too long: it is open already"
    );

    // The window opens: alice's job runs, on the booked GPU; the listing says active, in use.
    let running = wait_for("alice's job to start in the window", 2 * T, || {
        let job = cluster.show(&member);
        job["started_at"].is_string().then_some(job)
    });
    let assigned = time_of(&running["record"], "assigned_at");
    assert!(
        assigned >= window_start,
        "assigned at {assigned}, before the window at {window_start}: {running}"
    );
    assert_eq!(
        (text(&running, "node"), gpus_of(&running)),
        ("node001".to_owned(), vec![0]),
        "{running}"
    );
    let active = wait_for("paper listed active with its GPU in use", T, || {
        reservations(&cluster, false)
            .into_iter()
            .find(|r| r["name"] == "paper" && r["state"] == "active" && r["gpus_in_use"] == 1)
    });
    assert_eq!(active["owner"], "alice", "{active}");
    cluster.finished_as(&member, "succeeded", T);

    // Inside the window the idle GPU is still the reservation's: bob's job keeps waiting.
    let waiting = cluster.wait_reason(&long, RESERVED_REASON, T);
    assert_eq!(waiting["state"], "queued", "{waiting}");

    // Only its owner (or an admin) may cancel it; her cancel frees the GPU at once.
    let said = refused(&cluster, &bob, &["reserve", "--cancel", "paper"]);
    assert!(
        said.contains("reservation paper is alice's: only they or an admin may cancel it"),
        "{said}"
    );
    let cancelled = cluster.mgpu_ok(&["reserve", "--cancel", "paper"]);
    assert!(
        cancelled.contains("Cancelled reservation paper"),
        "{cancelled}"
    );
    let after = cluster.wait_state(&long, "running", T);
    assert_eq!(
        (text(&after, "node"), gpus_of(&after)),
        ("node001".to_owned(), vec![0])
    );
    let row = wait_listed_as(&cluster, "paper", "cancelled", T);
    assert_eq!(row["by"], "alice", "{row}");
    assert!(
        !reservations(&cluster, false)
            .iter()
            .any(|r| r["name"] == "paper"),
        "a cancelled reservation is listed without --all"
    );
    cluster.mgpu_ok_with(&bob, &["cancel", &long]);
}

#[test]
fn a_booking_survives_a_scheduler_restart_and_is_still_enforced() {
    let mut cluster = Cluster::start(&[NodeSpec::new("node001", "1x24GiB")]);
    cluster.wait_nodes_online(1);
    let alice = cluster.user_creds("alice");
    let bob = cluster.user_creds("bob");
    let booked = reserve(
        &cluster,
        &alice,
        &["exam", "--gpus", "1", "--start", "in 1h", "--for", "1h"],
    );
    assert_eq!(booked["owner"], "alice", "{booked}");

    // SIGKILLed: the listing reads the cluster bucket, so it still shows the booking.
    cluster.kill_scheduler();
    let row = wait_listed_as(&cluster, "exam", "booked", T);
    assert_eq!(row["gpus"], booked["gpus"], "{row}");

    cluster.start_scheduler();
    wait_scheduler_ready(&cluster, 2);
    let row = wait_listed_as(&cluster, "exam", "booked", T);
    assert_eq!(row["start"], booked["start"], "{row}");

    // Still enforced: a job without a time limit keeps off a GPU booked within the horizon
    // (24 h by default), and a clashing booking is refused naming it.
    let job = cluster.submit_as(&bob, &[], "sleep 300").0;
    cluster.wait_reason(&job, RESERVED_REASON, T);
    let said = refused(
        &cluster,
        &bob,
        &[
            "reserve", "clash", "--gpus", "1", "--start", "in 90m", "--for", "1h",
        ],
    );
    assert!(said.contains("exam"), "{said}");

    // Cancelled by its owner: the waiting job takes the GPU at once.
    cluster.mgpu_ok(&["reserve", "--cancel", "exam"]);
    cluster.wait_state(&job, "running", T);
    wait_listed_as(&cluster, "exam", "cancelled", T);
    cluster.mgpu_ok_with(&bob, &["cancel", &job]);
}

#[test]
fn a_window_nobody_uses_is_released_and_its_owner_told() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temporary directory: {e}"));
    let config = dir.path().join("scheduler.toml");
    std::fs::write(&config, "[reservations]\nrelease_unused_after = \"5s\"\n")
        .unwrap_or_else(|e| panic!("writing {config:?}: {e}"));
    let config = config.display().to_string();
    let cluster = Cluster::start_with(
        &[NodeSpec::new("node001", "1x24GiB")],
        &["--config", &config],
    );
    cluster.wait_nodes_online(1);
    let alice = cluster.user_creds("alice");
    let bob = cluster.user_creds("bob");

    let booked = reserve(
        &cluster,
        &alice,
        &["unused", "--gpus", "1", "--start", "now", "--for", "10m"],
    );
    let opened = time_of(&booked, "start");
    // Inside the open window, a job of someone else's waits.
    let job = cluster.submit_as(&bob, &[], "sleep 300").0;
    cluster.wait_reason(&job, RESERVED_REASON, T);

    // No job of alice's starts in it: 5 s in, its GPUs go back.
    let row = wait_listed_as(&cluster, "unused", "released", Duration::from_secs(20));
    let reason = row["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("no job of it ran in the first") && reason.contains("went back"),
        "{row}"
    );
    let released_at = time_of(&row, "at");
    assert!(
        released_at >= opened + chrono::Duration::seconds(5),
        "released at {released_at}, less than 5 s after its window opened at {opened}"
    );
    assert!(
        !reservations(&cluster, false)
            .iter()
            .any(|r| r["name"] == "unused"),
        "a released reservation is listed without --all"
    );
    cluster.wait_state(&job, "running", T);

    // Its owner is told, in a notice about the reservation (no job).
    let alice_key = mgpu_tests::public_key_of(&alice);
    let notices = wait_for("alice's reservation_released notice", T, || {
        let notices = notices_of(&cluster, &alice_key, "reservation_released", "unused");
        (!notices.is_empty()).then_some(notices)
    });
    assert_eq!(notices.len(), 1, "{notices:?}");
    let notice = &notices[0];
    assert_eq!(notice["after_secs"], 5, "{notice}");
    assert!(notice.get("job").is_none(), "{notice}");
    assert!(
        notice["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("reservation unused: no job of it ran")),
        "{notice}"
    );
    cluster.mgpu_ok_with(&bob, &["cancel", &job]);
}

#[test]
fn a_down_node_holding_a_booking_is_reported_to_its_owner_and_the_admins() {
    let mut cluster = Cluster::start(&[
        NodeSpec::new("node001", "1x24GiB"),
        NodeSpec::new("node002", "1x24GiB"),
    ]);
    cluster.wait_nodes_online(2);
    let alice = cluster.user_creds("alice");
    reserve(
        &cluster,
        &alice,
        &[
            "demo",
            "--gpus",
            "1",
            "--nodelist",
            "node002",
            "--start",
            "in 1h",
            "--for",
            "1h",
        ],
    );

    cluster.kill_agent("node002");
    let alice_key = mgpu_tests::public_key_of(&alice);
    let admin_key = mgpu_tests::public_key_of(&cluster.admin_creds());
    for (who, key) in [("alice", &alice_key), ("the admin", &admin_key)] {
        let notices = wait_for(&format!("{who}'s reservation_at_risk notice"), T, || {
            let notices = notices_of(&cluster, key, "reservation_at_risk", "demo");
            (!notices.is_empty()).then_some(notices)
        });
        let notice = &notices[0];
        assert_eq!(notice["node"], "node002", "{notice}");
        assert!(notice.get("job").is_none(), "{notice}");
        assert!(
            notice["message"]
                .as_str()
                .is_some_and(|m| m.contains("reservation demo: node node002 is down")),
            "{notice}"
        );
    }

    // Once per node going down, however many ticks see it down; the booking keeps its GPU.
    std::thread::sleep(Duration::from_secs(2));
    for key in [&alice_key, &admin_key] {
        let notices = notices_of(&cluster, key, "reservation_at_risk", "demo");
        assert_eq!(notices.len(), 1, "{notices:?}");
    }
    let row = wait_listed_as(&cluster, "demo", "booked", T);
    assert_eq!(row["gpus"][0]["node"], "node002", "{row}");
}
