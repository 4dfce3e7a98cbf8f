//! The simulated cluster: one scheduler machine (or none, while a standby takes over), the
//! store, the streams between them (requests and agents' reports, each message held until
//! acknowledged and delivered again after the acknowledgement wait; assignments and control
//! messages per node), the agents, the users, the clock, and the faults, all drawn from one
//! [`Rng`]. The simulator plays the driver's part itself: it hands the machine one input at
//! a time, carries out its commands, and feeds the results back before the next input.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use mgpu_protocol::Timestamp;
use mgpu_protocol::assign::NodeControl;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::node::{GpuSource, GpuStatus, NodeHeartbeat, RunningJob};
use mgpu_protocol::principals::{Principal, Registry, Role};
use mgpu_protocol::priority::Policy;
use mgpu_protocol::report::{AgentReport, ReportKind};
use mgpu_protocol::request::Request;

use super::Options;
use super::agents::SimAgent;
use super::rng::Rng;
use super::store::SimStore;
use crate::limits::Limits;
use crate::machine::messages::{Admitted, Identity, Input, Loaded, Step, Tick, Token, steps};
use crate::machine::{Command, SchedulerState};

/// How long JetStream waits for an acknowledgement before it delivers a message again.
const ACK_WAIT_MS: u64 = 30_000;

/// Something that happens at a simulated time.
#[derive(Clone, Debug)]
pub enum Event {
    Tick,
    Heartbeat(usize),
    AgentStep(usize),
    Pump,
    User,
    Fault,
    NodeRestart(usize, Vec<(JobId, u32)>),
    SchedulerStart,
    ToNode(usize, NodeMessage),
    HeartbeatArrives(Box<NodeHeartbeat>),
}

/// What travels to a node.
#[derive(Clone, Debug)]
pub enum NodeMessage {
    Assign {
        job: JobId,
        attempt: u32,
        msg_id: String,
    },
    Control(NodeControl),
}

/// A message in a stream the scheduler consumes.
pub struct Stored<T> {
    pub message: T,
    /// When it can be delivered (again).
    pub available_at: u64,
    pub acked: bool,
}

/// The scheduler and the messages it holds.
pub struct SimScheduler {
    pub machine: SchedulerState,
    held: BTreeMap<Token, (bool, usize)>,
    next_token: Token,
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
    pub agents: Vec<SimAgent>,
    pub requests: Vec<Stored<(Identity, Request)>>,
    pub reports: Vec<Stored<AgentReport>>,
    pub users: Vec<Identity>,
    pub registry: Registry,
    pub policy: Policy,
    pub limits: Limits,
    /// Every job submitted, and whether it asked `--no-requeue`.
    pub submitted: BTreeMap<JobId, bool>,
    pub drained: BTreeSet<String>,
    pub held_jobs: BTreeSet<JobId>,
    pub faults: u64,
    pub steps: u64,
    /// The latest lines of what happened, for a failing seed's report.
    pub trace: std::collections::VecDeque<String>,
    /// Faults and new work stop from here on (the quiet period).
    pub quiet: bool,
    /// User actions and faults due now, for the run loop to draw.
    pub due: Vec<Event>,
}

impl World {
    pub fn new(seed: u64, options: Options, limits: Limits) -> Self {
        let mut rng = Rng::new(seed);
        let users: Vec<Identity> = ["alice", "bob", "root"]
            .iter()
            .map(|name| Identity {
                name: (*name).to_owned(),
                key: format!("U{}", name.to_uppercase()),
                admin: *name == "root",
            })
            .collect();
        let registry = Registry {
            principals: users
                .iter()
                .map(|u| Principal {
                    name: u.name.clone(),
                    role: if u.admin { Role::Admin } else { Role::User },
                    public_key: u.key.clone(),
                    unix_user: None,
                    group: None,
                })
                .collect(),
        };
        let nodes = rng.between(2, 5) as usize;
        let agents = (0..nodes)
            .map(|i| SimAgent::new(format!("node{i}"), rng.between(1, 4) as u32))
            .collect();
        let policy = Policy {
            max_job_time_secs: Some(3_600),
            ..Policy::default()
        };
        let mut world = World {
            rng,
            options,
            now: 0,
            clock_offset_ms: 0,
            seq: 0,
            events: BTreeMap::new(),
            store: SimStore::default(),
            scheduler: None,
            agents,
            requests: Vec::new(),
            reports: Vec::new(),
            users,
            registry,
            policy,
            limits,
            submitted: BTreeMap::new(),
            drained: BTreeSet::new(),
            held_jobs: BTreeSet::new(),
            faults: 0,
            steps: 0,
            trace: std::collections::VecDeque::new(),
            quiet: false,
            due: Vec::new(),
        };
        for node in 0..world.agents.len() {
            let offset = world.rng.below(1000);
            world.at(offset, Event::Heartbeat(node));
            world.at(offset + 50, Event::AgentStep(node));
        }
        world.at(0, Event::SchedulerStart);
        world.at(1000, Event::Tick);
        world.at(200, Event::User);
        world.at(500, Event::Fault);
        world
    }

    /// The wall clock now.
    pub fn wall(&self) -> Timestamp {
        let base = chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap_or_default();
        let ms = i64::try_from(self.now).unwrap_or(i64::MAX) + self.clock_offset_ms;
        base + chrono::Duration::milliseconds(ms)
    }

    /// Schedules `event` `delay` milliseconds from now.
    pub fn at(&mut self, delay: u64, event: Event) {
        self.seq += 1;
        self.events.insert((self.now + delay, self.seq), event);
    }

    pub fn note(&mut self, line: String) {
        if self.trace.len() >= 200 {
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
            Event::Pump => self.pump(),
            // What users do and what goes wrong are drawn by the run loop (`run`), which
            // reschedules them while the run is not quiet.
            Event::User | Event::Fault => {
                if !self.quiet {
                    self.due.push(event);
                }
            }
            Event::NodeRestart(node, lost) => self.restart_node(node, &lost),
            Event::SchedulerStart => self.start_scheduler(),
            Event::ToNode(node, message) => self.deliver_to_node(node, message),
            Event::HeartbeatArrives(beat) => {
                if self.scheduler.is_some() {
                    self.feed(Input::Heartbeat(beat));
                }
            }
        }
    }

    /// A standby becomes active: a new machine from what the store holds, the reports stored
    /// meanwhile handled, unconfirmed assignments sent again, a tick, a pass.
    pub fn start_scheduler(&mut self) {
        let loaded = Loaded {
            records: self.store.records.values().cloned().collect(),
            heartbeats: self.store.heartbeats.values().cloned().collect(),
            admin: self.store.admin.clone(),
            usage: self.store.usage.clone(),
            principals: self.registry.clone(),
            limits: self.limits.clone(),
            policy: self.policy.clone(),
            now: self.wall(),
        };
        self.scheduler = Some(SimScheduler {
            machine: SchedulerState::new(loaded),
            held: BTreeMap::new(),
            next_token: 1,
        });
        self.note("scheduler active".into());
        self.pump_reports();
        self.feed(Input::Resumed);
        self.tick();
        self.pump();
    }

    /// The active scheduler dies: what it held is delivered again after the ack wait.
    pub fn crash_scheduler(&mut self) {
        let Some(scheduler) = self.scheduler.take() else {
            return;
        };
        for (is_report, index) in scheduler.held.into_values() {
            self.redeliver_later(is_report, index);
        }
        let back = self.rng.between(3_000, 6_000);
        self.at(back, Event::SchedulerStart);
    }

    fn redeliver_later(&mut self, is_report: bool, index: usize) {
        let at = self.now + ACK_WAIT_MS;
        if is_report {
            if let Some(stored) = self.reports.get_mut(index) {
                stored.available_at = at;
            }
        } else if let Some(stored) = self.requests.get_mut(index) {
            stored.available_at = at;
        }
        self.events.insert((at, u64::MAX - self.seq), Event::Pump);
        self.seq += 1;
    }

    fn tick(&mut self) {
        let caught_up = self.reports_caught_up();
        let tick = Tick {
            monotonic: Duration::from_millis(self.now),
            heartbeats_visible: true,
            reports_caught_up: caught_up,
        };
        if self.scheduler.is_some() {
            self.feed(Input::Tick(tick));
        }
    }

    fn reports_caught_up(&self) -> bool {
        self.reports.iter().all(|r| r.acked)
    }

    /// Delivers what the streams have ready: requests as the driver would (admitted, in
    /// steps), then reports one at a time.
    pub fn pump(&mut self) {
        if self.scheduler.is_none() {
            return;
        }
        let ready: Vec<usize> = (0..self.requests.len())
            .filter(|&i| !self.requests[i].acked && self.requests[i].available_at <= self.now)
            .take(512)
            .collect();
        let mut admitted = Vec::new();
        for index in ready {
            self.requests[index].available_at = u64::MAX;
            let (identity, request) = self.requests[index].message.clone();
            let token = self.hold(false, index);
            admitted.push(Admitted {
                token,
                identity,
                request,
            });
        }
        for step in steps(admitted, |a| &a.request) {
            let input = match step {
                Step::Record(batch) => Input::Submissions(batch),
                Step::CarryOut(one) => Input::Request(Box::new(one)),
            };
            self.feed(input);
        }
        self.release_unacked();
        self.pump_reports();
    }

    fn pump_reports(&mut self) {
        let ready: Vec<usize> = (0..self.reports.len())
            .filter(|&i| !self.reports[i].acked && self.reports[i].available_at <= self.now)
            .collect();
        for index in ready {
            if self.scheduler.is_none() {
                return;
            }
            self.reports[index].available_at = u64::MAX;
            let report = self.reports[index].message.clone();
            let token = self.hold(true, index);
            self.feed(Input::Report { token, report });
            self.release_unacked();
        }
    }

    fn hold(&mut self, is_report: bool, index: usize) -> Token {
        let Some(scheduler) = self.scheduler.as_mut() else {
            return 0;
        };
        let token = scheduler.next_token;
        scheduler.next_token += 1;
        scheduler.held.insert(token, (is_report, index));
        token
    }

    /// Messages handled but not acknowledged are delivered again after the ack wait.
    fn release_unacked(&mut self) {
        let Some(scheduler) = self.scheduler.as_mut() else {
            return;
        };
        let held: Vec<(bool, usize)> = std::mem::take(&mut scheduler.held).into_values().collect();
        for (is_report, index) in held {
            self.redeliver_later(is_report, index);
        }
    }

    /// Hands `input` to the machine and carries out what it asks, results fed back, then a
    /// pass when one is due.
    pub fn feed(&mut self, input: Input) {
        let wall = self.wall();
        let Some(scheduler) = self.scheduler.as_mut() else {
            return;
        };
        let commands = scheduler.machine.handle(wall, input);
        self.carry_out(commands);
        if self
            .scheduler
            .as_ref()
            .is_some_and(|s| s.machine.pass_due())
        {
            let wall = self.wall();
            if let Some(scheduler) = self.scheduler.as_mut() {
                let (commands, _, _) = scheduler.machine.pass(wall, &mut || 0);
                self.carry_out(commands);
            }
        }
    }

    fn carry_out(&mut self, mut commands: Vec<Command>) {
        let mut failed: BTreeSet<JobId> = BTreeSet::new();
        while !commands.is_empty() {
            let mut results = Vec::new();
            for command in commands {
                if command.job().is_some_and(|job| failed.contains(job))
                    && !matches!(command, Command::Write { .. } | Command::Log(_))
                {
                    continue;
                }
                if let Some(result) = self.carry_out_one(command, &mut failed) {
                    results.push(result);
                }
            }
            commands = Vec::new();
            let wall = self.wall();
            for result in results {
                if let Some(scheduler) = self.scheduler.as_mut() {
                    commands.extend(scheduler.machine.handle(wall, result));
                }
            }
        }
    }

    fn carry_out_one(&mut self, command: Command, failed: &mut BTreeSet<JobId>) -> Option<Input> {
        match command {
            Command::Write {
                op,
                record,
                expected,
            } => {
                let outcome = if !self.quiet && self.rng.chance(self.options.write_failure) {
                    self.faults += 1;
                    self.note(format!("write of {} fails", record.id.short()));
                    crate::machine::messages::WriteOutcome::Failed {
                        error: "store unavailable".into(),
                    }
                } else {
                    self.store.write(record, expected)
                };
                Some(Input::Written { op, outcome })
            }
            Command::Assign { job, ranks, .. } => {
                for rank in ranks {
                    let Some(node) = self.node_index(&rank.node) else {
                        continue;
                    };
                    let delay = self.delay();
                    let message = NodeMessage::Assign {
                        job: job.clone(),
                        attempt: rank.assignment.attempt,
                        msg_id: rank.msg_id.clone(),
                    };
                    self.at(delay, Event::ToNode(node, message.clone()));
                    if !self.quiet && self.rng.chance(self.options.duplicate) {
                        self.faults += 1;
                        let again = self.delay() + 500;
                        self.at(again, Event::ToNode(node, message));
                    }
                }
                self.note(format!("assign {}", job.short()));
                None
            }
            Command::Control { node, control, .. } => {
                if let Some(index) = self.node_index(&node) {
                    let delay = self.delay();
                    self.at(delay, Event::ToNode(index, NodeMessage::Control(control)));
                }
                None
            }
            Command::Ack { token, .. } => {
                let held = self.scheduler.as_mut()?.held.remove(&token)?;
                if !self.quiet && self.rng.chance(self.options.ack_lost) {
                    // The acknowledgement is lost: the message comes again.
                    self.faults += 1;
                    self.redeliver_later(held.0, held.1);
                } else if held.0 {
                    self.reports[held.1].acked = true;
                } else {
                    self.requests[held.1].acked = true;
                }
                None
            }
            Command::StoreAdmin { op, node, admin } => {
                self.store.admin.insert(node, admin);
                Some(Input::AdminStored { op, stored: true })
            }
            Command::Archive { record } => {
                let id = record.id.clone();
                self.store.archive(record);
                Some(Input::Archived { id, moved: true })
            }
            Command::SaveUsage(book) => {
                self.store.usage = book;
                None
            }
            Command::AskReportsCaughtUp { op } => Some(Input::ReportsCaughtUp {
                op,
                caught_up: self.reports_caught_up(),
            }),
            Command::Log(line) => {
                if self.options.trace_logs {
                    let job = line.job.as_ref().map(|j| j.short()).unwrap_or_default();
                    self.note(format!("log {job} {}", line.message));
                }
                None
            }
            Command::Event(_) | Command::Audit(_) | Command::Count(_) => {
                let _ = failed;
                None
            }
        }
    }

    /// A delivery delay: mostly short, now and then long (which reorders messages).
    fn delay(&mut self) -> u64 {
        if !self.quiet && self.rng.chance(self.options.delay) {
            self.faults += 1;
            self.rng.between(500, 4_000)
        } else {
            self.rng.between(1, 30)
        }
    }

    fn node_index(&self, name: &str) -> Option<usize> {
        self.agents.iter().position(|a| a.name == name)
    }

    fn deliver_to_node(&mut self, node: usize, message: NodeMessage) {
        let now = self.now;
        let wall = self.wall();
        let agent = &mut self.agents[node];
        if !agent.up {
            return;
        }
        match message {
            NodeMessage::Assign {
                job,
                attempt,
                msg_id,
            } => {
                if !agent.seen_msg_ids.insert(msg_id) {
                    return;
                }
                if let Some(kind) = agent.assign(&job, attempt, now, &mut self.rng) {
                    let name = agent.name.clone();
                    self.note(format!("{name} starts {} attempt {attempt}", job.short()));
                    self.publish_report(node, job, attempt, kind, wall);
                }
            }
            NodeMessage::Control(NodeControl::Kill {
                job_id,
                attempt,
                requeue,
                ..
            }) => agent.kill(&job_id, attempt, requeue, now, &mut self.rng),
        }
    }

    fn agent_step(&mut self, node: usize) {
        let now = self.now;
        let wall = self.wall();
        let ended = self.agents[node].ended(now);
        for (job, attempt, exit) in ended {
            let name = self.agents[node].name.clone();
            self.note(format!("{name} ends {} attempt {attempt}", job.short()));
            self.publish_report(node, job, attempt, ReportKind::Exited(exit), wall);
        }
    }

    pub fn publish_report(
        &mut self,
        node: usize,
        job: JobId,
        attempt: u32,
        kind: ReportKind,
        at: Timestamp,
    ) {
        let report = AgentReport {
            job,
            attempt,
            node: self.agents[node].name.clone(),
            at,
            kind,
        };
        let delay = self.delay();
        self.reports.push(Stored {
            message: report,
            available_at: self.now + delay,
            acked: false,
        });
        self.at(delay, Event::Pump);
    }

    fn heartbeat(&mut self, node: usize) {
        let agent = &self.agents[node];
        if !agent.up {
            return;
        }
        let beat = NodeHeartbeat {
            node: agent.name.clone(),
            sent_at: self.wall(),
            interval_ms: 1000,
            gpu_source: GpuSource::Declared,
            gpu_note: None,
            gpus: (0..agent.gpus)
                .map(|index| GpuStatus {
                    index,
                    uuid: format!("GPU-{node}-{index}"),
                    name: "Simulated".into(),
                    memory_total_mib: agent.memory_mib,
                    memory_used_mib: 0,
                    utilization_pct: 0,
                    temperature_c: None,
                    power_w: None,
                    foreign_processes: Vec::new(),
                })
                .collect(),
            running: agent
                .processes
                .keys()
                .map(|(id, attempt)| RunningJob {
                    id: id.clone(),
                    attempt: *attempt,
                    pid: 1000 + attempt,
                })
                .collect(),
            address: agent.name.clone(),
            runs_jobs_as: "root".into(),
            containment: None,
            agent_version: "sim".into(),
            protocol: mgpu_protocol::version::PROTOCOL,
            mem_threshold: 0.8,
            load_threshold: 0.8,
            labels: BTreeMap::new(),
            fence_after_ms: Some(3_000),
            kill_grace_ms: 0,
            gpu_isolation: true,
            cpus: None,
            mem_host_mib: None,
        };
        self.store
            .heartbeats
            .insert(beat.node.clone(), beat.clone());
        if !self.quiet && self.rng.chance(self.options.heartbeat_drop) {
            self.faults += 1;
            return;
        }
        let delay = self.rng.between(1, 200);
        self.at(delay, Event::HeartbeatArrives(Box::new(beat)));
    }

    pub fn crash_node(&mut self, node: usize) {
        if !self.agents[node].up {
            return;
        }
        let lost = self.agents[node].crash();
        let name = self.agents[node].name.clone();
        self.note(format!("{name} crashes with {} processes", lost.len()));
        let back = self.rng.between(2_000, 20_000);
        self.at(back, Event::NodeRestart(node, lost));
    }

    fn restart_node(&mut self, node: usize, lost: &[(JobId, u32)]) {
        let wall = self.wall();
        let reports = self.agents[node].restart(lost, wall);
        self.note(format!("{} restarts", self.agents[node].name));
        for report in reports {
            let job = report.job.clone();
            self.publish_report(node, job, report.attempt, report.kind, wall);
        }
    }
}
