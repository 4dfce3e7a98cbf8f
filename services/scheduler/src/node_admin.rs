//! `admin.requests`: admins drain and resume nodes, pause and resume GPUs (`mgpu node`,
//! `mgpu gpu`; the request is `mgpu_protocol::node_admin::AdminRequest`). The server lets only
//! admins publish it, and the signature must be an admin's too. The marks are kept in the
//! cluster bucket, so they survive restarts, and in the node table, which the core reads.

use anyhow::{Result, anyhow};
use bytes::Bytes;

use mgpu_protocol::node::AdminMark;
use mgpu_protocol::node_admin::AdminRequest;
use mgpu_protocol::request::Action;
use mgpu_protocol::{now, subjects};

use crate::identity::Identity;
use crate::metrics::RefusalReason;
use crate::outbox::Sender;
use crate::service::Scheduler;

impl Scheduler {
    pub(crate) async fn on_node_admin(
        &mut self,
        request: AdminRequest,
        identity: &Identity,
    ) -> Result<()> {
        let sender = Sender::Known(identity);
        if !identity.admin {
            let reason = format!("{} is not an admin", identity.name);
            let why = RefusalReason::NotPermitted;
            self.refuse(Action::Admin, None, &sender, why, reason);
            return Ok(());
        }
        // Marks carry the signer, whatever name the payload gives.
        let mark = |reason: &Option<String>| AdminMark {
            by: identity.name.clone(),
            at: now(),
            reason: reason.clone(),
        };
        let node = match &request {
            AdminRequest::DrainNode { node, .. }
            | AdminRequest::ResumeNode { node, .. }
            | AdminRequest::PauseGpu { node, .. }
            | AdminRequest::ResumeGpu { node, .. } => node.clone(),
        };
        let mut admin = self.nodes.admin.get(&node).cloned().unwrap_or_default();
        match &request {
            AdminRequest::DrainNode { reason, .. } => admin.drained = Some(mark(reason)),
            AdminRequest::ResumeNode { .. } => admin.drained = None,
            AdminRequest::PauseGpu { index, reason, .. } => {
                admin.paused_gpus.insert(*index, mark(reason));
            }
            AdminRequest::ResumeGpu { index, .. } => {
                admin.paused_gpus.remove(index);
            }
        }
        self.cluster
            .put(
                subjects::node_admin_key(&node),
                Bytes::from(serde_json::to_vec(&admin)?),
            )
            .await
            .map_err(|e| anyhow!("storing node {node} administration: {e}"))?;
        tracing::info!(node, by = identity.name, request = ?request, "node administration changed");
        self.outbox.audit(
            Action::Admin,
            &sender,
            Some(node.clone()),
            Ok(format!("{request:?}")),
        );
        self.nodes.admin.insert(node, admin);
        Ok(())
    }
}
