//! `mgpu-job-guard --pooled AGENT_PID CGROUP`: a guard started before its job, so that the
//! move into the job's cgroup (which may wait for the kernel's read-copy-update grace period)
//! is paid ahead of time. It moves in, then reads its job's start message on its standard
//! input (`mgpu_guard_rules::pooled`: directory, command line, environment), enters the
//! directory, puts `/dev/null` on its standard input and executes the guard with that command
//! line and environment. The exec keeps the cgroup; the guard it becomes does the rest as any
//! other. Nothing at all on its input (the agent gave it up): it ends quietly.

use core::cell::UnsafeCell;

use mgpu_guard_rules::Cgroup;
use mgpu_guard_rules::pooled::{ITEMS_MAX, MESSAGE_MAX, StartError, parse};
use mgpu_guard_rules::signal::SIGKILL;

use crate::{cgroup, fail, fail_with, sys};

/// Memory the guard's one thread writes while waiting (static: no allocator here; in the
/// zeroed data, so only the pages a message fills are ever touched).
struct Scratch<T>(UnsafeCell<T>);

// SAFETY: the guard has a single thread, and `wait_for_job` is entered once.
unsafe impl<T> Sync for Scratch<T> {}

static MESSAGE: Scratch<[u8; MESSAGE_MAX]> = Scratch(UnsafeCell::new([0; MESSAGE_MAX]));
/// The pointers of argv and envp, each array ending with a NULL.
static POINTERS: Scratch<[usize; ITEMS_MAX + 2]> = Scratch(UnsafeCell::new([0; ITEMS_MAX + 2]));

/// Waits for the job and becomes its guard; returns only on failure (the exit code).
///
/// # Safety
/// Called once, on the guard's only thread.
pub unsafe fn wait_for_job(agent: &[u8], cgroup_list: &[u8]) -> i32 {
    let Some(agent) = pid(agent) else {
        return fail(b"bad AGENT_PID");
    };
    // A pooled guard holds no job yet: if the agent dies, it simply goes.
    sys::set_parent_death_signal(SIGKILL);
    if sys::getppid() != agent {
        return fail(b"the agent is gone");
    }
    if !cgroup::join(&Cgroup::Join(cgroup_list)) {
        return fail(b"cannot move into the job's cgroup");
    }
    // SAFETY: entered once, on the only thread: nothing else refers to the scratch memory.
    let (message, pointers) = unsafe { (&mut *MESSAGE.0.get(), &mut *POINTERS.0.get()) };
    let length = match read_all(message) {
        Ok(length) => length,
        Err(reason) => return fail(reason),
    };
    let Some(message) = message.get(..length) else {
        return fail(b"a malformed start message");
    };
    let start = match parse(message) {
        Ok(start) => start,
        Err(StartError::Empty) => return 0,
        Err(error) => return fail(error.message().as_bytes()),
    };
    let envp_at = start.argc + 1;
    for (index, item) in start.items_with_nul().enumerate() {
        let at = if index < start.argc { index } else { index + 1 };
        if let Some(slot) = pointers.get_mut(at) {
            *slot = item.as_ptr() as usize;
        }
    }
    let items = start.items_with_nul().count();
    for end in [start.argc, items + 1] {
        if let Some(slot) = pointers.get_mut(end) {
            *slot = 0;
        }
    }
    // The job reads nothing from the agent: its input is empty, as for a guard spawned whole.
    let null = sys::open_read(b"/dev/null\0");
    if null < 0 || sys::dup2(null as i32, 0) < 0 {
        return fail(b"cannot open /dev/null");
    }
    sys::close(null as i32);
    // The directory is the message's first item: its NUL follows it there.
    let workdir = message.get(..=start.workdir.len()).unwrap_or_default();
    if sys::chdir(workdir) < 0 {
        return fail_with(b"cannot enter the job's directory ", start.workdir);
    }
    let (Some(program), Some(envp)) = (pointers.first(), pointers.get(envp_at..)) else {
        return fail(b"a malformed start message");
    };
    // SAFETY: argv (from `pointers[0]`, NULL at argc) and envp (NULL after the last entry)
    // point at NUL-terminated items of `message`, which lives until the exec.
    unsafe {
        sys::execve(
            *program as *const u8,
            pointers.as_ptr() as _,
            envp.as_ptr() as _,
        )
    };
    fail_with(b"cannot execute ", start.items().next().unwrap_or_default())
}

/// Reads standard input to its end into `buffer`: the length read.
fn read_all(buffer: &mut [u8]) -> Result<usize, &'static [u8]> {
    let mut length = 0;
    loop {
        let Some(free) = buffer.get_mut(length..).filter(|free| !free.is_empty()) else {
            return Err(b"the start message is too long");
        };
        match sys::read(0, free) {
            0 => return Ok(length),
            read if read > 0 => length += read as usize,
            interrupted if interrupted == -sys::EINTR => {}
            _ => return Err(b"cannot read the start message"),
        }
    }
}

fn pid(text: &[u8]) -> Option<i32> {
    mgpu_guard_rules::args::number(text).and_then(|n| i32::try_from(n).ok())
}
