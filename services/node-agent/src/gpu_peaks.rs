//! Peak GPU memory per job, for its usage record (`mgpu show`): at every GPU sample, the
//! memory each GPU process holds (NVML's process list) is added up by the job attempt the
//! process belongs to, and the highest sum per GPU is kept until the attempt ends. A process
//! belongs to the attempt whose cgroup it is in (`job-<id>-<attempt>`, whatever its process
//! group), else to the attempt whose process group it is in. Sampled at each heartbeat: a
//! peak shorter than the heartbeat interval can be missed.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use mgpu_protocol::host::GpuPeak;

use crate::gpu::GpuProcessMemory;
use crate::running::AttemptKey;

/// The peaks of the running attempts, shared by the heartbeat (which samples) and the jobs
/// (which take theirs when they end).
#[derive(Clone, Debug, Default)]
pub struct GpuPeaks {
    peaks: Arc<Mutex<HashMap<AttemptKey, BTreeMap<u32, u64>>>>,
}

impl GpuPeaks {
    /// Adds one sample, as [`sum_by_attempt`] added it up.
    pub fn record(&self, now: &AttemptMemory) {
        let mut peaks = self.peaks.lock().unwrap_or_else(|p| p.into_inner());
        for (key, gpus) in now {
            let peak = peaks.entry(key.clone()).or_default();
            for (gpu, mib) in gpus {
                let best = peak.entry(*gpu).or_default();
                *best = (*best).max(*mib);
            }
        }
    }

    /// The peaks of `key`, forgotten here.
    pub fn take(&self, key: &AttemptKey) -> Vec<GpuPeak> {
        self.peaks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key)
            .unwrap_or_default()
            .into_iter()
            .map(|(index, peak_mib)| GpuPeak { index, peak_mib })
            .collect()
    }
}

/// The memory (MiB) each attempt's processes hold on each GPU, in one sample.
pub type AttemptMemory = HashMap<AttemptKey, BTreeMap<u32, u64>>;

/// What each attempt holds on each GPU in one sample (a process listed twice on a GPU, as
/// compute and graphics, counts once): `attempt_of` tells which attempt a process belongs
/// to, if any. Also what jobs' idleness reads their memory from (`idle_tracker.rs`).
pub fn sum_by_attempt(
    sample: &[GpuProcessMemory],
    attempt_of: impl Fn(u32) -> Option<AttemptKey>,
) -> AttemptMemory {
    let mut by_process: BTreeMap<(u32, u32), u64> = BTreeMap::new();
    for process in sample {
        let held = by_process.entry((process.gpu, process.pid)).or_default();
        *held = (*held).max(process.used_mib);
    }
    let mut sums = AttemptMemory::new();
    for ((gpu, pid), mib) in by_process {
        if let Some(key) = attempt_of(pid) {
            *sums.entry(key).or_default().entry(gpu).or_default() += mib;
        }
    }
    sums
}

/// The attempt whose cgroup a process is in, from its `/proc/<pid>/cgroup` text: a path
/// component `job-<id>-<attempt>` (the name `cgroup/mod.rs` gives every attempt's cgroup).
pub fn attempt_in_cgroup(proc_cgroup: &str) -> Option<AttemptKey> {
    proc_cgroup
        .lines()
        .filter_map(|line| line.rsplit(':').next())
        .flat_map(|path| path.split('/'))
        .find_map(|component| {
            let rest = component.strip_prefix("job-")?;
            let (id, attempt) = rest.rsplit_once('-')?;
            Some(AttemptKey {
                job_id: id.parse().ok()?,
                attempt: attempt.parse().ok()?,
            })
        })
}

/// The attempt process `pid` belongs to: its cgroup's, else the one whose process group it
/// is in (`groups`: each running attempt's process group).
pub fn attempt_of_process(pid: u32, groups: &[(u32, AttemptKey)]) -> Option<AttemptKey> {
    if let Some(key) = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .ok()
        .and_then(|text| attempt_in_cgroup(&text))
    {
        return Some(key);
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let group = crate::gpu_processes::process_group_from_stat(&stat)?;
    groups
        .iter()
        .find(|(pgid, _)| *pgid == group)
        .map(|(_, key)| key.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgpu_protocol::ids::JobId;

    fn key(attempt: u32) -> AttemptKey {
        AttemptKey {
            job_id: JobId::random(),
            attempt,
        }
    }

    #[test]
    fn a_jobs_cgroup_names_its_attempt_on_either_version() {
        let job = key(2);
        let v1 = format!(
            "6:freezer:/mgpu/node001/job-{}-2\n5:devices:/mgpu/node001/job-{}-2\n",
            job.job_id, job.job_id
        );
        assert_eq!(attempt_in_cgroup(&v1), Some(job.clone()));
        let v2 = format!(
            "0::/system.slice/mgpu-node.service/mgpu-jobs/n1/job-{}-2\n",
            job.job_id
        );
        assert_eq!(attempt_in_cgroup(&v2), Some(job));
        assert_eq!(attempt_in_cgroup("0::/user.slice/session-3.scope\n"), None);
        assert_eq!(attempt_in_cgroup("0::/mgpu/n1/job-notanid-x\n"), None);
    }

    #[test]
    fn peaks_are_the_highest_sum_per_gpu_and_end_with_the_attempt() {
        let (a, b) = (key(1), key(1));
        let peaks = GpuPeaks::default();
        let owner = |pid: u32| match pid {
            10 | 11 => Some(a.clone()),
            20 => Some(b.clone()),
            _ => None,
        };
        let sample = |pairs: &[(u32, u32, u64)]| -> Vec<GpuProcessMemory> {
            pairs
                .iter()
                .map(|&(gpu, pid, used_mib)| GpuProcessMemory { gpu, pid, used_mib })
                .collect()
        };
        // Two processes of `a` on GPU 0 add up; 10 listed twice counts once; 99 is nobody's.
        peaks.record(&sum_by_attempt(
            &sample(&[
                (0, 10, 1000),
                (0, 10, 800),
                (0, 11, 500),
                (1, 20, 300),
                (0, 99, 9000),
            ]),
            owner,
        ));
        peaks.record(&sum_by_attempt(
            &sample(&[(0, 10, 200), (1, 20, 700)]),
            owner,
        ));
        assert_eq!(
            peaks.take(&a),
            vec![GpuPeak {
                index: 0,
                peak_mib: 1500
            }]
        );
        assert_eq!(
            peaks.take(&b),
            vec![GpuPeak {
                index: 1,
                peak_mib: 700
            }]
        );
        assert!(peaks.take(&a).is_empty(), "taken once");
    }
}
