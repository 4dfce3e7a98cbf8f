//! A batch script's `#MGPU` directives as `mgpu submit` options, merged with the command
//! line's, which win: clap parses the directives' words followed by the options given on the
//! command line, with every option allowed to repeat and the last occurrence kept. Options
//! that collect several values (`--after`, `--exclude`, …) would add up instead, so where the
//! command line gives one, its values replace the directives' ([`command_line_wins`]).
//!
//! The command line's options are read back from its own parse (`ArgMatches::value_source`),
//! so an option counts as given only where the user typed it, not where it has a default.

use std::ffi::OsString;

use anyhow::{Context as _, Result, anyhow};
use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Args as _, Command, FromArgMatches as _};

use super::args::SubmitArgs;
use super::batch_script::{Batch, DIRECTIVE};
use crate::client::session::ConnectionArgs;

/// Options a directive may not give: they are about how `mgpu` runs, not about the job.
const NOT_DIRECTIVES: &[&str] = &["--file", "--watch", "--help", "-h"];

/// Stands for the command while a directive is checked on its own.
const PLACEHOLDER: &str = "mgpu-directive-check";

/// `mgpu submit`'s options as the script's directives and this process's command line give
/// them together.
pub fn apply(batch: &Batch, args: &SubmitArgs) -> Result<SubmitArgs> {
    let command_line = command_line_matches()?;
    merge(batch, args, &command_line)
}

/// The `submit` options of this process's command line, parsed again to learn which were
/// typed. It parsed once already, so a failure here is not the user's.
fn command_line_matches() -> Result<ArgMatches> {
    let line = ConnectionArgs::augment_args(Command::new("mgpu"))
        .subcommand(SubmitArgs::augment_args(Command::new("submit")));
    let matches = line
        .try_get_matches_from(std::env::args_os())
        .context("cannot read the command line again to merge the script's directives")?;
    matches
        .subcommand_matches("submit")
        .cloned()
        .ok_or_else(|| anyhow!("cannot find the submit options in the command line"))
}

/// `mgpu submit`'s options where each may repeat, the last occurrence winning.
fn submit_command() -> Command {
    SubmitArgs::augment_args(Command::new("mgpu submit")).args_override_self(true)
}

/// The merged options: every directive checked alone first (so an error names its line),
/// then all of them with the command line's typed options after them.
fn merge(batch: &Batch, args: &SubmitArgs, command_line: &ArgMatches) -> Result<SubmitArgs> {
    let submit = submit_command();
    for directive in &batch.directives {
        check_alone(&submit, &directive.words)
            .map_err(|err| anyhow!("{}: {err}", batch.place(directive)))?;
    }
    let mut argv: Vec<OsString> = vec!["mgpu submit".into()];
    argv.extend(
        batch
            .directives
            .iter()
            .flat_map(|d| d.words.iter().map(OsString::from)),
    );
    argv.extend(typed_options(&submit, command_line));
    argv.push("--".into());
    argv.extend(batch.command.iter().map(OsString::from));
    let matches = submit.try_get_matches_from(argv).map_err(|err| {
        anyhow!(
            "the {DIRECTIVE} lines of {} do not go with the command line: {}",
            batch.script.path,
            first_line(&err)
        )
    })?;
    let mut merged =
        SubmitArgs::from_arg_matches(&matches).map_err(|err| anyhow!(first_line(&err)))?;
    command_line_wins(&mut merged, args, command_line);
    Ok(merged)
}

/// Checks one directive's words as `mgpu submit` options, with nothing but options in them.
fn check_alone(submit: &Command, words: &[String]) -> Result<(), String> {
    if let Some(word) = words.iter().find(|w| {
        NOT_DIRECTIVES
            .iter()
            .any(|not| w.as_str() == *not || w.starts_with(&format!("{not}=")))
    }) {
        return Err(format!(
            "{word} cannot be a directive; directives give the job's options (--gpus, \
             --time-limit, --name, …)"
        ));
    }
    let mut argv: Vec<&str> = vec!["mgpu submit"];
    argv.extend(words.iter().map(String::as_str));
    argv.extend(["--", PLACEHOLDER]);
    let matches = submit
        .clone()
        .try_get_matches_from(argv)
        .map_err(|err| first_line(&err))?;
    let command: Vec<&String> = matches
        .get_many::<String>("command")
        .map(Iterator::collect)
        .unwrap_or_default();
    match command.first() {
        Some(first) if first.as_str() != PLACEHOLDER => Err(format!(
            "`{first}` is not an option; directives give options only (the command is the \
             script itself)"
        )),
        _ => Ok(()),
    }
}

/// The options typed on the command line, as `--name=value` words (flags bare), in the
/// command's order of arguments. The command itself is left out.
fn typed_options(submit: &Command, command_line: &ArgMatches) -> Vec<OsString> {
    let mut words = Vec::new();
    for arg in submit.get_arguments().filter(|a| !a.is_positional()) {
        let id = arg.get_id().as_str();
        if command_line.value_source(id) != Some(ValueSource::CommandLine) {
            continue;
        }
        let name = match (arg.get_long(), arg.get_short()) {
            (Some(long), _) => format!("--{long}"),
            (None, Some(short)) => format!("-{short}"),
            (None, None) => continue,
        };
        match arg.get_action() {
            ArgAction::Count => {
                let times = command_line.get_count(id);
                words.extend((0..times).map(|_| OsString::from(&name)));
            }
            action if action.takes_values() => {
                for value in command_line.get_raw(id).into_iter().flatten() {
                    let mut word = OsString::from(format!("{name}="));
                    word.push(value);
                    words.push(word);
                }
            }
            _ => words.push(OsString::from(&name)),
        }
    }
    words
}

/// Where the command line gives a list (`--after a,b`), its values replace the directives'
/// rather than adding to them.
fn command_line_wins(merged: &mut SubmitArgs, args: &SubmitArgs, command_line: &ArgMatches) {
    let typed = |id: &str| command_line.value_source(id) == Some(ValueSource::CommandLine);
    for id in LIST_OPTIONS {
        if !typed(id) {
            continue;
        }
        match *id {
            "nodelist" => merged.nodelist = args.nodelist.clone(),
            "exclude" => merged.exclude = args.exclude.clone(),
            "after" => merged.after = args.after.clone(),
            "after_any" => merged.after_any = args.after_any.clone(),
            _ => {}
        }
    }
}

/// The options that collect values across occurrences (a unit test keeps this list complete).
const LIST_OPTIONS: &[&str] = &["nodelist", "exclude", "after", "after_any"];

/// The first line of clap's message, without its `error: ` prefix.
fn first_line(err: &clap::Error) -> String {
    let text = err.to_string();
    let line = text.lines().next().unwrap_or_default();
    line.strip_prefix("error: ").unwrap_or(line).to_owned()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use mgpu_protocol::job::BatchScript;

    use super::super::batch_script::Directive;
    use super::*;

    fn batch(lines: &[&str]) -> Batch {
        let directives = lines
            .iter()
            .enumerate()
            .map(|(i, line)| Directive {
                line: i + 2,
                text: format!("{DIRECTIVE} {line}"),
                words: line.split(' ').map(str::to_owned).collect(),
            })
            .collect();
        Batch {
            script: BatchScript {
                path: "/home/alice/train.sh".into(),
                content: String::new(),
            },
            command: vec!["train.sh".into(), "--epochs".into(), "3".into()],
            directives,
        }
    }

    /// Merges `lines` with `mgpu submit TYPED… train.sh --epochs 3`.
    fn merged(lines: &[&str], typed: &[&str]) -> Result<SubmitArgs> {
        let mut argv = vec!["mgpu submit"];
        argv.extend_from_slice(typed);
        argv.extend(["train.sh", "--epochs", "3"]);
        let command_line = submit_command().try_get_matches_from(&argv)?;
        let args = SubmitArgs::from_arg_matches(&command_line)?;
        merge(&batch(lines), &args, &command_line)
    }

    fn error(lines: &[&str], typed: &[&str]) -> String {
        merged(lines, typed)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn directives_apply_and_the_command_line_wins() {
        let args = merged(
            &["--gpus 2", "--time-limit 2h --name bert", "--priority 5"],
            &["--name", "bert-large", "--priority", "-1"],
        );
        let Ok(args) = args else { panic!("{args:?}") };
        assert_eq!(args.gpus.map(|g| g.to_string()).as_deref(), Some("2"));
        assert_eq!(args.time_limit, Some(Duration::from_secs(7200)));
        assert_eq!(args.name.as_deref(), Some("bert-large"));
        assert_eq!(args.priority, -1);
        assert_eq!(args.command, ["train.sh", "--epochs", "3"]);
    }

    #[test]
    fn qos_and_signal_are_directives_too() {
        let args = merged(
            &["--qos scavenger --signal USR1@300 --reservation deadline"],
            &["--signal", "USR2@60"],
        );
        let Ok(args) = args else { panic!("{args:?}") };
        assert_eq!(args.qos.as_deref(), Some("scavenger"));
        assert_eq!(args.reservation.as_deref(), Some("deadline"));
        assert_eq!(
            args.signal.map(|s| s.to_string()).as_deref(),
            Some("USR2@60")
        );
        let err = error(&["--signal USR3@5"], &[]);
        assert!(err.contains("unknown signal \"USR3\""), "{err}");
    }

    #[test]
    fn idle_ok_is_a_directive_and_stands_unless_typed() {
        let args = merged(&["--gpus 1", "--idle-ok"], &["--name", "notebook"]);
        let Ok(args) = args else { panic!("{args:?}") };
        assert!(args.idle_ok);
        assert_eq!(args.name.as_deref(), Some("notebook"));
        let typed = merged(&["--gpus 1"], &["--idle-ok"]);
        assert_eq!(typed.ok().map(|a| a.idle_ok), Some(true));
        let neither = merged(&["--gpus 1"], &[]);
        assert_eq!(neither.ok().map(|a| a.idle_ok), Some(false));
    }

    #[test]
    fn a_later_directive_wins_over_an_earlier_one_and_defaults_do_not_count() {
        let args = merged(&["--priority 3", "--priority 4"], &["--gpus", "1"]);
        let Ok(args) = args else { panic!("{args:?}") };
        // The command line's --priority is its default, not typed: the directive stands.
        assert_eq!(args.priority, 4);
        assert_eq!(args.gpus.map(|g| g.to_string()).as_deref(), Some("1"));
    }

    #[test]
    fn lists_from_the_command_line_replace_the_directives_lists() {
        let args = merged(
            &["--exclude node001,node002 --dedup"],
            &["--exclude", "node003", "-q"],
        );
        let Ok(args) = args else { panic!("{args:?}") };
        assert_eq!(args.exclude, ["node003"]);
        assert!(args.dedup && args.quiet);
        let kept = merged(&["--exclude node001,node002"], &[]);
        assert_eq!(
            kept.ok().map(|a| a.exclude),
            Some(vec!["node001".into(), "node002".into()])
        );
    }

    #[test]
    fn a_bad_directive_is_named_with_its_line() {
        let err = error(&["--gpus 2", "--gpus two"], &[]);
        assert!(
            err.starts_with("/home/alice/train.sh line 3 (#MGPU --gpus two): invalid value 'two'"),
            "{err}"
        );
        let err = error(&["--gpu 2"], &[]);
        assert!(
            err.contains("line 2 (#MGPU --gpu 2): unexpected argument '--gpu'"),
            "{err}"
        );
        let err = error(&["--gpus 2 python"], &[]);
        assert!(
            err.contains("`python` is not an option; directives give options only"),
            "{err}"
        );
        let err = error(&["--file jobs.csv"], &[]);
        assert!(err.contains("--file cannot be a directive"), "{err}");
    }

    #[test]
    fn directives_that_clash_with_the_command_line_say_so() {
        let err = error(&["--gpus 2"], &["--gpus-per-node", "2"]);
        assert!(
            err.starts_with(
                "the #MGPU lines of /home/alice/train.sh do not go with the command line: "
            ),
            "{err}"
        );
    }

    #[test]
    fn every_list_option_is_replaced_by_the_command_lines() {
        let submit = submit_command();
        let lists: Vec<&str> = submit
            .get_arguments()
            .filter(|a| !a.is_positional() && matches!(a.get_action(), ArgAction::Append))
            .map(|a| a.get_id().as_str())
            .collect();
        assert_eq!(lists, LIST_OPTIONS);
    }
}
