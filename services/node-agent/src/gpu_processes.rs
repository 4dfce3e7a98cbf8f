//! What a GPU's processes are to this agent, whichever probe listed them (NVML, or the
//! `--gpu-samples` file of declared GPUs): a process in one of the jobs' process groups is
//! theirs, any other is foreign. Also where a live process's group is read (`/proc`).
//!
//! Kept apart from both probes so that they split processes the same way.

use std::collections::BTreeMap;

use mgpu_protocol::node::ForeignProcess;

/// Memory one process holds on one GPU, from one sample: what a probe reports of the GPU
/// processes for jobs' peak GPU memory and idleness (`GpuProbe::processes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuProcessMemory {
    pub gpu: u32,
    pub pid: u32,
    pub used_mib: u64,
}

/// One process on one GPU as a probe listed it: the pid, and its memory there in MiB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListedProcess {
    pub pid: u32,
    pub used_mib: u64,
}

/// The processes not in any job's process group, one entry per pid (a process listed twice,
/// as NVML lists one with both compute and graphics contexts, counts once, with the larger
/// memory figure). `process_group` reads a pid's group; the agent passes [`process_group_of`].
pub fn foreign_processes(
    processes: &[ListedProcess],
    job_pgids: &[u32],
    process_group: impl Fn(u32) -> Option<u32>,
) -> Vec<ForeignProcess> {
    let mut by_pid: BTreeMap<u32, u64> = BTreeMap::new();
    for process in processes {
        // A process whose group cannot be read (gone already, or in another PID namespace) is
        // not provably ours, so it counts as foreign: better to under-promise a GPU.
        let ours = process_group(process.pid).is_some_and(|pgid| job_pgids.contains(&pgid));
        if !ours {
            let entry = by_pid.entry(process.pid).or_default();
            *entry = (*entry).max(process.used_mib);
        }
    }
    by_pid
        .into_iter()
        .map(|(pid, used_mib)| ForeignProcess {
            pid,
            used_mib,
            // Filled in after the sample, where the process's account can be read.
            user: None,
        })
        .collect()
}

/// The process group of a live process, from `/proc/<pid>/stat`.
pub fn process_group_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    process_group_from_stat(&stat)
}

/// Field 5 (`pgrp`) of a `/proc/<pid>/stat` line. Field 2 is the command name in parentheses
/// and may itself contain spaces and parentheses, so fields are counted after the last `)`.
pub fn process_group_from_stat(stat: &str) -> Option<u32> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // After the name: state (3), ppid (4), pgrp (5).
    after_comm.split_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_group_is_read_after_the_command_name() {
        let plain = "1234 (python) S 1 1230 1230 34816 1230 4194304";
        assert_eq!(process_group_from_stat(plain), Some(1230));
        let tricky = "77 (my (odd) prog) R 5 4242 4242 0 -1 4194560";
        assert_eq!(process_group_from_stat(tricky), Some(4242));
        let spaced = "78 (a b) c) S 5 99 99";
        assert_eq!(process_group_from_stat(spaced), Some(99));
        assert_eq!(process_group_from_stat("garbage"), None);
        assert_eq!(process_group_from_stat("1 (x) S 1"), None);
        assert_eq!(process_group_from_stat("1 (x) S 1 notanumber"), None);
    }

    #[test]
    fn our_own_process_group_is_readable() {
        let own = process_group_of(std::process::id());
        assert_eq!(own, Some(nix::unistd::getpgrp().as_raw() as u32));
    }

    #[test]
    fn job_processes_are_not_foreign_and_duplicates_count_once() {
        let process = |pid, used_mib| ListedProcess { pid, used_mib };
        let processes = [
            process(10, 512),
            process(20, 100),
            process(20, 300),
            process(30, 1),
        ];
        // 10 is in job group 10; 20 is another user's; 30 vanished before it could be read.
        let group = |pid: u32| match pid {
            10 => Some(10),
            20 => Some(20),
            _ => None,
        };
        let foreign = foreign_processes(&processes, &[10], group);
        assert_eq!(
            foreign,
            vec![
                ForeignProcess {
                    pid: 20,
                    used_mib: 300,
                    user: None,
                },
                ForeignProcess {
                    pid: 30,
                    used_mib: 1,
                    user: None,
                },
            ]
        );
    }
}
