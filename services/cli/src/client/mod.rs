//! The client library every command is built on: how `mgpu` talks to a cluster.
//!
//! - [`session`]: the connection options and the connection as the current user, whose key
//!   signs every request;
//! - [`request`]: the one request path (signed, published to JetStream under a message id,
//!   acknowledged, retried through leader elections without being applied twice), taken by
//!   submissions, cancellations, holds and releases, and node administration alike;
//! - [`submit`]: submissions on that path, pipelined, each job's environment stored apart first;
//! - [`answer`]: how the scheduler answers a request about one job (its record changes, or it
//!   says no), listened to from before the request;
//! - [`verdict`]: the scheduler's verdicts on submissions and reservation requests, heard on
//!   a subject of the user's inbox the request names;
//! - [`follow`]: following a job: its output, its record, and this terminal as the job's.

pub mod answer;
pub mod follow;
pub mod request;
pub mod session;
pub mod submit;
pub mod verdict;
