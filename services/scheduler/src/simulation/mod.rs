//! A deterministic simulation of a whole cluster in one process, with no NATS and no real
//! time: the real scheduler state machine ([`crate::machine::SchedulerState`]) with a
//! simulated store (compare-and-set, failed writes, another writer), simulated agents (jobs
//! that start, run for a drawn time, exit with a drawn code, hang on their kill until the
//! kill grace ends, fence themselves when cut off), a simulated bus (delayed, reordered and
//! duplicated messages, lost acknowledgements, dropped heartbeats), node crashes and
//! restarts, network partitions, scheduler crashes with a standby taking over from the store,
//! a scheduler stalled past its lease waking after a standby took over, clock steps, and users who submit (single jobs, arrays, multi-node jobs), cancel, hold and
//! release, and an admin who drains nodes, pauses GPUs and edits the limits and principals.
//!
//! Everything is drawn from one seed: [`run`] with the same seed and options does the same
//! thing, step for step (every collection whose order reaches a decision is ordered). The
//! invariants are checked as things happen ([`ledger`]) and after every step ([`checks`]); a
//! run ends with a quiet period (no faults, no new work, holds released, drains and pauses
//! resumed, limits restored) after which every job must have ended.
//!
//! Every fault a run draws is numbered in draw order (fault #1, #2, …; the trace shows each one
//! that happens as `fault #N: what`), and [`Options::skip_faults`] suppresses single faults by
//! number. A failing seed is reported with the shortest failing run found: [`shrink`] turns
//! fault kinds off one at a time, then suppresses single faults by delta debugging, keeping
//! each step while the run still breaks the same invariant; its options replay that run
//! exactly (`mgpu-simulate --skip-faults`). Suppressing a fault moves every draw after it, so
//! a shrunk run's faults are not all causes of the failure.
//!
//! # Layout
//! - [`world`]: the cluster's state, clock and events; [`driving`]: the simulator's part of
//!   the driver (`intake`: its requests and reports); [`nodes`]: heartbeats, agents' messages, crashes and partitions.
//! - [`store`]; [`streams`]; [`agents`].
//! - [`workload`]: what users do; [`admin`]: what the admin does; [`faults`]: what goes
//!   wrong; [`stall`]: a scheduler stopped and woken; [`ledger`] and [`checks`]: the invariants
//!   (`environments`: an array's environment, stored once, outlives every task that needs it).
//! - [`rng`]: the one source of chance; [`shrinking`]: the shortest failing run of a seed.
//! - `scenarios` (tests): each part on a cluster built by hand.

pub mod admin;
pub mod agents;
mod bookings;
pub mod checks;
pub mod driving;
mod environments;
pub mod faults;
pub mod finality;
pub mod gate;
pub mod idle_checks;
mod intake;
pub mod ledger;
pub mod nodes;
mod plan_checks;
pub mod preemption_checks;
mod priority_checks;
pub mod rng;
#[cfg(test)]
mod scenarios;
pub mod shrinking;
mod slice_checks;
pub mod stall;
pub mod store;
pub mod streams;
mod verdict_checks;
pub mod workload;
pub mod world;
pub mod writes;

use std::collections::BTreeSet;

pub use shrinking::{Shrunk, shrink, violation_kind};
use world::World;

/// How often things go wrong, per mille, and how long a run lasts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Simulated seconds of work and faults, then the quiet period.
    pub active_secs: u64,
    /// Simulated seconds the quiet period may last at most.
    pub quiet_secs: u64,
    /// Per fault draw (every 0.2 to 3 s).
    pub node_crash: u64,
    /// A node cut off from NATS for 0.5 to 25 s.
    pub partition: u64,
    pub scheduler_crash: u64,
    /// The active scheduler stalled for 0.5 to 8 s (a standby takes over after 3 s).
    pub scheduler_stall: u64,
    pub other_writer: u64,
    pub clock_step: u64,
    /// Per write, acknowledgement, message and heartbeat.
    pub write_failure: u64,
    pub ack_lost: u64,
    pub duplicate: u64,
    pub delay: u64,
    pub heartbeat_drop: u64,
    /// Per fault draw: a copy of an earlier request published again (a replay).
    pub replay: u64,
    /// Whether a stalled scheduler that wakes past its lease acts on what it pulls all the
    /// same (the driver without its lease gate): only for the test that shows what follows.
    pub acts_without_lease: bool,
    /// Whether the machine's log lines go into the trace.
    pub trace_logs: bool,
    /// How many of the last trace lines a failing seed prints.
    pub trace_lines: usize,
    /// Faults that do not happen, by ordinal: the run's Nth fault (numbered in draw order,
    /// suppressed ones included) is suppressed when N is here. Its draw is made all the same,
    /// so the run is the same up to it; what follows may differ, and later ordinals may then
    /// be other faults. Shrinking fills it; `mgpu-simulate --skip-faults` replays it.
    pub skip_faults: BTreeSet<u64>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            active_secs: 120,
            quiet_secs: 900,
            node_crash: 60,
            partition: 50,
            scheduler_crash: 40,
            scheduler_stall: 30,
            other_writer: 60,
            clock_step: 40,
            write_failure: 10,
            ack_lost: 20,
            duplicate: 30,
            delay: 50,
            heartbeat_drop: 5,
            replay: 20,
            acts_without_lease: false,
            trace_logs: false,
            trace_lines: 200,
            skip_faults: BTreeSet::new(),
        }
    }
}

/// How one run went.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub seed: u64,
    pub jobs: u64,
    pub faults: u64,
    pub steps: u64,
    /// Partitions drawn, and jobs started (multi-node ones, array tasks).
    pub partitions: u64,
    pub starts: u64,
    pub gang_starts: u64,
    pub array_starts: u64,
    /// Attempts preempted for a job of a class that may preempt.
    pub preemptions: u64,
    /// Waits recorded for a preferred GPU type expected free soon.
    pub preferred_type_waits: u64,
    /// Idle warnings sent, and idle jobs reclaimed for a waiting job.
    pub idle_warnings: u64,
    pub idle_reclaims: u64,
    /// Submissions told they were refused; expected starts stored, and the jobs they dated.
    pub refusals: u64,
    pub plans: u64,
    pub dated: u64,
    /// Bookings and cancels done, and refused.
    pub bookings: u64,
    pub bookings_refused: u64,
    /// Jobs started in a reservation, and notices about reservations (released, at risk).
    pub member_starts: u64,
    pub reservation_notices: u64,
    /// Jobs that yielded at their time slice's end, each checked (`slice_checks.rs`).
    pub slice_yields: u64,
    /// Starts checked against priorities (`priority_checks.rs`).
    pub priority_checks: u64,
    /// Every fault that took effect: its ordinal and what it was (as traced).
    pub fault_log: Vec<(u64, String)>,
    /// The invariant broken, with the simulated time, and the trace up to it.
    pub violation: Option<(String, Vec<String>)>,
}

/// Runs one seed to its end, or to its first broken invariant.
pub fn run(seed: u64, options: &Options) -> Outcome {
    let mut world = World::new(seed, options.clone(), admin::base_limits());
    let active = options.active_secs * 1000;
    let end = active + options.quiet_secs * 1000;
    let mut violation = None;
    while world.step(end) {
        for due in std::mem::take(&mut world.due) {
            let next = match due {
                world::Event::User => {
                    workload::user_action(&mut world);
                    world.rng.between(50, 1_500)
                }
                _ => {
                    faults::inject(&mut world);
                    world.rng.between(200, 3_000)
                }
            };
            world.at(next, due);
        }
        if !world.quiet && world.now >= active {
            world.quiet = true;
            world.note("quiet period: no more faults or work".into());
            admin::settle(&mut world);
        }
        if let Some(broken) = checks::after_step(&world) {
            violation = Some(format!("at {} ms: {broken}", world.now));
            break;
        }
        if world.quiet && world.now >= active + 60_000 && checks::all_finished(&mut world) {
            break;
        }
    }
    if violation.is_none() {
        let left = checks::unfinished(&mut world);
        if !left.is_empty() {
            // What is still out of service says why a job may wait.
            let out: Vec<String> = world
                .store
                .admin
                .iter()
                .filter(|(_, a)| a.drained.is_some() || !a.paused_gpus.is_empty())
                .map(|(node, a)| {
                    let paused: Vec<&u32> = a.paused_gpus.keys().collect();
                    format!("{node} drained {} paused {paused:?}", a.drained.is_some())
                })
                .collect();
            violation = Some(format!(
                "liveness: {} jobs never ended after the quiet period: {}; out of service: {}",
                left.len(),
                left.into_iter().take(5).collect::<Vec<_>>().join("; "),
                out.join(", ")
            ));
        }
    }
    Outcome {
        seed,
        jobs: world.submitted.len() as u64,
        faults: world.faults,
        steps: world.steps,
        partitions: world.partitions,
        starts: world.ledger.starts,
        gang_starts: world.ledger.gang_starts,
        array_starts: world.ledger.array_starts,
        preemptions: world.ledger.preempted.len() as u64,
        preferred_type_waits: world.ledger.preferred_type_waits,
        idle_warnings: world.ledger.idle_warnings,
        idle_reclaims: world.ledger.idle_reclaims,
        refusals: world
            .ledger
            .verdicts
            .values()
            .filter(|v| v.is_some())
            .count() as u64,
        plans: world.ledger.plans,
        dated: world.ledger.dated,
        bookings: world.ledger.bookings,
        bookings_refused: world.ledger.bookings_refused,
        member_starts: world.ledger.member_starts,
        reservation_notices: world.ledger.reservation_notices,
        slice_yields: world.ledger.slices.yields,
        priority_checks: world.ledger.priorities.checked,
        fault_log: world.fault_log,
        violation: violation.map(|v| (v, world.trace.into_iter().collect())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn short() -> Options {
        Options {
            active_secs: 40,
            ..Options::default()
        }
    }

    #[test]
    fn a_seed_replays_exactly() {
        let first = run(11, &short());
        let again = run(11, &short());
        assert_eq!(
            (first.jobs, first.faults, first.steps),
            (again.jobs, again.faults, again.steps)
        );
        assert!(first.jobs > 0 && first.faults > 0, "{first:?}");
    }
}
