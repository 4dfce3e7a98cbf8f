//! GPU discovery behind one small trait, [`GpuProbe`], with what a probe reports of the GPU
//! processes ([`GpuProcessMemory`]), and the probe that needs no driver: [`DeclaredProbe`],
//! the inventory the operator declared, fed what its GPUs are doing by a `--gpu-samples` file
//! where one is given (`gpu_samples.rs`). The NVML probe implements the trait in `nvml.rs`;
//! which probe an agent uses is decided in `gpu_choice.rs`; `gpu_peaks.rs` adds the processes'
//! memory up per job. This module imports none of them, so they depend on the trait and never
//! the other way round.

use std::path::Path;

use mgpu_protocol::node::{GpuSource, GpuStatus};

pub use crate::gpu_processes::GpuProcessMemory;
use crate::gpu_processes::process_group_of;
use crate::gpu_samples::SamplesSource;
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
    /// The GPUs whose processes the last sample listed. On the others a job's own memory
    /// cannot be told from anyone's, so its idleness reads the GPU's used memory instead.
    fn listed_gpus(&self) -> Vec<u32> {
        Vec::new()
    }
}

/// GPUs the operator declared: fixed sizes and types; idle, with no processes, unless a
/// `--gpu-samples` file says otherwise.
#[derive(Debug)]
pub struct DeclaredProbe {
    /// The declared GPUs at their defaults.
    gpus: Vec<GpuStatus>,
    note: Option<String>,
    samples: Option<SamplesSource>,
    /// What the last sample's file listed.
    last_processes: Vec<GpuProcessMemory>,
    listed_gpus: Vec<u32>,
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
        DeclaredProbe {
            gpus,
            note,
            samples: None,
            last_processes: Vec::new(),
            listed_gpus: Vec::new(),
        }
    }

    /// Reads what the GPUs are doing from `path` (`--gpu-samples`) at every sample.
    pub fn with_samples(mut self, path: Option<&Path>) -> Self {
        self.samples = path.map(SamplesSource::new);
        self
    }
}

impl GpuProbe for DeclaredProbe {
    fn sample(&mut self, job_pgids: &[u32]) -> anyhow::Result<Vec<GpuStatus>> {
        let Some(source) = self.samples.as_mut() else {
            return Ok(self.gpus.clone());
        };
        let applied = source
            .read(&self.gpus)
            .apply(&self.gpus, job_pgids, process_group_of);
        self.last_processes = applied.processes;
        self.listed_gpus = applied.listed_gpus;
        Ok(applied.gpus)
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

    fn processes(&self) -> Vec<GpuProcessMemory> {
        self.last_processes.clone()
    }

    fn listed_gpus(&self) -> Vec<u32> {
        self.listed_gpus.clone()
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

    #[test]
    fn a_samples_file_feeds_the_declared_gpus_and_their_processes() {
        let Ok(spec) = parse_gpu_spec("2x24GiB") else {
            panic!("spec did not parse");
        };
        let Ok(dir) = tempfile::tempdir() else {
            panic!("no temporary directory");
        };
        let path = dir.path().join("samples.json");
        let mut probe = DeclaredProbe::new("n1", &spec, None).with_samples(Some(&path));
        let idle = probe.sample(&[]).unwrap_or_default();
        assert_eq!(idle[1].utilization_pct, 0, "no file yet: the defaults");
        let text = r#"{"gpus": [{"index": 1, "utilization_pct": 60,
            "processes": [{"pid": 4000000, "used_mib": 700}]}]}"#;
        if let Err(err) = std::fs::write(&path, text) {
            panic!("writing {}: {err}", path.display());
        }
        let gpus = probe.sample(&[]).unwrap_or_default();
        assert_eq!(
            (gpus[1].utilization_pct, gpus[1].memory_used_mib),
            (60, 700)
        );
        // No such process: its group cannot be read, so it is foreign.
        assert_eq!(gpus[1].foreign_processes.len(), 1);
        assert_eq!(probe.listed_gpus(), vec![1]);
        assert_eq!(
            probe.processes(),
            vec![GpuProcessMemory {
                gpu: 1,
                pid: 4_000_000,
                used_mib: 700
            }]
        );
    }
}
