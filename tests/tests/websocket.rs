//! The WebSocket listener every generated server configuration carries (the web dashboard's
//! transport; `mgpu admin init`, `mgpu admin site`, the packaged examples): the same keys and
//! the same permissions as the client port. The real CLI given a `ws://` URL works as alice,
//! reads as the viewer and is refused its submission there, and an unknown key is turned away.

use std::time::Duration;

use mgpu_protocol::principals::Role;
use mgpu_tests::{Cluster, NodeSpec};
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

#[test]
fn over_websocket_alice_submits_and_reads_the_viewer_only_reads_and_strangers_are_refused() {
    let cluster = Cluster::start(&[NodeSpec::new("node001", "1x24GiB")]);
    let ws = format!("ws://127.0.0.1:{}", cluster.websocket_port);
    let alice = cluster.user_creds("alice");

    let out = cluster.mgpu_ok_with(
        &alice,
        &[
            "--server",
            &ws,
            "submit",
            "--json",
            "--",
            "echo over-websocket",
        ],
    );
    let submitted: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let id = submitted["id"].as_str().unwrap_or_default().to_owned();
    cluster.finished_as(&id, "succeeded", T);
    let logs = cluster.mgpu_ok_with(&alice, &["--server", &ws, "logs", &id]);
    assert!(logs.contains("over-websocket"), "{logs}");

    // The viewer reads over WebSocket what it reads anywhere, and no more.
    let wall = cluster.creds(Role::Viewer, "wall");
    let nodes = cluster.mgpu_ok_with(&wall, &["--server", &ws, "nodes", "--json"]);
    assert!(nodes.contains("node001"), "{nodes}");
    let queue = cluster.mgpu_ok_with(&wall, &["--server", &ws, "queue", "--json"]);
    assert!(queue.starts_with('{'), "{queue}");
    let refused = cluster.mgpu_with(&wall, &["--server", &ws, "submit", "--", "echo no"], None);
    assert!(!refused.status.success());

    // A key the server does not know.
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let stranger = dir.path().join("stranger.nk");
    let seed = nkeys::KeyPair::new_user()
        .seed()
        .unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(&stranger, format!("{seed}\n")).unwrap_or_else(|e| panic!("{e}"));
    let out = cluster.mgpu_with(&stranger, &["--server", &ws, "queue"], None);
    let said = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("authentication") || said.contains("authoriz"),
        "{said}"
    );
}
