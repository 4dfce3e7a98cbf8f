//! The job's cgroup, as the guard sees it: joining it before the job starts, and signalling
//! its processes ([`Command::SignalCgroup`]) when the guard stops the job without its agent.
//! Which files ([`Cgroup`], from CGROUP) and whom a signal spares are the guard's rules
//! (`mgpu-guard-rules`); the reading and writing are here.
//!
//! [`Command::SignalCgroup`]: mgpu_guard_rules::Command::SignalCgroup

use mgpu_guard_rules::Cgroup;
use mgpu_guard_rules::machine::{CGROUP_KILL_ROUNDS, cgroup_signal_spares_group};

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

/// Writes `0` to each `cgroup.procs` the guard joins (on cgroup v1 the job's cgroup is one
/// directory per controller hierarchy; none when the agent joined already, or there is no
/// cgroup). False when one could not be joined (or its path is longer than any the agent
/// makes).
pub fn join(cgroup: &Cgroup<'_>) -> bool {
    let mut buffer = [0u8; MAX_PATH];
    for procs in cgroup.to_join() {
        let Some(path) = with_nul(procs, &mut buffer) else {
            return false;
        };
        if sys::write_file(path, b"0") < 0 {
            return false;
        }
    }
    true
}

/// Sends `signal` to every process in the job's cgroup but this guard (those listed by
/// `members`, its first `cgroup.procs`; None: no cgroup), so a job stopped without its agent
/// (dead, or fenced) takes what left its process group with it. A forking job may add
/// processes while the list is read: SIGKILL goes a few rounds, until only the guard is left.
pub fn kill(members: Option<&[u8]>, signal: i32) {
    let mut buffer = [0u8; MAX_PATH];
    let Some(path) = members.and_then(|members| with_nul(members, &mut buffer)) else {
        return;
    };
    let me = sys::getpid();
    // 0: no group spared (no process is in group 0), and no system call to learn the group.
    let spared = if cgroup_signal_spares_group(signal) {
        sys::getpgrp()
    } else {
        0
    };
    for _ in 0..CGROUP_KILL_ROUNDS {
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
                            if spared == 0 || sys::getpgid(found) != spared {
                                sys::kill(found, signal);
                            }
                            others += 1;
                        }
                    }
                }
            }
        }
        sys::close(fd as i32);
        if others == 0 || cgroup_signal_spares_group(signal) {
            return;
        }
    }
}
