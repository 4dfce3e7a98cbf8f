//! Shrinking a failing run to the shortest trace found that still breaks the same invariant.
//! This module owns the two passes and their bounds: whole fault kinds turned off (one knob
//! per kind), then single faults suppressed by their ordinals (`Options::skip_faults`) with a
//! delta-debugging loop ([`ddmin`], a pure function over a predicate). The runs are
//! [`super::run`]'s; whether a fault happens or is suppressed is decided in one place in
//! `faults.rs` (`World::fault_happens`, `World::chance_of_fault`).

use super::{Options, Outcome};

/// The most runs the single-fault pass takes (its trials and the reruns that check what they
/// kept): about 20 s of the release build at its 75 ms a run.
pub const SINGLE_FAULT_RUNS: usize = 300;

/// What shrinking found.
#[derive(Clone, Debug)]
pub struct Shrunk {
    /// The options of the shortest failing run found: fault kinds turned off, single faults
    /// suppressed (`skip_faults`). Replaying the seed with them fails the same way.
    pub options: Options,
    /// How many runs shrinking took, the failing run's first one included.
    pub runs: usize,
}

/// The options with as few faults as still break the same invariant on `seed` (another
/// broken invariant is another bug, and its trace would not explain this one).
///
/// First each fault kind is turned off in turn and kept off when the run still fails the same
/// way with no more faults than the failing run (at most 11 runs). Then single faults: the
/// ordinals of the faults that still happen are cut down by [`ddmin`], a suppression kept
/// when the run still fails the same way with no more faults than the search began with. At
/// most [`SINGLE_FAULT_RUNS`] runs go to that pass, so shrinking takes at most 1 + 11 + 300
/// runs; when they run out, the faults kept so far are kept (the run still fails with them).
/// Faults are counted as `Outcome::fault_log` lists them, so the run found never has more than
/// the failing one.
///
/// Suppressing a fault changes what happens after it: the draws that follow fall elsewhere,
/// so a later ordinal may then denote another fault, and faults the failing run never had may
/// happen. That is why each trial is a whole run, why the pass starts over (within its
/// bound) when the run it kept has faults it did not search, and why the result holds only
/// as a whole: the options returned are replayed exactly, and a replay breaks the same
/// invariant because every suppression was kept only after a run that did.
pub fn shrink(seed: u64, options: &Options) -> Shrunk {
    shrink_with(seed, options, SINGLE_FAULT_RUNS, super::run)
}

/// [`shrink`] with `run` for the runs and `budget` runs for the single-fault pass (tests judge
/// runs by invariants of their own).
pub fn shrink_with(
    seed: u64,
    options: &Options,
    budget: usize,
    run: impl FnMut(u64, &Options) -> Outcome,
) -> Shrunk {
    let mut trials = Trials {
        seed,
        run,
        runs: 0,
        kind: String::new(),
    };
    let first = trials.run(options);
    let Some((broken, _)) = first.violation else {
        return Shrunk {
            options: options.clone(),
            runs: trials.runs,
        };
    };
    trials.kind = violation_kind(&broken);
    let fewer_kinds = without_kinds(options, first.fault_log.len(), &mut trials);
    let options = without_single_faults(fewer_kinds, budget, &mut trials);
    Shrunk {
        options,
        runs: trials.runs,
    }
}

/// The runs of one shrinking: the seed, how runs are made, how many were, the failure's kind.
struct Trials<R> {
    seed: u64,
    run: R,
    runs: usize,
    kind: String,
}

impl<R: FnMut(u64, &Options) -> Outcome> Trials<R> {
    fn run(&mut self, options: &Options) -> Outcome {
        self.runs += 1;
        (self.run)(self.seed, options)
    }

    /// Whether the run under `options` still breaks the invariant the failing run broke, with
    /// `most` faults at most (fewer faults is the point).
    fn fails_alike(&mut self, options: &Options, most: usize) -> bool {
        let outcome = self.run(options);
        self.same_kind(&outcome) && outcome.fault_log.len() <= most
    }

    fn same_kind(&self, outcome: &Outcome) -> bool {
        outcome
            .violation
            .as_ref()
            .is_some_and(|(broken, _)| violation_kind(broken) == self.kind)
    }
}

/// Each fault kind turned off in turn, kept off while the run still fails the same way with
/// no more faults than `most`, the failing run's: a step may add some, as the draws move, and
/// the single-fault pass takes them out again. (Bounding each step by the step before's
/// faults instead kept about as many in the end: 142 against 144 on 20 failing seeds.)
fn without_kinds<R: FnMut(u64, &Options) -> Outcome>(
    options: &Options,
    most: usize,
    trials: &mut Trials<R>,
) -> Options {
    let knobs: [fn(&mut Options) -> &mut u64; 12] = [
        |o| &mut o.node_crash,
        |o| &mut o.partition,
        |o| &mut o.scheduler_crash,
        |o| &mut o.other_writer,
        |o| &mut o.clock_step,
        |o| &mut o.write_failure,
        |o| &mut o.ack_lost,
        |o| &mut o.duplicate,
        |o| &mut o.delay,
        |o| &mut o.heartbeat_drop,
        |o| &mut o.replay,
        |o| &mut o.scheduler_stall,
    ];
    let mut smallest = options.clone();
    for knob in knobs {
        let mut trial = smallest.clone();
        if *knob(&mut trial) == 0 {
            continue;
        }
        *knob(&mut trial) = 0;
        if trials.fails_alike(&trial, most) {
            smallest = trial;
        }
    }
    smallest
}

/// Single faults suppressed by [`ddmin`] within `budget` runs; started over while the run kept
/// has faults the search did not see (suppressions move the draws that follow them).
fn without_single_faults<R: FnMut(u64, &Options) -> Outcome>(
    mut smallest: Options,
    budget: usize,
    trials: &mut Trials<R>,
) -> Options {
    let limit = trials.runs.saturating_add(budget);
    let mut searched: Option<Vec<u64>> = None;
    while trials.runs < limit {
        let outcome = trials.run(&smallest);
        // Every options kept here failed alike when run, and runs are deterministic: a run
        // that does not is a bug elsewhere; the search stops rather than shrink another run.
        if !trials.same_kind(&outcome) {
            break;
        }
        let active: Vec<u64> = outcome.fault_log.iter().map(|(n, _)| *n).collect();
        if searched.as_ref() == Some(&active) {
            break;
        }
        let base = smallest.clone();
        let left = limit.saturating_sub(trials.runs);
        let (kept, _) = ddmin(&active, left, |kept| {
            let trial = suppressing(&base, &active, kept);
            trials.fails_alike(&trial, active.len())
        });
        smallest = suppressing(&base, &active, &kept);
        searched = Some(kept);
    }
    smallest
}

/// `base` with the faults of `active` not in `kept` suppressed too (`kept` is a part of
/// `active`, in its order: ascending).
fn suppressing(base: &Options, active: &[u64], kept: &[u64]) -> Options {
    let mut options = base.clone();
    options.skip_faults.extend(
        active
            .iter()
            .filter(|n| kept.binary_search(n).is_err())
            .copied(),
    );
    options
}

/// Delta debugging (ddmin-style): the smallest part of `active` found for which `fails` still
/// holds, and how many times `fails` was asked (at most `budget`). `fails(active)` is taken
/// to hold. Chunks of what is still kept are dropped in turn, first all of it, then halves,
/// quarters, … down to single items (the single-item pass again while it drops something); a
/// drop stays when `fails` holds without the chunk. With budget enough, the result is
/// 1-minimal: dropping any one of its items makes `fails` false. Items keep their order.
pub fn ddmin<T: Copy>(
    active: &[T],
    budget: usize,
    mut fails: impl FnMut(&[T]) -> bool,
) -> (Vec<T>, usize) {
    let mut kept = active.to_vec();
    let mut asked = 0;
    let mut chunk = kept.len();
    while chunk > 0 {
        let mut dropped = false;
        let mut start = 0;
        while start < kept.len() {
            if asked == budget {
                return (kept, asked);
            }
            let end = start.saturating_add(chunk).min(kept.len());
            let without: Vec<T> = kept[..start].iter().chain(&kept[end..]).copied().collect();
            asked += 1;
            if fails(&without) {
                // The next chunk now begins at `start`.
                kept = without;
                dropped = true;
            } else {
                start = end;
            }
        }
        chunk = match chunk {
            1 if dropped => 1,
            1 => 0,
            _ => chunk / 2,
        };
    }
    (kept, asked)
}

/// A broken invariant without its time, ids and counts: `job 7dd0… runs attempts [1] and 2
/// at once` and `job 65a1… runs attempts [3] and 4 at once` are the same kind.
pub fn violation_kind(violation: &str) -> String {
    let without_time = match violation.split_once(" ms: ") {
        Some((at, rest)) if at.starts_with("at ") => rest,
        _ => violation,
    };
    without_time
        .split_whitespace()
        .take(6)
        .map(|word| match word.chars().any(|c| c.is_ascii_digit()) {
            true => "#",
            false => word,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
#[path = "shrinking_tests.rs"]
mod tests;
