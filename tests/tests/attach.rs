//! Stories of jobs on a terminal (`mgpu submit --pty`) and of joining them from anywhere
//! (`mgpu attach`, `mgpu submit -i --pty`), driven through real terminals (tmux panes, see
//! `tests/src/terminal.rs`) against a real cluster: what the job sees, what the viewer sees,
//! what its keys do, detaching, and the exit status.

use std::time::Duration;

use mgpu_tests::{Cluster, NodeSpec, Terminal};

const WAIT: Duration = Duration::from_secs(30);

/// A job that says whether it has a terminal and its size, echoes lines, answers `size`,
/// survives Ctrl+C (which it reports), and ends with 7 on `quit`.
const ECHO_JOB: &str = r#"bash --norc --noprofile -c '
test -t 0 && test -t 1 && echo "TTY-YES"
echo "EARLIER-OUTPUT"
trap "echo GOT-INT" INT
while true; do
  if read -r line; then
    case "$line" in
      size) stty size ;;
      quit) exit 7 ;;
      *) echo "got:$line" ;;
    esac
  fi
done'"#;

fn cluster() -> Cluster {
    let cluster = Cluster::start(&[NodeSpec::new("node001", "2x24GiB")]);
    cluster.wait_nodes_online(1);
    cluster
}

/// Attaches alice to `id` in a new terminal and waits until the screen so far is there.
fn attach(cluster: &Cluster, id: &str, cols: u16, rows: u16) -> Terminal {
    let terminal = cluster.mgpu_terminal(&["attach", id], cols, rows);
    terminal.wait_for_text("EARLIER-OUTPUT", WAIT);
    terminal
}

/// Waits for the job's output (in `mgpu logs`) to contain `text`.
fn wait_for_output(cluster: &Cluster, id: &str, text: &str) -> String {
    mgpu_tests::wait_for(&format!("job {id} to print {text:?}"), WAIT, || {
        let logs = String::from_utf8_lossy(&cluster.mgpu(&["logs", id]).stdout).into_owned();
        logs.contains(text).then_some(logs)
    })
}

/// A job submitted with `--pty` from a script (no terminal of its own) runs on a terminal of
/// the classic 80x24; its output, raw terminal bytes, is in `mgpu logs` as usual.
#[test]
fn a_pty_job_sees_a_terminal_of_the_default_size() {
    let cluster = cluster();
    let id = cluster.submit(
        &["--pty"],
        "test -t 0 && test -t 1 && test -t 2 && echo TTY-YES; stty size; tty",
    );
    cluster.finished_as(&id, "succeeded", WAIT);
    let logs = wait_for_output(&cluster, &id, "TTY-YES");
    assert!(logs.contains("24 80"), "{logs}");
    assert!(logs.contains("/dev/pts/"), "{logs}");
    // Without --pty the same job has no terminal.
    let plain = cluster.submit(&[], "test -t 1 && echo TTY-YES || echo NO-TTY");
    cluster.finished_as(&plain, "succeeded", WAIT);
    wait_for_output(&cluster, &plain, "NO-TTY");
}

/// `mgpu submit -i --pty` from a terminal: the job's terminal has this terminal's size, keys
/// go to it, and `submit` exits with the job's exit status.
#[test]
fn submit_interactive_with_a_pty_attaches_at_once() {
    let cluster = cluster();
    let terminal = cluster.mgpu_terminal(&["submit", "-i", "--pty", "--", ECHO_JOB], 100, 30);
    terminal.wait_for_text("EARLIER-OUTPUT", WAIT);
    let screen = terminal.screen();
    assert!(screen.contains("TTY-YES"), "{screen}");
    terminal.type_text("size\r");
    terminal.wait_for_text("30 100", WAIT);
    terminal.type_text("hello\r");
    terminal.wait_for_text("got:hello", WAIT);
    terminal.type_text("quit\r");
    assert_eq!(terminal.wait_for_exit(WAIT).status, 7);
}

/// Attaching to a running terminal job shows its screen so far, passes typed lines and
/// Ctrl+C to it (the job, not the viewer, handles Ctrl+C, and keeps running), follows the
/// window's size, and `Ctrl+]` detaches with status 0, leaving the job running. A second
/// attach takes over, and when the job ends the viewer exits with its exit status.
#[test]
fn attach_shows_the_screen_so_far_types_resizes_detaches_and_ends_with_the_job() {
    let cluster = cluster();
    let id = cluster.submit(&["--pty"], ECHO_JOB);
    cluster.wait_state(&id, "running", WAIT);
    wait_for_output(&cluster, &id, "EARLIER-OUTPUT");

    let first = attach(&cluster, &id, 120, 40);
    first.type_text("hello\r");
    first.wait_for_text("got:hello", WAIT);
    first.press(&["C-c"]);
    first.wait_for_text("GOT-INT", WAIT);
    // The window's size: the one attached with, then the new one after a resize.
    first.type_text("size\r");
    first.wait_for_text("40 120", WAIT);
    first.resize(90, 25);
    // The resize reaches the node asynchronously: ask until the new size is seen.
    mgpu_tests::wait_for("the job's terminal to follow the resize", WAIT, || {
        first.type_text("size\r");
        std::thread::sleep(Duration::from_millis(300));
        first.screen().contains("25 90").then_some(())
    });

    first.press(&["C-]"]);
    assert_eq!(first.wait_for_exit(WAIT).status, 0);
    let screen = first.screen();
    assert!(screen.contains("Detached from job"), "{screen}");
    assert_eq!(
        cluster.state(&id),
        "running",
        "detaching leaves the job running"
    );

    let second = attach(&cluster, &id, 100, 30);
    // The screen so far includes what was typed in the first session.
    let screen = second.wait_for_text("got:hello", WAIT);
    assert!(screen.contains("GOT-INT"), "{screen}");
    second.type_text("quit\r");
    assert_eq!(second.wait_for_exit(WAIT).status, 7);
    let job = cluster.finished_as(&id, "failed", WAIT);
    assert_eq!(job["exit_code"], 7, "{job}");
}

/// Two viewers of one job: the one that attached last types; the first one's keys are
/// dropped by the node, while both see the job's screen. A `--read-only` viewer watches
/// without taking the keyboard.
#[test]
fn several_viewers_watch_and_the_last_to_attach_types() {
    let cluster = cluster();
    let id = cluster.submit(&["--pty"], ECHO_JOB);
    cluster.wait_state(&id, "running", WAIT);
    wait_for_output(&cluster, &id, "EARLIER-OUTPUT");

    let first = attach(&cluster, &id, 100, 30);
    first.type_text("one\r");
    first.wait_for_text("got:one", WAIT);
    let second = attach(&cluster, &id, 100, 30);
    second.wait_for_text("got:one", WAIT);
    // A read-only viewer does not take the keyboard from the second.
    let watcher = cluster.mgpu_terminal(&["attach", "--read-only", &id], 100, 30);
    watcher.wait_for_text("got:one", WAIT);

    second.type_text("two\r");
    first.wait_for_text("got:two", WAIT);
    watcher.wait_for_text("got:two", WAIT);
    // The first viewer no longer has the keyboard, nor does the read-only one.
    first.type_text("dropped\r");
    watcher.type_text("ignored\r");
    second.type_text("three\r");
    let screen = second.wait_for_text("got:three", WAIT);
    assert!(!screen.contains("dropped"), "{screen}");
    assert!(!screen.contains("ignored"), "{screen}");
    let logs = wait_for_output(&cluster, &id, "got:three");
    assert!(
        !logs.contains("dropped") && !logs.contains("ignored"),
        "{logs}"
    );

    watcher.press(&["C-]"]);
    assert_eq!(watcher.wait_for_exit(WAIT).status, 0);
    second.type_text("quit\r");
    assert_eq!(second.wait_for_exit(WAIT).status, 7);
    assert_eq!(first.wait_for_exit(WAIT).status, 7);
}

/// Attaching to a job that has ended says how it ended and exits with its status; another
/// user's keys never reach a job (the node drops them), though they may watch it.
#[test]
fn attach_to_an_ended_job_or_as_another_user() {
    let cluster = cluster();
    let ended = cluster.submit(&["--pty"], "exit 4");
    cluster.finished_as(&ended, "failed", WAIT);
    let out = cluster.mgpu(&["attach", &ended]);
    assert_eq!(out.status.code(), Some(4));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("has ended") && err.contains("mgpu logs"),
        "{err}"
    );

    let id = cluster.submit(&["--pty"], ECHO_JOB);
    cluster.wait_state(&id, "running", WAIT);
    wait_for_output(&cluster, &id, "EARLIER-OUTPUT");
    let bob = cluster.user_creds("bob");
    let intruder = cluster.mgpu_terminal_with(&bob, &["attach", &id], 100, 30);
    let screen = intruder.wait_for_text("EARLIER-OUTPUT", WAIT);
    assert!(screen.contains("only if you are an admin"), "{screen}");
    intruder.type_text("evil\r");
    // Alice's own keys, sent after bob's, arrive; bob's never do.
    let alice = attach(&cluster, &id, 100, 30);
    alice.type_text("mine\r");
    let logs = wait_for_output(&cluster, &id, "got:mine");
    assert!(!logs.contains("evil"), "{logs}");
    alice.type_text("quit\r");
    assert_eq!(alice.wait_for_exit(WAIT).status, 7);
}
