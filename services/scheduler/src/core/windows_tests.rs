//! Stories and properties of reservations' windows in a pass (`windows.rs`).

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::tests::{job, node, reason_of, running, settings, started, t0};
use super::*;
use mgpu_protocol::gpu_amount::GpuAmount;

fn minutes(n: i64) -> chrono::Duration {
    chrono::Duration::minutes(n)
}

/// Reservation `name` of GPUs 0 and 1 of `n1`, from `opens` to `closes` minutes after t0.
fn window(name: &str, opens: i64, closes: i64) -> Window {
    Window {
        name: name.into(),
        gpus: vec![("n1".into(), 0), ("n1".into(), 1)],
        start: t0() + minutes(opens),
        end: t0() + minutes(closes),
    }
}

fn with_windows(windows: Vec<Window>) -> CoreSettings {
    CoreSettings {
        windows: Arc::new(windows),
        ..settings()
    }
}

fn limited(n: u32, gpus: u32, limit_minutes: u64) -> QueuedJob {
    let mut queued = job(n, GpuAmount::whole(gpus));
    queued.time_limit = Some(Duration::from_secs(limit_minutes * 60));
    queued
}

fn member(n: u32, gpus: u32, limit_minutes: u64, of: &str) -> QueuedJob {
    let mut queued = limited(n, gpus, limit_minutes);
    queued.reservation = Some(of.into());
    queued
}

fn gpus_of(placement: &Placement) -> Vec<(String, u32)> {
    placement
        .ranks()
        .flat_map(|(_, node, shares)| shares.iter().map(move |s| (node.to_owned(), s.index)))
        .collect()
}

#[test]
fn inside_an_open_window_only_its_members_take_its_gpus() {
    let nodes = [node("n1", 2, 80_000)];
    let settings = with_windows(vec![window("paper", -10, 60)]);
    let queue = [limited(1, 1, 5), member(2, 2, 30, "paper")];
    let decisions = plan(&nodes, &[] as &[RunningJob], &queue, &settings, t0());
    let starts = started(&decisions);
    assert_eq!(starts.len(), 1, "{decisions:?}");
    assert_eq!(starts[0].0, &queue[1].id);
    assert_eq!(
        reason_of(&decisions, &queue[0].id),
        Some(WaitReason::Reserved)
    );
}

#[test]
fn a_member_runs_only_on_its_windows_gpus() {
    let nodes = [node("n1", 4, 80_000)];
    let settings = with_windows(vec![window("paper", -10, 60)]);
    // Three GPUs asked; the window has two: it waits, though n1 has four free.
    let queue = [member(1, 3, 30, "paper"), member(2, 1, 30, "paper")];
    let decisions = plan(&nodes, &[] as &[RunningJob], &queue, &settings, t0());
    let starts = started(&decisions);
    assert_eq!(starts.len(), 1, "{decisions:?}");
    assert_eq!(starts[0].0, &queue[1].id);
    for gpu in gpus_of(starts[0].1) {
        assert!(gpu.1 < 2, "a member left its window: {gpu:?}");
    }
}

#[test]
fn before_its_window_a_member_waits_and_one_that_would_outlast_it_is_rejected() {
    let nodes = [node("n1", 2, 80_000)];
    let settings = with_windows(vec![window("paper", 10, 60)]);
    let queue = [
        member(1, 1, 30, "paper"),
        member(2, 1, 90, "paper"),
        member(3, 1, 10, "gone"),
    ];
    let decisions = plan(&nodes, &[] as &[RunningJob], &queue, &settings, t0());
    assert!(started(&decisions).is_empty(), "{decisions:?}");
    assert_eq!(
        reason_of(&decisions, &queue[0].id),
        Some(WaitReason::ReservationWindow)
    );
    let rejected: Vec<&JobId> = decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Reject { job, .. } => Some(job),
            _ => None,
        })
        .collect();
    assert_eq!(rejected, vec![&queue[1].id, &queue[2].id]);
}

#[test]
fn before_a_window_others_start_on_its_gpus_only_when_gone_by_then() {
    let nodes = [node("n1", 2, 80_000)];
    let settings = with_windows(vec![window("paper", 30, 90)]);
    // Ends in 20 minutes, before the window: starts. Ends in 40: waits. No limit, window
    // within the horizon (24 h): waits.
    let short = limited(1, 1, 20);
    let long = limited(2, 1, 40);
    let endless = job(3, GpuAmount::ONE);
    let queue = [short.clone(), long.clone(), endless.clone()];
    let decisions = plan(&nodes, &[] as &[RunningJob], &queue, &settings, t0());
    let starts = started(&decisions);
    assert_eq!(starts.len(), 1, "{decisions:?}");
    assert_eq!(starts[0].0, &short.id);
    assert_eq!(reason_of(&decisions, &long.id), Some(WaitReason::Reserved));
    assert_eq!(
        reason_of(&decisions, &endless.id),
        Some(WaitReason::Reserved)
    );
}

#[test]
fn a_job_without_a_time_limit_starts_on_booked_gpus_beyond_the_horizon() {
    let nodes = [node("n1", 2, 80_000)];
    let mut settings = with_windows(vec![window("paper", 3 * 60, 4 * 60)]);
    settings.reservation_horizon = chrono::Duration::hours(2);
    let queue = [job(1, GpuAmount::ONE)];
    let decisions = plan(&nodes, &[] as &[RunningJob], &queue, &settings, t0());
    assert_eq!(started(&decisions).len(), 1, "{decisions:?}");
    settings.reservation_horizon = chrono::Duration::hours(4);
    let decisions = plan(&nodes, &[] as &[RunningJob], &queue, &settings, t0());
    assert!(started(&decisions).is_empty(), "{decisions:?}");
}

#[test]
fn a_preemptible_job_starts_before_a_window_if_it_runs_its_minimum_and_leaves_when_it_opens() {
    let nodes = [node("n1", 2, 80_000)];
    let before = with_windows(vec![window("paper", 30, 90)]);
    let mut scavenger = job(1, GpuAmount::ONE);
    scavenger.preemptible = true;
    scavenger.stoppable_after = Some(Duration::from_secs(10 * 60));
    let decisions = plan(
        &nodes,
        &[] as &[RunningJob],
        &[scavenger.clone()],
        &before,
        t0(),
    );
    assert_eq!(started(&decisions).len(), 1, "{decisions:?}");
    // Its minimum would run past the window's start: it waits.
    scavenger.stoppable_after = Some(Duration::from_secs(40 * 60));
    let decisions = plan(&nodes, &[] as &[RunningJob], &[scavenger], &before, t0());
    assert!(started(&decisions).is_empty(), "{decisions:?}");
    // Once the window is open, a preemptible job on its GPUs is stopped for it; one not
    // preemptible, and one of the window, are left alone.
    let mut wide = window("paper", -1, 60);
    wide.gpus.push(("n1".into(), 2));
    let open = with_windows(vec![wide]);
    let mut on_window = running(7, "n1", &[0], None);
    on_window.preemptible_from = Some(t0() - minutes(5));
    let mut inside = running(8, "n1", &[1], None);
    inside.preemptible_from = Some(t0() - minutes(5));
    inside.reservation = Some("paper".into());
    let stuck = running(9, "n1", &[2], None);
    let vacated = on_window.id.clone();
    let holding = [on_window, inside, stuck];
    let nodes = [node("n1", 3, 80_000)];
    let decisions = plan(&nodes, &holding, &[] as &[QueuedJob], &open, t0());
    assert_eq!(
        decisions,
        vec![Decision::Vacate {
            job: vacated,
            window: "paper".into()
        }]
    );
}

#[test]
fn a_job_of_a_window_not_open_yet_is_dated_at_its_start() {
    // GPUs 2 and 3 are free now: a member is dated on the window's, when it opens.
    let nodes = [node("n1", 4, 80_000)];
    let settings = with_windows(vec![window("paper", 30, 90)]);
    let queue = [member(1, 1, 20, "paper")];
    let planned = plan_with_estimates(&nodes, &[] as &[RunningJob], &queue, &settings, t0());
    let estimate = planned.estimates.first().map(|e| (e.at, e.gpus.clone()));
    let on_window = |gpus: &Vec<(String, u32)>| gpus.iter().all(|(_, i)| *i < 2);
    assert!(
        estimate
            .as_ref()
            .is_some_and(|(at, gpus)| *at == Some(t0() + minutes(30)) && on_window(gpus)),
        "{planned:?}"
    );
}

#[test]
fn a_job_waiting_for_booked_gpus_is_dated_after_the_window() {
    let nodes = [node("n1", 2, 80_000)];
    let settings = with_windows(vec![window("paper", 30, 90)]);
    let queue = [limited(1, 2, 40)];
    let planned = plan_with_estimates(&nodes, &[] as &[RunningJob], &queue, &settings, t0());
    let estimate = planned.estimates.first().map(|e| e.at);
    assert_eq!(estimate, Some(Some(t0() + minutes(90))), "{planned:?}");
}

fn arb_window() -> impl Strategy<Value = (i64, i64, Vec<u32>)> {
    (
        -30i64..60,
        5i64..60,
        prop::collection::btree_set(0u32..4, 1..4),
    )
        .prop_map(|(opens, length, gpus)| (opens, opens + length, gpus.into_iter().collect()))
}

fn arb_job() -> impl Strategy<Value = (u32, Option<u64>, bool, bool)> {
    (
        1u32..3,
        prop::option::of(1u64..120),
        any::<bool>(),
        any::<bool>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Whatever the windows and the queue, no start breaks a window: a member starts only on
    /// its window's GPUs while it is open and ends before it closes; any other job starts on
    /// a booked GPU only before its window, gone (by its limit) when it opens.
    #[test]
    fn no_start_breaks_a_window(
        windows in prop::collection::vec(arb_window(), 0..3),
        jobs in prop::collection::vec(arb_job(), 1..8),
    ) {
        // Windows on one GPU never overlap: booking refuses that; keep the first of each.
        let mut kept: Vec<Window> = Vec::new();
        for (n, (opens, closes, gpus)) in windows.into_iter().enumerate() {
            let candidate = Window {
                name: format!("w{n}"),
                gpus: gpus.iter().map(|g| ("n1".to_owned(), *g)).collect(),
                start: t0() + minutes(opens),
                end: t0() + minutes(closes),
            };
            let clash = kept.iter().any(|w| {
                w.start < candidate.end && candidate.start < w.end
                    && w.gpus.iter().any(|g| candidate.gpus.contains(g))
            });
            if !clash {
                kept.push(candidate);
            }
        }
        let names: Vec<String> = kept.iter().map(|w| w.name.clone()).collect();
        let queue: Vec<QueuedJob> = jobs
            .into_iter()
            .enumerate()
            .map(|(n, (gpus, limit, in_window, preemptible))| {
                let mut queued = job(n as u32 + 1, GpuAmount::whole(gpus));
                queued.time_limit = limit.map(|m| Duration::from_secs(m * 60));
                queued.preemptible = preemptible && !in_window;
                queued.stoppable_after = queued.preemptible.then_some(Duration::ZERO);
                if in_window && !names.is_empty() {
                    queued.reservation = Some(names[n % names.len()].clone());
                }
                queued
            })
            .collect();
        let settings = with_windows(kept.clone());
        let nodes = [node("n1", 4, 80_000)];
        let decisions = plan(&nodes, &[] as &[RunningJob], &queue, &settings, t0());
        for (job_id, placement) in started(&decisions) {
            let queued = queue.iter().find(|q| &q.id == job_id).ok_or_else(|| TestCaseError::fail("unknown job"))?;
            let limit = queued.time_limit.and_then(|l| chrono::Duration::from_std(l).ok());
            for gpu in gpus_of(placement) {
                for w in kept.iter().filter(|w| w.end > t0() && w.gpus.contains(&gpu)) {
                    let member = queued.reservation.as_ref() == Some(&w.name);
                    if member {
                        prop_assert!(w.start <= t0());
                        prop_assert!(limit.is_some_and(|l| t0() + l <= w.end));
                    } else {
                        let gone = queued.preemptible
                            || limit.is_some_and(|l| t0() + l <= w.start);
                        prop_assert!(w.start > t0() && gone, "{job_id} on {gpu:?} of {}", w.name);
                    }
                }
                if let Some(name) = &queued.reservation {
                    let own = kept.iter().find(|w| &w.name == name);
                    prop_assert!(own.is_some_and(|w| w.gpus.contains(&gpu)));
                }
            }
        }
    }
}
