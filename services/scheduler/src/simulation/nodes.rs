//! The nodes' side of the simulated cluster: what reaches an agent (its stream delivers
//! assignments and controls while it is up and connected, and keeps them while it is not),
//! what an agent publishes (reports, stored at once or retried until stored; heartbeats,
//! stored or lost with a partition), its processes ending, its fence watch, and the faults
//! that hit a node: a crash and restart, and a network partition that cuts it off from NATS
//! for a drawn time.

use std::collections::BTreeMap;

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::node::{GpuSource, GpuStatus, NodeHeartbeat, RunningJob};
use mgpu_protocol::report::{AgentReport, ReportKind};

use super::agents::{Attempt, NodeMessage};
use super::world::{Event, World};
use crate::machine::messages::Input;

impl World {
    /// A message from the node's stream reaches the agent, or waits there; an assignment
    /// purged since it was stored never arrives.
    pub(super) fn deliver_to_node(&mut self, node: usize, message: NodeMessage) {
        let agent = &mut self.agents[node];
        if let NodeMessage::Assign { purges_before, .. } = &message
            && *purges_before < agent.purges
        {
            return;
        }
        // Until its reconciliation is over a restarted agent takes nothing, and then takes
        // the stream in order.
        if !agent.connected() || agent.reconciling {
            agent.inbox.push(message);
            return;
        }
        match message {
            NodeMessage::Assign {
                job,
                attempt,
                rank,
                time_limit_ms,
                ..
            } => self.start_attempt(node, job, attempt, rank, time_limit_ms),
            NodeMessage::Control(control) => {
                let now = self.now;
                self.agents[node].kill(&control, now, &mut self.rng);
                let broken = std::mem::take(&mut self.agents[node].broken);
                self.ledger.broken.extend(broken);
            }
        }
    }

    /// The assignments waiting on `node`'s stream, delivered to the agent or not yet, are
    /// dropped (its controls stay).
    pub(super) fn purge_assignments(&mut self, node: &str) {
        let Some(index) = self.node_index(node) else {
            return;
        };
        let agent = &mut self.agents[index];
        agent.purges += 1;
        agent
            .inbox
            .retain(|message| !matches!(message, NodeMessage::Assign { .. }));
        self.note(format!("assignments waiting for {node} purged"));
    }

    fn start_attempt(
        &mut self,
        node: usize,
        job: JobId,
        attempt: u32,
        rank: u32,
        time_limit_ms: Option<u64>,
    ) {
        let now = self.now;
        let Some(kind) = self.agents[node].assign(&job, attempt, time_limit_ms, now, &mut self.rng)
        else {
            return;
        };
        let others: Vec<u32> = self
            .agents
            .iter()
            .flat_map(|agent| agent.other_attempts(&job, attempt, now))
            .collect();
        let no_requeue = self.submitted.get(&job).copied().unwrap_or(false);
        let name = self.agents[node].name.clone();
        self.ledger
            .process_started((&job, attempt, &name), &others, no_requeue);
        self.note(format!(
            "{name} starts {} attempt {attempt} rank {rank}",
            job.short()
        ));
        let wall = self.wall();
        self.publish_report(node, job, attempt, kind, wall);
    }

    /// The agent's processes that ended are reported.
    pub(super) fn agent_step(&mut self, node: usize) {
        let now = self.now;
        let ended = self.agents[node].ended(now, &mut self.rng);
        if ended.is_empty() {
            return;
        }
        let wall = self.wall();
        for (job, attempt, exit) in ended {
            let name = self.agents[node].name.clone();
            let how = if exit.lost { " (fenced)" } else { "" };
            self.note(format!(
                "{name} ends {} attempt {attempt}{how}",
                job.short()
            ));
            self.publish_report(node, job, attempt, ReportKind::Exited(exit), wall);
        }
    }

    /// The fence watch looks.
    pub(super) fn fence_check(&mut self, node: usize) {
        let now = self.now;
        let stopped = self.agents[node].fence(now, &mut self.rng);
        if stopped > 0 {
            let agent = &self.agents[node];
            let line = format!(
                "{} fences itself: no heartbeat stored for {} ms, stopping {stopped} job(s)",
                agent.name,
                now.saturating_sub(agent.last_stored)
            );
            self.note(line);
        }
    }

    /// The agent publishes a report: stored now, or retried until it can be.
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
        if self.agents[node].connected() {
            self.store_report(node, report);
        } else {
            let now = self.now;
            self.agents[node].outbox.push((report, now));
        }
    }

    fn store_report(&mut self, node: usize, report: AgentReport) {
        self.agents[node].stored(&report);
        let delay = self.delay();
        let exit = match &report.kind {
            ReportKind::Exited(exit) => Some((report.job.clone(), report.attempt, exit.clone())),
            _ => None,
        };
        self.reports.publish(report, self.now + delay);
        if let Some((job, attempt, exit)) = exit {
            let at = self.reports.last_available();
            self.ledger.exit_reported(&job, attempt, &exit, at);
        }
        self.at(delay, Event::Pump);
    }

    /// A retry of a report by the agent of boot `boot`.
    pub(super) fn retry_report(&mut self, node: usize, boot: u32, report: AgentReport) {
        let agent = &mut self.agents[node];
        if !agent.up || agent.boot != boot {
            // Died with its agent: the restarted one reports the attempt lost.
            return;
        }
        if agent.cut {
            agent.outbox.push((report, self.now));
            return;
        }
        self.store_report(node, report);
    }

    /// The agent heartbeats: stored and delivered unless it is cut off (then neither, and its
    /// fence keeps counting).
    pub(super) fn heartbeat(&mut self, node: usize) {
        if !self.agents[node].connected() {
            return;
        }
        let beat = self.heartbeat_of(node);
        self.store
            .heartbeats
            .insert(beat.node.clone(), beat.clone());
        let now = self.now;
        self.agents[node].heartbeat_stored(now, &mut self.rng);
        if self.chance_of_fault(self.options.heartbeat_drop, |_| {
            format!("a heartbeat of {} is dropped", beat.node)
        }) {
            // Stored, but the scheduler's subscription missed it.
            return;
        }
        let delay = self.rng.between(1, 200);
        self.at(delay, Event::HeartbeatArrives(Box::new(beat)));
    }

    fn heartbeat_of(&self, node: usize) -> NodeHeartbeat {
        let agent = &self.agents[node];
        NodeHeartbeat {
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
                    gpu_type: Some(agent.gpu_type.clone()),
                })
                .collect(),
            running: agent
                .table
                .iter()
                .map(|(id, attempt)| RunningJob {
                    id: id.clone(),
                    attempt: *attempt,
                    pid: 1000 + attempt,
                    idle: agent
                        .processes
                        .get(&(id.clone(), *attempt))
                        .map(|process| process.idle_sample(self.now)),
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
            fence_after_ms: Some(agent.fence_after_ms),
            kill_grace_ms: agent.kill_grace_ms,
            gpu_isolation: true,
            cpus: None,
            mem_host_mib: None,
            features: agent.features.clone(),
        }
    }

    pub(super) fn heartbeat_arrives(&mut self, beat: NodeHeartbeat) {
        if self.scheduler.is_some() {
            self.feed(Input::Heartbeat(Box::new(beat)));
        }
    }

    pub fn crash_node(&mut self, node: usize) {
        if !self.agents[node].up {
            return;
        }
        let lost = self.agents[node].crash();
        let name = self.agents[node].name.clone();
        self.note(format!("{name} crashes with {} attempts", lost.len()));
        let back = self.rng.between(2_000, 20_000);
        self.at(back, Event::NodeRestart(node, lost));
    }

    pub(super) fn restart_node(&mut self, node: usize, lost: &[Attempt]) {
        let wall = self.wall();
        let now = self.now;
        let reports = self.agents[node].restart(lost, wall, now);
        self.note(format!("{} restarts", self.agents[node].name));
        for report in reports {
            self.publish_report(node, report.job, report.attempt, report.kind, wall);
        }
        if self.agents[node].cut {
            // Reconciliation is not over until its reports are stored.
            self.agents[node].reconciling = !self.agents[node].outbox.is_empty();
        } else {
            self.take_inbox(node);
        }
    }

    /// The node is cut off from NATS for a drawn time; false when it already is.
    pub fn partition_node(&mut self, node: usize) -> bool {
        if self.agents[node].cut {
            return false;
        }
        // Short ones heal before the node counts as offline; long ones outlast its fence.
        let lasts = if self.rng.chance(300) {
            self.rng.between(500, 3_000)
        } else {
            self.rng.between(3_000, 25_000)
        };
        self.cut_off(node, lasts);
        true
    }

    /// The node is cut off from NATS for `lasts` ms.
    pub fn cut_off(&mut self, node: usize, lasts: u64) {
        self.agents[node].cut = true;
        let name = self.agents[node].name.clone();
        self.note(format!("{name} is cut off from NATS for {lasts} ms"));
        self.at(lasts, Event::PartitionHeal(node));
    }

    /// The partition heals: the agent's reports are stored at their next retry, its stream
    /// delivers what waited (after the reconciliation's reports, if it restarted meanwhile).
    pub(super) fn heal_node(&mut self, node: usize) {
        self.agents[node].cut = false;
        let name = self.agents[node].name.clone();
        self.note(format!("{name} reaches NATS again"));
        if !self.agents[node].up {
            return;
        }
        let outbox = std::mem::take(&mut self.agents[node].outbox);
        let boot = self.agents[node].boot;
        let mut last = 0;
        for (report, since) in outbox {
            // Retried with a backoff that doubles up to 5 s: the next try comes within what
            // the report waited so far.
            let waited = self.now.saturating_sub(since).clamp(100, 5_000);
            let at = self.rng.between(1, waited);
            last = last.max(at);
            self.at(at, Event::ReportRetry(node, boot, Box::new(report)));
        }
        if self.agents[node].reconciling {
            self.at(last + 1, Event::Reconciled(node, boot));
        } else {
            self.take_inbox(node);
        }
    }

    /// A restarted agent's lost attempts are reported: it takes assignments from now on.
    pub(super) fn reconciled(&mut self, node: usize, boot: u32) {
        let agent = &mut self.agents[node];
        if agent.boot != boot || !agent.reconciling {
            return;
        }
        if !agent.connected() || !agent.outbox.is_empty() {
            // Cut off again before its reports were stored: the next heal goes on.
            return;
        }
        agent.reconciling = false;
        self.take_inbox(node);
    }

    /// The node's stream delivers what it kept, in order.
    fn take_inbox(&mut self, node: usize) {
        let inbox = std::mem::take(&mut self.agents[node].inbox);
        let mut at = 0;
        for message in inbox {
            at += self.rng.between(1, 10);
            self.at(at, Event::ToNode(node, message));
        }
    }
}
