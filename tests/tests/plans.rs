//! Plans and promises, end to end: every waiting job is dated by the scheduler's own plan
//! (`mgpu queue`'s START, `mgpu show`), the date is checked against when the job really
//! starts, `mgpu why` explains a wait to its owner (and to nobody else), and a job the
//! scheduler will never run is refused in `mgpu submit`'s own output.

use std::time::Duration;

use mgpu_tests::{Cluster, NodeSpec, time_of, wait_for};
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

/// A queued job's `expected_start` in `mgpu queue --json`, once it has one.
fn expected_start(cluster: &Cluster, id: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    let queue: Value = serde_json::from_str(&cluster.mgpu_ok(&["queue", "--json"])).ok()?;
    let job = queue["jobs"]
        .as_array()?
        .iter()
        .find(|j| j["id"] == id)?
        .clone();
    job["expected_start"].as_str()?.parse().ok()
}

#[test]
fn waiting_jobs_are_dated_by_the_plan_and_start_when_it_said() {
    let cluster = Cluster::start(&[NodeSpec::new("node001", "1x24GiB")]);
    cluster.wait_nodes_online(1);
    // One GPU, held by a job its time limit ends in 8 s; two 4-second jobs wait behind it.
    let limited = ["--time-limit", "8s", "--on-timeout", "fail"];
    let holder = cluster.submit(&limited, "sleep 300");
    let held = wait_for("the holder to start", T, || {
        let job = cluster.show(&holder);
        job["started_at"].is_string().then_some(job)
    });
    let short = ["--time-limit", "4s", "--on-timeout", "fail"];
    let first = cluster.submit(&short, "sleep 300");
    let second = cluster.submit(&short, "sleep 300");
    let (first_at, second_at) = wait_for("both waiting jobs dated", T, || {
        Some((
            expected_start(&cluster, &first)?,
            expected_start(&cluster, &second)?,
        ))
    });
    // The plan: when the holder's limit ends, then four seconds later.
    let holder_started = time_of(&held, "started_at");
    let off = |at: chrono::DateTime<chrono::Utc>, expected: chrono::DateTime<chrono::Utc>| {
        (at - expected).num_milliseconds().abs()
    };
    assert!(
        off(first_at, holder_started + chrono::Duration::seconds(8)) <= 1_000,
        "first dated {first_at}, holder started {holder_started}"
    );
    assert!(
        off(second_at, first_at + chrono::Duration::seconds(4)) <= 1_000,
        "second dated {second_at} after the first at {first_at}"
    );

    // Shown as the table's START column and in `mgpu show`, with what it assumes.
    let table = cluster.mgpu_ok(&["queue"]);
    assert!(
        table.lines().next().unwrap_or("").contains("START"),
        "{table}"
    );
    let row = table
        .lines()
        .find(|l| l.starts_with(&first[..10]))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains(" ~") || row.contains(" now "), "{row}");
    let shown = cluster.mgpu_ok(&["show", &second]);
    assert!(
        shown.contains("expected start: ") && shown.contains("end by their time limits"),
        "{shown}"
    );
    let json = cluster.show(&second);
    assert!(json["expected_start"].as_str().is_some(), "{json}");

    // `mgpu why`: its place, the job ahead holding the GPU, the holder's end, in words and
    // in JSON; nobody but its owner and the admins may ask.
    let why = cluster.mgpu_ok(&["why", &second]);
    assert!(why.contains("2 of 2 in line"), "{why}");
    assert!(
        why.contains("1 job(s) ahead hold reservations on GPUs it could use")
            && why.contains(&first[..10]),
        "{why}"
    );
    assert!(why.contains("expected to start in"), "{why}");
    let answer: Value = serde_json::from_str(&cluster.mgpu_ok(&["why", "--json", &second]))
        .unwrap_or_else(|e| panic!("{e}"));
    let kinds: Vec<&str> = answer["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["kind"].as_str())
        .collect();
    assert!(
        kinds.contains(&"jobs_ahead") && kinds.contains(&"fair_share"),
        "{answer}"
    );
    let bob = cluster.mgpu_with(&cluster.user_creds("bob"), &["why", &second], None);
    assert!(!bob.status.success());
    let said = String::from_utf8_lossy(&bob.stderr);
    assert!(
        said.contains("permission denied") && said.contains("alice"),
        "{said}"
    );
    cluster.mgpu_ok_with(&cluster.admin_creds(), &["why", &second]);

    // Reality: each starts within a second or two of its date (the holder is stopped at its
    // limit, its GPU reported free, the next pass places the job).
    let ran = wait_for("the first to start", T, || {
        let job = cluster.show(&first);
        job["started_at"].is_string().then_some(job)
    });
    let started = time_of(&ran, "started_at");
    assert!(
        off(started, first_at) <= 3_000,
        "first dated {first_at}, started {started}"
    );
    cluster.finished_as(&holder, "timed_out", T);
}

#[test]
fn a_job_that_can_never_run_is_refused_by_submit_itself() {
    let mut cluster = Cluster::start(&[NodeSpec::new("node001", "2x24GiB")]);
    cluster.wait_nodes_online(1);
    // More GPUs than any node has: exit status 1, the reason on stderr.
    let out = cluster.mgpu(&["submit", "--gpus", "99", "--", "true"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("refused") && said.contains("99"), "{said}");
    // In JSON too, and the record says the same.
    let (id, refused) = cluster.submit_as(&cluster.user_creds("alice"), &["--gpus", "99"], "true");
    let reason = refused.unwrap_or_else(|| panic!("{id} not refused"));
    let ended = cluster.finished_as(&id, "failed", T);
    assert_eq!(ended["reason"].as_str(), Some(reason.as_str()), "{ended}");
    // An array reports each refused task, by index.
    let out = cluster.mgpu(&["submit", "--array", "0-3", "--gpus", "99", "--", "true"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("4 of 4 tasks refused") && said.contains("index 0-3"),
        "{said}"
    );
    // One that fits is simply submitted.
    let fits = cluster.submit(&["--gpus", "2"], "true");
    cluster.finished_as(&fits, "succeeded", T);

    // No scheduler: stored all the same, and said to be unchecked.
    cluster.kill_scheduler();
    let out = cluster.mgpu(&["submit", "--gpus", "99", "--", "true"]);
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("Not checked yet"), "{said}");
    let stored = String::from_utf8_lossy(&out.stdout);
    let later = stored
        .split_whitespace()
        .last()
        .unwrap_or_default()
        .to_owned();
    // Checked once a scheduler runs again.
    cluster.start_scheduler();
    let ended = cluster.finished_as(&later, "failed", T);
    assert!(
        ended["reason"].as_str().unwrap_or_default().contains("99"),
        "{ended}"
    );
}
