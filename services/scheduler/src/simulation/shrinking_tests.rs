use std::collections::BTreeSet;

use super::*;
use crate::simulation::run;

fn short() -> Options {
    Options {
        active_secs: 40,
        ..Options::default()
    }
}

fn ordinals(outcome: &Outcome) -> Vec<u64> {
    outcome.fault_log.iter().map(|(n, _)| *n).collect()
}

fn skipping(skip: impl IntoIterator<Item = u64>) -> Options {
    Options {
        skip_faults: skip.into_iter().collect(),
        ..short()
    }
}

#[test]
fn a_skip_list_naming_no_fault_of_the_run_leaves_it_as_it_was() {
    let plain = run(3, &short());
    let drawn = plain.fault_log.len() as u64;
    assert!(drawn > 0, "{plain:?}");
    // Ordinals start at 1, and the run numbers no more than it has faults.
    let skipped = run(3, &skipping([0, drawn + 1, drawn + 50, u64::MAX]));
    assert_eq!(
        (plain.jobs, plain.faults, plain.steps, &plain.fault_log),
        (
            skipped.jobs,
            skipped.faults,
            skipped.steps,
            &skipped.fault_log
        )
    );
    assert_eq!(ordinals(&plain), (1..=drawn).collect::<Vec<_>>());
}

#[test]
fn a_fault_suppressed_does_not_happen_and_the_run_is_the_same_up_to_it() {
    let plain = run(3, &short());
    let last = plain.fault_log.len();
    let suppressed = plain.fault_log[last - 1].0;
    let skipped = run(3, &skipping([suppressed]));
    // The faults before it happened as they did; it did not. (The run then goes on
    // otherwise, and may draw other faults later.)
    assert_eq!(skipped.fault_log[..last - 1], plain.fault_log[..last - 1]);
    assert!(
        skipped.fault_log.iter().all(|(n, _)| *n != suppressed),
        "{:?}",
        skipped.fault_log
    );
}

#[test]
fn a_fault_traced_carries_its_ordinal() {
    let mut options = short();
    // A failure (the liveness check, with no quiet period to end the jobs) to get the trace.
    options.quiet_secs = 0;
    options.trace_lines = 100_000;
    let outcome = run(3, &options);
    let Some((_, trace)) = &outcome.violation else {
        panic!("{outcome:?}");
    };
    for (n, what) in &outcome.fault_log {
        let line = format!("fault #{n}: {what}");
        assert!(trace.iter().any(|l| l.ends_with(&line)), "{line}");
    }
}

/// A run failing (a test-only invariant) once a node and the scheduler both crashed.
fn crashes_both(seed: u64, options: &Options) -> Outcome {
    let mut outcome = run(seed, options);
    let had = |kind: &str| outcome.fault_log.iter().any(|(_, w)| w.starts_with(kind));
    if outcome.violation.is_none() && had("node crash") && had("scheduler crash") {
        let broken = "test: a node and the scheduler crashed".to_owned();
        outcome.violation = Some((broken, Vec::new()));
    }
    outcome
}

#[test]
fn shrinking_keeps_the_failure_and_suppresses_single_faults() {
    let options = short();
    // The first seed whose run crashes both (runs are deterministic: always the same one).
    let (seed, failing) = (1..=30)
        .map(|seed| (seed, crashes_both(seed, &options)))
        .find(|(_, outcome)| outcome.violation.is_some())
        .unwrap_or_else(|| panic!("no seed of the first 30 crashes a node and the scheduler"));
    let budget = 60;
    let shrunk = shrink_with(seed, &options, budget, crashes_both);
    let replay = crashes_both(seed, &shrunk.options);
    let kind = |o: &Outcome| o.violation.as_ref().map(|(v, _)| violation_kind(v));
    assert_eq!(kind(&replay), kind(&failing));
    let kept: Vec<&str> = replay.fault_log.iter().map(|(_, w)| w.as_str()).collect();
    assert!(
        !shrunk.options.skip_faults.is_empty(),
        "{:?}",
        shrunk.options
    );
    assert!(replay.fault_log.len() < failing.fault_log.len(), "{kept:?}");
    assert!(kept.iter().any(|w| w.starts_with("node crash")), "{kept:?}");
    assert!(
        kept.iter().any(|w| w.starts_with("scheduler crash")),
        "{kept:?}"
    );
    // Every fault left is needed: suppressing any one of them loses the failure, or keeps
    // it only with more faults than the run kept (the draws after it moved and new faults
    // came), which is no smaller run: what the shrinker asks of a step.
    for (ordinal, what) in &replay.fault_log {
        let mut without = shrunk.options.clone();
        without.skip_faults.insert(*ordinal);
        let outcome = crashes_both(seed, &without);
        let smaller_alike =
            kind(&outcome) == kind(&failing) && outcome.fault_log.len() <= replay.fault_log.len();
        assert!(
            !smaller_alike,
            "{what} was not needed: {kept:?}; without it {:?}",
            outcome.fault_log
        );
    }
    assert!(shrunk.runs <= 1 + 11 + budget, "{}", shrunk.runs);
}

#[test]
fn a_failure_that_needs_no_fault_shrinks_to_none() {
    // No quiet period: jobs still running when the run ends break the liveness check.
    let options = Options {
        quiet_secs: 0,
        ..short()
    };
    let failing = run(5, &options);
    assert!(
        failing.violation.is_some() && failing.faults > 0,
        "{failing:?}"
    );
    let shrunk = shrink(5, &options);
    let replay = run(5, &shrunk.options);
    let kind = |o: &Outcome| o.violation.as_ref().map(|(v, _)| violation_kind(v));
    assert_eq!(kind(&replay), kind(&failing));
    assert_eq!(replay.faults, 0);
}

#[test]
fn ddmin_finds_exactly_the_faults_a_failure_needs() {
    let active: Vec<u64> = (1..=40).collect();
    let needs = |kept: &[u64]| kept.contains(&4) && kept.contains(&9);
    let (kept, asked) = ddmin(&active, 300, needs);
    assert_eq!(kept, vec![4, 9]);
    assert!(asked <= 300);
    // One needed alone, or none.
    assert_eq!(ddmin(&active, 300, |k: &[u64]| k.contains(&40)).0, vec![40]);
    assert_eq!(ddmin(&active, 300, |_: &[u64]| true), (vec![], 1));
    assert_eq!(ddmin(&[] as &[u64], 300, |_: &[u64]| true), (vec![], 0));
}

#[test]
fn ddmin_asks_no_more_than_its_budget_and_keeps_a_failing_set() {
    let active: Vec<u64> = (1..=64).collect();
    // Fails while any three of these are kept: no unique answer, many trials.
    let needed: BTreeSet<u64> = [3, 17, 18, 40, 41, 63].into();
    let fails = |kept: &[u64]| kept.iter().filter(|n| needed.contains(n)).count() >= 3;
    for budget in [0, 1, 5, 12, 300] {
        let mut asked = 0;
        let (kept, told) = ddmin(&active, budget, |k| {
            asked += 1;
            fails(k)
        });
        assert_eq!(asked, told);
        assert!(told <= budget, "{told} > {budget}");
        assert!(fails(&kept), "{kept:?}");
        if budget == 0 {
            assert_eq!(kept, active);
        }
        if budget == 300 {
            assert_eq!(kept.len(), 3, "{kept:?}");
        }
    }
}

#[test]
fn violations_of_one_invariant_are_one_kind() {
    let one = violation_kind("at 40103 ms: job 65810132a2 runs attempts [1] and 2 at once");
    let other = violation_kind("at 9 ms: job bcf335f50d runs attempts [3] and 4 at once");
    assert_eq!(one, other);
    let liveness = violation_kind("liveness: 1 jobs never ended after the quiet period: x");
    assert_ne!(one, liveness);
}
