//! The idle tracker's stories and invariants.

use std::time::Duration;

use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{GpuShare, Placement};
use mgpu_protocol::job::{JobSpec, NodeShare};
use proptest::prelude::*;

use super::*;

const ONE: u32 = GpuAmount::UNITS_PER_GPU;

fn watched(gpus: &[(u32, u32)]) -> Watched {
    Watched {
        below_pct: 5,
        gpus: gpus.to_vec(),
    }
}

fn gpu(index: u32, utilization_pct: u32, memory_used_mib: u64) -> GpuStatus {
    GpuStatus {
        index,
        uuid: format!("GPU-{index}"),
        name: "Declared GPU".to_owned(),
        gpu_type: None,
        memory_total_mib: 24 * 1024,
        memory_used_mib,
        utilization_pct,
        temperature_c: None,
        power_w: None,
        foreign_processes: Vec::new(),
    }
}

/// `state` after readings `(seconds after start, quiet, memory)`.
fn run(state: IdleState, start: Instant, readings: &[(u64, bool, u64)]) -> IdleState {
    readings
        .iter()
        .fold(state, |state, &(secs, quiet, memory_mib)| {
            state.next(Reading {
                at: start + Duration::from_secs(secs),
                quiet,
                memory_mib,
            })
        })
}

#[test]
fn a_stretch_counts_from_its_first_idle_sample_and_a_busy_one_ends_it() {
    let start = Instant::now();
    let state = IdleState::new(watched(&[(0, ONE)]));
    assert_eq!(state.sample(), IdleSample::default());
    let state = run(
        state,
        start,
        &[(0, true, 100), (2, true, 100), (4, true, 100)],
    );
    assert_eq!(
        state.sample(),
        IdleSample {
            idle_for_secs: 4,
            idle_gpu_secs: 4
        }
    );
    let state = run(state, start, &[(6, false, 100)]);
    assert_eq!(
        state.sample(),
        IdleSample {
            idle_for_secs: 0,
            idle_gpu_secs: 4
        }
    );
    // Idle again: the interval ending at the idle sample counts, the stretch starts there.
    let state = run(state, start, &[(8, true, 100), (9, true, 100)]);
    assert_eq!(
        state.sample(),
        IdleSample {
            idle_for_secs: 1,
            idle_gpu_secs: 7
        }
    );
}

#[test]
fn memory_growing_past_the_allowance_is_work() {
    let start = Instant::now();
    let grown = 1000 + IDLE_MEMORY_GROWTH_MIB;
    let state = run(
        IdleState::new(watched(&[(0, ONE)])),
        start,
        &[(0, true, 1000), (1, true, grown), (2, true, 900)],
    );
    assert_eq!(
        state.sample().idle_for_secs,
        2,
        "within the allowance, and freeing"
    );
    // Growth is measured from the lowest point of the stretch (900 MiB).
    let state = run(state, start, &[(3, true, 900 + IDLE_MEMORY_GROWTH_MIB + 1)]);
    assert_eq!(state.sample().idle_for_secs, 0);
    assert_eq!(state.idle_gpu_secs(), 2);
    // The next quiet sample starts a stretch from the memory held then.
    let state = run(state, start, &[(4, true, 5000), (6, true, 5000)]);
    assert_eq!(state.sample().idle_for_secs, 2);
}

#[test]
fn shares_count_by_their_size_and_short_intervals_add_up() {
    let start = Instant::now();
    let half_and_one = watched(&[(0, ONE / 2), (1, ONE)]);
    let mut state = IdleState::new(half_and_one);
    // 200 ms heartbeats for 10 s: 1.5 GPUs × 10 s.
    for step in 0..=50u64 {
        state = state.next(Reading {
            at: start + Duration::from_millis(200 * step),
            quiet: true,
            memory_mib: 0,
        });
    }
    assert_eq!(state.idle_gpu_secs(), 15);
    assert_eq!(state.sample().idle_for_secs, 10);
}

#[test]
fn a_reading_needs_every_held_gpu_quiet_and_adds_the_jobs_own_memory() {
    let held = watched(&[(0, ONE), (1, ONE)]);
    let at = Instant::now();
    let own: BTreeMap<u32, u64> = [(0, 300)].into_iter().collect();
    // GPU 0's processes are listed (the job holds 300 MiB of its 2000); GPU 1's are not.
    let gpus = [gpu(0, 4, 2000), gpu(1, 0, 700), gpu(2, 99, 0)];
    let reading = Reading::of(&held, at, &gpus, Some(&own), &[0]);
    assert_eq!(
        reading,
        Reading {
            at,
            quiet: true,
            memory_mib: 1000
        }
    );
    let busy = [gpu(0, 5, 0), gpu(1, 0, 0)];
    assert!(
        !Reading::of(&held, at, &busy, None, &[]).quiet,
        "5 % is not below 5 %"
    );
    let missing = [gpu(0, 0, 0)];
    assert!(!Reading::of(&held, at, &missing, None, &[]).quiet);
    let nothing_listed = Reading::of(&held, at, &[gpu(0, 0, 0), gpu(1, 0, 0)], None, &[0, 1]);
    assert_eq!(
        nothing_listed.memory_mib, 0,
        "listed, and none of it the job's"
    );
}

#[test]
fn only_assignments_with_a_threshold_and_gpus_here_are_watched() {
    let share = |index, units| GpuShare {
        index,
        amount: GpuAmount::from_units(units),
        mem_mib: 0,
    };
    let mut placement = Placement::single("a", vec![share(0, ONE / 4), share(3, ONE)]);
    placement.peers.push(NodeShare {
        node: "b".into(),
        gpus: vec![share(1, ONE)],
    });
    let assignment = |rank, idle_below_pct, placement: &Placement| Assignment {
        job_id: JobId::random(),
        attempt: 1,
        user: "alice".into(),
        unix_user: None,
        spec: JobSpec::new(vec!["sleep".into(), "1".into()], "/tmp"),
        placement: placement.clone(),
        rank,
        input_keys: Vec::new(),
        output_subject: None,
        previous_stop: None,
        idle_below_pct,
    };
    assert_eq!(
        Watched::of(&assignment(0, Some(5), &placement), "a"),
        Some(Watched {
            below_pct: 5,
            gpus: vec![(0, ONE / 4), (3, ONE)]
        })
    );
    let peer = Watched::of(&assignment(1, Some(10), &placement), "b");
    assert_eq!(peer.map(|w| w.gpus), Some(vec![(1, ONE)]));
    assert_eq!(Watched::of(&assignment(0, None, &placement), "a"), None);
    assert_eq!(Watched::of(&assignment(1, Some(5), &placement), "a"), None);
    let cpu_only = Placement::single("a", Vec::new());
    assert_eq!(Watched::of(&assignment(0, Some(5), &cpu_only), "a"), None);
}

/// A reading as the property tests draw them: milliseconds since the previous one, whether
/// every GPU is quiet, and the memory held.
fn readings() -> impl Strategy<Value = Vec<(u64, bool, u64)>> {
    prop::collection::vec((0u64..5_000, any::<bool>(), 0u64..2_000), 1..60)
}

fn shares() -> impl Strategy<Value = Vec<(u32, u32)>> {
    prop::collection::vec(1u32..=4 * ONE, 1..4).prop_map(|units| {
        units
            .into_iter()
            .enumerate()
            .map(|(index, units)| (index as u32, units))
            .collect()
    })
}

proptest! {
    #[test]
    fn idleness_never_exceeds_the_time_observed(shares in shares(), steps in readings()) {
        let held = watched(&shares);
        let units: u128 = shares.iter().map(|(_, u)| u128::from(*u)).sum();
        let start = Instant::now();
        let mut state = IdleState::new(held);
        let mut at = start;
        let mut before = state.sample();
        for (gap_ms, quiet, memory_mib) in steps {
            at += Duration::from_millis(gap_ms);
            let next = state.next(Reading { at, quiet, memory_mib });
            let sample = next.sample();
            let observed = at.duration_since(start);
            prop_assert!(sample.idle_for_secs <= observed.as_secs());
            let per_gpu = u128::from(GpuAmount::UNITS_PER_GPU);
            let bound = observed.as_nanos() * units / (1_000_000_000 * per_gpu);
            prop_assert!(u128::from(sample.idle_gpu_secs) <= bound);
            let stretch = u128::from(sample.idle_for_secs) * units / per_gpu;
            prop_assert!(u128::from(sample.idle_gpu_secs) >= stretch, "the stretch is counted");
            prop_assert!(sample.idle_gpu_secs >= before.idle_gpu_secs, "the total only grows");
            if !quiet {
                prop_assert_eq!(sample.idle_for_secs, 0, "a busy sample ends the stretch");
                prop_assert_eq!(sample.idle_gpu_secs, before.idle_gpu_secs);
            }
            if let Some(stretch) = state.stretch
                && memory_mib > stretch.lowest_mib + IDLE_MEMORY_GROWTH_MIB
            {
                prop_assert_eq!(sample.idle_for_secs, 0, "growth past the allowance is work");
                prop_assert!(next.stretch.is_none());
            }
            if quiet && state.stretch.is_some() && next.stretch.is_some() {
                prop_assert!(sample.idle_for_secs >= before.idle_for_secs, "a stretch grows");
            }
            before = sample;
            state = next;
        }
    }
}

#[test]
fn a_sample_overtaken_by_a_later_one_adds_no_time() {
    let start = Instant::now();
    let state = run(
        IdleState::new(watched(&[(0, ONE)])),
        start,
        &[(0, false, 0), (4, true, 0), (2, true, 0), (5, true, 0)],
    );
    assert_eq!(
        state.sample(),
        IdleSample {
            idle_for_secs: 1,
            idle_gpu_secs: 5
        }
    );
}
