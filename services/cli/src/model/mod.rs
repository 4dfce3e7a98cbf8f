//! The jobs-and-nodes read model: what the commands read from JetStream (job records, node
//! heartbeats, the scheduler's policy, usage and admin marks) and the rows they derive from
//! it, ordered and counted as the scheduler sees them. How rows are printed (tables, text,
//! JSON) stays with each command.
//!
//! - [`snapshot`]: the jobs, nodes and cluster state, read at once for `mgpu queue` and
//!   `mgpu nodes`;
//! - [`cluster`]: the cluster bucket (policy, usage, drained nodes and paused GPUs);
//! - [`environment`]: a job's environment, as the reader may see it;
//! - [`jobs`]: finding one job by id or prefix, and the queue's listing order with effective
//!   priorities;
//! - [`nodes`]: a node's row: its state, free and paused GPUs, running jobs;
//! - [`history`]: finished jobs, live and in the history stream, filtered;
//! - [`accounting`]: GPU time and how jobs ended, summed by user, node or state.

pub mod accounting;
pub mod cluster;
pub mod environment;
pub mod history;
pub mod jobs;
pub mod nodes;
pub mod snapshot;
