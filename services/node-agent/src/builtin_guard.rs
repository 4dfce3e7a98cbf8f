//! The built-in job guard: this binary started as `mgpu-node __mgpu-job-guard AGENT_PID
//! GRACE_MS FENCE_MS CONTACT_FILE - CGROUP PROGRAM [ARGS...]` (see `guard.rs` for how the
//! agent starts it, and `services/job-guard` for the standalone guard that behaves the same).
//!
//! What the guard decides is `mgpu-guard-rules`, shared with `mgpu-job-guard`: its command
//! line, and the state machine that says when to stop the job's group (a stop signal, the
//! agent's death, which the kernel reports as SIGTERM through `PR_SET_PDEATHSIG`, or a
//! contact file older than FENCE_MS: the agent is alive but cut off or frozen), the kill
//! sequence and grace, and how the guard ends (the way the job ended). This file is its driver
//! on the standard library: it joins the cgroup, sets up the signals, starts PROGRAM (looked
//! up on the job's `PATH`; 127 when it cannot be found and 126 when it cannot be run, as in a
//! shell), reads the clocks and the contact file, waits on the job, and carries the rules'
//! commands out.
//!
//! Unlike `mgpu-job-guard` it never switches accounts (ACCOUNT must be `-`): started as root,
//! a dynamically linked program would load libraries under the job's `LD_LIBRARY_PATH`, so the
//! agent switches it before the exec.
//!
//! PR_SET_PDEATHSIG fires when the *thread* that forked the guard ends; the agent spawns jobs
//! from its async runtime's worker threads, which live as long as the agent.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant, SystemTime};

use mgpu_guard_rules::args::{PROGRAM_AT, USAGE};
use mgpu_guard_rules::machine::{CGROUP_KILL_ROUNDS, FENCED_MESSAGE, cgroup_signal_spares_group};
use mgpu_guard_rules::{Arguments, Command, Contact, Guard, JobEnd, Look, exit, signal};
use nix::errno::Errno;
use nix::fcntl::{FcntlArg, FdFlag};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, killpg, sigaction};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpgrp, getppid};

use crate::guard::GUARD_ARG;

/// The stop signal received, 0 while none.
static STOP: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(signal: nix::libc::c_int) {
    STOP.store(signal, Ordering::SeqCst);
}

/// For the keys a terminal turns into signals (Ctrl+C, Ctrl+\): they are the job's, so the
/// guard, in the same foreground group, neither stops nor dies of them. A handler rather
/// than "ignore", since the job would inherit an ignored signal.
extern "C" fn on_terminal_signal(_: nix::libc::c_int) {}

/// Runs as a job guard when argv says so; None otherwise (a normal agent start).
pub fn run_if_guard() -> Option<ExitCode> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) != Some(GUARD_ARG) {
        return None;
    }
    Some(match guard(args.get(2..).unwrap_or_default()) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("mgpu job guard: {err}");
            ExitCode::from(exit::NOT_FOUND)
        }
    })
}

/// A path from the command line's bytes.
fn path(bytes: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(bytes))
}

/// The guard's life: read its command line, arrange to hear of the agent's death, start the
/// job and see it through. The error is the guard's own failure (exit 127).
fn guard(args: &[String]) -> Result<ExitCode, String> {
    let settings = parse(args)?;
    // Where the agent did not move it there itself (it does before switching accounts, and
    // says so with `@`).
    for procs in settings.cgroup.to_join() {
        std::fs::write(path(procs), b"0").map_err(|err| {
            let procs = path(procs).display();
            format!("cannot move into the job's cgroup {procs}: {err}")
        })?;
    }
    if let Some(fence) = settings.fence {
        keep_contact_from_job(fence.contact);
    }
    prepare_for_agent_death(settings.agent)?;
    let (program, program_args) = match args.get(PROGRAM_AT..) {
        Some([program, rest @ ..]) => (program, rest),
        _ => return Err(usage()),
    };
    // Handlers do not survive exec: the job starts with default dispositions.
    let child = match start_program(program, program_args) {
        Ok(child) => child,
        Err((code, message)) => {
            eprintln!("mgpu: {program}: {message}");
            return Ok(ExitCode::from(code));
        }
    };
    watch_job(Pid::from_raw(child.id() as i32), &settings)
}

fn usage() -> String {
    format!("usage: {GUARD_ARG} {USAGE}")
}

/// The guard's arguments (the rules' format), with the bad one quoted in an error; an
/// ACCOUNT other than `-` is refused (the agent switches this guard's account itself).
fn parse(args: &[String]) -> Result<Arguments<'_>, String> {
    let bytes: Vec<&[u8]> = args.iter().map(|arg| arg.as_bytes()).collect();
    let parsed = Arguments::parse(&bytes).map_err(|error| {
        match error.position().and_then(|at| args.get(at)) {
            Some(bad) => format!("{} {bad}", error.message()),
            None => usage(),
        }
    })?;
    if parsed.account.is_some() {
        return Err("the built-in guard does not switch accounts (the agent does)".into());
    }
    Ok(parsed)
}

/// A contact file handed down as a descriptor (`guard::inheritable_contact`) is the guard's
/// alone: close-on-exec, so the job does not inherit it.
fn keep_contact_from_job(contact: &[u8]) {
    if let Some(fd) = std::str::from_utf8(contact)
        .ok()
        .and_then(|contact| contact.strip_prefix("/proc/self/fd/"))
        .and_then(|n| n.parse::<RawFd>().ok())
    {
        // SAFETY: inherited from the agent for this guard, and open for its whole life.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let _ = nix::fcntl::fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
    }
}

/// Notes stop signals instead of dying of them, asks for a signal when the agent dies, and
/// refuses to go on when the agent (pid `agent`) is already gone.
fn prepare_for_agent_death(agent: i32) -> Result<(), String> {
    let action = SigAction::new(
        SigHandler::Handler(on_stop_signal),
        // No SA_RESTART: a stop signal must interrupt the wait for the job.
        SaFlags::empty(),
        SigSet::empty(),
    );
    for stop in signal::STOP
        .into_iter()
        .filter_map(|n| Signal::try_from(n).ok())
    {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { sigaction(stop, &action) }.map_err(|e| format!("sigaction: {e}"))?;
    }
    // A job on a terminal (`--pty`): what is typed there is for the job. Hanging up the
    // terminal (SIGHUP) still stops it.
    if nix::unistd::isatty(std::io::stdin()).unwrap_or(false) {
        let typed = SigAction::new(
            SigHandler::Handler(on_terminal_signal),
            SaFlags::SA_RESTART,
            SigSet::empty(),
        );
        for key in signal::TERMINAL_KEYS
            .into_iter()
            .filter_map(|n| Signal::try_from(n).ok())
        {
            // SAFETY: the handler does nothing.
            unsafe { sigaction(key, &typed) }.map_err(|e| format!("sigaction: {e}"))?;
        }
    }
    let agent_died = Signal::try_from(signal::AGENT_DIED).map_err(|e| format!("prctl: {e}"))?;
    nix::sys::prctl::set_pdeathsig(agent_died).map_err(|e| format!("prctl: {e}"))?;
    // The agent may have died before the line above took effect: then nothing must start.
    if getppid() != Pid::from_raw(agent) {
        return Err("the agent is gone; not starting the job".into());
    }
    Ok(())
}

/// Waits for the job to end and ends the same way, stopping its group when the rules say: a
/// [`Guard`] driven by what the clocks, the contact file, the stop signals and the job's end
/// say.
fn watch_job(child: Pid, settings: &Arguments<'_>) -> Result<ExitCode, String> {
    // Not reaped yet, so the pid is still this child's.
    let exit_signal = pidfd_of(child);
    let contact = settings.fence.map(|fence| path(fence.contact));
    let members = settings.cgroup.members().map(path);
    let origin = Instant::now();
    let mut guard = Guard::new(settings.grace, settings.fence.map(|fence| fence.after));
    // Set when the rules said to wait without a limit: then waitpid itself waits (a stop
    // signal interrupts it: its handler has no SA_RESTART).
    let mut block = false;
    loop {
        let commands = match waitpid(child, (!block).then_some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => guard.job_ended(JobEnd::Exited(code as u8)),
            Ok(WaitStatus::Signaled(_, signal, _)) => {
                guard.job_ended(JobEnd::Signaled(signal as i32))
            }
            Ok(_) | Err(Errno::EINTR) => guard.look(Look {
                now: origin.elapsed(),
                stop_signal: STOP.load(Ordering::SeqCst) != 0,
                contact: read_contact(&guard, contact),
            }),
            Err(err) => return Err(format!("waiting for the job: {err}")),
        };
        for command in &commands {
            match *command {
                Command::AnnounceFence { after_ms } => {
                    eprint!("{}{after_ms}{}", FENCED_MESSAGE[0], FENCED_MESSAGE[1]);
                }
                Command::SignalCgroup(number) => {
                    if let (Some(members), Ok(signal)) = (members, Signal::try_from(number)) {
                        signal_cgroup(members, signal);
                    }
                }
                Command::SignalGroup(number) => {
                    if let Ok(signal) = Signal::try_from(number) {
                        let _ = killpg(getpgrp(), signal);
                    }
                }
                Command::Wait { at_most } => {
                    block = at_most.is_none();
                    if let Some(pause) = at_most {
                        pause_until_exit(exit_signal.as_ref(), pause);
                    }
                }
                Command::Exit(code) => return Ok(ExitCode::from(code)),
                Command::DieBy { signal, otherwise } => return Ok(die_by(signal, otherwise)),
            }
        }
    }
}

/// What the contact file says, when the rules want it read: when it was last touched, with
/// the wall clock now.
fn read_contact(guard: &Guard, contact: Option<&Path>) -> Contact {
    let Some(contact) = contact.filter(|_| guard.reads_contact()) else {
        return Contact::NotRead;
    };
    let since_epoch = |time: SystemTime| {
        time.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
    };
    match std::fs::metadata(contact).and_then(|meta| meta.modified()) {
        Ok(modified) => Contact::StoredAt {
            stored: since_epoch(modified),
            now: since_epoch(SystemTime::now()),
        },
        Err(_) => Contact::Unreadable,
    }
}

/// Sends `signal` to every process in the job's cgroup but this guard (those `members`, its
/// first `cgroup.procs`, lists), sparing the guard's group where the rules say; SIGKILL goes
/// a few rounds, until only the guard is left: a forking job may add processes meanwhile.
fn signal_cgroup(members: &Path, signal: Signal) {
    let me = std::process::id();
    let spares_group = cgroup_signal_spares_group(signal as i32);
    for _ in 0..CGROUP_KILL_ROUNDS {
        let Ok(text) = std::fs::read_to_string(members) else {
            return;
        };
        let others: Vec<i32> = text
            .lines()
            .filter_map(|line| line.trim().parse::<u32>().ok())
            .filter(|pid| *pid != me)
            .filter_map(|pid| i32::try_from(pid).ok())
            .collect();
        if others.is_empty() {
            return;
        }
        let group = getpgrp();
        for pid in others.into_iter().map(Pid::from_raw) {
            let in_group = nix::unistd::getpgid(Some(pid)).is_ok_and(|g| g == group);
            if !(spares_group && in_group) {
                let _ = nix::sys::signal::kill(pid, signal);
            }
        }
        if spares_group {
            return;
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
                .map_err(|err| (exit::NOT_RUNNABLE, format!("cannot be run ({err})")))
        }
        Err(err) => Err(match err.kind() {
            std::io::ErrorKind::NotFound if program.contains('/') => {
                (exit::NOT_FOUND, "No such file or directory".to_owned())
            }
            std::io::ErrorKind::NotFound => (exit::NOT_FOUND, "command not found".to_owned()),
            std::io::ErrorKind::PermissionDenied => {
                (exit::NOT_RUNNABLE, "Permission denied".to_owned())
            }
            _ => (exit::NOT_RUNNABLE, format!("cannot be run ({err})")),
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

/// Ends this process by `signal` (default disposition, sent to itself), as the job ended, so
/// the agent reports the same thing; `otherwise` if that did not end it.
fn die_by(signal: i32, otherwise: u8) -> ExitCode {
    if let Ok(signal) = Signal::try_from(signal) {
        let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
        // SAFETY: restoring the default disposition has no handler to be unsafe about.
        let _ = unsafe { sigaction(signal, &default) };
        let _ = nix::sys::signal::raise(signal);
    }
    ExitCode::from(otherwise)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| (*a).to_owned()).collect()
    }

    #[test]
    fn the_guard_reads_the_rules_format_and_quotes_what_is_wrong() {
        let args = strings(&[
            "42",
            "1500",
            "800",
            "/proc/self/fd/7",
            "-",
            "/cg/job/cgroup.procs",
            "sh",
            "-c",
            "x",
        ]);
        let settings = parse(&args).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(settings.agent, 42);
        assert_eq!(settings.grace, Duration::from_millis(1500));
        assert_eq!(
            settings.fence.map(|f| (f.after, path(f.contact))),
            Some((Duration::from_millis(800), Path::new("/proc/self/fd/7")))
        );
        assert_eq!(
            settings.cgroup.members().map(path),
            Some(Path::new("/cg/job/cgroup.procs"))
        );
        let error = |args: &[&str]| parse(&strings(args)).err();
        assert_eq!(
            error(&["1", "0", "x", "-", "-", "-", "true"]).as_deref(),
            Some("bad fence x")
        );
        assert_eq!(
            error(&["p", "y", "0", "-", "-", "-", "true"]).as_deref(),
            Some("bad agent pid p")
        );
        assert_eq!(
            error(&["1", "y", "0", "-", "-", "-", "true"]).as_deref(),
            Some("bad grace y")
        );
        let usage = error(&["1", "0", "0"]).unwrap_or_default();
        assert!(
            usage.starts_with("usage: __mgpu-job-guard AGENT_PID"),
            "{usage}"
        );
    }

    #[test]
    fn the_builtin_guard_refuses_to_switch_accounts() {
        assert!(guard(&["x".into()]).is_err());
        let switching = strings(&["1", "0", "0", "-", "0:0:", "-", "true"]);
        assert!(guard(&switching).is_err_and(|e| e.contains("does not switch")));
    }
}
