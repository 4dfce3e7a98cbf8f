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
//! - [`lease`]: how long a renewal of the scheduler lease lets a replica act.
//! - [`nodes`] (the node table), [`queue_view`] (the core's view of the queue, kept between
//!   passes), [`liveness_memory`] (what the liveness checks remember), [`limits`] (`[limits]`
//!   of the config file), [`config`] (the config file and its `[policy]`), [`metrics`] (the
//!   counters and the exposition), [`passes`] and [`status`] (pass statistics, what a
//!   status request answers).
//! - [`simulation`]: the deterministic simulator: the machine with a simulated store, bus,
//!   agents, clock and faults, drawn from one seed, invariants checked after every step.
//!
//! I/O, in six files: [`driver`] (`mod.rs`: the event loop; `intake.rs`: requests, reports
//! and heartbeats read into inputs; `store.rs`: record writes, history, the cluster bucket,
//! nonces; `outbox.rs`: the commands carried out; `replica.rs`: the lease, the status micro
//! service, the metrics endpoint) and `main.rs` (settings, streams, acting while the lease is
//! held). What they share with other programs (publishing off the hot path, the latest
//! heartbeat of each node, retries through elections) is in `mgpu-nats`. [`identity`] reads the principals file; everything else here is pure, and nothing
//! outside the driver imports it.

pub mod booking;
pub mod config;
pub mod core;
pub mod driver;
pub mod identity;
pub mod idle_config;
pub mod lease;
pub mod lifecycle;
pub mod limits;
pub mod limits_file;
pub mod liveness_memory;
pub mod machine;
pub mod metrics;
pub mod nodes;
pub mod passes;
pub mod qos_config;
pub mod queue_view;
pub mod reservations_config;
pub mod simulation;
pub mod status;
pub mod time_limits;
