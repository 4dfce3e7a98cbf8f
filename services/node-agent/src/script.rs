//! What a job attempt runs: the shell script built from its spec (environment setup, conda
//! activation, then the command with `{gpus}` filled in) and the environment it runs with.
//!
//! Everything here is pure, so the exact text a job gets is unit-tested without spawning it.

use std::collections::BTreeMap;
use std::path::Path;

use mgpu_protocol::job::{GPUS_PLACEHOLDER, JobSpec, Placement, shell_quote};

use crate::running::AttemptKey;

/// Exit status of a job whose conda environment cannot be activated: the shell's "command not
/// found", since what is missing is the environment the command needs.
pub const CONDA_FAILURE_EXIT: i32 = 127;

/// The assigned GPU indices as CUDA_VISIBLE_DEVICES and `{gpus}` get them: `0,2`.
pub fn gpu_list(gpus: &[u32]) -> String {
    gpus.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The shell script a job runs, in one shell so that each step affects the next:
///
/// 1. `env_setup_cmd` (`source venv/bin/activate`), when there is one;
/// 2. the conda environment's activation, when there is one; the job stops with
///    [`CONDA_FAILURE_EXIT`] and a message on stderr if it fails, rather than running the
///    command with the wrong Python;
/// 3. the command, `{gpus}` replaced in every element. One element is a shell line used as is;
///    several are quoted word by word (after the replacement, so an index list stays one word).
pub fn build_script(spec: &JobSpec, gpus: &[u32]) -> String {
    let mut lines = Vec::new();
    if let Some(setup) = spec.env_setup_cmd.as_deref()
        && !setup.trim().is_empty()
    {
        lines.push(setup.to_owned());
    }
    if let Some(env) = spec.conda_env.as_deref() {
        lines.push(conda_activation(env));
    }
    lines.push(command_line(&spec.command, &gpu_list(gpus)));
    lines.join("\n")
}

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

/// How the job starts: [`Launch::Direct`] when the command is a simple command (one line of
/// plain words, or several elements, which are literal words) with no environment setup or
/// conda environment, whose first word is no assignment, shell builtin, reserved word or
/// exported shell function; [`Launch::Shell`] otherwise, so the shell keeps its meaning
/// wherever it would do more than run a program.
pub fn launch(spec: &JobSpec, gpus: &[u32]) -> Launch {
    let shell = || Launch::Shell(build_script(spec, gpus));
    let has_setup = spec
        .env_setup_cmd
        .as_deref()
        .is_some_and(|setup| !setup.trim().is_empty());
    if has_setup || spec.conda_env.is_some() {
        return shell();
    }
    let gpu_list = gpu_list(gpus);
    let filled: Vec<String> = spec
        .command
        .iter()
        .map(|arg| arg.replace(GPUS_PLACEHOLDER, &gpu_list))
        .collect();
    let words = match filled.as_slice() {
        [line] => {
            let simple = line
                .split([' ', '\t'])
                .all(|word| word.is_empty() || mgpu_protocol::job::is_plain_word(word));
            if !simple {
                return shell();
            }
            line.split([' ', '\t'])
                .filter(|word| !word.is_empty())
                .map(str::to_owned)
                .collect()
        }
        _ => filled,
    };
    let Some((program, args)) = words.split_first() else {
        return shell();
    };
    let exported_function = spec.env.contains_key(&format!("BASH_FUNC_{program}%%"));
    if program.is_empty()
        || program.contains('=')
        || SHELL_ONLY.contains(&program.as_str())
        || exported_function
    {
        return shell();
    }
    Launch::Direct {
        program: program.clone(),
        args: args.to_vec(),
    }
}

/// The line activating a conda environment. `conda shell.bash hook` defines the `conda` shell
/// function that `activate` needs (a non-interactive shell never read the user's `.bashrc`);
/// when conda is missing altogether, the hook prints nothing and `conda activate` fails, which
/// the same message covers.
fn conda_activation(env: &str) -> String {
    let quoted = shell_quote(env);
    // The name is closed off from the double-quoted text and appended as its own quoted word,
    // so the message reads the same for any name and no name can inject shell code.
    format!(
        r#"eval "$(conda shell.bash hook 2>/dev/null)" && conda activate {quoted} || {{ echo "mgpu: cannot activate conda environment "{quoted} >&2; exit {CONDA_FAILURE_EXIT}; }}"#
    )
}

/// The command as one shell line with `{gpus}` filled in (listings show it unfilled).
fn command_line(command: &[String], gpu_list: &str) -> String {
    let filled: Vec<String> = command
        .iter()
        .map(|arg| arg.replace(GPUS_PLACEHOLDER, gpu_list))
        .collect();
    mgpu_protocol::job::command_line(&filled)
}

/// Whether a variable from the submitter's captured environment is passed on. The agent sets
/// the GPU and mgpu variables itself, and `LD_PRELOAD` would inject code into every process
/// the job starts.
fn passes_user_variable(name: &str) -> bool {
    !(name.is_empty()
        || name.contains(['=', '\0'])
        || name == "LD_PRELOAD"
        || name == "CUDA_VISIBLE_DEVICES"
        || name == "CUDA_DEVICE_ORDER"
        || name.starts_with("MGPU_"))
}

/// The job's whole environment: the submitter's captured one (filtered), then the agent's
/// variables, which always win.
/// Where one process of a multi-node job stands among the others.
pub struct RankInfo<'a> {
    pub placement: &'a Placement,
    pub rank: u32,
    pub hostfile: &'a Path,
}

pub fn job_environment(
    spec: &JobSpec,
    key: &AttemptKey,
    node: &str,
    gpus: &[u32],
    ranks: Option<&RankInfo<'_>>,
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = spec
        .env
        .iter()
        .filter(|(name, value)| passes_user_variable(name) && !value.contains('\0'))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    let gpu_list = gpu_list(gpus);
    env.insert("CUDA_VISIBLE_DEVICES".into(), gpu_list.clone());
    // CUDA's default numbering is fastest-first; PCI bus order matches NVML's indices.
    env.insert("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into());
    env.insert("MGPU_JOB_ID".into(), key.job_id.to_string());
    env.insert("MGPU_NODE".into(), node.to_owned());
    env.insert("MGPU_ATTEMPT".into(), key.attempt.to_string());
    // Attempts count from 1; a job checks this to resume from its checkpoint after a requeue.
    env.insert(
        "MGPU_RESTART_COUNT".into(),
        key.attempt.saturating_sub(1).to_string(),
    );
    env.insert("MGPU_GPUS".into(), gpu_list);
    if let Some(member) = &spec.array {
        env.insert("MGPU_ARRAY_INDEX".into(), member.index.to_string());
        env.insert("MGPU_ARRAY_ID".into(), member.array_id.to_string());
    }
    if let Some(info) = ranks {
        rank_environment(&mut env, info);
    }
    env
}

/// The variables torchrun, `torch.distributed` and MPI launchers read, plus mgpu's own.
fn rank_environment(env: &mut BTreeMap<String, String>, info: &RankInfo<'_>) {
    let placement = info.placement;
    let nodes = placement.node_count();
    let gpus_per_node = placement.gpus.len().max(1);
    let nodelist = placement.nodes_label();
    env.insert("MGPU_NODELIST".into(), nodelist);
    env.insert("MGPU_NNODES".into(), nodes.to_string());
    env.insert("MGPU_NODE_RANK".into(), info.rank.to_string());
    env.insert("MGPU_HOSTFILE".into(), info.hostfile.display().to_string());
    if let Some(launch) = &placement.launch
        && launch.distributed
    {
        let master = launch
            .addresses
            .first()
            .cloned()
            .unwrap_or_else(|| placement.node.clone());
        env.insert("MASTER_ADDR".into(), master);
        env.insert("MASTER_PORT".into(), launch.master_port.to_string());
        env.insert("NNODES".into(), nodes.to_string());
        env.insert("NODE_RANK".into(), info.rank.to_string());
        env.insert("GPUS_PER_NODE".into(), gpus_per_node.to_string());
        // torchrun's WORLD_SIZE: one process per GPU on every node (at least one per node).
        let world: usize = placement
            .ranks()
            .map(|(_, _, gpus)| gpus.len().max(1))
            .sum();
        env.insert("WORLD_SIZE".into(), world.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgpu_protocol::ids::JobId;
    use mgpu_protocol::job::ArrayMember;

    fn spec(command: &[&str]) -> JobSpec {
        JobSpec::new(command.iter().map(|s| (*s).to_owned()).collect(), "/tmp")
    }

    fn key(attempt: u32) -> AttemptKey {
        AttemptKey {
            job_id: JobId::random(),
            attempt,
        }
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
    fn one_element_is_a_shell_line_used_as_is() {
        let s = spec(&["python train.py | tee log.txt && echo $HOME"]);
        assert_eq!(
            build_script(&s, &[0]),
            "python train.py | tee log.txt && echo $HOME"
        );
    }

    #[test]
    fn several_elements_are_quoted_word_by_word() {
        let s = spec(&[
            "python",
            "-c",
            "print('hi there')",
            "a b",
            "$HOME",
            "plain-arg",
        ]);
        assert_eq!(
            build_script(&s, &[0]),
            r#"python -c 'print('\''hi there'\'')' 'a b' '$HOME' plain-arg"#
        );
    }

    #[test]
    fn the_environment_setup_runs_first_in_the_same_shell() {
        let mut s = spec(&["python", "train.py"]);
        s.env_setup_cmd = Some("source venv/bin/activate".into());
        assert_eq!(
            build_script(&s, &[]),
            "source venv/bin/activate\npython train.py"
        );
        s.env_setup_cmd = Some("   ".into());
        assert_eq!(build_script(&s, &[]), "python train.py");
    }

    #[test]
    fn gpus_placeholder_becomes_the_assigned_indices_in_every_element() {
        let line = spec(&["python run.py --cuda {gpus} --log gpu{gpus}.txt"]);
        assert_eq!(
            build_script(&line, &[0, 2]),
            "python run.py --cuda 0,2 --log gpu0,2.txt"
        );
        let words = spec(&["python", "run.py", "--cuda", "{gpus}", "--tag=a{gpus}b"]);
        assert_eq!(
            build_script(&words, &[3]),
            "python run.py --cuda 3 --tag=a3b"
        );
        // Without GPUs the placeholder empties, as CUDA_VISIBLE_DEVICES does.
        assert_eq!(
            build_script(&words, &[]),
            "python run.py --cuda '' --tag=ab"
        );
        // Only the exact text is replaced.
        let near = spec(&["echo {gpu} {GPUS} { gpus }"]);
        assert_eq!(build_script(&near, &[1]), "echo {gpu} {GPUS} { gpus }");
    }

    #[test]
    fn conda_activates_after_the_setup_and_before_the_command() {
        let mut s = spec(&["python", "train.py"]);
        s.conda_env = Some("llm-env".into());
        let activate = r#"eval "$(conda shell.bash hook 2>/dev/null)" && conda activate llm-env || { echo "mgpu: cannot activate conda environment "llm-env >&2; exit 127; }"#;
        assert_eq!(
            build_script(&s, &[0]),
            format!("{activate}\npython train.py")
        );
        s.env_setup_cmd = Some("module load cuda".into());
        assert_eq!(
            build_script(&s, &[0]),
            format!("module load cuda\n{activate}\npython train.py")
        );
    }

    #[test]
    fn a_conda_name_is_quoted_as_one_word() {
        // Validation refuses such names; the script stays safe even without it.
        let mut s = spec(&["true"]);
        s.conda_env = Some("x; rm -rf ~".into());
        let script = build_script(&s, &[]);
        assert!(
            script.contains("conda activate 'x; rm -rf ~' ||"),
            "{script}"
        );
        assert!(
            script.contains(r#"environment "'x; rm -rf ~' >&2"#),
            "{script}"
        );
    }

    /// Runs the conda line in a real bash with a fake `conda` on PATH, so the shell syntax and
    /// the failure path are checked, not just the text.
    #[test]
    fn the_conda_line_activates_or_stops_the_job_with_127() {
        use std::os::unix::fs::PermissionsExt;
        if !std::path::Path::new("/bin/bash").exists() {
            return;
        }
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let fake = dir.path().join("conda");
        // The hook defines a `conda` function that knows only the environment `good`.
        let hook = r#"#!/bin/sh
if [ "$1" = shell.bash ]; then
  echo 'conda() { [ "$1" = activate ] && [ "$2" = good ] && export CONDA_DEFAULT_ENV="$2"; }'
fi
"#;
        std::fs::write(&fake, hook).unwrap_or_else(|e| panic!("write: {e}"));
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("chmod: {e}"));
        let path = format!("{}:/usr/bin:/bin", dir.path().display());
        let run = |env: &str| {
            let mut s = spec(&["echo active=$CONDA_DEFAULT_ENV"]);
            s.conda_env = Some(env.into());
            std::process::Command::new("/bin/bash")
                .arg("-c")
                .arg(build_script(&s, &[]))
                .env_clear()
                .env("PATH", &path)
                .output()
                .unwrap_or_else(|e| panic!("bash: {e}"))
        };
        let good = run("good");
        assert_eq!(good.status.code(), Some(0));
        assert_eq!(String::from_utf8_lossy(&good.stdout), "active=good\n");
        let bad = run("missing");
        assert_eq!(bad.status.code(), Some(CONDA_FAILURE_EXIT));
        assert!(
            bad.stdout.is_empty(),
            "the command ran without its environment"
        );
        assert_eq!(
            String::from_utf8_lossy(&bad.stderr),
            "mgpu: cannot activate conda environment missing\n"
        );
    }

    #[test]
    fn user_variables_cannot_override_the_agents_or_inject_code() {
        let mut s = spec(&["true"]);
        s.env = [
            ("PATH", "/usr/bin"),
            ("HOME", "/home/alice"),
            ("LD_PRELOAD", "/tmp/evil.so"),
            ("LD_LIBRARY_PATH", "/opt/cuda/lib64"),
            ("CUDA_VISIBLE_DEVICES", "0,1,2,3"),
            ("CUDA_DEVICE_ORDER", "FASTEST_FIRST"),
            ("MGPU_JOB_ID", "forged"),
            ("MGPU_ANYTHING", "x"),
            ("MGPU_RESTART_COUNT", "9"),
            ("MGPU_ARRAY_INDEX", "9"),
            ("MGPU_ARRAY_ID", "forged"),
            ("BAD=NAME", "x"),
            ("NUL_VALUE", "a\0b"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let key = key(3);
        let env = job_environment(&s, &key, "node001", &[2, 5], None);
        let get = |name: &str| env.get(name).map(String::as_str);
        assert_eq!(get("PATH"), Some("/usr/bin"));
        assert_eq!(get("HOME"), Some("/home/alice"));
        assert_eq!(get("LD_LIBRARY_PATH"), Some("/opt/cuda/lib64"));
        assert_eq!(get("LD_PRELOAD"), None);
        assert_eq!(get("MGPU_ANYTHING"), None);
        assert_eq!(get("BAD=NAME"), None);
        assert_eq!(get("NUL_VALUE"), None);
        assert_eq!(get("CUDA_VISIBLE_DEVICES"), Some("2,5"));
        assert_eq!(get("MGPU_GPUS"), Some("2,5"));
        assert_eq!(get("CUDA_DEVICE_ORDER"), Some("PCI_BUS_ID"));
        assert_eq!(get("MGPU_JOB_ID"), Some(key.job_id.as_str()));
        assert_eq!(get("MGPU_NODE"), Some("node001"));
        assert_eq!(get("MGPU_ATTEMPT"), Some("3"));
        assert_eq!(get("MGPU_RESTART_COUNT"), Some("2"));
        // Not an array task: the forged array variables are dropped, none are set.
        assert_eq!(get("MGPU_ARRAY_INDEX"), None);
        assert_eq!(get("MGPU_ARRAY_ID"), None);
    }

    #[test]
    fn the_first_attempt_is_no_restart() {
        let env = job_environment(&spec(&["true"]), &key(1), "n", &[0], None);
        assert_eq!(env.get("MGPU_RESTART_COUNT").map(String::as_str), Some("0"));
    }

    #[test]
    fn array_tasks_see_their_index_and_array() {
        let mut s = spec(&["true"]);
        let array_id = JobId::random();
        s.array = Some(ArrayMember {
            array_id: array_id.clone(),
            index: 4,
            max_running: Some(2),
        });
        let env = job_environment(&s, &key(1), "n", &[0], None);
        let get = |name: &str| env.get(name).map(String::as_str);
        assert_eq!(get("MGPU_ARRAY_INDEX"), Some("4"));
        assert_eq!(get("MGPU_ARRAY_ID"), Some(array_id.as_str()));
    }

    #[test]
    fn a_job_without_gpus_sees_none() {
        let env = job_environment(&spec(&["true"]), &key(1), "n", &[], None);
        assert_eq!(
            env.get("CUDA_VISIBLE_DEVICES").map(String::as_str),
            Some("")
        );
        assert_eq!(env.get("MGPU_GPUS").map(String::as_str), Some(""));
    }

    #[test]
    fn a_distributed_rank_gets_the_torchrun_variables() {
        use mgpu_protocol::gpu_amount::GpuAmount;
        use mgpu_protocol::job::{GpuShare, Launch, NodeShare};
        let share = |index| GpuShare {
            index,
            amount: GpuAmount::ONE,
            mem_mib: 0,
        };
        let placement = Placement {
            node: "a".into(),
            gpus: vec![share(0), share(1)],
            peers: vec![NodeShare {
                node: "b".into(),
                gpus: vec![share(2), share(3)],
            }],
            launch: Some(Launch {
                distributed: true,
                addresses: vec!["10.0.0.1".into(), "10.0.0.2".into()],
                master_port: 29_877,
            }),
        };
        let info = RankInfo {
            placement: &placement,
            rank: 1,
            hostfile: Path::new("/tmp/h"),
        };
        let env = job_environment(&spec(&["true"]), &key(1), "b", &[2, 3], Some(&info));
        let get = |name: &str| env.get(name).map(String::as_str);
        assert_eq!(get("MASTER_ADDR"), Some("10.0.0.1"));
        assert_eq!(get("MASTER_PORT"), Some("29877"));
        assert_eq!(get("NNODES"), Some("2"));
        assert_eq!(get("NODE_RANK"), Some("1"));
        assert_eq!(get("GPUS_PER_NODE"), Some("2"));
        assert_eq!(get("WORLD_SIZE"), Some("4"));
        assert_eq!(get("MGPU_HOSTFILE"), Some("/tmp/h"));
        assert_eq!(get("MGPU_NODELIST"), Some("a,b"));
        assert_eq!(get("CUDA_VISIBLE_DEVICES"), Some("2,3"));
    }
}
