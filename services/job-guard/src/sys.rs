//! The Linux system calls the guard makes, as raw `syscall` instructions (x86_64), and the
//! little of the C runtime that compiled Rust code still expects (`memcpy` and friends).
//!
//! Every call returns the kernel's answer unchanged: a non-negative result, or `-errno`;
//! times are [`Duration`]s, as the guard's rules (`mgpu-guard-rules`) take them.

use core::arch::{asm, global_asm};
use core::time::Duration;

pub const EINTR: isize = 4;
pub const ENOENT: isize = 2;
pub const ENOEXEC: isize = 8;
pub const EACCES: isize = 13;
pub const ENOTDIR: isize = 20;

const SYS_READ: usize = 0;
const SYS_WRITE: usize = 1;
const SYS_CLOSE: usize = 3;
const SYS_DUP2: usize = 33;
const SYS_CHDIR: usize = 80;
const SYS_FSTAT: usize = 5;
const SYS_IOCTL: usize = 16;
const SYS_RT_SIGACTION: usize = 13;
const SYS_RT_SIGPROCMASK: usize = 14;
const SYS_GETPID: usize = 39;
const SYS_FORK: usize = 57;
const SYS_EXECVE: usize = 59;
const SYS_WAIT4: usize = 61;
const SYS_KILL: usize = 62;
const SYS_SETUID: usize = 105;
const SYS_SETGID: usize = 106;
const SYS_GETPPID: usize = 110;
const SYS_GETPGRP: usize = 111;
const SYS_GETPGID: usize = 121;
const SYS_SETGROUPS: usize = 116;
const SYS_PRCTL: usize = 157;
const SYS_CLOCK_GETTIME: usize = 228;
const SYS_EXIT_GROUP: usize = 231;
const SYS_NEWFSTATAT: usize = 262;
const SYS_PPOLL: usize = 271;
const SYS_OPENAT: usize = 257;
const SYS_PIDFD_OPEN: usize = 434;

const SA_RESTORER: u64 = 0x0400_0000;
const SIG_DFL: usize = 0;
const SIG_SETMASK: usize = 2;
const PR_SET_PDEATHSIG: usize = 1;
const WNOHANG: usize = 1;
const AT_FDCWD: isize = -100;
const O_RDONLY_CLOEXEC: usize = 0o2_000_000;
const O_WRONLY_CLOEXEC: usize = 0o2_000_001;
const POLLIN: i16 = 1;
pub const CLOCK_REALTIME: usize = 0;
pub const CLOCK_MONOTONIC: usize = 1;

/// # Safety
/// The arguments must be what system call `number` expects (pointers valid for it).
unsafe fn syscall6(number: usize, args: [usize; 6]) -> isize {
    let result: isize;
    // SAFETY: the caller vouches for the arguments; `syscall` clobbers rcx and r11 only.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") number as isize => result,
            in("rdi") args[0],
            in("rsi") args[1],
            in("rdx") args[2],
            in("r10") args[3],
            in("r8") args[4],
            in("r9") args[5],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    result
}

/// A system call whose arguments are plain numbers: it reads and writes no memory of ours.
fn plain(number: usize, a: usize, b: usize, c: usize) -> isize {
    // SAFETY: only called (below) for calls that take no pointers.
    unsafe { syscall6(number, [a, b, c, 0, 0, 0]) }
}

pub fn write(fd: i32, bytes: &[u8]) -> isize {
    // SAFETY: the kernel reads `bytes.len()` bytes from a live slice.
    unsafe {
        syscall6(
            SYS_WRITE,
            [fd as usize, bytes.as_ptr() as usize, bytes.len(), 0, 0, 0],
        )
    }
}

/// Reads into `buffer`: the bytes read, 0 at the end, or `-errno`.
pub fn read(fd: i32, buffer: &mut [u8]) -> isize {
    // SAFETY: the kernel writes at most `buffer.len()` bytes into a live slice.
    unsafe {
        syscall6(
            SYS_READ,
            [
                fd as usize,
                buffer.as_mut_ptr() as usize,
                buffer.len(),
                0,
                0,
                0,
            ],
        )
    }
}

pub fn close(fd: i32) -> isize {
    plain(SYS_CLOSE, fd as usize, 0, 0)
}

/// Makes `to` a copy of `from` (inherited across exec whatever `from`'s flag).
pub fn dup2(from: i32, to: i32) -> isize {
    plain(SYS_DUP2, from as usize, to as usize, 0)
}

/// Enters the NUL-terminated directory `path`: 0, or `-errno`.
pub fn chdir(path: &[u8]) -> isize {
    if path.last() != Some(&0) {
        return -ENOENT;
    }
    // SAFETY: `path` is NUL-terminated.
    unsafe { syscall6(SYS_CHDIR, [path.as_ptr() as usize, 0, 0, 0, 0, 0]) }
}

pub fn exit(code: i32) -> ! {
    plain(SYS_EXIT_GROUP, code as usize, 0, 0);
    // exit_group does not return; the loop only satisfies the type.
    loop {
        core::hint::spin_loop();
    }
}

pub fn getpid() -> i32 {
    plain(SYS_GETPID, 0, 0, 0) as i32
}

/// Whether `fd` is a terminal (it answers the terminal-settings query, as `isatty` asks).
pub fn is_terminal(fd: i32) -> bool {
    const TCGETS: usize = 0x5401;
    // Larger than the kernel's `struct termios` (60 bytes on x86_64).
    let mut settings = [0u8; 64];
    // SAFETY: TCGETS writes one `struct termios` into a live buffer large enough for it.
    unsafe {
        syscall6(
            SYS_IOCTL,
            [fd as usize, TCGETS, settings.as_mut_ptr() as usize, 0, 0, 0],
        ) == 0
    }
}

pub fn getppid() -> i32 {
    plain(SYS_GETPPID, 0, 0, 0) as i32
}

pub fn getpgrp() -> i32 {
    plain(SYS_GETPGRP, 0, 0, 0) as i32
}

/// The process group of `pid`; negative when it is gone.
pub fn getpgid(pid: i32) -> i32 {
    plain(SYS_GETPGID, pid as usize, 0, 0) as i32
}

/// `kill(pid, signal)`; a negative pid names a process group.
pub fn kill(pid: i32, signal: i32) -> isize {
    plain(SYS_KILL, pid as isize as usize, signal as usize, 0)
}

/// Switches this process (its only thread: the kernel call, unlike the C library's, changes
/// the calling thread alone) to supplementary groups `groups`, group `gid`, user `uid`, in the
/// order that works when dropping root. The first failure's `-errno`.
pub fn switch_account(uid: u32, gid: u32, groups: &[u32]) -> isize {
    // SAFETY: the kernel reads `groups.len()` gids from a live slice.
    let result = unsafe {
        syscall6(
            SYS_SETGROUPS,
            [groups.len(), groups.as_ptr() as usize, 0, 0, 0, 0],
        )
    };
    if result < 0 {
        return result;
    }
    let result = plain(SYS_SETGID, gid as usize, 0, 0);
    if result < 0 {
        return result;
    }
    plain(SYS_SETUID, uid as usize, 0, 0)
}

pub fn set_parent_death_signal(signal: i32) -> isize {
    plain(SYS_PRCTL, PR_SET_PDEATHSIG, signal as usize, 0)
}

/// A copy of this process; 0 in the child, the child's pid in the parent.
pub fn fork() -> isize {
    plain(SYS_FORK, 0, 0, 0)
}

/// # Safety
/// `path` must be NUL-terminated; `argv` and `envp` NULL-terminated arrays of such strings.
pub unsafe fn execve(path: *const u8, argv: *const *const u8, envp: *const *const u8) -> isize {
    // SAFETY: as the caller promised.
    unsafe {
        syscall6(
            SYS_EXECVE,
            [path as usize, argv as usize, envp as usize, 0, 0, 0],
        )
    }
}

/// `wait4(pid, &status, WNOHANG)`: the pid once it ended (with its wait status), 0 while it
/// runs, or `-errno`.
pub fn wait_nohang(pid: i32, status: &mut i32) -> isize {
    // SAFETY: the kernel writes one int into `status`.
    unsafe {
        syscall6(
            SYS_WAIT4,
            [pid as usize, status as *mut i32 as usize, WNOHANG, 0, 0, 0],
        )
    }
}

pub fn pidfd_open(pid: i32) -> isize {
    plain(SYS_PIDFD_OPEN, pid as usize, 0, 0)
}

/// A `struct timespec` as a [`Duration`] since its clock's zero; a time before it (a file
/// touched before 1970) as zero.
fn since_zero(seconds: i64, nanoseconds: i64) -> Duration {
    let seconds = Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
    seconds.saturating_add(Duration::from_nanos(
        u64::try_from(nanoseconds).unwrap_or(0),
    ))
}

/// The time on `clock`.
pub fn clock(clock: usize) -> Duration {
    let mut time = [0i64; 2];
    // SAFETY: the kernel writes one `struct timespec` (two longs).
    unsafe {
        syscall6(
            SYS_CLOCK_GETTIME,
            [clock, time.as_mut_ptr() as usize, 0, 0, 0, 0],
        );
    }
    since_zero(time[0], time[1])
}

/// The x86_64 `struct stat`, of which the guard reads the modification time.
#[repr(C)]
struct Stat {
    before_mtime: [u64; 11],
    mtime_sec: i64,
    mtime_nsec: i64,
    after: [u64; 5],
}

impl Stat {
    fn new() -> Self {
        Stat {
            before_mtime: [0; 11],
            mtime_sec: 0,
            mtime_nsec: 0,
            after: [0; 5],
        }
    }

    fn mtime(&self) -> Duration {
        since_zero(self.mtime_sec, self.mtime_nsec)
    }
}

/// Writes `bytes` to the existing file at the NUL-terminated `path` (a cgroup's
/// `cgroup.procs`): the bytes written, or `-errno`.
pub fn write_file(path: &[u8], bytes: &[u8]) -> isize {
    if path.last() != Some(&0) {
        return -ENOENT;
    }
    // SAFETY: `path` is NUL-terminated.
    let fd = unsafe {
        syscall6(
            SYS_OPENAT,
            [
                AT_FDCWD as usize,
                path.as_ptr() as usize,
                O_WRONLY_CLOEXEC,
                0,
                0,
                0,
            ],
        )
    };
    if fd < 0 {
        return fd;
    }
    let written = write(fd as i32, bytes);
    close(fd as i32);
    written
}

/// Opens the NUL-terminated `path` for reading (closed on exec): the descriptor, or `-errno`.
pub fn open_read(path: &[u8]) -> isize {
    if path.last() != Some(&0) {
        return -ENOENT;
    }
    // SAFETY: `path` is NUL-terminated.
    unsafe {
        syscall6(
            SYS_OPENAT,
            [
                AT_FDCWD as usize,
                path.as_ptr() as usize,
                O_RDONLY_CLOEXEC,
                0,
                0,
                0,
            ],
        )
    }
}

/// The modification time of the file open as `fd`, since the epoch.
pub fn modified_of(fd: i32) -> Option<Duration> {
    let mut stat = Stat::new();
    // SAFETY: the kernel writes one `struct stat`.
    let result = unsafe {
        syscall6(
            SYS_FSTAT,
            [fd as usize, &mut stat as *mut Stat as usize, 0, 0, 0, 0],
        )
    };
    (result == 0).then(|| stat.mtime())
}

/// The modification time of the NUL-terminated `path`, since the epoch.
pub fn modified(path: &[u8]) -> Option<Duration> {
    if path.last() != Some(&0) {
        return None;
    }
    let mut stat = Stat::new();
    // SAFETY: `path` is NUL-terminated; the kernel writes one `struct stat`.
    let result = unsafe {
        syscall6(
            SYS_NEWFSTATAT,
            [
                AT_FDCWD as usize,
                path.as_ptr() as usize,
                &mut stat as *mut Stat as usize,
                0,
                0,
                0,
            ],
        )
    };
    (result == 0).then(|| stat.mtime())
}

/// Sets the blocked signals to `mask` (bit `n - 1` for signal `n`).
pub fn set_signal_mask(mask: u64) {
    // SAFETY: the kernel reads one 8-byte mask.
    unsafe {
        syscall6(
            SYS_RT_SIGPROCMASK,
            [SIG_SETMASK, &mask as *const u64 as usize, 0, 8, 0, 0],
        );
    }
}

pub const fn signal_bit(signal: i32) -> u64 {
    1 << (signal - 1)
}

/// The kernel's `struct sigaction` on x86_64.
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

unsafe extern "C" {
    /// Returns from a signal handler (defined below): x86_64 needs one from user space.
    fn mgpu_guard_restore_rt();
}

global_asm!(
    ".globl mgpu_guard_restore_rt",
    "mgpu_guard_restore_rt:",
    "mov rax, 15",
    "syscall",
);

/// Runs `handler` on `signal`, with every signal blocked while it runs; None restores the
/// default disposition.
pub fn set_signal_handler(signal: i32, handler: Option<extern "C" fn(i32)>) -> isize {
    let action = KernelSigaction {
        handler: handler.map_or(SIG_DFL, |h| h as *const () as usize),
        flags: SA_RESTORER,
        restorer: mgpu_guard_restore_rt as *const () as usize,
        mask: u64::MAX,
    };
    // SAFETY: the kernel reads one `struct sigaction`; the handler and the restorer are
    // functions of this program.
    unsafe {
        syscall6(
            SYS_RT_SIGACTION,
            [
                signal as usize,
                &action as *const KernelSigaction as usize,
                0,
                8,
                0,
                0,
            ],
        )
    }
}

/// Waits until `fd` (when there is one) is readable, `timeout` passed (None: no limit) or a
/// signal arrived, with the blocked signals set to `mask` while it waits (atomically, so a
/// signal that comes just before the wait still ends it).
pub fn wait_readable(fd: Option<i32>, timeout: Option<Duration>, mask: u64) {
    #[repr(C)]
    struct PollFd {
        fd: i32,
        events: i16,
        revents: i16,
    }
    let mut poll = PollFd {
        fd: fd.unwrap_or(-1),
        events: POLLIN,
        revents: 0,
    };
    let timeout = timeout.map(|t| {
        let seconds = i64::try_from(t.as_secs()).unwrap_or(i64::MAX);
        [seconds, i64::from(t.subsec_nanos())]
    });
    let timeout_ptr = timeout.as_ref().map_or(0, |t| t.as_ptr() as usize);
    // SAFETY: one pollfd (a negative fd is ignored by the kernel), an optional timespec and
    // an 8-byte mask, all alive across the call.
    unsafe {
        syscall6(
            SYS_PPOLL,
            [
                &mut poll as *mut PollFd as usize,
                1,
                timeout_ptr,
                &mask as *const u64 as usize,
                8,
                0,
            ],
        );
    }
}

// The compiler lowers copies and comparisons to these; with no C library, the guard brings
// them. `rep movsb` / `rep stosb` are not loops the compiler could turn back into calls.

/// # Safety
/// As C's `memcpy`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcpy(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller passes valid, non-overlapping regions of `n` bytes.
    unsafe {
        asm!("rep movsb", inout("rcx") n => _, inout("rdi") dest => _, inout("rsi") src => _,
             options(nostack, preserves_flags));
    }
    dest
}

/// # Safety
/// As C's `memmove`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memmove(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dest as usize) <= (src as usize) || (dest as usize) >= (src as usize).wrapping_add(n) {
        // SAFETY: a forward copy never overwrites bytes it has still to read here.
        return unsafe { memcpy(dest, src, n) };
    }
    // SAFETY: copying backwards (direction flag set, then cleared as the ABI requires).
    unsafe {
        asm!("std", "rep movsb", "cld",
             inout("rcx") n => _,
             inout("rdi") dest.add(n - 1) => _,
             inout("rsi") src.add(n - 1) => _,
             options(nostack));
    }
    dest
}

/// # Safety
/// As C's `memset`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memset(dest: *mut u8, value: i32, n: usize) -> *mut u8 {
    // SAFETY: the caller passes a valid region of `n` bytes.
    unsafe {
        asm!("rep stosb", inout("rcx") n => _, inout("rdi") dest => _, in("al") value as u8,
             options(nostack, preserves_flags));
    }
    dest
}

/// # Safety
/// As C's `memcmp`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut i = 0;
    while i < n {
        // SAFETY: both regions hold `n` bytes; volatile keeps this a loop, not a call.
        let (x, y) = unsafe { (a.add(i).read_volatile(), b.add(i).read_volatile()) };
        if x != y {
            return x as i32 - y as i32;
        }
        i += 1;
    }
    0
}

/// # Safety
/// As C's `strlen`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strlen(text: *const u8) -> usize {
    let mut len = 0;
    // SAFETY: the caller passes a NUL-terminated string; volatile keeps this a loop.
    while unsafe { text.add(len).read_volatile() } != 0 {
        len += 1;
    }
    len
}

/// # Safety
/// As C's `bcmp`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: as the caller promised.
    unsafe { memcmp(a, b, n) }
}

/// The unwinder's entry point, which the precompiled `core` names. The guard is built with
/// `panic = "abort"`: nothing ever unwinds, so nothing ever calls it.
#[unsafe(no_mangle)]
pub extern "C" fn rust_eh_personality() {}
