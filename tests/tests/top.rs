//! `mgpu top` told as stories: the real binary in a real pseudo-terminal (tmux) against a real
//! cluster. One frame for scripts (`--once`, also with the scheduler down); the live screen
//! moved through, filtered and used to cancel a job with keys (a user her own only, an admin
//! anyone's); a job's live output; and the terminal given back after `q`, after Ctrl+C,
//! across resizes, and when it is killed with SIGTERM or SIGHUP.
//!
//! The live screens run inside a shell (`mgpu_terminal_in_shell`), which prints the exit
//! status and `stty -a` afterwards: the proof that the terminal was given back.

use std::time::Duration;

use mgpu_tests::{Cluster, NodeSpec, Terminal, bin_dir, gpus_of, process_running, wait_for};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const T: Duration = Duration::from_secs(30);

/// The short id listings show.
fn short(id: &str) -> &str {
    &id[..10.min(id.len())]
}

/// The nodes pane's GPU lines (each shows its memory, `used/24.0` GiB).
fn gpu_lines(screen: &str) -> Vec<&str> {
    screen
        .lines()
        .filter(|line| line.contains("/24.0"))
        .collect()
}

/// After the shell's `stty -a`: raw mode is off (canonical input and echo are back).
fn assert_terminal_restored(terminal: &Terminal) -> String {
    // `stty -a` lists `icanon` or `-icanon`: its output is complete once that is there.
    let screen = terminal.wait_for_screen("the shell's EXIT= and stty -a", T, |s| {
        s.contains("EXIT=") && s.contains("icanon") && s.contains("echo")
    });
    assert!(screen.contains("EXIT=0"), "{screen}");
    let words: Vec<&str> = screen
        .split(|c: char| c.is_whitespace() || c == ';')
        .collect();
    assert!(
        words.contains(&"icanon"),
        "canonical mode is off:\n{screen}"
    );
    assert!(words.contains(&"echo"), "echo is off:\n{screen}");
    assert!(
        !terminal.alternate_screen(),
        "still on the alternate screen"
    );
    screen
}

/// Alice checks the cluster from a script: one frame shows node001, both its GPUs, and her
/// running job (its id, and that it is hers) on the GPU it holds — and the same once the scheduler is gone,
/// since everything is read from JetStream.
#[test]
fn top_once_shows_the_nodes_their_gpus_and_who_runs_what() {
    let mut cluster = Cluster::start(&[NodeSpec::new("node001", "2x24GiB")]);
    cluster.wait_nodes_online(1);
    let id = cluster.submit(&["--gpus", "1"], "sleep 300");
    let job = cluster.wait_state(&id, "running", T);
    let gpu = gpus_of(&job)[0];

    let check = |screen: &str| {
        assert!(screen.contains("node001"), "{screen}");
        assert!(screen.contains("1 free, 1 used, 0 paused"), "{screen}");
        let held = screen
            .lines()
            .find(|line| line.contains(short(&id)) && line.contains("24.0"))
            .unwrap_or_else(|| panic!("no GPU line shows job {id}:\n{screen}"));
        assert!(held.contains("alice"), "{screen}");
        let words: Vec<&str> = held.split_whitespace().collect();
        assert!(words.contains(&gpu.to_string().as_str()), "{held}");
        assert_eq!(gpu_lines(screen).len(), 2, "{screen}");
        // The queue lists it as running on that GPU, marked as Alice's own.
        let queued = screen
            .lines()
            .find(|line| line.contains(short(&id)) && line.contains("running"))
            .unwrap_or_else(|| panic!("the queue does not list {id}:\n{screen}"));
        assert!(queued.contains(&format!("node001:{gpu}")), "{queued}");
        assert!(queued.contains('*'), "not marked as hers: {queued}");
    };

    // Printed to a pipe: a 120×40 frame, the whole cluster's counts on top.
    let printed = cluster.mgpu_ok(&["top", "--once"]);
    check(&printed);
    assert!(
        printed.starts_with("mgpu top · 1 node, 1 online · GPUs 1 free, 1 used, 0 paused"),
        "{printed}"
    );
    assert_eq!(printed.lines().count(), 40, "{printed}");

    // In a terminal, from a shell: a frame of `LINES` rows (the terminal's height less one
    // without it), no full screen, and the shell's lines below it.
    cluster.set_cli_env("LINES", "24");
    let terminal = cluster.mgpu_terminal_in_shell(&["top", "--once"], 120, 40);
    let screen = terminal.wait_for_text("EXIT=", T);
    assert!(screen.contains("EXIT=0"), "{screen}");
    assert!(screen.starts_with("mgpu top · 1 node"), "{screen}");
    assert!(
        screen
            .lines()
            .nth(24)
            .is_some_and(|l| l.starts_with("EXIT=0")),
        "{screen}"
    );
    check(&screen);
    assert!(!terminal.alternate_screen(), "--once draws no full screen");

    cluster.kill_scheduler();
    check(&cluster.mgpu_ok(&["top", "--once"]));
}

/// Alice watches the live screen, moves down to her waiting job (past her running one),
/// narrows the queue to her own jobs with `/`, cancels the job with `c` and a `y`, is told
/// that bob's job is not hers to cancel, and quits with `q`: her job is cancelled (her other
/// job still runs, bob's still waits) and her shell is as it was.
#[test]
fn live_top_moves_filters_and_cancels_with_keys_then_gives_the_terminal_back() {
    let cluster = Cluster::start(&[NodeSpec::new("node001", "1x24GiB")]);
    cluster.wait_nodes_online(1);
    let running = cluster.submit(&["--gpus", "1"], "sleep 300");
    cluster.wait_state(&running, "running", T);
    let waiting = cluster.submit(&["--gpus", "1"], "sleep 300");
    let bob = cluster.user_creds("bob");
    let bobs = cluster
        .mgpu_ok_with(&bob, &["submit", "-q", "--gpus", "1", "--", "sleep 300"])
        .trim()
        .to_owned();
    wait_for("bob's job to be recorded as his", T, || {
        (cluster.show(&bobs)["user"] == "bob").then_some(())
    });

    let terminal = cluster.mgpu_terminal_in_shell(&["top"], 120, 40);
    terminal.wait_for_screen("all three jobs", T, |s| {
        s.contains(short(&running)) && s.contains(short(&waiting)) && s.contains(short(&bobs))
    });
    assert!(terminal.alternate_screen());

    // Down (j, or the arrow) until the selection is on the waiting job.
    let selected = |screen: &str, id: &str| {
        screen
            .lines()
            .any(|line| line.starts_with('>') && line.contains(short(id)))
    };
    assert!(
        selected(&terminal.screen(), &running),
        "{}",
        terminal.screen()
    );
    for key in ["j", "Down", "j"] {
        if selected(&terminal.screen(), &waiting) {
            break;
        }
        terminal.press(&[key]);
        std::thread::sleep(Duration::from_millis(300));
    }
    terminal.wait_for_screen("the waiting job selected", T, |s| selected(s, &waiting));

    // Only Alice's jobs once filtered by user; the selection stays on its job.
    terminal.press(&["/"]);
    terminal.type_text("user:alice");
    terminal.press(&["Enter"]);
    let screen = terminal.wait_for_screen("bob's job filtered out", T, |s| {
        !s.contains(short(&bobs)) && s.contains("filter: user:alice")
    });
    assert!(selected(&screen, &waiting), "{screen}");
    assert!(screen.contains(short(&running)), "{screen}");

    // `c` asks first; `y` cancels.
    terminal.press(&["c"]);
    terminal.wait_for_text(&format!("Cancel job {}", short(&waiting)), T);
    terminal.press(&["y"]);
    cluster.wait_state(&waiting, "cancelled", T);
    terminal.wait_for_text(&format!("Cancelled job {}", short(&waiting)), T);
    // Gone from the queue: only the status line still names it.
    terminal.wait_for_screen("the cancelled job gone from the queue", T, |s| {
        !s.lines()
            .any(|l| l.contains(short(&waiting)) && !l.starts_with("Cancel"))
    });
    assert_eq!(cluster.state(&running), "running");
    assert_eq!(cluster.state(&bobs), "queued");

    // Bob's job, once the filter is cleared (esc): not hers to cancel, and top says so.
    terminal.press(&["Escape"]);
    terminal.wait_for_text(short(&bobs), T);
    for _ in 0..3 {
        if selected(&terminal.screen(), &bobs) {
            break;
        }
        terminal.press(&["j"]);
        std::thread::sleep(Duration::from_millis(300));
    }
    terminal.wait_for_screen("bob's job selected", T, |s| selected(s, &bobs));
    terminal.press(&["c"]);
    terminal.wait_for_text("bob's: only its owner or an admin may cancel it", T);
    assert_eq!(cluster.state(&bobs), "queued");

    terminal.press(&["q"]);
    assert_terminal_restored(&terminal);
}

/// Alice opens her job's output with `l` (what it printed before, then what it prints while
/// she watches) and closes it with esc; the terminal is resized under the live screen, which
/// redraws at the new size each time; Ctrl+C then quits, and the terminal is given back as
/// after `q`.
#[test]
fn live_top_shows_output_follows_resizes_and_ctrl_c_restores_the_terminal() {
    let cluster = Cluster::start(&[NodeSpec::new("node001", "2x24GiB")]);
    cluster.wait_nodes_online(1);
    let id = cluster.submit(
        &["--gpus", "1"],
        "echo before-top; sleep 3; echo while-watched; sleep 300",
    );
    cluster.wait_state(&id, "running", T);

    let terminal = cluster.mgpu_terminal_in_shell(&["top"], 100, 30);
    terminal.wait_for_text(short(&id), T);
    terminal.press(&["l"]);
    terminal.wait_for_text(&format!("Output of {}", short(&id)), T);
    terminal.wait_for_text("before-top", T);
    terminal.wait_for_text("while-watched", T);
    terminal.press(&["Escape"]);
    terminal.wait_for_screen("the queue back", T, |s| !s.contains("Output of"));

    // The queue's title rule runs to the right edge: its length is the screen's width.
    let width_is = |width: usize| {
        move |screen: &str| {
            screen
                .lines()
                .any(|l| l.contains("Queue ·") && l.chars().count() == width)
        }
    };
    terminal.wait_for_screen("a 100-column frame", T, width_is(100));
    terminal.resize(150, 45);
    let wide = terminal.wait_for_screen("a 150-column frame", T, width_is(150));
    assert!(
        wide.contains("node001") && wide.contains(short(&id)),
        "{wide}"
    );
    terminal.resize(70, 20);
    let narrow = terminal.wait_for_screen("a 70-column frame", T, width_is(70));
    assert!(narrow.contains(short(&id)), "{narrow}");

    terminal.press(&["C-c"]);
    assert_terminal_restored(&terminal);
    assert_eq!(cluster.state(&id), "running", "quitting top touches no job");
}

/// The pid of the `mgpu top` running in the terminal (under its shell).
fn top_pid(terminal: &Terminal) -> i32 {
    let mgpu = bin_dir().join("mgpu").to_string_lossy().into_owned();
    wait_for("mgpu top's process under the pane", T, || {
        let tops: Vec<i32> = terminal
            .pane_processes()
            .into_iter()
            .filter(|(_, args)| {
                args.first() == Some(&mgpu) && args.get(1..) == Some(&["top".to_owned()][..])
            })
            .map(|(pid, _)| pid)
            .collect();
        match tops[..] {
            [pid] => Some(pid),
            _ => None,
        }
    })
}

/// Alice's live `mgpu top` is killed from outside: with SIGTERM (a `kill`, a shutdown), and in
/// a second terminal with SIGHUP (the window closed under it, a lost SSH session). Each time
/// it leaves the alternate screen and raw mode before it exits: her shell echoes and reads
/// lines again. Her job runs on.
#[test]
fn live_top_gives_the_terminal_back_when_killed_by_sigterm_or_sighup() {
    let cluster = Cluster::start(&[NodeSpec::new("node001", "1x24GiB")]);
    cluster.wait_nodes_online(1);
    let id = cluster.submit(&["--gpus", "1"], "sleep 300");
    cluster.wait_state(&id, "running", T);

    for signal in [Signal::SIGTERM, Signal::SIGHUP] {
        let terminal = cluster.mgpu_terminal_in_shell(&["top"], 120, 40);
        terminal.wait_for_text(short(&id), T);
        assert!(terminal.alternate_screen(), "{signal}: not full screen");
        let pid = top_pid(&terminal);
        kill(Pid::from_raw(pid), signal).unwrap_or_else(|e| panic!("kill -{signal} {pid}: {e}"));
        let screen = assert_terminal_restored(&terminal);
        assert!(
            !process_running(pid),
            "{signal}: mgpu top still runs\n{screen}"
        );
        // The shell's own lines come after the full screen is gone: none of it is left.
        assert!(
            !screen.contains("Queue ·"),
            "{signal}: the frame is left:\n{screen}"
        );
    }
    assert_eq!(cluster.state(&id), "running", "killing top touches no job");
}

/// An admin's `mgpu top` cancels anyone's job: bob's, after the confirmation.
#[test]
fn an_admin_cancels_anyones_job_from_top() {
    let mut cluster = Cluster::start(&[NodeSpec::new("node001", "1x24GiB")]);
    cluster.wait_nodes_online(1);
    let bob = cluster.user_creds("bob");
    let bobs = cluster
        .mgpu_ok_with(&bob, &["submit", "-q", "--gpus", "1", "--", "sleep 300"])
        .trim()
        .to_owned();
    cluster.wait_state(&bobs, "running", T);

    // The terminal's `mgpu` runs with the admin's credentials (the later export wins).
    let admin = cluster.admin_creds();
    cluster.set_cli_env("MGPU_CREDS", &admin.to_string_lossy());
    let terminal = cluster.mgpu_terminal_in_shell(&["top"], 120, 40);
    let screen = terminal.wait_for_text(short(&bobs), T);
    // Selected, and not marked as the admin's own.
    assert!(
        screen
            .lines()
            .any(|l| l.starts_with("> ") && l.contains(short(&bobs))),
        "{screen}"
    );
    terminal.press(&["c"]);
    terminal.wait_for_text(&format!("Cancel job {}", short(&bobs)), T);
    terminal.press(&["y"]);
    cluster.wait_state(&bobs, "cancelled", T);
    terminal.press(&["q"]);
    assert_terminal_restored(&terminal);
}
