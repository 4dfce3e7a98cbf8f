//! Carrying out a pass's decisions through the job lifecycle: starts (recorded, then
//! assignments sent), new wait reasons, rejections and preemptions. Starts and wait reasons,
//! the bulk of a busy pass, are stored together (pipelined) and their assignments sent
//! together; rejections and preemptions, rare, one by one.

use std::collections::HashMap;

use futures::StreamExt;

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState, Launch, OnTimeout, Placement, WaitReason};

use crate::config::effective_time_limit;
use crate::core::Decision;
use crate::lifecycle::{self, Effect, Input};
use crate::outbox::master_port;
use crate::service::Scheduler;
use crate::state::WRITE_CHUNK;

/// Assignments awaiting JetStream's acknowledgement at once when a pass starts many jobs.
const ASSIGNMENTS_IN_FLIGHT: usize = 256;

impl Scheduler {
    /// Carries out a pass's decisions; returns how many changed something.
    pub(crate) async fn carry_out_all(
        &mut self,
        decisions: Vec<Decision>,
        now: Timestamp,
    ) -> usize {
        let mut starts: Vec<(JobId, Placement)> = Vec::new();
        let mut waits: Vec<(JobId, WaitReason)> = Vec::new();
        let mut others = Vec::new();
        for decision in decisions {
            match decision {
                Decision::Start { job, placement } => {
                    let placement = self.with_launch(&job, placement);
                    starts.push((job, placement));
                }
                Decision::Wait { job, reason } => {
                    let unchanged = matches!(
                        self.store.get(&job).map(|r| &r.state),
                        Some(JobState::Queued(w)) if w.reason == reason
                    );
                    if !unchanged {
                        waits.push((job, reason));
                    }
                }
                other => others.push(other),
            }
        }
        let mut changes = 0;
        for chunk in starts.chunks(WRITE_CHUNK) {
            changes += self.start_all(chunk, now).await;
        }
        for chunk in waits.chunks(WRITE_CHUNK) {
            changes += self.wait_all(chunk, now).await;
        }
        for decision in others {
            let (job, input) = match decision {
                Decision::Reject { job, reason } => (job, Input::Reject { reason }),
                Decision::Preempt { job } => (job, Input::SliceEnd),
                Decision::Start { .. } | Decision::Wait { .. } => continue,
            };
            match self.apply_input(&job, input, None).await {
                Ok(()) => changes += 1,
                Err(err) => tracing::error!(job = %job, "{err:#}"),
            }
        }
        changes
    }

    /// Records the started jobs as running, all writes pipelined, then sends their
    /// assignments, many at once. Recorded first: if we die in between, the restarted
    /// scheduler sees running jobs that never started and sends them again (the message id
    /// makes JetStream drop a copy that did go out).
    async fn start_all(&mut self, starts: &[(JobId, Placement)], now: Timestamp) -> usize {
        let inputs: HashMap<JobId, Input> = starts
            .iter()
            .map(|(job, placement)| {
                let placement = placement.clone();
                (job.clone(), Input::Start { placement })
            })
            .collect();
        // How long each waited, read before its record turns running and forgets.
        let waited: HashMap<JobId, chrono::Duration> = starts
            .iter()
            .filter_map(|(job, _)| match self.store.get(job) {
                Some(JobRecord {
                    state: JobState::Queued(waiting),
                    submitted_at,
                    ..
                }) => Some((
                    job.clone(),
                    now - waiting.enqueued_at.unwrap_or(*submitted_at),
                )),
                _ => None,
            })
            .collect();
        let started = self
            .write_all(&inputs, starts.iter().map(|(job, _)| job), now)
            .await;
        {
            let mut tally = self.metrics.tally();
            for (job, _) in &started {
                if let Some(waited) = waited.get(job) {
                    tally.started_after(*waited);
                }
            }
        }
        let this = &*self;
        let sent: Vec<(JobId, anyhow::Result<()>)> = futures::stream::iter(started)
            .map(|(job, todo)| async move {
                let outcome = this.carry_out_effects(&job, todo, None).await;
                (job, outcome)
            })
            .buffered(ASSIGNMENTS_IN_FLIGHT)
            .collect()
            .await;
        let mut changes = 0;
        for (job, outcome) in sent {
            match outcome {
                Ok(()) => {
                    changes += 1;
                    self.arm_slice_timer(&job, now);
                }
                // Recorded as running: the repair timer sends it again.
                Err(err) => tracing::error!("{err:#}"),
            }
        }
        changes
    }

    /// Gives waiting jobs their new reasons, all writes pipelined.
    async fn wait_all(&mut self, waits: &[(JobId, WaitReason)], now: Timestamp) -> usize {
        let inputs: HashMap<JobId, Input> = waits
            .iter()
            .map(|(job, reason)| (job.clone(), Input::Wait { reason: *reason }))
            .collect();
        let written = self
            .write_all(&inputs, waits.iter().map(|(job, _)| job), now)
            .await;
        let mut changes = 0;
        for (job, todo) in written {
            changes += 1;
            if let Err(err) = self.carry_out_effects(&job, todo, None).await {
                tracing::error!(job = %job, "{err:#}");
            }
        }
        changes
    }

    /// Applies each job's input in `order` and stores the records it changes, all writes
    /// pipelined; where a stored record changed under the scheduler, the input is applied
    /// again to what is stored. The effects of each record stored, in order (an input that
    /// changed nothing only gets its log lines carried out here).
    async fn write_all<'a>(
        &mut self,
        inputs: &HashMap<JobId, Input>,
        order: impl Iterator<Item = &'a JobId>,
        now: Timestamp,
    ) -> Vec<(JobId, Vec<Effect>)> {
        let limits = self.limits();
        let mut records = Vec::with_capacity(inputs.len());
        let mut effects = Vec::with_capacity(inputs.len());
        for job in order {
            let (Some(record), Some(input)) = (self.store.get(job), inputs.get(job)) else {
                continue;
            };
            let transition = lifecycle::apply(record, input.clone(), now, &limits);
            match transition.record {
                Some(record) => {
                    records.push(record);
                    effects.push((job.clone(), transition.effects));
                }
                None => {
                    let logs_only = transition.effects;
                    if let Err(err) = self.carry_out_effects(job, logs_only, None).await {
                        tracing::error!(job = %job, "{err:#}");
                    }
                }
            }
        }
        let redo = |stored: &JobRecord| {
            let input = inputs.get(&stored.id)?.clone();
            lifecycle::apply(stored, input, now, &limits).record
        };
        let written = self.store.write_many(records, redo).await;
        let mut stored = Vec::with_capacity(effects.len());
        for ((job, todo), result) in effects.into_iter().zip(written) {
            match result {
                Ok(true) => stored.push((job, todo)),
                Ok(false) => tracing::warn!(job = %job, "its record changed under the scheduler"),
                Err(err) => tracing::error!(job = %job, "storing a decision: {err:#}"),
            }
        }
        stored
    }

    /// Wakes the loop when a just-started job's time slice ends (jobs that requeue at their
    /// time limit run in slices).
    fn arm_slice_timer(&mut self, job: &JobId, now: Timestamp) {
        let Some(record) = self.store.get(job) else {
            return;
        };
        if record.spec.on_timeout != OnTimeout::Requeue {
            return;
        }
        if let Some(end) = effective_time_limit(&self.policy, &record.spec)
            .and_then(|l| chrono::Duration::from_std(l).ok())
            .map(|limit| now + limit)
            && self.next_slice_end.is_none_or(|next| end < next)
        {
            self.next_slice_end = Some(end);
        }
    }

    /// A placement with what a multi-node or distributed job's ranks need to find each other.
    fn with_launch(&self, job: &JobId, mut placement: Placement) -> Placement {
        let Some(spec) = self.store.get(job).map(|r| &r.spec) else {
            return placement;
        };
        if spec.is_multi_node() || spec.distributed {
            placement.launch = Some(Launch {
                distributed: spec.distributed,
                addresses: placement
                    .node_names()
                    .into_iter()
                    .map(|node| self.nodes.address(node).unwrap_or(node).to_owned())
                    .collect(),
                master_port: master_port(job),
            });
        }
        placement
    }
}
