//! How a job's command starts under its guard: directly, as the program and its words, when
//! it is a simple command a shell would only look up and run; under `SHELL -c SCRIPT` (the
//! script of `script.rs`) otherwise. The decision is the shell-word analysis below: every rule
//! that sends a command to the shell is one a shell would give a meaning a bare exec lacks.
//!
//! Pure apart from [`shell_program`], so the decision is unit-tested without spawning a job.

use std::sync::OnceLock;

use mgpu_protocol::job::{JobSpec, is_plain_word};

use crate::script::{build_script, env_setup, fill_gpus, gpu_list};

/// How a job's command starts under its guard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Launch {
    /// `SHELL -c SCRIPT`, the script of [`build_script`].
    Shell(String),
    /// The program and its arguments, run as they are (the program looked up on the job's
    /// `PATH`): a simple command, which a shell would only have looked up and run itself. A
    /// shell's start costs more than the rest of a short job's start put together.
    Direct { program: String, args: Vec<String> },
}

/// Shell builtins and reserved words that are plain words: a command starting with one of
/// these needs the shell. `true`, `false`, `echo`, `printf`, `test` and `kill` are missing on
/// purpose: their programs in `/usr/bin` do what the builtins do. (`pwd` is not: the program
/// prints the physical path, the builtin the logical one.)
const SHELL_ONLY: &[&str] = &[
    ".",
    ":",
    "alias",
    "bg",
    "bind",
    "break",
    "builtin",
    "caller",
    "case",
    "cd",
    "command",
    "compgen",
    "complete",
    "compopt",
    "continue",
    "coproc",
    "declare",
    "dirs",
    "disown",
    "do",
    "done",
    "elif",
    "else",
    "enable",
    "esac",
    "eval",
    "exec",
    "exit",
    "export",
    "fc",
    "fg",
    "fi",
    "for",
    "function",
    "getopts",
    "hash",
    "help",
    "history",
    "if",
    "in",
    "jobs",
    "let",
    "local",
    "logout",
    "mapfile",
    "popd",
    "pushd",
    "pwd",
    "read",
    "readarray",
    "readonly",
    "return",
    "select",
    "set",
    "shift",
    "shopt",
    "source",
    "suspend",
    "then",
    "time",
    "times",
    "trap",
    "type",
    "typeset",
    "ulimit",
    "umask",
    "unalias",
    "unset",
    "until",
    "wait",
    "while",
];

impl Launch {
    /// The program the guard runs and its arguments: `shell -c SCRIPT`, or the command's own
    /// program and words.
    pub fn into_program(self, shell: &str) -> (String, Vec<String>) {
        match self {
            Launch::Shell(script) => (shell.to_owned(), vec!["-c".to_owned(), script]),
            Launch::Direct { program, args } => (program, args),
        }
    }
}

/// How the job starts: [`Launch::Direct`] when the command is a simple command (one line of
/// plain words, or several elements, which are literal words) with no environment setup or
/// conda environment, whose first word is no assignment, shell builtin, reserved word or
/// exported shell function; [`Launch::Shell`] otherwise, so the shell keeps its meaning
/// wherever it would do more than run a program.
pub fn launch(spec: &JobSpec, gpus: &[u32]) -> Launch {
    let shell = || Launch::Shell(build_script(spec, gpus));
    if env_setup(spec).is_some() || spec.conda_env.is_some() {
        return shell();
    }
    let Some(words) = plain_words(fill_gpus(&spec.command, &gpu_list(gpus))) else {
        return shell();
    };
    match words.split_first() {
        Some((program, args)) if runs_as_program(program, spec) => Launch::Direct {
            program: program.clone(),
            args: args.to_vec(),
        },
        _ => shell(),
    }
}

/// The words the command is, when a shell would do nothing with them but split them: several
/// elements are literal words as they are; one element is a line split at blanks, provided
/// every word in it is plain (no quote, expansion, operator or anything else a shell reads).
/// None when the shell is needed.
fn plain_words(filled: Vec<String>) -> Option<Vec<String>> {
    let [line] = filled.as_slice() else {
        return Some(filled);
    };
    let words: Vec<&str> = line.split([' ', '\t']).collect();
    if !words
        .iter()
        .all(|word| word.is_empty() || is_plain_word(word))
    {
        return None;
    }
    Some(
        words
            .into_iter()
            .filter(|word| !word.is_empty())
            .map(str::to_owned)
            .collect(),
    )
}

/// Whether `program`, the command's first word, is a program a shell would only look up and
/// run: not empty, no variable assignment, no builtin or reserved word, and no function the
/// submitter's shell exported under that name (which the shell would run instead).
fn runs_as_program(program: &str, spec: &JobSpec) -> bool {
    let exported_function = spec.env.contains_key(&format!("BASH_FUNC_{program}%%"));
    !(program.is_empty()
        || program.contains('=')
        || SHELL_ONLY.contains(&program)
        || exported_function)
}

/// `/bin/bash` where there is one (`source` and `conda activate` need it), else `/bin/sh`.
pub fn shell_program() -> &'static str {
    static SHELL: OnceLock<&'static str> = OnceLock::new();
    SHELL.get_or_init(|| {
        if std::path::Path::new("/bin/bash").exists() {
            "/bin/bash"
        } else {
            "/bin/sh"
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(command: &[&str]) -> JobSpec {
        JobSpec::new(command.iter().map(|s| (*s).to_owned()).collect(), "/tmp")
    }

    fn direct(words: &[&str]) -> Launch {
        let owned = |words: &[&str]| words.iter().map(|w| (*w).to_owned()).collect();
        Launch::Direct {
            program: words[0].to_owned(),
            args: owned(&words[1..]),
        }
    }

    #[test]
    fn a_simple_command_runs_without_a_shell() {
        assert_eq!(launch(&spec(&["true"]), &[]), direct(&["true"]));
        assert_eq!(
            launch(
                &spec(&["python  train.py\t--lr=0.1 --gpus {gpus}"]),
                &[0, 2]
            ),
            direct(&["python", "train.py", "--lr=0.1", "--gpus", "0,2"])
        );
        // Several elements are literal words: quoting them for a shell changes nothing.
        assert_eq!(
            launch(&spec(&["./run me", "a b", "$HOME", "*"]), &[]),
            direct(&["./run me", "a b", "$HOME", "*"])
        );
        assert_eq!(launch(&spec(&["echo", "hi"]), &[]), direct(&["echo", "hi"]));
    }

    #[test]
    fn anything_a_shell_would_do_more_with_keeps_the_shell() {
        let shell = |command: &[&str]| {
            let spec = spec(command);
            assert_eq!(
                launch(&spec, &[1]),
                Launch::Shell(build_script(&spec, &[1])),
                "{command:?}"
            );
        };
        for line in [
            "echo $HOME",
            "ls *.txt",
            "a && b",
            "a | b",
            "a; b",
            "a\nb",
            "echo 'quoted'",
            "cd /tmp",
            "source venv/bin/activate",
            "exit 3",
            "FOO=1 env",
            "~/bin/run",
            "echo {a,b}",
            "cmd > out",
            "cmd # comment",
            "",
            "   ",
        ] {
            shell(&[line]);
        }
        shell(&["cd", "/tmp"]);
        shell(&["A=b", "env"]);
        shell(&["", "x"]);
        let mut with_setup = spec(&["true"]);
        with_setup.env_setup_cmd = Some("source venv/bin/activate".into());
        assert!(matches!(launch(&with_setup, &[]), Launch::Shell(_)));
        let mut with_conda = spec(&["true"]);
        with_conda.conda_env = Some("llm".into());
        assert!(matches!(launch(&with_conda, &[]), Launch::Shell(_)));
        // A function exported from the submitter's shell would replace the program.
        let mut with_function = spec(&["python", "x.py"]);
        with_function
            .env
            .insert("BASH_FUNC_python%%".into(), "() { echo no; }".into());
        assert!(matches!(launch(&with_function, &[]), Launch::Shell(_)));
        // An empty setup is no setup.
        let mut empty_setup = spec(&["true"]);
        empty_setup.env_setup_cmd = Some("  ".into());
        assert_eq!(launch(&empty_setup, &[]), direct(&["true"]));
    }

    /// Each direct launch runs what bash runs for the same job: same argv, same exit code.
    #[test]
    fn a_direct_launch_runs_what_the_shell_would() {
        if !std::path::Path::new("/bin/bash").exists() {
            return;
        }
        let argv_of = |program: &str, args: &[String]| {
            let out = std::process::Command::new(program)
                .args(args)
                .output()
                .unwrap_or_else(|e| panic!("{program}: {e}"));
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            )
        };
        for command in [
            &["printf", "[%s]", "a b", "$HOME", "*", "{gpus}"][..],
            &["printf %s. x=1 --flag=a,b {gpus}"][..],
            &["false"][..],
        ] {
            let spec = spec(command);
            let Launch::Direct { program, args } = launch(&spec, &[3]) else {
                panic!("{command:?} should run directly");
            };
            let script = build_script(&spec, &[3]);
            assert_eq!(
                argv_of(&program, &args),
                argv_of("/bin/bash", &["-c".to_owned(), script]),
                "{command:?}"
            );
        }
    }

    #[test]
    fn a_launch_becomes_the_guards_program_and_arguments() {
        let shell = Launch::Shell("echo $HOME".into()).into_program("/bin/sh");
        assert_eq!(
            shell,
            (
                "/bin/sh".to_owned(),
                vec!["-c".to_owned(), "echo $HOME".to_owned()]
            )
        );
        let direct = direct(&["python", "a b"]).into_program("/bin/sh");
        assert_eq!(direct, ("python".to_owned(), vec!["a b".to_owned()]));
    }

    #[test]
    fn only_plain_blank_separated_words_are_split() {
        let owned = |words: &[&str]| words.iter().map(|w| (*w).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            plain_words(owned(&[" a\tb  c "])),
            Some(owned(&["a", "b", "c"]))
        );
        assert_eq!(plain_words(owned(&["a $b"])), None);
        assert_eq!(plain_words(owned(&["a", "$b"])), Some(owned(&["a", "$b"])));
        assert_eq!(plain_words(owned(&["  "])), Some(Vec::new()));
        let s = spec(&["true"]);
        assert!(runs_as_program("python", &s));
        assert!(!runs_as_program("cd", &s));
        assert!(!runs_as_program("A=1", &s));
        assert!(!runs_as_program("", &s));
    }
}
