//! `mgpu-protocol`: the contract between the mgpu programs.
//!
//! The scheduler, the node agent and the CLI never talk to each other directly, only through
//! NATS subjects; this crate says what travels on them and what is valid. It does no I/O on the
//! network (no async runtime, no NATS client): the scheduler's pure core and job lifecycle
//! depend on it alone. How messages get onto NATS is `mgpu-nats`.
//!
//! # Layout
//! - [`subjects`]: every subject, stream, bucket and consumer name, in one place.
//! - [`ids`]: job ids (one NATS token, typed by prefix) and node names.
//! - [`gpu_amount`]: fixed-point GPU fractions (10 000 units per GPU), and the bounds on GPUs
//!   (how many on a node, how much memory one has).
//! - [`host`]: CPU cores and host memory a job asks for, and what it used.
//! - [`duration`]: time limits as users type them (`90`, `10m`, `2h`, `1-00:00:00`).
//! - [`job`]: what a user asks for ([`job::JobSpec`]) and what the scheduler records
//!   ([`job::JobRecord`]).
//! - [`request`]: every request to the scheduler, decoded once ([`request::Request`]), one
//!   file each: [`submit`], [`cancel`], [`hold`] (and release), [`node_admin`],
//!   [`reservation`] (GPUs booked for a window, and their records).
//! - [`report`]: an agent's report about one attempt's process ([`report::AgentReport`]).
//! - [`node`]: a node agent's heartbeat: its GPUs, its running jobs, its address.
//! - [`assign`]: scheduler → agent messages (run this job, kill that one).
//! - [`event`]: job state transitions and agents' reports on `jobs.<id>.events`.
//! - [`output`]: the headers of job output messages on `jobs.<id>.output`.
//! - [`audit`]: the audit trail's records.
//! - [`notify`]: notifications: `--notify` events, users' destinations, the service's names.
//! - [`priority`]: effective priority (priority, age, fair share) and the scheduling policy.
//! - [`principals`]: the principals file: who exists, in which role, with which public nkey.
//! - [`signing`]: request signatures (what is signed, how it is checked, replay protection).
//! - [`wire`]: strict decoding of inbound messages: size limits and the checks handlers share.
//! - `fuzzing` (tests only): hostile payload generators for the fuzz targets.
//! - [`error`]: [`error::InvalidInput`], what every validation returns.

pub mod assign;
pub mod audit;
pub mod cancel;
pub mod duration;
pub mod error;
pub mod event;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod gpu_amount;
pub mod gpu_type;
pub mod hold;
pub mod host;
pub mod idle;
pub mod ids;
pub mod job;
pub mod node;
pub mod node_admin;
pub mod notify;
pub mod output;
pub mod plan;
pub mod principals;
pub mod priority;
pub mod qos;
pub mod report;
pub mod request;
pub mod reservation;
pub mod signing;
pub mod stop;
pub mod subjects;
pub mod submit;
pub mod terminal;
pub mod version;
pub mod why;
pub mod wire;

/// Every timestamp on the wire: UTC, serialised as RFC 3339.
pub type Timestamp = chrono::DateTime<chrono::Utc>;

/// Wall-clock now, for the service layers (the scheduling core and the job lifecycle take the
/// clock as an argument).
pub fn now() -> Timestamp {
    chrono::Utc::now()
}
