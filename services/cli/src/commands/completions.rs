//! `mgpu completions SHELL` and `mgpu man`: shell completion scripts and man pages, both
//! generated from the same clap definitions as the command line itself, so they never drift
//! from it.
//!
//! clap_complete's scripts are static: they know every subcommand and option but cannot ask
//! the cluster anything. Job ids are completed by a small addition per shell that, where a
//! subcommand takes job ids ([`JOB_ID_COMMANDS`]), runs `mgpu completions SHELL --job-ids` (hidden)
//! and offers what it prints: the live jobs, one a line with a short description. That listing
//! gives up quietly (prints nothing) on any error or after [`JOB_IDS_WAIT`], so a completion
//! never hangs a shell or prints errors into the command line being typed. The additions are
//! built in `completions/shells.rs`.

mod shells;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::{Args, ValueEnum};
use mgpu_nats::records;
use mgpu_protocol::job::JobRecord;

use crate::client::session::{ConnectionArgs, Session};
use crate::console;
use crate::errors::plain;

/// Subcommands whose positional arguments are job ids: the ones the completion scripts offer
/// live job ids to. A unit test checks each exists and takes a positional argument.
pub const JOB_ID_COMMANDS: &[&str] = &[
    "cancel", "hold", "release", "logs", "show", "attach", "wait",
];

/// How long the hidden job listing may take before it gives up with nothing: a shell waits for
/// it on every Tab.
const JOB_IDS_WAIT: Duration = Duration::from_secs(2);

/// At most this many jobs are offered: the user's own first, then the newest.
const MAX_OFFERED: usize = 500;

#[derive(Debug, Args)]
#[command(after_long_help = "\
Install (each once; job ids are then completed from the live queue):
  bash:  mgpu completions bash > ~/.local/share/bash-completion/completions/mgpu
         (or add `source <(mgpu completions bash)` to ~/.bashrc)
  zsh:   mgpu completions zsh > ~/.zfunc/_mgpu
         (with `fpath=(~/.zfunc $fpath); autoload -Uz compinit; compinit` in ~/.zshrc)
  fish:  mgpu completions fish > ~/.config/fish/completions/mgpu.fish")]
pub struct CompletionsArgs {
    /// The shell to print the completion script for.
    #[arg(value_enum)]
    pub shell: CompletionShell,

    /// Print the live jobs as that shell's completion takes them (for the scripts
    /// themselves).
    #[arg(long, hide = true)]
    pub job_ids: bool,
}

/// The shells completion scripts are made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Debug, Args)]
#[command(after_long_help = "\
Install where man finds them, e.g.:
  mgpu man --out ~/.local/share/man/man1
then `man mgpu`, `man mgpu-submit`.")]
pub struct ManArgs {
    /// The directory to write the pages to (made if missing): mgpu.1, and mgpu-SUB.1 for
    /// each subcommand (mgpu-submit.1, mgpu-admin-init.1, …).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

/// `mgpu completions SHELL`: the script on stdout. `--job-ids`: the live jobs, for the scripts.
pub async fn run_completions(
    connection: &ConnectionArgs,
    args: &CompletionsArgs,
    command: clap::Command,
) -> Result<ExitCode> {
    if args.job_ids {
        // Nothing but the listing reaches the shell: no error, whatever went wrong.
        let listing = tokio::time::timeout(JOB_IDS_WAIT, job_lines(connection, args.shell));
        if let Ok(Ok(lines)) = listing.await {
            let _ = console::print(&lines);
        }
    } else {
        console::print(&script(args.shell, command))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The completion script for `shell`: clap_complete's, with the job-id addition.
pub fn script(shell: CompletionShell, mut command: clap::Command) -> String {
    let mut buffer = Vec::new();
    let generator = match shell {
        CompletionShell::Bash => clap_complete::Shell::Bash,
        CompletionShell::Zsh => clap_complete::Shell::Zsh,
        CompletionShell::Fish => clap_complete::Shell::Fish,
    };
    clap_complete::generate(generator, &mut command, "mgpu", &mut buffer);
    let generated = String::from_utf8_lossy(&buffer).into_owned();
    let positions = shells::JobIdPositions::of(&command);
    match shell {
        CompletionShell::Bash => shells::bash(generated, &positions),
        CompletionShell::Zsh => shells::zsh(generated, &positions),
        CompletionShell::Fish => shells::fish(generated, &positions),
    }
}

/// The live jobs, one line each as `shell` takes them.
async fn job_lines(connection: &ConnectionArgs, shell: CompletionShell) -> Result<String> {
    let session = Session::connect(connection).await?;
    let jobs = records::list_jobs_for_listing(&session.js)
        .await
        .map_err(plain)?;
    Ok(format_job_lines(jobs, &session.user, shell))
}

/// The listing: the user's own jobs first, newest first, at most [`MAX_OFFERED`]. Each id is
/// its short form unless another listed job shares that prefix, then in full.
fn format_job_lines(mut jobs: Vec<JobRecord>, user: &str, shell: CompletionShell) -> String {
    jobs.sort_by(|a, b| {
        (b.user == user)
            .cmp(&(a.user == user))
            .then(b.submitted_at.cmp(&a.submitted_at))
    });
    jobs.truncate(MAX_OFFERED);
    let mut shorts: HashMap<&str, usize> = HashMap::new();
    for job in &jobs {
        *shorts.entry(job.id.short()).or_default() += 1;
    }
    let mut out = String::new();
    for job in &jobs {
        let short = job.id.short();
        let id = if shorts.get(short).copied().unwrap_or(0) > 1 {
            job.id.as_str()
        } else {
            short
        };
        // Tabs and newlines in a name would break the line format.
        let name: String = job
            .spec
            .display_name()
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        let description = format!("{name} ({}, {})", job.state.name(), job.user);
        out.push_str(&shell.job_line(id, &description));
    }
    out
}

/// `mgpu man --out DIR`: a page for mgpu and one for every visible subcommand, at any depth.
pub fn run_man(args: &ManArgs, command: clap::Command) -> Result<ExitCode> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot make the directory {}", args.out.display()))?;
    let written = write_man_pages(command, &args.out)?;
    console::println(&format!(
        "Wrote {} man pages to {} (mgpu.1 and mgpu-SUBCOMMAND.1)",
        written.len(),
        args.out.display()
    ))?;
    Ok(ExitCode::SUCCESS)
}

/// Writes the pages; the paths written, the main page first.
pub fn write_man_pages(command: clap::Command, out: &Path) -> Result<Vec<PathBuf>> {
    let mut command = command.disable_help_subcommand(true);
    command.build();
    let mut written = Vec::new();
    write_page_and_subpages(command, out, &mut written)?;
    Ok(written)
}

fn write_page_and_subpages(
    command: clap::Command,
    out: &Path,
    written: &mut Vec<PathBuf>,
) -> Result<()> {
    let man = clap_mangen::Man::new(command.clone());
    let path = out.join(man.get_filename());
    let mut page = Vec::new();
    man.render(&mut page)
        .with_context(|| format!("cannot render {}", path.display()))?;
    std::fs::write(&path, page).with_context(|| format!("cannot write {}", path.display()))?;
    written.push(path);
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_page_and_subpages(sub.clone(), out, written)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;
    use crate::cli::Cli;
    use crate::fixtures;

    #[test]
    fn every_job_id_command_exists_and_takes_an_id() {
        let command = Cli::command();
        for name in JOB_ID_COMMANDS {
            let sub = command.find_subcommand(name);
            let positional = sub.is_some_and(|s| s.get_positionals().next().is_some());
            assert!(positional, "mgpu {name} should take job ids");
        }
    }

    #[test]
    fn jobs_are_listed_own_first_newest_first_with_unique_ids() {
        let mut mine_old = fixtures::job("train.py", fixtures::queued(), 0, 300);
        mine_old.spec.name = Some("tab\there".into());
        let mine_new = fixtures::job("eval.py", fixtures::queued(), 0, 10);
        let mut theirs = fixtures::job("other.py", fixtures::queued(), 0, 1);
        theirs.user = "bob".into();
        let jobs = vec![theirs.clone(), mine_old.clone(), mine_new.clone()];
        let lines = format_job_lines(jobs, "alice", CompletionShell::Fish);
        let expected = format!(
            "{}\teval.py (queued, alice)\n{}\ttab here (queued, alice)\n{}\tother.py (queued, bob)\n",
            mine_new.id.short(),
            mine_old.id.short(),
            theirs.id.short()
        );
        assert_eq!(lines, expected);

        // Two jobs sharing a short prefix are offered by their full ids.
        let mut twin = mine_new.clone();
        let full = format!(
            "{}{}",
            mine_new.id.short(),
            "0".repeat(32 - mine_new.id.short().len())
        );
        twin.id = full.parse().unwrap_or_else(|e| panic!("{e}"));
        let lines = format_job_lines(vec![mine_new.clone(), twin], "alice", CompletionShell::Bash);
        assert_eq!(lines, format!("{}\n{full}\n", mine_new.id));
    }

    #[test]
    fn every_script_keeps_clap_and_adds_the_job_ids() {
        for shell in [
            CompletionShell::Bash,
            CompletionShell::Zsh,
            CompletionShell::Fish,
        ] {
            let text = script(shell, Cli::command());
            assert!(text.contains("submit"), "{shell:?}");
            assert!(text.contains("_job_ids"), "{shell:?}");
        }
    }

    #[test]
    fn man_pages_cover_every_visible_subcommand() {
        let Ok(dir) = tempfile::tempdir() else { return };
        let written = write_man_pages(Cli::command(), dir.path()).unwrap_or_default();
        let names: Vec<String> = written
            .iter()
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        for expected in [
            "mgpu.1",
            "mgpu-submit.1",
            "mgpu-wait.1",
            "mgpu-admin-init.1",
        ] {
            assert!(names.iter().any(|n| n == expected), "{expected}: {names:?}");
        }
        assert!(!names.iter().any(|n| n.contains("help")), "{names:?}");
        let page = std::fs::read_to_string(dir.path().join("mgpu-wait.1")).unwrap_or_default();
        assert!(page.contains("Wait until jobs end"), "{page}");
    }
}
