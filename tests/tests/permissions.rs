//! Each role may publish only what it needs: the server itself refuses the rest.
//! Real nats-server with the generated authorization; real async-nats clients.

use std::path::Path;
use std::time::Duration;

use async_nats::{ConnectOptions, Event, ServerError};
use mgpu_nats::connect::read_seed;
use mgpu_protocol::principals::Role;
use mgpu_protocol::subjects;
use mgpu_tests::{Cluster, NodeSpec};
use tokio::sync::mpsc;

/// Connects with `creds`, publishes to `subject`, and says whether the server refused it.
async fn publish_refused(cluster: &Cluster, creds: &Path, subject: &str) -> bool {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let seed = read_seed(creds).unwrap_or_else(|e| panic!("{e}"));
    let client = ConnectOptions::with_nkey(seed)
        .event_callback(move |event| {
            let tx = tx.clone();
            async move {
                if let Event::ServerError(ServerError::Other(text)) = event {
                    let _ = tx.send(text);
                }
            }
        })
        .connect(cluster.server_url())
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    client
        .publish(subject.to_owned(), "{}".into())
        .await
        .unwrap_or_else(|e| panic!("publish: {e}"));
    let _ = client.flush().await;
    match tokio::time::timeout(Duration::from_secs(2), rx.recv()).await {
        Ok(Some(text)) => text.to_lowercase().contains("permissions violation"),
        _ => false,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn roles_are_held_to_their_subjects() {
    let cluster =
        tokio::task::spawn_blocking(|| Cluster::start(&[NodeSpec::new("node001", "1x24GiB")]))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    let alice = cluster.user_creds("alice");
    let node = cluster.creds(Role::Node, "node001");

    // A user cannot hand work to a node, fake a job's output or events, or a heartbeat.
    for subject in [
        subjects::assign("node001"),
        subjects::control("node001"),
        "jobs.0123.output".to_owned(),
        "jobs.0123.events".to_owned(),
        subjects::heartbeat("node001"),
        "$KV.mgpu-jobs.0123".to_owned(),
        "$JS.API.STREAM.DELETE.MGPU_REQUESTS".to_owned(),
    ] {
        assert!(
            publish_refused(&cluster, &alice, &subject).await,
            "user published {subject}"
        );
    }
    // A node cannot submit or cancel jobs, nor heartbeat as another node.
    for subject in [
        subjects::SUBMIT.to_owned(),
        "jobs.0123.cancel".to_owned(),
        subjects::heartbeat("node002"),
        subjects::assign("node001"),
    ] {
        assert!(
            publish_refused(&cluster, &node, &subject).await,
            "node published {subject}"
        );
    }
    // What each role needs stays allowed.
    assert!(!publish_refused(&cluster, &alice, subjects::SUBMIT).await);
    assert!(!publish_refused(&cluster, &node, &subjects::heartbeat("node001")).await);

    // The scheduler answers as a NATS micro service.
    let seed = read_seed(&alice).unwrap_or_else(|e| panic!("{e}"));
    // Replies come to alice's own inbox, the only one she may subscribe to.
    let public_key = nkeys::KeyPair::from_seed(&seed)
        .map(|pair| pair.public_key())
        .unwrap_or_else(|e| panic!("{e}"));
    let client = ConnectOptions::with_nkey(seed)
        .custom_inbox_prefix(mgpu_protocol::principals::inbox_prefix(&public_key))
        .connect(cluster.server_url())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let reply = tokio::time::timeout(
        Duration::from_secs(5),
        client.request("$SRV.PING", "".into()),
    )
    .await
    .unwrap_or_else(|_| panic!("$SRV.PING timed out"))
    .unwrap_or_else(|e| panic!("$SRV.PING: {e}"));
    let ping: serde_json::Value =
        serde_json::from_slice(&reply.payload).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ping["name"], subjects::SCHEDULER_SERVICE);
    drop(client);
    tokio::task::spawn_blocking(move || drop(cluster))
        .await
        .ok();
}
