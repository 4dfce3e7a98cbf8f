//! The command line: the connection options, one subcommand per module under `commands/`,
//! and the dispatch from a parsed command to the module that runs it. Only `main.rs` uses
//! this module: the commands take their own arguments and [`ConnectionArgs`].

use std::process::ExitCode;

use anyhow::Result;
use clap::{CommandFactory as _, Parser, Subcommand};

use crate::client::session::ConnectionArgs;
use crate::commands::{
    admin, attach, cancel, completions, history, hold, logs, node_admin, nodes, notices, notify,
    queue, report, reservations, reserve, show, submit, top, wait, web, why,
};

/// Submit, watch and manage GPU jobs on an mgpu cluster.
#[derive(Debug, Parser)]
#[command(name = "mgpu", version, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    connection: ConnectionArgs,

    #[command(subcommand)]
    command: Command,
}

impl Cli {
    /// Parses the process's arguments; clap prints its own usage errors and exits 2, as users
    /// of any clap tool expect.
    ///
    /// `mgpu submit …`, the command scripts run thousands of times, is parsed by a command
    /// line that knows only `submit`: clap builds every subcommand's arguments before it
    /// parses, and parsing took 0.54 ms of a 4 ms `mgpu submit` with all of them, 0.3 ms with
    /// this one (measured on the 2-core machine). The result, and what `mgpu submit --help`
    /// prints, are the same (a test compares them).
    pub fn from_args() -> Cli {
        if std::env::args_os()
            .nth(1)
            .is_some_and(|first| first == "submit")
        {
            let SubmitCommandLine {
                connection,
                command: SubmitOnly::Submit(args),
            } = SubmitCommandLine::parse();
            return Cli {
                connection,
                command: Command::Submit(args),
            };
        }
        Cli::parse()
    }

    /// Runs the command; its exit status, or the error `main` prints.
    pub async fn run(self) -> Result<ExitCode> {
        let connection = &self.connection;
        match &self.command {
            Command::Submit(args) => submit::run(connection, args).await,
            Command::Queue(args) => queue::run(connection, args).await,
            Command::Cancel(args) => cancel::run(connection, args).await,
            Command::Hold(args) => hold::run(connection, args, hold::Action::Hold).await,
            Command::Release(args) => hold::run(connection, args, hold::Action::Release).await,
            Command::Logs(args) => logs::run(connection, args).await,
            Command::Show(args) => show::run(connection, args).await,
            Command::Why(args) => why::run(connection, args).await,
            Command::History(args) => history::run(connection, args).await,
            Command::Report(args) => report::run(connection, args).await,
            Command::Nodes(args) => nodes::run(connection, args).await,
            Command::Node(args) => node_admin::run_node(connection, args).await,
            Command::Gpu(args) => node_admin::run_gpu(connection, args).await,
            Command::Reserve(args) => reserve::run(connection, args).await,
            Command::Reservations(args) => reservations::run(connection, args).await,
            Command::Admin(args) => admin::run(connection, args).await,
            Command::Top(args) => top::run(connection, args).await,
            Command::Attach(args) => attach::run(connection, args).await,
            Command::Wait(args) => wait::run(connection, args).await,
            Command::Notices(args) => notices::run(connection, args).await,
            Command::Notify(args) => notify::run(connection, args).await,
            Command::Web(args) => web::run(connection, args).await,
            Command::Completions(args) => {
                completions::run_completions(connection, args, Cli::command()).await
            }
            Command::Man(args) => completions::run_man(args, Cli::command()),
        }
    }
}

/// The command line when the first argument is `submit` (see [`Cli::from_args`]).
#[derive(Debug, Parser)]
#[command(name = "mgpu", version, propagate_version = true)]
struct SubmitCommandLine {
    #[command(flatten)]
    connection: ConnectionArgs,

    #[command(subcommand)]
    command: SubmitOnly,
}

#[derive(Debug, Subcommand)]
enum SubmitOnly {
    /// Submit a job: `mgpu submit --gpus 2 -- python train.py`.
    Submit(Box<submit::SubmitArgs>),
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Submit a job: `mgpu submit --gpus 2 -- python train.py`.
    // Boxed: its many options would make every other variant as large.
    Submit(Box<submit::SubmitArgs>),
    /// List queued and running jobs, and the nodes.
    #[command(visible_alias = "status")]
    Queue(queue::QueueArgs),
    /// Cancel jobs, queued or running.
    Cancel(cancel::CancelArgs),
    /// Hold queued jobs: they keep their place but do not start until released.
    Hold(hold::HoldArgs),
    /// Release held jobs, so they can start.
    Release(hold::HoldArgs),
    /// Print a job's output.
    Logs(logs::LogsArgs),
    /// Show everything recorded about one job.
    Show(show::ShowArgs),
    /// List finished jobs (yours by default), live and in history: `--since 3d --state failed`.
    History(history::HistoryArgs),
    /// GPU-hours and job counts by user, node or state over a period; or the fair-share
    /// ledger (`--fairshare`).
    Report(report::ReportArgs),
    /// Show the nodes and their GPUs.
    Nodes(nodes::NodesArgs),
    /// Why a job waits, one cause per line with its numbers, and when it should start.
    Why(why::WhyArgs),
    /// Drain a node or resume it (admins only).
    Node(node_admin::NodeArgs),
    /// Pause one GPU of a node or resume it (admins only).
    Gpu(node_admin::GpuArgs),
    /// Book GPUs for a window of time, or cancel a booking:
    /// `mgpu reserve deadline --gpus 8 --start 'tomorrow 09:00' --for 8h`.
    Reserve(reserve::ReserveArgs),
    /// List the reservations (booked and active; `--all` adds those over), with how many of
    /// an open one's GPUs its jobs use.
    Reservations(reservations::ReservationsArgs),
    /// Set up the cluster: credentials, server configuration, streams.
    Admin(admin::AdminArgs),
    /// Watch the whole cluster live, full screen: nodes, GPUs, the queue.
    Top(top::TopArgs),
    /// Join a running job's terminal (or follow its output): `Ctrl+]` detaches.
    Attach(attach::AttachArgs),
    /// Wait until jobs end; the exit status says how they ended.
    Wait(wait::WaitArgs),
    /// Follow the scheduler's notices about your jobs live (idle warnings), until Ctrl+C.
    Notices(notices::NoticesArgs),
    /// Where your notices go (chat, webhook, e-mail): `mgpu notify add slack URL`, `list`,
    /// `test`; `mgpu submit --notify end,fail` asks for them.
    Notify(notify::NotifyArgs),
    /// Serve the web dashboard (a live view of the cluster in the browser):
    /// `mgpu web`, then open http://127.0.0.1:8080/.
    Web(web::WebArgs),
    /// Print a shell completion script: `source <(mgpu completions bash)`.
    Completions(completions::CompletionsArgs),
    /// Write man pages for mgpu and every subcommand.
    Man(completions::ManArgs),
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    /// The `submit`-only command line parses and documents `mgpu submit` as the full one does.
    #[test]
    fn the_submit_command_line_matches_the_full_one() {
        SubmitCommandLine::command().debug_assert();
        let help = |mut command: clap::Command| {
            command.build();
            command
                .find_subcommand_mut("submit")
                .map(|submit| submit.render_long_help().to_string())
                .unwrap_or_default()
        };
        let full = help(Cli::command());
        assert!(full.contains("--gpu-ids"), "{full}");
        assert_eq!(help(SubmitCommandLine::command()), full);

        let argv = [
            "mgpu",
            "submit",
            "--gpus",
            "2",
            "--server",
            "nats://h:1",
            "--",
            "true",
        ];
        let via_full = Cli::try_parse_from(argv).map(|cli| format!("{cli:?}"));
        let via_submit = SubmitCommandLine::try_parse_from(argv).map(|line| {
            let SubmitOnly::Submit(args) = line.command;
            format!(
                "{:?}",
                Cli {
                    connection: line.connection,
                    command: Command::Submit(args),
                }
            )
        });
        assert_eq!(via_full.ok(), via_submit.ok());
    }

    #[test]
    fn a_negative_gpu_count_reaches_the_gpu_parser() {
        let parsed = Cli::try_parse_from(["mgpu", "submit", "--gpus", "-1", "--", "true"]);
        let err = parsed.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("GPU count must be 0 or more"), "{err}");
    }

    #[test]
    fn admin_commands_check_their_arguments() {
        let err = |argv: &[&str]| {
            Cli::try_parse_from(argv)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(err(&["mgpu", "gpu", "pause", "node001"]).contains("NODE:INDEX"));
        assert!(err(&["mgpu", "node", "drain", "node.1"]).contains("not a valid node name"));
        assert!(
            Cli::try_parse_from(["mgpu", "node", "drain", "node001", "--reason", "fan"]).is_ok()
        );
        assert!(Cli::try_parse_from(["mgpu", "gpu", "resume", "node001:3"]).is_ok());
        assert!(err(&["mgpu", "hold"]).contains("ID"));
    }

    #[test]
    fn reservations_are_booked_cancelled_and_listed_by_their_own_commands() {
        let booking = [
            "mgpu",
            "reserve",
            "deadline",
            "--gpus",
            "8",
            "--start",
            "tomorrow 09:00",
            "--for",
            "8h",
        ];
        assert!(matches!(
            Cli::try_parse_from(booking).map(|cli| cli.command),
            Ok(Command::Reserve(_))
        ));
        assert!(matches!(
            Cli::try_parse_from(["mgpu", "reserve", "--cancel", "deadline"]).map(|c| c.command),
            Ok(Command::Reserve(_))
        ));
        assert!(matches!(
            Cli::try_parse_from(["mgpu", "reservations", "--all", "--json"]).map(|c| c.command),
            Ok(Command::Reservations(_))
        ));
        let parsed = Cli::try_parse_from([
            "mgpu",
            "submit",
            "--reservation",
            "deadline",
            "--time-limit",
            "1h",
            "--",
            "true",
        ]);
        let reservation = match parsed {
            Ok(Cli {
                command: Command::Submit(args),
                ..
            }) => args.reservation,
            _ => None,
        };
        assert_eq!(reservation.as_deref(), Some("deadline"));
    }

    #[test]
    fn the_command_keeps_its_own_flags() {
        let parsed =
            Cli::try_parse_from(["mgpu", "submit", "--gpus", "0", "python", "-c", "print(1)"]);
        let command = match parsed {
            Ok(Cli {
                command: Command::Submit(args),
                ..
            }) => Some(args.command),
            _ => None,
        };
        assert_eq!(
            command,
            Some(vec!["python".into(), "-c".into(), "print(1)".into()])
        );
    }
}
