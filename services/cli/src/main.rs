//! `mgpu`: the command-line tool of the mgpu GPU job scheduler.
//!
//! The binary parses the command line and dispatches it; everything else (the commands, the
//! client library they share, the cluster set-up) is the library's, `mgpu_cli` (`lib.rs`
//! describes its layout).

use std::process::ExitCode;

use mgpu_cli::cli::Cli;
use mgpu_cli::process;

fn main() -> ExitCode {
    let cli = Cli::from_args();
    process::init_tracing();

    // A single-threaded runtime is plenty for one user's commands. It is built by hand (not
    // `#[tokio::main]`) so that it can be abandoned at the end: a stdin read blocked in a
    // background thread (interactive jobs) must not keep the process alive after the job ended.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            let err = anyhow::anyhow!("cannot start the async runtime: {err}");
            return process::exit_status(Err(err));
        }
    };
    let result = runtime.block_on(cli.run());
    runtime.shutdown_background();
    process::exit_status(result)
}
