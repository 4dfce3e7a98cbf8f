//! The core's view of the queue, kept between passes: one [`QueuedJob`] per waiting job,
//! rebuilt only when its record changes, its effective priority and dependencies refreshed
//! every pass; and one [`RunningJob`] per running job, rebuilt only when its record changes
//! (rebuilding 8 000 of them, names and placements copied, was a tenth of every pass).

use std::collections::HashMap;

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobSpec, JobState, Run, Waiting};
use mgpu_protocol::priority::{
    Policy, UsageBook, base_priority, effective_priority, effective_priority_after,
};

use crate::config::effective_host_request;
use crate::core::{Dependencies, QueuedJob, RunningJob};
use crate::machine::jobs::JobTable;
use crate::time_limits::{run_ends, time_limit};
use mgpu_protocol::gpu_type::Constraint;

/// The core's views of the queued and running jobs, kept between passes.
#[derive(Default)]
pub(crate) struct QueueViews {
    /// The core's view of each queued job, with what refreshing it needs: kept between
    /// passes so a pass over 100 000 waiting jobs does not copy each request.
    queued: Vec<QueueView>,
    /// Where each queued job's view is in `queued`.
    slots: HashMap<JobId, usize>,
    /// The running jobs as the core sees them, kept between passes like `queued`.
    running: HashMap<JobId, RunningJob>,
}

/// What building a view reads: the job table, users' usage and the policy.
pub(crate) struct Sources<'a> {
    pub jobs: &'a JobTable,
    pub usage: &'a UsageBook,
    pub policy: &'a Policy,
}

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

impl QueueViews {
    /// The queued jobs' views, in no particular order.
    pub(crate) fn queued(&self) -> impl Iterator<Item = &QueuedJob> {
        self.queued.iter().map(|cached| &cached.view)
    }

    /// The running jobs' views, in no particular order.
    pub(crate) fn running(&self) -> impl Iterator<Item = &RunningJob> {
        self.running.values()
    }

    /// Brings the views up to date with the records in `sources.jobs` whose ids are in
    /// `changed` (the records put or dropped since the last pass: a new view, a dropped one);
    /// then every queued view's effective priority (it ages) and, for the few jobs with
    /// dependencies, whether those are met, are refreshed in one sweep over views that lie
    /// next to each other in memory.
    pub(crate) fn refresh(
        &mut self,
        changed: impl IntoIterator<Item = JobId>,
        sources: &Sources<'_>,
        now: Timestamp,
    ) {
        for id in changed {
            self.refresh_one(id, sources, now);
        }
        self.refresh_priorities(sources, now);
    }

    fn refresh_one(&mut self, id: JobId, sources: &Sources<'_>, now: Timestamp) {
        match sources.jobs.get(&id).map(|record| (record, &record.state)) {
            Some((record, JobState::Running(run))) => {
                let view = running_job(sources, record, run, now);
                self.running.insert(id.clone(), view);
            }
            _ => {
                self.running.remove(&id);
            }
        }
        let fresh = sources
            .jobs
            .get(&id)
            .and_then(|record| match &record.state {
                JobState::Queued(waiting) => Some(QueueView {
                    priority: base_priority(&record.spec, sources.policy),
                    queued_secs: waiting
                        .enqueued_at
                        .unwrap_or(record.submitted_at)
                        .timestamp(),
                    user: record.user.clone(),
                    has_dependencies: !record.spec.after.is_empty()
                        || !record.spec.after_any.is_empty(),
                    view: queued_job(sources, record, waiting, now),
                }),
                _ => None,
            });
        match (self.slots.get(&id).copied(), fresh) {
            (Some(slot), Some(view)) => self.queued[slot] = view,
            (Some(slot), None) => {
                self.slots.remove(&id);
                self.queued.swap_remove(slot);
                if let Some(moved) = self.queued.get(slot) {
                    self.slots.insert(moved.view.id.clone(), slot);
                }
            }
            (None, Some(view)) => {
                self.slots.insert(id, self.queued.len());
                self.queued.push(view);
            }
            (None, None) => {}
        }
    }

    fn refresh_priorities(&mut self, sources: &Sources<'_>, now: Timestamp) {
        let policy = sources.policy;
        let now_secs = now.timestamp();
        let mut gpu_hours: HashMap<String, f64> = HashMap::new();
        let mut last_user: Option<(String, f64)> = None;
        for cached in &mut self.queued {
            // Runs of one user's jobs are common: no lookup for those.
            let hours = match &last_user {
                Some((user, hours)) if *user == cached.user => *hours,
                _ => {
                    let hours = match gpu_hours.get(cached.user.as_str()) {
                        Some(hours) => *hours,
                        None => {
                            let hours =
                                sources
                                    .usage
                                    .gpu_hours(&cached.user, now, policy.half_life_secs);
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
                policy,
            );
            if cached.has_dependencies
                && let Some(record) = sources.jobs.get(&cached.view.id)
            {
                cached.view.dependencies = dependencies(sources.jobs, record);
            }
        }
        // Usage decays: a job with a time slice is ranked, were it requeued, as of now. Jobs
        // without one never yield, so they are left alone.
        for running in self.running.values_mut() {
            if running.slice_end.is_none() {
                continue;
            }
            let Some(record) = sources.jobs.get(&running.id) else {
                continue;
            };
            let hours = *gpu_hours.entry(record.user.clone()).or_insert_with(|| {
                sources
                    .usage
                    .gpu_hours(&record.user, now, policy.half_life_secs)
            });
            running.priority_if_requeued =
                effective_priority_after(base_priority(&record.spec, policy), 0, hours, policy);
        }
    }
}

fn queued_job(
    sources: &Sources<'_>,
    record: &JobRecord,
    waiting: &Waiting,
    now: Timestamp,
) -> QueuedJob {
    let policy = sources.policy;
    let queued_at = waiting.enqueued_at.unwrap_or(record.submitted_at);
    let gpu_hours = sources
        .usage
        .gpu_hours(&record.user, now, policy.half_life_secs);
    let mut view = request_view(policy, &record.id, &record.user, &record.spec, queued_at);
    view.effective_priority = effective_priority(
        base_priority(&record.spec, policy),
        queued_at,
        gpu_hours,
        policy,
        now,
    );
    view.held = waiting.held_by.is_some();
    view.dependencies = dependencies(sources.jobs, record);
    view.not_before = waiting.not_before;
    view.recorded_reason = Some(waiting.reason);
    view.attempt = record.attempt;
    view
}

/// What job `id` of `user` asks for, as the core sees it, queued at `queued_at` with no
/// priority, hold or dependency worked out: enough to judge where it could ever run (what
/// the intake checks a submission against).
pub(crate) fn request_view(
    policy: &Policy,
    id: &JobId,
    user: &str,
    spec: &JobSpec,
    queued_at: Timestamp,
) -> QueuedJob {
    let (cpus, mem_host_mib) = effective_host_request(policy, spec);
    let class = policy.qos.of_job(spec.qos.as_deref());
    QueuedJob {
        owner: user.to_owned(),
        id: id.clone(),
        effective_priority: 0,
        queued_at,
        gpus: spec.gpus,
        gpu_ids: spec.gpu_ids.clone(),
        allowed_gpus: spec.allowed_gpus.clone(),
        mem_mib: spec.mem_mib,
        cpus,
        mem_host_mib,
        time_limit: time_limit(policy, spec),
        held: false,
        dependencies: Dependencies::Met,
        array: spec
            .array
            .as_ref()
            .map(|a| (a.array_id.clone(), a.max_running)),
        nodes: spec.nodes,
        required_nodes: spec.required_nodes(),
        exclude: spec.exclude.clone(),
        node_gpu_ids: spec.node_gpu_ids.clone(),
        not_before: None,
        recorded_reason: None,
        attempt: 1,
        gpu_types: spec.gpu_types.clone(),
        qos: spec.qos.clone(),
        may_preempt: class.may_preempt,
        preemptible: class.preemptible,
        // A `--no-requeue` job is never stopped to run again: not preemptible for a window.
        stoppable_after: (class.preemptible && !spec.no_requeue)
            .then(|| std::time::Duration::from_secs(class.min_runtime_secs)),
        reservation: spec.reservation.clone(),
        // Checked at submit: a record that does not parse selects nothing rather than all.
        constraint: spec
            .constraint
            .as_deref()
            .map(|text| Constraint::parse(text).unwrap_or_else(|_| Constraint::Any(Vec::new()))),
    }
}

fn running_job(sources: &Sources<'_>, record: &JobRecord, run: &Run, now: Timestamp) -> RunningJob {
    let policy = sources.policy;
    let ends = run_ends(policy, record, run);
    let class = policy.qos.of_job(record.spec.qos.as_deref());
    let started_at = run.started_at.unwrap_or(run.assigned_at);
    let min_runtime =
        chrono::Duration::seconds(i64::try_from(class.min_runtime_secs).unwrap_or(i64::MAX / 1000));
    RunningJob {
        owner: record.user.clone(),
        id: record.id.clone(),
        placement: run.placement.clone(),
        expected_end: ends.expected_end,
        slice_end: ends.slice_end,
        array_id: record.spec.array.as_ref().map(|a| a.array_id.clone()),
        started_at,
        qos: record.spec.qos.clone(),
        // Counted from the process's start: a job not started yet has run nothing; a
        // `--no-requeue` job is never requeued, so never preempted.
        preemptible_from: run
            .started_at
            .filter(|_| class.preemptible && !record.spec.no_requeue)
            .map(|started| started + min_runtime),
        stopping: run.preempt_requested || run.cancel_requested_by.is_some(),
        may_preempt: class.may_preempt,
        reclaimable_from: reclaimable_from(record, run),
        reservation: record.spec.reservation.clone(),
        priority_if_requeued: effective_priority_after(
            base_priority(&record.spec, policy),
            0,
            sources
                .usage
                .gpu_hours(&record.user, now, policy.half_life_secs),
            policy,
        ),
    }
}

/// From when the idle policy may act on a job its warning names: a `--no-requeue` job is
/// never requeued, so only a cancel may be taken on it; a warning only warns.
fn reclaimable_from(record: &JobRecord, run: &Run) -> Option<mgpu_protocol::Timestamp> {
    use mgpu_protocol::idle::IdleAction;
    let warning = run.idle_warning.as_ref()?;
    match warning.action {
        IdleAction::Requeue if !record.spec.no_requeue => Some(warning.action_from),
        IdleAction::Cancel => Some(warning.action_from),
        _ => None,
    }
}

/// Whether `--after` (must succeed) and `--after-any` (must end) are met. A job started
/// before (requeued: its attempt past the first) met them then, and how a job ended never
/// changes: what it depends on may since have moved to history, unknown to a scheduler that
/// took over after, and it must not wait on that forever.
fn dependencies(store: &JobTable, record: &JobRecord) -> Dependencies {
    if record.attempt > 1 {
        return Dependencies::Met;
    }
    let spec = &record.spec;
    let mut waiting = false;
    for id in &spec.after {
        match store.state_of(id) {
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
        if !store.state_of(id).is_some_and(JobState::is_finished) {
            waiting = true;
        }
    }
    if waiting {
        Dependencies::Waiting
    } else {
        Dependencies::Met
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::jobs::Tracked;
    use mgpu_protocol::job::WaitReason;

    fn waiting_on(dependency: &JobId, attempt: u32) -> JobRecord {
        let mut spec = JobSpec::new(vec!["true".into()], "/tmp");
        spec.after = vec![dependency.clone()];
        JobRecord {
            id: JobId::random(),
            user: "alice".into(),
            user_key: None,
            spec,
            submitted_at: mgpu_protocol::now(),
            attempt,
            state: JobState::Queued(Waiting::new(WaitReason::Dependency)),
            last_request: None,
            preemptions: Vec::new(),
        }
    }

    #[test]
    fn a_requeued_job_does_not_wait_again_on_what_it_depended_on() {
        // What it depends on is in history, unknown to this scheduler (it took over since).
        let table = JobTable::new(Vec::<Tracked>::new());
        let gone = JobId::random();
        assert_eq!(
            dependencies(&table, &waiting_on(&gone, 1)),
            Dependencies::Waiting
        );
        assert_eq!(
            dependencies(&table, &waiting_on(&gone, 2)),
            Dependencies::Met
        );
    }
}
