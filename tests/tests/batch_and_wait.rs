//! Batch scripts, `mgpu wait` and the shell integration, told as stories: a script's `#MGPU`
//! lines are submit options and the command line wins; the job runs the script as it was at
//! submit; `wait` blocks until jobs end and exits with how they ended; the completion scripts
//! load in bash and complete live job ids; `mgpu man` writes the pages. Real nats-server,
//! real binaries.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use mgpu_tests::{Cluster, NodeSpec, bin_dir};
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

fn one_gpu_node() -> Vec<NodeSpec> {
    vec![NodeSpec::new("node001", "1x24GiB")]
}

/// Writes an executable script into the cluster's directory, where `mgpu` runs.
fn write_script(cluster: &Cluster, name: &str, content: &str) -> PathBuf {
    let path = cluster.dir.path().join(name);
    mgpu_tests::write_executable(&path, content);
    path
}

/// The id `mgpu submit --json …` printed.
fn submitted_id(out: &Output) -> String {
    assert!(
        out.status.success(),
        "submit failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("submit --json printed {out:?}: {e}"));
    json["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no id in {json}"))
        .to_owned()
}

fn stdout_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Alice writes `train.sh` with `#MGPU` lines for its name, time limit and priority, and
/// submits it with a priority of her own on the command line: the job takes the script's
/// name and time limit, her priority, and runs the script with its arguments.
#[test]
fn a_batch_scripts_directives_apply_and_the_command_line_wins() {
    let cluster = Cluster::start(&one_gpu_node());
    write_script(
        &cluster,
        "train.sh",
        "#!/bin/bash
# Trains BERT.
#MGPU --name bert
#MGPU --time-limit 2h --priority 3
#MGPU --gpus 1   # one is enough

echo \"args: $*\"
echo \"gpus: $CUDA_VISIBLE_DEVICES\"
#MGPU --name not-a-directive-any-more
",
    );
    let out = cluster.mgpu(&[
        "submit",
        "--json",
        "--priority",
        "7",
        "train.sh",
        "--epochs",
        "3",
    ]);
    let id = submitted_id(&out);
    let job = cluster.finished_as(&id, "succeeded", T);
    assert_eq!(job["name"], "bert", "{job}");
    let spec = &job["record"]["spec"];
    assert_eq!(spec["time_limit_secs"], 7200, "{job}");
    assert_eq!(spec["priority"], 7, "the command line wins: {job}");
    assert_eq!(
        spec["command"],
        serde_json::json!(["train.sh", "--epochs", "3"])
    );
    let path = spec["script"]["path"].as_str().unwrap_or_default();
    assert!(path.ends_with("/train.sh"), "{job}");
    let logs = cluster.mgpu_ok(&["logs", &id]);
    assert_eq!(logs, "args: --epochs 3\ngpus: 0\n");
    let shown = cluster.mgpu_ok(&["show", &id]);
    assert!(shown.contains(&format!("{path} (")), "{shown}");

    // Without a `#!` line the script runs under /bin/sh; `$0` is the node's private copy.
    let original = write_script(
        &cluster,
        "plain.sh",
        "# No #! line.\n#MGPU --name plain --gpus 0\necho \"$0\"\n",
    );
    let id = submitted_id(&cluster.mgpu(&["submit", "--json", "plain.sh"]));
    assert_eq!(cluster.finished_as(&id, "succeeded", T)["name"], "plain");
    let zero = cluster.mgpu_ok(&["logs", &id]);
    assert!(zero.ends_with("/plain.sh\n"), "{zero}");
    assert_ne!(zero.trim_end(), original.display().to_string());
    // The copy went with the job.
    let copy = Path::new(zero.trim_end());
    let dir = copy.parent().unwrap_or(copy);
    assert!(!dir.exists(), "{} outlived its job", dir.display());

    // Any interpreter the `#!` line names runs the script, here Python, with its directives.
    if which("python3").is_some() {
        write_script(
            &cluster,
            "eval.py",
            "#!/usr/bin/env python3\n#MGPU --name evaluate --gpus 0\nimport sys\nprint('python', sys.argv[1:])\n",
        );
        let id = submitted_id(&cluster.mgpu(&["submit", "--json", "./eval.py", "x"]));
        let job = cluster.finished_as(&id, "succeeded", T);
        assert_eq!(job["name"], "evaluate", "{job}");
        assert_eq!(cluster.mgpu_ok(&["logs", &id]), "python ['x']\n");
    }
}

/// A directive with a mistake stops the submission with the script's name, the line and
/// what is wrong, before anything is queued.
#[test]
fn a_bad_directive_is_reported_with_its_line() {
    let cluster = Cluster::start(&one_gpu_node());
    write_script(
        &cluster,
        "bad.sh",
        "#!/bin/sh\n#MGPU --gpus 1\n#MGPU --time-limit soon\necho never\n",
    );
    let out = cluster.mgpu(&["submit", "bad.sh"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = stderr_of(&out);
    assert!(
        err.contains("/bad.sh line 3 (#MGPU --time-limit soon): invalid value 'soon'"),
        "{err}"
    );
    assert!(cluster.all_jobs().is_empty());
}

/// Alice submits a script while the only GPU is busy, then edits the file: when the job
/// finally runs, it runs the script as she submitted it, as sbatch would.
#[test]
fn the_queued_job_runs_the_script_as_it_was_at_submit() {
    let cluster = Cluster::start(&one_gpu_node());
    let blocker = cluster.submit(&["--gpus", "1"], "sleep 30");
    cluster.wait_state(&blocker, "running", T);
    let path = write_script(&cluster, "job.sh", "#!/bin/sh\necho original\n");
    let id = submitted_id(&cluster.mgpu(&["submit", "--json", "job.sh"]));
    cluster.wait_reason(&id, "waiting for GPUs to become free", T);
    std::fs::write(&path, "#!/bin/sh\necho edited\n").unwrap_or_else(|e| panic!("{e}"));

    cluster.mgpu_ok(&["cancel", &blocker]);
    cluster.finished_as(&id, "succeeded", T);
    assert_eq!(cluster.mgpu_ok(&["logs", &id]), "original\n");
}

/// `mgpu wait` exits 0 when every job succeeded and with the first failure's exit code
/// otherwise; `--any` returns when the first job ends; an unknown id is exit status 2.
#[test]
fn wait_returns_how_the_jobs_ended() {
    let cluster = Cluster::start(&[NodeSpec::new("node001", "2x24GiB")]);
    let ok = cluster.submit(&["--gpus", "0"], "sleep 1");
    let fails = cluster.submit(&["--gpus", "0"], "sleep 2; exit 3");
    let slow = cluster.submit(&["--gpus", "0"], "sleep 30");

    let out = cluster.mgpu(&["wait", &ok, &fails]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr_of(&out));
    assert_eq!(
        cluster.state(&ok),
        "succeeded",
        "returned before the jobs ended"
    );
    assert_eq!(
        cluster.state(&fails),
        "failed",
        "returned before the jobs ended"
    );
    // Not on a terminal: nothing printed, the status says it all.
    assert_eq!(stdout_of(&out), "");
    assert_eq!(stderr_of(&out), "");

    // Already ended, found by a prefix: returns at once.
    let out = cluster.mgpu(&["wait", short(&ok)]);
    assert_eq!(out.status.code(), Some(0));

    // The first job to end decides with --any; the slow one keeps running.
    let started = Instant::now();
    let quick = cluster.submit(&["--gpus", "0"], "exit 5");
    let out = cluster.mgpu(&["wait", "--any", &slow, &quick]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr_of(&out));
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(cluster.state(&slow), "running");

    // A job cancelled while `wait` watches it, before it started, has no exit code: 1.
    let held = cluster.submit(&["--gpus", "0", "--after", &slow], "true");
    cluster.wait_reason(&held, "waiting for the jobs it depends on", T);
    let waiter = cluster
        .mgpu_command(&cluster.user_creds("alice"), &["wait", &held])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("mgpu wait: {e}"));
    std::thread::sleep(Duration::from_millis(500));
    cluster.mgpu_ok(&["cancel", &held]);
    let out = waiter
        .wait_with_output()
        .unwrap_or_else(|e| panic!("mgpu wait: {e}"));
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));

    let out = cluster.mgpu(&["wait", &ok, "0123456789abcdef0123456789abcdef"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        stderr_of(&out).contains("no job matches"),
        "{}",
        stderr_of(&out)
    );
    cluster.mgpu_ok(&["cancel", &slow]);
}

/// On a terminal, `mgpu wait` shows how many jobs run and wait, rewritten in place, and a
/// line for each job that ends.
#[test]
fn wait_on_a_terminal_shows_progress() {
    let cluster = Cluster::start(&one_gpu_node());
    let first = cluster.submit(&["--gpus", "1", "--name", "first"], "sleep 3");
    cluster.wait_state(&first, "running", T);
    let second = cluster.submit(&["--gpus", "1", "--name", "second"], "exit 4");
    // In a shell, which prints `EXIT=<status>` after it and keeps the screen.
    let terminal = cluster.mgpu_terminal_in_shell(&["wait", &first, &second], 100, 20);
    terminal.wait_for_text("waiting for 2 jobs: 1 running, 1 queued (", T);
    let screen = terminal.wait_for_text(
        &format!("job {} (second) failed: exit code 4", short(&second)),
        T,
    );
    assert!(
        screen.contains(&format!("job {} (first) succeeded", short(&first))),
        "{screen}"
    );
    let screen = terminal.wait_for_text("EXIT=", T);
    assert!(screen.contains("EXIT=4"), "{screen}");
    // The status line is gone: only the two lines about the jobs stay above the status.
    let before_exit = screen.split("EXIT=").next().unwrap_or_default();
    assert_eq!(before_exit.lines().count(), 2, "{screen}");
}

/// The bash completion script loads and registers `mgpu`, and completes the ids of live jobs
/// where a command takes one; zsh and fish scripts are made (and parse, where installed).
#[test]
fn completion_scripts_load_and_complete_live_job_ids() {
    let mgpu = bin_dir().join("mgpu");
    let loaded = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source <({} completions bash) && complete -p mgpu",
            shell_word(&mgpu)
        ))
        .output()
        .unwrap_or_else(|e| panic!("bash: {e}"));
    assert!(loaded.status.success(), "{loaded:?}");
    assert!(stdout_of(&loaded).contains("mgpu"), "{loaded:?}");

    let cluster = Cluster::start(&one_gpu_node());
    let id = cluster.submit(&["--gpus", "1"], "sleep 30");
    // What bash runs on Tab at the end of `mgpu WORDS…`.
    let complete_with = |server: &str, words: &[&str]| {
        let line = format!("{} {}", mgpu.display(), words.join(" "));
        let script = format!(
            "source <({mgpu} completions bash) || exit 9
COMP_LINE={line}; COMP_POINT=${{#COMP_LINE}}
read -ra COMP_WORDS <<< \"$COMP_LINE\"; [[ $COMP_LINE == *' ' ]] && COMP_WORDS+=('')
COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
_mgpu_with_job_ids \"${{COMP_WORDS[0]}}\" \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"
printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            mgpu = shell_word(&mgpu),
            line = shell_word(Path::new(&line)),
        );
        let out = Command::new("bash")
            .arg("-c")
            .arg(script)
            .env("MGPU_SERVER", server)
            .env("MGPU_CREDS", cluster.user_creds("alice"))
            .output()
            .unwrap_or_else(|e| panic!("bash: {e}"));
        assert!(out.status.success(), "{out:?}");
        stdout_of(&out)
    };
    let complete = |words: &[&str]| complete_with(&cluster.server_url(), words);
    assert_eq!(complete(&["logs", ""]), format!("{}\n", short(&id)));
    // With connection options typed before it, which bash would split at `:`.
    let server = format!("--server {}", cluster.server_url());
    assert_eq!(
        complete(&[&server, "wait", ""]),
        format!("{}\n", short(&id))
    );
    assert_eq!(complete(&["cancel", &id[..3]]), format!("{}\n", short(&id)));
    assert_eq!(
        complete(&["lo"]),
        "logs\n",
        "clap's completion is still there"
    );
    assert!(complete(&["logs", "--"]).contains("--follow"));
    cluster.mgpu_ok(&["cancel", &id]);

    // The hidden listing the scripts call: one line per job, with a description for zsh.
    let listing = cluster.mgpu_ok(&["completions", "zsh", "--job-ids"]);
    assert!(
        listing.starts_with(&format!("{}:sleep (", short(&id))),
        "{listing}"
    );

    for (shell, check) in [("zsh", "-n"), ("fish", "--no-execute")] {
        let out = Command::new(&mgpu)
            .args(["completions", shell])
            .output()
            .unwrap_or_else(|e| panic!("mgpu completions {shell}: {e}"));
        assert!(out.status.success(), "{out:?}");
        let script = stdout_of(&out);
        assert!(script.contains("_job_ids"), "{script}");
        if which(shell).is_some() {
            let file = cluster.dir.path().join(format!("completion.{shell}"));
            std::fs::write(&file, &script).unwrap_or_else(|e| panic!("{e}"));
            let parsed = Command::new(shell)
                .arg(check)
                .arg(&file)
                .output()
                .unwrap_or_else(|e| panic!("{shell}: {e}"));
            assert!(parsed.status.success(), "{shell} {check}: {parsed:?}");
        }
    }
}

/// `mgpu man --out DIR` writes a page for mgpu and one per subcommand, from the same text
/// as `--help`.
#[test]
fn man_pages_are_written_for_every_subcommand() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let out_dir = dir.path().join("man1");
    let out = Command::new(bin_dir().join("mgpu"))
        .arg("man")
        .arg("--out")
        .arg(&out_dir)
        .output()
        .unwrap_or_else(|e| panic!("mgpu man: {e}"));
    assert!(out.status.success(), "{out:?}");
    for (page, about) in [
        ("mgpu.1", "Submit, watch and manage GPU jobs"),
        ("mgpu-wait.1", "Wait until jobs end"),
        ("mgpu-completions.1", "Print a shell completion script"),
        ("mgpu-submit.1", "Submit a job"),
        ("mgpu-admin-init.1", ""),
    ] {
        let text =
            std::fs::read_to_string(out_dir.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.contains(".TH"), "{page} is no man page");
        assert!(text.contains(about), "{page}: {text}");
    }
    assert!(!out_dir.join("mgpu-completions-jobs.1").exists());
}

/// The id as listings show it.
fn short(id: &str) -> &str {
    &id[..mgpu_protocol::ids::JobId::SHORT_LEN]
}

/// A word bash reads back as exactly `path`.
fn shell_word(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

/// The program's path on PATH, if it is installed.
fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}
