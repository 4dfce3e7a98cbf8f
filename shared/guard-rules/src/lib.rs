//! `mgpu-guard-rules`: what a job's guard decides, written once for both guards, the static
//! `mgpu-job-guard` (`services/job-guard`, no standard library) and the node agent's built-in
//! one (`mgpu-node __mgpu-job-guard`, `services/node-agent/src/builtin_guard.rs`).
//!
//! Every job's first process is its guard. It runs the job as its child in the same process
//! group and stops that group (SIGTERM, the kill grace, SIGKILL) when the agent dies (the
//! kernel sends it SIGTERM: `PR_SET_PDEATHSIG`), when someone sends it a stop signal, or when
//! the contact file, which the agent touches whenever JetStream stored its heartbeat, says no
//! heartbeat was stored for the fence time: the agent is alive but cut off or frozen, and the
//! scheduler may already run the job elsewhere. Otherwise it ends the way the job ended.
//!
//! # Layout
//! - [`machine`]: the pure state machine ([`Guard`]): what the guard saw goes in ([`Look`],
//!   [`JobEnd`]), what to do comes out as data ([`Command`]s). It has no clock and reads no
//!   file: the drivers read the clocks and the contact file, wait, and carry the commands out.
//! - [`args`]: the guard's command line, which the agent writes (`guard.rs` there) and both
//!   guards read ([`Arguments`]).
//! - [`signal`] and [`exit`]: the signal numbers and exit codes both guards use.
//! - [`pooled`]: the message that starts a job under a guard the agent started ahead of it.
//!
//! `#![no_std]` and without allocation, so that the static guard, which starts in
//! microseconds, can use it; the tests use the standard library.

#![no_std]

#[cfg(test)]
extern crate std;

pub mod args;
pub mod exit;
pub mod machine;
pub mod pooled;
pub mod signal;

pub use args::{ArgumentError, Arguments, Cgroup, Fence};
pub use machine::{Command, Commands, Contact, Guard, JobEnd, Look, State};
