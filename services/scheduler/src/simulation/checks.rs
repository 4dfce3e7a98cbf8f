//! The invariants checked after every step, and at the end of a run once it was quiet:
//! - a GPU is never given to jobs whose shares add up to more than one GPU, nor its memory
//!   beyond its size (the store's running records);
//! - a job runs in at most one attempt at a time (the agents' live processes), and a
//!   `--no-requeue` job at most once (the attempts agents ever started);
//! - a record that reached a final state never leaves it (every write is checked);
//! - a user never runs more GPUs than their `max_gpus_running` (bob: two);
//! - liveness: after the quiet period every submitted job has reached its final state (the
//!   workload only asks for what the cluster can run, holds are released and drains resumed
//!   when the quiet period begins).

use std::collections::{BTreeMap, BTreeSet};

use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::JobState;

use super::world::World;

/// The first invariant broken now, if any.
pub fn after_step(world: &World) -> Option<String> {
    if let Some(left) = world.store.left_final.first() {
        return Some(left.clone());
    }
    gpus_overbooked(world)
        .or_else(|| attempts_at_once(world))
        .or_else(|| user_cap(world))
}

fn gpus_overbooked(world: &World) -> Option<String> {
    let mut units: BTreeMap<(&str, u32), (u64, u64)> = BTreeMap::new();
    for tracked in world.store.records.values() {
        let JobState::Running(run) = &tracked.record.state else {
            continue;
        };
        for node in run.placement.node_names() {
            for share in run.placement.gpus_on(node).unwrap_or_default() {
                let entry = units.entry((node, share.index)).or_default();
                entry.0 += u64::from(share.amount.units());
                entry.1 += share.mem_mib;
            }
        }
    }
    units.into_iter().find_map(|((node, gpu), (units, mem))| {
        let memory = world
            .agents
            .iter()
            .find(|a| a.name == node)
            .map_or(0, |a| a.memory_mib);
        (units > u64::from(GpuAmount::UNITS_PER_GPU) || mem > memory)
            .then(|| format!("GPU {gpu} of {node} is given {units} units and {mem} MiB"))
    })
}

fn attempts_at_once(world: &World) -> Option<String> {
    let mut live: BTreeMap<&JobId, BTreeSet<u32>> = BTreeMap::new();
    let mut ever: BTreeMap<&JobId, BTreeSet<u32>> = BTreeMap::new();
    for agent in &world.agents {
        for (job, attempt) in agent.processes.keys() {
            live.entry(job).or_default().insert(*attempt);
        }
        for (job, attempt) in &agent.started {
            ever.entry(job).or_default().insert(*attempt);
        }
    }
    if let Some((job, attempts)) = live.iter().find(|(_, attempts)| attempts.len() > 1) {
        return Some(format!(
            "job {} runs attempts {attempts:?} at once",
            job.short()
        ));
    }
    ever.iter().find_map(|(job, attempts)| {
        let no_requeue = world.submitted.get(*job).copied().unwrap_or(false);
        (no_requeue && attempts.len() > 1)
            .then(|| format!("--no-requeue job {} ran attempts {attempts:?}", job.short()))
    })
}

fn user_cap(world: &World) -> Option<String> {
    let units: u64 = world
        .store
        .records
        .values()
        .filter(|t| t.record.user == "bob")
        .filter_map(|t| match &t.record.state {
            JobState::Running(run) => Some(run.placement.total_gpus()),
            _ => None,
        })
        .map(|gpus| (gpus * 10_000.0).round() as u64)
        .sum();
    (units > 20_000).then(|| format!("bob runs {units} GPU units, over his cap of 2 GPUs"))
}

/// After the quiet period: the jobs that have not reached a final state.
pub fn unfinished(world: &World) -> Vec<String> {
    world
        .submitted
        .keys()
        .filter(|id| {
            !world
                .store
                .record(id)
                .is_some_and(|r| r.state.is_finished())
        })
        .map(|id| {
            let state = world
                .store
                .record(id)
                .map_or("not recorded".to_owned(), |r| format!("{:?}", r.state));
            format!(
                "{}: {}",
                id.short(),
                state.chars().take(160).collect::<String>()
            )
        })
        .collect()
}
