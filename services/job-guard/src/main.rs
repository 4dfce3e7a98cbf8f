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
//! What to do and when (the command line, when to stop the group, the kill sequence, how to
//! end) is `mgpu-guard-rules`, which the agent's built-in guard (`mgpu-node __mgpu-job-guard`,
//! used where this binary is missing) drives too; this program is its driver on raw system
//! calls: it reads the clocks and the contact file, waits on the job and on signals, and
//! carries out the rules' commands. It does so without the standard library or a C library: a
//! job's start pays for its guard's, and a start through the C library and the agent's 70 MB
//! binary cost about a millisecond of CPU on a virtual machine (dynamic linking, and
//! CPU-feature probing that traps to the hypervisor), against a few dozen microseconds here.

#![no_std]
#![no_main]

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
compile_error!(
    "mgpu-job-guard speaks to Linux on x86_64 only; elsewhere the agent uses its built-in \
     guard (scripts/setup.sh does not build this crate there)"
);

mod cgroup;
mod pooled;
mod sys;

use core::arch::global_asm;
use core::ffi::CStr;
use core::sync::atomic::{AtomicI32, Ordering};
use core::time::Duration;

use mgpu_guard_rules::args::{self, AccountIds, parse_account};
use mgpu_guard_rules::machine::FENCED_MESSAGE;
use mgpu_guard_rules::signal::{self, SIGQUIT};
use mgpu_guard_rules::{ArgumentError, Arguments, Command, Contact, Guard, JobEnd, Look, exit};

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
const NOT_FOUND: i32 = exit::NOT_FOUND as i32;
/// Exit code for a program found but not runnable (as a shell says).
const NOT_RUNNABLE: i32 = exit::NOT_RUNNABLE as i32;
/// Where PROGRAM is in argv; the guard's own arguments come before it, after argv[0].
const PROGRAM_AT: usize = 1 + args::PROGRAM_AT;
/// Supplementary groups an account may have here; more is refused.
const MAX_GROUPS: usize = 1024;
/// Where a program is looked up when the job has no `PATH`.
const DEFAULT_PATH: &[u8] = b"/usr/local/bin:/usr/bin:/bin";
/// Without a pidfd (kernels before 5.3) only time tells that the job ended: the guard looks
/// at least this often.
const PAUSE_WITHOUT_PIDFD: Duration = Duration::from_millis(100);

/// The stop signal received, 0 while none.
static STOP: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(signal: i32) {
    STOP.store(signal, Ordering::SeqCst);
}

/// For the keys a terminal turns into signals (Ctrl+C, Ctrl+\): they are the job's, so the
/// guard, in the same foreground group, neither stops nor dies of them. A handler rather
/// than "ignore", since the job would inherit an ignored signal.
extern "C" fn on_terminal_signal(_: i32) {}

/// The stop signals ([`signal::STOP`]): blocked except while the guard waits, so none comes
/// between a look and the wait and goes unnoticed until the job ends.
const STOP_SIGNALS: u64 = {
    let mut mask = 0;
    let mut at = 0;
    while at < signal::STOP.len() {
        mask |= sys::signal_bit(signal::STOP[at]);
        at += 1;
    }
    mask
};

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
    fail_with(reason, b"")
}

fn fail_with(reason: &[u8], detail: &[u8]) -> i32 {
    Message::new()
        .push(b"mgpu job guard: ")
        .push(reason)
        .push(detail)
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
    // SAFETY: index 1 is below argc where checked.
    if argc == 4 && unsafe { arg(argv, 1) }.to_bytes() == mgpu_guard_rules::pooled::FLAG {
        // SAFETY: indices 2 and 3 are below argc; this is the process's only thread.
        return unsafe { pooled::wait_for_job(arg(argv, 2).to_bytes(), arg(argv, 3).to_bytes()) };
    }
    // SAFETY: as the caller promised.
    let settings = match unsafe { Settings::parse(argc, argv) } {
        Ok(settings) => settings,
        Err(ArgumentError::Usage) => {
            return fail_with(b"usage: mgpu-job-guard ", args::USAGE.as_bytes());
        }
        Err(error) => return fail(error.message().as_bytes()),
    };
    // Opened while the guard may still be root: a root agent's state directory is usually one
    // the job's account cannot enter. The agent touches this same file (it never replaces it).
    let contact_fd = match settings
        .contact
        .map(|path| sys::open_read(path.to_bytes_with_nul()))
    {
        Some(fd) if fd >= 0 => Some(fd as i32),
        _ => None,
    };
    // Joined while the guard may still be root (the agent made the cgroup, as root): the job it
    // forks starts inside, and so does everything the job starts.
    if !cgroup::join(&settings.args.cgroup) {
        return fail(b"cannot move into the job's cgroup");
    }
    // From here on nothing runs with more rights than the job has.
    if let Some(Err(reason)) = settings.args.account.map(become_account) {
        return fail(reason);
    }
    if let Err(reason) = prepare_for_agent_death(settings.args.agent) {
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
    args: Arguments<'a>,
    /// CONTACT_FILE, NUL-terminated for the kernel, when the guard fences.
    contact: Option<&'a CStr>,
}

impl Settings<'_> {
    /// [`Arguments`] from argv.
    ///
    /// # Safety
    /// As for [`entry`].
    unsafe fn parse(argc: usize, argv: *mut *const u8) -> Result<Self, ArgumentError> {
        if argc <= PROGRAM_AT {
            return Err(ArgumentError::Usage);
        }
        // SAFETY: indices below argc (AGENT_PID to PROGRAM).
        let given = unsafe { [1, 2, 3, 4, 5, 6, 7].map(|i| arg(argv, i)) };
        let args = Arguments::parse(&given.map(CStr::to_bytes))?;
        let contact = args
            .fence
            .and_then(|_| given.get(args::CONTACT_AT).copied());
        Ok(Settings { args, contact })
    }
}

/// Switches to `account` (`UID:GID:GROUPS`).
fn become_account(account: &[u8]) -> Result<(), &'static [u8]> {
    let mut groups = [0u32; MAX_GROUPS];
    let Some(AccountIds {
        uid,
        gid,
        groups: count,
    }) = parse_account(account, &mut groups)
    else {
        return Err(b"bad account (UID:GID:GROUPS)");
    };
    let Some(groups) = groups.get(..count) else {
        return Err(b"bad account (UID:GID:GROUPS)");
    };
    if sys::switch_account(uid, gid, groups) < 0 {
        return Err(b"cannot switch to the job's account");
    }
    Ok(())
}

/// Blocks the stop signals (see [`STOP_SIGNALS`]) and notes them instead of dying of them,
/// asks for SIGTERM when the agent dies, and refuses to go on when the agent (pid `agent`)
/// is already gone.
fn prepare_for_agent_death(agent: i32) -> Result<(), &'static [u8]> {
    sys::set_signal_mask(STOP_SIGNALS);
    for stop in signal::STOP {
        if sys::set_signal_handler(stop, Some(on_stop_signal)) < 0 {
            return Err(b"cannot handle stop signals");
        }
    }
    // A job on a terminal (`--pty`): what is typed there is for the job. Hanging up the
    // terminal (SIGHUP) still stops it.
    if sys::is_terminal(0) {
        for key in signal::TERMINAL_KEYS {
            if sys::set_signal_handler(key, Some(on_terminal_signal)) < 0 {
                return Err(b"cannot handle terminal signals");
            }
        }
    }
    if sys::set_parent_death_signal(signal::AGENT_DIED) < 0 {
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
            for handled in signal::STOP.into_iter().chain([SIGQUIT]) {
                sys::set_signal_handler(handled, None);
            }
            sys::set_signal_mask(0);
            // SAFETY: argv from PROGRAM_AT is PROGRAM, ARGS and the NULL; envp as given.
            unsafe { run_program(argv, envp) }
        }
        pid if pid > 0 => Ok(pid as i32),
        _ => Err(b"cannot start the job (fork failed)"),
    }
}

/// Waits for the job to end and returns how to end the same way, stopping its group when the
/// rules say: a [`Guard`] driven by what the clocks, the contact file, the stop signals and
/// the job's end say.
fn watch_job(child: i32, settings: &Settings<'_>, contact_fd: Option<i32>) -> i32 {
    let exit_signal = match sys::pidfd_open(child) {
        fd if fd >= 0 => Some(fd as i32),
        // Kernels before 5.3: the guard sleeps between its looks instead.
        _ => None,
    };
    let mut guard = Guard::new(settings.args.grace, settings.args.fence.map(|f| f.after));
    loop {
        let mut status = 0;
        let commands = match sys::wait_nohang(child, &mut status) {
            ended if ended == child as isize => guard.job_ended(JobEnd::from_wait_status(status)),
            running if running == 0 || running == -sys::EINTR => {
                guard.look(look(&guard, settings, contact_fd))
            }
            _ => return fail(b"lost track of the job"),
        };
        for command in &commands {
            if let Some(code) = carry_out(*command, settings, exit_signal) {
                return code;
            }
        }
    }
}

/// What the guard sees now of a job that has not ended.
fn look(guard: &Guard, settings: &Settings<'_>, contact_fd: Option<i32>) -> Look {
    let contact = if guard.reads_contact() {
        read_contact(settings, contact_fd)
    } else {
        Contact::NotRead
    };
    Look {
        now: sys::clock(sys::CLOCK_MONOTONIC),
        stop_signal: STOP.load(Ordering::SeqCst) != 0,
        contact,
    }
}

/// When CONTACT_FILE (touched by the agent whenever JetStream stored its heartbeat) was last
/// touched: through the descriptor opened at the start, else by its path.
fn read_contact(settings: &Settings<'_>, contact_fd: Option<i32>) -> Contact {
    let touched = match (contact_fd, settings.contact) {
        (Some(fd), _) => sys::modified_of(fd),
        (None, Some(path)) => sys::modified(path.to_bytes_with_nul()),
        (None, None) => None,
    };
    match touched {
        Some(stored) => Contact::StoredAt {
            stored,
            now: sys::clock(sys::CLOCK_REALTIME),
        },
        None => Contact::Unreadable,
    }
}

/// Carries out one of the rules' commands; the exit code when it ends the guard.
fn carry_out(command: Command, settings: &Settings<'_>, exit_signal: Option<i32>) -> Option<i32> {
    match command {
        Command::AnnounceFence { after_ms } => Message::new()
            .push(FENCED_MESSAGE[0].as_bytes())
            .number(after_ms)
            .push(FENCED_MESSAGE[1].as_bytes())
            .send(),
        Command::SignalCgroup(signal) => cgroup::kill(settings.args.cgroup.members(), signal),
        Command::SignalGroup(signal) => {
            sys::kill(-sys::getpgrp(), signal);
        }
        Command::Wait { at_most } => {
            // Without a pidfd, only time tells: look again soon.
            let at_most = match exit_signal {
                Some(_) => at_most,
                None => Some(at_most.map_or(PAUSE_WITHOUT_PIDFD, |t| t.min(PAUSE_WITHOUT_PIDFD))),
            };
            sys::wait_readable(exit_signal, at_most, !STOP_SIGNALS);
        }
        Command::Exit(code) => return Some(i32::from(code)),
        Command::DieBy { signal, otherwise } => {
            sys::set_signal_handler(signal, None);
            sys::set_signal_mask(0);
            sys::kill(sys::getpid(), signal);
            return Some(i32::from(otherwise));
        }
    }
    None
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
