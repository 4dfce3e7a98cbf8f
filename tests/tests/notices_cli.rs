//! `mgpu notices` as a story against a real nats-server with mgpu's permissions: the notices
//! are published by hand as the scheduler principal (which alone, with admins, may publish
//! them), so the story does not wait on the scheduler's idle policy. Alice follows hers with
//! `--json` and reads back what was sent, and Ctrl+C ends the command cleanly; bob, following
//! his own, never sees hers, and may not follow hers with `--user`; an admin may, naming her
//! as the credentials directory knows her.

use std::io::{BufRead as _, BufReader, Read as _};
use std::path::Path;
use std::process::{Child, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mgpu_protocol::idle::{IdleAction, IdleWarning, Notice, NoticeKind};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::principals::Role;
use mgpu_protocol::subjects;
use mgpu_tests::{Cluster, wait_for};

const T: Duration = Duration::from_secs(20);

/// How long a notice that must not arrive is waited for.
const QUIET: Duration = Duration::from_secs(1);

/// A running `mgpu notices`, its stdout lines coming through a channel; killed on drop.
struct Following {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Following {
    fn start(cluster: &Cluster, creds: &Path, args: &[&str]) -> Following {
        let mut child = cluster
            .mgpu_command(creds, args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("running mgpu: {e}"));
        let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        Following { child, lines }
    }

    /// Sends SIGINT (Ctrl+C) and returns the exit status and stderr.
    fn interrupt(mut self) -> (ExitStatus, String) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(0));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT)
            .unwrap_or_else(|e| panic!("interrupting mgpu notices: {e}"));
        let status = wait_for("mgpu notices to end on Ctrl+C", T, || {
            self.child.try_wait().ok().flatten()
        });
        let mut stderr = String::new();
        if let Some(mut pipe) = self.child.stderr.take() {
            let _ = pipe.read_to_string(&mut stderr);
        }
        (status, stderr)
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An idle warning about a job, as the scheduler's policy would send it.
fn idle_warning() -> Notice {
    let now = mgpu_protocol::now();
    Notice {
        job: Some(JobId::random()),
        at: now,
        message: "job idle since 14:02; requeued from 16:32 if another job waits".to_owned(),
        kind: NoticeKind::IdleWarning {
            warning: IdleWarning {
                idle_since: now - chrono::Duration::hours(2),
                warned_at: now,
                action: IdleAction::Requeue,
                action_from: now + chrono::Duration::minutes(30),
            },
        },
    }
}

/// Publishes `notice` to the user whose key is `key`, as the scheduler, every 200 ms until
/// `following` prints a line (returned) or `within` has passed (None). A subscription the
/// command has only just made may miss the first ones: notices are not stored.
fn publish_until_heard(
    cluster: &Cluster,
    key: &str,
    notice: &Notice,
    following: &Following,
    within: Duration,
) -> Option<String> {
    let subject = subjects::notices(key);
    let payload = serde_json::to_vec(notice).unwrap_or_else(|e| panic!("{e}"));
    let scheduler = cluster.creds(Role::Scheduler, "scheduler");
    cluster.with_nats(&scheduler, |client| async move {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            client
                .publish(subject.clone(), payload.clone().into())
                .await
                .unwrap_or_else(|e| panic!("publishing a notice: {e}"));
            client
                .flush()
                .await
                .unwrap_or_else(|e| panic!("flushing: {e}"));
            tokio::time::sleep(Duration::from_millis(200)).await;
            if let Ok(line) = following.lines.try_recv() {
                return Some(line);
            }
        }
        None
    })
}

/// The notice a `--json` line holds.
fn parsed(line: &str) -> Notice {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not a notice ({e}): {line}"))
}

#[test]
fn a_user_follows_her_own_notices_and_no_one_else_s() {
    let cluster = Cluster::server_only(&[]);
    let alice_creds = cluster.user_creds("alice");
    let bob_creds = cluster.user_creds("bob");
    let alice_key = mgpu_tests::public_key_of(&alice_creds);
    let bob_key = mgpu_tests::public_key_of(&bob_creds);

    // Alice hears the scheduler's notice to her, as one JSON line that reads back.
    let alice = Following::start(&cluster, &alice_creds, &["notices", "--json"]);
    let notice = idle_warning();
    let line = publish_until_heard(&cluster, &alice_key, &notice, &alice, T)
        .unwrap_or_else(|| panic!("alice's `mgpu notices --json` printed nothing"));
    assert_eq!(parsed(&line), notice);

    // Bob, following his own, hears his and never hers.
    let bob = Following::start(&cluster, &bob_creds, &["notices", "--json"]);
    let his = idle_warning();
    let heard = publish_until_heard(&cluster, &bob_key, &his, &bob, T)
        .unwrap_or_else(|| panic!("bob's `mgpu notices --json` printed nothing"));
    assert_eq!(parsed(&heard).job, his.job);
    while bob.lines.try_recv().is_ok() {}
    let hers = idle_warning();
    let leaked = publish_until_heard(&cluster, &alice_key, &hers, &bob, QUIET);
    assert_eq!(leaked, None, "bob heard a notice sent to alice");

    // Ctrl+C ends the command, as a success.
    let (status, stderr) = alice.interrupt();
    assert!(status.success(), "{status:?}: {stderr}");
}

#[test]
fn only_admins_follow_another_user_s_notices() {
    let cluster = Cluster::server_only(&[]);
    let alice_key = mgpu_tests::public_key_of(&cluster.user_creds("alice"));

    // Bob names alice by her key: the server refuses his subscription, and he is told why.
    let refused = Following::start(
        &cluster,
        &cluster.user_creds("bob"),
        &["notices", "--user", &alice_key],
    );
    let (status, stderr) = {
        let mut refused = refused;
        let status = wait_for("bob's refused `mgpu notices` to end", T, || {
            refused.child.try_wait().ok().flatten()
        });
        let mut stderr = String::new();
        if let Some(mut pipe) = refused.child.stderr.take() {
            let _ = pipe.read_to_string(&mut stderr);
        }
        (status, stderr)
    };
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("only admins may follow another user's notices"),
        "{stderr}"
    );

    // An admin names her as the credentials directory knows her, and hears her notice.
    let auth_dir = cluster.auth_dir();
    let admin = Following::start(
        &cluster,
        &cluster.admin_creds(),
        &[
            "notices",
            "--user",
            "alice",
            "--dir",
            &auth_dir.display().to_string(),
        ],
    );
    let notice = idle_warning();
    let line = publish_until_heard(&cluster, &alice_key, &notice, &admin, T)
        .unwrap_or_else(|| panic!("the admin's `mgpu notices --user alice` printed nothing"));
    assert!(
        line.contains(&format!(
            "{} idle warning: idle since ",
            notice.job.as_ref().map(|j| j.short()).unwrap_or_default()
        )),
        "{line}"
    );
    assert!(line.contains("; requeue from "), "{line}");
}
