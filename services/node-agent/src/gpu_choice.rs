//! Which [`GpuProbe`] this agent reads its GPUs through: the `--gpus` / `--fallback-gpus`
//! rules, with the operator's GPU types (`--gpu-type`, `--gpu-type-of`) put over the probe's
//! own. It is the one place that knows both probes, so neither probe module needs the other.

use std::path::Path;

use anyhow::bail;
use mgpu_protocol::node::{GpuSource, GpuStatus};
use tracing::{info, warn};

use crate::gpu::{DeclaredProbe, GpuProbe, GpuProcessMemory};
use crate::gpu_spec::DeclaredSpec;
use crate::gpu_type::TypeOverrides;
use crate::nvml::NvmlProbe;

/// Picks the probe: `--gpus` always wins; otherwise NVML, and when NVML cannot start,
/// `--fallback-gpus` (with a note saying why) or a startup error telling the operator what to pass.
/// Its GPUs' types are then `overrides`' where they say one. Declared GPUs read what they are
/// doing from `samples` (`--gpu-samples`), where given.
pub fn choose_probe(
    node: &str,
    declared: Option<&DeclaredSpec>,
    fallback: Option<&DeclaredSpec>,
    samples: Option<&Path>,
    overrides: TypeOverrides,
) -> anyhow::Result<Box<dyn GpuProbe>> {
    Ok(TypedProbe::wrap(
        untyped_probe(node, declared, fallback, samples)?,
        overrides,
    ))
}

fn untyped_probe(
    node: &str,
    declared: Option<&DeclaredSpec>,
    fallback: Option<&DeclaredSpec>,
    samples: Option<&Path>,
) -> anyhow::Result<Box<dyn GpuProbe>> {
    if let Some(spec) = declared {
        info!(inventory = %spec, "using the declared GPU inventory (--gpus)");
        let probe = DeclaredProbe::new(node, spec, None).with_samples(samples);
        return Ok(Box::new(probe));
    }
    match NvmlProbe::init() {
        Ok(probe) => {
            info!("reading GPUs through NVML");
            if let Some(samples) = samples {
                // Real readings win over made-up ones; the file only stands in for a driver.
                warn!(
                    file = %samples.display(),
                    "--gpu-samples is ignored: it describes declared GPUs, and NVML reads these"
                );
            }
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
            let probe = DeclaredProbe::new(node, spec, Some(note)).with_samples(samples);
            Ok(Box::new(probe))
        }
    }
}

/// A probe whose samples carry the operator's types over the probe's own: what both the
/// heartbeats and `--print-gpus` read through.
struct TypedProbe {
    inner: Box<dyn GpuProbe>,
    overrides: TypeOverrides,
    /// Whether `--gpu-type-of` indexes missing from the GPUs were already warned about.
    checked_indexes: bool,
}

impl TypedProbe {
    /// `inner` itself when there are no overrides.
    fn wrap(inner: Box<dyn GpuProbe>, overrides: TypeOverrides) -> Box<dyn GpuProbe> {
        if overrides.is_empty() {
            return inner;
        }
        Box::new(TypedProbe {
            inner,
            overrides,
            checked_indexes: false,
        })
    }
}

impl GpuProbe for TypedProbe {
    fn sample(&mut self, job_pgids: &[u32]) -> anyhow::Result<Vec<GpuStatus>> {
        let mut gpus = self.inner.sample(job_pgids)?;
        if !self.checked_indexes {
            self.checked_indexes = true;
            let unknown = self.overrides.unknown_indexes(&gpus);
            if !unknown.is_empty() {
                warn!(
                    indexes = ?unknown,
                    gpus = gpus.len(),
                    "--gpu-type-of names GPUs this node does not have"
                );
            }
        }
        self.overrides.apply(&mut gpus);
        Ok(gpus)
    }

    fn source(&self) -> GpuSource {
        self.inner.source()
    }

    fn note(&self) -> Option<String> {
        self.inner.note()
    }

    fn device_minors(&mut self) -> Vec<(u32, u32)> {
        self.inner.device_minors()
    }

    fn processes(&self) -> Vec<GpuProcessMemory> {
        self.inner.processes()
    }

    fn listed_gpus(&self) -> Vec<u32> {
        self.inner.listed_gpus()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu_spec::parse_gpu_spec;

    #[test]
    fn declared_inventory_overrides_nvml_and_keeps_no_note() {
        let Ok(spec) = parse_gpu_spec("2x24GiB") else {
            panic!("spec did not parse");
        };
        let probe = choose_probe("n1", Some(&spec), None, None, TypeOverrides::default());
        assert!(probe.is_ok_and(|p| p.source() == GpuSource::Declared && p.note().is_none()));
    }

    fn types_of(spec: &str, overrides: TypeOverrides) -> Vec<Option<String>> {
        let Ok(spec) = parse_gpu_spec(spec) else {
            panic!("{spec} did not parse");
        };
        let Ok(mut probe) = choose_probe("n1", Some(&spec), None, None, overrides) else {
            panic!("no probe");
        };
        assert_eq!(probe.source(), GpuSource::Declared);
        let gpus = probe.sample(&[]).unwrap_or_default();
        gpus.into_iter().map(|gpu| gpu.gpu_type).collect()
    }

    fn some(name: &str) -> Option<String> {
        Some(name.to_owned())
    }

    fn overrides(node: Option<&str>, by_index: &[(u32, &str)]) -> TypeOverrides {
        let by_index: Vec<(u32, String)> = by_index
            .iter()
            .map(|(index, name)| (*index, (*name).to_owned()))
            .collect();
        TypeOverrides::new(node.map(str::to_owned), &by_index)
            .unwrap_or_else(|err| panic!("overrides refused: {err}"))
    }

    #[test]
    fn per_index_beats_node_wide_beats_the_declared_type() {
        let spec = "1x80GiB:a100-80gb,1x24GiB,1x24GiB:rtx-4090";
        assert_eq!(
            types_of(spec, TypeOverrides::default()),
            vec![some("a100-80gb"), None, some("rtx-4090")]
        );
        assert_eq!(
            types_of(spec, overrides(Some("l40s"), &[])),
            vec![some("l40s"); 3]
        );
        assert_eq!(
            types_of(spec, overrides(Some("l40s"), &[(2, "h100")])),
            vec![some("l40s"), some("l40s"), some("h100")]
        );
        assert_eq!(
            types_of(spec, overrides(None, &[(1, "t4"), (9, "t4")])),
            vec![some("a100-80gb"), some("t4"), some("rtx-4090")]
        );
    }

    #[test]
    fn the_typed_probe_passes_the_rest_through() {
        let Ok(spec) = parse_gpu_spec("2x24GiB") else {
            panic!("spec did not parse");
        };
        let probe = choose_probe("n1", Some(&spec), None, None, overrides(Some("t4"), &[]));
        let Ok(mut probe) = probe else {
            panic!("no probe");
        };
        assert_eq!(probe.device_minors(), vec![(0, 0), (1, 1)]);
        assert_eq!(probe.note(), None);
        assert!(probe.processes().is_empty());
        assert!(probe.listed_gpus().is_empty());
    }
}
