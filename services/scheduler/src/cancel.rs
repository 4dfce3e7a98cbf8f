//! `jobs.<id>.cancel`: its owner or an admin stops a job. A queued job ends at once; a
//! running one is killed on its nodes and ends when its agent reports so (the job
//! lifecycle's `Cancel`).

use anyhow::Result;

use mgpu_protocol::cancel::CancelRequest;
use mgpu_protocol::ids::JobId;

use crate::identity::Identity;
use crate::lifecycle::Input;
use crate::service::Scheduler;

impl Scheduler {
    pub(crate) async fn on_cancel(
        &mut self,
        job: &JobId,
        request: CancelRequest,
        identity: &Identity,
    ) -> Result<()> {
        if self.store.get(job).is_none() {
            tracing::warn!(job = %job, "cancel for an unknown job");
            return Ok(());
        }
        let input = Input::Cancel {
            by: identity.requester(),
            reason: request.reason,
        };
        self.apply_input(job, input, Some(identity)).await
    }
}
