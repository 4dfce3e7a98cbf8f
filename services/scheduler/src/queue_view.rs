//! The core's view of the queue, kept between passes: one [`QueuedJob`] per waiting job,
//! rebuilt only when its record changes, its effective priority and dependencies refreshed
//! every pass; and one [`RunningJob`] per running job, rebuilt only when its record changes
//! (rebuilding 8 000 of them, names and placements copied, was a tenth of every pass).

use std::collections::HashMap;

use mgpu_protocol::Timestamp;
use mgpu_protocol::job::{JobRecord, JobSpec, JobState, OnTimeout, Run, Waiting};
use mgpu_protocol::priority::{effective_priority, effective_priority_after};

use crate::core::{Dependencies, QueuedJob, RunningJob};
use crate::service::Scheduler;

/// A queued job's view for the core, kept between passes, with what refreshing it needs.
pub(crate) struct QueueView {
    /// The job's own priority and owner, from which its effective priority is recomputed.
    priority: i32,
    /// When it joined the queue, in whole seconds since the epoch.
    queued_secs: i64,
    user: String,
    has_dependencies: bool,
    pub(crate) view: QueuedJob,
}

impl Scheduler {
    /// Brings [`Scheduler::queue_views`] and [`Scheduler::running_views`] up to date. Only
    /// jobs whose record changed since the last pass are looked up (a new view, a dropped
    /// one); then every queued view's effective
    /// priority (it ages) and, for the few jobs with dependencies, whether those are met, are
    /// refreshed in one sweep over views that lie next to each other in memory.
    pub(crate) fn refresh_queue_views(&mut self, now: Timestamp) {
        let changed = self.store.take_changed();
        self.churn += changed.len();
        for id in changed {
            match self.store.get(&id).map(|record| (record, &record.state)) {
                Some((record, JobState::Running(run))) => {
                    let view = self.running_job(record, run);
                    self.running_views.insert(id.clone(), view);
                }
                _ => {
                    self.running_views.remove(&id);
                }
            }
            let fresh = self.store.get(&id).and_then(|record| match &record.state {
                JobState::Queued(waiting) => Some(QueueView {
                    priority: record.spec.priority,
                    queued_secs: waiting
                        .enqueued_at
                        .unwrap_or(record.submitted_at)
                        .timestamp(),
                    user: record.user.clone(),
                    has_dependencies: !record.spec.after.is_empty()
                        || !record.spec.after_any.is_empty(),
                    view: self.queued_job(record, waiting, now),
                }),
                _ => None,
            });
            match (self.queue_slots.get(&id).copied(), fresh) {
                (Some(slot), Some(view)) => self.queue_views[slot] = view,
                (Some(slot), None) => {
                    self.queue_slots.remove(&id);
                    self.queue_views.swap_remove(slot);
                    if let Some(moved) = self.queue_views.get(slot) {
                        self.queue_slots.insert(moved.view.id.clone(), slot);
                    }
                }
                (None, Some(view)) => {
                    self.queue_slots.insert(id, self.queue_views.len());
                    self.queue_views.push(view);
                }
                (None, None) => {}
            }
        }
        let mut views = std::mem::take(&mut self.queue_views);
        let now_secs = now.timestamp();
        let mut gpu_hours: HashMap<String, f64> = HashMap::new();
        let mut last_user: Option<(String, f64)> = None;
        for cached in &mut views {
            // Runs of one user's jobs are common: no lookup for those.
            let hours = match &last_user {
                Some((user, hours)) if *user == cached.user => *hours,
                _ => {
                    let hours = match gpu_hours.get(cached.user.as_str()) {
                        Some(hours) => *hours,
                        None => {
                            let hours =
                                self.usage
                                    .gpu_hours(&cached.user, now, self.policy.half_life_secs);
                            gpu_hours.insert(cached.user.clone(), hours);
                            hours
                        }
                    };
                    last_user = Some((cached.user.clone(), hours));
                    hours
                }
            };
            cached.view.effective_priority = effective_priority_after(
                cached.priority,
                now_secs - cached.queued_secs,
                hours,
                &self.policy,
            );
            if cached.has_dependencies
                && let Some(record) = self.store.get(&cached.view.id)
            {
                cached.view.dependencies = self.dependencies(&record.spec);
            }
        }
        self.queue_views = views;
    }

    fn queued_job(&self, record: &JobRecord, waiting: &Waiting, now: Timestamp) -> QueuedJob {
        let queued_at = waiting.enqueued_at.unwrap_or(record.submitted_at);
        let gpu_hours = self
            .usage
            .gpu_hours(&record.user, now, self.policy.half_life_secs);
        QueuedJob {
            id: record.id.clone(),
            effective_priority: effective_priority(
                record.spec.priority,
                queued_at,
                gpu_hours,
                &self.policy,
                now,
            ),
            queued_at,
            gpus: record.spec.gpus,
            gpu_ids: record.spec.gpu_ids.clone(),
            allowed_gpus: record.spec.allowed_gpus.clone(),
            mem_mib: record.spec.mem_mib,
            time_limit: self.effective_time_limit(&record.spec),
            held: waiting.held_by.is_some(),
            dependencies: self.dependencies(&record.spec),
            array: record
                .spec
                .array
                .as_ref()
                .map(|a| (a.array_id.clone(), a.max_running)),
            nodes: record.spec.nodes,
            required_nodes: record.spec.required_nodes(),
            exclude: record.spec.exclude.clone(),
            node_gpu_ids: record.spec.node_gpu_ids.clone(),
            not_before: waiting.not_before,
            recorded_reason: Some(waiting.reason),
        }
    }

    pub(crate) fn running_job(&self, record: &JobRecord, run: &Run) -> RunningJob {
        let began = run.started_at.unwrap_or(run.assigned_at);
        let end = self
            .effective_time_limit(&record.spec)
            .and_then(|limit| chrono::Duration::from_std(limit).ok())
            .map(|limit| began + limit);
        let sliced = record.spec.on_timeout == OnTimeout::Requeue && !run.preempt_requested;
        RunningJob {
            id: record.id.clone(),
            placement: run.placement.clone(),
            expected_end: end,
            slice_end: if sliced { end } else { None },
            array_id: record.spec.array.as_ref().map(|a| a.array_id.clone()),
        }
    }

    /// Whether `--after` (must succeed) and `--after-any` (must end) are met.
    fn dependencies(&self, spec: &JobSpec) -> Dependencies {
        let mut waiting = false;
        for id in &spec.after {
            match self.store.get(id).map(|r| &r.state) {
                Some(JobState::Succeeded(_)) => {}
                Some(state) if state.is_finished() => {
                    return Dependencies::Broken(format!(
                        "dependency {} ended {} (--after needs it to succeed)",
                        id.short(),
                        state.name()
                    ));
                }
                Some(_) => waiting = true,
                // Submitted but not recorded yet, or unknown: wait for it.
                None => waiting = true,
            }
        }
        for id in &spec.after_any {
            if !self.store.get(id).is_some_and(|r| r.state.is_finished()) {
                waiting = true;
            }
        }
        if waiting {
            Dependencies::Waiting
        } else {
            Dependencies::Met
        }
    }
}
