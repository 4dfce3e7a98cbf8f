//! `mgpu-scheduler`: the service that decides which queued job runs where, as a library the
//! two programs share: `mgpu-scheduler` (the service, `main.rs`) and `mgpu-simulate` (a whole
//! cluster simulated in one process, `bin/simulate.rs`).
//!
//! # Layout
//! Pure, no I/O (unit- and property-tested without NATS, and driven by the simulator):
//! - [`machine`]: every decision the scheduler makes, as a state machine: inputs in, commands
//!   out (`SchedulerState`).
//! - [`core`]: the scheduling function: which queued job runs where.
//! - [`lifecycle`]: a job's lifecycle: `(record, input, now) -> (record, effects)`.
//! - [`time_limits`]: a job's time limit and time slice, in one place.
//! - [`nodes`] (the node table), [`queue_view`] (the core's view of the queue, kept between
//!   passes), [`liveness_memory`] (what the liveness checks remember), [`limits`] (`[limits]`
//!   of the config file), [`config`] (the config file and its `[policy]`), [`metrics`] (the
//!   counters and the exposition), [`passes`] and [`status`] (pass statistics).
//! - [`simulation`]: the deterministic simulator: the machine with a simulated store, bus,
//!   agents, clock and faults, drawn from one seed, invariants checked after every step.
//!
//! I/O (the driver): [`driver`] (the event loop: inputs read, commands carried out against
//! NATS), [`identity`] (the principals file and the signature gate), [`replay_memory`]
//! (request nonces kept in KV), [`leader`] (the lease that makes exactly one replica active).

pub mod config;
pub mod core;
pub mod driver;
pub mod identity;
pub mod leader;
pub mod lifecycle;
pub mod limits;
pub mod liveness_memory;
pub mod machine;
pub mod metrics;
pub mod nodes;
pub mod passes;
pub mod queue_view;
pub mod replay_memory;
pub mod simulation;
pub mod status;
pub mod time_limits;
