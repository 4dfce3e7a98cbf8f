//! The scheduler's view of the nodes: the last heartbeat of each, turned into what the
//! core needs (online or not, GPU inventory).

use std::collections::HashMap;

use mgpu_shared::Timestamp;
use mgpu_shared::node::{NodeHeartbeat, NodeLiveness};

use crate::core::{GpuCapacity, NodeView};

#[derive(Default)]
pub struct NodeTable {
    nodes: HashMap<String, NodeHeartbeat>,
}

impl NodeTable {
    pub fn from_heartbeats(beats: Vec<NodeHeartbeat>) -> Self {
        NodeTable {
            nodes: beats.into_iter().map(|b| (b.node.clone(), b)).collect(),
        }
    }

    /// Records a heartbeat. Returns true when it may let queued work start: the node is new,
    /// was offline, or its GPUs changed.
    pub fn update(&mut self, beat: NodeHeartbeat, now: Timestamp) -> bool {
        let changes_capacity = match self.nodes.get(&beat.node) {
            None => true,
            Some(old) => {
                old.liveness(now) == NodeLiveness::Offline
                    || old.gpus.len() != beat.gpus.len()
                    || old.gpus.iter().zip(&beat.gpus).any(|(a, b)| {
                        a.index != b.index || a.memory_total_mib != b.memory_total_mib
                    })
            }
        };
        self.nodes.insert(beat.node.clone(), beat);
        changes_capacity
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn online(&self, now: Timestamp) -> usize {
        self.nodes
            .values()
            .filter(|n| n.liveness(now) == NodeLiveness::Online)
            .count()
    }

    /// Nodes as the scheduling core sees them, sorted by name for deterministic passes.
    pub fn views(&self, now: Timestamp) -> Vec<NodeView> {
        let mut views: Vec<NodeView> = self
            .nodes
            .values()
            .map(|beat| NodeView {
                name: beat.node.clone(),
                online: beat.liveness(now) == NodeLiveness::Online,
                gpus: beat
                    .gpus
                    .iter()
                    .map(|g| GpuCapacity {
                        index: g.index,
                        memory_total_mib: g.memory_total_mib,
                    })
                    .collect(),
            })
            .collect();
        views.sort_by(|a, b| a.name.cmp(&b.name));
        views
    }
}
