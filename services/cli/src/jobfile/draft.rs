//! One job as a job file describes it ([`Draft`]), before the submitter's defaults and profiles
//! apply; each tagged with its line ([`Entry`]), or the error that spoils a whole file.

use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::job::OnTimeout;
use mgpu_protocol::stop::StopSignal;

/// One job as a file describes it, before the submitter's defaults and profiles apply.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Draft {
    pub command: Vec<String>,
    pub name: Option<String>,
    /// None: decided by the profile rules (`--llm NAME` in the command), else one GPU.
    pub gpus: Option<GpuAmount>,
    pub profile: Option<String>,
    pub gpu_ids: Option<Vec<u32>>,
    pub allowed_gpus: Option<Vec<u32>>,
    pub mem_mib: Option<u64>,
    /// `cpus` and `mem_host`: as `--cpus` and `--mem-host`.
    pub cpus: Option<u32>,
    pub mem_host_mib: Option<u64>,
    pub priority: i32,
    pub time_limit_secs: Option<u64>,
    pub on_timeout: Option<OnTimeout>,
    pub conda_env: Option<String>,
    pub env_setup_cmd: Option<String>,
    /// As written; relative paths are taken from the current directory, like `--workdir`.
    pub workdir: Option<String>,
    /// Skip the job when an identical one is queued, running, or earlier in this run.
    pub dedup: bool,
    /// `no_requeue = true|false` in a TOML job; None: the command line's `--no-requeue`.
    pub no_requeue: Option<bool>,
    /// `idle_ok = true|false` in a TOML job; None: the command line's `--idle-ok`.
    pub idle_ok: Option<bool>,
    /// `gpu_type`: GPU types, preferred first.
    pub gpu_types: Vec<String>,
    /// `constraint`: node features.
    pub constraint: Option<String>,
    /// `qos`: the quality-of-service class, as `--qos`.
    pub qos: Option<String>,
    /// `signal`: the warning before a stop, as `--signal` (`"USR1@300"`).
    pub signal: Option<StopSignal>,
    /// `reservation`: the reservation it runs in, as `--reservation`.
    pub reservation: Option<String>,
}

/// One job of a file: the line it starts on (1-based) and the job, or why it is unusable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub line: usize,
    pub draft: Result<Draft, String>,
}

/// A file that cannot be read as a whole (a TOML syntax error): nothing in it is usable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileError {
    pub line: usize,
    pub message: String,
}
