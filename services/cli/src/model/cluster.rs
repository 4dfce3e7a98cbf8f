//! What the scheduler keeps in the cluster bucket, read once per command: the policy and usage
//! that effective priorities are computed from, the admins' marks (drained nodes, paused
//! GPUs), when waiting jobs are expected to start, and the reservations.

use std::collections::BTreeMap;

use anyhow::Result;
use async_nats::jetstream;
use mgpu_nats::error::StateError;
use mgpu_nats::records::{self, ClusterState};
use mgpu_protocol::node::NodeAdmin;
use mgpu_protocol::plan::PlanSnapshot;
use mgpu_protocol::priority::{Policy, UsageBook};
use mgpu_protocol::reservation::Reservation;

use crate::errors::plain;

/// The cluster bucket's contents, by what they are for.
#[derive(Debug, Default)]
pub struct Cluster {
    pub policy: Policy,
    pub usage: UsageBook,
    /// Each node's admin marks, by node name.
    pub admin: BTreeMap<String, NodeAdmin>,
    /// When the scheduler expects waiting jobs to start.
    pub plan: PlanSnapshot,
    /// The reservations kept (booked ones, and those over for a few days), by name.
    pub reservations: BTreeMap<String, Reservation>,
}

impl Cluster {
    /// A server set up before the cluster bucket existed has none of it yet: defaults apply
    /// (no node drained, nobody's usage counted), as the scheduler would assume.
    pub async fn read(js: &jetstream::Context) -> Result<Cluster> {
        let state = match records::cluster_state(js).await {
            Ok(state) => state,
            Err(StateError::NotSetUp) => ClusterState::default(),
            Err(err) => return Err(plain(err)),
        };
        Ok(Cluster {
            policy: state.policy.unwrap_or_default(),
            usage: state.usage.unwrap_or_default(),
            admin: state.node_admin,
            plan: state.plan,
            reservations: state.reservations,
        })
    }
}
