//! The `mgpu` CLI's library part: what `mgpu admin init` writes to set up a cluster (the
//! principals' keys, the nats-server configuration, the TLS certificate authority). It is a
//! library so that the test harness and the benchmarks set up their clusters exactly as an
//! administrator does. The commands themselves live in the `mgpu` binary (`main.rs`).

pub mod setup;
