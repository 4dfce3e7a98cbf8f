//! The services run the way an installed site runs them: each from its configuration file
//! (`--config FILE`, what the systemd units' `ExecStart` lines say), for the stories that
//! install the Debian packages (`tests/packaging.rs`) and that run a site written by
//! `mgpu admin site` (`tests/site.rs`).
//!
//! [`Services`] owns the processes: each one's output goes to a log file, nothing of this
//! process's `MGPU_*` environment reaches it, and all are stopped on drop (SIGTERM, then
//! SIGKILL after 8 s), their logs printed when the story failed.
//!
//! A service binary that does not read whole configuration files yet (no `--print-config` in
//! its help: the config-file work has not landed) gets the file's keys as the flags they name
//! instead ([`config_args`]), so these stories run either way.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::wait_for;

/// Processes started by a story, stopped on drop.
pub struct Services {
    logs: PathBuf,
    children: Vec<(String, Child)>,
}

impl Services {
    /// No process yet; logs go to `logs/<name>.log`.
    pub fn new(logs: &Path) -> Services {
        std::fs::create_dir_all(logs).unwrap_or_else(|e| panic!("{}: {e}", logs.display()));
        Services {
            logs: logs.to_path_buf(),
            children: Vec::new(),
        }
    }

    /// Starts `command` as `name`, without this process's `MGPU_*` variables (a developer's
    /// `source .mgpu/env` must not reach it). Returns its pid.
    pub fn spawn(&mut self, name: &str, mut command: Command) -> u32 {
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("MGPU_") {
                command.env_remove(key);
            }
        }
        let log = self.log_path(name);
        let file = |log: &Path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .unwrap_or_else(|e| panic!("{}: {e}", log.display()))
        };
        let child = command
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(file(&log))
            .stderr(file(&log))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name} ({command:?}): {e}"));
        let pid = child.id();
        self.children.push((name.to_owned(), child));
        pid
    }

    pub fn log_path(&self, name: &str) -> PathBuf {
        self.logs.join(format!("{name}.log"))
    }

    /// What `name` has logged so far.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.log_path(name)).unwrap_or_default()
    }

    /// Panics, with its log, when `name` has exited.
    pub fn assert_running(&mut self, name: &str) {
        let exited = self
            .children
            .iter_mut()
            .find(|(n, _)| n == name)
            .map(|(_, child)| !matches!(child.try_wait(), Ok(None)));
        assert_eq!(
            exited,
            Some(false),
            "{name} is not running; its log:\n{}",
            self.log(name)
        );
    }
}

impl Drop for Services {
    fn drop(&mut self) {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        // Agents first (they stop their jobs), servers last: the reverse of the start order.
        for (_, child) in self.children.iter().rev() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(8);
        for (_, child) in self.children.iter_mut().rev() {
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            for (name, _) in &self.children {
                eprintln!(
                    "===== {name} =====\n{}",
                    std::fs::read_to_string(self.logs.join(format!("{name}.log")))
                        .unwrap_or_default()
                );
            }
        }
    }
}

/// Whether `program` reads whole configuration files: its help offers `--print-config`.
pub fn reads_config_files(program: &Path) -> bool {
    Command::new(program)
        .arg("--help")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).contains("--print-config"))
        .unwrap_or(false)
}

/// How `program` is given the configuration file `config`: `--config FILE` where it reads
/// one; else (before the config-file work) the flags its keys name, e.g. `server = "…"` as
/// `--server …`, `jobs_as_agent_user = true` as `--jobs-as-agent-user`. Only the simple
/// `key = value` lines mgpu writes are understood there: strings, numbers, booleans.
pub fn config_args(program: &Path, config: &Path) -> Vec<String> {
    if reads_config_files(program) {
        return vec!["--config".into(), config.display().to_string()];
    }
    let text =
        std::fs::read_to_string(config).unwrap_or_else(|e| panic!("{}: {e}", config.display()));
    let mut args = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            break;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if line.starts_with('#') {
            continue;
        }
        let flag = format!("--{}", key.trim().replace('_', "-"));
        match value.trim() {
            "true" => args.push(flag),
            "false" => {}
            quoted if quoted.starts_with('"') => {
                args.push(flag);
                args.push(quoted.trim_matches('"').to_owned());
            }
            other => {
                args.push(flag);
                args.push(other.to_owned());
            }
        }
    }
    args
}

/// Waits until `nodes` nodes are online, asking `mgpu nodes --json` as `mgpu` (a command with
/// the server and credentials set) builds it.
pub fn wait_online(nodes: usize, mgpu: impl Fn() -> Command) {
    wait_for(
        &format!("{nodes} node(s) online"),
        Duration::from_secs(60),
        || {
            let out = mgpu().args(["nodes", "--json"]).output().ok()?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let online = text.matches("\"online\"").count();
            (online >= nodes).then_some(())
        },
    );
}
