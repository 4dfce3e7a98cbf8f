//! A scheduling pass: the core's view of the queue brought up to date ([`QueueViews`]),
//! [`core::plan`] asked, and its decisions turned into lifecycle inputs: starts (the record
//! written as running with its placement, then the assignments sent), new wait reasons,
//! rejections and preemptions (a time slice over while others wait).

use mgpu_protocol::stop::{StopCause, StopWarning};
use std::collections::{HashMap, HashSet};

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState, Launch, Placement};

use super::SchedulerState;
use super::assignment::master_port;
use super::messages::Command;
use super::pending::Origin;
use crate::core::{self, CoreSettings, Decision, QueuedJob, RunningJob};

/// Decisions of a pass applied at once: their writes go out together (pipelined), and what
/// they hold until stored stays a few MB.
pub(crate) const DECISIONS_AT_ONCE: usize = 2_048;
use crate::lifecycle::Input;
use crate::queue_view::Sources;
use crate::status::PassSample;
use crate::time_limits::run_ends;

impl SchedulerState {
    /// Queued jobs whose earlier attempt may still run: a node lists it although the job
    /// was requeued (the node came back before its agent fenced itself, or after its fence
    /// time but before a standby that had not heard from it yet gave up on it, or the other
    /// ranks of a distributed job one rank of which was lost are still stopping). The stale
    /// attempt is being killed (liveness); the new one waits until it is gone, or until the
    /// offline node that lists it surely stopped it, so the job never runs twice. Also the
    /// earliest such time, when a pass must look again. Only jobs that ran before are looked
    /// for.
    fn earlier_attempts_still_running(
        &self,
        now: Timestamp,
    ) -> (HashSet<JobId>, Option<Timestamp>) {
        let requeued: HashMap<&JobId, u32> = self
            .views
            .queued()
            .filter(|q| q.attempt > 1)
            .map(|q| (&q.id, q.attempt))
            .collect();
        let mut waiting = HashSet::new();
        let mut look_again: Option<Timestamp> = None;
        if requeued.is_empty() {
            return (waiting, look_again);
        }
        for (running, until) in self.nodes.possibly_running(now) {
            if requeued
                .get(&running.id)
                .is_some_and(|attempt| running.attempt < *attempt)
            {
                waiting.insert(running.id.clone());
                if let Some(until) = until {
                    look_again = Some(look_again.map_or(until, |earliest| earliest.min(until)));
                }
            }
        }
        (waiting, look_again)
    }

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
        let (stale, stale_gone_by) = self.earlier_attempts_still_running(now);
        self.watch.next_release_monotonic = self.watch.prune_fenced(self.monotonic);
        let monotonic = self.monotonic;
        let queue: Vec<&QueuedJob> = self
            .views
            .queued()
            .filter(|q| !stale.contains(&q.id) && !self.watch.fencing(&q.id, monotonic))
            .collect();
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
            .chain(stale_gone_by)
            .filter(|t| *t > now)
            .min();
        let mut sample = PassSample {
            queued: queue.len(),
            running: running.len(),
            view_us: lap(),
            ..PassSample::default()
        };
        if !queue.is_empty() || self.bookings.any_open(now) {
            let horizon = self.policy.reservations.horizon_secs;
            let settings = CoreSettings {
                placement: self.policy.placement,
                max_reservations: self.policy.max_reservations,
                topology_label: Some(self.policy.topology_label.clone())
                    .filter(|label| !label.is_empty()),
                gpu_caps: std::sync::Arc::clone(&self.gpu_caps),
                gpu_type_caps: std::sync::Arc::clone(&self.gpu_type_caps),
                class_caps: std::sync::Arc::clone(&self.class_caps),
                max_start_estimates: self.policy.max_start_estimates,
                windows: self.bookings.windows(),
                reservation_horizon: chrono::Duration::seconds(
                    i64::try_from(horizon).unwrap_or(i64::MAX / 1000),
                ),
            };
            let nodes = self.nodes.views(now);
            sample.view_us = lap();
            let plan = core::plan_with_estimates(&nodes, &running, &queue, &settings, now);
            sample.plan_us = lap().saturating_sub(sample.view_us);
            drop((queue, running));
            self.estimates.update(plan.estimates, now);
            self.carry_out_decisions(plan.decisions, now);
        } else {
            self.estimates.update(Vec::new(), now);
        }
        // New jobs the pass had nothing to decide for (none waits: they were cancelled).
        self.write_staged();
        self.save_usage(now, false);
        self.save_plan(now);
        (std::mem::take(&mut self.out), sample, churn)
    }

    /// Decisions of the last pass whose records were stored (read once its writes came out).
    pub fn take_pass_changes(&mut self) -> usize {
        std::mem::take(&mut self.pass_changes)
    }

    /// Turns a pass's decisions into lifecycle inputs: starts first, then new wait reasons
    /// (a reason the record already gives is not written again), then rejections and
    /// preemptions. They are applied [`DECISIONS_AT_ONCE`] at a time (see
    /// [`SchedulerState::apply_more_decisions`]).
    fn carry_out_decisions(&mut self, decisions: Vec<Decision>, now: Timestamp) {
        let mut starts = Vec::new();
        let mut waits = Vec::new();
        let mut others = Vec::new();
        for decision in decisions {
            match decision {
                Decision::Start { job, placement } => {
                    let placement = self.with_launch(&job, placement);
                    let waited = self.jobs.get(&job).and_then(|record| waited(record, now));
                    starts.push((job, Input::Start { placement }, Origin::Pass { waited }));
                }
                Decision::Wait { job, reason } => {
                    let unchanged = matches!(
                        self.jobs.get(&job).map(|r| &r.state),
                        Some(JobState::Queued(w)) if w.reason == reason
                    );
                    if !unchanged {
                        let origin = Origin::Pass { waited: None };
                        waits.push((job, Input::Wait { reason }, origin));
                    }
                }
                Decision::Reject { job, reason } => {
                    let origin = Origin::Pass { waited: None };
                    others.push((job, Input::Reject { reason }, origin));
                }
                Decision::Preempt { job, for_job } => {
                    let origin = Origin::Pass { waited: None };
                    let input = match for_job {
                        None => Some(Input::SliceEnd),
                        Some(for_job) => self.preemption(&job, &for_job),
                    };
                    others.extend(input.map(|input| (job, input, origin)));
                }
                Decision::Vacate { job, window } => {
                    let origin = Origin::Pass { waited: None };
                    let input = self.jobs.get(&job).map(|record| Input::Preempt {
                        for_job: format!("reservation {window}"),
                        warning: self.stop_warning(record, StopCause::Preempted),
                    });
                    others.extend(input.map(|input| (job, input, origin)));
                }
                Decision::Reclaim { job, for_job } => {
                    let origin = Origin::Pass { waited: None };
                    let input = self.reclamation(&job, for_job);
                    others.extend(input.map(|input| (job, input, origin)));
                }
            }
        }
        // A new job's decision changes its staged record, which is then created; the other
        // decisions go out a chunk at a time once every new record is stored (some were
        // made for new jobs: a preemption, a reclaim, a slice's yield), and are dropped if
        // one is not (see `staging`).
        let (staged, stored): (Vec<_>, Vec<_>) = starts
            .into_iter()
            .chain(waits)
            .chain(others)
            .partition(|(job, ..)| self.staged.contains(job));
        for (job, input, origin) in staged {
            self.apply_staged(now, &job, (input, origin, None));
        }
        self.write_staged();
        self.decisions_left = stored.into();
        self.decided_at = now;
        self.apply_more_decisions();
    }

    /// Applies the next [`DECISIONS_AT_ONCE`] decisions of the last pass, once the writes of
    /// those before have come out: what is held at once (records on their way to the store,
    /// their effects) stays bounded when a pass decides for 100 000 jobs.
    pub(crate) fn apply_more_decisions(&mut self) {
        let now = self.decided_at;
        // A chunk that wrote nothing (jobs gone meanwhile) is followed by the next at once.
        while self.pending.is_empty() && !self.decisions_left.is_empty() {
            for _ in 0..DECISIONS_AT_ONCE {
                let Some((job, input, origin)) = self.decisions_left.pop_front() else {
                    break;
                };
                self.apply(now, &job, input, origin, None);
            }
        }
    }

    /// The stop of `victim` for `for_job`, a job of a class that may preempt.
    fn preemption(&self, victim: &JobId, for_job: &JobId) -> Option<Input> {
        let record = self.jobs.get(victim)?;
        let preemptor = self.jobs.get(for_job)?;
        Some(Input::Preempt {
            for_job: format!("{} ({})", for_job.short(), preemptor.user),
            warning: self.stop_warning(record, StopCause::Preempted),
        })
    }

    /// The idle policy's action on `idle`, for `for_job` that waits for its GPUs; a requeue
    /// is warned as a preemption is. Nothing when the job's agents say it works again (its
    /// warning is withdrawn at the next tick).
    fn reclamation(&self, idle: &JobId, for_job: JobId) -> Option<Input> {
        let record = self.jobs.get(idle)?;
        let waiter = self.jobs.get(&for_job)?;
        let JobState::Running(run) = &record.state else {
            return None;
        };
        if super::idle::idleness(&self.nodes, record, run) == super::idle::Idleness::Busy {
            return None;
        }
        Some(Input::Reclaim {
            for_job: format!("{} ({})", for_job.short(), waiter.user),
            for_id: for_job,
            stop: self.stop_warning(record, StopCause::Idle),
        })
    }

    /// The warning a job stopped for another gets: its `--signal` (default SIGUSR1), then its
    /// class's grace, or the shorter time its `--signal` asks for.
    fn stop_warning(&self, record: &JobRecord, cause: StopCause) -> StopWarning {
        let class = self.policy.qos.of_job(record.spec.qos.as_deref());
        let asked = record.spec.signal;
        let grace_secs = match asked.map(|s| s.seconds) {
            Some(seconds) if seconds > 0 => seconds.min(class.grace_secs),
            _ => class.grace_secs,
        };
        StopWarning {
            signal: asked.map_or(mgpu_protocol::stop::DEFAULT_SIGNAL, |s| s.signal),
            grace_secs,
            cause,
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
