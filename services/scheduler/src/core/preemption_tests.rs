//! Stories and properties of preemption by class (`preemption.rs`).

use std::collections::HashSet;

use proptest::prelude::*;

use super::tests::{id, job, node, run, running, t0};
use super::*;
use mgpu_protocol::gpu_amount::GpuAmount;

/// A job of the preemptible `scavenger` class on `gpus` of `node`, started `ago` seconds
/// before t0, preemptible from `min_runtime` seconds after its start.
fn scavenger(n: u32, node: &str, gpus: &[u32], ago: i64, min_runtime: i64) -> RunningJob {
    let mut job = running(n, node, gpus, None);
    job.started_at = t0() - chrono::Duration::seconds(ago);
    job.qos = Some("scavenger".into());
    job.preemptible_from = Some(job.started_at + chrono::Duration::seconds(min_runtime));
    job
}

fn normal(n: u32, gpus: u32) -> QueuedJob {
    let mut waiter = job(n, GpuAmount::whole(gpus));
    waiter.may_preempt = true;
    waiter
}

fn victims_of(decisions: &[Decision], waiter: &JobId) -> Vec<JobId> {
    decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Preempt {
                job,
                for_job: Some(for_job),
            } if for_job == waiter => Some(job.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_waiter_that_may_preempt_stops_the_cheapest_scavengers_it_needs_and_no_more() {
    let nodes = [node("n1", 4, 24_576)];
    let old = scavenger(1, "n1", &[0, 1], 7200, 0);
    let young = scavenger(2, "n1", &[2], 60, 0);
    let younger = scavenger(3, "n1", &[3], 30, 0);
    let holding = [old.clone(), young.clone(), younger.clone()];
    // One GPU: the job that ran least (fewest GPU-hours lost).
    let decisions = run(&nodes, &holding, &[normal(10, 1)]);
    assert_eq!(victims_of(&decisions, &id(10)), vec![younger.id.clone()]);
    // Two GPUs: the two one-GPU jobs, not the two-GPU one that ran for two hours.
    let decisions = run(&nodes, &holding, &[normal(11, 2)]);
    let victims: HashSet<JobId> = victims_of(&decisions, &id(11)).into_iter().collect();
    assert_eq!(victims, HashSet::from([young.id, younger.id]));
}

#[test]
fn nothing_is_preempted_when_it_would_not_be_enough_or_not_needed_or_not_allowed() {
    let nodes = [node("n1", 2, 24_576)];
    let holding = [scavenger(1, "n1", &[0], 600, 0)];
    // Three GPUs on a two-GPU node: no amount of stopping helps.
    assert!(victims_of(&run(&nodes, &holding, &[normal(10, 3)]), &id(10)).is_empty());
    // A free GPU: it starts there.
    let decisions = run(&nodes, &holding, &[normal(11, 1)]);
    assert!(victims_of(&decisions, &id(11)).is_empty());
    assert_eq!(super::tests::started(&decisions).len(), 1);
    // A class that may not preempt waits.
    let full = [
        scavenger(1, "n1", &[0], 600, 0),
        scavenger(2, "n1", &[1], 600, 0),
    ];
    let mut polite = normal(12, 1);
    polite.may_preempt = false;
    assert!(victims_of(&run(&nodes, &full, &[polite]), &id(12)).is_empty());
    // Not before the victim's minimum run time, and never a job of no preemptible class.
    let young = [
        scavenger(1, "n1", &[0], 60, 600),
        running(2, "n1", &[1], None),
    ];
    assert!(victims_of(&run(&nodes, &young, &[normal(13, 1)]), &id(13)).is_empty());
    // Nor one of its own class.
    let mut same = normal(14, 1);
    same.qos = Some("scavenger".into());
    assert!(victims_of(&run(&nodes, &full, &[same]), &id(14)).is_empty());
}

#[test]
fn a_waiter_whose_victims_are_still_stopping_has_no_more_stopped() {
    let nodes = [node("n1", 2, 24_576)];
    let mut stopping = scavenger(1, "n1", &[0], 600, 0);
    stopping.stopping = true;
    let holding = [stopping, scavenger(2, "n1", &[1], 600, 0)];
    assert!(victims_of(&run(&nodes, &holding, &[normal(10, 1)]), &id(10)).is_empty());
    // Two waiters do not count on the same victim: the second gets the other scavenger.
    let waiters = [normal(10, 1), normal(11, 1)];
    let decisions = run(&nodes, &holding, &waiters);
    assert_eq!(victims_of(&decisions, &id(11)), vec![id(1002)]);
}

#[test]
fn a_job_past_its_slice_does_not_yield_to_a_scavenger_it_would_preempt_back() {
    let nodes = [node("n1", 1, 24_576)];
    let mut sliced = running(1, "n1", &[0], None);
    sliced.slice_end = Some(t0() - chrono::Duration::seconds(1));
    sliced.may_preempt = true;
    let mut waiter = job(10, GpuAmount::ONE);
    waiter.qos = Some("scavenger".into());
    waiter.preemptible = true;
    let yields = |decisions: &[Decision]| {
        decisions
            .iter()
            .any(|d| matches!(d, Decision::Preempt { for_job: None, .. }))
    };
    assert!(!yields(&run(
        &nodes,
        std::slice::from_ref(&sliced),
        &[waiter]
    )));
    let plain = job(11, GpuAmount::ONE);
    assert!(
        yields(&run(&nodes, &[sliced], &[plain])),
        "to a job of no preemptible class"
    );
}

proptest! {
    /// Whatever runs and waits: only preemptible jobs past their minimum run time are
    /// stopped, each for one waiter, and the waiter could start in the room the stopping
    /// jobs leave (nothing is preempted for a job that then cannot start).
    #[test]
    fn victims_are_preemptible_and_make_room(
        shapes in prop::collection::vec((0u32..4, 0u32..3, any::<bool>(), 0i64..900), 1..8),
        wants in prop::collection::vec(1u32..4, 1..4),
    ) {
        let nodes = [node("n1", 4, 24_576), node("n2", 4, 24_576)];
        let mut holding = Vec::new();
        let mut used: HashSet<(String, u32)> = HashSet::new();
        for (n, (gpu, node_index, preemptible, ago)) in shapes.into_iter().enumerate() {
            let name = if node_index == 0 { "n1" } else { "n2" };
            if !used.insert((name.to_owned(), gpu)) {
                continue;
            }
            let n = n as u32;
            holding.push(if preemptible {
                scavenger(n, name, &[gpu], ago, 300)
            } else {
                running(n, name, &[gpu], None)
            });
        }
        let queue: Vec<QueuedJob> = wants.iter().enumerate()
            .map(|(i, gpus)| normal(100 + i as u32, *gpus))
            .collect();
        let decisions = run(&nodes, &holding, &queue);
        let mut stopped: HashSet<JobId> = HashSet::new();
        for waiter in &queue {
            let victims = victims_of(&decisions, &waiter.id);
            for victim in &victims {
                let held = holding.iter().find(|h| &h.id == victim);
                let from = held.and_then(|h| h.preemptible_from);
                prop_assert!(from.is_some_and(|f| f <= t0()), "{victim:?} stopped");
                prop_assert!(stopped.insert(victim.clone()), "{victim:?} stopped twice");
            }
        }
        if !stopped.is_empty() {
            // What runs once the victims are gone: the others, and what this pass started.
            let mut remaining: Vec<RunningJob> = holding.iter()
                .filter(|h| !stopped.contains(&h.id)).cloned().collect();
            for (job, placement) in super::tests::started(&decisions) {
                let mut now_running = running(0, "n1", &[], None);
                now_running.id = job.clone();
                now_running.placement = placement.clone();
                remaining.push(now_running);
            }
            let preemptors: Vec<QueuedJob> = queue.iter()
                .filter(|w| !victims_of(&decisions, &w.id).is_empty()).cloned().collect();
            let after = run(&nodes, &remaining, &preemptors);
            let first = preemptors.first().map(|w| w.id.clone());
            prop_assert!(
                super::tests::started(&after).iter().any(|(job, _)| Some((*job).clone()) == first),
                "the first job that preempted does not start once its victims are gone"
            );
        }
    }
}
