//! The MPI hostfile of a multi-node job: `ADDRESS slots=GPUS`, one line per node in rank
//! order, written where the job can read it (the temporary directory) before it starts and
//! removed once it ended. Its path reaches the job as `MGPU_HOSTFILE` (`environment.rs`).

use std::path::{Path, PathBuf};

use mgpu_protocol::job::Placement;

use crate::running::AttemptKey;

/// The hostfile's lines: each rank's address (its node's name where the placement has no
/// address for it) and its GPU count, at least one slot per node.
fn hostfile_text(placement: &Placement) -> String {
    let addresses = placement
        .launch
        .as_ref()
        .map(|l| l.addresses.clone())
        .unwrap_or_default();
    let mut text = String::new();
    for (rank, node, gpus) in placement.ranks() {
        let address = addresses.get(rank as usize).map_or(node, String::as_str);
        text.push_str(&format!("{address} slots={}\n", gpus.len().max(1)));
    }
    text
}

/// Where the hostfile of attempt `key` on `node` goes: named after the node too, since agents
/// sharing a host must not remove each other's file.
fn hostfile_path(temp_dir: &Path, key: &AttemptKey, node: &str) -> PathBuf {
    temp_dir.join(format!("mgpu-{}-{}-{node}.hosts", key.job_id, key.attempt))
}

/// Writes the hostfile; the error is the `FailedToStart` text.
pub async fn write_hostfile(
    key: &AttemptKey,
    node: &str,
    placement: &Placement,
) -> Result<PathBuf, String> {
    let path = hostfile_path(&std::env::temp_dir(), key, node);
    tokio::fs::write(&path, hostfile_text(placement))
        .await
        .map_err(|err| format!("cannot write the hostfile {}: {err}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use mgpu_protocol::gpu_amount::GpuAmount;
    use mgpu_protocol::ids::JobId;
    use mgpu_protocol::job::{GpuShare, Launch, NodeShare};

    use super::*;

    fn share(index: u32) -> GpuShare {
        GpuShare {
            index,
            amount: GpuAmount::ONE,
            mem_mib: 0,
        }
    }

    fn placement(addresses: Vec<String>) -> Placement {
        Placement {
            node: "a".into(),
            gpus: vec![share(0), share(1)],
            peers: vec![
                NodeShare {
                    node: "b".into(),
                    gpus: vec![share(2)],
                },
                NodeShare {
                    node: "c".into(),
                    gpus: Vec::new(),
                },
            ],
            launch: Some(Launch {
                distributed: false,
                addresses,
                master_port: 29_500,
            }),
            cpus: 0,
            mem_host_mib: 0,
        }
    }

    #[test]
    fn one_line_per_rank_with_its_address_and_at_least_one_slot() {
        let with_addresses = placement(vec!["10.0.0.1".into(), "10.0.0.2".into()]);
        assert_eq!(
            hostfile_text(&with_addresses),
            "10.0.0.1 slots=2\n10.0.0.2 slots=1\nc slots=1\n"
        );
        // A rank without an address is reached by its node's name.
        assert_eq!(
            hostfile_text(&placement(Vec::new())),
            "a slots=2\nb slots=1\nc slots=1\n"
        );
    }

    #[test]
    fn the_path_names_the_attempt_and_the_node() {
        let key = AttemptKey {
            job_id: JobId::random(),
            attempt: 3,
        };
        let path = hostfile_path(Path::new("/tmp"), &key, "n1");
        assert_eq!(
            path,
            PathBuf::from(format!("/tmp/mgpu-{}-3-n1.hosts", key.job_id))
        );
    }
}
