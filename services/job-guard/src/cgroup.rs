//! The job's cgroup, as the guard sees it: joining it before the job starts, and emptying it
//! when the guard stops the job without its agent. CGROUP is the `:`-separated list of the
//! `cgroup.procs` files of the job's cgroup (one per hierarchy on cgroup v1), NUL-terminated;
//! `@` before it: the agent joined already; `-`: none.

use crate::sys;

/// The longest `cgroup.procs` path the guard handles (the agent's are far shorter).
const MAX_PATH: usize = 1024;

/// `path` with a NUL after it, in `buffer`; None when it does not fit.
fn with_nul<'a>(path: &[u8], buffer: &'a mut [u8; MAX_PATH]) -> Option<&'a [u8]> {
    let room = buffer.get_mut(..=path.len())?;
    let (name, end) = room.split_at_mut(path.len());
    name.copy_from_slice(path);
    *end.first_mut()? = 0;
    Some(room)
}

/// Writes `0` to each `cgroup.procs` in `list` (`:`-separated, NUL-terminated): on cgroup v1
/// the job's cgroup is one directory per controller hierarchy. False when one could not be
/// joined (or its path is longer than any the agent makes).
pub fn join(list: &[u8]) -> bool {
    let list = list.strip_suffix(b"\0").unwrap_or(list);
    let mut buffer = [0u8; MAX_PATH];
    for procs in list.split(|byte| *byte == b':') {
        let Some(path) = with_nul(procs, &mut buffer) else {
            return false;
        };
        if sys::write_file(path, b"0") < 0 {
            return false;
        }
    }
    true
}

/// Sends `signal` to every process in the job's cgroup but this guard (the first
/// `cgroup.procs` of the `:`-separated list; `-`: none), so a job stopped without its agent
/// (dead, or fenced) takes what left its process group with it. A forking job may add
/// processes while the list is read: SIGKILL goes a few rounds, until only the guard is left.
pub fn kill(list: &[u8], signal: i32) {
    let list = list.strip_suffix(b"\0").unwrap_or(list);
    let list = list.strip_prefix(b"@").unwrap_or(list);
    let first = list.split(|byte| *byte == b':').next().unwrap_or(b"-");
    if first == b"-" {
        return;
    }
    let mut buffer = [0u8; MAX_PATH];
    let Some(path) = with_nul(first, &mut buffer) else {
        return;
    };
    let me = sys::getpid();
    // The group's members get a stop signal from the group's own; a second SIGTERM would run
    // a job's TERM handler twice. SIGKILL goes to every member, whatever its group.
    let group = if signal == sys::SIGKILL {
        0
    } else {
        sys::getpgrp()
    };
    for _ in 0..20 {
        let fd = sys::open_read(path);
        if fd < 0 {
            return;
        }
        let mut others = 0;
        let mut pid: Option<i32> = None;
        let mut chunk = [0u8; 1024];
        loop {
            let read = sys::read(fd as i32, &mut chunk);
            let Some(bytes) = usize::try_from(read).ok().and_then(|n| chunk.get(..n)) else {
                break;
            };
            if bytes.is_empty() {
                break;
            }
            for byte in bytes {
                match byte {
                    b'0'..=b'9' => {
                        let digit = i32::from(byte - b'0');
                        pid = Some(pid.unwrap_or(0).saturating_mul(10).saturating_add(digit));
                    }
                    _ => {
                        if let Some(found) = pid.take().filter(|found| *found != me) {
                            if group == 0 || sys::getpgid(found) != group {
                                sys::kill(found, signal);
                            }
                            others += 1;
                        }
                    }
                }
            }
        }
        sys::close(fd as i32);
        if others == 0 || signal != sys::SIGKILL {
            return;
        }
    }
}
