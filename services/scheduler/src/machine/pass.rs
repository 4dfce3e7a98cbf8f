//! A scheduling pass: the core's view of the queue brought up to date ([`QueueViews`]),
//! [`core::plan`] asked, and its decisions turned into lifecycle inputs: starts (the record
//! written as running with its placement, then the assignments sent), new wait reasons,
//! rejections and preemptions (a time slice over while others wait).

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState, Launch, Placement};

use super::SchedulerState;
use super::assignment::master_port;
use super::messages::Command;
use super::transitions::Origin;
use crate::core::{self, CoreSettings, Decision, QueuedJob, RunningJob};
use crate::lifecycle::Input;
use crate::queue_view::Sources;
use crate::status::PassSample;
use crate::time_limits::run_ends;

impl SchedulerState {
    /// One scheduling pass at `now`. `lap` reads a stopwatch (microseconds since the pass
    /// began) for the pass's statistics; the machine reads no clock of its own. The sample's
    /// `changes` and `total_us` are the driver's to fill in once the pass's writes came out
    /// ([`SchedulerState::take_pass_changes`]).
    pub fn pass(
        &mut self,
        now: Timestamp,
        lap: &mut dyn FnMut() -> u64,
    ) -> (Vec<Command>, PassSample, usize) {
        self.pass_due = false;
        self.pass_changes = 0;
        let changed = self.jobs.take_changed();
        let churn = changed.len();
        let sources = Sources {
            jobs: &self.jobs,
            usage: &self.usage,
            policy: &self.policy,
        };
        self.views.refresh(changed, &sources, now);
        let queue: Vec<&QueuedJob> = self.views.queued().collect();
        let mut running: Vec<&RunningJob> = self.views.running().collect();
        // In id order: which slice yields first must not depend on hashing.
        running.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        // Only slices still to come arm the timer: one already over is acted on by the next
        // pass that finds someone waiting (a submission or an exit wakes the loop anyway).
        self.next_slice_end = running
            .iter()
            .filter_map(|r| r.slice_end)
            .filter(|end| *end > now)
            .min();
        // Jobs held until a lost node surely stopped them: the liveness timer wakes us then.
        self.watch.next_release = queue
            .iter()
            .filter_map(|q| q.not_before)
            .filter(|t| *t > now)
            .min();
        let mut sample = PassSample {
            queued: queue.len(),
            running: running.len(),
            view_us: lap(),
            ..PassSample::default()
        };
        if !queue.is_empty() {
            let settings = CoreSettings {
                placement: self.policy.placement,
                max_reservations: self.policy.max_reservations,
                topology_label: Some(self.policy.topology_label.clone())
                    .filter(|label| !label.is_empty()),
                gpu_caps: std::sync::Arc::clone(&self.gpu_caps),
            };
            let nodes = self.nodes.views(now);
            sample.view_us = lap();
            let decisions = core::plan(&nodes, &running, &queue, &settings, now);
            sample.plan_us = lap().saturating_sub(sample.view_us);
            drop((queue, running));
            self.carry_out_decisions(decisions, now);
        }
        self.save_usage(now, false);
        (std::mem::take(&mut self.out), sample, churn)
    }

    /// Decisions of the last pass whose records were stored (read once its writes came out).
    pub fn take_pass_changes(&mut self) -> usize {
        std::mem::take(&mut self.pass_changes)
    }

    /// Turns a pass's decisions into lifecycle inputs: starts first, then new wait reasons
    /// (a reason the record already gives is not written again), then rejections and
    /// preemptions.
    fn carry_out_decisions(&mut self, decisions: Vec<Decision>, now: Timestamp) {
        let mut waits = Vec::new();
        let mut others = Vec::new();
        for decision in decisions {
            match decision {
                Decision::Start { job, placement } => {
                    let placement = self.with_launch(&job, placement);
                    let waited = self.jobs.get(&job).and_then(|record| waited(record, now));
                    let input = Input::Start { placement };
                    self.apply(now, &job, input, Origin::Pass { waited }, None);
                }
                Decision::Wait { job, reason } => {
                    let unchanged = matches!(
                        self.jobs.get(&job).map(|r| &r.state),
                        Some(JobState::Queued(w)) if w.reason == reason
                    );
                    if !unchanged {
                        waits.push((job, Input::Wait { reason }));
                    }
                }
                Decision::Reject { job, reason } => others.push((job, Input::Reject { reason })),
                Decision::Preempt { job } => others.push((job, Input::SliceEnd)),
            }
        }
        for (job, input) in waits.into_iter().chain(others) {
            self.apply(now, &job, input, Origin::Pass { waited: None }, None);
        }
    }

    /// A job a pass just started runs in slices: the machine wants to be woken when its
    /// slice ends (the next pass reads it from the views, but the driver may sleep till then).
    pub(crate) fn arm_slice_timer(&mut self, job: &JobId) {
        let Some(record) = self.jobs.get(job) else {
            return;
        };
        let JobState::Running(run) = &record.state else {
            return;
        };
        if let Some(end) = run_ends(&self.policy, record, run).slice_end
            && self.next_slice_end.is_none_or(|next| end < next)
        {
            self.next_slice_end = Some(end);
        }
    }

    /// A placement with what a multi-node or distributed job's ranks need to find each other.
    fn with_launch(&self, job: &JobId, mut placement: Placement) -> Placement {
        let Some(spec) = self.jobs.get(job).map(|r| &r.spec) else {
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

/// How long a queued job has waited at `now` (read before its record turns running).
fn waited(record: &JobRecord, now: Timestamp) -> Option<chrono::Duration> {
    match &record.state {
        JobState::Queued(waiting) => Some(now - waiting.enqueued_at.unwrap_or(record.submitted_at)),
        _ => None,
    }
}
