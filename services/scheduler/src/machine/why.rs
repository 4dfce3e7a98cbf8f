//! `mgpu why`: the scheduler's own account of why a job waits, read off its tables and the
//! last pass's plan, never a pass of its own: its place in line and what makes up its
//! effective priority, the jobs ahead whose reservations hold GPUs it could use, its owner's
//! limits and use, the GPU types and nodes it asks for against what is free, its hold,
//! dependencies or array limit, and when its GPUs free up by the time limits of the jobs on
//! them. Owners ask about their own jobs, admins about any; other users' jobs are named as
//! `mgpu queue` shows them (id, user, state, priority).

use std::collections::BTreeMap;

use mgpu_protocol::Timestamp;
use mgpu_protocol::duration::format_duration;
use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState, WaitReason, Waiting};
use mgpu_protocol::priority::{PRIORITY_SCALE, base_priority};
use mgpu_protocol::why::{Cause, CauseKind, JobRef, WhyAnswer};

use super::SchedulerState;
use crate::core::{NodeView, QueuedJob, RunningJob};

/// Jobs ahead named at most, by cause.
const JOBS_NAMED: usize = 5;

impl SchedulerState {
    /// The answer to the holder of public key `asker` about `job`; the refusal in words when
    /// the job is not known here or is neither theirs nor asked by an admin.
    pub fn explain(&self, job: &JobId, asker: &str, now: Timestamp) -> Result<WhyAnswer, String> {
        let record = self
            .jobs
            .get(job)
            .ok_or_else(|| format!("no job {} waits or runs", job.short()))?;
        let owns = record.user_key.as_deref() == Some(asker);
        if !owns && !self.admin_keys().any(|key| key == asker) {
            return Err(format!(
                "permission denied: job {} belongs to {}",
                job.short(),
                record.user
            ));
        }
        let mut answer = WhyAnswer {
            job: job.clone(),
            state: record.state.name().to_owned(),
            position: None,
            queued: 0,
            effective_priority: None,
            expected_start: self.estimates.of(job).cloned(),
            causes: Vec::new(),
        };
        let JobState::Queued(waiting) = &record.state else {
            answer.causes.push(not_waiting(record));
            return Ok(answer);
        };
        let mut order: Vec<&QueuedJob> = self.views.queued().collect();
        order.sort_by(|a, b| crate::core::queue_order(a, b));
        answer.queued = order.len();
        let position = order.iter().position(|q| &q.id == job);
        answer.position = position.map(|p| p + 1);
        let view = position.map(|p| order[p]);
        answer.effective_priority = view.map(|v| v.effective_priority);
        answer.causes = self.causes(record, waiting, view, &order, now);
        Ok(answer)
    }

    /// Every cause of a waiting job, the main one first.
    fn causes(
        &self,
        record: &JobRecord,
        waiting: &Waiting,
        view: Option<&QueuedJob>,
        order: &[&QueuedJob],
        now: Timestamp,
    ) -> Vec<Cause> {
        let mut causes = Vec::new();
        match waiting.reason {
            WaitReason::Held => causes.push(plain(
                CauseKind::Held,
                format!(
                    "held by {}: `mgpu release {}` lets it run",
                    waiting.held_by.as_deref().unwrap_or(&record.user),
                    record.id.short()
                ),
            )),
            WaitReason::Dependency => causes.push(self.dependencies(record)),
            WaitReason::ArrayLimit => causes.extend(self.array_limit(record)),
            WaitReason::UserLimit => causes.push(self.user_limit(record, view)),
            WaitReason::ReservationWindow | WaitReason::Reserved => {
                causes.push(self.reservation_cause(record, waiting.reason, now));
            }
            reason => causes.push(plain(CauseKind::Other, reason.describe().to_owned())),
        }
        if let Some(view) = view
            && wants_gpus(waiting.reason)
        {
            let nodes = self.nodes.views(now);
            causes.extend(self.jobs_ahead(view, order, &nodes));
            causes.push(free_gpus(view, &nodes, self.views.running()));
            causes.push(self.expected_start(view, now));
        }
        if let Some(view) = view {
            causes.push(self.place_in_line(record, view, order, now));
        }
        causes
    }

    /// The window its reservation opens at, or the bookings on the GPUs it could use.
    fn reservation_cause(&self, record: &JobRecord, reason: WaitReason, now: Timestamp) -> Cause {
        let at = |t: Timestamp| t.format("%Y-%m-%d %H:%M UTC").to_string();
        let kept = &self.bookings.kept;
        let text = match (reason, &record.spec.reservation) {
            (WaitReason::ReservationWindow, Some(name)) => match kept.get(name) {
                Some(r) => format!(
                    "runs in reservation {name} ({}'s, {} GPUs), whose window opens at {} and \
                     closes at {}",
                    r.owner,
                    r.gpus.len(),
                    at(r.start),
                    at(r.end)
                ),
                None => format!("runs in reservation {name}, which is not booked"),
            },
            _ => {
                let booked: Vec<String> = (kept.values())
                    .filter(|r| r.holds_at(now))
                    .map(|r| {
                        format!(
                            "{} ({}, {} GPUs, {} to {})",
                            r.name,
                            r.owner,
                            r.gpus.len(),
                            at(r.start),
                            at(r.end)
                        )
                    })
                    .collect();
                let limit = crate::time_limits::time_limit(&self.policy, &record.spec).map_or_else(
                    || "it has no time limit".to_owned(),
                    |l| {
                        format!(
                            "its time limit is {}",
                            mgpu_protocol::duration::format_duration(l)
                        )
                    },
                );
                format!(
                    "the GPUs it could use are booked by {}; a job runs on booked GPUs before a \
                     window only if it ends before the window opens ({limit})",
                    booked.join(", ")
                )
            }
        };
        plain(CauseKind::Reservation, text)
    }

    /// What the jobs it waits on are doing.
    fn dependencies(&self, record: &JobRecord) -> Cause {
        let spec = &record.spec;
        let jobs: Vec<JobRef> = (spec.after.iter().chain(&spec.after_any))
            .map(|id| self.job_ref(id))
            .collect();
        let listed: Vec<String> = jobs
            .iter()
            .map(|j| format!("{} ({}, {})", j.id.short(), j.user, j.state))
            .collect();
        Cause {
            kind: CauseKind::Dependency,
            text: format!(
                "waits for {} job(s) it depends on: {}",
                jobs.len(),
                listed.join(", ")
            ),
            jobs,
        }
    }

    /// Its array's running tasks against the array's `%N`.
    fn array_limit(&self, record: &JobRecord) -> Option<Cause> {
        let array = record.spec.array.as_ref()?;
        let running = self
            .views
            .running()
            .filter(|r| r.array_id.as_ref() == Some(&array.array_id))
            .count();
        Some(plain(
            CauseKind::ArrayLimit,
            format!(
                "its array {} runs {running} task(s), its limit (%{})",
                array.array_id.short(),
                array.max_running.unwrap_or_default()
            ),
        ))
    }

    /// Its owner's caps (total, per type, its class's) against what their jobs hold now.
    fn user_limit(&self, record: &JobRecord, view: Option<&QueuedJob>) -> Cause {
        let user = &record.user;
        let mine: Vec<&RunningJob> = self.views.running().filter(|r| &r.owner == user).collect();
        let held: u64 = mine.iter().map(|r| units_of(r)).sum();
        let mut said = Vec::new();
        if let Some(cap) = self.gpu_caps.get(user) {
            said.push(format!(
                "{user} may hold {} GPU(s) at once and holds {} in {} job(s)",
                gpus(*cap),
                gpus(held),
                mine.len()
            ));
        }
        if let Some(caps) = self.gpu_type_caps.get(user) {
            for (gpu_type, cap) in caps {
                said.push(format!("at most {} of type {gpu_type}", gpus(*cap)));
            }
        }
        let class = mgpu_protocol::qos::class_name(record.spec.qos.as_deref());
        if let Some(cap) = self.class_caps.get(class) {
            let in_class: u64 = mine
                .iter()
                .filter(|r| mgpu_protocol::qos::class_name(r.qos.as_deref()) == class)
                .map(|r| units_of(r))
                .sum();
            said.push(format!(
                "class {class} allows {} GPU(s) per user, {user}'s jobs of it hold {}",
                gpus(*cap),
                gpus(in_class)
            ));
        }
        let asks = view.map_or(record.spec.gpus, |v| v.gpus);
        if said.is_empty() {
            said.push(format!("{user}'s limits keep it waiting"));
        }
        plain(
            CauseKind::UserLimit,
            format!("{}; it asks for {asks} more", said.join("; ")),
        )
    }

    /// Jobs ahead of it whose reservations hold GPUs of nodes it could use.
    fn jobs_ahead(
        &self,
        view: &QueuedJob,
        order: &[&QueuedJob],
        nodes: &[NodeView],
    ) -> Option<Cause> {
        let ahead: BTreeMap<&JobId, usize> = order
            .iter()
            .take_while(|q| q.id != view.id)
            .enumerate()
            .map(|(n, q)| (&q.id, n))
            .collect();
        let mut holders: Vec<(usize, &JobId, Vec<String>)> = Vec::new();
        for dated in self.estimates.dated().iter().filter(|d| d.reserved) {
            let Some(&place) = ahead.get(&dated.job) else {
                continue;
            };
            let usable: Vec<String> = dated
                .gpus
                .iter()
                .filter(|(node, index)| could_use(view, nodes, node, *index))
                .map(|(node, index)| format!("{node}:{index}"))
                .collect();
            if !usable.is_empty() {
                holders.push((place, &dated.job, usable));
            }
        }
        if holders.is_empty() {
            return None;
        }
        holders.sort();
        let count = holders.len();
        let named: Vec<(JobRef, Vec<String>)> = holders
            .into_iter()
            .take(JOBS_NAMED)
            .map(|(_, id, gpus)| (self.job_ref(id), gpus))
            .collect();
        let listed: Vec<String> = named
            .iter()
            .map(|(j, gpus)| {
                let priority = j.effective_priority.unwrap_or_default();
                format!(
                    "{} ({}, priority {priority}) on {}",
                    j.id.short(),
                    j.user,
                    gpus.join(" ")
                )
            })
            .collect();
        Some(Cause {
            kind: CauseKind::JobsAhead,
            text: format!(
                "{count} job(s) ahead hold reservations on GPUs it could use: {}{}",
                listed.join(", "),
                if count > JOBS_NAMED { ", …" } else { "" }
            ),
            jobs: named.into_iter().map(|(j, _)| j).collect(),
        })
    }

    /// When the GPUs it counts on free up, and which jobs' time limits say so.
    fn expected_start(&self, view: &QueuedJob, now: Timestamp) -> Cause {
        let Some(start) = self.estimates.of(&view.id) else {
            return plain(
                CauseKind::ExpectedStart,
                "no expected start: the last pass did not date it (it sits past the jobs the \
                 scheduler dates, or no node it may use is up)"
                    .to_owned(),
            );
        };
        let gpus = self.estimates.gpus_of(&view.id);
        let on_its_gpus =
            |node: &str, index: u32| gpus.iter().any(|(n, i)| n == node && *i == index);
        let holding: Vec<&RunningJob> = self
            .views
            .running()
            .filter(|r| {
                r.placement
                    .ranks()
                    .any(|(_, node, shares)| shares.iter().any(|s| on_its_gpus(node, s.index)))
            })
            .collect();
        // Jobs the plan serves before it on the same GPUs (the reservations, then the jobs
        // dated before it): it comes after them.
        let before: Vec<&crate::core::StartEstimate> = self
            .estimates
            .dated()
            .iter()
            .take_while(|d| d.job != view.id)
            .filter(|d| d.gpus.iter().any(|(n, i)| on_its_gpus(n, *i)))
            .collect();
        let mut jobs: Vec<JobRef> = holding.iter().map(|r| self.job_ref(&r.id)).collect();
        jobs.extend(before.iter().map(|d| self.job_ref(&d.job)));
        let mut named: Vec<String> = holding
            .iter()
            .map(|r| match r.expected_end {
                Some(end) => format!(
                    "{} ({}) runs there until its time limit, {}",
                    r.id.short(),
                    r.owner,
                    in_time(now, end)
                ),
                None => format!(
                    "{} ({}) runs there with no time limit",
                    r.id.short(),
                    r.owner
                ),
            })
            .collect();
        named.extend(before.iter().map(|d| {
            let user = self.jobs.get(&d.job).map_or("", |r| r.user.as_str());
            match (d.at, d.until) {
                (Some(at), Some(until)) => format!(
                    "then {} ({user}), before it there, starting {} for up to {}",
                    d.job.short(),
                    in_time(now, at),
                    format_duration((until - at).to_std().unwrap_or_default())
                ),
                _ => format!("{} ({user}) goes there before it", d.job.short()),
            }
        }));
        let on: Vec<String> = gpus.iter().map(|(n, i)| format!("{n}:{i}")).collect();
        let when = match start.at {
            Some(at) if at <= now => "now: its GPUs are free".to_owned(),
            Some(at) => in_time(now, at),
            None => "at an unknown time: a job on its GPUs has no time limit".to_owned(),
        };
        let why = match named.is_empty() {
            true => String::new(),
            false => format!(": {}", named.join("; ")),
        };
        Cause {
            kind: CauseKind::ExpectedStart,
            text: format!("expected to start {when} on {}{why}", on.join(" ")),
            jobs,
        }
    }

    /// Its place in line and what its effective priority is made of.
    fn place_in_line(
        &self,
        record: &JobRecord,
        view: &QueuedJob,
        order: &[&QueuedJob],
        now: Timestamp,
    ) -> Cause {
        let position = order.iter().position(|q| q.id == view.id).unwrap_or(0) + 1;
        let base = i64::from(base_priority(&record.spec, &self.policy));
        let waited = (now - view.queued_at).to_std().unwrap_or_default();
        let half_life = self.policy.half_life_secs;
        let usage = self.usage.gpu_hours(&record.user, now, half_life);
        let share = (self.policy.fairshare_weight * usage).round() as i64;
        let age = view.effective_priority - base * PRIORITY_SCALE + share;
        plain(
            CauseKind::FairShare,
            format!(
                "position {position} of {} in line, effective priority {}: {} for its \
                 priority {base}, +{age} for {} waited, −{share} for {}'s {usage:.2} GPU-hours \
                 of recent use",
                order.len(),
                view.effective_priority,
                base * PRIORITY_SCALE,
                format_duration(std::time::Duration::from_secs(waited.as_secs())),
                record.user,
            ),
        )
    }

    /// Another job as `mgpu queue` shows it.
    fn job_ref(&self, id: &JobId) -> JobRef {
        let record = self.jobs.get(id);
        let effective_priority = self
            .views
            .queued()
            .find(|q| &q.id == id)
            .map(|q| q.effective_priority);
        JobRef {
            id: id.clone(),
            user: record.map_or_else(String::new, |r| r.user.clone()),
            state: record
                .map_or("ended (in history)", |r| r.state.name())
                .to_owned(),
            effective_priority,
        }
    }
}

/// Waiting for GPUs to free up (as opposed to a hold, a dependency, a limit…).
fn wants_gpus(reason: WaitReason) -> bool {
    matches!(
        reason,
        WaitReason::Resources
            | WaitReason::Priority
            | WaitReason::GpusBusy
            | WaitReason::GpusPaused
            | WaitReason::PreferredType
            | WaitReason::Submitted
            | WaitReason::Reserved
    )
}

fn plain(kind: CauseKind, text: String) -> Cause {
    Cause {
        kind,
        text,
        jobs: Vec::new(),
    }
}

/// A job that does not wait: where it runs, or how it ended.
fn not_waiting(record: &JobRecord) -> Cause {
    let text = match &record.state {
        JobState::Running(run) => {
            let nodes: Vec<&str> = run.placement.ranks().map(|(_, node, _)| node).collect();
            format!("it does not wait: it runs on {}", nodes.join(", "))
        }
        state => format!("it does not wait: it {}", state.name()),
    };
    plain(CauseKind::NotWaiting, text)
}

/// The GPU units a running job holds.
fn units_of(job: &RunningJob) -> u64 {
    job.placement
        .ranks()
        .flat_map(|(_, _, shares)| shares)
        .map(|s| u64::from(s.amount.units()))
        .sum()
}

/// Units as GPUs (`2`, `0.5`).
fn gpus(units: u64) -> GpuAmount {
    GpuAmount::from_units(u32::try_from(units).unwrap_or(u32::MAX))
}

/// `in 35m` (or `now`).
fn in_time(now: Timestamp, at: Timestamp) -> String {
    match (at - now).to_std() {
        Ok(left) if !left.is_zero() => {
            format!(
                "in {}",
                format_duration(std::time::Duration::from_secs(left.as_secs().max(1)))
            )
        }
        _ => "now".to_owned(),
    }
}

/// Whether `job` could ever use GPU `index` of `node` (its type, the node's features, the
/// job's node list and GPU pins), busy or not.
fn could_use(job: &QueuedJob, nodes: &[NodeView], node: &str, index: u32) -> bool {
    nodes.iter().any(|n| {
        n.name == node
            && job.may_use_node(node)
            && job.selects_node(&n.features)
            && job.may_use_gpu(node, index)
            && n.gpus
                .iter()
                .any(|g| g.index == index && job.takes_type(g.gpu_type.as_deref()))
    })
}

/// What is free now against what it asks for: GPUs of the types it takes on nodes it may
/// use, and the most on one node.
fn free_gpus<'a>(
    job: &QueuedJob,
    nodes: &[NodeView],
    running: impl Iterator<Item = &'a RunningJob>,
) -> Cause {
    let mut held: BTreeMap<(&str, u32), u64> = BTreeMap::new();
    for r in running {
        for (_, node, shares) in r.placement.ranks() {
            for share in shares {
                *held.entry((node, share.index)).or_default() += u64::from(share.amount.units());
            }
        }
    }
    let whole = u64::from(GpuAmount::UNITS_PER_GPU);
    let mut by_type: BTreeMap<String, u32> = BTreeMap::new();
    let mut best: Option<(u32, &str)> = None;
    for node in nodes.iter().filter(|n| n.online && !n.drained) {
        let usable = job.may_use_node(&node.name) && job.selects_node(&node.features);
        let mut here = 0;
        for gpu in node.gpus.iter().filter(|g| !g.paused) {
            let taken = held
                .get(&(node.name.as_str(), gpu.index))
                .copied()
                .unwrap_or(0);
            if taken >= whole {
                continue;
            }
            let name = gpu.gpu_type.clone().unwrap_or_else(|| "untyped".to_owned());
            *by_type.entry(name).or_default() += 1;
            if usable
                && job.takes_type(gpu.gpu_type.as_deref())
                && job.may_use_gpu(&node.name, gpu.index)
            {
                here += 1;
            }
        }
        if here > 0 && best.is_none_or(|(most, _)| here > most) {
            best = Some((here, node.name.as_str()));
        }
    }
    let free: Vec<String> = by_type.iter().map(|(t, n)| format!("{n} {t}")).collect();
    let free = match free.is_empty() {
        true => "no GPU is free on any online node".to_owned(),
        false => format!("free now: {}", free.join(", ")),
    };
    let of_type = match job.gpu_types.is_empty() {
        true => String::new(),
        false => format!(" of type {}", job.gpu_types.join(" or ")),
    };
    let wants = match job.nodes {
        0 | 1 => format!("{} GPU(s){of_type}", job.gpus),
        nodes => format!("{} GPU(s){of_type} on each of {nodes} nodes", job.gpus),
    };
    let fits = match (best, by_type.is_empty()) {
        (_, true) => String::new(),
        (Some((most, node)), false) => {
            format!("; the most it could take on one node now is {most} ({node})")
        }
        (None, false) => "; none of them is of a type it takes on a node it may use".to_owned(),
    };
    plain(
        CauseKind::NoFreeGpus,
        format!("it asks for {wants}; {free}{fits}"),
    )
}
