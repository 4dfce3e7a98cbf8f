//! `mgpu-shared`: everything the mgpu programs agree on.
//!
//! The scheduler, the node agent and the CLI never talk to each other directly, only through
//! NATS subjects; this crate is the contract between them.
//!
//! # Layout
//! - [`subjects`]: every subject, stream, bucket and consumer name, in one place.
//! - [`ids`]: job ids (one NATS token, typed by prefix) and node names.
//! - [`gpu_amount`]: fixed-point GPU fractions (10 000 units per GPU).
//! - [`duration`]: time limits as users type them (`90`, `10m`, `2h`, `1-00:00:00`).
//! - [`job`]: what a user asks for ([`job::JobSpec`]) and what the scheduler records ([`job::JobRecord`]).
//! - [`node`]: a node agent's heartbeat: its GPUs, its running jobs, its address.
//! - [`assign`]: scheduler → agent messages (run this job, kill that one).
//! - [`event`]: job state transitions published on `jobs.<id>.events`.
//! - [`output`]: the headers of job output messages on `jobs.<id>.output`.
//! - [`priority`]: effective priority (priority, age, fair share) and the scheduling policy.
//! - [`streams`]: the JetStream streams and KV buckets, and how to create them.
//! - [`connect`]: connecting with an nkey, with errors a person can act on.
//! - [`auth`]: nkeys for each role, and the nats-server authorization they get.
//! - [`tls`]: the certificate authority and server certificate, and the server's `tls` blocks.
//! - [`records`]: reading job records and node heartbeats straight from JetStream.
//! - [`pull`]: continuous pulls from durable consumers that survive losing the consumer's leader.
//! - [`wire`]: strict decoding of inbound messages: size limits and the checks handlers share.
//! - `fuzzing` (tests only): hostile payload generators for the fuzz targets.
//! - [`error`]: the typed errors of this crate.

pub mod assign;
pub mod audit;
pub mod auth;
pub mod connect;
pub mod duration;
pub mod error;
pub mod event;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod gpu_amount;
pub mod ids;
pub mod job;
pub mod node;
pub mod output;
pub mod priority;
pub mod pull;
pub mod records;
pub mod signing;
pub mod streams;
pub mod subjects;
pub mod tls;
pub mod wire;

/// Every timestamp on the wire: UTC, serialised as RFC 3339.
pub type Timestamp = chrono::DateTime<chrono::Utc>;

/// Wall-clock now, for the service layers (the scheduling core takes the clock as an argument).
pub fn now() -> Timestamp {
    chrono::Utc::now()
}
