//! The NVML probe: reads each GPU's name (and from it its type), UUID, memory, utilisation and
//! processes from the NVIDIA driver; `gpu_processes.rs` tells the agent's own job processes
//! from foreign ones by process group.

use std::collections::HashSet;

use anyhow::Context;
use mgpu_protocol::node::{GpuSource, GpuStatus};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use tracing::warn;

use crate::gpu::{GpuProbe, GpuProcessMemory};
use crate::gpu_processes::{ListedProcess, foreign_processes, process_group_of};

const BYTES_PER_MIB: u64 = 1024 * 1024;

pub struct NvmlProbe {
    nvml: Nvml,
    /// Problems already logged: a field a GPU does not support fails on every sample, and
    /// saying so once is enough.
    logged: HashSet<String>,
    /// The GPU processes of the last sample.
    last: LastProcesses,
}

/// What the last sample found of the GPUs' processes.
#[derive(Default)]
struct LastProcesses {
    /// Every GPU process, for jobs' peak GPU memory and idleness.
    processes: Vec<GpuProcessMemory>,
    /// The GPUs whose compute processes could be listed.
    listed_gpus: Vec<u32>,
}

impl LastProcesses {
    /// Keeps GPU `index`'s processes (and whether they could be listed); returns them as the
    /// foreign split reads them.
    fn keep(
        &mut self,
        index: u32,
        (found, listed): (Vec<ProcessInfo>, bool),
    ) -> Vec<ListedProcess> {
        if listed {
            self.listed_gpus.push(index);
        }
        let processes: Vec<ListedProcess> = found
            .iter()
            .map(|process| ListedProcess {
                pid: process.pid,
                used_mib: used_mib_of(process),
            })
            .collect();
        self.processes
            .extend(processes.iter().map(|process| GpuProcessMemory {
                gpu: index,
                pid: process.pid,
                used_mib: process.used_mib,
            }));
        processes
    }
}

impl NvmlProbe {
    /// Loads the driver's NVML library; fails where there is no NVIDIA driver.
    pub fn init() -> Result<Self, NvmlError> {
        Ok(NvmlProbe {
            nvml: Nvml::init()?,
            logged: HashSet::new(),
            last: LastProcesses::default(),
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
        self.last = LastProcesses::default();
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
            let processes = self
                .last
                .keep(index, processes_on(&device, index, &mut problems));
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
        self.last.processes.clone()
    }

    fn listed_gpus(&self) -> Vec<u32> {
        self.last.listed_gpus.clone()
    }
}

fn used_mib_of(process: &ProcessInfo) -> u64 {
    match process.used_gpu_memory {
        UsedGpuMemory::Used(bytes) => bytes / BYTES_PER_MIB,
        UsedGpuMemory::Unavailable => 0,
    }
}

/// The processes using GPU `index`: compute, and graphics where they can be listed; and
/// whether the compute processes could be listed at all (where not, a job's memory on the GPU
/// can only be read as the GPU's used memory).
fn processes_on(
    device: &nvml_wrapper::Device<'_>,
    index: u32,
    problems: &mut Vec<String>,
) -> (Vec<ProcessInfo>, bool) {
    let mut processes = Vec::new();
    let listed = match device.running_compute_processes() {
        Ok(list) => {
            processes.extend(list);
            true
        }
        Err(err) => {
            problems.push(format!(
                "GPU {index}: cannot list compute processes ({err})"
            ));
            false
        }
    };
    // Graphics contexts use memory too (a desktop session on a workstation GPU); not every
    // GPU or driver can list them, which is not worth a warning.
    if let Ok(list) = device.running_graphics_processes() {
        processes.extend(list);
    }
    (processes, listed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_nvml_cannot_tell_counts_as_none() {
        let process = |used_gpu_memory| ProcessInfo {
            pid: 1,
            used_gpu_memory,
            gpu_instance_id: None,
            compute_instance_id: None,
        };
        let used = process(UsedGpuMemory::Used(3 * BYTES_PER_MIB + 5));
        assert_eq!(used_mib_of(&used), 3);
        assert_eq!(used_mib_of(&process(UsedGpuMemory::Unavailable)), 0);
    }
}
