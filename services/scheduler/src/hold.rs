//! `jobs.<id>.hold` and `jobs.<id>.release`: its owner or an admin keeps a queued job from
//! starting, and lets it go again (the job lifecycle's `Hold` and `Release`).

use anyhow::Result;

use mgpu_protocol::ids::JobId;

use crate::identity::Identity;
use crate::lifecycle::Input;
use crate::service::Scheduler;

impl Scheduler {
    /// Holds (`hold`) or releases `job`.
    pub(crate) async fn on_hold(
        &mut self,
        job: &JobId,
        hold: bool,
        identity: &Identity,
    ) -> Result<()> {
        if self.store.get(job).is_none() {
            tracing::warn!(job = %job, "hold/release of an unknown job");
            return Ok(());
        }
        let by = identity.requester();
        let input = if hold {
            Input::Hold { by }
        } else {
            Input::Release { by }
        };
        self.apply_input(job, input, Some(identity)).await
    }
}
