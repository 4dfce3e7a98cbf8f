//! What the `mgpu` process does around its command: where library warnings go (`tracing` to
//! stderr), and how the command's result becomes the exit status and the one error line every
//! failure ends with.

use std::process::ExitCode;

use crate::console;

/// Library warnings (a malformed heartbeat, a lost connection) go to stderr; `RUST_LOG` shows more.
pub fn init_tracing() {
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

/// The exit status of a command that returned `result`; a failure's message is printed first.
pub fn exit_status(result: anyhow::Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        // `mgpu logs ID | head` closes the pipe early; that is the reader's choice, not a failure.
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            console::stderr_line(&format!("error: {err:#}"));
            ExitCode::FAILURE
        }
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_pipe_is_not_a_failure() {
        let closed = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
            .context("writing the job's output");
        assert!(is_broken_pipe(&closed));
        assert!(!is_broken_pipe(&anyhow::anyhow!("no job matches `abc`")));
        assert_eq!(exit_status(Err(closed)), ExitCode::SUCCESS);
        assert_eq!(exit_status(Ok(ExitCode::from(3))), ExitCode::from(3));
    }
}
