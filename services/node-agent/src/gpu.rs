//! GPU discovery behind one small trait, [`GpuProbe`], with what a probe reports of the GPU
//! processes ([`GpuProcessMemory`]), and the probe that needs no driver: [`DeclaredProbe`],
//! the inventory the operator declared. The NVML probe implements the trait in `nvml.rs`;
//! which probe an agent uses is decided in `gpu_choice.rs`; `gpu_peaks.rs` adds the processes'
//! memory up per job. This module imports none of them, so they depend on the trait and never
//! the other way round.

use mgpu_protocol::node::{GpuSource, GpuStatus};

use crate::gpu_spec::DeclaredSpec;

/// Something that can tell what the node's GPUs are doing now.
///
/// `sample` may block (NVML calls into the driver), so callers run it on a blocking thread.
pub trait GpuProbe: Send {
    /// The GPUs as of now. `job_pgids` are the process groups of the jobs this agent started;
    /// GPU processes outside them are reported as foreign.
    fn sample(&mut self, job_pgids: &[u32]) -> anyhow::Result<Vec<GpuStatus>>;
    fn source(&self) -> GpuSource;
    /// Why the inventory is declared rather than read, when that was not the operator's choice.
    fn note(&self) -> Option<String>;
    /// Each GPU's device minor by index: `/dev/nvidiaN` is character device 195:N, and a job's
    /// cgroup lets it open only its own GPUs' minors.
    fn device_minors(&mut self) -> Vec<(u32, u32)>;
    /// The memory each process held on each GPU at the last sample (for jobs' peak GPU
    /// memory); empty where processes cannot be seen.
    fn processes(&self) -> Vec<GpuProcessMemory> {
        Vec::new()
    }
}

/// Memory one process holds on one GPU, from one sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuProcessMemory {
    pub gpu: u32,
    pub pid: u32,
    pub used_mib: u64,
}

/// GPUs the operator declared: fixed sizes and types, never busy, no foreign processes.
#[derive(Debug)]
pub struct DeclaredProbe {
    gpus: Vec<GpuStatus>,
    note: Option<String>,
}

impl DeclaredProbe {
    pub fn new(node: &str, spec: &DeclaredSpec, note: Option<String>) -> Self {
        let gpus = spec
            .gpus()
            .zip(0u32..)
            .map(|((memory_total_mib, gpu_type), index)| GpuStatus {
                index,
                uuid: format!("declared-{node}-{index}"),
                name: "Declared GPU".to_owned(),
                memory_total_mib,
                memory_used_mib: 0,
                utilization_pct: 0,
                temperature_c: None,
                power_w: None,
                foreign_processes: Vec::new(),
                gpu_type: gpu_type.map(str::to_owned),
            })
            .collect();
        DeclaredProbe { gpus, note }
    }
}

impl GpuProbe for DeclaredProbe {
    fn sample(&mut self, _job_pgids: &[u32]) -> anyhow::Result<Vec<GpuStatus>> {
        Ok(self.gpus.clone())
    }

    fn source(&self) -> GpuSource {
        GpuSource::Declared
    }

    fn note(&self) -> Option<String> {
        self.note.clone()
    }

    /// A declared GPU `N` is `/dev/nvidiaN`, as the driver numbers them.
    fn device_minors(&mut self) -> Vec<(u32, u32)> {
        self.gpus.iter().map(|gpu| (gpu.index, gpu.index)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu_spec::parse_gpu_spec;

    #[test]
    fn declared_gpus_are_named_and_numbered() {
        let Ok(spec) = parse_gpu_spec("1x80GiB,2x16GiB:t4") else {
            panic!("spec did not parse");
        };
        let mut probe = DeclaredProbe::new("node001", &spec, None);
        let gpus = probe.sample(&[]).unwrap_or_default();
        assert_eq!(gpus.len(), 3);
        assert_eq!(gpus[0].memory_total_mib, 80 * 1024);
        assert_eq!(gpus[2].index, 2);
        assert_eq!(gpus[2].uuid, "declared-node001-2");
        assert_eq!(gpus[2].name, "Declared GPU");
        assert_eq!(gpus[2].memory_used_mib, 0);
        assert_eq!(gpus[0].gpu_type, None);
        assert_eq!(gpus[2].gpu_type.as_deref(), Some("t4"));
        assert_eq!(probe.source(), GpuSource::Declared);
        assert_eq!(probe.note(), None);
    }
}
