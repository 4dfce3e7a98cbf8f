//! Which [`GpuProbe`] this agent reads its GPUs through: the `--gpus` / `--fallback-gpus`
//! rules. It is the one place that knows both probes, so neither probe module needs the other.

use anyhow::bail;
use tracing::{info, warn};

use crate::gpu::{DeclaredProbe, GpuProbe};
use crate::gpu_spec::DeclaredSpec;
use crate::nvml::NvmlProbe;

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
    use mgpu_protocol::node::GpuSource;

    use super::*;
    use crate::gpu_spec::parse_gpu_spec;

    #[test]
    fn declared_inventory_overrides_nvml_and_keeps_no_note() {
        let Ok(spec) = parse_gpu_spec("2x24GiB") else {
            panic!("spec did not parse");
        };
        let probe = choose_probe("n1", Some(&spec), None);
        assert!(probe.is_ok_and(|p| p.source() == GpuSource::Declared && p.note().is_none()));
    }
}
