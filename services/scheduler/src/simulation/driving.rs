//! The simulator's part of the driver, kept to what `crate::driver` does: a standby that
//! becomes active loads the machine from the store, handles the reports stored meanwhile and
//! resends unconfirmed assignments; requests are handed over in steps, then one pass; each
//! report, heartbeat and tick is handed over, then a pass if one is due; the limits and
//! principals files are read again on a tick; the slice timer wakes the machine when a time
//! slice ends. Every command is carried out against the simulated store and streams, and its
//! result fed back before the next input.

use std::time::Duration;

use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::JobSpec;

use super::agents::NodeMessage;
use super::gate::SimGate;
use super::world::{Event, SimScheduler, Source, World};
use crate::machine::messages::{Input, Loaded, RankAssignment, Tick};
use crate::machine::{Command, SchedulerState};

/// A node stream's duplicate window: an assignment published again with the same message id
/// within it is dropped (`mgpu_nats::streams`).
const DEDUP_WINDOW_MS: u64 = 120_000;

impl World {
    /// A standby becomes active: a new machine from what the store holds, the reports stored
    /// meanwhile handled, unconfirmed assignments sent again, a tick, a pass.
    pub fn start_scheduler(&mut self) {
        let loaded = Loaded {
            records: self.store.records.values().cloned().collect(),
            heartbeats: self.store.heartbeats.values().cloned().collect(),
            admin: self.store.admin.clone(),
            reservations: self.store.reservations.values().cloned().collect(),
            usage: self.store.usage.clone(),
            principals: self.registry.clone(),
            limits: self.limits.clone(),
            policy: self.policy.clone(),
            now: self.wall(),
        };
        // It read both files as they are now.
        self.limits_changed = false;
        self.principals_changed = false;
        self.ledger.in_force(&self.limits, &self.registry);
        self.gate = SimGate::restored(&self.store.nonces);
        self.scheduler = Some(SimScheduler {
            machine: SchedulerState::new(loaded),
            held: std::collections::BTreeMap::new(),
            next_token: 1,
            released_batches: std::collections::BTreeSet::new(),
        });
        self.note("scheduler active".into());
        if self.reports.awaits_redelivery() {
            self.feed(Input::ReportsUnacknowledged);
        }
        self.pump_reports();
        self.feed(Input::Resumed);
        let queued: Vec<JobSpec> = self
            .scheduler
            .as_ref()
            .map(|s| s.machine.queued_specs().into_iter().cloned().collect())
            .unwrap_or_default();
        self.learn_archived(&queued);
        self.tick();
        self.pump();
    }

    /// The active scheduler dies: what it held is delivered again after the ack wait.
    pub fn crash_scheduler(&mut self) {
        let Some(scheduler) = self.scheduler.take() else {
            return;
        };
        // A batch's tasks share their message: delivered again once.
        let messages: std::collections::BTreeSet<(Source, usize)> =
            scheduler.held.into_values().collect();
        for (source, index) in messages {
            self.redeliver_later(source, index);
        }
        self.slice_timer = None;
        let back = self.rng.between(3_000, 6_000);
        self.at(back, Event::SchedulerStart);
    }

    /// The liveness timer: the limits and principals files read again if they changed, then
    /// the tick (the pass, if any, comes after all three, as in the driver's loop).
    pub(super) fn tick(&mut self) {
        if self.scheduler.is_none() {
            return;
        }
        let limits = std::mem::take(&mut self.limits_changed);
        let principals = std::mem::take(&mut self.principals_changed);
        if limits {
            self.feed_only(Input::Limits(self.limits.clone()));
        }
        if principals {
            self.feed_only(Input::Principals(self.registry.clone()));
        }
        if limits || principals {
            self.ledger.in_force(&self.limits, &self.registry);
            self.note("the scheduler reads the limits and principals again".into());
        }
        let tick = Tick {
            monotonic: Duration::from_millis(self.now),
            heartbeats_visible: true,
            reports_caught_up: self.reports.all_acked(),
        };
        self.feed(Input::Tick(tick));
    }

    /// The slice timer went off: the machine decides in a pass whether to preempt.
    pub(super) fn slice_end(&mut self) {
        if self.slice_timer.is_some_and(|at| at <= self.now) {
            self.slice_timer = None;
        }
        if let Some(scheduler) = self.scheduler.as_mut() {
            scheduler.machine.slice_over();
        }
        self.run_pass();
    }

    /// Hands `input` to the machine and carries out what it asks, results fed back, then a
    /// pass when one is due.
    pub fn feed(&mut self, input: Input) {
        self.feed_only(input);
        self.run_pass();
    }

    /// Hands `input` to the machine and carries out what it asks, results fed back.
    pub(super) fn feed_only(&mut self, input: Input) {
        let wall = self.wall();
        let Some(scheduler) = self.scheduler.as_mut() else {
            return;
        };
        let commands = scheduler.machine.handle(wall, input);
        self.carry_out(commands);
    }

    /// A pass, when the machine says one is due; the slice timer set after it.
    pub(super) fn run_pass(&mut self) {
        let wall = self.wall();
        let Some(scheduler) = self.scheduler.as_mut() else {
            return;
        };
        if scheduler.machine.pass_due() {
            let (commands, _, _) = scheduler.machine.pass(wall, &mut || 0);
            self.carry_out(commands);
        }
        let Some(end) = self
            .scheduler
            .as_ref()
            .and_then(|s| s.machine.next_slice_end())
        else {
            return;
        };
        // The driver sleeps until 5 ms past the slice's end on the wall clock.
        let at = self.when_wall(end) + 5;
        if self.slice_timer.is_none_or(|armed| armed > at) {
            self.slice_timer = Some(at);
            self.last_at(at, Event::SliceEnd);
        }
    }

    /// Carries commands out in rounds: the results of one round are fed back, and what they
    /// ask for is the next round. A round goes in job order, each job's commands in the order
    /// given: the machine lists different jobs' commands in the order of its hash maps (two
    /// nodes lost in one tick, two slices over in one pass), which differs from run to run,
    /// and the seed must replay exactly. The driver pipelines writes of different jobs, so
    /// any order across jobs is one it may carry out.
    fn carry_out(&mut self, mut commands: Vec<Command>) {
        // A fault while the moment's commands are carried out (the failed write of the start
        // of the job first in line, before or after another's start is stored) excuses what
        // the priorities' check would suspect.
        self.faults_at_moment = self.faults;
        while !commands.is_empty() {
            commands.sort_by(|a, b| a.job().cmp(&b.job()));
            self.ledger.next_round();
            let results: Vec<Input> = commands
                .into_iter()
                .filter_map(|command| self.carry_out_one(command))
                .collect();
            commands = Vec::new();
            let wall = self.wall();
            for result in results {
                if let Some(scheduler) = self.scheduler.as_mut() {
                    commands.extend(scheduler.machine.handle(wall, result));
                }
            }
        }
        self.settle_priorities();
    }

    fn carry_out_one(&mut self, command: Command) -> Option<Input> {
        match command {
            Command::Write {
                op,
                record,
                expected,
            } => Some(Input::Written {
                op,
                outcome: self.write(std::sync::Arc::unwrap_or_clone(record), expected),
            }),
            Command::Assign { job, ranks, .. } => {
                self.check_start_in_windows(&job);
                self.check_array_environment(&job);
                self.send_assignments(&job, ranks);
                None
            }
            Command::Control { node, control, .. } => {
                if let Some(index) = self.node_index(&node) {
                    let mgpu_protocol::assign::NodeControl::Kill {
                        job_id, attempt, ..
                    } = &control;
                    self.ledger.kill_sent(job_id, *attempt, &node);
                    let record = self.store.records.get(job_id).map(|t| &t.record);
                    let broken = record.and_then(|record| {
                        super::preemption_checks::kill_sent(record, &control, &self.policy.qos)
                    });
                    self.ledger.broken.extend(broken);
                    let really_idle = self.agents[index]
                        .processes
                        .get(&(job_id.clone(), *attempt))
                        .filter(|p| p.stopping.is_none())
                        .map(|p| p.idle);
                    let broken = record.and_then(|record| {
                        let classes = &self.policy.qos;
                        let now = self.wall();
                        super::idle_checks::kill_sent(record, &control, classes, really_idle, now)
                    });
                    self.ledger.broken.extend(broken);
                    let delay = self.in_stream_order(index);
                    self.at(delay, Event::ToNode(index, NodeMessage::Control(control)));
                }
                None
            }
            Command::Ack { token, job } => {
                let (source, index) = self.scheduler.as_mut()?.held.remove(&token)?;
                if source == Source::Request
                    && let Some(job) = job
                {
                    self.check_acknowledged_cancel(index, &job);
                }
                // A batch is acknowledged once every task in it is, and delivered again
                // instead if one of them was let go.
                if self.other_parts_held(source, index) {
                    return None;
                }
                let released = self
                    .scheduler
                    .as_mut()
                    .is_some_and(|s| s.released_batches.remove(&index));
                if released {
                    self.redeliver_later(source, index);
                    return None;
                }
                if source == Source::Request {
                    self.check_acknowledged_batch(index);
                }
                if self.chance_of_fault(self.options.ack_lost, |_| {
                    "an acknowledgement is lost".into()
                }) {
                    // The message comes again.
                    self.redeliver_later(source, index);
                } else if source == Source::Report {
                    self.reports.ack(index);
                } else {
                    self.requests.ack(index);
                }
                None
            }
            Command::StoreAdmin { op, node, admin } => {
                self.ledger.admin_stored(&node, &admin);
                self.store.admin.insert(node, admin);
                Some(Input::AdminStored { op, stored: true })
            }
            Command::StoreReservation { op, reservation } => {
                self.reservation_stored(op, reservation)
            }
            Command::DropReservation { name } => {
                self.store.reservations.remove(&name);
                None
            }
            Command::ReservationVerdict { verdict, .. } => {
                self.reservation_answered(&verdict);
                None
            }
            Command::PurgeAssignments { node } => {
                let purged = !self.chance_of_uncounted_fault(self.options.write_failure, |_| {
                    format!("purge of {node}'s assignments fails")
                });
                if purged {
                    self.purge_assignments(&node);
                }
                Some(Input::AssignmentsPurged { node, purged })
            }
            Command::Archive {
                record,
                last_of_array,
            } => {
                if last_of_array {
                    self.drop_array_environment(&record);
                }
                let id = record.id.clone();
                self.store.archive(*record);
                Some(Input::Archived { id, moved: true })
            }
            Command::SaveUsage(book) => {
                self.store.usage = book;
                None
            }
            Command::SavePlan(plan) => {
                self.check_plan(&plan);
                None
            }
            Command::AskReportsCaughtUp { op } => Some(Input::ReportsCaughtUp {
                op,
                caught_up: self.reports.all_acked(),
            }),
            Command::Log(line) => {
                if self.options.trace_logs {
                    let job = line.job.as_ref().map(|j| j.short()).unwrap_or_default();
                    self.note(format!("log {job} {}", line.message));
                }
                None
            }
            Command::Verdict { verdict, .. } => {
                self.check_stored_before_told(&verdict.job, "a verdict");
                self.check_verdict(verdict);
                None
            }
            Command::Event(event) => {
                self.check_event(&event);
                None
            }
            Command::Notice { notice, .. } => {
                self.check_notice(&notice);
                None
            }
            Command::Audit(_) | Command::Count(_) => None,
        }
    }

    /// A job's assignments, one per launched rank, each on its node's stream.
    fn send_assignments(&mut self, job: &JobId, ranks: Vec<RankAssignment>) {
        let sent: Vec<(u32, String)> = ranks
            .iter()
            .map(|r| (r.assignment.rank, r.node.clone()))
            .collect();
        if let Some(first) = ranks.first() {
            let stored = self.store.records.get(job).map(|t| &t.record);
            self.ledger
                .assigned(stored, first.assignment.attempt, &sent);
        }
        for rank in ranks {
            let purges_before = self
                .node_index(&rank.node)
                .map_or(0, |index| self.agents[index].purges);
            let message = NodeMessage::Assign {
                job: job.clone(),
                attempt: rank.assignment.attempt,
                rank: rank.assignment.rank,
                time_limit_ms: rank.assignment.spec.time_limit_secs.map(|s| s * 1000),
                purges_before,
            };
            self.send_assignment(&rank.node, &rank.msg_id, message);
        }
        self.note(format!("assign {}", job.short()));
    }

    /// Publishes one rank's assignment on its node's stream (dropped there when its message
    /// id came within the duplicate window); now and then delivered twice, as after an
    /// agent's acknowledgement was lost.
    fn send_assignment(&mut self, node: &str, msg_id: &str, message: NodeMessage) {
        let Some(node) = self.node_index(node) else {
            return;
        };
        if self
            .msg_ids
            .get(msg_id)
            .is_some_and(|at| self.now < at + DEDUP_WINDOW_MS)
        {
            return;
        }
        self.msg_ids.insert(msg_id.to_owned(), self.now);
        let delay = self.in_stream_order(node);
        self.at(delay, Event::ToNode(node, message.clone()));
        if self.chance_of_fault(self.options.duplicate, |w| {
            format!("an assignment to {} comes twice", w.agents[node].name)
        }) {
            let again = self.delay() + 500;
            self.at(again, Event::ToNode(node, message));
        }
    }

    /// The delay of a message stored now on `node`'s stream: a delivery delay, but never
    /// before one stored earlier (the agent's one consumer takes its stream in order).
    fn in_stream_order(&mut self, node: usize) -> u64 {
        let at = (self.now + self.delay()).max(self.agents[node].stream_tail);
        self.agents[node].stream_tail = at;
        at - self.now
    }

    /// A delivery delay: mostly short, now and then long (which reorders messages).
    pub(super) fn delay(&mut self) -> u64 {
        if self.chance_of_fault(self.options.delay, |_| "a message is delayed".into()) {
            self.rng.between(500, 4_000)
        } else {
            self.rng.between(1, 30)
        }
    }

    pub(super) fn node_index(&self, name: &str) -> Option<usize> {
        self.agents.iter().position(|a| a.name == name)
    }
}
