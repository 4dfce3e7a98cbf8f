//! A real terminal for stories that drive `mgpu` the way a person does: the command runs in a
//! tmux pane (a real pseudo-terminal with a VT100 screen behind it), keys are typed into it
//! with `send-keys`, and the screen is read back with `capture-pane`. Each terminal has its own
//! tmux server (its socket in the cluster's directory), killed on drop.
//!
//! The command runs under `sh`, which writes its exit status to a file and then keeps the
//! pane open, so a story can read the exit status and what the command left on the screen.
//! (tmux's own `#{pane_dead_status}` is not used: a command that exits within moments of its
//! start was at times left unreaped by tmux, and its pane never reported it dead.) [`Terminal::start_shell`] runs the command
//! inside `sh`, which then prints `stty -a` and whether the screen is the alternate one: the
//! proof that a full-screen program gave the terminal back.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::{Cluster, bin_dir};

/// One tmux server with one window running a command.
pub struct Terminal {
    socket: PathBuf,
    /// Where the shell writes the command's exit status once it has exited.
    status_file: PathBuf,
}

/// What a finished pane says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PaneExit {
    pub status: i32,
}

impl Cluster {
    /// Runs `mgpu ARGS` as alice in a terminal of `cols`×`rows`.
    pub fn mgpu_terminal(&self, args: &[&str], cols: u16, rows: u16) -> Terminal {
        self.mgpu_terminal_with(&self.user_creds("alice"), args, cols, rows)
    }

    /// Runs `mgpu ARGS` with the given credentials in a terminal of `cols`×`rows`.
    pub fn mgpu_terminal_with(
        &self,
        creds: &Path,
        args: &[&str],
        cols: u16,
        rows: u16,
    ) -> Terminal {
        let mut line = vec![shell_word(&bin_dir().join("mgpu").to_string_lossy())];
        line.extend(args.iter().map(|a| shell_word(a)));
        Terminal::start(self, creds, &line.join(" "), cols, rows)
    }

    /// Runs `mgpu ARGS` in a terminal, inside `sh`: after it exits the shell prints
    /// `EXIT=<status>`, the terminal's `stty -a` and `ALT=<0|1>` (1 while the program left the
    /// alternate screen on), so a story can check the terminal was restored.
    pub fn mgpu_terminal_in_shell(&self, args: &[&str], cols: u16, rows: u16) -> Terminal {
        let mut line = vec![shell_word(&bin_dir().join("mgpu").to_string_lossy())];
        line.extend(args.iter().map(|a| shell_word(a)));
        let script = format!("{}; echo EXIT=$?; stty -a; sleep 600", line.join(" "));
        Terminal::start(
            self,
            &self.user_creds("alice"),
            &format!("sh -c {}", shell_word(&script)),
            cols,
            rows,
        )
    }
}

impl Terminal {
    /// Starts a tmux server running `command_line` (a shell command) with the cluster's `mgpu`
    /// environment, in a window of `cols`×`rows`.
    fn start(
        cluster: &Cluster,
        creds: &Path,
        command_line: &str,
        cols: u16,
        rows: u16,
    ) -> Terminal {
        let name = uuid_like();
        let socket = cluster.dir.path().join(format!("tmux-{name}"));
        let status_file = cluster.dir.path().join(format!("tmux-{name}.status"));
        let mut env = vec![
            ("MGPU_SERVER".to_owned(), cluster.server_url()),
            (
                "MGPU_CREDS".to_owned(),
                creds.to_string_lossy().into_owned(),
            ),
            ("USER".to_owned(), "alice".to_owned()),
            ("TERM".to_owned(), "xterm-256color".to_owned()),
        ];
        // An `MGPU_CA` from the developer's shell must not leak in (tmux passes its own
        // environment on): it is set to the cluster's, or unset.
        let mut unset = String::from("unset MGPU_CA;");
        if let Some(ca) = cluster.ca() {
            env.push(("MGPU_CA".to_owned(), ca.to_string_lossy().into_owned()));
            unset.clear();
        }
        env.extend(cluster.cli_env.iter().cloned());
        let exports: Vec<String> = env
            .iter()
            .map(|(k, v)| format!("export {k}={};", shell_word(v)))
            .collect();
        let full = format!(
            "cd {}; {unset} {} {}; echo $? > {status}; exec sleep 86400",
            shell_word(&cluster.dir.path().to_string_lossy()),
            exports.join(" "),
            command_line,
            status = shell_word(&status_file.to_string_lossy()),
        );
        let terminal = Terminal {
            socket,
            status_file,
        };
        // `-f /dev/null`: no user configuration changes what the story sees.
        terminal.tmux_ok(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-x",
            &cols.to_string(),
            "-y",
            &rows.to_string(),
            "sh",
            "-c",
            &full,
        ]);
        terminal.tmux_ok(&["set-option", "-g", "remain-on-exit", "on"]);
        terminal.tmux_ok(&["set-option", "-g", "status", "off"]);
        terminal.tmux_ok(&[
            "resize-window",
            "-x",
            &cols.to_string(),
            "-y",
            &rows.to_string(),
        ]);
        terminal
    }

    fn tmux(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run tmux (scripts/setup.sh installs it): {e}"))
    }

    fn tmux_ok(&self, args: &[&str]) -> String {
        let out = self.tmux(args);
        assert!(
            out.status.success(),
            "tmux {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The visible screen, one line per row, trailing blanks trimmed.
    pub fn screen(&self) -> String {
        self.tmux_ok(&["capture-pane", "-p", "-t", "0"])
    }

    /// Waits until the screen holds `text`; returns the screen then.
    pub fn wait_for_text(&self, text: &str, timeout: Duration) -> String {
        self.wait_for_screen(&format!("the screen to show {text:?}"), timeout, |s| {
            s.contains(text)
        })
    }

    /// Waits until `ready` holds for the screen; returns the screen then. On a timeout the
    /// panic message carries the last screen.
    pub fn wait_for_screen(
        &self,
        what: &str,
        timeout: Duration,
        ready: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let screen = self.screen();
            if ready(&screen) {
                return screen;
            }
            if std::time::Instant::now() > deadline {
                panic!("timed out waiting for {what}; the screen:\n{screen}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Types text as it is (no key names).
    pub fn type_text(&self, text: &str) {
        self.tmux_ok(&["send-keys", "-t", "0", "-l", text]);
    }

    /// Presses keys by tmux name: `Enter`, `Down`, `C-c`, `C-]`, `q`, `Escape`.
    pub fn press(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "0"];
        args.extend_from_slice(keys);
        self.tmux_ok(&args);
    }

    /// Resizes the terminal; the program gets SIGWINCH as from any terminal.
    pub fn resize(&self, cols: u16, rows: u16) {
        self.tmux_ok(&[
            "resize-window",
            "-x",
            &cols.to_string(),
            "-y",
            &rows.to_string(),
        ]);
    }

    /// The command's exit status once it has exited, else None.
    pub fn exit(&self) -> Option<PaneExit> {
        let text = std::fs::read_to_string(&self.status_file).ok()?;
        // The shell may be halfway through writing it.
        let status = text.strip_suffix('\n')?.parse().ok()?;
        Some(PaneExit { status })
    }

    /// Waits for the command to exit; its status.
    pub fn wait_for_exit(&self, timeout: Duration) -> PaneExit {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(exit) = self.exit() {
                return exit;
            }
            if std::time::Instant::now() > deadline {
                panic!(
                    "timed out waiting for the terminal's command to exit; the screen:\n{}",
                    self.screen()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Every process running under the pane (the shell tmux started there, its children,
    /// theirs, …) as its pid and command line, for a story that signals one of them as
    /// `kill` would. Read from `/proc`; a process that exits meanwhile is left out.
    pub fn pane_processes(&self) -> Vec<(i32, Vec<String>)> {
        let root: i32 = self
            .tmux_ok(&["display-message", "-p", "-t", "0", "#{pane_pid}"])
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("tmux gave no pane pid: {e}"));
        // Each process's parent, from `/proc/<pid>/stat` (the field after the `(comm)`).
        let parents: Vec<(i32, i32)> = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
                let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
                let after = &stat[stat.rfind(')')? + 1..];
                let parent = after.split_whitespace().nth(1)?.parse().ok()?;
                Some((pid, parent))
            })
            .collect();
        let mut under = vec![root];
        let mut at = 0;
        while let Some(&parent) = under.get(at) {
            under.extend(
                parents
                    .iter()
                    .filter(|(_, p)| *p == parent)
                    .map(|(c, _)| *c),
            );
            at += 1;
        }
        under
            .into_iter()
            .filter_map(|pid| {
                let line = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                let args = line
                    .split(|b| *b == 0)
                    .filter(|arg| !arg.is_empty())
                    .map(|arg| String::from_utf8_lossy(arg).into_owned())
                    .collect();
                Some((pid, args))
            })
            .collect()
    }

    /// Whether the program has the alternate screen on (full-screen programs turn it on).
    pub fn alternate_screen(&self) -> bool {
        self.tmux_ok(&["display-message", "-p", "-t", "0", "#{alternate_on}"])
            .trim()
            == "1"
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.tmux(&["kill-server"]);
    }
}

/// A word the shell reads back as exactly `text`.
fn shell_word(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// A short name unique within this process run.
fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
