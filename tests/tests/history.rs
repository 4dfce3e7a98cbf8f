//! History, told as stories: a finished job leaves the live bucket for the history stream
//! after the scheduler's `keep_finished` (shortened here to 1 s), `mgpu show` still finds it
//! by its id, a job submitted `--after` it resolves from history, and a finished job a queued
//! job depends on stays live until that job is no longer queued. A job's environment goes
//! with it; an array's, stored once for all its tasks, reaches every task and outlives them,
//! and its tasks go a hundred to a message, each listed while it waits for the scheduler.

use std::time::Duration;

use mgpu_protocol::ids::JobId;
use mgpu_protocol::subjects;
use mgpu_tests::{Cluster, NodeSpec, wait_for};
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

fn cluster_keeping_finished_for(keep: &str) -> (Cluster, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let config = dir.path().join("scheduler.toml");
    std::fs::write(&config, format!("keep_finished = \"{keep}\"\n"))
        .unwrap_or_else(|e| panic!("{e}"));
    let config = config.display().to_string();
    let cluster = Cluster::start_with(
        &[NodeSpec::new("node001", "2x24GiB")],
        &["--config", &config],
    );
    (cluster, dir)
}

fn live_ids(cluster: &Cluster) -> Vec<String> {
    cluster
        .all_jobs()
        .iter()
        .filter_map(|job| job["id"].as_str().map(str::to_owned))
        .collect()
}

fn wait_moved(cluster: &Cluster, id: &str) {
    wait_for(&format!("job {id} to leave the live bucket"), T, || {
        (!live_ids(cluster).iter().any(|live| live == id)).then_some(())
    });
}

#[test]
fn a_finished_job_moves_to_history_and_is_still_found_and_depended_on() {
    let (cluster, _config) = cluster_keeping_finished_for("1s");
    let done = cluster.submit(&[], "echo from the past");
    cluster.finished_as(&done, "succeeded", T);
    wait_moved(&cluster, &done);
    // Found by its id, as it ended.
    let shown: Value = cluster.show(&done);
    assert_eq!(shown["state"], "succeeded", "{shown}");
    assert_eq!(shown["exit_code"], 0, "{shown}");
    let text = cluster.mgpu_ok(&["show", &done]);
    assert!(text.contains("succeeded"), "{text}");
    // A dependency on it resolves from history.
    let after = cluster.submit(&["--after", &done], "true");
    cluster.finished_as(&after, "succeeded", T);
}

#[test]
fn a_finished_job_a_queued_job_waits_for_stays_live_until_it_no_longer_waits() {
    let (cluster, _config) = cluster_keeping_finished_for("1s");
    let done = cluster.submit(&[], "true");
    cluster.finished_as(&done, "succeeded", T);
    let running = cluster.submit(&[], "sleep 1000");
    cluster.wait_state(&running, "running", T);
    let waiting = cluster.submit(&["--after", &format!("{done},{running}")], "true");
    cluster.wait_reason(&waiting, "waiting for the jobs it depends on", T);
    // Well past keep_finished: still live, since `waiting` depends on it.
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        live_ids(&cluster).contains(&done),
        "moved while depended on"
    );
    // Once `running` is cancelled, `waiting` can never run: it fails, and `done` moves.
    cluster.mgpu_ok(&["cancel", &running]);
    cluster.finished_as(&waiting, "failed", T);
    wait_moved(&cluster, &done);
}

/// `mgpu history --json`'s lines, as JSON.
fn history_lines(cluster: &Cluster, args: &[&str]) -> Vec<Value> {
    history_lines_as(cluster, &cluster.user_creds("alice"), args)
}

fn history_lines_as(cluster: &Cluster, creds: &std::path::Path, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["history", "--json"];
    all.extend_from_slice(args);
    cluster
        .mgpu_ok_with(creds, &all)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}")))
        .collect()
}

fn ids(lines: &[Value]) -> Vec<&str> {
    lines.iter().filter_map(|job| job["id"].as_str()).collect()
}

#[test]
fn history_lists_my_finished_jobs_and_filters_them() {
    let (cluster, _config) = cluster_keeping_finished_for("1s");
    let good = cluster.submit(&["--name", "ok-job"], "true");
    // One after the other: history lists by end time, and two jobs started together may end
    // in either order.
    cluster.wait_finished(&good, T);
    let bad = cluster.submit(&["--name", "bad-job"], "exit 3");
    let bobs = cluster
        .mgpu_ok_with(&cluster.user_creds("bob"), &["submit", "-q", "--", "true"])
        .trim()
        .to_owned();
    for id in [&good, &bad, &bobs] {
        cluster.wait_finished(id, T);
    }
    wait_moved(&cluster, &good);
    wait_moved(&cluster, &bad);

    // Mine by default, oldest first, with what they used and why they ended.
    let mine = history_lines(&cluster, &[]);
    assert_eq!(ids(&mine), vec![good.as_str(), bad.as_str()], "{mine:?}");
    assert!(
        mine.iter()
            .all(|job| job["user"] == "alice" && job["gpu_hours"].is_f64())
    );
    let failed = history_lines(&cluster, &["--state", "failed"]);
    assert_eq!(ids(&failed), vec![bad.as_str()]);
    assert_eq!(failed[0]["reason"], "exit code 3");
    assert_eq!(
        ids(&history_lines(&cluster, &["--name", "ok-*"])),
        vec![good.as_str()]
    );
    assert_eq!(
        ids(&history_lines(&cluster, &["--limit", "1"])),
        vec![bad.as_str()]
    );
    assert_eq!(
        history_lines(&cluster, &["--since", "1d", "--node", "node001"]).len(),
        2
    );
    assert!(history_lines(&cluster, &["--until", "2000-01-01"]).is_empty());
    // Everyone's, or one other user's: an admin's to read, not alice's (the server refuses).
    let admin = cluster.admin_creds();
    let everyone = history_lines_as(&cluster, &admin, &["--all-users"]);
    assert!(ids(&everyone).contains(&bobs.as_str()), "{everyone:?}");
    let bob_only = history_lines_as(&cluster, &admin, &["--user", "bob"]);
    assert_eq!(ids(&bob_only), vec![bobs.as_str()]);
    for others in [&["--all-users"][..], &["--user", "bob"]] {
        let mut args = vec!["history"];
        args.extend_from_slice(others);
        let out = cluster.mgpu(&args);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && said.contains("only admins"),
            "{said}"
        );
    }
    // Bob's job in history is not alice's to show; it is bob's.
    wait_moved(&cluster, &bobs);
    assert!(!cluster.mgpu(&["show", &bobs]).status.success());
    let bobs_view = cluster.mgpu_ok_with(&cluster.user_creds("bob"), &["show", &bobs]);
    assert!(bobs_view.contains("succeeded"), "{bobs_view}");
    // The table names them too.
    let table = cluster.mgpu_ok(&["history"]);
    assert!(table.contains("ok-job") && table.contains("bad-job") && table.contains("GPU-H"));
    // A malformed filter says what is accepted.
    let out = cluster.mgpu(&["history", "--since", "garbage"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        said.contains("`garbage` is not a time") && said.contains("2026-11-01"),
        "{said}"
    );
}

/// GPU-seconds of a finished job from its `mgpu show --json`: GPUs held times run time.
fn gpu_seconds_of(job: &Value) -> f64 {
    let record = &job["record"];
    let started = mgpu_tests::time_of(record, "started_at");
    let ended = mgpu_tests::time_of(record, "ended_at");
    let gpus = record["placement"]["gpus"].as_array().map_or(0.0, |gpus| {
        gpus.iter().filter_map(|g| g["amount"].as_f64()).sum()
    });
    gpus * (ended - started).num_milliseconds() as f64 / 1000.0
}

#[test]
fn report_sums_the_jobs_run_to_the_gpu_second() {
    let (cluster, _config) = cluster_keeping_finished_for("1s");
    let one = cluster.submit(&["--gpus", "1"], "sleep 1");
    let two = cluster.submit(&["--gpus", "2"], "sleep 1; exit 4");
    let shared = cluster.submit(&["--gpus", "0.5"], "sleep 1");
    let jobs: Vec<Value> = [&one, &two, &shared]
        .iter()
        .map(|id| cluster.wait_finished(id, T))
        .map(|job| cluster.show(job["id"].as_str().unwrap_or("")))
        .collect();
    let expected: f64 = jobs.iter().map(gpu_seconds_of).sum();
    assert!(expected > 3.0, "{expected}");
    wait_moved(&cluster, &one);

    // Everyone's report is an admin's; alice may report on her own.
    let refused = cluster.mgpu(&["report", "--since", "1d"]);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("only admins"));
    let own: Value =
        serde_json::from_str(&cluster.mgpu_ok(&["report", "--since", "1d", "--mine", "--json"]))
            .unwrap_or_else(|e| panic!("{e}"));
    let own_seconds = own["total"]["gpu_seconds"].as_f64().unwrap_or(0.0);
    assert!((own_seconds - expected).abs() < 0.001, "{own}");
    let admin = cluster.admin_creds();
    let as_admin = |args: &[&str]| -> String { cluster.mgpu_ok_with(&admin, args) };
    let report: Value = serde_json::from_str(&as_admin(&["report", "--since", "1d", "--json"]))
        .unwrap_or_else(|e| panic!("{e}"));
    let alice = report["groups"]
        .as_array()
        .and_then(|groups| groups.iter().find(|g| g["user"] == "alice"))
        .unwrap_or_else(|| panic!("no alice in {report}"));
    assert_eq!(
        (
            alice["jobs"].as_u64(),
            alice["succeeded"].as_u64(),
            alice["failed"].as_u64()
        ),
        (Some(3), Some(2), Some(1))
    );
    let reported = alice["gpu_seconds"].as_f64().unwrap_or(0.0);
    assert!(
        (reported - expected).abs() < 0.001,
        "{reported} against {expected}"
    );
    // By node and by state, the same seconds.
    let by_node: Value = serde_json::from_str(&as_admin(&[
        "report", "--since", "1d", "--by", "node", "--json",
    ]))
    .unwrap_or_else(|e| panic!("{e}"));
    assert!((by_node["total"]["gpu_seconds"].as_f64().unwrap_or(0.0) - expected).abs() < 0.001);
    let csv = as_admin(&["report", "--since", "1d", "--by", "state", "--csv"]);
    assert!(
        csv.starts_with(
            "state,jobs,succeeded,failed,cancelled,timed_out,node_failed,gpu_hours,idle_gpu_hours,preemptions,\
             preempted_gpu_hours\n"
        ),
        "{csv}"
    );
    assert!(
        csv.contains("\nfailed,1,0,1,") && csv.contains("\nsucceeded,2,2,0,"),
        "{csv}"
    );
    // The fair-share ledger counted the same runs.
    let ledger: Value =
        serde_json::from_str(&cluster.mgpu_ok(&["report", "--fairshare", "--json"]))
            .unwrap_or_else(|e| panic!("{e}"));
    let users = ledger["users"].as_array().cloned().unwrap_or_default();
    assert_eq!(users.len(), 1, "{ledger}");
    assert_eq!(users[0]["share"], 1.0);
    let decayed = users[0]["gpu_hours"].as_f64().unwrap_or(0.0) * 3600.0;
    assert!(
        decayed <= expected + 0.001 && decayed > expected * 0.99,
        "{decayed} against {expected}"
    );
}

/// What `creds` reads under `key` in the environments' bucket (empty: nothing there, or
/// refused).
fn env_entry(cluster: &Cluster, creds: &std::path::Path, key: String) -> String {
    let subject = format!(
        "$JS.API.DIRECT.GET.{}.$KV.{}.{key}",
        subjects::JOB_ENV_BUCKET_STREAM,
        subjects::JOB_ENV_BUCKET
    );
    cluster.with_nats(creds, |client| async move {
        let reply = tokio::time::timeout(T, client.request(subject, "".into())).await;
        match reply {
            Ok(Ok(reply)) if reply.status.is_none() => {
                String::from_utf8_lossy(&reply.payload).into_owned()
            }
            _ => String::new(),
        }
    })
}

#[test]
fn an_array_stores_its_environment_once_and_it_goes_with_the_last_task() {
    let (mut cluster, _config) = cluster_keeping_finished_for("1s");
    let secret = format!("array-{}", JobId::random());
    cluster.set_cli_env("ARRAY_TOKEN", &secret);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let go = dir.path().join("go");
    // Each task waits for the word, then says whether the token reached it.
    let command = format!(
        "while [ ! -e {go} ]; do sleep 0.1; done; [ -n \"$ARRAY_TOKEN\" ] && echo token-arrived",
        go = go.display()
    );
    let (array, ids) = cluster.submit_array("0-2%1", &[], &command);
    let array_id = array["array_id"].as_str().unwrap_or_default().to_owned();
    assert_eq!(ids.len(), 3, "{array}");
    let first = &ids[0];
    cluster.wait_state(first, "running", T);

    // Stored once, under the array's id, not under each task's.
    let shown = cluster.show(first);
    let owner = shown["record"]["user_key"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let admin = cluster.admin_creds();
    let stored = env_entry(&cluster, &admin, format!("{owner}.{array_id}"));
    assert!(stored.contains(&secret), "{stored:?}");
    for id in &ids {
        assert_eq!(env_entry(&cluster, &admin, format!("{owner}.{id}")), "");
    }
    // Still another user's to read nowhere; its owner reads it through each task.
    let bob = cluster.user_creds("bob");
    assert_eq!(env_entry(&cluster, &bob, format!("{owner}.{array_id}")), "");
    let own = cluster.mgpu_ok_with(&cluster.user_creds("alice"), &["show", "--json", &ids[2]]);
    assert!(own.contains(&secret), "{own}");

    std::fs::write(&go, "").unwrap_or_else(|e| panic!("{e}"));
    for id in &ids {
        cluster.finished_as(id, "succeeded", T);
        let logs = cluster.mgpu_ok(&["logs", id]);
        assert!(logs.contains("token-arrived"), "{id}: {logs}");
    }
    // A job's own environment goes with its move to history. The array's last tasks wait
    // two minutes from its submission for any task still to come, the environment with them.
    let single = cluster.submit(&[], "true");
    cluster.finished_as(&single, "succeeded", T);
    assert!(env_entry(&cluster, &admin, format!("{owner}.{single}")).contains(&secret));
    wait_moved(&cluster, &single);
    assert_eq!(env_entry(&cluster, &admin, format!("{owner}.{single}")), "");
    assert!(
        live_ids(&cluster).contains(&ids[2]),
        "the array's last task moved early"
    );
    let stored = env_entry(&cluster, &admin, format!("{owner}.{array_id}"));
    assert!(stored.contains(&secret), "{stored:?}");
}

/// How many messages the requests stream holds.
fn requests_stored(cluster: &Cluster) -> u64 {
    cluster.with_nats(&cluster.admin_creds(), |client| async move {
        let js = async_nats::jetstream::new(client);
        let mut stream = js
            .get_stream(subjects::REQUESTS_STREAM)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let info = stream.info().await.unwrap_or_else(|e| panic!("{e}"));
        info.state.messages
    })
}

#[test]
fn an_array_s_tasks_go_together_and_each_is_listed_while_the_scheduler_is_away() {
    let mut cluster = Cluster::start(&[NodeSpec::new("node001", "2x24GiB")]);
    cluster.kill_scheduler();
    let before = requests_stored(&cluster);
    let (array, ids) = cluster.submit_array("0-249", &[], "true");
    assert_eq!(ids.len(), 250, "{array}");
    assert_eq!(
        requests_stored(&cluster) - before,
        3,
        "100, 100 and 50 tasks"
    );
    let listed = |cluster: &Cluster, state: &str| {
        let queue: Value = serde_json::from_str(&cluster.mgpu_ok(&["queue", "--all", "--json"]))
            .unwrap_or_else(|e| panic!("queue --json: {e}"));
        let jobs = queue["jobs"].as_array().cloned().unwrap_or_default();
        jobs.iter()
            .filter(|job| job["state"] == state)
            .filter(|job| {
                job["id"]
                    .as_str()
                    .is_some_and(|id| ids.iter().any(|i| i == id))
            })
            .count()
    };
    assert_eq!(listed(&cluster, "queued"), 250, "each task listed, waiting");
    cluster.start_scheduler();
    wait_for("every task to succeed", Duration::from_secs(60), || {
        (listed(&cluster, "succeeded") == 250).then_some(())
    });
}
