//! `mgpu-job-guard`: the first process of every job on Linux x86_64, so a job never outlives
//! its agent.
//!
//! The agent starts each job as
//! `mgpu-job-guard AGENT_PID GRACE_MS FENCE_MS CONTACT_FILE ACCOUNT CGROUP PROGRAM [ARGS...]`
//! in a new process group. ACCOUNT is `-` (stay as started) or `UID:GID:GROUPS` (GROUPS a
//! comma-separated list, maybe empty): an agent running as root starts the guard as root, and
//! the guard becomes the job's account once it has opened CONTACT_FILE (in a directory the
//! job's account usually cannot enter) and moved itself into the job's cgroup (CGROUP, the
//! `cgroup.procs` file of the cgroup the agent made for the job, several joined by `:` on
//! cgroup v1 where each controller has its own hierarchy; `@` before them: joined already, by
//! the agent; or `-`: none, so the job starts inside), before anything else; so the agent can start it without copying itself
//! first (`posix_spawn` rather than `fork`). The guard asks the kernel
//! for SIGTERM when the agent dies (`PR_SET_PDEATHSIG`), runs PROGRAM as its child in the same
//! group (looked up on the job's `PATH` when it has no `/`, as a shell would), and waits. If the agent dies, or anyone sends
//! the guard SIGTERM, SIGINT or SIGHUP, it stops the whole group: SIGTERM, the grace period,
//! SIGKILL (on a job's terminal, `--pty`, SIGINT and SIGQUIT are typed keys, and the job's). When FENCE_MS is not 0 it also stops the group once CONTACT_FILE (touched by the
//! agent whenever JetStream stored its heartbeat) is older than that: the agent is alive but
//! cut off or frozen, and the scheduler may already run the job elsewhere. Otherwise the guard
//! is invisible: the job inherits its standard streams, environment, directory and group, and
//! the guard ends the way the job ended (same exit code, or the same signal).
//!
//! It does what `mgpu-node __mgpu-job-guard` does (the agent's built-in guard, used where this
//! binary is missing), without the standard library or a C library: a job's start pays for its
//! guard's, and a start through the C library and the agent's 70 MB binary cost about a
//! millisecond of CPU on a virtual machine (dynamic linking, and CPU-feature probing that
//! traps to the hypervisor), against a few dozen microseconds here.

#![no_std]
#![no_main]

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
compile_error!(
    "mgpu-job-guard speaks to Linux on x86_64 only; elsewhere the agent uses its built-in \
     guard (scripts/setup.sh does not build this crate there)"
);

mod cgroup;
mod sys;

use core::arch::global_asm;
use core::ffi::CStr;
use core::sync::atomic::{AtomicI32, Ordering};

use sys::{SIGHUP, SIGINT, SIGKILL, SIGQUIT, SIGTERM};

// The kernel starts the program here with argc, argv and envp on the stack.
global_asm!(
    ".globl _start",
    "_start:",
    "xor ebp, ebp",
    "mov rdi, rsp",
    "and rsp, -16",
    "call {entry}",
    "ud2",
    entry = sym entry,
);

/// Exit code for the guard's own failures, and for a program that cannot be found (as a
/// shell says "command not found").
const NOT_FOUND: i32 = 127;
/// Exit code for a program found but not runnable (as a shell says).
const NOT_RUNNABLE: i32 = 126;
/// Where PROGRAM is in argv; the guard's own arguments come before it.
const PROGRAM_AT: usize = 7;
/// Supplementary groups an account may have here; more is refused.
const MAX_GROUPS: usize = 1024;
/// Where a program is looked up when the job has no `PATH`.
const DEFAULT_PATH: &[u8] = b"/usr/local/bin:/usr/bin:/bin";
const MS: i128 = 1_000_000;

/// The stop signal received, 0 while none.
static STOP: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(signal: i32) {
    STOP.store(signal, Ordering::SeqCst);
}

/// For the keys a terminal turns into signals (Ctrl+C, Ctrl+\): they are the job's, so the
/// guard, in the same foreground group, neither stops nor dies of them. A handler rather
/// than "ignore", since the job would inherit an ignored signal.
extern "C" fn on_terminal_signal(_: i32) {}

/// The stop signals: blocked except while the guard waits, so none comes between a check and
/// the wait and goes unnoticed until the job ends.
const STOP_SIGNALS: u64 =
    sys::signal_bit(SIGTERM) | sys::signal_bit(SIGINT) | sys::signal_bit(SIGHUP);

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    sys::write(2, b"mgpu job guard: internal error\n");
    sys::exit(NOT_FOUND)
}

/// # Safety
/// Called once, by `_start`, with the stack the kernel set up: argc, then argv and envp.
unsafe extern "C" fn entry(stack: *const usize) -> ! {
    // SAFETY: the System V process start layout.
    let (argc, argv, envp) = unsafe {
        let argc = *stack;
        let argv = stack.add(1) as *mut *const u8;
        (argc, argv, argv.add(argc + 1) as *const *const u8)
    };
    // SAFETY: argv holds argc NUL-terminated strings and a NULL; envp is NULL-terminated.
    sys::exit(unsafe { guard(argc, argv, envp) })
}

/// The argument `index` (below argc) as bytes without its NUL.
///
/// # Safety
/// `argv` must hold a NUL-terminated string at `index`.
unsafe fn arg<'a>(argv: *mut *const u8, index: usize) -> &'a CStr {
    // SAFETY: as the caller promised; argv lives as long as the process.
    unsafe { CStr::from_ptr(*argv.add(index) as *const core::ffi::c_char) }
}

fn number(text: &CStr) -> Option<u64> {
    core::str::from_utf8(text.to_bytes()).ok()?.parse().ok()
}

/// A message to stderr, built without allocating.
struct Message {
    bytes: [u8; 1024],
    len: usize,
}

impl Message {
    fn new() -> Self {
        Message {
            bytes: [0; 1024],
            len: 0,
        }
    }

    fn push(mut self, text: &[u8]) -> Self {
        let take = text.len().min(self.bytes.len() - self.len);
        self.bytes[self.len..self.len + take].copy_from_slice(&text[..take]);
        self.len += take;
        self
    }

    fn number(self, mut value: u64) -> Self {
        let mut digits = [0u8; 20];
        let mut start = digits.len();
        loop {
            start -= 1;
            digits[start] = b'0' + (value % 10) as u8;
            value /= 10;
            if value == 0 {
                break;
            }
        }
        self.push(&digits[start..])
    }

    fn send(self) {
        sys::write(2, &self.bytes[..self.len]);
    }
}

fn fail(reason: &[u8]) -> i32 {
    Message::new()
        .push(b"mgpu job guard: ")
        .push(reason)
        .push(b"\n")
        .send();
    NOT_FOUND
}

/// The guard's life: read its command line, open the contact file, become the job's account,
/// arrange to hear of the agent's death, start the job and see it through. Returns the exit
/// code: the job's, or [`NOT_FOUND`] after the guard's own failure.
///
/// # Safety
/// As for [`entry`].
unsafe fn guard(argc: usize, argv: *mut *const u8, envp: *const *const u8) -> i32 {
    // SAFETY: as the caller promised.
    let settings = match unsafe { Settings::parse(argc, argv) } {
        Ok(settings) => settings,
        Err(reason) => return fail(reason),
    };
    // Opened while the guard may still be root: a root agent's state directory is usually one
    // the job's account cannot enter. The agent touches this same file (it never replaces it).
    let contact_fd = match settings.fence_ns.map(|_| sys::open_read(settings.contact)) {
        Some(fd) if fd >= 0 => Some(fd as i32),
        _ => None,
    };
    // Joined while the guard may still be root (the agent made the cgroup, as root): the job it
    // forks starts inside, and so does everything the job starts.
    let joined_already = settings.cgroup_procs.first() == Some(&b'@');
    if settings.cgroup_procs != b"-\0" && !joined_already && !cgroup::join(settings.cgroup_procs) {
        return fail(b"cannot move into the job's cgroup");
    }
    // From here on nothing runs with more rights than the job has.
    if let Err(reason) = become_account(settings.account) {
        return fail(reason);
    }
    if let Err(reason) = prepare_for_agent_death(settings.agent) {
        return fail(reason);
    }
    // SAFETY: as the caller promised (argc above PROGRAM_AT, checked by the parse).
    match unsafe { start_job(argv, envp) } {
        Ok(child) => watch_job(child, &settings, contact_fd),
        Err(reason) => fail(reason),
    }
}

/// The guard's command line (PROGRAM and its arguments stay in argv, for the exec).
struct Settings<'a> {
    agent: i32,
    grace_ns: i128,
    /// None: never fence.
    fence_ns: Option<i128>,
    /// CONTACT_FILE with its NUL.
    contact: &'a [u8],
    /// `-` or `UID:GID:GROUPS`.
    account: &'a [u8],
    /// `-` or the job's cgroup's `cgroup.procs`, with its NUL.
    cgroup_procs: &'a [u8],
}

impl<'a> Settings<'a> {
    /// `AGENT_PID GRACE_MS FENCE_MS CONTACT_FILE ACCOUNT CGROUP PROGRAM [ARGS...]`; the error
    /// is the guard's message.
    ///
    /// # Safety
    /// As for [`entry`].
    unsafe fn parse(argc: usize, argv: *mut *const u8) -> Result<Self, &'static [u8]> {
        if argc <= PROGRAM_AT {
            return Err(
                b"usage: mgpu-job-guard AGENT_PID GRACE_MS FENCE_MS CONTACT_FILE ACCOUNT CGROUP PROGRAM [ARGS...]",
            );
        }
        // SAFETY: indices below argc.
        let [agent, grace, fence, contact, account, cgroup] =
            unsafe { [1, 2, 3, 4, 5, 6].map(|i| arg(argv, i)) };
        let Some(agent) = number(agent).and_then(|pid| i32::try_from(pid).ok()) else {
            return Err(b"bad agent pid");
        };
        let Some(grace_ns) = number(grace).map(|ms| ms as i128 * MS) else {
            return Err(b"bad grace");
        };
        let fence_ns = match number(fence) {
            None => return Err(b"bad fence"),
            Some(0) => None,
            Some(ms) => Some(ms as i128 * MS),
        };
        Ok(Settings {
            agent,
            grace_ns,
            fence_ns,
            contact: contact.to_bytes_with_nul(),
            account: account.to_bytes(),
            cgroup_procs: cgroup.to_bytes_with_nul(),
        })
    }
}

/// Switches to `account` (`UID:GID:GROUPS`) unless it is `-`.
fn become_account(account: &[u8]) -> Result<(), &'static [u8]> {
    if account == b"-" {
        return Ok(());
    }
    let mut groups = [0u32; MAX_GROUPS];
    let Some((uid, gid, count)) = parse_account(account, &mut groups) else {
        return Err(b"bad account (UID:GID:GROUPS)");
    };
    if sys::switch_account(uid, gid, &groups[..count]) < 0 {
        return Err(b"cannot switch to the job's account");
    }
    Ok(())
}

/// Blocks the stop signals (see [`STOP_SIGNALS`]) and notes them instead of dying of them,
/// asks for SIGTERM when the agent dies, and refuses to go on when the agent (pid `agent`)
/// is already gone.
fn prepare_for_agent_death(agent: i32) -> Result<(), &'static [u8]> {
    sys::set_signal_mask(STOP_SIGNALS);
    for signal in [SIGTERM, SIGINT, SIGHUP] {
        if sys::set_signal_handler(signal, Some(on_stop_signal)) < 0 {
            return Err(b"cannot handle stop signals");
        }
    }
    // A job on a terminal (`--pty`): what is typed there is for the job. Hanging up the
    // terminal (SIGHUP) still stops it.
    if sys::is_terminal(0) {
        for signal in [SIGINT, SIGQUIT] {
            if sys::set_signal_handler(signal, Some(on_terminal_signal)) < 0 {
                return Err(b"cannot handle terminal signals");
            }
        }
    }
    if sys::set_parent_death_signal(SIGTERM) < 0 {
        return Err(b"cannot ask for a signal on the agent's death");
    }
    // The agent may have died before the line above took effect: then nothing must start.
    if sys::getppid() != agent {
        return Err(b"the agent is gone; not starting the job");
    }
    Ok(())
}

/// Forks the job's process, which runs PROGRAM; returns its pid.
///
/// # Safety
/// As for [`run_program`].
unsafe fn start_job(argv: *mut *const u8, envp: *const *const u8) -> Result<i32, &'static [u8]> {
    match sys::fork() {
        0 => {
            // A stop signal sent before the exec must stop the job, not reach the guard's
            // handler (in this copy of the guard) and vanish: default handling, then unblock.
            for signal in [SIGTERM, SIGINT, SIGHUP, SIGQUIT] {
                sys::set_signal_handler(signal, None);
            }
            sys::set_signal_mask(0);
            // SAFETY: argv from PROGRAM_AT is PROGRAM, ARGS and the NULL; envp as given.
            unsafe { run_program(argv, envp) }
        }
        pid if pid > 0 => Ok(pid as i32),
        _ => Err(b"cannot start the job (fork failed)"),
    }
}

/// Waits for the job to end and returns how to end the same way; stops its group on a stop
/// signal or when fenced: SIGTERM, then SIGKILL once the grace has passed.
fn watch_job(child: i32, settings: &Settings<'_>, contact_fd: Option<i32>) -> i32 {
    let exit_signal = match sys::pidfd_open(child) {
        fd if fd >= 0 => Some(fd as i32),
        // Kernels before 5.3: the guard sleeps between its checks instead.
        _ => None,
    };
    // Checked this often while fencing; the agent's heartbeat margin covers the delay.
    let check_every = settings
        .fence_ns
        .map(|fence| (fence / 8).clamp(20 * MS, 100 * MS));
    let mut stop_deadline: Option<i128> = None;
    loop {
        let mut status = 0;
        match sys::wait_nohang(child, &mut status) {
            ended if ended == child as isize => {
                // Stopped without its agent (dead, or fenced): nothing of the job may outlive
                // this guard, not even what left its group.
                if stop_deadline.is_some() {
                    cgroup::kill(settings.cgroup_procs, SIGKILL);
                }
                return ended_like(status);
            }
            0 => {}
            err if err == -sys::EINTR => {}
            _ => return fail(b"lost track of the job"),
        }
        let fenced = fenced(settings, contact_fd);
        if stop_deadline.is_none() && fenced {
            Message::new()
                .push(b"mgpu: this node has not reached the cluster for longer than ")
                .number((settings.fence_ns.unwrap_or(0) / MS) as u64)
                .push(b" ms; stopping the job, which may already run elsewhere (fenced)\n")
                .send();
        }
        if stop_deadline.is_none() && (STOP.load(Ordering::SeqCst) != 0 || fenced) {
            // Stop the whole group (this guard only notes its own copy: the handler is set),
            // and what left it.
            cgroup::kill(settings.cgroup_procs, SIGTERM);
            sys::kill(-sys::getpgrp(), SIGTERM);
            stop_deadline = Some(sys::clock_ns(sys::CLOCK_MONOTONIC) + settings.grace_ns);
        }
        let now = sys::clock_ns(sys::CLOCK_MONOTONIC);
        let timeout = match stop_deadline {
            Some(deadline) => {
                if now >= deadline {
                    // What left the group (a daemon, `setsid`) first, then the group, which
                    // takes this guard down too; the agent (if alive) sees signal 9.
                    cgroup::kill(settings.cgroup_procs, SIGKILL);
                    sys::kill(-sys::getpgrp(), SIGKILL);
                }
                Some(20 * MS)
            }
            None => check_every,
        };
        // Without a pidfd, only time tells: look again soon.
        let timeout = match exit_signal {
            Some(_) => timeout,
            None => Some(timeout.unwrap_or(100 * MS).min(100 * MS)),
        };
        sys::wait_readable(exit_signal, timeout, !STOP_SIGNALS);
    }
}

/// Whether CONTACT_FILE (touched by the agent whenever JetStream stored its heartbeat) is
/// older than the fence.
fn fenced(settings: &Settings<'_>, contact_fd: Option<i32>) -> bool {
    let Some(after) = settings.fence_ns else {
        return false;
    };
    let touched = match contact_fd {
        Some(fd) => sys::modified_ns_of(fd),
        None => sys::modified_ns(settings.contact),
    };
    match touched {
        Some(touched) => sys::clock_ns(sys::CLOCK_REALTIME) - touched > after,
        // A contact file that cannot be read keeps the job: fencing on a missing file would
        // turn an operator's mistake into lost work.
        None => false,
    }
}

/// `UID:GID:G1,G2,...` into (uid, gid, number of groups written to `groups`).
fn parse_account(text: &[u8], groups: &mut [u32; MAX_GROUPS]) -> Option<(u32, u32, usize)> {
    let text = core::str::from_utf8(text).ok()?;
    let mut parts = text.splitn(3, ':');
    let uid = parts.next()?.parse().ok()?;
    let gid = parts.next()?.parse().ok()?;
    let mut count = 0;
    for group in parts.next()?.split(',').filter(|g| !g.is_empty()) {
        *groups.get_mut(count)? = group.parse().ok()?;
        count += 1;
    }
    Some((uid, gid, count))
}

/// Ends this process the way the job ended (wait status `status`): same exit code, or the same
/// signal, so the agent reports the same thing.
fn ended_like(status: i32) -> i32 {
    let signal = status & 0x7f;
    if signal == 0 {
        return (status >> 8) & 0xff;
    }
    sys::set_signal_handler(signal, None);
    sys::set_signal_mask(0);
    sys::kill(sys::getpid(), signal);
    // A signal whose default is not to end a process cannot have ended the job; kept total.
    128 + signal
}

/// The job's process: runs PROGRAM (argv index [`PROGRAM_AT`]) with its arguments and the
/// guard's environment, looked up on `PATH` like a shell does; a file the kernel cannot run (a
/// script without `#!`) runs under `/bin/sh`, as `execvp` does. Ends with 127 or 126 and a message if
/// nothing can run.
///
/// # Safety
/// As for [`entry`], with argc above [`PROGRAM_AT`].
unsafe fn run_program(argv: *mut *const u8, envp: *const *const u8) -> ! {
    // SAFETY: PROGRAM_AT is below argc.
    let program = unsafe { arg(argv, PROGRAM_AT) };
    let name = program.to_bytes();
    if name.contains(&b'/') || name.is_empty() {
        // SAFETY: as the caller promised.
        let err = unsafe { try_run(program.as_ptr() as *const u8, argv, envp) };
        let message: &[u8] = match err {
            e if e == -sys::ENOENT || e == -sys::ENOTDIR => b": No such file or directory\n",
            e if e == -sys::EACCES => b": Permission denied\n",
            _ => b": cannot be run\n",
        };
        Message::new()
            .push(b"mgpu: ")
            .push(name)
            .push(message)
            .send();
        let not_there = err == -sys::ENOENT || err == -sys::ENOTDIR;
        sys::exit(if not_there { NOT_FOUND } else { NOT_RUNNABLE });
    }
    // SAFETY: envp is NULL-terminated.
    let path = unsafe { variable(envp, b"PATH=") }.unwrap_or(DEFAULT_PATH);
    let mut denied = false;
    for dir in path.split(|b| *b == b':') {
        let dir: &[u8] = if dir.is_empty() { b"." } else { dir };
        let mut candidate = [0u8; 4096];
        let len = dir.len() + 1 + name.len();
        if len >= candidate.len() {
            continue;
        }
        candidate[..dir.len()].copy_from_slice(dir);
        candidate[dir.len()] = b'/';
        candidate[dir.len() + 1..len].copy_from_slice(name);
        // SAFETY: candidate is NUL-terminated (zeroed past len); argv and envp as promised.
        let err = unsafe { try_run(candidate.as_ptr(), argv, envp) };
        if err == -sys::EACCES {
            denied = true;
        } else if err != -sys::ENOENT && err != -sys::ENOTDIR {
            break;
        }
    }
    let (message, code): (&[u8], i32) = if denied {
        (b": Permission denied\n", NOT_RUNNABLE)
    } else {
        (b": command not found\n", NOT_FOUND)
    };
    Message::new()
        .push(b"mgpu: ")
        .push(name)
        .push(message)
        .send();
    sys::exit(code)
}

/// Runs `path` with argv from [`PROGRAM_AT`] (under `/bin/sh` if the kernel cannot run it);
/// returns only when `path` cannot be run, with `-errno`.
///
/// # Safety
/// `path` NUL-terminated; argv and envp as for [`run_program`].
unsafe fn try_run(path: *const u8, argv: *mut *const u8, envp: *const *const u8) -> isize {
    // SAFETY: as the caller promised.
    let err = unsafe { sys::execve(path, argv.add(PROGRAM_AT), envp) };
    if err != -sys::ENOEXEC {
        return err;
    }
    // `sh PATH ARGS...`: the two slots before ARGS are the guard's own (CGROUP and
    // PROGRAM), which this process no longer needs.
    let shell_at = PROGRAM_AT - 1;
    // SAFETY: both indices exist (argc > PROGRAM_AT); the strings are NUL-terminated.
    unsafe {
        *argv.add(shell_at) = c"/bin/sh".as_ptr() as *const u8;
        *argv.add(PROGRAM_AT) = path;
        sys::execve(*argv.add(shell_at), argv.add(shell_at), envp);
    }
    // argv no longer names the program: no other candidate can be tried.
    Message::new()
        .push(b"mgpu: cannot run /bin/sh for a file without #!\n")
        .send();
    sys::exit(NOT_RUNNABLE)
}

/// The value of the variable starting `prefix` (`NAME=`) in `envp`.
///
/// # Safety
/// `envp` must be a NULL-terminated array of NUL-terminated strings.
unsafe fn variable<'a>(envp: *const *const u8, prefix: &[u8]) -> Option<&'a [u8]> {
    let mut entry = envp;
    // SAFETY: walking the array up to its NULL.
    unsafe {
        while !(*entry).is_null() {
            let text = CStr::from_ptr(*entry as *const core::ffi::c_char).to_bytes();
            if let Some(value) = text.strip_prefix(prefix) {
                return Some(value);
            }
            entry = entry.add(1);
        }
    }
    None
}
