//! Preemption's handshake, the job's side, told as stories. A job that asked for
//! `--signal USR1@2` and has a hard limit of 5 s is warned 2 s before its limit (SIGUSR1, and
//! `time_limit` in the file `$MGPU_STOP_FILE` names, which did not exist before), then stopped
//! at the limit with SIGTERM and ends `timed_out`; a first attempt sees
//! `MGPU_RESTART_COUNT=0`. A `scavenger` job preempted by a `normal` one is warned (SIGUSR1,
//! `preempted`), saves and ends within its class's grace without SIGTERM, runs again as
//! attempt 2 with `MGPU_RESTART_COUNT=1`, and `mgpu logs` shows attempt 1's output, the agent's
//! line saying why it stopped, then attempt 2's.
//!
//! The jobs write what they saw to files in the story's directory: when the warning came and
//! what the stop file said then, whether and when SIGTERM came.

use std::path::Path;
use std::time::Duration;

use mgpu_tests::{Cluster, NodeSpec, wait_for};

const T: Duration = Duration::from_secs(30);

/// A job script recording, in `dir`, its restart count, whether its stop file existed at its
/// start, and the times of its start, its warning (with the stop file's text) and its SIGTERM.
/// It sleeps in short steps so that bash runs its traps within a tenth of a second.
fn recording_job(dir: &Path) -> String {
    format!(
        r#"d='{d}'
echo "$MGPU_RESTART_COUNT" > "$d/restart"
if [ -e "$MGPU_STOP_FILE" ]; then echo yes > "$d/existed"; else echo no > "$d/existed"; fi
trap 'date +%s.%N > "$d/warned"; cat "$MGPU_STOP_FILE" > "$d/cause"' USR1
trap 'date +%s.%N > "$d/terminated"; exit 143' TERM
date +%s.%N > "$d/started"
while :; do sleep 0.1; done"#,
        d = dir.display()
    )
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_default()
}

fn time(dir: &Path, name: &str) -> f64 {
    let text = read(dir, name);
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {text:?}: {e}"))
}

#[test]
fn a_job_is_warned_its_seconds_before_its_time_limit_and_reads_why() {
    let cluster = Cluster::start(&[NodeSpec::new("node001", "1x24GiB")]);
    cluster.wait_nodes_online(1);
    let dir = cluster.dir.path().join("job");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let id = cluster.submit(
        &[
            "--signal",
            "USR1@2",
            "--time-limit",
            "5s",
            "--on-timeout",
            "fail",
        ],
        &recording_job(&dir),
    );

    // What was asked for shows, and travels in the record.
    let shown = cluster.mgpu_ok(&["show", &id]);
    assert!(
        shown.contains("USR1, 2 s before a stop (USR1@2)"),
        "{shown}"
    );
    let record = cluster.show(&id);
    assert_eq!(record["record"]["spec"]["signal"]["signal"], 10);
    assert_eq!(record["record"]["spec"]["signal"]["seconds"], 2);

    let job = cluster.wait_state(&id, "timed_out", T);
    assert_eq!(job["attempt"], 1, "{job}");
    wait_for("the job's SIGTERM trap", T, || {
        dir.join("terminated").exists().then_some(())
    });

    assert_eq!(
        read(&dir, "restart"),
        "0\n",
        "a first attempt is no restart"
    );
    assert_eq!(
        read(&dir, "existed"),
        "no\n",
        "no stop was announced at the start"
    );
    assert_eq!(read(&dir, "cause"), "time_limit\n");
    let started = time(&dir, "started");
    let warned = time(&dir, "warned");
    let terminated = time(&dir, "terminated");
    // The limit counts from the spawn, a moment before the job's first line: the warning
    // comes about 3 s after that line, SIGTERM about 2 s after the warning.
    let before_limit = terminated - warned;
    assert!(
        (1.5..=2.6).contains(&before_limit),
        "warned {before_limit:.2} s before SIGTERM"
    );
    let after_start = warned - started;
    assert!(
        (2.4..=3.6).contains(&after_start),
        "warned {after_start:.2} s after the start"
    );
}

/// Classes of the preemption story: scavenger jobs may be preempted, with 5 s of grace.
const CLASSES: &str = "[qos.scavenger]\npreemptible = true\nmay_preempt = false\ngrace = \"5s\"\n";

/// The README's training loop in shell: it counts steps until warned, then saves its step
/// to a checkpoint (and copies its stop file) and ends; an attempt with a restart count above
/// 0 resumes from the checkpoint, says from which step, and ends. SIGTERM would leave a
/// `terminated` mark.
fn preemptible_job(dir: &Path) -> String {
    format!(
        r#"d='{d}'
echo "output of attempt $MGPU_ATTEMPT"
echo "$MGPU_RESTART_COUNT" > "$d/restart.$MGPU_ATTEMPT"
step=0
if [ "$MGPU_RESTART_COUNT" -gt 0 ]; then step=$(cat "$d/ckpt"); echo "resumed from step $step"; exit 0; fi
trap 'cat "$MGPU_STOP_FILE" > "$d/cause"; echo "$step" > "$d/ckpt"; echo saved; exit 0' USR1
trap 'touch "$d/terminated"; exit 143' TERM
touch "$d/ready"
while :; do step=$((step + 1)); sleep 0.1; done"#,
        d = dir.display()
    )
}

#[test]
fn a_preempted_job_is_warned_saves_and_its_next_attempt_says_why_in_its_output() {
    let config = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let config_file = config.path().join("scheduler.toml");
    std::fs::write(&config_file, CLASSES).unwrap_or_else(|e| panic!("{e}"));
    let config_text = config_file.display().to_string();
    let cluster = Cluster::start_with(
        &[NodeSpec::new("node001", "1x24GiB")],
        &["--config", &config_text],
    );
    cluster.wait_nodes_online(1);
    let dir = cluster.dir.path().join("scavenger");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let scavenger = cluster.submit(&["--qos", "scavenger"], &preemptible_job(&dir));
    wait_for("the scavenger job to run", T, || {
        dir.join("ready").exists().then_some(())
    });
    let shown = cluster.mgpu_ok(&["show", &scavenger]);
    assert!(shown.contains("\nqos:"), "{shown}");
    // A class that does not exist is refused at submit, naming those that do.
    let unknown = cluster.submit(&["--qos", "express"], "true");
    let refused = cluster.wait_state(&unknown, "failed", T);
    let reason = refused["reason"].as_str().unwrap_or_default().to_owned();
    assert!(
        reason.contains("\"express\"") && reason.contains("normal, scavenger"),
        "{refused}"
    );

    let urgent = cluster.submit(&[], "sleep 1");
    cluster.wait_state(&urgent, "succeeded", T);
    let job = cluster.wait_state(&scavenger, "succeeded", T);
    assert_eq!(job["attempt"], 2, "{job}");

    assert_eq!(read(&dir, "cause"), "preempted\n");
    assert!(
        !dir.join("terminated").exists(),
        "the job ended within its grace; no SIGTERM was needed"
    );
    assert_eq!(read(&dir, "restart.1"), "0\n");
    assert_eq!(read(&dir, "restart.2"), "1\n");

    // Accounting keeps the preempted attempt, by whom, and that it left within its grace.
    let shown = cluster.mgpu_ok(&["show", &scavenger]);
    let preempted = format!("attempt 1 by {} (alice) after", &urgent[..10]);
    assert!(
        shown.contains(&preempted) && shown.contains("it left within its grace"),
        "{shown}"
    );

    let logs = cluster.mgpu_ok(&["logs", &scavenger]);
    let prefix = format!(
        "output of attempt 1\nsaved\n--- mgpu: attempt 2 starts; attempt 1 stopped: preempted by {}",
        &urgent[..10]
    );
    assert!(logs.starts_with(&prefix), "{logs}");
    let saved_at: u64 = read(&dir, "ckpt")
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("checkpoint: {e}"));
    assert!(saved_at > 0, "it ran some steps before the warning");
    let resumed = format!(" ---\noutput of attempt 2\nresumed from step {saved_at}\n");
    assert!(logs.ends_with(&resumed), "{logs}");
}
