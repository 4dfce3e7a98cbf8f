//! `mgpu-simulate`: runs the scheduler's deterministic simulation over many seeds (or replays
//! one), and prints, as its last line, one JSON object: seeds, jobs, faults, steps, steps per
//! second and violations. A failing seed is printed with the broken invariant, how many faults
//! it had and how many of them the shortest failing run found keeps (fault kinds turned off,
//! then single faults suppressed), that run's trace, and the command that replays it exactly
//! (`--seed S` with its `--without` kinds, its `--skip-faults` list and `--no-shrink`).

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
    /// Let these faults of the seed not happen, by their ordinal (the run's Nth fault, as its
    /// trace numbers them: `fault #N: …`), e.g. `--skip-faults 3,7,12`. Each is drawn as
    /// before, so the run is the same up to the first one skipped; after it, ordinals may
    /// denote other faults. A failing seed's replay command lists those its shrinking found.
    #[arg(long, value_delimiter = ',', value_name = "N,...", requires = "seed")]
    skip_faults: Vec<u64>,
    /// Print a failing seed's own trace, without shrinking it first. A failure's replay
    /// command has it: the run it replays is the shrunk one, and shrinking that again could
    /// find another run and print another trace.
    #[arg(long)]
    no_shrink: bool,
}

/// The fault kinds a run draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Fault {
    NodeCrash,
    Partition,
    SchedulerCrash,
    SchedulerStall,
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
            Fault::SchedulerStall => &mut options.scheduler_stall,
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
    options.skip_faults.extend(&args.skip_faults);
    if !options.skip_faults.is_empty() {
        println!("faults skipped: {:?}", options.skip_faults);
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
    let (mut member_starts, mut reservation_notices) = (0u64, 0u64);
    let (mut slice_yields, mut priority_checks) = (0u64, 0u64);
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
        priority_checks += outcome.priority_checks;
        if outcome.violation.is_some() {
            violations += 1;
            report_failure(&outcome, &options, !args.no_shrink);
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
            "priority_checks": priority_checks,
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

/// How many faults of the shortest failing run a report lists by name.
const FAULTS_LISTED: usize = 20;

/// Prints a failing seed: the invariant; how many faults it had, and how many the shortest
/// failing run found keeps (`simulation::shrink`; unless `shrink` is false, when the run is
/// shown as it is), with their ordinals; that run's violation and trace; and the command that
/// replays that run exactly.
fn report_failure(outcome: &Outcome, options: &Options, shrink: bool) {
    let Some((violation, _)) = &outcome.violation else {
        return;
    };
    println!("seed {} broke an invariant: {violation}", outcome.seed);
    let (smallest, shown) = if shrink {
        let shrunk = simulation::shrink(outcome.seed, options);
        let rerun = simulation::run(outcome.seed, &shrunk.options);
        println!(
            "  shrunk in {} runs: the failing run had {} faults, \
             the shortest failing run found keeps {}",
            shrunk.runs,
            outcome.fault_log.len(),
            rerun.fault_log.len()
        );
        (shrunk.options, rerun)
    } else {
        println!("  not shrunk: {} faults", outcome.fault_log.len());
        (options.clone(), outcome.clone())
    };
    for (ordinal, what) in shown.fault_log.iter().take(FAULTS_LISTED) {
        println!("    #{ordinal}: {what}");
    }
    let Some((shown_violation, trace)) = &shown.violation else {
        // Shrinking keeps only options whose run failed, and runs replay exactly.
        println!("  the shrunk run did not fail again: {smallest:?}");
        return;
    };
    if simulation::violation_kind(shown_violation) != simulation::violation_kind(violation) {
        println!("  (it breaks another invariant: shrinking went wrong)");
    }
    println!("  {shown_violation}");
    for line in trace {
        println!("    {line}");
    }
    println!("  replay: {}", replay_command(outcome.seed, &smallest));
}

/// `scripts/simulate.sh` with what makes `seed`'s run under `options` again and prints it as
/// it is: its active seconds, the fault kinds turned off, the faults skipped, and how its
/// trace is printed.
fn replay_command(seed: u64, options: &Options) -> String {
    let mut command = format!(
        "scripts/simulate.sh --seed {seed} --active-secs {}",
        options.active_secs
    );
    let mut probe = options.clone();
    for fault in <Fault as clap::ValueEnum>::value_variants() {
        if *fault.knob(&mut probe) == 0
            && let Some(value) = clap::ValueEnum::to_possible_value(fault)
        {
            command.push_str(&format!(" --without {}", value.get_name()));
        }
    }
    if !options.skip_faults.is_empty() {
        let skipped: Vec<String> = options.skip_faults.iter().map(u64::to_string).collect();
        command.push_str(&format!(" --skip-faults {}", skipped.join(",")));
    }
    if options.trace_logs {
        command.push_str(" --trace-logs");
    }
    if options.trace_lines != Options::default().trace_lines {
        command.push_str(&format!(" --trace-lines {}", options.trace_lines));
    }
    // That run is already the shortest found: shown as it is, its trace is this one.
    command.push_str(" --no-shrink");
    command
}
