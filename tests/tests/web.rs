//! The web dashboard in a real browser: `mgpu web` serves the page, Debian's Chromium (driven
//! by Playwright, `services/web/test/browser/dashboard.mjs`) signs in with each principal's
//! seed file and reads the cluster over the server's WebSocket listener. Alice sees the node,
//! her job appears within a second of `mgpu submit` returning, its output arrives in order,
//! and a cancel from the page ends it; the server (not the page) refuses Bob's cancel of her
//! job and every read of secrets by the read-only `wall` viewer; the audit names who asked.
//! Each view's screenshot is kept in `target/web-screenshots/`. On a cluster that requires TLS
//! the page signs in over `wss://`.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use mgpu_tests::web::WebServer;
use mgpu_tests::{Cluster, NodeSpec, bin_dir, repo_root};
use serde_json::Value;

fn screenshots_dir() -> PathBuf {
    repo_root().join("target/web-screenshots")
}

/// Runs the browser script; its one JSON line of results.
fn run_browser(cluster: &Cluster, web: &WebServer) -> Value {
    let web_dir = repo_root().join("services/web");
    let mut child = Command::new("node")
        .arg(web_dir.join("test/browser/dashboard.mjs"))
        .current_dir(&web_dir)
        .env("WEB_URL", &web.url)
        .env("MGPU_BIN", bin_dir().join("mgpu"))
        .env("MGPU_SERVER", cluster.server_url())
        .env("WORKDIR", cluster.dir.path())
        .env("ALICE_CREDS", cluster.user_creds("alice"))
        .env("BOB_CREDS", cluster.user_creds("bob"))
        .env(
            "ALICE_KEY",
            mgpu_tests::public_key_of(&cluster.user_creds("alice")),
        )
        .env(
            "WALL_CREDS",
            cluster.creds(mgpu_protocol::principals::Role::Viewer, "wall"),
        )
        .env("SCREENSHOTS", screenshots_dir())
        .env("WEBSOCKET_PORT", cluster.websocket_port.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("running node (scripts/setup.sh installs it): {e}"));
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    let lines: Vec<String> = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .collect();
    let status = child
        .wait()
        .unwrap_or_else(|e| panic!("waiting for node: {e}"));
    assert!(
        status.success(),
        "the browser story failed ({status}): {lines:?}"
    );
    let last = lines.last().cloned().unwrap_or_default();
    serde_json::from_str(&last).unwrap_or_else(|e| panic!("results {last:?}: {e}"))
}

#[test]
fn on_a_cluster_that_requires_tls_the_page_connects_over_wss() {
    let cluster = Cluster::start_tls(&[NodeSpec::new("node001", "1x24GiB")]);
    cluster.wait_nodes_online(1);
    let websocket = format!("wss://127.0.0.1:{}", cluster.websocket_port);
    let web = WebServer::start(&cluster, &websocket);
    let web_dir = repo_root().join("services/web");
    let run = Command::new("node")
        .arg(web_dir.join("test/browser/tls.mjs"))
        .current_dir(&web_dir)
        .env("WEB_URL", &web.url)
        .env("ALICE_CREDS", cluster.user_creds("alice"))
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("running node: {e}"));
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "the wss:// story failed: {out}");
    assert!(out.contains(&websocket), "{out} (expected {websocket})");
}

#[test]
fn the_dashboard_shows_the_cluster_live_and_the_server_enforces_who_may_do_what() {
    let cluster = Cluster::start(&[NodeSpec::new("node001", "2x24GiB")]);
    cluster.wait_nodes_online(1);
    let web = WebServer::start(
        &cluster,
        &format!("ws://127.0.0.1:{}", cluster.websocket_port),
    );
    let results = run_browser(&cluster, &web);
    eprintln!("browser results: {results}");

    let cancelled = results["cancelled_from_page"].as_str().unwrap_or_default();
    let record = cluster.show(cancelled);
    assert_eq!(record["state"], "cancelled", "{record}");
    let audit = cluster.audit_records();
    let alice = mgpu_tests::public_key_of(&cluster.user_creds("alice"));
    let bob = mgpu_tests::public_key_of(&cluster.user_creds("bob"));
    let cancel_of = |job: &str, signer: &str| {
        audit.iter().find(|r| {
            r["action"] == "cancel" && r["target"].as_str() == Some(job) && r["key"] == *signer
        })
    };
    let alices_cancel = cancel_of(cancelled, &alice)
        .unwrap_or_else(|| panic!("no audit record of alice's cancel from the page: {audit:?}"));
    assert_eq!(alices_cancel["accepted"], true, "{alices_cancel}");
    assert_eq!(alices_cancel["by"], "alice", "{alices_cancel}");
    let alices = results["alices_job"].as_str().unwrap_or_default();
    let bobs_cancel = cancel_of(alices, &bob)
        .unwrap_or_else(|| panic!("no audit record of bob's cancel: {audit:?}"));
    assert_eq!(
        bobs_cancel["accepted"], false,
        "bob's cancel of alice's job: {bobs_cancel}"
    );
    assert!(
        results["reconnected_and_caught_up"].is_string(),
        "{results}"
    );
    assert!(results["from_plain_file_server"].is_string(), "{results}");
    for view in [
        "cluster",
        "queue",
        "job",
        "usage",
        "wall",
        "cluster-dark",
        "disconnected",
    ] {
        let shot = screenshots_dir().join(format!("{view}.png"));
        assert!(shot.is_file(), "no screenshot {}", shot.display());
    }
}
