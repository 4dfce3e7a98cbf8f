//! The client library every command is built on: how `mgpu` talks to a cluster.
//!
//! - [`session`]: the connection options and the connection as the current user, whose key
//!   signs every request;
//! - [`request`]: the one request path (signed, published to JetStream under a message id,
//!   acknowledged, retried through leader elections without being applied twice), taken by
//!   submissions, cancellations, holds and releases, and node administration alike;
//! - [`submit`]: submissions on that path, pipelined, each job's environment stored apart first.

pub mod request;
pub mod session;
pub mod submit;
