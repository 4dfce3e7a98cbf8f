//! The faults a run draws while it is not quiet: nodes that crash and come back, nodes cut off
//! from NATS for a while (a network partition), the active scheduler dying and a standby
//! taking over from the store, another writer changing a record under the scheduler, a copy
//! of an earlier request published again (a replay), clock steps. (Lost and failed writes, lost acknowledgements,
//! delayed, reordered and duplicated messages and dropped heartbeats are drawn where they
//! happen, in `driving.rs` and `nodes.rs`.)

use super::world::World;

/// Draws at most one fault now.
pub fn inject(world: &mut World) {
    let options = world.options.clone();
    let roll = world.rng.below(1000);
    let mut threshold = 0;
    let mut hit = |per_mille: u64| {
        threshold += per_mille;
        roll < threshold
    };
    if hit(options.node_crash) {
        let node = world.rng.below(world.agents.len() as u64) as usize;
        world.faults += 1;
        world.crash_node(node);
    } else if hit(options.partition) {
        let node = world.rng.below(world.agents.len() as u64) as usize;
        if world.partition_node(node) {
            world.faults += 1;
            world.partitions += 1;
        }
    } else if hit(options.scheduler_crash) {
        if world.scheduler.is_some() {
            world.faults += 1;
            world.note("scheduler crashes; a standby takes over".into());
            world.crash_scheduler();
        }
    } else if hit(options.other_writer) {
        let live: Vec<_> = world.store.records.keys().cloned().collect();
        let at = world.wall();
        if let Some(id) = world.rng.pick(&live).cloned()
            && world.store.rewrite(&id, at)
        {
            world.faults += 1;
            world.note(format!("another writer rewrites {}", id.short()));
        }
    } else if hit(options.replay) {
        let stored = world.requests.messages().count() as u64;
        if stored > 0 {
            let index = world.rng.below(stored) as usize;
            if world.replay_request(index) {
                world.faults += 1;
                world.note(format!("someone publishes message {} again", index + 1));
            }
        }
    } else if hit(options.clock_step) {
        let step = world.rng.between(1, 800) as i64;
        world.clock_offset_ms += step;
        world.faults += 1;
        world.note(format!("the wall clock steps {step} ms ahead"));
    }
}
