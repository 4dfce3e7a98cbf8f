//! The invariants that are about a moment, checked at that moment rather than after the step
//! (by then a job may have ended, a cap changed, a GPU been resumed):
//! - each job start as its record is stored: a multi-node job placed whole, on distinct nodes,
//!   with its GPUs on every rank; no GPU given beyond its units or memory; none paused before
//!   the start was decided; its owner within the `max_gpus_running` in force when it started;
//!   its array within its `%N`;
//! - each assignment sent: one per launched rank of the stored placement, none for others;
//! - each process an agent starts: no other attempt of its job still alive anywhere, and a
//!   `--no-requeue` job never started as a second attempt;
//! - each record stored and process started: an ending is final ([`super::finality`]).
//!
//! What "before the decision" means: the simulator carries a machine's commands out in
//! rounds (`World::carry_out`); what a round stored was decided by the machine before the
//! round began, so a pause stored in an earlier round was known to it.

use std::collections::{BTreeMap, BTreeSet};

use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState};
use mgpu_protocol::node::NodeAdmin;
use mgpu_protocol::principals::{Registry, Role};
use mgpu_protocol::report::Exit;

use super::finality::Finality;
use crate::limits::Limits;
use crate::machine::jobs::Tracked;

/// What the checker remembers between moments, and what it found broken.
#[derive(Default)]
pub struct Ledger {
    /// Invariants broken, in the order found.
    pub broken: Vec<String>,
    /// The round of commands being carried out.
    round: u64,
    /// Paused GPUs, with the round their pause was stored in.
    paused: BTreeMap<(String, u32), u64>,
    /// Each capped user's `max_gpus_running` (GPU units) in the machine's hands.
    caps: BTreeMap<String, u64>,
    /// And per GPU type, and per class (for each user's jobs of it).
    type_caps: BTreeMap<String, BTreeMap<String, u64>>,
    class_caps: BTreeMap<String, u64>,
    /// Attempts agents ever started, by job.
    ran: BTreeMap<JobId, BTreeSet<u32>>,
    /// Endings and cancels stored.
    finality: Finality,
    /// Kills sent: job, attempt, node.
    kills_sent: BTreeSet<(JobId, u32, String)>,
    /// Jobs started, multi-node ones among them, and array tasks.
    pub starts: u64,
    pub gang_starts: u64,
    pub array_starts: u64,
    /// Attempts stopped for a job of a class that may preempt.
    pub preempted: BTreeSet<(JobId, u32)>,
    /// Waits recorded for a preferred GPU type expected soon.
    pub preferred_type_waits: u64,
    /// Idle warnings and reclaims notified.
    pub idle_warnings: u64,
    pub idle_reclaims: u64,
    /// Notices about reservations (at risk with a down node, released unused).
    pub reservation_notices: u64,
    /// What each submitter was told (`verdict_checks.rs`): None, queued; else why refused.
    pub verdicts: BTreeMap<JobId, Option<String>>,
    /// Expected starts stored (`plan_checks.rs`), and the jobs they dated.
    pub plans: u64,
    pub dated: u64,
    /// Bookings and cancels done and refused (`bookings.rs`), and the attempts whose start
    /// was checked against the windows.
    pub bookings: u64,
    pub bookings_refused: u64,
    /// Jobs started in a reservation.
    pub member_starts: u64,
    pub window_checked: std::collections::HashSet<(JobId, u32)>,
    /// Time slices' yields checked (`slice_checks.rs`), and starts checked against
    /// priorities (`priority_checks.rs`).
    pub slices: super::slice_checks::SliceYields,
    pub priorities: super::priority_checks::Suspects,
}

impl Ledger {
    /// A new round of commands begins.
    pub fn next_round(&mut self) {
        self.round += 1;
    }

    /// The machine was handed these limits and principals (loaded, or read again).
    pub fn in_force(&mut self, limits: &Limits, registry: &Registry) {
        let users = registry
            .principals
            .iter()
            .filter(|p| matches!(p.role, Role::User | Role::Admin))
            .map(|p| (p.name.as_str(), p.group.as_deref()));
        let users: Vec<(&str, Option<&str>)> = users.collect();
        self.caps = limits.running_caps(users.clone()).into_iter().collect();
        self.type_caps = limits.running_type_caps(users).into_iter().collect();
        self.class_caps = limits.class_running_caps().into_iter().collect();
    }

    /// The cap of `user` in force, in GPU units; on GPUs of `gpu_type`.
    pub fn cap(&self, user: &str) -> Option<u64> {
        self.caps.get(user).copied()
    }

    pub fn type_cap(&self, user: &str, gpu_type: &str) -> Option<u64> {
        self.type_caps.get(user)?.get(gpu_type).copied()
    }

    /// A node's administration was stored: its GPUs paused from this round on.
    pub fn admin_stored(&mut self, node: &str, admin: &NodeAdmin) {
        let round = self.round;
        self.paused
            .retain(|(n, gpu), _| n != node || admin.paused_gpus.contains_key(gpu));
        for gpu in admin.paused_gpus.keys() {
            self.paused.entry((node.to_owned(), *gpu)).or_insert(round);
        }
    }

    /// A record was stored at `now` over one of attempt `before`: an ending stays final.
    pub fn settled(&mut self, before: Option<u32>, record: &JobRecord, now: u64) {
        if let Some(broken) = self.finality.stored(before, record, now) {
            self.broken.push(broken);
        }
    }

    /// A cancel of `job` by its owner or an admin was acknowledged while attempt `running`
    /// ran (None: none did).
    pub fn cancel_acknowledged(&mut self, job: &JobId, running: Option<u32>) {
        self.finality.cancel_acknowledged(job, running);
    }

    /// An exit report for `attempt` of `job` is in the reports stream from `at` on.
    pub fn exit_reported(&mut self, job: &JobId, attempt: u32, exit: &Exit, at: u64) {
        self.finality.exit_reported(job, attempt, exit, at);
    }

    /// A record was stored over `before` (its state and attempt); `records` is the bucket
    /// after the write. A start is checked.
    pub fn stored(
        &mut self,
        before: Option<(bool, u32)>,
        record: &JobRecord,
        records: &BTreeMap<JobId, Tracked>,
        memory_of: impl Fn(&str) -> u64,
    ) {
        let JobState::Running(run) = &record.state else {
            return;
        };
        if before == Some((true, record.attempt)) {
            return;
        }
        self.starts += 1;
        let label = format!("job {} attempt {}", record.id.short(), record.attempt);
        let placement = &run.placement;
        if let Some(broken) = gang_broken(record) {
            self.broken.push(format!("{label}: {broken}"));
        }
        if record.spec.nodes > 1 {
            self.gang_starts += 1;
        }
        for (_, node, gpus) in placement.ranks() {
            for share in gpus {
                let since = self.paused.get(&(node.to_owned(), share.index));
                if let Some(since) = since.filter(|since| **since < self.round) {
                    self.broken.push(format!(
                        "{label} started on GPU {} of {node}, paused since round {since} \
                         (now {})",
                        share.index, self.round
                    ));
                }
                let (units, mem) = gpu_load(records, node, share.index);
                if units > u64::from(GpuAmount::UNITS_PER_GPU) || mem > memory_of(node) {
                    self.broken.push(format!(
                        "{label}: GPU {} of {node} is given {units} units and {mem} MiB",
                        share.index
                    ));
                }
            }
        }
        self.check_cap(record, records, &label);
        self.check_array(record, records, &label);
    }

    fn check_cap(&mut self, record: &JobRecord, records: &BTreeMap<JobId, Tracked>, label: &str) {
        let Some(cap) = self.cap(&record.user) else {
            return;
        };
        let held: u64 = records
            .values()
            .filter(|t| t.record.user == record.user)
            .filter_map(|t| match &t.record.state {
                JobState::Running(run) => Some(placement_units(&run.placement)),
                _ => None,
            })
            .sum();
        if held > cap {
            self.broken.push(format!(
                "{label} took {} to {held} GPU units running, over the cap of {cap} in force",
                record.user
            ));
        }
    }

    /// A started job keeps its owner within their caps per GPU type; `type_of` gives a node's
    /// GPU type.
    pub fn check_type_caps<'a>(
        &mut self,
        record: &JobRecord,
        records: &BTreeMap<JobId, Tracked>,
        type_of: impl Fn(&str) -> Option<&'a str>,
    ) {
        let Some(caps) = self.type_caps.get(&record.user) else {
            return;
        };
        let mut held: BTreeMap<&str, u64> = BTreeMap::new();
        for tracked in records.values().filter(|t| t.record.user == record.user) {
            let JobState::Running(run) = &tracked.record.state else {
                continue;
            };
            for (_, node, gpus) in run.placement.ranks() {
                if let Some(gpu_type) = type_of(node) {
                    let units: u64 = gpus.iter().map(|g| u64::from(g.amount.units())).sum();
                    *held.entry(gpu_type).or_default() += units;
                }
            }
        }
        for (gpu_type, units) in held {
            if let Some(cap) = caps.get(gpu_type).filter(|cap| units > **cap) {
                self.broken.push(format!(
                    "job {} took {} to {units} units of {gpu_type} running, over the cap of {cap}",
                    record.id.short(),
                    record.user
                ));
            }
        }
    }

    /// A started job keeps its owner's jobs of its class within the class's cap.
    pub fn check_class_caps(&mut self, record: &JobRecord, records: &BTreeMap<JobId, Tracked>) {
        let class = mgpu_protocol::qos::class_name(record.spec.qos.as_deref());
        let Some(cap) = self.class_caps.get(class).copied() else {
            return;
        };
        let held: u64 = records
            .values()
            .filter(|t| t.record.user == record.user)
            .filter(|t| mgpu_protocol::qos::class_name(t.record.spec.qos.as_deref()) == class)
            .filter_map(|t| match &t.record.state {
                JobState::Running(run) => Some(
                    run.placement
                        .ranks()
                        .flat_map(|(_, _, gpus)| gpus.iter().map(|g| u64::from(g.amount.units())))
                        .sum::<u64>(),
                ),
                _ => None,
            })
            .sum();
        if held > cap {
            self.broken.push(format!(
                "job {} took {}'s {class} jobs to {held} units running, over the class's cap of {cap}",
                record.id.short(),
                record.user
            ));
        }
    }

    fn check_array(&mut self, record: &JobRecord, records: &BTreeMap<JobId, Tracked>, label: &str) {
        let Some(member) = &record.spec.array else {
            return;
        };
        self.array_starts += 1;
        let Some(most) = member.max_running else {
            return;
        };
        let running = records
            .values()
            .filter(|t| matches!(t.record.state, JobState::Running(_)))
            .filter(|t| {
                t.record
                    .spec
                    .array
                    .as_ref()
                    .is_some_and(|a| a.array_id == member.array_id)
            })
            .count();
        if running > most as usize {
            self.broken.push(format!(
                "{label}: array {} runs {running} tasks, over its %{most}",
                member.array_id.short()
            ));
        }
    }

    /// An assignment went out for these ranks (rank, node) of `record`'s attempt `attempt`.
    pub fn assigned(&mut self, record: Option<&JobRecord>, attempt: u32, ranks: &[(u32, String)]) {
        let Some(record) = record.filter(|r| r.attempt == attempt) else {
            return;
        };
        let JobState::Running(run) = &record.state else {
            return;
        };
        let want: BTreeSet<(u32, String)> = run
            .placement
            .launched_ranks()
            .into_iter()
            .map(|(rank, node)| (rank, node.to_owned()))
            .collect();
        let sent: BTreeSet<(u32, String)> = ranks.iter().cloned().collect();
        if sent != want {
            self.broken.push(format!(
                "job {} attempt {attempt}: assignments for ranks {sent:?}, its launched ranks \
                 are {want:?}",
                record.id.short()
            ));
        }
    }

    /// A kill of `attempt` of `job` was stored on `node`'s stream.
    pub fn kill_sent(&mut self, job: &JobId, attempt: u32, node: &str) {
        self.kills_sent
            .insert((job.clone(), attempt, node.to_owned()));
    }

    /// An agent on `node` started `attempt` of `job`, while `others` of its attempts are
    /// alive.
    pub fn process_started(
        &mut self,
        (job, attempt, node): (&JobId, u32, &str),
        others: &[u32],
        no_requeue: bool,
    ) {
        let kill_follows = self
            .kills_sent
            .contains(&(job.clone(), attempt, node.to_owned()));
        if let Some(broken) = self.finality.started(job, attempt, kill_follows) {
            self.broken.push(broken);
        }
        if let Some(Some(why)) = self.verdicts.get(job) {
            self.broken.push(format!(
                "job {} started although its submitter was told: {why}",
                job.short()
            ));
        }
        let ran = self.ran.entry(job.clone()).or_default();
        ran.insert(attempt);
        if !others.is_empty() {
            self.broken.push(format!(
                "job {} runs attempts {others:?} and {attempt} at once",
                job.short()
            ));
        }
        if no_requeue && ran.len() > 1 {
            self.broken.push(format!(
                "--no-requeue job {} ran attempts {ran:?}",
                job.short()
            ));
        }
    }
}

impl Ledger {
    /// Whether an agent ever started an attempt of `job`.
    pub fn ran_any(&self, job: &JobId) -> bool {
        self.ran.contains_key(job)
    }
}

/// What is wrong with a started job's gang, if anything: a multi-node job holds exactly its
/// nodes, distinct, each with the GPUs it asked for; a distributed one launches everywhere.
fn gang_broken(record: &JobRecord) -> Option<String> {
    let JobState::Running(run) = &record.state else {
        return None;
    };
    let placement = &run.placement;
    let spec = &record.spec;
    let want = spec.nodes.max(1) as usize;
    if placement.node_count() != want {
        return Some(format!(
            "placed on {} node(s), asked for {want}",
            placement.node_count()
        ));
    }
    let distinct: BTreeSet<&str> = placement.node_names().into_iter().collect();
    if distinct.len() != want {
        return Some(format!(
            "placed twice on a node: {}",
            placement.nodes_label()
        ));
    }
    if let Some((_, node, gpus)) = placement.ranks().find(|(_, _, gpus)| {
        gpus.iter()
            .map(|g| u64::from(g.amount.units()))
            .sum::<u64>()
            != u64::from(spec.gpus.units())
    }) {
        return Some(format!("half-placed: {} GPU(s) on {node}", gpus.len()));
    }
    (want > 1 && placement.distributed() != spec.distributed)
        .then(|| "launched unlike it asked (--distributed)".to_owned())
}

/// GPU units and memory the running records hold on one GPU.
fn gpu_load(records: &BTreeMap<JobId, Tracked>, node: &str, index: u32) -> (u64, u64) {
    let mut load = (0, 0);
    for tracked in records.values() {
        let JobState::Running(run) = &tracked.record.state else {
            continue;
        };
        for share in run.placement.gpus_on(node).unwrap_or_default() {
            if share.index == index {
                load.0 += u64::from(share.amount.units());
                load.1 += share.mem_mib;
            }
        }
    }
    load
}

/// GPU units a placement holds on all its nodes.
fn placement_units(placement: &mgpu_protocol::job::Placement) -> u64 {
    placement
        .ranks()
        .flat_map(|(_, _, gpus)| gpus.iter().map(|g| u64::from(g.amount.units())))
        .sum()
}

/// Whether a started job's placement breaks its selection: a GPU not of its types, GPUs of
/// two types, or a node without its constraint's features. `node` gives a node's GPU type
/// and features.
pub fn selection_broken<'a>(
    record: &JobRecord,
    node: impl Fn(&str) -> Option<(&'a str, &'a [String])>,
) -> Option<String> {
    let JobState::Running(run) = &record.state else {
        return None;
    };
    let label = format!("job {} attempt {}", record.id.short(), record.attempt);
    let constraint = record
        .spec
        .constraint
        .as_deref()
        .and_then(|text| mgpu_protocol::gpu_type::Constraint::parse(text).ok());
    let mut types_used = BTreeSet::new();
    for (_, name, gpus) in run.placement.ranks() {
        let (gpu_type, features) = node(name)?;
        if constraint.as_ref().is_some_and(|c| !c.holds_for(features)) {
            return Some(format!(
                "{label} runs on {name}, which lacks its constraint's features"
            ));
        }
        if !gpus.is_empty() {
            types_used.insert(gpu_type);
        }
    }
    let wanted = &record.spec.gpu_types;
    let foreign = types_used
        .iter()
        .find(|t| !wanted.is_empty() && !wanted.iter().any(|w| w == *t));
    match (foreign, types_used.len()) {
        (Some(t), _) => Some(format!("{label} got {t} GPUs; it takes only {wanted:?}")),
        (None, n) if n > 1 && !wanted.is_empty() => {
            Some(format!("{label} got GPUs of {n} types: {types_used:?}"))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests;
