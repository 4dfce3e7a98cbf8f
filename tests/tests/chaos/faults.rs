//! The faults, drawn from the seed: SIGKILL of an agent, a scheduler or a nats-server (started
//! again a few seconds later: a killed scheduler comes back as a new standby), and SIGSTOP of
//! any of them, SIGCONT a few seconds later. At most one nats-server is down or paused at a
//! time, so the JetStream cluster keeps its quorum; the other components may fail together.
//! When the campaign ends, every fault is repaired at once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mgpu_tests::Cluster;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::NODES;
use crate::draw::Draw;

/// A component the faults hit.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Target {
    Agent(String),
    Scheduler(String),
    Server(String),
}

/// A fault in effect, and when it is repaired.
struct Standing {
    target: Target,
    paused: Option<u32>,
    until: Instant,
}

/// How many faults of each kind were injected.
#[derive(Default)]
pub struct Injected {
    kills: u32,
    pauses: u32,
    by_target: BTreeMap<&'static str, u32>,
}

impl Injected {
    pub fn counts(&self) -> Value {
        json!({
            "kill": self.kills,
            "pause": self.pauses,
            "partition": 0,
            "disk_full": 0,
            "clock_step": 0,
            "by_component": self.by_target,
        })
    }
}

/// Injects faults until `stop`, then repairs them all.
pub fn inject(cluster: &Arc<Mutex<Cluster>>, seed: u64, stop: &AtomicBool) -> Injected {
    let mut draw = Draw::new(seed, 2);
    let mut injected = Injected::default();
    let mut standing: Vec<Standing> = Vec::new();
    let mut next = Instant::now() + Duration::from_millis(draw.between(2_000, 5_000));
    while !stop.load(Ordering::SeqCst) && !crate::INTERRUPTED.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
        let mut cluster = lock(cluster);
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = standing.drain(..).partition(|s| s.until <= now);
        standing = later;
        for fault in due {
            repair(&mut cluster, fault);
        }
        if now < next {
            continue;
        }
        next = now + Duration::from_millis(draw.between(1_500, 5_000));
        if let Some(fault) = strike(&mut cluster, &mut draw, &standing, &mut injected) {
            standing.push(fault);
        }
    }
    let mut cluster = lock(cluster);
    for fault in standing {
        repair(&mut cluster, fault);
    }
    injected
}

fn lock(cluster: &Arc<Mutex<Cluster>>) -> std::sync::MutexGuard<'_, Cluster> {
    cluster
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Draws one fault and injects it; None when the one drawn cannot be (its target is down).
fn strike(
    cluster: &mut Cluster,
    draw: &mut Draw,
    standing: &[Standing],
    injected: &mut Injected,
) -> Option<Standing> {
    let hit = |target: &Target| standing.iter().any(|s| &s.target == target);
    let server_hit = standing
        .iter()
        .any(|s| matches!(s.target, Target::Server(_)));
    let schedulers = cluster.scheduler_names();
    let target = match draw.between(1, 10) {
        1..=5 => Target::Agent((*draw.pick(&NODES)).to_owned()),
        6..=8 if schedulers.is_empty() => return None,
        6..=8 => Target::Scheduler(draw.pick(&schedulers).clone()),
        _ if server_hit => return None,
        _ => Target::Server(draw.pick(&cluster.nats_server_names()).clone()),
    };
    if hit(&target) {
        return None;
    }
    let pid = pid_of(cluster, &target)?;
    let pause = draw.chance(40);
    let until = Instant::now() + Duration::from_millis(draw.between(1_000, 6_000));
    let kind = match &target {
        Target::Agent(_) => "agent",
        Target::Scheduler(_) => "scheduler",
        Target::Server(_) => "nats_server",
    };
    *injected.by_target.entry(kind).or_default() += 1;
    eprintln!("chaos: {} {target:?}", if pause { "pause" } else { "kill" });
    if pause {
        injected.pauses += 1;
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGSTOP);
        return Some(Standing {
            target,
            paused: Some(pid),
            until,
        });
    }
    injected.kills += 1;
    match &target {
        Target::Agent(name) => cluster.kill_agent(name),
        Target::Scheduler(name) => cluster.kill_scheduler_named(name),
        Target::Server(name) => cluster.kill_nats_server(name),
    }
    Some(Standing {
        target,
        paused: None,
        until,
    })
}

fn pid_of(cluster: &Cluster, target: &Target) -> Option<u32> {
    match target {
        Target::Agent(name) => Some(cluster.agent_pid(name)),
        Target::Scheduler(name) => Some(cluster.scheduler_pid(name)),
        Target::Server(name) => cluster.nats_server_pid(name),
    }
}

/// Thaws a paused component, or starts a killed one again.
fn repair(cluster: &mut Cluster, fault: Standing) {
    if let Some(pid) = fault.paused {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
        return;
    }
    match &fault.target {
        Target::Agent(name) => cluster.start_agent(name),
        Target::Scheduler(_) => {
            cluster.start_standby_scheduler();
        }
        Target::Server(name) => cluster.restart_nats_server(name),
    }
}
