//! The NVML probe: reads each GPU's name (and from it its type), UUID, memory, utilisation and
//! processes from the NVIDIA driver, and tells the agent's own job processes from foreign ones
//! by process group.

use std::collections::{BTreeMap, HashSet};

use anyhow::Context;
use mgpu_protocol::node::{ForeignProcess, GpuSource, GpuStatus};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use tracing::warn;

use crate::gpu::{GpuProbe, GpuProcessMemory};

const BYTES_PER_MIB: u64 = 1024 * 1024;

pub struct NvmlProbe {
    nvml: Nvml,
    /// Problems already logged: a field a GPU does not support fails on every sample, and
    /// saying so once is enough.
    logged: HashSet<String>,
    /// Every GPU process of the last sample, for jobs' peak GPU memory.
    last_processes: Vec<GpuProcessMemory>,
}

impl NvmlProbe {
    /// Loads the driver's NVML library; fails where there is no NVIDIA driver.
    pub fn init() -> Result<Self, NvmlError> {
        Ok(NvmlProbe {
            nvml: Nvml::init()?,
            logged: HashSet::new(),
            last_processes: Vec::new(),
        })
    }

    fn warn_once(&mut self, problem: String) {
        if self.logged.insert(problem.clone()) {
            warn!("{problem}");
        }
    }
}

impl GpuProbe for NvmlProbe {
    fn sample(&mut self, job_pgids: &[u32]) -> anyhow::Result<Vec<GpuStatus>> {
        let count = self
            .nvml
            .device_count()
            .context("asking NVML for the number of GPUs")?;
        let mut gpus = Vec::with_capacity(count as usize);
        let mut problems = Vec::new();
        self.last_processes.clear();
        for index in 0..count {
            // A GPU whose handle or memory cannot be read is left out: it cannot be scheduled
            // safely. Everything else has a harmless default, so one unsupported field never
            // hides a GPU.
            let device = match self.nvml.device_by_index(index) {
                Ok(device) => device,
                Err(err) => {
                    problems.push(format!(
                        "GPU {index}: NVML cannot open it ({err}); leaving it out"
                    ));
                    continue;
                }
            };
            let memory = match device.memory_info() {
                Ok(memory) => memory,
                Err(err) => {
                    problems.push(format!(
                        "GPU {index}: cannot read its memory ({err}); leaving it out"
                    ));
                    continue;
                }
            };
            let name = device.name().unwrap_or_else(|err| {
                problems.push(format!("GPU {index}: cannot read its name ({err})"));
                "NVIDIA GPU".to_owned()
            });
            let uuid = device.uuid().unwrap_or_else(|err| {
                problems.push(format!("GPU {index}: cannot read its UUID ({err})"));
                format!("nvml-index-{index}")
            });
            let utilization_pct = match device.utilization_rates() {
                Ok(rates) => rates.gpu,
                Err(err) => {
                    problems.push(format!(
                        "GPU {index}: cannot read its utilisation ({err}); reporting 0"
                    ));
                    0
                }
            };
            let processes = processes_on(&device, index, &mut problems);
            self.last_processes
                .extend(processes.iter().map(|process| GpuProcessMemory {
                    gpu: index,
                    pid: process.pid,
                    used_mib: used_mib_of(process),
                }));
            let memory_total_mib = memory.total / BYTES_PER_MIB;
            gpus.push(GpuStatus {
                index,
                uuid,
                gpu_type: crate::gpu_type::type_of_model(&name, memory_total_mib),
                name,
                memory_total_mib,
                memory_used_mib: memory.used / BYTES_PER_MIB,
                utilization_pct,
                // Not every GPU has the sensors: missing is shown as unknown, not as zero.
                temperature_c: device.temperature(TemperatureSensor::Gpu).ok(),
                power_w: device
                    .power_usage()
                    .ok()
                    .map(|milliwatts| milliwatts / 1000),
                foreign_processes: foreign_processes(&processes, job_pgids, process_group_of),
            });
        }
        for problem in problems {
            self.warn_once(problem);
        }
        Ok(gpus)
    }

    fn source(&self) -> GpuSource {
        GpuSource::Nvml
    }

    /// NVML's minor number (the N of `/dev/nvidiaN`), which need not equal the index.
    fn device_minors(&mut self) -> Vec<(u32, u32)> {
        let count = self.nvml.device_count().unwrap_or(0);
        let mut minors = Vec::new();
        for index in 0..count {
            match self
                .nvml
                .device_by_index(index)
                .and_then(|device| device.minor_number())
            {
                Ok(minor) => minors.push((index, minor)),
                Err(err) => self.warn_once(format!(
                    "GPU {index}: cannot read its device minor ({err}); jobs cannot be kept off it"
                )),
            }
        }
        minors
    }

    fn note(&self) -> Option<String> {
        None
    }

    fn processes(&self) -> Vec<GpuProcessMemory> {
        self.last_processes.clone()
    }
}

fn used_mib_of(process: &ProcessInfo) -> u64 {
    match process.used_gpu_memory {
        UsedGpuMemory::Used(bytes) => bytes / BYTES_PER_MIB,
        UsedGpuMemory::Unavailable => 0,
    }
}

/// The processes not in any job's process group, one entry per pid (a process listed as both
/// compute and graphics counts once, with the larger memory figure).
fn foreign_processes(
    processes: &[ProcessInfo],
    job_pgids: &[u32],
    process_group: impl Fn(u32) -> Option<u32>,
) -> Vec<ForeignProcess> {
    let mut by_pid: BTreeMap<u32, u64> = BTreeMap::new();
    for process in processes {
        let used_mib = used_mib_of(process);
        // A process whose group cannot be read (gone already, or in another PID namespace) is
        // not provably ours, so it counts as foreign: better to under-promise a GPU.
        let ours = process_group(process.pid).is_some_and(|pgid| job_pgids.contains(&pgid));
        if !ours {
            let entry = by_pid.entry(process.pid).or_default();
            *entry = (*entry).max(used_mib);
        }
    }
    by_pid
        .into_iter()
        .map(|(pid, used_mib)| ForeignProcess {
            pid,
            used_mib,
            user: None,
        })
        .collect()
}

/// The process group of a live process, from `/proc/<pid>/stat`.
fn process_group_of(pid: u32) -> Option<u32> {
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

/// The processes using GPU `index`: compute, and graphics where they can be listed.
fn processes_on(
    device: &nvml_wrapper::Device<'_>,
    index: u32,
    problems: &mut Vec<String>,
) -> Vec<ProcessInfo> {
    let mut processes = Vec::new();
    match device.running_compute_processes() {
        Ok(list) => processes.extend(list),
        Err(err) => problems.push(format!(
            "GPU {index}: cannot list compute processes ({err})"
        )),
    }
    // Graphics contexts use memory too (a desktop session on a workstation GPU); not every
    // GPU or driver can list them, which is not worth a warning.
    if let Ok(list) = device.running_graphics_processes() {
        processes.extend(list);
    }
    processes
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

    fn process(pid: u32, bytes: u64) -> ProcessInfo {
        ProcessInfo {
            pid,
            used_gpu_memory: UsedGpuMemory::Used(bytes),
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    #[test]
    fn job_processes_are_not_foreign_and_duplicates_count_once() {
        let processes = [
            process(10, 512 * BYTES_PER_MIB),
            process(20, 100 * BYTES_PER_MIB),
            process(20, 300 * BYTES_PER_MIB),
            process(30, BYTES_PER_MIB),
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
