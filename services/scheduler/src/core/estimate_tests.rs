//! Stories and properties of the expected starts.

use std::time::Duration;

use proptest::prelude::*;

use super::tests::{arb_cluster, arb_queue, job, node, running, settings, t0};
use super::*;
use mgpu_protocol::gpu_amount::GpuAmount;

fn limited(n: u32, minutes: u64) -> QueuedJob {
    let mut queued = job(n, GpuAmount::ONE);
    queued.time_limit = Some(Duration::from_secs(minutes * 60));
    queued
}

fn minutes(m: i64) -> Option<Timestamp> {
    Some(t0() + chrono::Duration::minutes(m))
}

#[test]
fn jobs_waiting_for_one_busy_gpu_are_dated_one_after_another() {
    // One GPU, busy for ten more minutes; three ten-minute jobs wait.
    let nodes = [node("n1", 1, 24_000)];
    let busy = [running(1, "n1", &[0], Some(600))];
    let queue = [limited(1, 10), limited(2, 10), limited(3, 10)];
    let one_reservation = CoreSettings {
        max_reservations: 1,
        ..settings()
    };
    let plan = plan_with_estimates(&nodes, &busy, &queue, &one_reservation, t0());
    let dated: Vec<(&JobId, Option<Timestamp>, bool)> = plan
        .estimates
        .iter()
        .map(|e| (&e.job, e.at, e.reserved))
        .collect();
    // The first holds the reservation; the others are dated one after another, each when
    // the one before it would end by its time limit.
    assert_eq!(
        dated,
        [
            (&queue[0].id, minutes(10), true),
            (&queue[1].id, minutes(20), false),
            (&queue[2].id, minutes(30), false),
        ]
    );
    // A job without a time limit ahead: what comes after it cannot be dated.
    let mut unlimited = queue.clone();
    unlimited[1].time_limit = None;
    let plan = plan_with_estimates(&nodes, &busy, &unlimited, &one_reservation, t0());
    let starts: Vec<Option<Timestamp>> = plan.estimates.iter().map(|e| e.at).collect();
    assert_eq!(starts, [minutes(10), minutes(20), None]);
}

#[test]
fn without_a_time_limit_on_its_gpus_a_start_is_unknown() {
    let nodes = [node("n1", 1, 24_000)];
    let busy = [running(1, "n1", &[0], None)];
    let plan = plan_with_estimates(&nodes, &busy, &[limited(1, 10)], &settings(), t0());
    assert_eq!(plan.estimates.len(), 1);
    assert_eq!(plan.estimates[0].at, None);
    assert_eq!(plan.estimates[0].gpus, [("n1".to_owned(), 0)]);
}

#[test]
fn estimates_go_past_the_reservations_on_other_gpus() {
    // Four GPUs freeing up at 10, 20, 30 and 40 minutes; four one-GPU jobs wait, and only
    // the first may hold a reservation.
    let nodes = [node("n1", 4, 24_000)];
    let busy: Vec<RunningJob> = (0..4)
        .map(|i| running(i, "n1", &[i], Some(600 * (i64::from(i) + 1))))
        .collect();
    let queue: Vec<QueuedJob> = (1..=4).map(|n| limited(n, 60)).collect();
    let one_reservation = CoreSettings {
        max_reservations: 1,
        ..settings()
    };
    let plan = plan_with_estimates(&nodes, &busy, &queue, &one_reservation, t0());
    let dated: Vec<(&JobId, Option<Timestamp>, bool)> = plan
        .estimates
        .iter()
        .map(|e| (&e.job, e.at, e.reserved))
        .collect();
    assert_eq!(
        dated,
        [
            (&queue[0].id, minutes(10), true),
            (&queue[1].id, minutes(20), false),
            (&queue[2].id, minutes(30), false),
            (&queue[3].id, minutes(40), false),
        ]
    );
    // No estimates asked for: the reservation alone.
    let none = CoreSettings {
        max_start_estimates: 0,
        ..one_reservation
    };
    let plan = plan_with_estimates(&nodes, &busy, &queue, &none, t0());
    assert_eq!(plan.estimates.len(), 1);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn estimates_change_no_decision(
        (nodes, holding) in arb_cluster(),
        queue in arb_queue(),
        reservations in 0usize..4,
    ) {
        let without = CoreSettings {
            max_reservations: reservations,
            max_start_estimates: 0,
            ..settings()
        };
        let with = CoreSettings {
            max_start_estimates: 64,
            ..without.clone()
        };
        let plain = plan(&nodes, &holding, &queue, &without, t0());
        let dated = plan_with_estimates(&nodes, &holding, &queue, &with, t0());
        prop_assert_eq!(plain, dated.decisions);
    }

    #[test]
    fn no_gpu_is_counted_on_twice_at_once_and_no_start_is_in_the_past(
        (nodes, holding) in arb_cluster(),
        queue in arb_queue(),
        reservations in 0usize..4,
    ) {
        let settings = CoreSettings { max_reservations: reservations, ..settings() };
        let plan = plan_with_estimates(&nodes, &holding, &queue, &settings, t0());
        prop_assert!(overlapping(&plan.estimates).is_none(), "{:?}", overlapping(&plan.estimates));
        for estimate in &plan.estimates {
            prop_assert!(estimate.at.is_none_or(|at| at >= t0()));
            let started = plan.decisions.iter().any(|d| {
                matches!(d, Decision::Start { job, .. } if job == &estimate.job)
            });
            prop_assert!(!started, "job {} started and dated", estimate.job);
        }
    }
}

/// A dated job: its id, when, and on which GPUs.
type Dated = (JobId, Option<Timestamp>, Vec<(String, u32)>);

/// What dating `jobs` gives when each is reserved for from scratch, looking at every node:
/// what the timeline's kept offers must give too.
fn dated_from_scratch(
    nodes: &[NodeView],
    holding: &[RunningJob],
    jobs: &[QueuedJob],
) -> Vec<Dated> {
    let running: Vec<&RunningJob> = holding.iter().collect();
    let capacity = super::capacity::Capacity::new(nodes, &running);
    let mut releases =
        super::reservation::ReleaseTimes::new(&capacity, running.iter().copied(), t0());
    let nothing = super::reservation::ReservedGpus::default();
    let any_type = |_: Option<&str>| true;
    let no_windows = Vec::new();
    let windows =
        super::windows::WindowIndex::new(&no_windows, &capacity, chrono::Duration::zero(), t0());
    let mut dated = Vec::new();
    for job in jobs {
        let among = super::reservation::Among {
            reserved: &nothing,
            type_allowed: &any_type,
            windows: &windows,
            guest: windows.guest(job),
        };
        if let Some(made) =
            super::reservation::reserve(&capacity, nodes, &releases, job, &among, t0())
        {
            releases.hold_until(&capacity, &made.gpus, made.ends);
            dated.push((made.job, made.start, made.gpus));
        }
    }
    dated
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn the_timeline_dates_as_reserving_from_scratch_would(
        (nodes, holding) in arb_cluster(),
        mut queue in arb_queue(),
    ) {
        queue.sort_by(super::queue_order);
        let running: Vec<&RunningJob> = holding.iter().collect();
        let capacity = super::capacity::Capacity::new(&nodes, &running);
        let releases = super::reservation::ReleaseTimes::new(&capacity, running.iter().copied(), t0());
        let caps = Default::default();
        let type_caps = Default::default();
        let class_caps = Default::default();
        let owner_gpus = super::owner_gpus::OwnerGpus::new(&caps, &type_caps, &class_caps, &running, &nodes);
        let mut timeline = super::estimate::Timeline::after(&capacity, &releases, &[]);
        let no_windows = Vec::new();
        let windows = super::windows::WindowIndex::new(&no_windows, &capacity, chrono::Duration::zero(), t0());
        let dates = super::estimate::Dates { capacity: &capacity, nodes: &nodes, owner_gpus: &owner_gpus, windows: &windows, now: t0() };
        let jobs: Vec<&QueuedJob> = queue.iter().collect();
        let kept: Vec<Dated> = timeline
            .date(&jobs, &dates)
            .into_iter()
            .map(|r| (r.job, r.start, r.gpus))
            .collect();
        prop_assert_eq!(kept, dated_from_scratch(&nodes, &holding, &queue));
    }
}
