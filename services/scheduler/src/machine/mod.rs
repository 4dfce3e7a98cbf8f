//! The scheduler as a pure state machine: every decision it makes, and no I/O.
//!
//! [`SchedulerState`] takes [`Input`]s (a request admitted or refused at the gate, an agent's
//! report, a heartbeat, a tick of the clock with the time, the result of a write it asked
//! for) and returns [`Command`]s as data (write this record expecting that revision, assign,
//! kill, publish, audit, acknowledge, move to history, store the usage book). It never reads
//! a clock (every input comes with `now`), never waits, never touches NATS. The driver
//! (`crate::driver`) carries the commands out against NATS and feeds the results back; the
//! simulator (`crate::simulation`) does the same against a simulated store, bus and agents,
//! from one seed. Both feed the same machine, so what the simulator finds is what production
//! does.
//!
//! The contract with whoever drives it: inputs are handed over one at a time, and the
//! results of the operations one input asked for ([`Input::Written`] and the like) are fed
//! back before the next input; [`SchedulerState::pass`] runs when [`SchedulerState::pass_due`]
//! says so, once everything before it is carried out.
//!
//! # Layout
//! - [`messages`]: the inputs and commands.
//! - [`jobs`]: the job table (records and their KV revisions).
//! - [`transitions`]: a job's lifecycle input applied: the record written, then its effects.
//! - [`announce`]: events, audit records, refusals and log lines, as commands.
//! - [`assignment`]: what an assignment and a kill say (time limit, Unix account, input keys,
//!   output subject, ranks).
//! - [`requests`]: submissions, cancels, holds and node administration.
//! - [`staging`]: new jobs kept unwritten until the pass decided for them.
//! - [`reservations`]: bookings and cancels, the windows a pass minds, their upkeep.
//! - [`liveness`]: heartbeats, lost nodes and jobs, fencing of stale attempts, repair.
//! - [`pass`]: a scheduling pass and its decisions.
//! - [`pending`]: the operations asked for, and what follows each once answered.
//! - [`retention`]: finished jobs moved to history.

pub mod announce;
pub mod assignment;
pub mod estimates;
#[cfg(test)]
mod exit_tests;
pub mod idle;
pub mod jobs;
pub mod liveness;
pub mod messages;
pub mod pass;
pub mod pending;
pub mod requests;
pub mod reservations;
#[cfg(test)]
mod reservations_tests;
pub mod retention;
#[cfg(test)]
mod retention_tests;
pub mod staging;
#[cfg(test)]
mod tests;
pub mod transitions;
pub mod why;
#[cfg(test)]
mod why_tests;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobSpec, JobState};
use mgpu_protocol::principals::{Principal, Registry, Role};
use mgpu_protocol::priority::{Policy, UsageBook};
use mgpu_protocol::report::AgentReport;

use crate::limits::Limits;
use crate::liveness_memory::LivenessMemory;
use crate::metrics::{Gauges, UserJobs};
use crate::nodes::NodeTable;
use crate::queue_view::QueueViews;

use jobs::{JobTable, Tracked};
pub use messages::{Command, Input, Loaded, OpId};
use pending::Pending;

/// The least time between two writes of the usage book. Every pass that saw a job end wrote
/// it, a round trip inside the pass; in a burst of short jobs that is most passes. A scheduler
/// killed between two writes loses at most this much of its users' accounted GPU time (a
/// stopped one stores it before it exits).
const SAVE_USAGE_EVERY: chrono::TimeDelta = chrono::TimeDelta::seconds(1);

/// The scheduler's whole state, and every decision it makes.
pub struct SchedulerState {
    pub(crate) jobs: JobTable,
    pub(crate) nodes: NodeTable,
    pub(crate) policy: Policy,
    usage: UsageBook,
    /// The usage book changed since it was last stored, and when that was.
    usage_dirty: bool,
    usage_saved_at: Option<Timestamp>,
    principals: Registry,
    limits: Limits,
    /// Each capped user's most GPUs running at once, from `limits` and users' groups.
    gpu_caps: Arc<HashMap<String, u64>>,
    /// Each capped user's caps per GPU type, from `limits` and users' groups.
    gpu_type_caps: Arc<crate::core::TypeCaps>,
    /// Each class's cap on one user's running jobs of it, from `limits`.
    class_caps: Arc<HashMap<String, u64>>,
    views: QueueViews,
    watch: LivenessMemory,
    /// The monotonic reading of the latest tick (when kills were sent is measured on it).
    monotonic: Duration,
    /// When the next time slice of a running job ends (the driver wakes the machine then).
    next_slice_end: Option<Timestamp>,
    /// When finished jobs are next looked at for history (monotonic), and those on their way.
    next_sweep: Duration,
    archiving: HashSet<JobId>,
    /// Exit reports whose record could not be stored (the store failed): JetStream delivers
    /// each again after the acknowledgement wait, and until then a job they ended must not be
    /// requeued as lost with its node ([`liveness`]'s `lose_job` applies the exit instead).
    unsettled_exits: HashMap<JobId, AgentReport>,
    /// Operations asked for and not answered yet.
    pending: HashMap<OpId, Pending>,
    next_op: OpId,
    /// What the input being handled asks for so far.
    out: Vec<Command>,
    /// Something changed that a pass should see.
    pass_due: bool,
    /// Decisions of the last pass whose records were stored.
    pass_changes: usize,
    /// Decisions of the last pass not applied yet, and the time they were made at.
    decisions_left: std::collections::VecDeque<(JobId, crate::lifecycle::Input, pending::Origin)>,
    decided_at: Timestamp,
    /// When the last pass expects waiting jobs to start.
    pub(crate) estimates: estimates::Estimates,
    /// Reservations and their windows.
    pub(crate) bookings: reservations::Bookings,
    /// New jobs waiting for the pass before their record's first write.
    pub(crate) staged: staging::Staged,
}

impl SchedulerState {
    /// The machine over what was read from the store.
    pub fn new(loaded: Loaded) -> Self {
        let Loaded {
            records,
            heartbeats,
            admin,
            reservations,
            usage,
            principals,
            limits,
            policy,
            now,
        } = loaded;
        let mut out = Vec::new();
        // The stream keeps whatever was published: a stored heartbeat is checked like a live
        // one (an absurd one would otherwise sit in the table until the node beats again).
        let heartbeats = heartbeats
            .into_iter()
            .filter(|beat| match beat.validate(now) {
                Ok(()) => true,
                Err(invalid) => {
                    let why = format!("ignoring a stored heartbeat: {invalid}");
                    out.push(Command::node_log(messages::LogLevel::Warn, &beat.node, why));
                    false
                }
            })
            .collect();
        let mut nodes = NodeTable::new(heartbeats, admin, policy.missed_heartbeats);
        nodes.require_gpu_isolation = policy.require_gpu_isolation;
        // A node already silent when this scheduler starts is found offline only after the
        // allowance below; what waits on its assignment subject meanwhile (an assignment of a
        // job since ended, whose purge the scheduler before this one did not live to make)
        // must not reach its agent should it come back first. Unconfirmed assignments of
        // jobs still running go out again on `Resumed`.
        for node in nodes.silent_at(now) {
            out.push(Command::PurgeAssignments { node });
        }
        // Heartbeats stored while no scheduler was active (or this one was still loading)
        // were not seen: every node gets a full allowance from now before it counts as silent.
        nodes.blind_until(now);
        let gpu_caps = Arc::new(limits.running_caps(users_with_groups(&principals)));
        let gpu_type_caps = Arc::new(limits.running_type_caps(users_with_groups(&principals)));
        let class_caps = Arc::new(limits.class_running_caps());
        SchedulerState {
            jobs: JobTable::new(records),
            nodes,
            policy,
            usage,
            usage_dirty: false,
            usage_saved_at: None,
            principals,
            limits,
            gpu_caps,
            gpu_type_caps,
            class_caps,
            views: QueueViews::default(),
            watch: LivenessMemory::default(),
            monotonic: Duration::ZERO,
            next_slice_end: None,
            next_sweep: Duration::ZERO,
            archiving: HashSet::new(),
            unsettled_exits: HashMap::new(),
            pending: HashMap::new(),
            next_op: 1,
            out,
            pass_due: true,
            pass_changes: 0,
            decisions_left: std::collections::VecDeque::new(),
            decided_at: now,
            estimates: estimates::Estimates::default(),
            bookings: reservations::Bookings::new(reservations),
            staged: staging::Staged::default(),
        }
    }

    /// Handles one input at `now`; the commands to carry out, in order.
    pub fn handle(&mut self, now: Timestamp, input: Input) -> Vec<Command> {
        match input {
            Input::Submissions(batch) => self.on_submissions(now, batch),
            Input::Request(admitted) => self.on_request(now, *admitted),
            Input::Refused(refused) => self.on_refused(now, refused),
            Input::Report { token, report } => self.on_report(now, token, report),
            Input::ReportRefused {
                token,
                job,
                key,
                why,
            } => self.on_report_refused(now, token, job, key, why),
            Input::Heartbeat(beat) => self.on_heartbeat(now, *beat),
            Input::IncompatibleHeartbeat { node, protocol } => {
                self.on_incompatible_heartbeat(now, &node, protocol);
            }
            Input::Tick(tick) => self.on_tick(now, tick),
            Input::Written { op, outcome } => self.on_written(op, outcome),
            Input::Archived { id, moved } => self.on_archived(&id, moved),
            Input::AdminStored { op, stored } => self.on_admin_stored(now, op, stored),
            Input::ReservationStored { op, stored } => {
                self.on_reservation_stored(now, op, stored);
            }
            Input::AssignmentsPurged { node, purged } => self.on_assignments_purged(&node, purged),
            Input::ReportsCaughtUp { op, caught_up } => {
                self.on_reports_caught_up(now, op, caught_up);
            }
            Input::HistoryStates(states) => {
                for (id, state) in states {
                    self.jobs.remember_archived(id, state);
                }
            }
            Input::UsageNotSaved => self.usage_dirty = true,
            Input::PlanNotSaved => self.estimates.not_saved(),
            Input::Limits(limits) => {
                self.limits = limits;
                self.derive_caps();
            }
            Input::Principals(registry) => {
                self.principals = registry;
                self.derive_caps();
            }
            Input::Resumed => self.resend_assignments_older_than(now, chrono::Duration::zero()),
            Input::ReportsUnacknowledged => self.await_redelivered_reports(now),
            Input::Stop => self.save_usage(now, true),
        }
        // A pass's decisions go out a chunk at a time, each once the one before is stored.
        self.apply_more_decisions();
        std::mem::take(&mut self.out)
    }

    /// Whether something changed that a pass should see (and the last pass's decisions are
    /// all applied).
    pub fn pass_due(&self) -> bool {
        self.pass_due && self.decisions_left.is_empty()
    }

    /// Whether a new job will acknowledge `token` once its record is stored: the driver
    /// keeps that message until then.
    pub fn keeps_token(&self, token: messages::Token) -> bool {
        self.staged.holds(token)
    }

    /// Whether operations asked for are still unanswered.
    pub fn waiting_for_results(&self) -> bool {
        !self.pending.is_empty()
    }

    /// When the machine wants to be woken for a time slice's end, if it does.
    pub fn next_slice_end(&self) -> Option<Timestamp> {
        self.next_slice_end
    }

    /// The driver's clock reached a slice's end: a pass is due.
    pub fn slice_over(&mut self) {
        self.pass_due = true;
    }

    /// The record of job `id`.
    pub fn job(&self, id: &JobId) -> Option<&JobRecord> {
        self.jobs.get(id)
    }

    /// Every live record, in no particular order.
    pub fn records(&self) -> impl Iterator<Item = &JobRecord> {
        self.jobs.all()
    }

    /// How many jobs are queued and running, and how many records the table holds: stored
    /// ones only (a new job waiting for its first write is not recorded yet).
    pub fn counts(&self) -> (usize, usize, usize) {
        let (queued, running) = self.jobs.counts();
        let (staged, staged_queued) = self.staged.count(&self.jobs);
        let total = self.jobs.total();
        (
            queued.saturating_sub(staged_queued),
            running,
            total.saturating_sub(staged),
        )
    }

    /// How many nodes are known, and online at `now`.
    pub fn node_counts(&self, now: Timestamp) -> (usize, usize) {
        (self.nodes.len(), self.nodes.online(now))
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The jobs `specs` depend on that the table does not know: the driver looks them up in
    /// history and hands what it finds back ([`Input::HistoryStates`]).
    pub fn unknown_dependencies<'a>(
        &self,
        specs: impl IntoIterator<Item = &'a JobSpec>,
    ) -> Vec<JobId> {
        let mut unknown: Vec<JobId> = specs
            .into_iter()
            .flat_map(|spec| spec.after.iter().chain(&spec.after_any))
            .filter(|id| !self.jobs.knows(id))
            .cloned()
            .collect();
        unknown.sort_unstable();
        unknown.dedup();
        unknown
    }

    /// The queued jobs' specs.
    pub fn queued_specs(&self) -> Vec<&JobSpec> {
        self.jobs.queued().map(|r| &r.spec).collect()
    }

    /// Counts what the job and node tables hold, for the metrics: the queued and running jobs
    /// only (finished ones pile up by the hundred thousand until they move to history).
    pub fn gauges(&self, now: Timestamp) -> Gauges {
        // Keyed by the records' own names: no allocation per job, only per user at the end.
        let mut jobs: HashMap<&str, UserJobs> = HashMap::new();
        // A new job staged until the next pass is not stored yet: not counted, as the
        // status does not count it.
        let stored = |record: &&JobRecord| !self.staged.contains(&record.id);
        for record in self.jobs.queued().filter(stored) {
            let counts = jobs.entry(record.user.as_str()).or_default();
            match &record.state {
                JobState::Queued(waiting) if waiting.held_by.is_some() => counts.held += 1,
                _ => counts.queued += 1,
            }
        }
        for record in self.jobs.running().filter(stored) {
            let counts = jobs.entry(record.user.as_str()).or_default();
            counts.running += 1;
            if let JobState::Running(run) = &record.state {
                counts.gpus += run.placement.total_gpus();
            }
        }
        Gauges {
            jobs: jobs
                .into_iter()
                .map(|(user, counts)| (user.to_owned(), counts))
                .collect(),
            nodes: self.nodes.state_counts(now),
        }
    }

    /// A fresh operation id.
    fn op(&mut self) -> OpId {
        let op = self.next_op;
        self.next_op += 1;
        op
    }

    /// Derives the caps on running GPUs again (limits or users' groups changed); a pass
    /// then starts what a raised cap lets start.
    fn derive_caps(&mut self) {
        let caps = self
            .limits
            .running_caps(users_with_groups(&self.principals));
        if caps != *self.gpu_caps {
            self.gpu_caps = Arc::new(caps);
            self.pass_due = true;
        }
        let type_caps = self
            .limits
            .running_type_caps(users_with_groups(&self.principals));
        let class_caps = self.limits.class_running_caps();
        if class_caps != *self.class_caps {
            self.class_caps = Arc::new(class_caps);
            self.pass_due = true;
        }
        if type_caps != *self.gpu_type_caps {
            self.gpu_type_caps = Arc::new(type_caps);
            self.pass_due = true;
        }
    }

    /// Adds a finished run's GPU time to its user's usage.
    fn add_usage(&mut self, user: &str, gpu_seconds: f64, at: Timestamp) {
        let half_life = self.policy.half_life_secs;
        self.usage.add(user, gpu_seconds, at, half_life);
        self.usage_dirty = true;
    }

    /// Asks for the usage book to be stored if it changed: at once when `now_anyway`
    /// (stopping) or when the last write is [`SAVE_USAGE_EVERY`] old.
    fn save_usage(&mut self, now: Timestamp, now_anyway: bool) {
        let recent = self
            .usage_saved_at
            .is_some_and(|at| now - at < SAVE_USAGE_EVERY && now >= at);
        if !self.usage_dirty || (!now_anyway && recent) {
            return;
        }
        self.usage_dirty = false;
        self.usage_saved_at = Some(now);
        self.out.push(Command::SaveUsage(self.usage.clone()));
    }

    /// Asks for the expected starts to be stored if they changed (see [`estimates`]).
    fn save_plan(&mut self, now: Timestamp) {
        if let Some(plan) = self.estimates.to_save(now, false) {
            self.out.push(Command::SavePlan(plan));
        }
    }

    /// The user or admin named `name`.
    fn user_by_name(&self, name: &str) -> Option<&Principal> {
        self.principals
            .principals
            .iter()
            .find(|p| p.name == name && matches!(p.role, Role::User | Role::Admin))
    }

    /// The group of the user or admin named `name`.
    fn group_of(&self, name: &str) -> Option<&str> {
        self.user_by_name(name).and_then(|p| p.group.as_deref())
    }

    /// The admins' public keys.
    fn admin_keys(&self) -> impl Iterator<Item = &String> {
        self.principals
            .principals
            .iter()
            .filter(|p| p.is_admin())
            .map(|p| &p.public_key)
    }

    /// Puts a record read back from the store in the table (or drops it: gone there).
    fn take_stored(&mut self, id: &JobId, stored: Option<Box<Tracked>>) {
        match stored {
            Some(tracked) => self.jobs.put(*tracked),
            None => self.jobs.forget(id),
        }
    }
}

/// Every user and admin of `registry`, with the group whose limits apply to them.
fn users_with_groups(registry: &Registry) -> impl Iterator<Item = (&str, Option<&str>)> {
    registry
        .principals
        .iter()
        .filter(|p| matches!(p.role, Role::User | Role::Admin))
        .map(|p| (p.name.as_str(), p.group.as_deref()))
}
