//! The invariants, as a run sees them after every step:
//! - a record that reached a final state never leaves it (every write is checked, `store.rs`);
//! - what the ledger found at the moment it happened (`ledger.rs`): a GPU given beyond its
//!   units or memory, a job started on a GPU paused before, a user started past the cap in
//!   force, an array past its `%N`, a multi-node job half-placed or on a node twice, an
//!   assignment missing for a launched rank, a job running two attempts at once, a
//!   `--no-requeue` job started twice;
//! - liveness: after the quiet period every submitted job has reached its final state (the
//!   workload only asks for what the cluster can run, holds are released, drains and pauses
//!   resumed and the limits restored when the quiet period begins).

use super::world::World;

/// The first invariant broken so far, if any.
pub fn after_step(world: &World) -> Option<String> {
    world
        .store
        .left_final
        .first()
        .or_else(|| world.ledger.broken.first())
        .cloned()
}

/// Whether every submitted job reached its final state; those seen final are forgotten.
pub fn all_finished(world: &mut World) -> bool {
    let store = &world.store;
    world
        .open
        .retain(|id| !store.record(id).is_some_and(|r| r.state.is_finished()));
    world.open.is_empty()
}

/// The jobs that have not reached a final state, with where they stand.
pub fn unfinished(world: &mut World) -> Vec<String> {
    all_finished(world);
    world
        .open
        .iter()
        .map(|id| {
            let state = world
                .store
                .record(id)
                .map_or("not recorded".to_owned(), |r| {
                    // What it waits on, first: the state below is cut short.
                    let after: Vec<String> = r
                        .spec
                        .after
                        .iter()
                        .chain(&r.spec.after_any)
                        .map(|dep| {
                            let ended = world.store.record(dep).map(|d| d.state.name());
                            format!("{} {}", dep.short(), ended.unwrap_or("not recorded"))
                        })
                        .collect();
                    format!(
                        "{} asking {} GPUs x {} of {:?} after {after:?}: {:?}",
                        r.user, r.spec.gpus, r.spec.nodes, r.spec.gpu_types, r.state
                    )
                });
            format!(
                "{}: {}",
                id.short(),
                state.chars().take(240).collect::<String>()
            )
        })
        .collect()
}
