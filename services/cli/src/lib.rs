//! The `mgpu` CLI's library part: what `mgpu admin init` writes to set up a cluster (the
//! principals' keys, the nats-server configuration, the TLS certificate authority). It is a
//! library so that the test harness and the benchmarks set up their clusters exactly as an
//! administrator does. The commands themselves live in the `mgpu` binary (`main.rs`).
//!
//! Also here: the pure part of `mgpu top` (its model and drawing, no I/O), so that the
//! benchmarks draw frames of a large cluster with the code the command draws with.

pub mod setup;
#[path = "commands/top/screen/mod.rs"]
pub mod top;
