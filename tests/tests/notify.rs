//! Notifications for real: `mgpu-notify` against a real nats-server with mgpu's permissions, a
//! Python webhook receiver that checks every signature (tests/fixtures/notify/receiver.py) and
//! an SMTP sink (Debian's python3-aiosmtpd, which scripts/setup.sh installs).
//!
//! 1. Alice adds a webhook, a Slack-shaped hook and an e-mail address (bad ones are refused);
//!    bob cannot read hers; a job with `--notify start,end` is told of at all three, signed;
//!    an array with `--notify end` sends one summary and no notice per task.
//! 2. The service is killed (SIGKILL) while a receiver holds one delivery of a burst: after
//!    its restart every notice arrives, none twice. Then a storm to a destination allowing 3
//!    a window: the rest arrive summarised, each notice once.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use mgpu_protocol::principals::Role;
use mgpu_tests::{Cluster, NodeSpec, bin_dir, free_port, wait_for};
use serde_json::Value;

const T: Duration = Duration::from_secs(60);

/// A child process killed on drop.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/notify")
        .join(name)
}

/// What `mgpu-notify` logs once its consumers exist: a notice stored before that is never
/// delivered (the notices consumer starts with those stored from its creation on).
const READY_LINE: &str = "mgpu-notify delivering notices";

/// Starts `mgpu-notify` with `notify_section` as its config file's `[notify]`, and waits
/// until it is ready: a story that published before then would lose its notices to the
/// consumer's start (a loaded machine starts the service late).
fn start_notify(cluster: &Cluster, notify_section: &str) -> Process {
    let config = cluster.dir.path().join("notify.toml");
    std::fs::write(&config, format!("[notify]\n{notify_section}"))
        .unwrap_or_else(|e| panic!("{e}"));
    // Under logs/, where the harness prints every log when a story fails.
    let log_path = cluster.dir.path().join("logs/notify.log");
    let ready_lines = || {
        std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .matches(READY_LINE)
            .count()
    };
    let ready_before = ready_lines();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .unwrap_or_else(|e| panic!("{e}"));
    let child = Command::new(bin_dir().join("mgpu-notify"))
        .env("MGPU_SERVER", cluster.server_url())
        .env("MGPU_CREDS", cluster.creds(Role::Notify, "notify"))
        .env("MGPU_NOTIFY_CONFIG", &config)
        .env_remove("MGPU_LOG_FORMAT")
        .env("RUST_LOG", "info,mgpu_notify=debug,async_nats=debug")
        .args(["--time80-interval", "1s"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting mgpu-notify: {e}"));
    let mut process = Process(child);
    wait_for("mgpu-notify to be ready", T, || {
        if let Ok(Some(status)) = process.0.try_wait() {
            panic!("mgpu-notify exited before it was ready: {status}");
        }
        (ready_lines() > ready_before).then_some(())
    });
    process
}

/// The receiver on a free port, appending to `out`; `hold` = (path, nth request) to hold.
fn start_receiver(cluster: &Cluster, out: &Path, hold: Option<(&str, u32)>) -> (Process, u16) {
    let port = free_port();
    let secret = cluster.dir.path().join("secret");
    let mut command = Command::new("python3");
    command
        .arg(fixture("receiver.py"))
        .arg(port.to_string())
        .arg(&secret)
        .arg(out);
    if let Some((path, at)) = hold {
        command.args([path, &at.to_string()]);
    }
    let child = command
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting the receiver: {e}"));
    wait_for("the receiver to listen", T, || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
    (Process(child), port)
}

/// aiosmtpd writing each mail into the maildir `dir`, on a free port.
fn start_smtp_sink(dir: &Path) -> (Process, u16) {
    let python = ["/usr/bin/python3", "python3"]
        .into_iter()
        .find(|py| {
            Command::new(py)
                .args(["-c", "import aiosmtpd"])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .unwrap_or_else(|| panic!("no python3 with aiosmtpd: run scripts/setup.sh"));
    let port = free_port();
    let child = Command::new(python)
        .args(["-m", "aiosmtpd", "-n", "-l", &format!("127.0.0.1:{port}")])
        .args(["-c", "aiosmtpd.handlers.Mailbox"])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting aiosmtpd: {e}"));
    wait_for("the SMTP sink to listen", T, || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
    (Process(child), port)
}

/// Every answered request the receiver wrote down.
fn received(out: &Path) -> Vec<Value> {
    std::fs::read_to_string(out)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|entry| entry["event"] == "received")
        .collect()
}

fn on_path(out: &Path, path: &str) -> Vec<Value> {
    received(out)
        .into_iter()
        .filter(|e| e["path"] == path)
        .collect()
}

/// Adds a destination as alice and writes her secret where the receiver reads it.
fn add(cluster: &Cluster, kind: &str, target: &str) {
    cluster.mgpu_ok(&["notify", "add", kind, target]);
    let listing: Value =
        serde_json::from_str(&cluster.mgpu_ok(&["notify", "list", "--json", "--show-secret"]))
            .unwrap_or_else(|e| panic!("notify list --json: {e}"));
    let secret = listing["secret"]
        .as_str()
        .unwrap_or_else(|| panic!("{listing}"));
    std::fs::write(cluster.dir.path().join("secret"), secret).unwrap_or_else(|e| panic!("{e}"));
}

/// Sends a test notice; its id comes back in the webhook's body.
fn test_notice(cluster: &Cluster) {
    cluster.mgpu_ok(&["notify", "test"]);
}

#[test]
fn notices_reach_webhooks_and_mail_signed_and_an_array_once() {
    let cluster = Cluster::start(&[NodeSpec::new("node001", "2x24GiB")]);
    let maildir = cluster.dir.path().join("mail");
    let (_sink, smtp_port) = start_smtp_sink(&maildir);
    let out = cluster.dir.path().join("hooks.jsonl");
    let (_receiver, port) = start_receiver(&cluster, &out, None);
    let _notify = start_notify(
        &cluster,
        &format!("smtp = \"smtp://127.0.0.1:{smtp_port}\"\nmax_per_minute = 100\n"),
    );

    // Refused at add, saying why.
    let plain = cluster.mgpu(&["notify", "add", "webhook", "http://example.com/x"]);
    assert!(!plain.status.success());
    assert!(String::from_utf8_lossy(&plain.stderr).contains("plain http"));
    let bad = cluster.mgpu(&["notify", "add", "email", "alice-at-example"]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("is not an e-mail address"));

    add(
        &cluster,
        "webhook",
        &format!("http://127.0.0.1:{port}/hook"),
    );
    add(&cluster, "slack", &format!("http://127.0.0.1:{port}/slack"));
    add(&cluster, "email", "alice@example.com");
    let listing: Value =
        serde_json::from_str(&cluster.mgpu_ok(&["notify", "list", "--json"])).unwrap_or_default();
    assert_eq!(listing["destinations"].as_array().map(Vec::len), Some(3));
    assert!(listing.get("secret").is_none(), "{listing}");

    // Bob sees none of alice's, and the server does not let him read her entries.
    let bob = cluster.user_creds("bob");
    let bobs = cluster.mgpu_with(&bob, &["notify", "list", "--json"], None);
    let bobs: Value = serde_json::from_slice(&bobs.stdout).unwrap_or_default();
    assert_eq!(
        bobs["destinations"].as_array().map(Vec::len),
        Some(0),
        "{bobs}"
    );
    let alice_key = mgpu_tests::public_key_of(&cluster.user_creds("alice"));
    let stolen = cluster.with_nats(&bob, |client| async move {
        let js = async_nats::jetstream::new(client);
        let kv = js.get_key_value("mgpu-notify").await.ok()?;
        kv.get(format!("{alice_key}.secret")).await.ok().flatten()
    });
    assert!(stolen.is_none(), "bob read alice's secret");

    let job = cluster.submit(&["--notify", "start,end"], "true");
    let end_id = format!("{job}-end");
    wait_for("the end notice at the webhook", T, || {
        received(&out)
            .iter()
            .any(|e| e["path"] == "/hook" && e["id"] == end_id.as_str())
            .then_some(())
    });
    let hook = on_path(&out, "/hook");
    assert!(
        hook.iter()
            .any(|e| e["id"] == format!("{job}-1-start").as_str()),
        "{hook:?}"
    );
    let ended = hook
        .iter()
        .find(|e| e["id"] == end_id.as_str())
        .cloned()
        .unwrap_or_default();
    assert_eq!(ended["body"]["notice"]["kind"], "ended");
    assert_eq!(ended["body"]["notice"]["state"], "succeeded");
    wait_for("the Slack-shaped notice", T, || {
        on_path(&out, "/slack")
            .iter()
            .any(|e| e["id"] == end_id.as_str())
            .then_some(())
    });
    let slack = on_path(&out, "/slack");
    assert!(
        slack.iter().all(|e| e["body"]["text"].is_string()),
        "{slack:?}"
    );
    let short = &job[..10];
    wait_for("the mail", T, || {
        mails(&maildir)
            .iter()
            .any(|m| m.contains(short) && m.contains("ended succeeded"))
            .then_some(())
    });
    assert!(
        received(&out).iter().all(|e| e["valid"] == true),
        "a signature did not check"
    );

    // An array: one summary, no notice per task.
    let array = cluster.submit_json(&["--array", "0-2", "--notify", "end"], "true");
    let array_id = array["array_id"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_default();
    let summary_id = format!("{array_id}-array-end");
    wait_for("the array's summary", T, || {
        on_path(&out, "/hook")
            .iter()
            .any(|e| e["id"] == summary_id.as_str())
            .then_some(())
    });
    // Notices go out in order: once a later test notice arrived, anything about the array
    // would have too.
    test_notice(&cluster);
    wait_for("the test notice", T, || {
        on_path(&out, "/hook")
            .iter()
            .any(|e| e["body"]["notice"]["kind"] == "test")
            .then_some(())
    });
    let hook = on_path(&out, "/hook");
    let summaries = hook
        .iter()
        .filter(|e| e["body"]["notice"]["kind"] == "array_ended");
    assert_eq!(summaries.count(), 1, "{hook:?}");
    let ends = hook
        .iter()
        .filter(|e| e["body"]["notice"]["kind"] == "ended")
        .count();
    assert_eq!(ends, 1, "only the single job's end: {hook:?}");
}

#[test]
fn killed_during_a_burst_nothing_is_lost_or_doubled_and_a_storm_is_summarised() {
    let cluster = Cluster::start(&[]);
    let out = cluster.dir.path().join("hooks.jsonl");
    let (_receiver, port) = start_receiver(&cluster, &out, Some(("/hook", 6)));
    let mut notify = start_notify(&cluster, "max_per_minute = 1000\n");
    add(
        &cluster,
        "webhook",
        &format!("http://127.0.0.1:{port}/hook"),
    );
    const BURST: usize = 12;
    for _ in 0..BURST {
        test_notice(&cluster);
    }
    wait_for("the receiver to hold a delivery", T, || {
        std::fs::read_to_string(&out)
            .unwrap_or_default()
            .contains("holding")
            .then_some(())
    });
    // Killed while a delivery is in flight: no chance to mark it or acknowledge anything.
    let _ = notify.0.kill();
    let _ = notify.0.wait();
    std::fs::write(format!("{}.release", out.display()), "").unwrap_or_else(|e| panic!("{e}"));
    let _notify = start_notify(&cluster, "max_per_minute = 3\nthrottle_window = \"4s\"\n");
    // Generous: the delivery held at the kill comes back after the consumer's ack wait, and
    // one that failed while the receiver was held backs off; a loaded machine stretches both.
    let ids = wait_for("every notice of the burst", 3 * T, || {
        let ids = ids_on(&out, "/hook");
        (ids.len() >= BURST).then_some(ids)
    });
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "a notice arrived twice: {ids:?}");

    // A storm to a new destination that takes 3 a window: the rest come summarised.
    add(
        &cluster,
        "webhook",
        &format!("http://127.0.0.1:{port}/storm"),
    );
    const STORM: usize = 8;
    for _ in 0..STORM {
        test_notice(&cluster);
    }
    let storm = wait_for("the storm, one by one or summarised", 3 * T, || {
        let ids = ids_on(&out, "/storm");
        (ids.len() >= STORM).then_some(ids)
    });
    let mut unique = storm.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), STORM, "lost or doubled: {storm:?}");
    let summaries = on_path(&out, "/storm")
        .into_iter()
        .filter(|e| e["body"]["summarised"].is_array())
        .count();
    assert!(summaries >= 1, "no summary: {:?}", on_path(&out, "/storm"));
    assert!(received(&out).iter().all(|e| e["valid"] == true));
}

/// The notice ids `path` received, a summary counting for each notice it stands for.
fn ids_on(out: &Path, path: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for entry in on_path(out, path) {
        let body = &entry["body"];
        match body["summarised"].as_array() {
            Some(notices) => ids.extend(notices.iter().map(|n| n["message"].to_string())),
            None => ids.push(body["notice"]["message"].to_string()),
        }
    }
    ids
}

fn mails(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir.join("new"))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                .collect()
        })
        .unwrap_or_default()
}
