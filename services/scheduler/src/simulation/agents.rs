//! Simulated node agents, kept to what the real agent (`services/node-agent/src`) does:
//! - an assignment starts its attempt unless this agent already ran it (its running table
//!   remembers finished attempts, `running.rs`; a restarted agent remembers nothing), and is
//!   reported `started`; the process runs for a drawn time and exits with a drawn code;
//! - a stop (a kill, the hard time limit, fencing) sends SIGTERM: most processes end within
//!   300 ms, one in ten ignores it and gets SIGKILL once the node's kill grace has passed; the
//!   first reason given is the one reported, whatever ends the process (`stopping.rs`);
//! - self-fencing (`fence.rs`): every `--fence-after / 4` (50 ms to 1 s) the agent looks at
//!   when its last stored heartbeat was taken, and past `--fence-after` it stops every job,
//!   which is reported `lost`; each job's guard looks at the same time on its own, so every
//!   process alive `--fence-after` after the last stored heartbeat is stopped right then, and
//!   reported `lost` too (`guard.rs`, `GuardFence::lapsed`);
//! - an attempt stays in the running table, so in heartbeats, until its exit report is stored
//!   (`job.rs`); a report is retried until JetStream stores it (`report.rs`), so a node cut off
//!   keeps its reports until it heals, and its stream keeps what is sent to it;
//! - a crash kills every process (their guards die with them) and the agent's memory; the
//!   state file survives, so the restarted agent reports every attempt of its table lost
//!   (`reconcile.rs`) before it takes assignments, and does not run again the last attempts
//!   that ended before the crash (`state_file.rs`: an assignment whose acknowledgement was
//!   lost comes back to it).

use std::collections::{BTreeMap, BTreeSet};

use mgpu_protocol::Timestamp;
use mgpu_protocol::assign::NodeControl;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::report::{AgentReport, Exit, ReportKind};

use super::rng::Rng;

/// Ended attempts a node's state file keeps, as the real agent's does.
const ENDED_KEPT: usize = 256;

/// One attempt of a job: what the running table is keyed by.
pub type Attempt = (JobId, u32);

/// What travels to a node through its stream.
#[derive(Clone, Debug)]
pub enum NodeMessage {
    Assign {
        job: JobId,
        attempt: u32,
        rank: u32,
        /// The hard limit the agent enforces (`agent_limit_secs`), if any.
        time_limit_ms: Option<u64>,
        /// How many times the node's assignments had been purged when it was stored: one
        /// stored before a later purge is gone from the stream.
        purges_before: u32,
    },
    Control(NodeControl),
}

/// Why the agent stops a process (`running::StopReason`, and the time limit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopWhy {
    TimeLimit,
    Cancelled,
    Requeued,
    Fenced,
}

/// One attempt's process on a node.
#[derive(Clone, Debug)]
pub struct Process {
    /// When it exits by itself (simulated milliseconds), and with which code.
    pub ends_at: u64,
    pub exit_code: i32,
    pub time_limit_at: Option<u64>,
    /// A stop under way: why, when the process is gone, and the signal that ends it.
    pub stopping: Option<(StopWhy, u64, i32)>,
    /// Warned (a preemption's signal): SIGTERM comes then, unless a cancel, a fence or its
    /// time limit stops it sooner.
    pub warned_until: Option<u64>,
    /// When it started, and whether its GPUs sit idle all along (a forgotten notebook).
    pub started_at: u64,
    pub idle: bool,
}

impl Process {
    /// What its agent measures of its idleness at `now` (one GPU counted).
    pub fn idle_sample(&self, now: u64) -> mgpu_protocol::idle::IdleSample {
        let secs = now.saturating_sub(self.started_at) / 1000;
        match self.idle {
            true => mgpu_protocol::idle::IdleSample {
                idle_for_secs: secs,
                idle_gpu_secs: secs,
            },
            false => mgpu_protocol::idle::IdleSample::default(),
        }
    }
}

impl Process {
    /// When the process is gone (by itself, or stopped).
    pub fn gone_at(&self) -> u64 {
        match self.stopping {
            Some((_, at, _)) => at.min(self.ends_at),
            None => self.ends_at,
        }
    }

    /// How it ended, as the agent reports it.
    fn exit(&self) -> Exit {
        let (exit_code, signal) = match self.stopping {
            Some((_, at, signal)) if at < self.ends_at => (128 + signal, Some(signal)),
            _ => (self.exit_code, None),
        };
        let why = self.stopping.map(|(why, _, _)| why);
        Exit {
            exit_code,
            signal,
            cancelled: why == Some(StopWhy::Cancelled),
            timed_out: why == Some(StopWhy::TimeLimit),
            preempted: why == Some(StopWhy::Requeued),
            lost: why == Some(StopWhy::Fenced),
            ..Exit::default()
        }
    }
}

/// A node's agent.
#[derive(Debug)]
pub struct SimAgent {
    pub name: String,
    pub gpus: u32,
    pub memory_mib: u64,
    /// The type of each of its GPUs, and the node's features.
    pub gpu_type: String,
    pub features: Vec<String>,
    /// `--fence-after` and `--kill-grace`, announced in every heartbeat.
    pub fence_after_ms: u64,
    pub kill_grace_ms: u64,
    /// False while crashed.
    pub up: bool,
    /// True while cut off from NATS (a network partition).
    pub cut: bool,
    /// Counts the agent's starts: a retry of a report by an agent that died since is dropped.
    pub boot: u32,
    /// When the last heartbeat JetStream stored was taken (the fence counts from it).
    pub last_stored: u64,
    pub processes: BTreeMap<Attempt, Process>,
    /// The running table: every attempt from its start until its exit report is stored.
    pub table: BTreeSet<Attempt>,
    /// Attempts this agent started since it started: an assignment for one is not run again.
    pub ran: BTreeSet<Attempt>,
    /// The last attempts whose exit was stored (or that were reported lost), oldest first, as
    /// the state file keeps them across crashes (`ENDED_KEPT` in the agent's `state_file.rs`).
    pub ended: std::collections::VecDeque<Attempt>,
    /// Reports not stored yet, each with when it was first tried.
    pub outbox: Vec<(AgentReport, u64)>,
    /// What the node's stream holds for it while the agent cannot take it.
    pub inbox: Vec<NodeMessage>,
    /// Restarted while cut off: assignments wait until its lost attempts are reported.
    pub reconciling: bool,
    /// How many times the scheduler purged the assignments waiting for this node.
    pub purges: u32,
    /// Invariants its kills broke (the world hands them to the ledger).
    pub broken: Vec<String>,
    /// When the last message stored on the node's stream reaches the agent: its assignments
    /// and controls share one stream and one consumer, so none overtakes one stored before.
    pub stream_tail: u64,
}

impl SimAgent {
    pub fn new(name: String, gpus: u32, fence_after_ms: u64, kill_grace_ms: u64) -> Self {
        SimAgent {
            name,
            gpus,
            memory_mib: 81_920,
            gpu_type: "a100".into(),
            features: Vec::new(),
            fence_after_ms,
            kill_grace_ms,
            up: true,
            cut: false,
            boot: 0,
            last_stored: 0,
            processes: BTreeMap::new(),
            table: BTreeSet::new(),
            ran: BTreeSet::new(),
            ended: std::collections::VecDeque::new(),
            outbox: Vec::new(),
            inbox: Vec::new(),
            reconciling: false,
            purges: 0,
            broken: Vec::new(),
            stream_tail: 0,
        }
    }

    /// Whether the agent runs and reaches NATS.
    pub fn connected(&self) -> bool {
        self.up && !self.cut
    }

    /// How often the fence watch looks (`fence::watch`).
    pub fn fence_check_every(&self) -> u64 {
        (self.fence_after_ms / 4).clamp(50, 1_000)
    }

    /// An assignment arrived: the attempt starts unless this agent already ran it. The report
    /// to publish, if any.
    pub fn assign(
        &mut self,
        job: &JobId,
        attempt: u32,
        time_limit_ms: Option<u64>,
        now: u64,
        rng: &mut Rng,
    ) -> Option<ReportKind> {
        let key = (job.clone(), attempt);
        if !self.up || !self.ran.insert(key.clone()) {
            return None;
        }
        self.table.insert(key.clone());
        // A quarter of the jobs sit idle, and long enough to be warned and reclaimed.
        let idle = rng.chance(250);
        let runs_for = match idle {
            true => rng.between(8_000, 30_000),
            false => rng.between(200, 20_000),
        };
        let exit_code = if rng.chance(150) { 1 } else { 0 };
        self.processes.insert(
            key,
            Process {
                ends_at: now + runs_for,
                exit_code,
                time_limit_at: time_limit_ms.map(|limit| now + limit),
                stopping: None,
                warned_until: None,
                started_at: now,
                idle,
            },
        );
        Some(ReportKind::Started {
            pid: 1000 + attempt,
        })
    }

    /// A kill from the scheduler: the attempt it names is stopped, if it runs here; warned
    /// first and stopped at the grace's end when the kill carries a warning. A requeue without
    /// a warning must not cut a warned process's grace short (`broken` says so).
    pub fn kill(&mut self, control: &NodeControl, now: u64, rng: &mut Rng) {
        let NodeControl::Kill {
            job_id,
            attempt,
            requeue,
            warning,
            ..
        } = control;
        let key = (job_id.clone(), *attempt);
        let why = if *requeue {
            StopWhy::Requeued
        } else {
            StopWhy::Cancelled
        };
        if let Some(warning) = warning {
            self.warn(&key, why, warning.grace_secs.saturating_mul(1000), now, rng);
            return;
        }
        let warned = self
            .processes
            .get(&key)
            .and_then(|p| p.warned_until)
            .is_some_and(|until| now < until);
        if warned && *requeue {
            self.broken.push(format!(
                "a preempted job's grace cut short: {} attempt {attempt} got a requeue with no \
                 warning",
                job_id.short()
            ));
            return;
        }
        self.stop(&key, why, now, rng);
    }

    /// A warning: the process is stopped `grace_ms` from `now` (SIGTERM then), or exits by
    /// itself before, reported stopped for `why` all the same (it saved its work and left).
    /// Nothing changes for a process already being stopped or warned.
    fn warn(&mut self, key: &Attempt, why: StopWhy, grace_ms: u64, now: u64, rng: &mut Rng) {
        let Some(process) = self.processes.get_mut(key) else {
            return;
        };
        if process.stopping.is_some() {
            return;
        }
        let term_at = now + grace_ms;
        if process.ends_at <= term_at {
            process.stopping = Some((why, process.ends_at, 0));
        } else {
            self.stop(key, why, term_at, rng);
        }
        if let Some(process) = self.processes.get_mut(key) {
            process.warned_until = Some(term_at);
        }
    }

    /// Stops a process at `at` (SIGTERM, then SIGKILL after the kill grace). False when it
    /// does not run, is gone by then, or is already being stopped (the first reason sticks).
    pub fn stop(&mut self, key: &Attempt, why: StopWhy, at: u64, rng: &mut Rng) -> bool {
        let grace = self.kill_grace_ms;
        let Some(process) = self.processes.get_mut(key) else {
            return false;
        };
        // A warned process is stopped sooner by a cancel, a fence or its time limit.
        let hurried = process.warned_until.is_some_and(|until| at < until);
        if (process.stopping.is_some() && !hurried) || process.ends_at <= at {
            return false;
        }
        let why = process.stopping.map_or(why, |(first, _, _)| first);
        process.warned_until = None;
        // Most jobs end soon after SIGTERM; one in ten ignores it until SIGKILL.
        let reacts_in = (!rng.chance(100)).then(|| rng.between(10, 300));
        let (gone_at, signal) = match reacts_in {
            Some(delay) if delay <= grace => (at + delay, 15),
            _ => (at + grace + rng.between(0, 50), 9),
        };
        process.stopping = Some((why, gone_at, signal));
        true
    }

    /// The fence watch looks: with no heartbeat stored for `--fence-after`, every job is
    /// stopped. How many were (by their guards, at the fence's time, or by the agent now).
    pub fn fence(&mut self, now: u64, rng: &mut Rng) -> usize {
        let by_guards = self.guards_fence(now, rng);
        if !self.up || now.saturating_sub(self.last_stored) < self.fence_after_ms {
            return by_guards;
        }
        let keys: Vec<Attempt> = self.processes.keys().cloned().collect();
        by_guards
            + keys
                .iter()
                .filter(|key| self.stop(key, StopWhy::Fenced, now, rng))
                .count()
    }

    /// The job guards' fence, caught up to `now`: each guard watches the contact file itself,
    /// so a process alive `--fence-after` after the last stored heartbeat (or started later,
    /// with no heartbeat stored since) is stopped at that moment, before the agent's own look.
    /// Applied whenever the agent is looked at, so that moment is never missed. How many.
    fn guards_fence(&mut self, now: u64, rng: &mut Rng) -> usize {
        let fence_at = self.last_stored + self.fence_after_ms;
        if !self.up || now < fence_at {
            return 0;
        }
        let keys: Vec<(Attempt, u64)> = self
            .processes
            .iter()
            .map(|(key, process)| (key.clone(), fence_at.max(process.started_at)))
            .collect();
        keys.iter()
            .filter(|(key, at)| self.stop(key, StopWhy::Fenced, *at, rng))
            .count()
    }

    /// JetStream stored a heartbeat taken `now`: the fence counts from it (the guards' fence
    /// caught up first, as they saw the contact file before it was touched).
    pub fn heartbeat_stored(&mut self, now: u64, rng: &mut Rng) {
        self.guards_fence(now, rng);
        self.last_stored = now;
    }

    /// The processes gone by `now` (hard time limits reached first), with how they ended,
    /// taken off the node; their attempts stay in the table until reported.
    pub fn ended(&mut self, now: u64, rng: &mut Rng) -> Vec<(JobId, u32, Exit)> {
        self.guards_fence(now, rng);
        let timed_out: Vec<(Attempt, u64)> = self
            .processes
            .iter()
            .filter_map(|(key, p)| {
                let at = p.time_limit_at.filter(|at| *at <= now)?;
                p.stopping.is_none().then(|| (key.clone(), at))
            })
            .collect();
        for (key, at) in timed_out {
            self.stop(&key, StopWhy::TimeLimit, at, rng);
        }
        let done: Vec<Attempt> = self
            .processes
            .iter()
            .filter(|(_, p)| p.gone_at() <= now)
            .map(|(key, _)| key.clone())
            .collect();
        done.into_iter()
            .filter_map(|key| {
                let process = self.processes.remove(&key)?;
                Some((key.0, key.1, process.exit()))
            })
            .collect()
    }

    /// Live processes of `job` at `now` other than `attempt`'s.
    pub fn other_attempts(&self, job: &JobId, attempt: u32, now: u64) -> Vec<u32> {
        self.processes
            .range((job.clone(), 0)..=(job.clone(), u32::MAX))
            .filter(|((_, a), p)| *a != attempt && p.gone_at() > now)
            .map(|((_, a), _)| *a)
            .collect()
    }

    /// A report was stored: an exited attempt leaves the table (and the heartbeats).
    pub fn stored(&mut self, report: &AgentReport) {
        if matches!(report.kind, ReportKind::Exited(_)) {
            let attempt = (report.job.clone(), report.attempt);
            if self.table.remove(&attempt) {
                self.remember_ended(attempt);
            }
        }
    }

    /// The state file keeps an ended attempt, the last [`ENDED_KEPT`] of them.
    fn remember_ended(&mut self, attempt: Attempt) {
        self.ended.push_back(attempt);
        while self.ended.len() > ENDED_KEPT {
            self.ended.pop_front();
        }
    }

    /// The node crashes: every process dies, and the agent's memory with it. The attempts
    /// its state file still lists.
    pub fn crash(&mut self) -> Vec<Attempt> {
        self.up = false;
        self.reconciling = false;
        self.processes.clear();
        self.outbox.clear();
        self.ran.clear();
        std::mem::take(&mut self.table).into_iter().collect()
    }

    /// The agent starts again (`now`, wall clock `at`): the attempts it had (`lost`) are
    /// reported lost, before it takes assignments.
    pub fn restart(&mut self, lost: &[Attempt], at: Timestamp, now: u64) -> Vec<AgentReport> {
        self.up = true;
        self.boot += 1;
        // The state file remembers them, and the attempts that ended before the crash: an
        // assignment for one delivered again (its acknowledgement lost) is ignored.
        self.ran.extend(lost.iter().cloned());
        self.ran.extend(self.ended.iter().cloned());
        for attempt in lost {
            self.remember_ended(attempt.clone());
        }
        // `Contact::new`: the fence counts from the agent's start.
        self.last_stored = now;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn job(n: u64) -> JobId {
        format!("{n:032x}")
            .parse()
            .unwrap_or_else(|e| panic!("job id: {e:?}"))
    }

    #[test]
    fn a_stop_ends_the_job_within_the_kill_grace_and_keeps_its_first_reason() {
        let mut rng = Rng::new(5);
        for _ in 0..200 {
            let mut agent = SimAgent::new("n".into(), 1, 3_000, 1_500);
            assert!(agent.assign(&job(1), 1, None, 0, &mut rng).is_some());
            if let Some(p) = agent.processes.values_mut().next() {
                p.ends_at = 100_000;
            }
            assert!(agent.stop(&(job(1), 1), StopWhy::Requeued, 10, &mut rng));
            assert!(!agent.stop(&(job(1), 1), StopWhy::Cancelled, 20, &mut rng));
            let ended = agent.ended(10 + 1_500 + 50, &mut rng);
            assert_eq!(ended.len(), 1, "gone by the grace and a slow SIGKILL");
            let exit = &ended[0].2;
            assert!(exit.preempted && !exit.cancelled);
            assert!(matches!(exit.signal, Some(15 | 9)));
            assert!(agent.table.contains(&(job(1), 1)), "listed until reported");
        }
    }

    #[test]
    fn the_fence_stops_every_job_once_no_heartbeat_was_stored_for_fence_after() {
        let mut rng = Rng::new(9);
        let mut agent = SimAgent::new("n".into(), 2, 3_000, 0);
        agent.assign(&job(1), 1, None, 0, &mut rng);
        agent.assign(&job(2), 1, None, 0, &mut rng);
        for p in agent.processes.values_mut() {
            p.ends_at = 100_000;
        }
        agent.last_stored = 1_000;
        assert_eq!(agent.fence(3_999, &mut rng), 0);
        assert_eq!(agent.fence(4_000, &mut rng), 2);
        let ended = agent.ended(4_100, &mut rng);
        assert_eq!(ended.len(), 2);
        assert!(ended.iter().all(|(_, _, exit)| exit.lost));
    }

    #[test]
    fn the_guards_stop_a_job_at_the_fence_time_though_the_agent_looks_later() {
        let mut rng = Rng::new(3);
        let mut agent = SimAgent::new("n".into(), 1, 3_000, 1_500);
        agent.assign(&job(1), 1, None, 0, &mut rng);
        if let Some(p) = agent.processes.values_mut().next() {
            // It would end by itself, with success, between the fence and the agent's look.
            p.ends_at = 3_500;
            p.exit_code = 0;
        }
        agent.last_stored = 0;
        let ended = agent.ended(4_000, &mut rng);
        assert_eq!(ended.len(), 1);
        let exit = &ended[0].2;
        assert!(exit.lost, "its guard stopped it at 3 000 ms: {exit:?}");
        // A heartbeat stored late still lets the guards' fence catch up first.
        agent.assign(&job(2), 1, None, 4_000, &mut rng);
        if let Some(p) = agent.processes.values_mut().next() {
            p.ends_at = 100_000;
        }
        agent.heartbeat_stored(4_050, &mut rng);
        assert!(agent.processes.values().all(|p| p.stopping.is_some()));
    }

    #[test]
    fn a_restarted_agent_reports_its_table_lost_and_runs_none_of_it_again() {
        let mut rng = Rng::new(1);
        let mut agent = SimAgent::new("n".into(), 1, 3_000, 0);
        agent.assign(&job(1), 1, None, 0, &mut rng);
        assert!(agent.assign(&job(1), 1, None, 5, &mut rng).is_none());
        let lost = agent.crash();
        assert_eq!(lost, vec![(job(1), 1)]);
        let at = chrono::DateTime::from_timestamp(0, 0).unwrap_or_default();
        let reports = agent.restart(&lost, at, 50);
        assert!(matches!(&reports[0].kind, ReportKind::Exited(e) if e.lost));
        assert!(agent.processes.is_empty());
        // Its assignment, delivered again (unacknowledged when the agent died), is ignored.
        assert!(agent.assign(&job(1), 1, None, 60, &mut rng).is_none());
        assert!(agent.assign(&job(1), 2, None, 60, &mut rng).is_some());
    }

    #[test]
    fn an_attempt_that_ended_before_a_crash_is_not_run_again_by_the_next_agent() {
        let mut rng = Rng::new(2);
        let mut agent = SimAgent::new("n".into(), 1, 3_000, 0);
        assert!(agent.assign(&job(7), 1, None, 0, &mut rng).is_some());
        let at = chrono::DateTime::from_timestamp(0, 0).unwrap_or_default();
        let exited = AgentReport {
            job: job(7),
            attempt: 1,
            node: "n".into(),
            at,
            kind: ReportKind::Exited(Exit::default()),
        };
        agent.stored(&exited);
        let lost = agent.crash();
        assert!(lost.is_empty());
        agent.restart(&lost, at, 50);
        // Its acknowledgement was lost: the assignment comes back, and is not run twice.
        assert!(agent.assign(&job(7), 1, None, 60, &mut rng).is_none());
    }
}
