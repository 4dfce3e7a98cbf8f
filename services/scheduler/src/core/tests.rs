//! Stories and properties of the scheduling core.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::TimeZone;
use proptest::prelude::*;

use super::*;
use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::job::{GpuShare, NodeGpuIds};

pub(super) fn t0() -> Timestamp {
    chrono::Utc
        .timestamp_opt(1_700_000_000, 0)
        .single()
        .unwrap_or_default()
}

pub(super) fn node(name: &str, gpus: u32, mem: u64) -> NodeView {
    NodeView {
        name: name.into(),
        online: true,
        drained: false,
        mem_threshold: 0.8,
        load_threshold: 0.8,
        gpus: (0..gpus)
            .map(|index| GpuView {
                index,
                memory_total_mib: mem,
                foreign_mem_mib: 0,
                utilization_pct: 0,
                paused: false,
                gpu_type: None,
            })
            .collect(),
        labels: BTreeMap::new(),
        cpus: None,
        mem_host_mib: None,
        features: Vec::new(),
    }
}

pub(super) fn id(n: u32) -> JobId {
    format!("{n:032x}")
        .parse()
        .unwrap_or_else(|_| JobId::random())
}

pub(super) fn job(n: u32, gpus: GpuAmount) -> QueuedJob {
    QueuedJob::new(id(n), gpus, t0() + chrono::Duration::seconds(i64::from(n)))
}

pub(super) fn running(n: u32, node: &str, gpus: &[u32], ends_in: Option<i64>) -> RunningJob {
    RunningJob {
        id: id(1000 + n),
        owner: String::new(),
        placement: Placement::single(
            node,
            gpus.iter()
                .map(|index| GpuShare {
                    index: *index,
                    amount: GpuAmount::ONE,
                    mem_mib: 0,
                })
                .collect(),
        ),
        expected_end: ends_in.map(|s| t0() + chrono::Duration::seconds(s)),
        slice_end: None,
        array_id: None,
        started_at: t0(),
        qos: None,
        preemptible_from: None,
        stopping: false,
        may_preempt: false,
        reclaimable_from: None,
        reservation: None,
        priority_if_requeued: i64::MIN,
    }
}

pub(super) fn settings() -> CoreSettings {
    CoreSettings {
        placement: PlacementPolicy::FillFirst,
        max_reservations: 16,
        topology_label: Some("rack".into()),
        gpu_caps: Default::default(),
        gpu_type_caps: Default::default(),
        class_caps: Default::default(),
        max_start_estimates: 64,
        windows: Default::default(),
        reservation_horizon: chrono::Duration::hours(24),
    }
}

pub(super) fn run(
    nodes: &[NodeView],
    holding: &[RunningJob],
    queue: &[QueuedJob],
) -> Vec<Decision> {
    plan(nodes, holding, queue, &settings(), t0())
}

pub(super) fn started(decisions: &[Decision]) -> Vec<(&JobId, &Placement)> {
    decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Start { job, placement } => Some((job, placement)),
            _ => None,
        })
        .collect()
}

pub(super) fn reason_of(decisions: &[Decision], job: &JobId) -> Option<WaitReason> {
    decisions.iter().find_map(|d| match d {
        Decision::Wait { job: j, reason } if j == job => Some(*reason),
        _ => None,
    })
}

#[test]
fn two_one_gpu_jobs_on_a_one_gpu_node_the_second_waits() {
    let queue = [job(1, GpuAmount::ONE), job(2, GpuAmount::ONE)];
    let decisions = run(&[node("n1", 1, 24_000)], &[], &queue);
    assert_eq!(started(&decisions).len(), 1);
    assert_eq!(started(&decisions)[0].0, &queue[0].id);
    assert_eq!(
        reason_of(&decisions, &queue[1].id),
        Some(WaitReason::Resources)
    );
}

#[test]
fn waiting_for_the_reason_already_recorded_is_no_decision() {
    let mut unchanged = job(2, GpuAmount::ONE);
    unchanged.recorded_reason = Some(WaitReason::Resources);
    let mut changed = job(3, GpuAmount::ONE);
    changed.recorded_reason = Some(WaitReason::Submitted);
    let queue = [job(1, GpuAmount::ONE), unchanged, changed];
    let decisions = run(&[node("n1", 1, 24_000)], &[], &queue);
    assert_eq!(started(&decisions).len(), 1);
    assert_eq!(reason_of(&decisions, &queue[1].id), None);
    assert_eq!(
        reason_of(&decisions, &queue[2].id),
        Some(WaitReason::Resources)
    );
    assert_eq!(decisions.len(), 2);
}

#[test]
fn higher_effective_priority_goes_first_even_when_younger() {
    let mut urgent = job(2, GpuAmount::ONE);
    urgent.effective_priority = 10;
    let decisions = run(
        &[node("n1", 1, 24_000)],
        &[],
        &[job(1, GpuAmount::ONE), urgent.clone()],
    );
    assert_eq!(started(&decisions)[0].0, &urgent.id);
}

#[test]
fn exact_ids_are_honoured_and_missing_ids_rejected() {
    let nodes = [node("n1", 4, 24_000)];
    let mut pinned = job(1, GpuAmount::whole(2));
    pinned.gpu_ids = Some(vec![1, 3]);
    assert_eq!(
        started(&run(&nodes, &[], &[pinned]))[0].1.gpu_indices(),
        vec![1, 3]
    );
    let mut missing = job(2, GpuAmount::ONE);
    missing.gpu_ids = Some(vec![7]);
    assert!(matches!(
        run(&nodes, &[], &[missing])[0],
        Decision::Reject { .. }
    ));
}

#[test]
fn allowed_gpus_restrict_without_pinning() {
    let mut picky = job(1, GpuAmount::ONE);
    picky.allowed_gpus = Some(vec![2, 3]);
    let decisions = run(
        &[node("n1", 4, 24_000)],
        &[running(1, "n1", &[2], None)],
        &[picky],
    );
    assert_eq!(started(&decisions)[0].1.gpu_indices(), vec![3]);
}

#[test]
fn shares_pack_onto_one_gpu_and_memory_is_booked() {
    let nodes = [node("n1", 2, 24_000)];
    let queue = [
        job(1, GpuAmount::from_units(5_000)),
        job(2, GpuAmount::from_units(5_000)),
    ];
    let decisions = run(&nodes, &[], &queue);
    let starts = started(&decisions);
    assert_eq!(starts.len(), 2);
    assert_eq!(starts[0].1.gpus[0].index, starts[1].1.gpus[0].index);

    let mut a = job(1, GpuAmount::from_units(2_500));
    a.mem_mib = Some(16_000);
    let mut b = job(2, GpuAmount::from_units(2_500));
    b.mem_mib = Some(16_000);
    assert_eq!(
        started(&run(&[node("n1", 1, 24_000)], &[], &[a, b])).len(),
        1
    );
}

#[test]
fn gpus_busy_with_other_peoples_work_are_not_offered() {
    let mut busy = node("n1", 2, 24_000);
    busy.gpus[0].foreign_mem_mib = 20_000; // above 0.8 of 24 000
    busy.gpus[1].utilization_pct = 95; // above 0.8 load, and no mgpu job on it
    let decisions = run(&[busy], &[], &[job(1, GpuAmount::ONE)]);
    assert!(started(&decisions).is_empty());
    let mut light = node("n1", 1, 24_000);
    light.gpus[0].foreign_mem_mib = 4_000;
    let mut needs = job(1, GpuAmount::ONE);
    needs.mem_mib = Some(22_000);
    assert!(
        started(&run(&[light], &[], &[needs])).is_empty(),
        "foreign memory is not free"
    );
}

#[test]
fn paused_gpus_and_drained_nodes_get_nothing_and_say_so() {
    let mut n = node("n1", 1, 24_000);
    n.gpus[0].paused = true;
    let decisions = run(&[n], &[], &[job(1, GpuAmount::ONE)]);
    assert_eq!(reason_of(&decisions, &id(1)), Some(WaitReason::GpusPaused));
    let mut d = node("n1", 1, 24_000);
    d.drained = true;
    let decisions = run(
        &[d],
        &[],
        &[job(1, GpuAmount::ONE), job(2, GpuAmount::ZERO)],
    );
    assert!(started(&decisions).is_empty());
}

#[test]
fn fill_first_packs_and_spread_spreads() {
    let nodes = [node("big", 8, 24_000), node("small", 2, 24_000)];
    let packed = run(&nodes, &[], &[job(1, GpuAmount::ONE)]);
    assert_eq!(started(&packed)[0].1.node, "small");
    let spread = plan::<_, RunningJob>(
        &nodes,
        &[],
        &[job(1, GpuAmount::ONE)],
        &CoreSettings {
            placement: PlacementPolicy::Spread,
            ..settings()
        },
        t0(),
    );
    assert_eq!(started(&spread)[0].1.node, "big");
}

#[test]
fn held_dependent_and_array_limited_jobs_wait_with_their_reason() {
    let nodes = [node("n1", 4, 24_000)];
    let mut held = job(1, GpuAmount::ONE);
    held.held = true;
    let mut dependent = job(2, GpuAmount::ONE);
    dependent.dependencies = Dependencies::Waiting;
    let mut broken = job(3, GpuAmount::ONE);
    broken.dependencies = Dependencies::Broken("dependency x failed".into());
    let array = JobId::random();
    let mut tasks: Vec<QueuedJob> = (4..7)
        .map(|n| {
            let mut t = job(n, GpuAmount::ZERO);
            t.array = Some((array.clone(), Some(2)));
            t
        })
        .collect();
    let mut queue = vec![held, dependent, broken];
    queue.append(&mut tasks);
    let decisions = run(&nodes, &[], &queue);
    assert_eq!(reason_of(&decisions, &id(1)), Some(WaitReason::Held));
    assert_eq!(reason_of(&decisions, &id(2)), Some(WaitReason::Dependency));
    assert!(decisions.contains(&Decision::Reject {
        job: id(3),
        reason: "dependency x failed".into()
    }));
    assert_eq!(
        started(&decisions).len(),
        2,
        "at most 2 tasks of the array at once"
    );
    assert_eq!(reason_of(&decisions, &id(6)), Some(WaitReason::ArrayLimit));
}

#[test]
fn a_task_requeued_from_a_silent_node_counts_against_its_array_until_the_fence() {
    let nodes = [node("n1", 4, 24_000)];
    let array = JobId::random();
    let task = |n: u32| {
        let mut t = job(n, GpuAmount::ONE);
        t.array = Some((array.clone(), Some(1)));
        t
    };
    // Task 1's first attempt may still run on its silent node for ten more seconds.
    let mut requeued = task(1);
    requeued.attempt = 2;
    requeued.not_before = Some(t0() + chrono::Duration::seconds(10));
    let queue = vec![requeued.clone(), task(2)];
    let decisions = run(&nodes, &[], &queue);
    assert!(started(&decisions).is_empty(), "{decisions:?}");
    assert_eq!(reason_of(&decisions, &id(1)), Some(WaitReason::Fencing));
    assert_eq!(reason_of(&decisions, &id(2)), Some(WaitReason::ArrayLimit));
    // Once the fence is past, one task of the two starts.
    requeued.not_before = Some(t0() - chrono::Duration::seconds(1));
    let decisions = run(&nodes, &[], &[requeued, task(2)]);
    assert_eq!(started(&decisions).len(), 1, "{decisions:?}");
}

#[test]
fn backfill_lets_short_jobs_through_and_keeps_long_ones_behind_the_reservation() {
    // 2 GPUs; GPU 0 busy for 100 s. A 2-GPU job waits at the head and reserves both GPUs from
    // t+100. A 50 s job may use GPU 1 now; an unlimited one may not.
    let nodes = [node("n1", 2, 24_000)];
    let holding = [running(1, "n1", &[0], Some(100))];
    let big = job(1, GpuAmount::whole(2));
    let mut short = job(2, GpuAmount::ONE);
    short.time_limit = Some(Duration::from_secs(50));
    let long = job(3, GpuAmount::ONE);
    let decisions = run(
        &nodes,
        &holding,
        &[big.clone(), short.clone(), long.clone()],
    );
    assert_eq!(reason_of(&decisions, &big.id), Some(WaitReason::Resources));
    assert_eq!(started(&decisions).len(), 1);
    assert_eq!(started(&decisions)[0].0, &short.id);
    // Without the short one, GPU 1 is free, yet the unlimited job must leave it to the big one.
    let decisions = run(&nodes, &holding, &[big.clone(), long.clone()]);
    assert!(started(&decisions).is_empty());
    assert_eq!(reason_of(&decisions, &long.id), Some(WaitReason::Priority));
}

#[test]
fn over_slice_jobs_are_preempted_only_when_someone_waits() {
    let nodes = [node("n1", 1, 24_000)];
    let mut over = running(1, "n1", &[0], None);
    over.slice_end = Some(t0() - chrono::Duration::seconds(1));
    let alone = run(&nodes, std::slice::from_ref(&over), &[]);
    assert!(alone.is_empty());
    let contended = run(&nodes, &[over.clone()], &[job(1, GpuAmount::ONE)]);
    assert!(contended.contains(&Decision::Preempt {
        job: over.id,
        for_job: None
    }));
}

#[test]
fn a_job_past_its_slice_does_not_yield_to_a_waiter_ranked_below_it_once_requeued() {
    let nodes = [node("n1", 1, 24_000)];
    let mut over = running(1, "n1", &[0], None);
    over.slice_end = Some(t0() - chrono::Duration::seconds(1));
    over.priority_if_requeued = 5_000_000;
    let mut lower = job(1, GpuAmount::ONE);
    lower.effective_priority = 4_999_999;
    let decisions = run(&nodes, std::slice::from_ref(&over), &[lower]);
    // Requeued, it would come first and take its GPU back at once: it keeps running.
    assert!(
        !decisions
            .iter()
            .any(|d| matches!(d, Decision::Preempt { .. })),
        "{decisions:?}"
    );
    let mut equal = job(2, GpuAmount::ONE);
    equal.effective_priority = 5_000_000;
    let decisions = run(&nodes, std::slice::from_ref(&over), &[equal]);
    // Ranked as high, it waited longer: it comes first once the job is requeued.
    assert!(
        decisions.contains(&Decision::Preempt {
            job: over.id.clone(),
            for_job: None
        }),
        "{decisions:?}"
    );
}

#[test]
fn impossible_requests_are_rejected_and_no_nodes_means_waiting() {
    let nodes = [node("n1", 2, 24_000)];
    let decisions = run(&nodes, &[], &[job(1, GpuAmount::whole(3))]);
    assert!(
        matches!(&decisions[0], Decision::Reject { reason, .. } if reason.contains("largest node has 2"))
    );
    let mut big = job(2, GpuAmount::ONE);
    big.mem_mib = Some(80_000);
    assert!(matches!(
        run(&nodes, &[], &[big])[0],
        Decision::Reject { .. }
    ));
    let decisions = run(&[], &[], &[job(3, GpuAmount::ONE)]);
    assert_eq!(reason_of(&decisions, &id(3)), Some(WaitReason::NoNodes));
    let mut offline = node("n1", 1, 24_000);
    offline.online = false;
    assert_eq!(
        reason_of(&run(&[offline], &[], &[job(4, GpuAmount::ONE)]), &id(4)),
        Some(WaitReason::NoNodes)
    );
}

fn amount() -> impl Strategy<Value = GpuAmount> {
    prop_oneof![
        (0u32..=3).prop_map(GpuAmount::whole),
        prop::sample::select(vec![2_500u32, 5_000, 7_500]).prop_map(GpuAmount::from_units),
    ]
}

pub(super) fn arb_queue() -> impl Strategy<Value = Vec<QueuedJob>> {
    prop::collection::vec(
        (
            amount(),
            prop::option::of(1_000u64..30_000),
            -2i64..3,
            prop::option::of(1u64..300),
            prop::option::of(prop::collection::vec(0u32..4, 1..3)),
            prop_oneof![4 => Just(1u32), 1 => 2u32..4],
        ),
        1..30,
    )
    .prop_map(|shapes| {
        shapes
            .into_iter()
            .enumerate()
            .map(|(i, (a, mem, prio, limit, ids, nodes))| {
                let mut j = job(i as u32, a);
                if a.is_whole() {
                    j.nodes = nodes;
                }
                j.mem_mib = if a.is_zero() { None } else { mem };
                j.effective_priority = prio;
                j.time_limit = limit.map(Duration::from_secs);
                if let Some(mut ids) = ids
                    && a.is_whole()
                    && !a.is_zero()
                {
                    ids.sort_unstable();
                    ids.dedup();
                    j.gpus = GpuAmount::whole(ids.len() as u32);
                    j.gpu_ids = Some(ids);
                }
                j
            })
            .collect()
    })
}

pub(super) fn arb_cluster() -> impl Strategy<Value = (Vec<NodeView>, Vec<RunningJob>)> {
    prop::collection::vec(
        (
            1u32..5,
            prop::collection::vec(any::<bool>(), 4),
            prop::collection::vec(prop::option::of(prop::option::of(1i64..500)), 4),
        ),
        1..4,
    )
    .prop_map(|specs| {
        let mut nodes = Vec::new();
        let mut holding = Vec::new();
        for (i, (gpus, paused, busy)) in specs.into_iter().enumerate() {
            let name = format!("n{i}");
            let mut n = node(&name, gpus, 24_000);
            for (g, p) in n.gpus.iter_mut().zip(&paused) {
                g.paused = *p && g.index % 2 == 1;
            }
            for (g, b) in busy.iter().enumerate().take(gpus as usize) {
                if let Some(ends) = b {
                    holding.push(running((i * 10 + g) as u32, &name, &[g as u32], *ends));
                }
            }
            nodes.push(n);
        }
        (nodes, holding)
    })
}

proptest! {
    #[test]
    fn allocations_respect_capacity_memory_pins_and_pauses(
        (nodes, holding) in arb_cluster(),
        queue in arb_queue(),
    ) {
        let decisions = run(&nodes, &holding, &queue);
        let mut units: BTreeMap<(String, u32), u32> = BTreeMap::new();
        let mut mem: BTreeMap<(String, u32), u64> = BTreeMap::new();
        for h in &holding {
            for s in &h.placement.gpus {
                *units.entry((h.placement.node.clone(), s.index)).or_default() += s.amount.units();
            }
        }
        for (job_id, placement) in started(&decisions) {
            let job = queue.iter().find(|j| &j.id == job_id);
            prop_assert!(job.is_some());
            let job = job.unwrap_or_else(|| unreachable!());
            // Gang allocation: exactly the nodes asked for, all distinct.
            let mut names = placement.node_names();
            prop_assert_eq!(names.len(), job.nodes as usize);
            names.sort_unstable();
            names.dedup();
            prop_assert_eq!(names.len(), job.nodes as usize, "a node twice in one job");
            for (_, node_name, shares) in placement.ranks() {
                if let Some(ids) = &job.gpu_ids {
                    let got: Vec<u32> = shares.iter().map(|g| g.index).collect();
                    prop_assert_eq!(&got, ids);
                }
                let n = nodes.iter().find(|n| n.name == node_name);
                prop_assert!(n.is_some_and(|n| !n.drained));
                for share in shares {
                    let gpu = n.and_then(|n| n.gpus.iter().find(|g| g.index == share.index));
                    prop_assert!(gpu.is_some_and(|g| !g.paused), "a paused GPU got work");
                    *units.entry((node_name.to_owned(), share.index)).or_default() += share.amount.units();
                    *mem.entry((node_name.to_owned(), share.index)).or_default() += share.mem_mib;
                }
            }
        }
        prop_assert!(units.values().all(|u| *u <= GpuAmount::UNITS_PER_GPU));
        prop_assert!(mem.values().all(|m| *m <= 24_000));
    }

    #[test]
    fn a_fitting_higher_priority_job_is_never_passed_over(
        (nodes, holding) in arb_cluster(),
        queue in arb_queue(),
    ) {
        let decisions = run(&nodes, &holding, &queue);
        // Every job that waits for GPUs alone ("Resources") must not fit in what is left once
        // the jobs ahead of it started: re-planning it alone on that remainder starts nothing.
        let mut remaining = holding.clone();
        for (job_id, placement) in started(&decisions) {
            remaining.push(RunningJob { id: job_id.clone(), owner: String::new(), placement: placement.clone(), expected_end: None, slice_end: None, array_id: None, started_at: t0(), qos: None, preemptible_from: None, stopping: false, may_preempt: false, reclaimable_from: None, reservation: None, priority_if_requeued: i64::MIN });
        }
        for job in &queue {
            if reason_of(&decisions, &job.id) == Some(WaitReason::Resources) {
                let alone = run(&nodes, &remaining, std::slice::from_ref(job));
                prop_assert!(started(&alone).is_empty(), "job {} fit but waited", job.id);
            }
        }
    }

    #[test]
    fn backfill_never_delays_a_reservation(
        (nodes, holding) in arb_cluster(),
        queue in arb_queue(),
    ) {
        let (decisions, reservations) =
            plan_with_reservations(&nodes, &holding, &queue, &settings(), t0());
        let mut ordered = queue.clone();
        ordered.sort_by(queue_order);
        for (job_id, placement) in started(&decisions) {
            let job = ordered.iter().find(|j| &j.id == job_id);
            prop_assert!(job.is_some());
            let job = job.unwrap_or_else(|| unreachable!());
            let ends = job.time_limit.and_then(|l| chrono::Duration::from_std(l).ok()).map(|l| t0() + l);
            let position = ordered.iter().position(|j| &j.id == job_id);
            for r in &reservations {
                // Only jobs behind the one the reservation is for may not delay it.
                let reserved_for = ordered.iter().position(|j| j.id == r.job);
                if position <= reserved_for {
                    continue;
                }
                for (_, node_name, shares) in placement.ranks() {
                    for share in shares {
                        prop_assert!(
                            !r.blocks(node_name, share.index, ends),
                            "job {} took reserved GPU {}:{}", job_id, node_name, share.index
                        );
                    }
                }
            }
        }
    }
}

fn labelled(name: &str, gpus: u32, rack: &str) -> NodeView {
    let mut n = node(name, gpus, 24_000);
    n.labels.insert("rack".into(), rack.into());
    n
}

fn multi(n: u32, nodes: u32, gpus_per_node: u32) -> QueuedJob {
    let mut j = job(n, GpuAmount::whole(gpus_per_node));
    j.nodes = nodes;
    j
}

#[test]
fn a_multi_node_job_gets_all_its_nodes_or_none() {
    let nodes = [
        node("a", 2, 24_000),
        node("b", 2, 24_000),
        node("c", 2, 24_000),
    ];
    // Two nodes free of three: a three-node job waits and holds nothing (no half placement;
    // reservations off here), so a small job behind it still starts on what is free.
    let busy = [running(1, "c", &[0], None)];
    let queue = [multi(1, 3, 2), job(2, GpuAmount::ONE)];
    let no_reservations = CoreSettings {
        max_reservations: 0,
        ..settings()
    };
    let decisions = plan(&nodes, &busy, &queue, &no_reservations, t0());
    let starts = started(&decisions);
    assert_eq!(starts.len(), 1);
    assert_eq!(starts[0].0, &queue[1].id);
    assert_eq!(
        reason_of(&decisions, &queue[0].id),
        Some(WaitReason::Resources)
    );
    // All free: it gets three distinct nodes with two GPUs each.
    let decisions = run(&nodes, &[], &queue[..1]);
    let starts = started(&decisions);
    assert_eq!(starts.len(), 1);
    let placement = starts[0].1;
    assert_eq!(placement.node_count(), 3);
    for (_, _, gpus) in placement.ranks() {
        assert_eq!(gpus.len(), 2);
    }
}

#[test]
fn nodelist_exclude_and_node_gpu_ids_are_obeyed() {
    let nodes = [
        node("a", 2, 24_000),
        node("b", 2, 24_000),
        node("c", 2, 24_000),
    ];
    let mut listed = multi(1, 2, 1);
    listed.required_nodes = vec!["c".into(), "a".into()];
    let decisions = run(&nodes, &[], std::slice::from_ref(&listed));
    assert_eq!(started(&decisions)[0].1.node_names(), vec!["c", "a"]);

    let mut excluded = multi(2, 2, 1);
    excluded.exclude = vec!["a".into()];
    let decisions = run(&nodes, &[], std::slice::from_ref(&excluded));
    let names = started(&decisions)[0].1.node_names();
    assert!(!names.contains(&"a"), "{names:?}");

    let mut pinned = multi(3, 2, 2);
    pinned.node_gpu_ids = vec![
        NodeGpuIds {
            node: "b".into(),
            gpu_ids: vec![1, 0],
        },
        NodeGpuIds {
            node: "c".into(),
            gpu_ids: vec![0, 1],
        },
    ];
    pinned.required_nodes = vec!["b".into(), "c".into()];
    let decisions = run(&nodes, &[], std::slice::from_ref(&pinned));
    let placement = started(&decisions)[0].1;
    assert_eq!(placement.node_names(), vec!["b", "c"]);
    assert_eq!(placement.gpu_indices(), vec![1, 0]);
    // A pinned GPU busy: the whole job waits.
    let decisions = run(&nodes, &[running(1, "c", &[1], None)], &[pinned]);
    assert!(started(&decisions).is_empty());
}

#[test]
fn multi_node_jobs_prefer_nodes_sharing_a_rack() {
    // Fill-first alone would pick the two fullest nodes (a1 and b1, one rack each).
    let nodes = [
        labelled("a1", 2, "r1"),
        labelled("a2", 4, "r1"),
        labelled("b1", 2, "r2"),
        labelled("b2", 4, "r2"),
    ];
    let busy = [running(1, "a1", &[0], None), running(2, "b1", &[0], None)];
    let decisions = run(&nodes, &busy, &[multi(1, 2, 1)]);
    let mut names = started(&decisions)[0].1.node_names();
    names.sort_unstable();
    assert!(
        names == vec!["a1", "a2"] || names == vec!["b1", "b2"],
        "expected one rack, got {names:?}"
    );
    // With the preference off, packing wins.
    let mut off = settings();
    off.topology_label = None;
    let decisions = plan(&nodes, &busy, &[multi(1, 2, 1)], &off, t0());
    let mut names = started(&decisions)[0].1.node_names();
    names.sort_unstable();
    assert_eq!(names, vec!["a1", "b1"]);
    // A required node's rack is preferred for the rest.
    let mut listed = multi(2, 2, 1);
    listed.required_nodes = vec!["b2".into()];
    let decisions = run(&nodes, &busy, &[listed]);
    assert_eq!(started(&decisions)[0].1.node_names(), vec!["b2", "b1"]);
}

#[test]
fn impossible_multi_node_requests_are_rejected_with_the_reason() {
    let nodes = [node("a", 2, 24_000), node("b", 2, 24_000)];
    let reject = |j: QueuedJob| {
        run(&nodes, &[], &[j]).into_iter().find_map(|d| match d {
            Decision::Reject { reason, .. } => Some(reason),
            _ => None,
        })
    };
    let too_many = reject(multi(1, 3, 1)).unwrap_or_default();
    assert!(too_many.contains("asks for 3 nodes"), "{too_many}");
    let mut unknown = multi(2, 2, 1);
    unknown.required_nodes = vec!["zz".into()];
    let unknown = reject(unknown).unwrap_or_default();
    assert!(unknown.contains("node zz is not known"), "{unknown}");
    let mut excluded = multi(3, 2, 1);
    excluded.exclude = vec!["b".into()];
    assert!(reject(excluded).is_some());
    assert!(reject(multi(4, 2, 2)).is_none());
}

#[test]
fn a_waiting_multi_node_job_reserves_gpus_on_every_node_it_needs() {
    let nodes = [node("a", 1, 24_000), node("b", 1, 24_000)];
    // a frees at 100 s, b at 200 s: the two-node job starts at 200 s on both.
    let busy = [
        running(1, "a", &[0], Some(100)),
        running(2, "b", &[0], Some(200)),
    ];
    let (_, reservations) =
        plan_with_reservations(&nodes, &busy, &[multi(1, 2, 1)], &settings(), t0());
    assert_eq!(reservations.len(), 1);
    assert_eq!(reservations[0].gpus.len(), 2);
    assert_eq!(
        reservations[0].start,
        Some(t0() + chrono::Duration::seconds(200))
    );
}

/// A full cluster of 1 000 nodes x 8 GPUs and 100 000 alike jobs waiting: a pass must not
/// search every GPU for every job. Counted, not timed: jobs of one shape cost one search
/// per pass, so the pass answers within the time a handful of searches take even in a
/// debug build (the release figure is the benchmark's, `scripts/bench.sh --only scale`).
#[test]
fn a_long_queue_of_alike_jobs_on_a_full_cluster_is_planned_without_a_search_per_job() {
    let nodes: Vec<NodeView> = (0..1000)
        .map(|n| node(&format!("n{n:04}"), 8, 81_920))
        .collect();
    let holding: Vec<RunningJob> = (0..8000u32)
        .map(|n| running(1_000_000 + n, &format!("n{:04}", n / 8), &[n % 8], None))
        .collect();
    let queue: Vec<QueuedJob> = (0..100_000u32).map(|n| job(n, GpuAmount::ONE)).collect();
    let started = std::time::Instant::now();
    let decisions = run(&nodes, &holding, &queue);
    let took = started.elapsed();
    assert_eq!(decisions.len(), 100_000);
    assert!(decisions.iter().all(|d| matches!(
        d,
        Decision::Wait {
            reason: WaitReason::Resources,
            ..
        }
    )));
    eprintln!("planned 100 000 jobs on 8 000 busy GPUs in {took:?}");
}

/// A node with `gpus` GPUs that counts `cpus` cores and `mem_host_mib` of host memory.
fn host_node(name: &str, gpus: u32, cpus: u32, mem_host_mib: u64) -> NodeView {
    NodeView {
        cpus: Some(cpus),
        mem_host_mib: Some(mem_host_mib),
        ..node(name, gpus, 24_000)
    }
}

fn with_host(mut queued: QueuedJob, cpus: u32, mem_host_mib: u64) -> QueuedJob {
    queued.cpus = cpus;
    queued.mem_host_mib = mem_host_mib;
    queued
}

#[test]
fn cores_are_counted_like_gpus_and_the_third_one_core_job_on_two_cores_waits() {
    let nodes = [host_node("n1", 0, 2, 8192)];
    let queue: Vec<QueuedJob> = (1..=3)
        .map(|n| with_host(job(n, GpuAmount::ZERO), 1, 0))
        .collect();
    let decisions = run(&nodes, &[], &queue);
    let placed = started(&decisions);
    assert_eq!(placed.len(), 2, "{decisions:?}");
    assert!(placed.iter().all(|(_, placement)| placement.cpus == 1));
    assert_eq!(
        reason_of(&decisions, &queue[2].id),
        Some(WaitReason::Resources)
    );
    // Booked by a running job, the cores are not offered again.
    let mut holding = running(1, "n1", &[], None);
    holding.placement.cpus = 2;
    let decisions = run(&nodes, &[holding], &queue[..1]);
    assert!(started(&decisions).is_empty(), "{decisions:?}");
}

#[test]
fn host_memory_is_booked_and_a_node_without_room_is_passed_over() {
    let nodes = [host_node("a", 1, 8, 1024), host_node("b", 1, 8, 4096)];
    let decisions = run(&nodes, &[], &[with_host(job(1, GpuAmount::ONE), 0, 2048)]);
    let placed = started(&decisions);
    assert_eq!(placed.len(), 1);
    assert_eq!(placed[0].1.node, "b");
    assert_eq!(placed[0].1.mem_host_mib, 2048);
    // Nodes that do not count host resources take anything.
    let uncounted = run(
        &[node("c", 1, 24_000)],
        &[],
        &[with_host(job(2, GpuAmount::ONE), 512, 1 << 30)],
    );
    assert_eq!(started(&uncounted).len(), 1);
}

#[test]
fn more_cores_or_host_memory_than_any_node_has_is_rejected_with_the_reason() {
    let nodes = [host_node("n1", 1, 2, 4096), host_node("n2", 1, 4, 2048)];
    let reject = |queued: QueuedJob| match run(&nodes, &[], &[queued]).first() {
        Some(Decision::Reject { reason, .. }) => reason.clone(),
        other => panic!("{other:?}"),
    };
    let cpus = reject(with_host(job(1, GpuAmount::ONE), 5, 0));
    assert_eq!(
        cpus,
        "asks for 5 CPU cores on one node; the largest node has 4"
    );
    let mem = reject(with_host(job(2, GpuAmount::ZERO), 0, 8192));
    assert_eq!(
        mem,
        "asks for 8 GiB of host memory on one node; the largest node has 4 GiB"
    );
    // Each fits some node, but not both on one.
    let both = reject(with_host(job(3, GpuAmount::ONE), 4, 4096));
    assert!(both.contains("host memory"), "{both}");
}

#[test]
fn a_job_past_its_slice_yields_only_to_a_waiter_its_gpus_would_let_start() {
    let nodes = [node("n1", 2, 24_000)];
    let mut over = running(1, "n1", &[0], None);
    over.slice_end = Some(t0() - chrono::Duration::seconds(1));
    let steady = running(2, "n1", &[1], None);
    let holding = [over.clone(), steady];
    // Two GPUs on one node: the one GPU the job past its slice frees cannot serve it.
    let mut two = job(1, GpuAmount::whole(2));
    two.time_limit = None;
    let decisions = run(&nodes, &holding, &[two]);
    assert!(
        !decisions.contains(&Decision::Preempt {
            job: over.id.clone(),
            for_job: None
        }),
        "{decisions:?}"
    );
    // One GPU: what it frees is exactly what the waiter needs.
    let decisions = run(&nodes, &holding, &[job(2, GpuAmount::ONE)]);
    assert!(
        decisions.contains(&Decision::Preempt {
            job: over.id.clone(),
            for_job: None
        }),
        "{decisions:?}"
    );
    // A waiter held back by something else (its dependencies) is no reason to yield.
    let mut held = job(3, GpuAmount::ONE);
    held.dependencies = Dependencies::Waiting;
    let decisions = run(&nodes, &holding, &[held]);
    assert!(
        !decisions
            .iter()
            .any(|d| matches!(d, Decision::Preempt { .. }))
    );
}
