//! The jobs, the nodes and the cluster state, read together: what `mgpu queue` and
//! `mgpu nodes` list. The three reads are independent, so their round trips overlap.

use anyhow::Result;
use async_nats::jetstream;
use mgpu_nats::records;
use mgpu_protocol::Timestamp;
use mgpu_protocol::job::{JobRecord, JobState};
use mgpu_protocol::node::NodeHeartbeat;

use super::cluster::Cluster;
use super::nodes::NodeRow;
use crate::errors::plain;

pub struct Snapshot {
    /// Every job record, read as for a listing: without each spec's environment.
    pub jobs: Vec<JobRecord>,
    /// Each node's last heartbeat.
    pub nodes: Vec<NodeHeartbeat>,
    pub cluster: Cluster,
}

impl Snapshot {
    pub async fn read(js: &jetstream::Context) -> Result<Snapshot> {
        let (jobs, nodes, cluster) = tokio::try_join!(
            async { records::list_jobs_for_listing(js).await.map_err(plain) },
            async { records::list_nodes(js).await.map_err(plain) },
            Cluster::read(js),
        )?;
        Ok(Snapshot {
            jobs,
            nodes,
            cluster,
        })
    }

    /// Every node's row. Node usage counts every running job, listed or not; only running
    /// jobs hold GPUs, so the nodes are matched against those few rather than every record.
    pub fn node_rows(&self, now: Timestamp) -> Vec<NodeRow> {
        let running: Vec<JobRecord> = self
            .jobs
            .iter()
            .filter(|job| matches!(job.state, JobState::Running(_)))
            .cloned()
            .collect();
        self.nodes
            .iter()
            .map(|beat| {
                NodeRow::new(
                    beat,
                    &running,
                    self.cluster.admin.get(&beat.node),
                    now,
                    self.cluster.policy.missed_heartbeats,
                )
            })
            .collect()
    }
}
