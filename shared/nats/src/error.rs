//! Typed errors of the NATS layer: reaching the server, and reading mgpu's state from
//! JetStream. The binaries wrap them with context (anyhow).

use thiserror::Error;

/// Failure to reach or log in to NATS, phrased for the person at the terminal.
#[derive(Debug, Error)]
pub enum ConnectError {
    #[error("cannot read credentials file {path}: {error}")]
    Credentials { path: String, error: std::io::Error },
    #[error("credentials file {path} holds no nkey seed (a line starting with `SU`)")]
    NoSeed { path: String },
    #[error("authentication failed at {server}: the server does not accept the nkey in {creds}")]
    AuthenticationFailed { server: String, creds: String },
    #[error("cannot reach NATS at {server}: {detail}")]
    Unreachable { server: String, detail: String },
    #[error(
        "CA certificate {path} does not exist: run `mgpu admin init --tls` to create it, or point --ca / MGPU_CA at the cluster's ca.pem"
    )]
    CaMissing { path: String },
    #[error("TLS with {server} failed: {detail}; {hint}")]
    Tls {
        server: String,
        detail: String,
        hint: String,
    },
}

/// Failure reading mgpu state from JetStream.
#[derive(Debug, Error)]
pub enum StateError {
    #[error(
        "mgpu's streams do not exist on this server yet: start mgpu-scheduler once, or run `mgpu admin setup`"
    )]
    NotSetUp,
    #[error("no job matches `{0}`")]
    UnknownJob(String),
    #[error("`{prefix}` is ambiguous: it matches {count} jobs ({examples}); type more of the id")]
    AmbiguousJob {
        prefix: String,
        count: usize,
        examples: String,
    },
    #[error("`{0}` is not a job id or id prefix (job ids are lowercase hex digits)")]
    NotAnId(String),
    #[error("record {key} is not valid: {error}")]
    Corrupt {
        key: String,
        error: serde_json::Error,
    },
    #[error("JetStream: {0}")]
    JetStream(String),
}

impl StateError {
    pub fn jetstream(err: impl std::fmt::Display) -> Self {
        StateError::JetStream(err.to_string())
    }
}
