//! A server with little storage, told as stories. JetStream reserves a size-bounded stream's
//! whole `max_bytes` against its `max_file_store` (by default 75% of the free disk), so the
//! default 4 GiB of output and 10 GiB of history do not fit on a small disk. Left at their
//! defaults, the scheduler keeps less and says so; an administrator's own size is kept or
//! refused at start, naming the setting, never cut; on a cluster as on a single server.

use std::time::Duration;

use mgpu_tests::{Cluster, NodeSpec, wait_for};

const T: Duration = Duration::from_secs(30);

/// The server grants 1 GB: not the 14 GiB the defaults ask for.
const SMALL_STORE: &str = "1G";

fn scheduler_log(cluster: &Cluster) -> String {
    std::fs::read_to_string(cluster.log_path("scheduler")).unwrap_or_default()
}

#[test]
fn with_default_sizes_the_scheduler_keeps_less_on_a_small_server_and_says_so() {
    let mut cluster =
        Cluster::server_only_with_storage(&[NodeSpec::new("node001", "1x24GiB")], SMALL_STORE);
    cluster.start_scheduler_with(&[]);
    cluster.start_agent("node001");
    cluster.wait_nodes_online(1);

    let id = cluster.submit(&[], "echo stored");
    cluster.finished_as(&id, "succeeded", T);

    let log = scheduler_log(&cluster);
    for stream in ["MGPU_HISTORY", "MGPU_OUTPUT"] {
        let warning = log
            .lines()
            .find(|line| line.contains("keeps less") && line.contains(stream))
            .unwrap_or_else(|| panic!("no warning for {stream} in\n{log}"));
        assert!(warning.contains("max_file_store"), "{warning}");
    }
    assert!(log.contains("history_max_gib"), "{log}");
}

#[test]
fn a_chosen_history_size_that_does_not_fit_stops_the_scheduler_naming_the_setting() {
    let mut cluster =
        Cluster::server_only_with_storage(&[NodeSpec::without_agent("node001")], SMALL_STORE);
    // The output stream's default shrinks; the history's 10 GiB was asked for.
    cluster.start_scheduler_with(&["--history-max-gib", "10"]);
    wait_for("the scheduler to stop", T, || {
        (!cluster.exited_components().is_empty()).then_some(())
    });
    let log = scheduler_log(&cluster);
    let error = log
        .lines()
        .find(|line| line.contains("creating stream MGPU_HISTORY"))
        .unwrap_or_else(|| panic!("no error for MGPU_HISTORY in\n{log}"));
    assert!(error.contains("no room to reserve 10 GiB"), "{error}");
    assert!(error.contains("history_max_gib"), "{error}");
    assert!(error.contains("max_file_store"), "{error}");
}

/// `mgpu admin setup` run on a cluster whose scheduler chose its own sizes leaves them: the
/// default history size would drop the oldest records of a larger history, and reserve more
/// than a smaller one was given.
#[test]
fn admin_setup_keeps_the_sizes_the_scheduler_chose() {
    const MIB: i64 = 1024 * 1024;
    // A fixed grant, whatever the disk has free (the server grants 75% of that).
    let mut cluster =
        Cluster::server_only_with_storage(&[NodeSpec::without_agent("node001")], "4G");
    cluster.start_scheduler_with(&["--history-max-gib", "2", "--output-max-mib", "300"]);
    wait_for("the scheduler to be ready", T, || {
        scheduler_log(&cluster)
            .contains("scheduler ready")
            .then_some(())
    });
    let max_bytes = |cluster: &Cluster| {
        cluster.with_nats(&cluster.admin_creds(), |client| async move {
            let js = async_nats::jetstream::new(client);
            let mut sizes = Vec::new();
            for stream in ["MGPU_HISTORY", "MGPU_OUTPUT"] {
                let stream = js
                    .get_stream(stream)
                    .await
                    .unwrap_or_else(|e| panic!("{stream}: {e}"));
                sizes.push(stream.cached_info().config.max_bytes);
            }
            sizes
        })
    };
    assert_eq!(max_bytes(&cluster), [2048 * MIB, 300 * MIB]);

    let setup = cluster.mgpu_with(&cluster.admin_creds(), &["admin", "setup"], None);
    assert!(
        setup.status.success(),
        "{}",
        String::from_utf8_lossy(&setup.stderr)
    );
    assert_eq!(max_bytes(&cluster), [2048 * MIB, 300 * MIB]);
}

#[test]
fn on_a_nats_cluster_with_little_storage_the_defaults_shrink_too() {
    // Every member grants 2 GB (the harness caps cluster members): a cluster answers "no
    // suitable peers for placement, insufficient storage", not a single server's error, and
    // the scheduler must read it the same way instead of retrying for ever.
    let cluster = Cluster::start_on_nats_cluster(3, &[NodeSpec::new("node001", "1x24GiB")], &[]);
    let id = cluster.submit(&[], "echo stored");
    cluster.finished_as(&id, "succeeded", T);
    let log = scheduler_log(&cluster);
    for stream in ["MGPU_HISTORY", "MGPU_OUTPUT"] {
        assert!(
            log.lines()
                .any(|line| line.contains("keeps less") && line.contains(stream)),
            "no warning for {stream} in\n{log}"
        );
    }
}
