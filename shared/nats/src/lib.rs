//! `mgpu-nats`: how the mgpu programs use NATS and JetStream. What travels is
//! `mgpu-protocol`'s; this crate moves it.
//!
//! # Layout
//! - [`connect`]: connecting with an nkey (and TLS), with errors a person can act on.
//! - [`streams`]: the JetStream streams and KV buckets, and how to create them.
//! - [`notify_streams`]: the notices stream and the buckets of `mgpu-notify`.
//! - [`job_env`]: the environments captured at submit, kept apart from the job records.
//! - [`records`]: reading job records and node heartbeats straight from JetStream.
//! - [`reading`]: the short-lived consumers those reads go through.
//! - [`pull`]: continuous pulls from durable consumers that survive losing the consumer's leader.
//! - [`background_publish`]: messages stored off the caller's hot path, retried through elections.
//! - [`latest_per_subject`]: a subscription read by a task of its own, the latest of each subject
//!   kept until taken.
//! - [`retry`]: backoff between the tries of an operation NATS could not answer.
//! - [`signing`]: request signatures put on and read off message headers.
//! - [`error`]: the typed errors of this crate.

pub mod background_publish;
pub mod cluster_records;
pub mod connect;
pub mod error;
pub mod job_env;
pub mod latest_per_subject;
pub mod notify_streams;
pub mod pull;
pub mod reading;
pub mod records;
pub mod retry;
pub mod signing;
pub mod streams;
