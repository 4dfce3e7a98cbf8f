//! The faults, drawn from the seed: SIGKILL of an agent, a scheduler or a nats-server (started
//! again a few seconds later: a killed scheduler comes back as a new standby); SIGSTOP of any
//! of them, SIGCONT a few seconds later; one of them cut off from all others (its link down),
//! or one way only (what it sends dropped, or what it receives); the cluster split in two
//! halves that each still talk among themselves (the machine, where the CLI runs, with one of
//! them); an agent's or a scheduler's wall clock stepped 2 to 30 s either way (and back); a
//! nats-server's JetStream disk filled (then emptied, and the server restarted, as an operator
//! would), or lost (the server killed, its data removed, and started again on the empty disk).
//! At most one nats-server is hit at a time, and none during a split; the other components may
//! fail together, and a split may leave the CLI's half without a JetStream quorum until it
//! heals. When the campaign ends, every fault is repaired at once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mgpu_tests::Cluster;
use mgpu_tests::netns::OneWay;
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

/// What a fault did, so it can be undone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Done {
    Killed,
    Paused(u32),
    Cut,
    /// Cut one way only (an iptables rule in its namespace).
    CutOneWay(OneWay),
    Split,
    /// An agent's or a scheduler's clock stepped by this many seconds.
    ClockStepped(i64),
    DiskFilled,
    /// A server killed and its JetStream data removed (started again on an empty disk).
    DiskLost,
}

/// A fault in effect, and when it is repaired.
struct Standing {
    target: Target,
    done: Done,
    until: Instant,
}

/// What was injected, by kind and by component.
#[derive(Default)]
pub struct Injected {
    kills: u32,
    pauses: u32,
    partitions: u32,
    one_way_partitions: u32,
    clock_steps: u32,
    disks_filled: u32,
    disks_lost: u32,
    by_target: BTreeMap<&'static str, u32>,
}

impl Injected {
    pub fn counts(&self) -> Value {
        json!({
            "kill": self.kills,
            "pause": self.pauses,
            "partition": self.partitions,
            "partition_one_way": self.one_way_partitions,
            "disk_full": self.disks_filled,
            "disk_lost": self.disks_lost,
            "clock_step": self.clock_steps,
            "by_component": self.by_target,
        })
    }
}

/// Injects faults until `stop`, then repairs them all.
pub fn inject(cluster: &Arc<Mutex<Cluster>>, seed: u64, stop: &AtomicBool) -> Injected {
    let mut draw = Draw::new(seed, 2);
    // Choices added to the fault model later draw from a stream of their own: the first
    // stream's draws (which component, what kind, when) stay what they were for every seed,
    // so the seeds kept for the violations they once found still hit the same components at
    // the same moments.
    let mut refine = Draw::new(seed, 3);
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
        let draws = (&mut draw, &mut refine);
        if let Some(fault) = strike(&mut cluster, draws, &standing, &mut injected) {
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

/// Draws one fault and injects it; None when the one drawn cannot be (its target is down,
/// or it would take a JetStream quorum away).
fn strike(
    cluster: &mut Cluster,
    (draw, refine): (&mut Draw, &mut Draw),
    standing: &[Standing],
    injected: &mut Injected,
) -> Option<Standing> {
    let server_hit = standing
        .iter()
        .any(|s| matches!(s.target, Target::Server(_)));
    let split = standing.iter().any(|s| s.done == Done::Split);
    let schedulers = cluster.scheduler_names();
    let target = match draw.between(1, 10) {
        1..=5 => Target::Agent((*draw.pick(&NODES)).to_owned()),
        6..=8 if schedulers.is_empty() => return None,
        6..=8 => Target::Scheduler(draw.pick(&schedulers).clone()),
        _ if server_hit || split => return None,
        _ => Target::Server(draw.pick(&cluster.nats_server_names()).clone()),
    };
    if standing.iter().any(|s| s.target == target) {
        return None;
    }
    let until = Instant::now() + Duration::from_millis(draw.between(1_000, 6_000));
    let done = match (draw.between(1, 100), &target) {
        (1..=35, _) => Done::Killed,
        (36..=60, _) => Done::Paused(pid_of(cluster, &target)?),
        // Two cuts in five are one way, half of those in each direction.
        (61..=80, _) if refine.chance(40) => Done::CutOneWay(if refine.chance(50) {
            OneWay::Outgoing
        } else {
            OneWay::Incoming
        }),
        (61..=80, _) => Done::Cut,
        (81..=92, Target::Agent(_)) => {
            let step = draw.between(2, 30) as i64;
            Done::ClockStepped(if draw.chance(50) { step } else { -step })
        }
        // One server disk fault in three loses the disk instead of filling it.
        (81..=92, Target::Server(_)) if refine.chance(33) => Done::DiskLost,
        (81..=92, Target::Server(_)) => Done::DiskFilled,
        // A scheduler's clock steps as an agent's does (its draws from the refining stream).
        (81..=92, Target::Scheduler(_)) => {
            let step = refine.between(2, 30) as i64;
            Done::ClockStepped(if refine.chance(50) { step } else { -step })
        }
        _ if split || server_hit => return None,
        _ => Done::Split,
    };
    let kind = match (&target, done) {
        (_, Done::Split) => "cluster_split",
        (Target::Agent(_), _) => "agent",
        (Target::Scheduler(_), _) => "scheduler",
        (Target::Server(_), _) => "nats_server",
    };
    if !inflict(cluster, draw, &target, done) {
        return None;
    }
    *injected.by_target.entry(kind).or_default() += 1;
    match done {
        Done::Killed => injected.kills += 1,
        Done::Paused(_) => injected.pauses += 1,
        Done::Cut | Done::Split => injected.partitions += 1,
        Done::CutOneWay(_) => {
            injected.partitions += 1;
            injected.one_way_partitions += 1;
        }
        Done::ClockStepped(_) => injected.clock_steps += 1,
        Done::DiskFilled => injected.disks_filled += 1,
        Done::DiskLost => injected.disks_lost += 1,
    }
    Some(Standing {
        target,
        done,
        until,
    })
}

/// Does what `done` says to `target`; false when this cluster cannot (no namespaces, no
/// libfaketime, no disk of its own).
fn inflict(cluster: &mut Cluster, draw: &mut Draw, target: &Target, done: Done) -> bool {
    eprintln!("chaos: {done:?} {target:?}");
    match done {
        Done::Killed => match target {
            Target::Agent(name) => cluster.kill_agent(name),
            Target::Scheduler(name) => cluster.kill_scheduler_named(name),
            Target::Server(name) => cluster.kill_nats_server(name),
        },
        Done::Paused(pid) => {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGSTOP);
        }
        Done::Cut => match cluster.net() {
            Some(net) => net.cut(name_of(target)),
            None => return false,
        },
        Done::CutOneWay(way) => match cluster.net() {
            Some(net) => return net.cut_one_way(name_of(target), way),
            None => return false,
        },
        Done::Split => {
            let Some(net) = cluster.net() else {
                return false;
            };
            let names = net.names();
            let mut half: Vec<String> = names.iter().filter(|_| draw.chance(50)).cloned().collect();
            // Two halves, neither empty.
            if half.is_empty() {
                half.push(draw.pick(&names).clone());
            } else if half.len() == names.len() {
                half.pop();
            }
            eprintln!("chaos: split off {half:?}");
            net.split(&half);
        }
        Done::ClockStepped(secs) => return cluster.step_clock(name_of(target), secs),
        Done::DiskFilled => return cluster.fill_jetstream_disk(name_of(target)),
        Done::DiskLost => return cluster.lose_jetstream_disk(name_of(target)),
    }
    true
}

fn name_of(target: &Target) -> &str {
    match target {
        Target::Agent(name) | Target::Scheduler(name) | Target::Server(name) => name,
    }
}

fn pid_of(cluster: &Cluster, target: &Target) -> Option<u32> {
    match target {
        Target::Agent(name) => Some(cluster.agent_pid(name)),
        Target::Scheduler(name) => Some(cluster.scheduler_pid(name)),
        Target::Server(name) => cluster.nats_server_pid(name),
    }
}

/// Thaws a paused component, starts a killed one again, heals a cut link, joins the halves,
/// steps a clock back, empties a disk and restarts its server.
fn repair(cluster: &mut Cluster, fault: Standing) {
    let name = name_of(&fault.target);
    match fault.done {
        Done::Paused(pid) => {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
        }
        Done::Cut | Done::CutOneWay(_) => {
            if let Some(net) = cluster.net() {
                net.heal(name);
            }
        }
        Done::Split => {
            if let Some(net) = cluster.net() {
                net.join();
            }
        }
        Done::ClockStepped(_) => {
            cluster.step_clock(name, 0);
        }
        Done::DiskFilled => {
            cluster.empty_jetstream_disk(name);
            // A server whose writes failed for want of space turns JetStream off until it
            // starts again.
            cluster.kill_nats_server(name);
            cluster.restart_nats_server(name);
        }
        Done::DiskLost => cluster.restart_nats_server(name),
        Done::Killed => match &fault.target {
            Target::Agent(name) => cluster.start_agent(name),
            Target::Scheduler(_) => {
                cluster.start_standby_scheduler();
            }
            Target::Server(name) => cluster.restart_nats_server(name),
        },
    }
}
