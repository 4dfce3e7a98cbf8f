//! Simulated node agents, kept to what the real agent does: an assignment starts its
//! attempt once (an attempt already run is never started again) and is reported `started`;
//! the process runs for a drawn time and exits with a drawn code; a kill stops the attempt
//! it names (after a drawn delay when the process hangs on its kill) and is reported with
//! how it ended; the agent heartbeats the attempts it runs. A crash kills every process (its
//! guards die with it) and silences the node; on restart the agent reports each attempt it
//! had as lost before it heartbeats again.

use std::collections::{BTreeMap, BTreeSet};

use mgpu_protocol::ids::JobId;
use mgpu_protocol::report::{AgentReport, Exit, ReportKind};

use super::rng::Rng;

/// One attempt's process on a node.
#[derive(Clone, Debug)]
pub struct Process {
    /// When it exits by itself (simulated milliseconds).
    pub ends_at: u64,
    pub exit_code: i32,
    /// A kill that is taking effect: when it ends, and as what.
    pub stopping: Option<(u64, Exit)>,
}

/// A node's agent.
#[derive(Debug)]
pub struct SimAgent {
    pub name: String,
    pub gpus: u32,
    pub memory_mib: u64,
    /// False while crashed.
    pub up: bool,
    pub processes: BTreeMap<(JobId, u32), Process>,
    /// Attempts this node ever started: an assignment for one is not started again.
    pub started: BTreeSet<(JobId, u32)>,
    /// Assignment message ids already taken (the node's stream drops a copy).
    pub seen_msg_ids: BTreeSet<String>,
}

impl SimAgent {
    pub fn new(name: String, gpus: u32) -> Self {
        SimAgent {
            name,
            gpus,
            memory_mib: 81_920,
            up: true,
            processes: BTreeMap::new(),
            started: BTreeSet::new(),
            seen_msg_ids: BTreeSet::new(),
        }
    }

    /// An assignment arrived: the attempt starts unless this node already ran it. The
    /// report to publish, if any.
    pub fn assign(
        &mut self,
        job: &JobId,
        attempt: u32,
        now: u64,
        rng: &mut Rng,
    ) -> Option<ReportKind> {
        let key = (job.clone(), attempt);
        if !self.up || self.started.contains(&key) {
            return None;
        }
        self.started.insert(key.clone());
        let runs_for = rng.between(200, 20_000);
        let exit_code = if rng.chance(150) { 1 } else { 0 };
        self.processes.insert(
            key,
            Process {
                ends_at: now + runs_for,
                exit_code,
                stopping: None,
            },
        );
        Some(ReportKind::Started {
            pid: 1000 + attempt,
        })
    }

    /// A kill for `attempt` of `job`: it takes effect after a short delay, or a long one when
    /// the process hangs on its kill.
    pub fn kill(&mut self, job: &JobId, attempt: u32, requeue: bool, now: u64, rng: &mut Rng) {
        let Some(process) = self.processes.get_mut(&(job.clone(), attempt)) else {
            return;
        };
        if process.stopping.is_some() {
            return;
        }
        let delay = if rng.chance(100) {
            rng.between(2_000, 12_000)
        } else {
            rng.between(10, 300)
        };
        let exit = Exit {
            exit_code: 143,
            signal: Some(15),
            cancelled: !requeue,
            preempted: requeue,
            ..Exit::default()
        };
        process.stopping = Some((now + delay, exit));
    }

    /// The processes that end by `now`, with how, taken off the node.
    pub fn ended(&mut self, now: u64) -> Vec<(JobId, u32, Exit)> {
        let done: Vec<(JobId, u32)> = self
            .processes
            .iter()
            .filter(|(_, p)| {
                p.ends_at <= now || p.stopping.as_ref().is_some_and(|(at, _)| *at <= now)
            })
            .map(|(key, _)| key.clone())
            .collect();
        let mut ended = Vec::new();
        for key in done {
            if let Some(process) = self.processes.remove(&key) {
                let exit = match process.stopping {
                    Some((at, exit)) if at <= now => exit,
                    _ => Exit {
                        exit_code: process.exit_code,
                        ..Exit::default()
                    },
                };
                ended.push((key.0, key.1, exit));
            }
        }
        ended
    }

    /// The node crashes: every process dies with it.
    pub fn crash(&mut self) -> Vec<(JobId, u32)> {
        self.up = false;
        std::mem::take(&mut self.processes).into_keys().collect()
    }

    /// The agent comes back: the attempts it had (`lost`) are reported lost.
    pub fn restart(
        &mut self,
        lost: &[(JobId, u32)],
        at: mgpu_protocol::Timestamp,
    ) -> Vec<AgentReport> {
        self.up = true;
        lost.iter()
            .map(|(job, attempt)| AgentReport {
                job: job.clone(),
                attempt: *attempt,
                node: self.name.clone(),
                at,
                kind: ReportKind::Exited(Exit {
                    exit_code: -1,
                    lost: true,
                    ..Exit::default()
                }),
            })
            .collect()
    }
}
