//! The host's own resources next to its GPUs: the CPU cores and memory (RAM) this agent
//! offers jobs (read from the kernel, or declared with `--cpus` / `--mem-host`), announced in
//! every heartbeat so the scheduler counts `--cpus` and `--mem-host` against them, and the
//! cores each running job is pinned to.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::running::AttemptKey;

/// The cores and memory jobs may be given here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostResources {
    /// The cores jobs may be pinned to: those this agent may run on (its affinity).
    pub cores: Vec<u32>,
    /// How many cores the scheduler may hand out (`--cpus`, else `cores.len()`).
    pub cpus: u32,
    /// Host memory the scheduler may hand out, in MiB (`--mem-host`, else the host's total).
    pub mem_mib: u64,
}

impl HostResources {
    /// Reads this host's cores and memory, `declared_cpus` and `declared_mem_mib` standing
    /// in for what was read where given.
    pub fn detect(declared_cpus: Option<u32>, declared_mem_mib: Option<u64>) -> HostResources {
        let cores = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|status| {
                status
                    .lines()
                    .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
                    .map(parse_core_list)
            })
            .filter(|cores| !cores.is_empty())
            .unwrap_or_else(|| {
                let count = std::thread::available_parallelism().map_or(1, |n| n.get());
                (0..u32::try_from(count).unwrap_or(1)).collect()
            });
        let mem_mib = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|info| {
                info.lines()
                    .find_map(|line| line.strip_prefix("MemTotal:"))
                    .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
            .map_or(0, |kib| kib / 1024);
        HostResources {
            cpus: declared_cpus.unwrap_or(u32::try_from(cores.len()).unwrap_or(u32::MAX)),
            cores,
            mem_mib: declared_mem_mib.unwrap_or(mem_mib),
        }
    }
}

/// `0-3,8,10-11` (the kernel's list format) → the cores.
pub fn parse_core_list(text: &str) -> Vec<u32> {
    let mut cores = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(first), Ok(last)) = (first.trim().parse::<u32>(), last.trim().parse::<u32>()) {
            cores.extend(first..=last.min(first.saturating_add(65_535)));
        }
    }
    cores
}

/// What every job's cgroup is set up from: the host's resources, its GPUs' device minors and
/// the cores already handed out.
#[derive(Debug)]
pub struct JobHost {
    pub resources: HostResources,
    /// `(index, minor)` of each GPU: `/dev/nvidiaN` is 195:minor.
    pub gpu_minors: Vec<(u32, u32)>,
    pub cores: CoreBook,
    /// Whether the containment can pin cores at all.
    pub pins_cpus: bool,
    /// Each running attempt's peak GPU memory, sampled by the heartbeat.
    pub gpu_peaks: crate::gpu_peaks::GpuPeaks,
    /// Each running attempt's owner, GPUs and cgroup, for the metrics.
    pub holdings: crate::holdings::Holdings,
}

impl JobHost {
    /// The limits of one attempt given `gpus` (indices), `cpus` cores and `mem_host_mib`
    /// (0: none), booking its cores; [`CoreBook::release`] gives them back.
    pub fn limits_for(
        &self,
        key: &AttemptKey,
        gpus: &[u32],
        cpus: u32,
        mem_host_mib: u64,
    ) -> crate::cgroup::JobLimits {
        let minor_of = |index: &u32| {
            self.gpu_minors
                .iter()
                .find(|(gpu, _)| gpu == index)
                .map(|(_, minor)| *minor)
        };
        crate::cgroup::JobLimits {
            gpu_minors: gpus.iter().filter_map(minor_of).collect(),
            node_gpu_minors: self.gpu_minors.iter().map(|(_, minor)| *minor).collect(),
            mem_host_mib: (mem_host_mib > 0).then_some(mem_host_mib),
            cores: (self.pins_cpus && cpus > 0)
                .then(|| self.cores.take(key, &self.resources.cores, cpus))
                .flatten(),
        }
    }
}

/// Which cores each running job is pinned to, so two jobs never get the same ones.
#[derive(Clone, Debug, Default)]
pub struct CoreBook {
    taken: Arc<Mutex<HashMap<AttemptKey, Vec<u32>>>>,
}

impl CoreBook {
    /// Books `wanted` of `cores` nobody holds for `key`; None (nothing booked) when there are
    /// not that many free: the job then runs unpinned rather than on someone's cores.
    pub fn take(&self, key: &AttemptKey, cores: &[u32], wanted: u32) -> Option<Vec<u32>> {
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        let held: Vec<u32> = taken.values().flatten().copied().collect();
        let chosen = choose_cores(cores, &held, wanted)?;
        taken.insert(key.clone(), chosen.clone());
        Some(chosen)
    }

    /// Gives `key`'s cores back.
    pub fn release(&self, key: &AttemptKey) {
        self.taken
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}

/// The first `wanted` of `cores` not in `held`, or None when there are not that many.
fn choose_cores(cores: &[u32], held: &[u32], wanted: u32) -> Option<Vec<u32>> {
    let free: Vec<u32> = cores
        .iter()
        .copied()
        .filter(|core| !held.contains(core))
        .take(wanted as usize)
        .collect();
    (wanted > 0 && free.len() == wanted as usize).then_some(free)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_core_lists_are_read() {
        assert_eq!(
            parse_core_list("0-3,8,10-11\n"),
            vec![0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(parse_core_list("\t1"), vec![1]);
        assert_eq!(parse_core_list(""), Vec::<u32>::new());
    }

    #[test]
    fn jobs_get_cores_nobody_holds_or_none() {
        let book = CoreBook::default();
        let key = |n: u32| AttemptKey {
            job_id: mgpu_protocol::ids::JobId::random(),
            attempt: n,
        };
        let (a, b, c) = (key(1), key(1), key(1));
        assert_eq!(book.take(&a, &[0, 1], 1), Some(vec![0]));
        assert_eq!(book.take(&b, &[0, 1], 1), Some(vec![1]));
        assert_eq!(book.take(&c, &[0, 1], 1), None);
        book.release(&a);
        assert_eq!(book.take(&c, &[0, 1], 1), Some(vec![0]));
        assert_eq!(choose_cores(&[0, 1], &[], 0), None);
    }

    #[test]
    fn this_hosts_resources_are_read_and_declared_values_win() {
        let read = HostResources::detect(None, None);
        assert!(read.cpus >= 1 && read.mem_mib > 0, "{read:?}");
        let declared = HostResources::detect(Some(64), Some(1024));
        assert_eq!((declared.cpus, declared.mem_mib), (64, 1024));
        assert_eq!(declared.cores, read.cores);
    }
}
