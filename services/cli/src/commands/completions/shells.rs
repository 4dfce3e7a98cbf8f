//! The job-id additions to clap_complete's scripts, one per shell: where a subcommand of
//! [`JOB_ID_COMMANDS`] expects a job id, each asks `mgpu completions SHELL --job-ids` for
//! the live jobs, in the format that shell's completion system takes
//! ([`CompletionShell::job_line`]).
//!
//! clap_complete has no hook for this, so the additions work on its output: bash gets a
//! function run before clap's, zsh gets the job-id positionals of those subcommands pointed
//! at a function of ours, fish gets one more `complete` line. Each rewrite is unit-tested
//! against the generated text, so a clap_complete upgrade that changes its output fails a
//! test instead of silently losing the job ids.

use super::{CompletionShell, JOB_ID_COMMANDS};

/// What the additions need to know about the command line: the options that take a value
/// (their value is not a subcommand or a job id), before the subcommand and in each
/// subcommand of [`JOB_ID_COMMANDS`].
#[derive(Debug, Default)]
pub struct JobIdPositions {
    /// Options of `mgpu` itself that take a value (`--server URL`), long and short forms.
    pub root_value_options: Vec<String>,
    /// Each job-id subcommand with its options that take a value (globals included).
    pub commands: Vec<(String, Vec<String>)>,
}

impl JobIdPositions {
    /// Reads them from the built command (`clap_complete::generate` builds it, which copies
    /// the global options into every subcommand).
    pub fn of(command: &clap::Command) -> JobIdPositions {
        let commands = JOB_ID_COMMANDS
            .iter()
            .filter_map(|name| command.find_subcommand(name))
            .map(|sub| (sub.get_name().to_owned(), value_options(sub)))
            .collect();
        JobIdPositions {
            root_value_options: value_options(command),
            commands,
        }
    }

    fn names(&self) -> Vec<&str> {
        self.commands
            .iter()
            .map(|(name, _)| name.as_str())
            .collect()
    }
}

/// The `--long` and `-s` forms (aliases included) of the options of `command` that take a
/// value.
fn value_options(command: &clap::Command) -> Vec<String> {
    let mut names = Vec::new();
    for arg in command.get_arguments() {
        if arg.is_positional() || !arg.get_action().takes_values() {
            continue;
        }
        for long in arg.get_long_and_visible_aliases().unwrap_or_default() {
            names.push(format!("--{long}"));
        }
        for short in arg.get_short_and_visible_aliases().unwrap_or_default() {
            names.push(format!("-{short}"));
        }
    }
    names
}

impl CompletionShell {
    /// One job as this shell's completion takes it: bash only the id, zsh `ID:DESCRIPTION`
    /// (`_describe`), fish `ID<TAB>DESCRIPTION`.
    pub fn job_line(self, id: &str, description: &str) -> String {
        match self {
            CompletionShell::Bash => format!("{id}\n"),
            CompletionShell::Zsh => format!("{id}:{description}\n"),
            CompletionShell::Fish => format!("{id}\t{description}\n"),
        }
    }
}

/// The bash functions added to clap's script; `@…@` are filled in by [`bash`]. The line is
/// split at blanks from COMP_LINE rather than read from COMP_WORDS, which bash also splits at
/// `:` and `=`, so `--server nats://host:4222` would read as several words.
const BASH_ADDITION: &str = r#"
# Job ids, completed from the live queue (`mgpu completions bash --job-ids`).
_mgpu_job_ids() {
    local line="${COMP_LINE:0:COMP_POINT}" word sub="" skip=0 i
    local -a words=() connection=()
    read -ra words <<< "$line"
    [[ $line == *[[:space:]] ]] && words+=("")
    local count=${#words[@]}
    (( count >= 2 )) || return 1
    local cur="${words[count-1]}" prev="${words[count-2]}"
    for (( i = 1; i < count - 1; i++ )); do
        word="${words[i]}"
        if (( skip )); then
            skip=0
            connection+=("$word")
            continue
        fi
        case "$word" in
            @ROOT_VALUES@) skip=1; connection+=("$word") ;;
            -*) ;;
            *) [[ -z $sub ]] && sub="$word" ;;
        esac
    done
    case "$sub" in
        @COMMANDS@) ;;
        *) return 1 ;;
    esac
    [[ $cur == -* ]] && return 1
@SKIP_CASE@    local program="${words[0]}"
    [[ $program == "~/"* ]] && program="$HOME/${program#"~/"}"
    local IFS=$'\n'
    COMPREPLY=($(compgen -W "$("$program" "${connection[@]}" completions bash --job-ids 2>/dev/null)" -- "$cur"))
    return 0
}

_mgpu_with_job_ids() {
    _mgpu_job_ids || _mgpu "$@"
}
"#;

/// Bash: `_mgpu_job_ids` answers where a job id is expected (the word after a job-id
/// subcommand that is no option and no option's value) and otherwise leaves the word to
/// clap's `_mgpu`; the `complete` lines name the wrapper instead of `_mgpu`.
pub fn bash(generated: String, positions: &JobIdPositions) -> String {
    let root_values = positions.root_value_options.join("|");
    let skip_values: Vec<String> = positions
        .commands
        .iter()
        .flat_map(|(name, options)| options.iter().map(move |o| format!("\"{name} {o}\"")))
        .collect();
    let skip_case = if skip_values.is_empty() {
        String::new()
    } else {
        format!(
            "    case \"$sub $prev\" in\n        {}) return 1 ;;\n    esac\n",
            skip_values.join("|")
        )
    };
    let addition = BASH_ADDITION
        .replace("@ROOT_VALUES@", &root_values)
        .replace("@COMMANDS@", &positions.names().join("|"))
        .replace("@SKIP_CASE@", &skip_case);
    let mut script = generated.replace("complete -F _mgpu ", "complete -F _mgpu_with_job_ids ");
    // The functions must exist before `complete` names them, so they go before its block.
    let at = script
        .rfind("\nif [[ \"${BASH_VERSINFO")
        .unwrap_or(script.len());
    script.insert_str(at, &addition);
    script
}

/// Zsh: the job-id positionals of those subcommands (`':id -- …:_default'`) complete with
/// `_mgpu_job_ids`, which `_describe`s the live jobs.
pub fn zsh(generated: String, positions: &JobIdPositions) -> String {
    let mut script = generated;
    for name in positions.names() {
        script = point_positionals_at_jobs(&script, name);
    }
    let addition = r#"
(( $+functions[_mgpu_job_ids] )) ||
_mgpu_job_ids() {
    local -a jobs
    jobs=(${(f)"$(mgpu completions zsh --job-ids 2>/dev/null)"})
    _describe -t jobs 'job' jobs
}
"#;
    let at = script
        .rfind("\nif [ \"$funcstack[1]\" = \"_mgpu\" ]")
        .unwrap_or(script.len());
    script.insert_str(at, addition);
    script
}

/// In every `(NAME)` block of the zsh script (up to its `;;`), the positional specs
/// (`':…:_default'` or `'*::…:_default'`) complete with `_mgpu_job_ids` instead.
fn point_positionals_at_jobs(script: &str, name: &str) -> String {
    let opening = format!("({name})");
    let mut out = String::with_capacity(script.len() + 64);
    let mut in_block = false;
    for line in script.split_inclusive('\n') {
        let trimmed = line.trim();
        if trimmed == opening {
            in_block = true;
        } else if trimmed == ";;" {
            in_block = false;
        }
        let positional = line.starts_with("':") || line.starts_with("'*:");
        if in_block && positional && line.contains(":_default'") {
            out.push_str(&line.replacen(":_default'", ":_mgpu_job_ids'", 1));
        } else {
            out.push_str(line);
        }
    }
    out
}

/// Fish: one more `complete` line offering the live jobs after a job-id subcommand.
pub fn fish(generated: String, positions: &JobIdPositions) -> String {
    format!(
        r#"{generated}
# Job ids, completed from the live queue (`mgpu completions fish --job-ids`).
function __fish_mgpu_job_ids
    set -l cmd (commandline -opc)
    $cmd[1] completions fish --job-ids 2>/dev/null
end
complete -c mgpu -n "__fish_mgpu_using_subcommand {commands}" -f -a "(__fish_mgpu_job_ids)"
"#,
        commands = positions.names().join(" "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command line shaped like mgpu's: a global option with a value, job-id subcommands
    /// with and without options of their own, and another subcommand.
    fn sample() -> clap::Command {
        let id = || clap::Arg::new("id").value_name("ID").required(true);
        clap::Command::new("mgpu")
            .arg(clap::Arg::new("server").long("server").global(true))
            .subcommand(
                clap::Command::new("logs")
                    .arg(id())
                    .arg(
                        clap::Arg::new("follow")
                            .short('f')
                            .long("follow")
                            .action(clap::ArgAction::SetTrue),
                    )
                    .arg(clap::Arg::new("since").long("since").short('s')),
            )
            .subcommand(clap::Command::new("cancel").arg(id().num_args(1..)))
            .subcommand(clap::Command::new("queue"))
    }

    fn generated(shell: clap_complete::Shell) -> (String, JobIdPositions) {
        let mut command = sample();
        let mut buffer = Vec::new();
        clap_complete::generate(shell, &mut command, "mgpu", &mut buffer);
        let positions = JobIdPositions::of(&command);
        (String::from_utf8_lossy(&buffer).into_owned(), positions)
    }

    #[test]
    fn options_with_values_are_found_globals_included() {
        let (_, positions) = generated(clap_complete::Shell::Bash);
        assert_eq!(positions.root_value_options, ["--server"]);
        assert_eq!(positions.names(), ["cancel", "logs"]);
        let logs = positions.commands.iter().find(|(name, _)| name == "logs");
        let options = logs.map(|(_, options)| options.clone()).unwrap_or_default();
        assert!(options.contains(&"--server".to_owned()), "{options:?}");
        assert!(options.contains(&"--since".to_owned()), "{options:?}");
        assert!(options.contains(&"-s".to_owned()), "{options:?}");
        assert!(
            !options.contains(&"--follow".to_owned()),
            "a flag takes no value"
        );
    }

    #[test]
    fn bash_registers_the_wrapper_defined_before_it() {
        let (text, positions) = generated(clap_complete::Shell::Bash);
        let script = bash(text, &positions);
        assert!(!script.contains("complete -F _mgpu "), "{script}");
        let defined = script.find("_mgpu_with_job_ids() {");
        let registered = script.find("complete -F _mgpu_with_job_ids ");
        assert!(defined.is_some() && registered.is_some(), "{script}");
        assert!(defined < registered, "{script}");
        assert!(script.contains("        cancel|logs) ;;"), "{script}");
        assert!(script.contains("\"logs --since\"|\"logs -s\""), "{script}");
    }

    #[test]
    fn zsh_points_only_the_job_id_positionals_at_the_jobs() {
        let (text, positions) = generated(clap_complete::Shell::Zsh);
        let defaults = text.matches(":_default'").count();
        let script = zsh(text, &positions);
        // `logs ID` and `cancel ID…`; option values (`--since`) and `queue` keep theirs.
        assert_eq!(script.matches(":_mgpu_job_ids'").count(), 2, "{script}");
        assert_eq!(
            script.matches(":_default'").count(),
            defaults - 2,
            "{script}"
        );
        assert!(script.contains("':id:_mgpu_job_ids' \\"), "{script}");
        let defined = script.find("_mgpu_job_ids() {");
        let dispatched = script.find("if [ \"$funcstack[1]\" = \"_mgpu\" ]");
        assert!(defined.is_some() && defined < dispatched, "{script}");
    }

    #[test]
    fn fish_offers_the_jobs_after_the_job_id_subcommands() {
        let (text, positions) = generated(clap_complete::Shell::Fish);
        assert!(
            text.contains("function __fish_mgpu_using_subcommand"),
            "{text}"
        );
        let script = fish(text, &positions);
        assert!(
            script.contains(
                "complete -c mgpu -n \"__fish_mgpu_using_subcommand cancel logs\" -f -a \"(__fish_mgpu_job_ids)\""
            ),
            "{script}"
        );
    }

    #[test]
    fn each_shell_gets_the_line_format_it_reads() {
        assert_eq!(
            CompletionShell::Bash.job_line("ab12", "x (queued)"),
            "ab12\n"
        );
        assert_eq!(
            CompletionShell::Zsh.job_line("ab12", "x (queued)"),
            "ab12:x (queued)\n"
        );
        assert_eq!(
            CompletionShell::Fish.job_line("ab12", "x (queued)"),
            "ab12\tx (queued)\n"
        );
    }
}
