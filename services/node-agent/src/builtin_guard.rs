//! The built-in job guard: this binary started as `mgpu-node __mgpu-job-guard AGENT_PID
//! GRACE_MS FENCE_MS CONTACT_FILE - PROGRAM [ARGS...]` (see `guard.rs` for how the agent
//! starts it, and `services/job-guard` for the standalone guard that behaves the same).
//!
//! The guard asks the kernel for SIGTERM when the agent dies (`PR_SET_PDEATHSIG`), runs
//! PROGRAM as its child in the same group, and waits. If the agent dies (SIGKILL, crash) — or
//! anyone sends the guard SIGTERM, SIGINT or SIGHUP — it stops the whole group: SIGTERM, the
//! grace period, SIGKILL (on a job's terminal, `--pty`, SIGINT and SIGQUIT are typed keys, and
//! the job's). Without it, a job whose agent was killed would keep running while
//! the scheduler already runs its next attempt elsewhere.
//!
//! The guard also fences the job when the agent is alive but cut off or frozen (SIGSTOP, a
//! stalled host): when CONTACT_FILE is older than FENCE_MS (0: never) the guard stops the
//! group the same way, since the scheduler may by then run the job elsewhere. When to stop
//! and kill is the pure [`GuardState::next`]; [`watch_job`] applies it.
//!
//! Otherwise the guard is invisible: the job inherits its standard streams, environment,
//! directory and group, and the guard ends the way the job ended (same exit code, or the
//! same signal). A PROGRAM without `/` is looked up on the job's `PATH`; one that cannot be
//! found ends the job with 127 and one that cannot be run with 126, as in a shell.
//!
//! PR_SET_PDEATHSIG fires when the *thread* that forked the guard ends; the agent spawns jobs
//! from its async runtime's worker threads, which live as long as the agent.

use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, FdFlag};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, Signal, killpg};
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

/// How long ago `file` was last touched; None when it cannot be read (the guard then keeps
/// the job: fencing on a missing file would turn an operator's mistake into lost work).
fn age_of(file: &Path) -> Option<Duration> {
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

/// The guard's life: read its command line, arrange to hear of the agent's death, start the
/// job and see it through. The error is the guard's own failure (exit 127).
fn guard(args: &[String]) -> Result<ExitCode, String> {
    let settings = GuardSettings::parse(args)?;
    // Where the agent did not move it there itself (it does before switching accounts, and
    // says so with `@`). One `cgroup.procs` per hierarchy on cgroup v1, joined by `:`.
    let to_join = settings.cgroup_procs.filter(|list| !list.starts_with('@'));
    for procs in to_join.iter().flat_map(|list| list.split(':')) {
        std::fs::write(procs, b"0")
            .map_err(|err| format!("cannot move into the job's cgroup {procs}: {err}"))?;
    }
    keep_contact_from_job(settings.contact);
    prepare_for_agent_death(settings.agent)?;
    // Handlers do not survive exec: the job starts with default dispositions.
    let child = match start_program(settings.program, settings.args) {
        Ok(child) => child,
        Err((code, message)) => {
            eprintln!("mgpu: {}: {message}", settings.program);
            return Ok(ExitCode::from(code));
        }
    };
    watch_job(Pid::from_raw(child.id() as i32), &settings)
}

/// The built-in guard's command line.
#[derive(Debug, PartialEq, Eq)]
struct GuardSettings<'a> {
    agent: i32,
    grace: Duration,
    /// None: never fence.
    fence_after: Option<Duration>,
    contact: &'a str,
    /// The job's cgroup's `cgroup.procs` to move into first (several joined by `:` on cgroup
    /// v1); None: `-`.
    cgroup_procs: Option<&'a str>,
    program: &'a str,
    args: &'a [String],
}

impl<'a> GuardSettings<'a> {
    /// `AGENT_PID GRACE_MS FENCE_MS CONTACT_FILE - CGROUP PROGRAM [ARGS...]`; the error is the
    /// guard's message.
    fn parse(args: &'a [String]) -> Result<Self, String> {
        let [
            agent,
            grace_ms,
            fence_ms,
            contact,
            account,
            cgroup,
            program,
            rest @ ..,
        ] = args
        else {
            return Err(
                "usage: __mgpu-job-guard AGENT_PID GRACE_MS FENCE_MS CONTACT_FILE - CGROUP PROGRAM [ARGS...]"
                    .into(),
            );
        };
        if account != "-" {
            return Err("the built-in guard does not switch accounts (the agent does)".into());
        }
        let fence_after = match fence_ms
            .parse::<u64>()
            .map_err(|_| format!("bad fence {fence_ms}"))?
        {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        };
        let agent: i32 = agent
            .parse()
            .map_err(|_| format!("bad agent pid {agent}"))?;
        let grace = Duration::from_millis(
            grace_ms
                .parse()
                .map_err(|_| format!("bad grace {grace_ms}"))?,
        );
        Ok(GuardSettings {
            agent,
            grace,
            fence_after,
            contact,
            cgroup_procs: Some(cgroup.as_str()).filter(|c| *c != "-"),
            program,
            args: rest,
        })
    }

    /// How often the contact file is looked at while fencing; the agent's heartbeat margin
    /// covers the delay.
    fn check_every(&self) -> Option<Duration> {
        self.fence_after
            .map(|f| (f / 8).clamp(Duration::from_millis(20), Duration::from_millis(100)))
    }

    /// Whether the contact file says the agent has not stored a heartbeat for too long.
    fn fenced(&self) -> bool {
        self.fence_after
            .is_some_and(|after| age_of(Path::new(self.contact)).is_some_and(|age| age > after))
    }
}

/// A contact file handed down as a descriptor ([`inheritable_contact`]) is the guard's alone:
/// close-on-exec, so the job does not inherit it.
fn keep_contact_from_job(contact: &str) {
    if let Some(fd) = contact
        .strip_prefix("/proc/self/fd/")
        .and_then(|n| n.parse::<RawFd>().ok())
    {
        // SAFETY: inherited from the agent for this guard, and open for its whole life.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let _ = nix::fcntl::fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
    }
}

/// Notes stop signals instead of dying of them, asks for SIGTERM when the agent dies, and
/// refuses to go on when the agent (pid `agent`) is already gone.
fn prepare_for_agent_death(agent: i32) -> Result<(), String> {
    let action = SigAction::new(
        SigHandler::Handler(on_stop_signal),
        // No SA_RESTART: a stop signal must interrupt the wait for the job.
        SaFlags::empty(),
        SigSet::empty(),
    );
    for stop in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { signal::sigaction(stop, &action) }.map_err(|e| format!("sigaction: {e}"))?;
    }
    // A job on a terminal (`--pty`): what is typed there is for the job. Hanging up the
    // terminal (SIGHUP) still stops it.
    if nix::unistd::isatty(std::io::stdin()).unwrap_or(false) {
        let typed = SigAction::new(
            SigHandler::Handler(on_terminal_signal),
            SaFlags::SA_RESTART,
            SigSet::empty(),
        );
        for key in [Signal::SIGINT, Signal::SIGQUIT] {
            // SAFETY: the handler does nothing.
            unsafe { signal::sigaction(key, &typed) }.map_err(|e| format!("sigaction: {e}"))?;
        }
    }
    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(|e| format!("prctl: {e}"))?;
    // The agent may have died before the line above took effect: then nothing must start.
    if getppid() != Pid::from_raw(agent) {
        return Err("the agent is gone; not starting the job".into());
    }
    Ok(())
}

/// Waits for the job to end and ends the same way; stops its group on a stop signal or when
/// fenced.
fn watch_job(child: Pid, settings: &GuardSettings<'_>) -> Result<ExitCode, String> {
    // Not reaped yet, so the pid is still this child's.
    let exit_signal = pidfd_of(child);
    let check_every = settings.check_every();
    let mut state = GuardState::Watching;
    loop {
        let polling = state != GuardState::Watching || settings.fence_after.is_some();
        let ended = match waitpid(child, polling.then_some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => Some(ExitCode::from(code as u8)),
            Ok(WaitStatus::Signaled(_, signal, _)) => Some(die_like(signal)),
            Ok(_) | Err(Errno::EINTR) => None,
            Err(err) => return Err(format!("waiting for the job: {err}")),
        };
        if let Some(code) = ended {
            // Stopped without its agent (dead, or fenced): nothing of the job may outlive
            // this guard, not even what left its group.
            if state != GuardState::Watching
                && let Some(list) = settings.cgroup_procs
            {
                kill_cgroup(list, Signal::SIGKILL);
            }
            return Ok(code);
        }
        let look = Look {
            now: Instant::now(),
            fenced: settings.fenced(),
            stop_signal: STOP.load(Ordering::SeqCst) != 0,
        };
        let (next, plan) = state.next(look, settings.grace, check_every);
        state = next;
        if plan.announce_fence {
            eprintln!(
                "mgpu: this node has not reached the cluster for longer than {:?}; stopping \
                 the job, which may already run elsewhere (fenced)",
                settings.fence_after.unwrap_or_default()
            );
        }
        // The whole group (this guard ignores its own SIGTERM: the handler is set).
        if plan.terminate {
            if let Some(list) = settings.cgroup_procs {
                kill_cgroup(list, Signal::SIGTERM);
            }
            let _ = killpg(getpgrp(), Signal::SIGTERM);
        }
        if plan.kill {
            // What left the group (a daemon, `setsid`) first, then the group, which takes this
            // guard down too; the agent (if alive) sees signal 9.
            if let Some(list) = settings.cgroup_procs {
                kill_cgroup(list, Signal::SIGKILL);
            }
            let _ = killpg(getpgrp(), Signal::SIGKILL);
        }
        if let Some(pause) = plan.pause {
            pause_until_exit(exit_signal.as_ref(), pause);
        }
    }
}

/// Sends `signal` to every process in the job's cgroup but this guard (the first
/// `cgroup.procs` of `list`), so a job stopped without its agent (dead, or fenced) takes what
/// left its process group with it. SIGKILL goes a few rounds, until only the guard is left:
/// a forking job may add processes meanwhile.
fn kill_cgroup(list: &str, signal: Signal) {
    let list = list.strip_prefix('@').unwrap_or(list);
    let Some(procs) = list.split(':').next() else {
        return;
    };
    let me = std::process::id();
    for _ in 0..20 {
        let Ok(text) = std::fs::read_to_string(procs) else {
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
        // The group's members get a stop signal from the group's own; a second SIGTERM would
        // run a job's TERM handler twice. SIGKILL goes to every member, whatever its group.
        let group = nix::unistd::getpgrp();
        for pid in others.into_iter().map(Pid::from_raw) {
            let in_group = nix::unistd::getpgid(Some(pid)).is_ok_and(|g| g == group);
            if signal == Signal::SIGKILL || !in_group {
                let _ = nix::sys::signal::kill(pid, signal);
            }
        }
        if signal != Signal::SIGKILL {
            return;
        }
    }
}

/// How often a stopping guard looks whether the job is gone or SIGKILL is due.
const STOPPING_PAUSE: Duration = Duration::from_millis(20);

/// Where the guard's stopping of its job stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GuardState {
    Watching,
    /// SIGTERM sent to the group; SIGKILL is due at `kill_at` (None: a grace too long for the
    /// clock, never).
    Stopping {
        kill_at: Option<Instant>,
    },
}

/// What one look at a job that has not ended found.
#[derive(Clone, Copy, Debug)]
struct Look {
    now: Instant,
    fenced: bool,
    stop_signal: bool,
}

/// What the guard does after a look.
#[derive(Debug, Default, PartialEq, Eq)]
struct Plan {
    /// Say on the job's stderr that it is fenced.
    announce_fence: bool,
    /// SIGTERM to the group.
    terminate: bool,
    /// SIGKILL to the group.
    kill: bool,
    /// Wait this long (or until the job exits) before looking again; None: block in waitpid.
    pause: Option<Duration>,
}

impl GuardState {
    /// The first stop signal or fencing stops the group; SIGKILL follows once the grace has
    /// passed, and is repeated at every look after that until the guard dies of it.
    fn next(self, look: Look, grace: Duration, check_every: Option<Duration>) -> (Self, Plan) {
        let mut plan = Plan::default();
        let state = match self {
            GuardState::Watching if look.stop_signal || look.fenced => {
                plan.announce_fence = look.fenced;
                plan.terminate = true;
                GuardState::Stopping {
                    kill_at: look.now.checked_add(grace),
                }
            }
            other => other,
        };
        match state {
            GuardState::Stopping { kill_at } => {
                plan.kill = kill_at.is_some_and(|at| look.now >= at);
                plan.pause = Some(STOPPING_PAUSE);
            }
            GuardState::Watching => plan.pause = check_every,
        }
        (state, plan)
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
    use crate::guard::{GuardFence, guard_args};

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| (*a).to_owned()).collect()
    }

    #[test]
    fn the_guard_reads_what_the_agent_passes_and_refuses_the_rest() {
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
        let settings = GuardSettings::parse(&args);
        assert_eq!(
            settings,
            Ok(GuardSettings {
                agent: 42,
                grace: Duration::from_millis(1500),
                fence_after: Some(Duration::from_millis(800)),
                contact: "/proc/self/fd/7",
                cgroup_procs: Some("/cg/job/cgroup.procs"),
                program: "sh",
                args: &args[7..],
            })
        );
        // Checked a hundred times a fence, but at most every 100 ms and at least every 20 ms.
        let every = |fence_ms: &str| {
            let args = strings(&["1", "0", fence_ms, "-", "-", "-", "true"]);
            GuardSettings::parse(&args).map(|s| s.check_every())
        };
        assert_eq!(every("800"), Ok(Some(Duration::from_millis(100))));
        assert_eq!(every("400"), Ok(Some(Duration::from_millis(50))));
        assert_eq!(every("80"), Ok(Some(Duration::from_millis(20))));
        assert_eq!(every("0"), Ok(None));
        let error = |args: &[&str]| GuardSettings::parse(&strings(args)).err();
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
    }

    fn look(now: Instant, fenced: bool, stop_signal: bool) -> Look {
        Look {
            now,
            fenced,
            stop_signal,
        }
    }

    #[test]
    fn a_stop_signal_terminates_the_group_then_kills_it_after_the_grace() {
        let grace = Duration::from_secs(2);
        let start = Instant::now();
        let every = Some(Duration::from_millis(50));
        let (state, plan) = GuardState::Watching.next(look(start, false, false), grace, every);
        assert_eq!((state, &plan.pause), (GuardState::Watching, &every));
        assert!(!plan.terminate && !plan.kill);

        let (stopping, plan) = state.next(look(start, false, true), grace, every);
        assert_eq!(
            stopping,
            GuardState::Stopping {
                kill_at: Some(start + grace)
            }
        );
        assert!(plan.terminate && !plan.kill && !plan.announce_fence);
        assert_eq!(plan.pause, Some(STOPPING_PAUSE));
        // Within the grace: no second SIGTERM, no SIGKILL yet.
        let (same, plan) = stopping.next(look(start + grace / 2, true, true), grace, every);
        assert_eq!(same, stopping);
        assert_eq!(
            plan,
            Plan {
                pause: Some(STOPPING_PAUSE),
                ..Plan::default()
            }
        );
        let (_, plan) = stopping.next(look(start + grace, false, true), grace, every);
        assert!(plan.kill && !plan.terminate);
    }

    #[test]
    fn fencing_is_announced_once_and_a_zero_grace_kills_at_once() {
        let now = Instant::now();
        let (state, plan) = GuardState::Watching.next(look(now, true, false), Duration::ZERO, None);
        assert_eq!(
            plan,
            Plan {
                announce_fence: true,
                terminate: true,
                kill: true,
                pause: Some(STOPPING_PAUSE),
            }
        );
        let (_, plan) = state.next(look(now, true, false), Duration::ZERO, None);
        assert!(!plan.announce_fence && !plan.terminate && plan.kill);
        // Without fencing and before any signal, the guard just waits for the job.
        let (_, plan) = GuardState::Watching.next(look(now, false, false), Duration::ZERO, None);
        assert_eq!(plan, Plan::default());
        // A grace too long for the clock never comes due.
        let (state, plan) = GuardState::Watching.next(look(now, false, true), Duration::MAX, None);
        assert_eq!(state, GuardState::Stopping { kill_at: None });
        assert!(plan.terminate && !plan.kill);
    }

    #[test]
    fn what_the_agent_passes_is_what_the_guard_reads() {
        let fence = GuardFence {
            after: Duration::from_millis(700),
            contact_file: "/proc/self/fd/9".into(),
        };
        let mut args = guard_args(
            7,
            Duration::from_millis(1500),
            Some(&fence),
            None,
            None,
            "python",
        );
        args.push("a.py".into());
        assert_eq!(
            GuardSettings::parse(&args),
            Ok(GuardSettings {
                agent: 7,
                grace: Duration::from_millis(1500),
                fence_after: Some(Duration::from_millis(700)),
                contact: "/proc/self/fd/9",
                cgroup_procs: None,
                program: "python",
                args: &args[7..],
            })
        );
        assert!(guard(&["x".into()]).is_err());
        let switching: Vec<String> = ["1", "0", "0", "-", "0:0:", "-", "true"]
            .map(str::to_owned)
            .to_vec();
        assert!(guard(&switching).is_err_and(|e| e.contains("does not switch")));
    }
}
