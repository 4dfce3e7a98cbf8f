//! GPU discovery behind one small trait, [`GpuProbe`]: NVML where an NVIDIA driver is present
//! ([`crate::nvml::NvmlProbe`]), a declared inventory ([`DeclaredProbe`]) where it is not or
//! where the operator overrides it. [`choose_probe`] applies the `--gpus` / `--fallback-gpus`
//! rules.

use anyhow::bail;
use mgpu_protocol::node::{GpuSource, GpuStatus};
use tracing::{info, warn};

use crate::gpu_spec::DeclaredSpec;
use crate::nvml::NvmlProbe;

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
}

/// GPUs the operator declared: fixed sizes, never busy, no foreign processes.
#[derive(Debug)]
pub struct DeclaredProbe {
    gpus: Vec<GpuStatus>,
    note: Option<String>,
}

impl DeclaredProbe {
    pub fn new(node: &str, spec: &DeclaredSpec, note: Option<String>) -> Self {
        let gpus = spec
            .memory_per_gpu()
            .zip(0u32..)
            .map(|(memory_total_mib, index)| GpuStatus {
                index,
                uuid: format!("declared-{node}-{index}"),
                name: "Declared GPU".to_owned(),
                memory_total_mib,
                memory_used_mib: 0,
                utilization_pct: 0,
                foreign_processes: Vec::new(),
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
}

/// Picks the probe: `--gpus` always wins; otherwise NVML, and when NVML cannot start,
/// `--fallback-gpus` (with a note saying why) or a startup error telling the operator what to pass.
pub fn choose_probe(
    node: &str,
    declared: Option<&DeclaredSpec>,
    fallback: Option<&DeclaredSpec>,
) -> anyhow::Result<Box<dyn GpuProbe>> {
    if let Some(spec) = declared {
        info!(inventory = %spec, "using the declared GPU inventory (--gpus)");
        return Ok(Box::new(DeclaredProbe::new(node, spec, None)));
    }
    match NvmlProbe::init() {
        Ok(probe) => {
            info!("reading GPUs through NVML");
            Ok(Box::new(probe))
        }
        Err(nvml_error) => {
            let Some(spec) = fallback else {
                bail!(
                    "NVML is not available on this host ({nvml_error}); declare its GPUs with \
                     --gpus COUNTxSIZE (e.g. --gpus 2x24GiB), or pass --fallback-gpus to use a \
                     declared inventory only where NVML is missing"
                );
            };
            let note = format!("NVML unavailable ({nvml_error}); using declared inventory {spec}");
            warn!("{note}");
            Ok(Box::new(DeclaredProbe::new(node, spec, Some(note))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu_spec::parse_gpu_spec;

    #[test]
    fn declared_gpus_are_named_and_numbered() {
        let Ok(spec) = parse_gpu_spec("1x80GiB,2x16GiB") else {
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
        assert_eq!(probe.source(), GpuSource::Declared);
        assert_eq!(probe.note(), None);
    }

    #[test]
    fn declared_inventory_overrides_nvml_and_keeps_no_note() {
        let Ok(spec) = parse_gpu_spec("2x24GiB") else {
            panic!("spec did not parse");
        };
        let probe = choose_probe("n1", Some(&spec), None);
        assert!(probe.is_ok_and(|p| p.source() == GpuSource::Declared && p.note().is_none()));
    }
}
