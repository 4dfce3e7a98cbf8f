//! The job guard: the first process of every job, so a job never outlives its agent.
//!
//! The agent starts each job as
//! `mgpu-job-guard AGENT_PID GRACE_MS FENCE_MS CONTACT_FILE ACCOUNT PROGRAM [ARGS...]` (a
//! small static binary installed beside the agent, `services/job-guard`), or where that is
//! missing (or `--job-guard builtin`) as `mgpu-node __mgpu-job-guard AGENT_PID ...`, this
//! module; both behave the same. PROGRAM is the shell with `-c SCRIPT`, or a simple command
//! itself (see `launch.rs`). ACCOUNT is `UID:GID:GROUPS` for `mgpu-job-guard` to switch
//! to once it has opened CONTACT_FILE, or `-`: this module never switches (started as root, a
//! dynamically linked program would load libraries under the job's `LD_LIBRARY_PATH`), so for
//! it the agent switches the child before the exec, and passes CONTACT_FILE as an inherited
//! descriptor, `/proc/self/fd/N` ([`inheritable_contact`]). The guard asks the kernel for
//! SIGTERM when the agent dies (`PR_SET_PDEATHSIG`), runs PROGRAM as its child in the same
//! group, and waits. If the agent dies (SIGKILL, crash) — or anyone sends the guard SIGTERM,
//! SIGINT or SIGHUP — it stops the whole group: SIGTERM, the grace period, SIGKILL. Without it, a job whose agent was killed
//! would keep running while the scheduler already runs its next attempt elsewhere.
//!
//! The guard also fences the job when the agent is alive but cut off or frozen (SIGSTOP, a
//! stalled host): the agent touches CONTACT_FILE whenever JetStream stored a heartbeat, and
//! when that is older than FENCE_MS (0: never) the guard stops the group the same way, since
//! the scheduler may by then run the job elsewhere.
//!
//! Otherwise the guard is invisible: the job inherits its standard streams, environment,
//! directory and group, and the guard ends the way the job ended (same exit code, or the
//! same signal). A PROGRAM without `/` is looked up on the job's `PATH`; one that cannot be
//! found ends the job with 127 and one that cannot be run with 126, as in a shell.
//!
//! PR_SET_PDEATHSIG fires when the *thread* that forked the guard ends; the agent spawns jobs
//! from its async runtime's worker threads, which live as long as the agent.

use std::os::fd::{AsFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, FdFlag};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, Signal, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpgrp, getppid};

/// argv[1] that turns `mgpu-node` into a job guard.
pub const GUARD_ARG: &str = "__mgpu-job-guard";

/// The stop signal received, 0 while none.
static STOP: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(signal: nix::libc::c_int) {
    STOP.store(signal, Ordering::SeqCst);
}

/// How a guard fences its job: stop it once `contact_file` is older than `after`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardFence {
    pub after: Duration,
    pub contact_file: std::path::PathBuf,
}

/// Opens `contact` for reading as a descriptor that every guard inherits (no close-on-exec),
/// held for the agent's whole life: the built-in guard runs as the job's account, which
/// usually cannot enter a root agent's state directory, but reads the file through
/// `/proc/self/fd/N` whatever the directory's permissions. The guard keeps it from the job.
pub fn inheritable_contact(contact: &Path) -> std::io::Result<PathBuf> {
    let fd = OwnedFd::from(std::fs::File::open(contact)?);
    nix::fcntl::fcntl(&fd, FcntlArg::F_SETFD(FdFlag::empty()))?;
    // Never closed: it serves every job this agent starts.
    Ok(PathBuf::from(format!("/proc/self/fd/{}", fd.into_raw_fd())))
}

/// The name of the standalone guard, looked for beside the agent's binary.
pub const SLIM_GUARD_NAME: &str = "mgpu-job-guard";

/// The program every job starts under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GuardProgram {
    /// `mgpu-job-guard`: no C library, so it starts in microseconds.
    Slim(PathBuf),
    /// This agent's own binary in guard mode.
    Builtin(PathBuf),
}

impl GuardProgram {
    /// The guard `--job-guard` names: `builtin`, a path, or (None) `mgpu-job-guard` beside
    /// `agent_exe` when it is there, else the built-in one.
    pub fn choose(setting: Option<&str>, agent_exe: &Path) -> Result<Self, String> {
        match setting {
            Some("builtin") => Ok(GuardProgram::Builtin(agent_exe.to_owned())),
            Some(path) => {
                // Absolute: the guard is started in the job's directory.
                match std::fs::canonicalize(path) {
                    Ok(path) if path.is_file() => Ok(GuardProgram::Slim(path)),
                    _ => Err(format!(
                        "--job-guard {path}: no such file (give the path of {SLIM_GUARD_NAME}, \
                         or `builtin`)"
                    )),
                }
            }
            None => {
                let beside = agent_exe.with_file_name(SLIM_GUARD_NAME);
                Ok(if beside.is_file() {
                    GuardProgram::Slim(beside)
                } else {
                    GuardProgram::Builtin(agent_exe.to_owned())
                })
            }
        }
    }

    /// Whether the guard switches to the job's account itself ([`guard_args`]' ACCOUNT).
    pub fn switches_accounts(&self) -> bool {
        matches!(self, GuardProgram::Slim(_))
    }

    /// The binary to run and the arguments that come before [`guard_args`].
    pub fn program(&self) -> (&Path, &'static [&'static str]) {
        match self {
            GuardProgram::Slim(path) => (path, &[]),
            GuardProgram::Builtin(path) => (path, &[GUARD_ARG]),
        }
    }

    /// For the agent's log.
    pub fn describe(&self) -> String {
        match self {
            GuardProgram::Slim(path) => path.display().to_string(),
            GuardProgram::Builtin(path) => format!("{} {GUARD_ARG} (built in)", path.display()),
        }
    }
}

/// The arguments (after [`GuardProgram::program`]'s) that make the guard run `program` for
/// the agent with pid `agent`, as `account` (`UID:GID:GROUPS`; None: as the guard was
/// started); the program's own arguments follow.
pub fn guard_args(
    agent: u32,
    grace: Duration,
    fence: Option<&GuardFence>,
    account: Option<String>,
    program: &str,
) -> Vec<String> {
    let (fence_ms, contact) = match fence {
        Some(f) => (
            f.after.as_millis().max(1).to_string(),
            f.contact_file.display().to_string(),
        ),
        None => ("0".to_owned(), "-".to_owned()),
    };
    vec![
        agent.to_string(),
        grace.as_millis().to_string(),
        fence_ms,
        contact,
        account.unwrap_or_else(|| "-".to_owned()),
        program.to_owned(),
    ]
}

/// How long ago `file` was last touched; None when it cannot be read (the guard then keeps
/// the job: fencing on a missing file would turn an operator's mistake into lost work).
fn age_of(file: &std::path::Path) -> Option<Duration> {
    let modified = std::fs::metadata(file).ok()?.modified().ok()?;
    Some(
        std::time::SystemTime::now()
            .duration_since(modified)
            .unwrap_or(Duration::ZERO),
    )
}

/// Runs as a job guard when argv says so; None otherwise (a normal agent start).
pub fn run_if_guard() -> Option<ExitCode> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) != Some(GUARD_ARG) {
        return None;
    }
    Some(match guard(&args[2..]) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("mgpu job guard: {err}");
            ExitCode::from(127)
        }
    })
}

fn guard(args: &[String]) -> Result<ExitCode, String> {
    let [
        agent,
        grace_ms,
        fence_ms,
        contact,
        account,
        program,
        rest @ ..,
    ] = args
    else {
        return Err(
            "usage: __mgpu-job-guard AGENT_PID GRACE_MS FENCE_MS CONTACT_FILE - PROGRAM [ARGS...]"
                .into(),
        );
    };
    if account != "-" {
        return Err("the built-in guard does not switch accounts (the agent does)".into());
    }
    // A contact file handed down as a descriptor (`inheritable_contact`) is the guard's alone.
    if let Some(fd) = contact
        .strip_prefix("/proc/self/fd/")
        .and_then(|n| n.parse::<RawFd>().ok())
    {
        // SAFETY: inherited from the agent for this guard, and open for its whole life.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let _ = nix::fcntl::fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
    }
    let fence_after = match fence_ms
        .parse::<u64>()
        .map_err(|_| format!("bad fence {fence_ms}"))?
    {
        0 => None,
        ms => Some(Duration::from_millis(ms)),
    };
    let contact = std::path::Path::new(contact);
    // Checked this often while fencing; the agent's heartbeat margin covers the delay.
    let check_every =
        fence_after.map(|f| (f / 8).clamp(Duration::from_millis(20), Duration::from_millis(100)));
    let agent: i32 = agent
        .parse()
        .map_err(|_| format!("bad agent pid {agent}"))?;
    let grace = Duration::from_millis(
        grace_ms
            .parse()
            .map_err(|_| format!("bad grace {grace_ms}"))?,
    );

    let action = SigAction::new(
        SigHandler::Handler(on_stop_signal),
        // No SA_RESTART: a stop signal must interrupt the wait below.
        SaFlags::empty(),
        SigSet::empty(),
    );
    for stop in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { signal::sigaction(stop, &action) }.map_err(|e| format!("sigaction: {e}"))?;
    }
    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(|e| format!("prctl: {e}"))?;
    // The agent may have died before the line above took effect: then nothing must start.
    if getppid() != Pid::from_raw(agent) {
        return Err("the agent is gone; not starting the job".into());
    }

    // Handlers do not survive exec: the job starts with default dispositions.
    let child = match start_program(program, rest) {
        Ok(child) => child,
        Err((code, message)) => {
            eprintln!("mgpu: {program}: {message}");
            return Ok(ExitCode::from(code));
        }
    };
    let child = Pid::from_raw(child.id() as i32);
    // Not reaped yet, so the pid is still this child's.
    let exit_signal = pidfd_of(child);

    let mut stop_deadline: Option<Instant> = None;
    loop {
        let polling = stop_deadline.is_some() || fence_after.is_some();
        let flags = polling.then_some(WaitPidFlag::WNOHANG);
        match waitpid(child, flags) {
            Ok(WaitStatus::Exited(_, code)) => return Ok(ExitCode::from(code as u8)),
            Ok(WaitStatus::Signaled(_, signal, _)) => return Ok(die_like(signal)),
            Ok(_) | Err(Errno::EINTR) => {}
            Err(err) => return Err(format!("waiting for the job: {err}")),
        }
        let fenced =
            fence_after.is_some_and(|after| age_of(contact).is_some_and(|age| age > after));
        if stop_deadline.is_none() && fenced {
            eprintln!(
                "mgpu: this node has not reached the cluster for longer than {:?}; stopping \
                 the job, which may already run elsewhere (fenced)",
                fence_after.unwrap_or_default()
            );
        }
        if stop_deadline.is_none() && (STOP.load(Ordering::SeqCst) != 0 || fenced) {
            // Stop the whole group (this guard ignores its own copy: the handler is set).
            let _ = killpg(getpgrp(), Signal::SIGTERM);
            stop_deadline = Some(Instant::now() + grace);
        }
        if let Some(deadline) = stop_deadline {
            if Instant::now() >= deadline {
                // Takes this guard down too; the agent (if alive) sees signal 9.
                let _ = killpg(getpgrp(), Signal::SIGKILL);
            }
            pause_until_exit(exit_signal.as_ref(), Duration::from_millis(20));
        } else if let Some(every) = check_every {
            pause_until_exit(exit_signal.as_ref(), every);
        }
    }
}

/// Starts `program args` (looked up on this process's `PATH`, which is the job's); a file
/// the kernel cannot run (a script without `#!`) runs under `/bin/sh`, as `execvp` does.
/// The error is the exit code and message a shell would give.
fn start_program(program: &str, args: &[String]) -> Result<std::process::Child, (u8, String)> {
    match std::process::Command::new(program).args(args).spawn() {
        Ok(child) => Ok(child),
        // `sh -c 'exec "$0" "$@"'` finds the file again and, since the kernel cannot run
        // it, the shell reads it as a script.
        Err(err) if err.raw_os_error() == Some(Errno::ENOEXEC as i32) => {
            std::process::Command::new("/bin/sh")
                .args(["-c", r#"exec "$0" "$@""#, program])
                .args(args)
                .spawn()
                .map_err(|err| (126, format!("cannot be run ({err})")))
        }
        Err(err) => Err(match err.kind() {
            std::io::ErrorKind::NotFound if program.contains('/') => {
                (127, "No such file or directory".to_owned())
            }
            std::io::ErrorKind::NotFound => (127, "command not found".to_owned()),
            std::io::ErrorKind::PermissionDenied => (126, "Permission denied".to_owned()),
            _ => (126, format!("cannot be run ({err})")),
        }),
    }
}

/// A descriptor that becomes readable when `child` exits (Linux 5.3+); None where the kernel
/// has no `pidfd_open`, and the guard then only sleeps between its checks.
fn pidfd_of(child: Pid) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags, and returns a new descriptor or -1.
    let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, child.as_raw(), 0) };
    let fd = RawFd::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: the kernel just created this descriptor, and nothing else owns it.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Waits `at_most`, or less: until the child exits (when its pidfd is known) or a stop signal
/// arrives. A job that ends at once is then reaped at once, not at the next fence check
/// (up to 100 ms later, which capped a node at a few dozen short jobs per second per GPU).
fn pause_until_exit(exit_signal: Option<&OwnedFd>, at_most: Duration) {
    let Some(fd) = exit_signal else {
        std::thread::sleep(at_most);
        return;
    };
    let timeout = PollTimeout::try_from(at_most).unwrap_or(PollTimeout::MAX);
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    // Readable, timed out or interrupted by a stop signal: the caller checks everything again.
    let _ = poll(&mut fds, timeout);
}

/// Ends this process by `signal`, as the shell ended, so the agent reports the same thing.
fn die_like(signal: Signal) -> ExitCode {
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    // SAFETY: restoring the default disposition has no handler to be unsafe about.
    let _ = unsafe { signal::sigaction(signal, &default) };
    let _ = signal::raise(signal);
    ExitCode::from(128u8.wrapping_add(signal as u8))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slim_guard_is_used_where_it_is_beside_the_agent() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let agent = dir.path().join("mgpu-node");
        let builtin = GuardProgram::Builtin(agent.clone());
        assert_eq!(GuardProgram::choose(None, &agent), Ok(builtin.clone()));
        let slim = dir.path().join(SLIM_GUARD_NAME);
        std::fs::write(&slim, b"").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            GuardProgram::choose(None, &agent),
            Ok(GuardProgram::Slim(slim.clone()))
        );
        assert_eq!(GuardProgram::choose(Some("builtin"), &agent), Ok(builtin));
        let elsewhere = slim.display().to_string();
        let absolute = std::fs::canonicalize(&slim).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            GuardProgram::choose(Some(&elsewhere), Path::new("/nowhere/mgpu-node")),
            Ok(GuardProgram::Slim(absolute.clone()))
        );
        // A relative path is made absolute: the guard starts in the job's directory.
        let here = std::env::current_dir().unwrap_or_else(|e| panic!("{e}"));
        let relative = pathdiff(&absolute, &here);
        assert_eq!(
            GuardProgram::choose(Some(&relative), &agent),
            Ok(GuardProgram::Slim(absolute))
        );
        let missing = GuardProgram::choose(Some("/no/such/guard"), &agent);
        assert!(missing.is_err_and(|e| e.contains("no such file")));
    }

    /// `path` relative to `base`, through `..` (both absolute).
    fn pathdiff(path: &Path, base: &Path) -> String {
        let ups = base.components().count().saturating_sub(1);
        let mut relative = "../".repeat(ups);
        relative.push_str(&path.display().to_string()[1..]);
        relative
    }

    #[test]
    fn guard_arguments_round_trip() {
        let args = guard_args(42, Duration::from_millis(1500), None, None, "/bin/bash");
        assert_eq!(args, vec!["42", "1500", "0", "-", "-", "/bin/bash"]);
        let fence = GuardFence {
            after: Duration::from_millis(700),
            contact_file: "/state/n1.contact".into(),
        };
        let args = guard_args(
            42,
            Duration::from_millis(1500),
            Some(&fence),
            Some("1000:1000:1000,27".into()),
            "/bin/sh",
        );
        assert_eq!(
            args,
            vec![
                "42",
                "1500",
                "700",
                "/state/n1.contact",
                "1000:1000:1000,27",
                "/bin/sh"
            ]
        );
        assert!(guard(&["x".into()]).is_err());
        let switching: Vec<String> = ["1", "0", "0", "-", "0:0:", "true"]
            .map(str::to_owned)
            .to_vec();
        assert!(guard(&switching).is_err_and(|e| e.contains("does not switch")));
    }
}
