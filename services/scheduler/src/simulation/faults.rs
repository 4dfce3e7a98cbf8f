//! The faults a run draws while it is not quiet: nodes that crash and come back, nodes cut off
//! from NATS for a while (a network partition), the active scheduler dying and a standby
//! taking over from the store, another writer changing a record under the scheduler, a copy
//! of an earlier request published again (a replay), clock steps, the active scheduler
//! stalled for a while (`stall.rs`). (Lost and failed writes,
//! lost acknowledgements, delayed, reordered and duplicated messages and dropped heartbeats
//! are drawn where they happen, in `driving.rs` and `nodes.rs`.)
//!
//! Every fault, wherever it is drawn, is decided in one place, through
//! [`World::fault_happens`] here and [`World::chance_of_fault`] where drawn in place: it gets
//! its ordinal there (the run's 1st, 2nd, … fault, in draw order), and a fault whose ordinal
//! is in `Options::skip_faults` is suppressed there, which is how a failing run is shrunk
//! fault by fault (`shrinking.rs`).

use super::world::World;

/// The fault kinds drawn here, in the order their per mille are stacked against one roll.
#[derive(Clone, Copy)]
enum Kind {
    NodeCrash,
    Partition,
    SchedulerCrash,
    OtherWriter,
    SchedulerStall,
    Replay,
    ClockStep,
}

/// Draws at most one fault now.
pub fn inject(world: &mut World) {
    match draw_kind(world) {
        Some(Kind::NodeCrash) => crash_node(world),
        Some(Kind::Partition) => partition(world),
        Some(Kind::SchedulerCrash) => crash_scheduler(world),
        Some(Kind::OtherWriter) => rewrite_record(world),
        Some(Kind::Replay) => replay_request(world),
        Some(Kind::ClockStep) => step_clock(world),
        Some(Kind::SchedulerStall) => stall_scheduler(world),
        None => {}
    }
}

fn crash_node(world: &mut World) {
    let node = world.rng.below(world.agents.len() as u64) as usize;
    let name = world.agents[node].name.clone();
    if world.fault_happens(format!("node crash ({name})")) {
        world.crash_node(node);
    }
}

fn partition(world: &mut World) {
    let node = world.rng.below(world.agents.len() as u64) as usize;
    // A node already cut off is not cut off again: no fault, so no ordinal either.
    if world.agents[node].cut {
        return;
    }
    let name = world.agents[node].name.clone();
    if world.fault_happens(format!("partition ({name})")) {
        world.partition_node(node);
        world.partitions += 1;
    }
}

fn crash_scheduler(world: &mut World) {
    if world.scheduler.is_some()
        && world.fault_happens("scheduler crashes; a standby takes over".into())
    {
        world.crash_scheduler();
    }
}

fn stall_scheduler(world: &mut World) {
    let stalled_for = world.rng.between(500, 8_000);
    if world.scheduler.is_some()
        && world.fault_happens(format!("the scheduler stalls for {stalled_for} ms"))
    {
        world.stall_scheduler(stalled_for);
    }
}

fn rewrite_record(world: &mut World) {
    let live: Vec<_> = world.store.records.keys().cloned().collect();
    let at = world.wall();
    if let Some(id) = world.rng.pick(&live).cloned()
        && world.fault_happens(format!("another writer rewrites {}", id.short()))
    {
        // A live record, just picked: the rewrite takes effect.
        world.store.rewrite(&id, at);
    }
}

fn replay_request(world: &mut World) {
    let stored = world.requests.messages().count() as u64;
    if stored == 0 {
        return;
    }
    let index = world.rng.below(stored) as usize;
    if world.fault_happens(format!("someone publishes message {} again", index + 1)) {
        // A stored message, just picked: the copy is published.
        world.replay_request(index);
    }
}

fn step_clock(world: &mut World) {
    let step = world.rng.between(1, 800) as i64;
    if world.fault_happens(format!("the wall clock steps {step} ms ahead")) {
        world.clock_offset_ms += step;
    }
}

/// Which kind of fault one roll draws, if any: each kind's per mille stacked in turn.
fn draw_kind(world: &mut World) -> Option<Kind> {
    let roll = world.rng.below(1000);
    let o = &world.options;
    let kinds = [
        (o.node_crash, Kind::NodeCrash),
        (o.partition, Kind::Partition),
        (o.scheduler_crash, Kind::SchedulerCrash),
        (o.other_writer, Kind::OtherWriter),
        (o.replay, Kind::Replay),
        (o.clock_step, Kind::ClockStep),
        (o.scheduler_stall, Kind::SchedulerStall),
    ];
    let mut threshold = 0;
    kinds.into_iter().find_map(|(per_mille, kind)| {
        threshold += per_mille;
        (roll < threshold).then_some(kind)
    })
}

impl World {
    /// Whether a fault drawn at `per_mille` happens now, where one is drawn in place (a lost
    /// acknowledgement, a failed write, a duplicate, a delay, a dropped heartbeat): never in
    /// the quiet period, which draws nothing; otherwise drawn, and when drawn, numbered and
    /// perhaps suppressed by [`World::fault_happens`]. `what` names it for the trace.
    pub fn chance_of_fault(&mut self, per_mille: u64, what: impl FnOnce(&World) -> String) -> bool {
        self.chance_of(per_mille, what, true)
    }

    /// As [`World::chance_of_fault`], for a failed purge of a node's assignments, which
    /// `faults` never counted: it is numbered and may be suppressed, but is left out of
    /// `faults` so that a run's counts stay those of earlier versions.
    pub fn chance_of_uncounted_fault(
        &mut self,
        per_mille: u64,
        what: impl FnOnce(&World) -> String,
    ) -> bool {
        self.chance_of(per_mille, what, false)
    }

    fn chance_of(
        &mut self,
        per_mille: u64,
        what: impl FnOnce(&World) -> String,
        counted: bool,
    ) -> bool {
        if self.quiet || !self.rng.chance(per_mille) {
            return false;
        }
        let what = what(self);
        self.fault_decided(what, counted)
    }

    /// Whether a fault drawn here (`inject`) takes effect, asked once its draw said yes and
    /// the fault would change something: see `fault_decided`.
    pub fn fault_happens(&mut self, what: String) -> bool {
        self.fault_decided(what, true)
    }

    /// The one place every fault, wherever drawn, is numbered and let happen or suppressed.
    /// It gets the next ordinal whether or not it happens, so ordinals follow the draws; one
    /// in `options.skip_faults` is suppressed (its draws were made all the same, so the run is
    /// the same up to it). One that happens is counted in `faults` (if `counted`), kept in
    /// `fault_log` and traced as `fault #N: what`, so that a trace can be read against a skip
    /// list.
    fn fault_decided(&mut self, what: String, counted: bool) -> bool {
        self.fault_ordinal += 1;
        let ordinal = self.fault_ordinal;
        if self.options.skip_faults.contains(&ordinal) {
            return false;
        }
        if counted {
            self.faults += 1;
        }
        self.note(format!("fault #{ordinal}: {what}"));
        self.fault_log.push((ordinal, what));
        true
    }
}
