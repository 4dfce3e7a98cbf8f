//! Guards started ahead of their jobs, so a contained job starts without waiting for its move
//! into a cgroup. That move waits for the kernel's read-copy-update grace period whenever no
//! other move happened in the last one (about 10 ms here, more on larger hosts: measured in
//! docs/performance.md), which would double a short job's start. So the agent keeps a few
//! `mgpu-job-guard --pooled AGENT_PID CGROUP` processes, each already in a cgroup of its own
//! made without limits, waiting on its standard input; a job that may use one takes it, gets
//! the cgroup with its limits written (`cgroup/pooled.rs`) and sends the guard its command
//! line, environment and directory (`mgpu_guard_rules::pooled`), and the pool makes another in
//! the background.
//!
//! Only what the guard would be started with can be sent: a job with a terminal or that reads
//! input, one pinned to cores (on v1 its cpuset cgroup is its own), one under the built-in
//! guard, or one whose command line and environment exceed the message's bounds starts the
//! usual way, as does any job while the pool is empty.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use mgpu_guard_rules::pooled::{FLAG, ITEMS_MAX, MESSAGE_MAX};
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};
use tracing::{debug, warn};

use crate::cgroup::{Containment, JobCgroup};
use crate::guard::GuardProgram;

/// Guards kept waiting when `--guard-pool` is not given.
pub const DEFAULT_SIZE: u16 = 4;

/// The pool of one agent.
pub struct GuardPool {
    program: PathBuf,
    containment: Containment,
    size: usize,
    state: Mutex<PoolState>,
}

#[derive(Default)]
struct PoolState {
    ready: VecDeque<PooledGuard>,
    /// Guards being made now.
    making: usize,
    /// Names pooled cgroups apart (with this agent's pid).
    made: u64,
    closed: bool,
}

/// A guard waiting in its cgroup for a job.
pub struct PooledGuard {
    pub child: Child,
    pub cgroup: JobCgroup,
}

impl GuardPool {
    /// The pool of `size` guards, filling in the background; None where it cannot serve:
    /// no containment, the built-in guard, or a size of 0. Pooled cgroups an earlier agent
    /// left are removed first, but those `taken` by its jobs.
    pub fn start(
        size: u16,
        program: &GuardProgram,
        containment: &Containment,
        taken: &[String],
    ) -> Option<Arc<GuardPool>> {
        // Also when this agent keeps none: an earlier one may have.
        containment.remove_idle_pooled(taken);
        let GuardProgram::Slim(program) = program else {
            return None;
        };
        if size == 0 || !containment.enabled() {
            return None;
        }
        let pool = Arc::new(GuardPool {
            program: program.clone(),
            containment: containment.clone(),
            size: usize::from(size),
            state: Mutex::new(PoolState::default()),
        });
        pool.refill();
        Some(pool)
    }

    /// A waiting guard, if one is there; another is made in the background.
    pub fn take(self: &Arc<Self>) -> Option<PooledGuard> {
        let taken = self.state.lock().ok()?.ready.pop_front();
        self.refill();
        taken
    }

    /// Makes guards until `size` are waiting or being made. Runs on the runtime's worker
    /// threads: a guard's parent-death signal follows the thread that started it, and
    /// those live as long as the agent.
    fn refill(self: &Arc<Self>) {
        let pool = Arc::clone(self);
        tokio::spawn(async move {
            while let Some(id) = pool.claim_one() {
                let made = pool.make(&id);
                match made {
                    Ok(guard) => {
                        if let Some(unwanted) = pool.keep(guard) {
                            discard(unwanted).await;
                        }
                    }
                    Err(err) => {
                        pool.made_none();
                        // Jobs still start the usual way; the next take tries again.
                        warn!("cannot start a guard for the pool: {err}");
                        return;
                    }
                }
            }
        });
    }

    /// Puts a guard just made with those waiting; hands it back once the pool is closed.
    fn keep(&self, guard: PooledGuard) -> Option<PooledGuard> {
        let Ok(mut state) = self.state.lock() else {
            return Some(guard);
        };
        state.making -= 1;
        if state.closed {
            return Some(guard);
        }
        state.ready.push_back(guard);
        None
    }

    /// A guard claimed could not be made.
    fn made_none(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.making -= 1;
        }
    }

    /// The id of one more guard to make, unless enough are waiting or being made.
    fn claim_one(&self) -> Option<String> {
        let mut state = self.state.lock().ok()?;
        if state.closed || state.ready.len() + state.making >= self.size {
            return None;
        }
        state.making += 1;
        state.made += 1;
        Some(format!("{}-{}", std::process::id(), state.made))
    }

    /// A cgroup without limits and a guard moving into it.
    fn make(&self, id: &str) -> Result<PooledGuard, String> {
        let cgroup = self
            .containment
            .make_pooled(id)?
            .ok_or("jobs are not contained here")?;
        let spawned = Command::new(&self.program)
            .arg(OsStr::from_bytes(FLAG))
            .arg(std::process::id().to_string())
            .arg(cgroup.guard_argument())
            .env_clear()
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        match spawned {
            Ok(child) => {
                debug!(cgroup = ?cgroup.name(), "a guard waits in the pool");
                Ok(PooledGuard { child, cgroup })
            }
            Err(err) => {
                // Nothing started, so nothing is in it.
                let removed = cgroup.remove_empty();
                Err(format!(
                    "cannot start {}: {err}{}",
                    self.program.display(),
                    removed.err().map(|e| format!(" ({e})")).unwrap_or_default()
                ))
            }
        }
    }

    /// Ends every waiting guard and removes its cgroup; nothing is made afterwards.
    pub async fn close(&self) {
        let waiting: Vec<PooledGuard> = match self.state.lock() {
            Ok(mut state) => {
                state.closed = true;
                state.ready.drain(..).collect()
            }
            Err(_) => return,
        };
        for guard in waiting {
            discard(guard).await;
        }
    }
}

impl PooledGuard {
    /// Sends the guard its start `message` and hands back its process. An error where the
    /// guard is gone (its process is then reaped).
    pub async fn start(mut self, message: &[u8]) -> Result<Child, (String, Child)> {
        let Some(mut input) = self.child.stdin.take() else {
            return Err(("the pooled guard has no input".to_owned(), self.child));
        };
        let sent = input.write_all(message).await;
        // The end of the input is the end of the message.
        drop(input);
        match sent {
            Ok(()) => Ok(self.child),
            Err(err) => Err((format!("the pooled guard is gone: {err}"), self.child)),
        }
    }
}

/// Ends a waiting guard (an empty message: it exits quietly) and removes its cgroup.
async fn discard(mut guard: PooledGuard) {
    drop(guard.child.stdin.take());
    let _ = guard.child.wait().await;
    if let Err(err) = guard.cgroup.kill_all().await {
        warn!("removing a pooled guard's cgroup: {err}");
    }
}

/// The start message of a guard command (`mgpu_guard_rules::pooled`); None when it exceeds
/// what a pooled guard takes.
pub fn start_message(command: &Command) -> Option<Vec<u8>> {
    let command = command.as_std();
    let workdir = command.get_current_dir()?;
    let args: Vec<&OsStr> = std::iter::once(command.get_program())
        .chain(command.get_args())
        .collect();
    let env: Vec<(&OsStr, &OsStr)> = command
        .get_envs()
        .filter_map(|(name, value)| Some((name, value?)))
        .collect();
    // No item holds a NUL: a job's spec with one is refused before it gets here.
    if args.len() + env.len() > ITEMS_MAX {
        return None;
    }
    let mut message = Vec::with_capacity(4096);
    let mut item = |bytes: &[u8]| {
        message.extend_from_slice(bytes);
        message.push(0);
    };
    item(workdir.as_os_str().as_bytes());
    item(args.len().to_string().as_bytes());
    for arg in &args {
        item(arg.as_bytes());
    }
    for (name, value) in env {
        item(&[name.as_bytes(), b"=", value.as_bytes()].concat());
    }
    (message.len() < MESSAGE_MAX).then_some(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgpu_guard_rules::pooled::parse;

    #[test]
    fn the_start_message_carries_the_command_line_environment_and_directory() {
        let mut command = Command::new("/opt/mgpu/mgpu-job-guard");
        command
            .args(["1", "", "sh", "-c", "echo $A"])
            .env_clear()
            .env("A", "x=y")
            .env("PWD", "/work")
            .current_dir("/work");
        let message = start_message(&command).unwrap_or_else(|| panic!("no message"));
        let start = parse(&message).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(start.workdir, b"/work");
        assert_eq!(start.argc, 6);
        let items: Vec<&[u8]> = start.items().collect();
        assert_eq!(
            items,
            [
                &b"/opt/mgpu/mgpu-job-guard"[..],
                b"1",
                b"",
                b"sh",
                b"-c",
                b"echo $A",
                b"A=x=y",
                b"PWD=/work"
            ]
            .to_vec()
        );
    }

    #[test]
    fn what_a_pooled_guard_could_not_take_is_started_the_usual_way() {
        let mut huge = Command::new("/guard");
        huge.env("BIG", "x".repeat(MESSAGE_MAX)).current_dir("/");
        assert!(start_message(&huge).is_none());
        let mut nowhere = Command::new("/guard");
        nowhere.arg("a");
        assert!(start_message(&nowhere).is_none(), "no directory set");
    }
}
