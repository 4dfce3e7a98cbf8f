//! `mgpu`: the command-line tool of the mgpu GPU job scheduler.
//!
//! It talks only to NATS: requests (submissions, cancellations, holds, node administration) go
//! to JetStream streams, and everything it shows (queue, records, nodes, output) is read straight
//! from JetStream, so most commands work while the scheduler is down.
//!
//! Layout (no module imports one that imports it back):
//!
//! - `cli`: the command line (clap) and the dispatch to the commands; only `main` imports it.
//! - `commands/`: one module per subcommand. `submit/`: `args` (its options), `spec` (the job
//!   spec from options or a job file's draft), `plan` (each form, a job, an array or a job
//!   file, as prepared submissions), `pipeline` (check, skip duplicates via `dedup`, store),
//!   `report` (what each form prints), `file` (job files, `--watch`), `attach` (`-i`).
//!   `queue`, `show`, `nodes`, `logs`, `cancel`, `hold` (and release), `node_admin` (`node`
//!   and `gpu`), and `admin/`, one file per subcommand (`init`, `add_user`, `add_node`,
//!   `list`, `remove`, `audit`, `setup`) with the registry's files (`registry`) and the
//!   reload and audit record after a change (`announce`).
//! - `model/`: the jobs-and-nodes read model: the cluster bucket (`cluster`), jobs, nodes and
//!   cluster read together (`snapshot`), finding a job and the queue's order (`jobs`), a
//!   node's row (`nodes`).
//! - `session`: the connection options and the signed connection as the current user.
//! - `publish`: storing submissions, pipelined and retried; publish failures as advice.
//! - `follow`: a job's output and record as JetStream has them, for `logs`, `submit -i`,
//!   `cancel` and `hold`.
//! - `jobfile/`: the job-file formats (`csv` lines, `native` TOML tables) parsed into drafts.
//! - `gpu_profiles`: the JSON profiles file giving each model's GPU requirement.
//! - `parse`: value parsers for the command line (GPU ids, memory sizes, arrays, `NODE:IDX`).
//! - `console` (our stdout and stderr), `human` (ages, states, lists), `tables`: output.
//! - `errors`: library errors as one-line messages.
//! - `fixtures` (tests only): job records and heartbeats.
//!
//! The cluster set-up `mgpu admin init` writes (keys, server configuration, TLS) is the
//! library's (`lib.rs`, `setup/`), shared with the test harness.

mod cli;
mod commands;
mod console;
mod errors;
#[cfg(test)]
mod fixtures;
mod follow;
mod gpu_profiles;
mod human;
mod jobfile;
mod model;
mod parse;
mod publish;
mod raw_terminal;
mod session;
mod tables;

use std::process::ExitCode;

use crate::cli::Cli;

fn main() -> ExitCode {
    let cli = Cli::from_args();
    init_tracing();

    // A single-threaded runtime is plenty for one user's commands. It is built by hand (not
    // `#[tokio::main]`) so that it can be abandoned at the end: a stdin read blocked in a
    // background thread (interactive jobs) must not keep the process alive after the job ended.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => return report(&anyhow::anyhow!("cannot start the async runtime: {err}")),
    };
    let result = runtime.block_on(cli.run());
    runtime.shutdown_background();

    match result {
        Ok(code) => code,
        // `mgpu logs ID | head` closes the pipe early; that is the reader's choice, not a failure.
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => report(&err),
    }
}

/// Prints the one-line error message every failure ends with, and the failing exit status.
fn report(err: &anyhow::Error) -> ExitCode {
    console::stderr_line(&format!("error: {err:#}"));
    ExitCode::FAILURE
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Library warnings (a malformed heartbeat, a lost connection) go to stderr; `RUST_LOG` shows more.
fn init_tracing() {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::{EnvFilter, Layer as _, filter::Targets};

    let output = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .without_time();
    // Without RUST_LOG the fixed filter is built directly: parsing it as filter directives
    // took 0.05 ms of every command (measured), and every command is a new process.
    match EnvFilter::try_from_default_env() {
        Ok(filter) => tracing_subscriber::registry()
            .with(output.with_filter(filter))
            .init(),
        Err(_) => tracing_subscriber::registry()
            .with(
                output.with_filter(
                    Targets::new()
                        .with_default(tracing::Level::WARN)
                        .with_target("async_nats", tracing::Level::ERROR),
                ),
            )
            .init(),
    }
}
