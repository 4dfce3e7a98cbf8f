//! Stories and properties of idle GPUs handed to who waits (`idle_reclaim.rs`).

use std::collections::HashSet;

use proptest::prelude::*;

use super::tests::{id, job, node, run, running, t0};
use super::*;
use mgpu_protocol::gpu_amount::GpuAmount;

/// A job on `gpus` of `node`, warned for idleness, past its grace since `ago` seconds
/// (negative: not yet).
fn idle(n: u32, node: &str, gpus: &[u32], ago: i64) -> RunningJob {
    let mut job = running(n, node, gpus, None);
    job.reclaimable_from = Some(t0() - chrono::Duration::seconds(ago));
    job
}

fn reclaimed(decisions: &[Decision]) -> Vec<(JobId, JobId)> {
    decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Reclaim { job, for_job } => Some((job.clone(), for_job.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_waiter_gets_the_idle_gpus_it_needs_and_no_more_longest_past_grace_first() {
    let nodes = [node("n1", 3, 24_576)];
    let holding = [
        idle(1, "n1", &[0], 60),
        idle(2, "n1", &[1], 600),
        running(3, "n1", &[2], None),
    ];
    let decisions = run(&nodes, &holding, &[job(10, GpuAmount::ONE)]);
    assert_eq!(reclaimed(&decisions), vec![(holding[1].id.clone(), id(10))]);
    let decisions = run(&nodes, &holding, &[job(11, GpuAmount::whole(2))]);
    let taken: HashSet<JobId> = reclaimed(&decisions).into_iter().map(|(j, _)| j).collect();
    let idle_ones = HashSet::from([holding[0].id.clone(), holding[1].id.clone()]);
    assert_eq!(taken, idle_ones);
}

#[test]
fn nothing_is_reclaimed_while_nobody_waits_before_the_grace_or_when_it_would_not_be_enough() {
    let nodes = [node("n1", 2, 24_576)];
    let holding = [idle(1, "n1", &[0], 600), running(2, "n1", &[1], None)];
    assert!(reclaimed(&run(&nodes, &holding, &[])).is_empty());
    // Two GPUs: the idle one and a busy one would be needed.
    let decisions = run(&nodes, &holding, &[job(10, GpuAmount::whole(2))]);
    assert!(reclaimed(&decisions).is_empty());
    let early = [idle(1, "n1", &[0], -10), running(2, "n1", &[1], None)];
    let decisions = run(&nodes, &early, &[job(11, GpuAmount::ONE)]);
    assert!(reclaimed(&decisions).is_empty());
    // A free GPU: the waiter starts there, the idle job keeps its own.
    let roomy = [idle(1, "n1", &[0], 600)];
    let decisions = run(&nodes, &roomy, &[job(12, GpuAmount::ONE)]);
    assert!(reclaimed(&decisions).is_empty());
    assert_eq!(super::tests::started(&decisions).len(), 1);
}

#[test]
fn two_waiters_do_not_count_on_the_same_idle_job() {
    let nodes = [node("n1", 1, 24_576)];
    let holding = [idle(1, "n1", &[0], 600)];
    let decisions = run(
        &nodes,
        &holding,
        &[job(10, GpuAmount::ONE), job(11, GpuAmount::ONE)],
    );
    assert_eq!(reclaimed(&decisions), vec![(holding[0].id.clone(), id(10))]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Only jobs past their grace are reclaimed, each once, and only when everything
    /// reclaimed for a waiter makes room for it.
    #[test]
    fn only_reclaimable_jobs_are_taken_and_each_once(
        (nodes, mut holding) in super::tests::arb_cluster(),
        queue in super::tests::arb_queue(),
        marks in proptest::collection::vec(-600i64..600, 0..32),
    ) {
        for (job, mark) in holding.iter_mut().zip(&marks) {
            job.reclaimable_from = Some(t0() + chrono::Duration::seconds(*mark));
        }
        let refs: Vec<&RunningJob> = holding.iter().collect();
        let decisions = plan(&nodes, &refs, &queue, &super::tests::settings(), t0());
        let mut seen = HashSet::new();
        for (victim, _) in reclaimed(&decisions) {
            prop_assert!(seen.insert(victim.clone()), "{victim} reclaimed twice");
            let held = holding.iter().find(|j| j.id == victim);
            prop_assert!(held.is_some_and(|j| j.reclaimable_from.is_some_and(|f| f <= t0())));
        }
    }
}
