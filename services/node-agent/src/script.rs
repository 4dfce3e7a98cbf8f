//! The shell script a job runs when it needs a shell: environment setup, conda activation,
//! then the command with `{gpus}` filled in. Whether a job needs a shell at all is decided in
//! `launch.rs`; the environment it runs with is built in `environment.rs`.
//!
//! Everything here is pure, so the exact text a job gets is unit-tested without spawning it.

use mgpu_protocol::job::{GPUS_PLACEHOLDER, JobSpec, shell_quote};

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

/// The command's elements with `{gpus}` replaced by `gpu_list` in every one.
pub fn fill_gpus(command: &[String], gpu_list: &str) -> Vec<String> {
    command
        .iter()
        .map(|arg| arg.replace(GPUS_PLACEHOLDER, gpu_list))
        .collect()
}

/// The environment setup command, when there is one that is not blank.
pub fn env_setup(spec: &JobSpec) -> Option<&str> {
    spec.env_setup_cmd
        .as_deref()
        .filter(|setup| !setup.trim().is_empty())
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
    if let Some(setup) = env_setup(spec) {
        lines.push(setup.to_owned());
    }
    if let Some(env) = spec.conda_env.as_deref() {
        lines.push(conda_activation(env));
    }
    // The command as one shell line with `{gpus}` filled in (listings show it unfilled).
    let filled = fill_gpus(&spec.command, &gpu_list(gpus));
    lines.push(mgpu_protocol::job::command_line(&filled));
    lines.join("\n")
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

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(command: &[&str]) -> JobSpec {
        JobSpec::new(command.iter().map(|s| (*s).to_owned()).collect(), "/tmp")
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
    fn only_a_setup_that_is_not_blank_counts() {
        let mut s = spec(&["true"]);
        assert_eq!(env_setup(&s), None);
        s.env_setup_cmd = Some(" \t".into());
        assert_eq!(env_setup(&s), None);
        s.env_setup_cmd = Some(" module load cuda".into());
        assert_eq!(env_setup(&s), Some(" module load cuda"));
    }
}
