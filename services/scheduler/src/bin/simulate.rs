//! `mgpu-simulate`: runs the scheduler's deterministic simulation over many seeds (or replays
//! one), and prints, as its last line, one JSON object: seeds, jobs, faults, steps, steps per
//! second and violations. A failing seed is printed with the broken invariant, the fault
//! kinds it still fails with, and the trace up to the failure; `--seed S` replays it exactly.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;

use mgpu_scheduler::simulation::{self, Options, Outcome};

/// Runs the scheduler's deterministic cluster simulation.
#[derive(Parser, Debug)]
#[command(name = "mgpu-simulate", version)]
struct Args {
    /// Replay this one seed (its trace is printed when it fails).
    #[arg(long, conflicts_with_all = ["seeds", "first_seed"])]
    seed: Option<u64>,
    /// How many seeds to run (from --first-seed on).
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 1)]
    first_seed: u64,
    /// Stop starting new seeds after this many minutes of real time.
    #[arg(long)]
    minutes: Option<f64>,
    /// Simulated seconds of work and faults per seed (then a quiet period).
    #[arg(long, default_value_t = 120)]
    active_secs: u64,
    /// Put the scheduler's log lines in a failing seed's trace too.
    #[arg(long)]
    trace_logs: bool,
    /// How many of the last trace lines a failing seed prints (a job that waits forever may
    /// have stalled long before the end).
    #[arg(long, default_value_t = 200)]
    trace_lines: usize,
    /// Draw no fault of this kind (repeatable): e.g. to run what a known open bug does not
    /// need while it is being fixed.
    #[arg(long, value_enum, value_name = "FAULT")]
    without: Vec<Fault>,
}

/// The fault kinds a run draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Fault {
    NodeCrash,
    Partition,
    SchedulerCrash,
    OtherWriter,
    ClockStep,
    WriteFailure,
    AckLost,
    Duplicate,
    Delay,
    HeartbeatDrop,
    Replay,
}

impl Fault {
    /// How often this fault is drawn, in `options`.
    fn knob(self, options: &mut Options) -> &mut u64 {
        match self {
            Fault::NodeCrash => &mut options.node_crash,
            Fault::Partition => &mut options.partition,
            Fault::SchedulerCrash => &mut options.scheduler_crash,
            Fault::OtherWriter => &mut options.other_writer,
            Fault::ClockStep => &mut options.clock_step,
            Fault::WriteFailure => &mut options.write_failure,
            Fault::AckLost => &mut options.ack_lost,
            Fault::Duplicate => &mut options.duplicate,
            Fault::Delay => &mut options.delay,
            Fault::HeartbeatDrop => &mut options.heartbeat_drop,
            Fault::Replay => &mut options.replay,
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut options = Options {
        active_secs: args.active_secs,
        trace_logs: args.trace_logs,
        trace_lines: args.trace_lines,
        ..Options::default()
    };
    for fault in &args.without {
        *fault.knob(&mut options) = 0;
    }
    if !args.without.is_empty() {
        println!("faults not drawn: {:?}", args.without);
    }
    let began = Instant::now();
    let deadline = args
        .minutes
        .map(|m| began + Duration::from_secs_f64((m * 60.0).max(0.0)));
    let seeds: Vec<u64> = match args.seed {
        Some(seed) => vec![seed],
        None => (args.first_seed..args.first_seed.saturating_add(args.seeds)).collect(),
    };
    let (mut ran, mut jobs, mut faults, mut steps, mut violations) = (0u64, 0, 0, 0, 0u64);
    let (mut preemptions, mut idle_warnings, mut idle_reclaims) = (0u64, 0u64, 0u64);
    let mut preferred_type_waits = 0u64;
    let (mut refusals, mut plans, mut dated) = (0u64, 0u64, 0u64);
    let (mut bookings, mut bookings_refused) = (0u64, 0u64);
    let (mut member_starts, mut reservation_notices, mut slice_yields) = (0u64, 0u64, 0u64);
    for seed in seeds {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let outcome = simulation::run(seed, &options);
        ran += 1;
        jobs += outcome.jobs;
        faults += outcome.faults;
        steps += outcome.steps;
        preemptions += outcome.preemptions;
        idle_warnings += outcome.idle_warnings;
        idle_reclaims += outcome.idle_reclaims;
        preferred_type_waits += outcome.preferred_type_waits;
        refusals += outcome.refusals;
        plans += outcome.plans;
        dated += outcome.dated;
        bookings += outcome.bookings;
        bookings_refused += outcome.bookings_refused;
        member_starts += outcome.member_starts;
        reservation_notices += outcome.reservation_notices;
        slice_yields += outcome.slice_yields;
        if outcome.violation.is_some() {
            violations += 1;
            report_failure(&outcome, &options, &args.without);
        }
    }
    let seconds = began.elapsed().as_secs_f64();
    let per_second = if seconds > 0.0 {
        (steps as f64 / seconds).round()
    } else {
        0.0
    };
    println!(
        "{}",
        serde_json::json!({
            "seeds": ran,
            "jobs": jobs,
            "faults": faults,
            "steps": steps,
            "preemptions": preemptions,
            "idle_warnings": idle_warnings,
            "idle_reclaims": idle_reclaims,
            "preferred_type_waits": preferred_type_waits,
            "refusals": refusals,
            "plans": plans,
            "dated": dated,
            "bookings": bookings,
            "bookings_refused": bookings_refused,
            "member_starts": member_starts,
            "reservation_notices": reservation_notices,
            "slice_yields": slice_yields,
            "steps_per_second": per_second,
            "violations": violations,
        })
    );
    if violations == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Prints a failing seed: the invariant, the fault kinds it still fails with, the trace.
fn report_failure(outcome: &Outcome, options: &Options, without: &[Fault]) {
    let Some((violation, _)) = &outcome.violation else {
        return;
    };
    println!("seed {} broke an invariant: {violation}", outcome.seed);
    let smallest = simulation::shrink(outcome.seed, options);
    let rerun = simulation::run(outcome.seed, &smallest);
    let (violation, trace) = rerun
        .violation
        .unwrap_or_else(|| (violation.clone(), Vec::new()));
    println!("  still fails with only these faults: {smallest:?}");
    println!("  {violation}");
    for line in trace {
        println!("    {line}");
    }
    let without: String = without
        .iter()
        .filter_map(clap::ValueEnum::to_possible_value)
        .map(|value| format!(" --without {}", value.get_name()))
        .collect();
    println!(
        "  replay: scripts/simulate.sh --seed {} --active-secs {}{without}",
        outcome.seed, options.active_secs
    );
}
