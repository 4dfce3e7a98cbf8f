//! The simulated cluster: one scheduler machine (or none, while a standby takes over), the
//! store, the streams between them (requests and agents' reports, each message held until
//! acknowledged and delivered again after the acknowledgement wait; assignments and control
//! messages per node), the agents, the users, the clock, and the faults, all drawn from one
//! [`Rng`]. Here: the world's state, its clock and its queue of events. The simulator's part
//! of the driver is in `driving.rs`, the nodes' side (heartbeats, agents, partitions) in
//! `nodes.rs`.

use super::gate::{SimGate, StoredRequest};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::node::NodeHeartbeat;
use mgpu_protocol::principals::{Principal, Registry, Role};
use mgpu_protocol::priority::Policy;
use mgpu_protocol::report::AgentReport;

use super::Options;
use super::agents::{Attempt, NodeMessage, SimAgent};
use super::ledger::Ledger;
use super::priority_checks::Context;
use super::rng::Rng;
use super::store::SimStore;
use super::streams::Stream;
use crate::limits::Limits;
use crate::machine::SchedulerState;
use crate::machine::messages::{Identity, Token};

/// How long JetStream waits for an acknowledgement before it delivers a message again.
pub const ACK_WAIT_MS: u64 = crate::machine::messages::ACK_WAIT.as_millis() as u64;
/// The GPU types of the simulated nodes, node by node in turn.
pub const GPU_TYPES: [&str; 2] = ["h100", "a100"];

/// Something that happens at a simulated time.
#[derive(Clone, Debug)]
pub enum Event {
    Tick,
    Heartbeat(usize),
    AgentStep(usize),
    FenceCheck(usize),
    Pump,
    User,
    Fault,
    NodeRestart(usize, Vec<Attempt>),
    PartitionHeal(usize),
    SchedulerStart,
    ToNode(usize, NodeMessage),
    HeartbeatArrives(Box<NodeHeartbeat>),
    /// A restarted agent (of that boot) has its lost attempts reported.
    Reconciled(usize, u32),
    /// An agent (of that boot) tries again to store a report.
    ReportRetry(usize, u32, Box<AgentReport>),
    /// The driver's slice timer: a running job's time slice ends.
    SliceEnd,
    /// A standby tries to take the lease of the scheduler stalled in that stall.
    StandbyTakesOver(u64),
    /// The scheduler stalled in that stall wakes.
    SchedulerWakes(u64),
}

/// Which stream a held message came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    Request,
    Report,
}

/// The scheduler and the messages it holds.
pub struct SimScheduler {
    pub machine: SchedulerState,
    pub held: BTreeMap<Token, (Source, usize)>,
    pub next_token: Token,
    /// Requests (by stream index) carrying several tasks, one of which the machine let go
    /// unacknowledged: the message is delivered again once its last task is settled.
    pub released_batches: BTreeSet<usize>,
}

/// A scheduler stopped in its tracks (`stall.rs`).
pub struct Stalled {
    pub scheduler: SimScheduler,
    /// Which stall this is: the events scheduled for an earlier one find another here.
    pub generation: u64,
    /// Until when its last renewal let it act (simulated monotonic milliseconds).
    pub acts_until: std::time::Duration,
    /// Whether a standby took the lease while it was stalled.
    pub superseded: bool,
}

pub struct World {
    pub rng: Rng,
    pub options: Options,
    /// Simulated milliseconds since the run began (the monotonic clock).
    pub now: u64,
    /// What the wall clock is off by (clock steps).
    pub clock_offset_ms: i64,
    seq: u64,
    pub events: BTreeMap<(u64, u64), Event>,
    pub store: SimStore,
    pub scheduler: Option<SimScheduler>,
    /// A scheduler stopped in its tracks (a standby may have taken over meanwhile).
    pub stalled: Option<Stalled>,
    /// How many stalls there were: the events of each name theirs.
    pub stall_generation: u64,
    pub agents: Vec<SimAgent>,
    pub requests: Stream<StoredRequest>,
    /// The active scheduler's gate (its nonces), and the next nonce a client signs with.
    pub gate: SimGate,
    pub next_nonce: u64,
    pub reports: Stream<AgentReport>,
    /// Assignment message ids the node streams saw, and when (JetStream's duplicate window).
    pub msg_ids: BTreeMap<String, u64>,
    pub users: Vec<Identity>,
    /// The principals file and the limits file as they are now; a tick hands a change over.
    pub registry: Registry,
    pub limits: Limits,
    pub principals_changed: bool,
    pub limits_changed: bool,
    pub policy: Policy,
    /// Every job submitted, and whether it asked `--no-requeue`.
    pub submitted: BTreeMap<JobId, bool>,
    /// Jobs not yet seen in a final state (the liveness check prunes it).
    pub open: BTreeSet<JobId>,
    pub drained: BTreeSet<String>,
    pub paused: BTreeSet<(String, u32)>,
    pub held_jobs: BTreeSet<JobId>,
    pub ledger: Ledger,
    /// Faults that took effect (a failed purge of a node's assignments is not counted).
    pub faults: u64,
    /// `faults` when the commands of the moment began to be carried out: a start is judged
    /// against priorities only where none happened during the moment.
    pub faults_at_moment: u64,
    /// The ordinal the latest fault got, suppressed or not (decided in faults.rs).
    pub fault_ordinal: u64,
    /// Every fault that took effect: its ordinal and what it was.
    pub fault_log: Vec<(u64, String)>,
    pub partitions: u64,
    pub steps: u64,
    /// When the slice timer is set for, if it is.
    pub slice_timer: Option<u64>,
    /// The latest lines of what happened, for a failing seed's report.
    pub trace: VecDeque<String>,
    /// Faults and new work stop from here on (the quiet period).
    pub quiet: bool,
    /// User actions and faults due now, for the run loop to draw.
    pub due: Vec<Event>,
}

impl World {
    /// A cluster of 2 to 5 nodes drawn from `seed`.
    pub fn new(seed: u64, options: Options, limits: Limits) -> Self {
        let mut rng = Rng::new(seed);
        let nodes = rng.between(2, 5) as usize;
        let agents = (0..nodes)
            .map(|i| {
                let gpus = rng.between(1, 4) as u32;
                // `--fence-after` from 3 s (three intervals) to the 10 s default, and a kill
                // grace from none to the 10 s default.
                let fence = rng.between(3_000, 10_000);
                let grace = rng.between(0, 10_000);
                let mut agent = SimAgent::new(format!("node{i}"), gpus, fence, grace);
                // Mixed GPU types, and a fast network on some nodes: jobs select by them.
                agent.gpu_type = GPU_TYPES[i % GPU_TYPES.len()].into();
                if i % 3 == 0 {
                    agent.features = vec!["ib".into()];
                }
                agent
            })
            .collect();
        Self::with_agents(rng, options, limits, agents)
    }

    /// A cluster of these agents.
    pub fn with_agents(
        mut rng: Rng,
        options: Options,
        limits: Limits,
        agents: Vec<SimAgent>,
    ) -> Self {
        let users: Vec<Identity> = ["alice", "bob", "root"]
            .iter()
            .map(|name| Identity {
                name: (*name).to_owned(),
                key: format!("U{}", name.to_uppercase()),
                admin: *name == "root",
            })
            .collect();
        let registry = registry_of(&users, &BTreeMap::new());
        let action = match rng.below(3) {
            0 => mgpu_protocol::idle::IdleAction::Requeue,
            1 => mgpu_protocol::idle::IdleAction::Cancel,
            _ => mgpu_protocol::idle::IdleAction::Warn,
        };
        let policy = Policy {
            max_job_time_secs: Some(3_600),
            // Finished jobs move to history within a run (the default keeps them a day).
            keep_finished_secs: SIM_KEEP_FINISHED_SECS,
            qos: sim_classes(),
            idle: Some(sim_idle_policy(action)),
            reservations: mgpu_protocol::reservation::ReservationPolicy {
                horizon_secs: 30,
                release_unused_after_secs: 20,
                ..Default::default()
            },
            ..Policy::default()
        };
        let mut ledger = Ledger::default();
        ledger.in_force(&limits, &registry);
        let mut world = World {
            rng,
            options,
            now: 0,
            clock_offset_ms: 0,
            seq: 0,
            events: BTreeMap::new(),
            store: SimStore::default(),
            scheduler: None,
            stalled: None,
            stall_generation: 0,
            agents,
            requests: Stream::default(),
            gate: SimGate::default(),
            next_nonce: 0,
            reports: Stream::default(),
            msg_ids: BTreeMap::new(),
            users,
            registry,
            limits,
            principals_changed: false,
            limits_changed: false,
            policy,
            submitted: BTreeMap::new(),
            open: BTreeSet::new(),
            drained: BTreeSet::new(),
            paused: BTreeSet::new(),
            held_jobs: BTreeSet::new(),
            ledger,
            faults: 0,
            faults_at_moment: 0,
            fault_ordinal: 0,
            fault_log: Vec::new(),
            partitions: 0,
            steps: 0,
            slice_timer: None,
            trace: VecDeque::new(),
            quiet: false,
            due: Vec::new(),
        };
        for node in 0..world.agents.len() {
            let offset = world.rng.below(1000);
            world.at(offset, Event::Heartbeat(node));
            world.at(offset + 50, Event::AgentStep(node));
            world.at(offset + 20, Event::FenceCheck(node));
        }
        world.at(0, Event::SchedulerStart);
        world.at(1000, Event::Tick);
        world.at(200, Event::User);
        world.at(500, Event::Fault);
        world
    }

    /// The wall clock now.
    pub fn wall(&self) -> Timestamp {
        let ms = i64::try_from(self.now).unwrap_or(i64::MAX) + self.clock_offset_ms;
        epoch() + chrono::Duration::milliseconds(ms)
    }

    /// The simulated time at which the wall clock reads `wall` (now, if it already passed).
    pub fn when_wall(&self, wall: Timestamp) -> u64 {
        let ms = (wall - epoch()).num_milliseconds() - self.clock_offset_ms;
        u64::try_from(ms).unwrap_or(0).max(self.now)
    }

    /// Schedules `event` `delay` milliseconds from now.
    pub fn at(&mut self, delay: u64, event: Event) {
        self.seq += 1;
        self.events.insert((self.now + delay, self.seq), event);
    }

    /// Schedules `event` at `at` after everything else due then.
    pub fn last_at(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.events.insert((at, u64::MAX - self.seq), event);
    }

    pub fn note(&mut self, line: String) {
        if self.trace.len() >= self.options.trace_lines.max(1) {
            self.trace.pop_front();
        }
        self.trace.push_back(format!("{:>9} ms  {line}", self.now));
    }

    /// Takes the next event and handles it; false when none is left before `until`.
    pub fn step(&mut self, until: u64) -> bool {
        let Some((&(time, seq), _)) = self.events.iter().next() else {
            return false;
        };
        if time > until {
            return false;
        }
        let Some(event) = self.events.remove(&(time, seq)) else {
            return false;
        };
        self.now = time;
        self.steps += 1;
        self.handle(event);
        true
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Tick => {
                self.tick();
                self.at(1000, Event::Tick);
            }
            Event::Heartbeat(node) => {
                self.heartbeat(node);
                self.at(1000, Event::Heartbeat(node));
            }
            Event::AgentStep(node) => {
                self.agent_step(node);
                self.at(100, Event::AgentStep(node));
            }
            Event::FenceCheck(node) => {
                self.fence_check(node);
                let every = self.agents[node].fence_check_every();
                self.at(every, Event::FenceCheck(node));
            }
            Event::Pump => self.pump(),
            // What users do and what goes wrong are drawn by the run loop (`run`), which
            // reschedules them while the run is not quiet.
            Event::User | Event::Fault => {
                if !self.quiet {
                    self.due.push(event);
                }
            }
            Event::NodeRestart(node, lost) => self.restart_node(node, &lost),
            Event::PartitionHeal(node) => self.heal_node(node),
            Event::SchedulerStart => self.start_scheduler(),
            Event::ToNode(node, message) => self.deliver_to_node(node, message),
            Event::HeartbeatArrives(beat) => self.heartbeat_arrives(*beat),
            Event::Reconciled(node, boot) => self.reconciled(node, boot),
            Event::ReportRetry(node, boot, report) => self.retry_report(node, boot, *report),
            Event::SliceEnd => self.slice_end(),
            Event::StandbyTakesOver(stall) => self.standby_takes_over(stall),
            Event::SchedulerWakes(stall) => self.stalled_scheduler_wakes(stall),
        }
    }

    /// The principals file with these users' groups.
    pub fn set_groups(&mut self, groups: &BTreeMap<String, String>) {
        self.registry = registry_of(&self.users, groups);
        self.principals_changed = true;
    }

    /// The group `user` is in, in the principals file.
    pub fn group_of(&self, user: &str) -> Option<&str> {
        self.registry
            .principals
            .iter()
            .find(|p| p.name == user)
            .and_then(|p| p.group.as_deref())
    }
}

/// The wall clock when the run begins.
fn epoch() -> Timestamp {
    chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap_or_default()
}

/// The principals file: `users`, each in the group `groups` names, if any.
fn registry_of(users: &[Identity], groups: &BTreeMap<String, String>) -> Registry {
    Registry {
        principals: users
            .iter()
            .map(|u| Principal {
                name: u.name.clone(),
                role: if u.admin { Role::Admin } else { Role::User },
                public_key: u.key.clone(),
                unix_user: None,
                group: groups.get(&u.name).cloned(),
            })
            .collect(),
    }
}

/// How long the simulated scheduler keeps a finished job in the live bucket: short enough
/// that runs move jobs (arrays' last tasks with their environment among them) to history.
pub const SIM_KEEP_FINISHED_SECS: u64 = 20;

/// The simulated cluster's `[idle]` policy: warned after 3 s idle, acted on 2 s later.
pub fn sim_idle_policy(action: mgpu_protocol::idle::IdleAction) -> mgpu_protocol::idle::IdlePolicy {
    mgpu_protocol::idle::IdlePolicy {
        after_secs: 3,
        min_util_pct: 5,
        grace_secs: 2,
        action,
    }
}

/// The classes the simulated cluster has: `scavenger` (preemptible, 2 s of grace, 1 s of
/// minimum run time, may not preempt) beside `normal` (which may preempt it).
pub fn sim_classes() -> mgpu_protocol::qos::QosClasses {
    let scavenger = mgpu_protocol::qos::QosClass {
        priority: -1,
        preemptible: true,
        may_preempt: false,
        grace_secs: 2,
        min_runtime_secs: 1,
        allow_idle_ok: true,
        ..mgpu_protocol::qos::QosClass::default()
    };
    mgpu_protocol::qos::QosClasses(BTreeMap::from([("scavenger".to_owned(), scavenger)]))
}

impl World {
    /// A start was just stored: checked against priorities, once the moment's commands are
    /// carried out ([`World::settle_priorities`]).
    pub fn check_priority(&mut self, record: &mgpu_protocol::job::JobRecord) {
        let now = self.wall();
        let mut suspects = std::mem::take(&mut self.ledger.priorities);
        let ledger = &self.ledger;
        let cap = |user: &str| ledger.cap(user);
        let type_cap = |user: &str, gpu_type: &str| ledger.type_cap(user, gpu_type);
        let context = Context {
            agents: &self.agents,
            reservations: &self.store.reservations,
            cap: &cap,
            type_cap: &type_cap,
            now,
        };
        suspects.start_stored(record, &self.store.records, &context, self.faults_at_moment);
        self.ledger.priorities = suspects;
    }

    /// The commands of the moment are carried out: the starts suspected of passing over a
    /// job first in line are judged.
    pub fn settle_priorities(&mut self) {
        let broken = (self.ledger.priorities).settle(&self.store.records, self.faults);
        self.ledger.broken.extend(broken);
    }
}
