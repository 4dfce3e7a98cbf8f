//! The scheduler as a NATS micro service: `$SRV.PING` / `$SRV.INFO` answer with
//! `mgpu-scheduler`, and `mgpu.scheduler.status` answers with the counters below.

use anyhow::{Result, anyhow};
use async_nats::service::ServiceExt;
use futures::StreamExt;
use serde::Serialize;
use tokio::sync::watch;

use mgpu_protocol::subjects;

/// What `mgpu.scheduler.status` answers.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Status {
    pub jobs_queued: usize,
    pub jobs_running: usize,
    pub jobs_total: usize,
    pub nodes_known: usize,
    pub nodes_online: usize,
    pub passes: u64,
    /// The latest scheduling passes, oldest first (at most [`RECENT_PASSES`]): what the
    /// benchmark reads, and what an operator asks when the queue seems slow.
    pub recent_passes: std::collections::VecDeque<PassSample>,
}

/// Passes kept in [`Status::recent_passes`].
pub const RECENT_PASSES: usize = 2_000;

/// How long one scheduling pass took, and over how much.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct PassSample {
    /// Jobs waiting when it began.
    pub queued: usize,
    pub running: usize,
    /// Building the core's view of jobs and nodes.
    pub view_us: u64,
    /// The core's decisions (`core::plan`).
    pub plan_us: u64,
    /// The whole pass, writes of its decisions and assignments included.
    pub total_us: u64,
    /// Decisions that changed something (starts, new wait reasons, rejections, preemptions).
    pub changes: usize,
}

/// Registers the service and answers status requests until the client closes.
pub async fn serve(client: async_nats::Client, status: watch::Receiver<Status>) -> Result<()> {
    let service = client
        .service_builder()
        .description("mgpu scheduler: places queued GPU jobs on nodes")
        .start(subjects::SCHEDULER_SERVICE, env!("CARGO_PKG_VERSION"))
        .await
        .map_err(|e| anyhow!("registering the micro service: {e}"))?;
    let mut endpoint = service
        .endpoint(subjects::SCHEDULER_STATUS)
        .await
        .map_err(|e| anyhow!("adding the status endpoint: {e}"))?;
    while let Some(request) = endpoint.next().await {
        let body = serde_json::to_vec(&*status.borrow()).unwrap_or_default();
        if let Err(err) = request.respond(Ok(body.into())).await {
            tracing::warn!(%err, "answering a status request");
        }
    }
    Ok(())
}
