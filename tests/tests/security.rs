//! Attacks by users with valid accounts, each against the real server and scheduler: a
//! submission signed by no user or not signed at all, a forged cancel, a replayed hold,
//! cancelling or holding someone else's job. After each, the jobs before it are intact, the
//! refusal is in the audit trail, and the CLI says "permission denied" with a failing status.
//! A submission the scheduler records as failed is audited as refused too.

use std::time::Duration;

use async_nats::HeaderMap;
use mgpu_nats::signing;
use mgpu_protocol::cancel::CancelRequest;
use mgpu_protocol::hold::HoldRequest;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::JobSpec;
use mgpu_protocol::principals::Role;
use mgpu_protocol::subjects;
use mgpu_protocol::submit::SubmitRequest;
use mgpu_tests::{Cluster, NodeSpec, wait_for};
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

fn cluster() -> Cluster {
    Cluster::start(&[NodeSpec::new("node001", "1x24GiB")])
}

/// The nkey of `role`/`name`, read from its seed file.
fn key_of(cluster: &Cluster, role: Role, name: &str) -> nkeys::KeyPair {
    let seed =
        mgpu_nats::connect::read_seed(&cluster.creds(role, name)).unwrap_or_else(|e| panic!("{e}"));
    nkeys::KeyPair::from_seed(&seed).unwrap_or_else(|e| panic!("{e}"))
}

/// Publishes `payload` on `subject` through JetStream as `creds`, with `headers`.
fn publish(
    cluster: &Cluster,
    creds: Role,
    name: &str,
    subject: String,
    headers: HeaderMap,
    payload: Vec<u8>,
) {
    cluster.with_nats(&cluster.creds(creds, name), |client| async move {
        let js = async_nats::jetstream::new(client);
        js.publish_with_headers(subject, headers, payload.into())
            .await
            .unwrap_or_else(|e| panic!("publish: {e}"))
            .await
            .unwrap_or_else(|e| panic!("not stored: {e}"));
    });
}

fn signed_by(
    key: &nkeys::KeyPair,
    subject: &str,
    payload: &[u8],
    at: mgpu_protocol::Timestamp,
) -> HeaderMap {
    let mut headers = HeaderMap::new();
    signing::sign(key, subject, payload, at, &mut headers).unwrap_or_else(|e| panic!("{e}"));
    headers
}

fn refused_in_audit(cluster: &Cluster, action: &str, target: &str, detail: &str) -> Value {
    wait_for(
        &format!("a refused {action} of {target} in the audit"),
        T,
        || {
            cluster.audit_records().into_iter().find(|r| {
                r["action"] == action
                    && r["target"] == target
                    && r["accepted"] == false
                    && r["detail"].as_str().is_some_and(|d| d.contains(detail))
            })
        },
    )
}

#[test]
fn submissions_signed_by_no_user_or_unsigned_are_refused_and_nothing_runs() {
    let cluster = cluster();
    let before = cluster.submit(&[], "true");
    cluster.finished_as(&before, "succeeded", T);
    let snapshot = cluster.show(&before);

    for (name, sign) in [("stranger", true), ("unsigned", false)] {
        let id = JobId::random();
        let request = SubmitRequest {
            id: id.clone(),
            user: "alice".into(),
            spec: JobSpec::new(vec![format!("echo {name}")], "/tmp"),
        };
        let payload = serde_json::to_vec(&request).unwrap_or_default();
        let headers = if sign {
            // A key the server never heard of, on alice's connection.
            signed_by(
                &nkeys::KeyPair::new_user(),
                subjects::SUBMIT,
                &payload,
                mgpu_protocol::now(),
            )
        } else {
            HeaderMap::new()
        };
        publish(
            &cluster,
            Role::User,
            "alice",
            subjects::SUBMIT.into(),
            headers,
            payload,
        );
        let why = if sign {
            "belongs to no user"
        } else {
            "not signed"
        };
        refused_in_audit(&cluster, "submit", id.as_str(), why);
        let shown = cluster.mgpu(&["show", "--json", id.as_str()]);
        let text = String::from_utf8_lossy(&shown.stdout);
        assert!(
            !text.contains("succeeded") && !text.contains("running"),
            "{name}: {text}"
        );
    }
    assert_eq!(cluster.show(&before), snapshot, "earlier jobs are intact");
}

/// A signed submission the scheduler records as failed (its spec cannot run) is in the audit
/// trail as refused, not as carried out.
#[test]
fn a_submission_recorded_as_failed_is_audited_as_refused() {
    let cluster = cluster();
    let id = JobId::random();
    let request = SubmitRequest {
        id: id.clone(),
        user: "alice".into(),
        spec: JobSpec::new(vec!["true".into()], "relative/dir"),
    };
    let payload = serde_json::to_vec(&request).unwrap_or_default();
    let headers = signed_by(
        &key_of(&cluster, Role::User, "alice"),
        subjects::SUBMIT,
        &payload,
        mgpu_protocol::now(),
    );
    publish(
        &cluster,
        Role::User,
        "alice",
        subjects::SUBMIT.into(),
        headers,
        payload,
    );
    let job = cluster.finished_as(id.as_str(), "failed", T);
    assert!(
        job["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("invalid submission")),
        "{job}"
    );
    refused_in_audit(&cluster, "submit", id.as_str(), "rejected");
}

#[test]
fn the_signer_owns_the_job_whatever_name_the_payload_gives() {
    let cluster = cluster();
    // The CLI runs with USER=alice, but these are bob's credentials.
    let out = cluster.mgpu_ok_with(&cluster.user_creds("bob"), &["submit", "-q", "--", "true"]);
    let id = out.trim().to_owned();
    let job = cluster.finished_as(&id, "succeeded", T);
    assert_eq!(job["user"], "bob", "{job}");
}

#[test]
fn users_cancel_and_hold_only_their_own_jobs_and_admins_any() {
    let cluster = cluster();
    let alices = cluster.submit(&[], "sleep 60");
    cluster.wait_state(&alices, "running", T);
    let queued = cluster.submit(&[], "true");

    let bob = cluster.user_creds("bob");
    let cancel = cluster.mgpu_with(&bob, &["cancel", &alices], None);
    assert!(!cancel.status.success());
    let stderr = String::from_utf8_lossy(&cancel.stderr);
    assert!(
        stderr.contains("permission denied") && stderr.contains("belongs to alice"),
        "{stderr}"
    );
    let hold = cluster.mgpu_with(&bob, &["hold", &queued], None);
    assert!(!hold.status.success());
    let stderr = String::from_utf8_lossy(&hold.stderr);
    assert!(stderr.contains("permission denied"), "{stderr}");
    assert_eq!(
        cluster.state(&alices),
        "running",
        "bob's cancel changed nothing"
    );
    refused_in_audit(&cluster, "cancel", &alices, "belongs to alice");

    // A cancel forged in alice's name, signed with bob's key, is bob's cancel: refused.
    let payload = serde_json::to_vec(&CancelRequest {
        user: "alice".into(),
        reason: None,
    })
    .unwrap_or_default();
    let id: JobId = alices.parse().unwrap_or_else(|e| panic!("{e}"));
    let subject = subjects::cancel(&id);
    let headers = signed_by(
        &key_of(&cluster, Role::User, "bob"),
        &subject,
        &payload,
        mgpu_protocol::now(),
    );
    publish(
        &cluster,
        Role::User,
        "bob",
        subject.clone(),
        headers,
        payload.clone(),
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(cluster.state(&alices), "running");

    // Signed by alice but ten minutes ago (a captured message): stale.
    let old = mgpu_protocol::now() - chrono::Duration::minutes(10);
    let headers = signed_by(
        &key_of(&cluster, Role::User, "alice"),
        &subject,
        &payload,
        old,
    );
    publish(&cluster, Role::User, "alice", subject, headers, payload);
    refused_in_audit(&cluster, "cancel", &alices, "signed");
    assert_eq!(cluster.state(&alices), "running");

    // An admin may cancel anyone's job.
    let admin = cluster.mgpu_with(&cluster.admin_creds(), &["cancel", &alices], None);
    assert!(
        admin.status.success(),
        "{}",
        String::from_utf8_lossy(&admin.stderr)
    );
    let done = cluster.finished_as(&alices, "cancelled", T);
    assert!(
        done["reason"].as_str().unwrap_or("").contains("admin"),
        "{done}"
    );
}

#[test]
fn a_replayed_hold_changes_nothing() {
    let cluster = Cluster::start(&[NodeSpec::new("node001", "1x24GiB")]);
    let blocker = cluster.submit(&[], "sleep 60");
    cluster.wait_state(&blocker, "running", T);
    let waiting = cluster.submit(&[], "true");
    let id: JobId = waiting.parse().unwrap_or_else(|e| panic!("{e}"));

    // Alice holds her job with a message someone copies.
    let payload = serde_json::to_vec(&HoldRequest {
        user: "alice".into(),
    })
    .unwrap_or_default();
    let subject = subjects::hold(&id);
    let headers = signed_by(
        &key_of(&cluster, Role::User, "alice"),
        &subject,
        &payload,
        mgpu_protocol::now(),
    );
    publish(
        &cluster,
        Role::User,
        "alice",
        subject.clone(),
        headers.clone(),
        payload.clone(),
    );
    cluster.wait_reason(&waiting, "held: `mgpu release` lets it run", T);
    cluster.mgpu_ok(&["release", &waiting]);
    // The copy, sent again: refused, the job stays released.
    publish(&cluster, Role::User, "bob", subject, headers, payload);
    refused_in_audit(&cluster, "hold", &waiting, "already received");
    let job = cluster.show(&waiting);
    assert_ne!(job["reason"], "held: `mgpu release` lets it run", "{job}");
    cluster.mgpu_ok(&["cancel", &blocker]);
    cluster.finished_as(&waiting, "succeeded", T);
}

#[test]
fn a_hold_and_a_cancel_replayed_after_a_scheduler_restart_are_refused() {
    let mut cluster = cluster();
    let blocker = cluster.submit(&[], "sleep 60");
    cluster.wait_state(&blocker, "running", T);
    let waiting = cluster.submit(&[], "true");
    let cancelled = cluster.submit(&[], "true");
    let alice = key_of(&cluster, Role::User, "alice");

    // Alice holds one job and cancels the other with messages someone copies.
    let copies: Vec<(String, String, HeaderMap, Vec<u8>)> = [
        (
            "hold",
            &waiting,
            serde_json::to_vec(&HoldRequest {
                user: "alice".into(),
            }),
        ),
        (
            "cancel",
            &cancelled,
            serde_json::to_vec(&CancelRequest {
                user: "alice".into(),
                reason: None,
            }),
        ),
    ]
    .into_iter()
    .map(|(action, job, payload)| {
        let id: JobId = job.parse().unwrap_or_else(|e| panic!("{e}"));
        let subject = if action == "hold" {
            subjects::hold(&id)
        } else {
            subjects::cancel(&id)
        };
        let payload = payload.unwrap_or_default();
        let headers = signed_by(&alice, &subject, &payload, mgpu_protocol::now());
        (action.to_owned(), subject, headers, payload)
    })
    .collect();
    for (_, subject, headers, payload) in &copies {
        publish(
            &cluster,
            Role::User,
            "alice",
            subject.clone(),
            headers.clone(),
            payload.clone(),
        );
    }
    cluster.wait_reason(&waiting, "held: `mgpu release` lets it run", T);
    cluster.finished_as(&cancelled, "cancelled", T);
    cluster.mgpu_ok(&["release", &waiting]);

    // The scheduler restarts (its memory of nonces gone with the process), then the copies
    // come again, well within the signatures' two minutes.
    cluster.kill_scheduler();
    cluster.start_scheduler();
    for (_, subject, headers, payload) in copies.iter().cloned() {
        publish(&cluster, Role::User, "bob", subject, headers, payload);
    }
    refused_in_audit(&cluster, "hold", &waiting, "already received");
    refused_in_audit(&cluster, "cancel", &cancelled, "already received");
    let job = cluster.show(&waiting);
    assert_ne!(job["reason"], "held: `mgpu release` lets it run", "{job}");
    cluster.mgpu_ok(&["cancel", &blocker]);
    cluster.finished_as(&waiting, "succeeded", T);
}

/// Maps mgpu user `user` to Unix account `unix_user` while the scheduler runs (it re-reads
/// the principals file; give it a moment).
fn map_user(cluster: &Cluster, user: &str, unix_user: &str) {
    let dir = cluster.auth_dir().display().to_string();
    cluster.mgpu_ok_with(
        &cluster.admin_creds(),
        &[
            "admin",
            "add-user",
            user,
            "--unix-user",
            unix_user,
            "--dir",
            &dir,
        ],
    );
}

/// Creates a throwaway Unix account (root only), removed when dropped.
struct Account(String);

impl Account {
    fn create() -> Option<Account> {
        if !nix::unistd::Uid::effective().is_root() {
            return None;
        }
        let name = format!("mgpu-t{}", &JobId::random().as_str()[..8]);
        let made = std::process::Command::new("useradd")
            .args([
                "--no-create-home",
                "--home-dir",
                "/tmp",
                "--shell",
                "/bin/sh",
                // A supplementary group, which the job must have too.
                "--groups",
                "users",
                &name,
            ])
            .status()
            .is_ok_and(|s| s.success());
        made.then_some(Account(name))
    }
}

impl Drop for Account {
    fn drop(&mut self) {
        let _ = std::process::Command::new("userdel").arg(&self.0).status();
    }
}

/// Runs `story` with a throwaway Unix account (root only), once under mgpu-job-guard and once
/// under the built-in guard (given the agent's flags).
fn under_both_guards_with_an_account(story: impl Fn(&Account, &[&str])) {
    let Some(account) = Account::create() else {
        eprintln!("skipped: needs root and useradd to create a Unix account");
        return;
    };
    for agent_args in [&[][..], &["--job-guard", "builtin"][..]] {
        story(&account, agent_args);
    }
}

/// One node whose agent (root, as the tests run) runs each job as its owner's account.
fn owners_cluster(agent_args: &[&str]) -> Cluster {
    Cluster::start(&[NodeSpec::new("node001", "1x24GiB")
        .agent_args(agent_args)
        .jobs_as_owners()])
}

#[test]
fn an_agent_running_as_root_runs_each_job_as_its_owners_account_and_never_as_root() {
    // mgpu-job-guard switches to the account itself; the built-in guard is switched by the
    // agent before it starts.
    under_both_guards_with_an_account(runs_jobs_as_owners);
}

fn runs_jobs_as_owners(account: &Account, agent_args: &[&str]) {
    let cluster = owners_cluster(agent_args);
    map_user(&cluster, "alice", &account.0);
    map_user(&cluster, "bob", "root");
    std::thread::sleep(Duration::from_millis(1500));

    // The job and its guard (its parent, which switched to the account) run as the account,
    // with its groups.
    let id = cluster.submit(
        &[],
        "echo \"$(id -un) $USER $HOME\"; id -G; awk '/^Uid/ { print $2 }' /proc/$PPID/status",
    );
    let ended = cluster.wait_finished(&id, T);
    // On a failure, what the job (or its guard) wrote to stderr says why.
    let out = cluster.mgpu(&["logs", &id]);
    let logs = String::from_utf8_lossy(&out.stdout).into_owned();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(ended["state"], "succeeded", "{said}");
    let id_of = |flag: &str| {
        let out = std::process::Command::new("id")
            .args([flag, &account.0])
            .output()
            .unwrap_or_else(|e| panic!("id: {e}"));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let groups = id_of("-G");
    assert!(groups.contains(' '), "a supplementary group: {groups}");
    assert_eq!(
        logs.trim(),
        format!(
            "{} {} /tmp\n{groups}\n{}",
            account.0,
            account.0,
            id_of("-u")
        )
    );

    let as_root =
        cluster.mgpu_ok_with(&cluster.user_creds("bob"), &["submit", "-q", "--", "id -u"]);
    let job = cluster.finished_as(as_root.trim(), "failed", T);
    let reason = job["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("refusing to run bob's job as root"),
        "{reason}"
    );

    let nodes = cluster.mgpu_ok(&["nodes", "--json"]);
    assert!(
        nodes.contains(mgpu_protocol::node::RUNS_AS_OWNER),
        "{nodes}"
    );
    let human = cluster.mgpu_ok(&["nodes"]);
    assert!(human.contains("runs jobs as each job's owner"), "{human}");
}

/// A root agent's state directory is usually one the jobs' accounts cannot enter (under
/// `/root`; here made mode 0700): the guard, which watches the contact file there, opens it
/// before it becomes the job's account, and still fences.
#[test]
fn a_frozen_root_agents_job_is_stopped_by_its_guard_where_its_owner_cannot_read_the_state_dir() {
    // mgpu-job-guard opens the file before it switches; the built-in guard inherits it open.
    under_both_guards_with_an_account(fences_where_the_owner_cannot_read_the_state_dir);
}

fn fences_where_the_owner_cannot_read_the_state_dir(account: &Account, agent_args: &[&str]) {
    let cluster = owners_cluster(agent_args);
    {
        use std::os::unix::fs::PermissionsExt;
        let state_dir = cluster.state_dir();
        std::fs::set_permissions(&state_dir, std::fs::Permissions::from_mode(0o700))
            .unwrap_or_else(|e| panic!("{}: {e}", state_dir.display()));
    }
    map_user(&cluster, "alice", &account.0);
    std::thread::sleep(Duration::from_millis(1500));
    let pid_file = format!("/tmp/{}.pid", account.0);
    let id = cluster.submit(
        &["--workdir", "/tmp"],
        &format!(
            "ls -l /proc/$$/fd; echo $$ > {pid_file}.tmp && mv {pid_file}.tmp {pid_file} && exec sleep 60"
        ),
    );
    let pid: i32 = wait_for(&format!("job {id} to write its pid"), T, || {
        std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
    });
    let _ = std::fs::remove_file(&pid_file);
    // The guard's way to the contact file is not handed on to the job.
    let descriptors = cluster.mgpu_ok(&["logs", &id]);
    assert!(
        descriptors.contains("/dev/null") && !descriptors.contains(".contact"),
        "{agent_args:?}: {descriptors}"
    );
    cluster.signal_agent("node001", nix::sys::signal::Signal::SIGSTOP);
    // The agents of these stories fence after 2 s; the guard half a heartbeat interval later.
    // Well before the job's own end (60 s), and with the agent frozen throughout.
    wait_for(
        "the guard to stop the job of its frozen agent",
        Duration::from_secs(15),
        || (!mgpu_tests::process_running(pid)).then_some(()),
    );
    cluster.signal_agent("node001", nix::sys::signal::Signal::SIGCONT);
    let out = cluster.mgpu(&["logs", &id]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("(fenced)"),
        "{agent_args:?}: the guard says why: {stderr}"
    );
}

#[test]
fn a_user_cannot_read_another_users_replies_nor_drain_the_schedulers_reports() {
    let cluster = cluster();
    let bob_key = key_of(&cluster, Role::User, "bob").public_key();
    let scheduler_pull = format!(
        "$JS.API.CONSUMER.MSG.NEXT.{}.{}",
        subjects::EVENTS_STREAM,
        subjects::SCHEDULER_EVENTS_CONSUMER
    );
    let pull_subject = scheduler_pull.clone();
    cluster.with_nats(&cluster.user_creds("alice"), |client| async move {
        // Bob's reply inbox.
        let inbox = format!("{}.>", mgpu_protocol::principals::inbox_prefix(&bob_key));
        let _ = client.subscribe(inbox).await;
        // A pull from the scheduler's durable consumer of reports, which would take them.
        let _ = client.publish(pull_subject, "{\"batch\":1}".into()).await;
        let _ = client.flush().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    });
    let log = std::fs::read_to_string(cluster.dir.path().join("logs").join("nats-server.log"))
        .unwrap_or_default();
    let refused = |what: &str| {
        log.lines()
            .any(|line| line.contains("Violation") && line.contains(what))
    };
    let bob_inbox =
        mgpu_protocol::principals::inbox_prefix(&key_of(&cluster, Role::User, "bob").public_key());
    assert!(
        refused(&bob_inbox),
        "subscribing to bob's inbox was not refused:\n{log}"
    );
    assert!(
        refused(&scheduler_pull),
        "pulling from the scheduler's consumer was not refused:\n{log}"
    );
    // And the scheduler still gets its reports: a job runs to the end.
    let id = cluster.submit(&[], "true");
    cluster.finished_as(&id, "succeeded", T);
}

#[test]
fn users_added_and_removed_while_the_server_runs_take_effect_without_dropping_connections() {
    let cluster = cluster();
    let auth_dir = cluster.auth_dir();
    cluster.let_admin_reload_server();
    let dir = auth_dir.display().to_string();
    let admin = cluster.admin_creds();

    // Carol is new: once added, she submits and her job runs.
    let carol_key = cluster.dir.path().join("carol.nk");
    let out = carol_key.display().to_string();
    let added = cluster.mgpu_ok_with(
        &admin,
        &["admin", "add-user", "carol", "--dir", &dir, "--out", &out],
    );
    assert!(
        added.contains("Reloaded the configuration of 1 running nats-server"),
        "{added}"
    );
    let mode = std::fs::metadata(&carol_key).map(|m| {
        use std::os::unix::fs::PermissionsExt;
        m.permissions().mode() & 0o777
    });
    assert_eq!(mode.ok(), Some(0o600));
    let id = wait_for("carol to be let in", T, || {
        let out = cluster.mgpu_with(&carol_key, &["submit", "-q", "--", "true"], None);
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    });
    let job = cluster.finished_as(&id, "succeeded", T);
    assert_eq!(job["user"], "carol");
    wait_for("the addition in the audit trail", T, || {
        cluster.audit_records().into_iter().find(|r| {
            r["action"] == "admin" && r["detail"] == "added user carol" && r["by"] == "admin"
        })
    });

    // Bob is removed: his key no longer connects, and the scheduler kept running throughout.
    cluster.mgpu_ok_with(&admin, &["admin", "remove", "bob", "--dir", &dir]);
    wait_for("bob to be refused", T, || {
        let out = cluster.mgpu_with(&cluster.user_creds("bob"), &["queue"], None);
        (!out.status.success()).then_some(())
    });
    let after = cluster.submit(&[], "true");
    cluster.finished_as(&after, "succeeded", T);
}
