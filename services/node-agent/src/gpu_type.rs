//! The GPU types and node features this agent reports: the type derived from a GPU's NVML model
//! name ([`type_of_model`]), the values of `--gpu-type`, `--gpu-type-of` and `--feature`, the
//! operator's types applied over what a probe says ([`TypeOverrides`]; `gpu_choice.rs` puts
//! them in front of the probe) and the node's features as heartbeats carry them
//! ([`node_features`]). The names' form is `mgpu_protocol::gpu_type`'s. This module imports
//! no other module of the agent.
//!
//! Each GPU's type, first found first: its `--gpu-type-of INDEX=TYPE`, the node's
//! `--gpu-type`, its declared group's `:TYPE` (`--gpus 2x24GiB:rtx-4090`), the type derived
//! from its model name (NVML); else none.

use std::collections::BTreeMap;

use mgpu_protocol::gpu_type::check_name;
use mgpu_protocol::node::GpuStatus;

/// Words of a model name that name the vendor or a brand, not the model.
const BRAND_WORDS: &[&str] = &["nvidia", "geforce", "tesla", "quadro", "gpu"];

/// Words of a model name that name a form factor or memory technology: the same chip is the
/// same type whatever board it sits on (`dgxs`: the DGX Station's V100). `generation` is from
/// `RTX 6000 Ada Generation`.
const FORM_WORDS: &[&str] = &[
    "sxm",
    "sxm2",
    "sxm3",
    "sxm4",
    "sxm5",
    "sxm6",
    "pcie",
    "nvl",
    "hbm",
    "hbm2",
    "hbm2e",
    "hbm3",
    "hbm3e",
    "dgxs",
    "generation",
];

/// Models sold in several memory sizes (GB), whose type therefore ends in the size
/// (`a100-80gb`). Any other model's type leaves its memory out (`h100`, whether 80 or 94 GB).
const MULTI_MEMORY: &[(&str, &[u64])] = &[
    ("a100", &[40, 80]),
    ("a800", &[40, 80]),
    ("v100", &[16, 32]),
    ("p100", &[12, 16]),
    ("rtx-3060", &[8, 12]),
    ("rtx-3080", &[10, 12]),
    ("rtx-4060-ti", &[8, 16]),
];

const MIB_PER_GIB: u64 = 1024;

/// The type jobs ask for (`--gpu-type`) of a GPU whose NVML model name is `model` and which
/// has `memory_mib` MiB: the marketing name in lower case, words joined by dashes, without
/// the vendor, brand and form-factor words, and with the memory size for models sold in
/// several (`NVIDIA A100-SXM4-80GB` → `a100-80gb`, `NVIDIA GeForce RTX 4090` → `rtx-4090`,
/// `NVIDIA H100 80GB HBM3` → `h100`). The size is the name's, else the model's size nearest
/// to `memory_mib` (none when that is 0). None when nothing usable is left.
pub fn type_of_model(model: &str, memory_mib: u64) -> Option<String> {
    let mut words: Vec<String> = Vec::new();
    let mut named_size: Option<u64> = None;
    let tokens = model
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|t| !t.is_empty())
        .map(str::to_ascii_lowercase);
    for token in tokens {
        if let Some(gb) = size_in_gb(&token) {
            named_size = named_size.or(Some(gb));
        } else if !BRAND_WORDS.contains(&token.as_str()) && !FORM_WORDS.contains(&token.as_str()) {
            words.push(token);
        }
    }
    let base = words.join("-");
    let name = match MULTI_MEMORY.iter().find(|(model, _)| *model == base) {
        Some((_, sizes)) => match named_size.or_else(|| nearest_size(sizes, memory_mib)) {
            Some(gb) => format!("{base}-{gb}gb"),
            None => base,
        },
        None => base,
    };
    check_name(&name, "GPU type").ok().map(|()| name)
}

/// `80gb` or `80g` → 80.
fn size_in_gb(token: &str) -> Option<u64> {
    let digits = token
        .strip_suffix("gb")
        .or_else(|| token.strip_suffix('g'))?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|gb| *gb > 0)
}

/// The size among `sizes` (GB) nearest to `memory_mib`; None when the memory is unknown (0).
fn nearest_size(sizes: &[u64], memory_mib: u64) -> Option<u64> {
    if memory_mib == 0 {
        return None;
    }
    sizes
        .iter()
        .copied()
        .min_by_key(|gb| gb.saturating_mul(MIB_PER_GIB).abs_diff(memory_mib))
}

/// A type or feature name as the operator typed it, lower-cased and checked; the error is
/// `mgpu_protocol::gpu_type::check_name`'s sentence.
pub fn parse_name(text: &str, what: &str) -> Result<String, String> {
    let name = text.trim().to_ascii_lowercase();
    check_name(&name, what).map_err(|err| err.to_string())?;
    Ok(name)
}

/// `--gpu-type TYPE`.
pub fn parse_gpu_type(text: &str) -> Result<String, String> {
    parse_name(text, "GPU type")
}

/// `--feature NAME`.
pub fn parse_feature(text: &str) -> Result<String, String> {
    parse_name(text, "feature")
}

/// `--gpu-type-of INDEX=TYPE`: the type of the GPU of that index (NVML's numbering, as
/// `mgpu nodes` shows it).
pub fn parse_gpu_type_of(text: &str) -> Result<(u32, String), String> {
    let (index, name) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}` is not INDEX=TYPE (e.g. 0=h100)"))?;
    let index: u32 = index
        .trim()
        .parse()
        .map_err(|_| format!("`{text}`: `{}` is not a GPU index", index.trim()))?;
    Ok((index, parse_gpu_type(name)?))
}

/// The node's features as its heartbeats carry them: sorted, each once.
pub fn node_features(names: &[String]) -> Vec<String> {
    let mut features = names.to_vec();
    features.sort();
    features.dedup();
    features
}

/// The operator's GPU types: `--gpu-type-of` by index, over `--gpu-type` for every GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TypeOverrides {
    node: Option<String>,
    by_index: BTreeMap<u32, String>,
}

impl TypeOverrides {
    /// The overrides from `--gpu-type` and the `--gpu-type-of` values (names already
    /// checked); an index given two different types is an error.
    pub fn new(node: Option<String>, by_index: &[(u32, String)]) -> Result<Self, String> {
        let mut map = BTreeMap::new();
        for (index, name) in by_index {
            match map.insert(*index, name.clone()) {
                Some(earlier) if earlier != *name => {
                    return Err(format!(
                        "--gpu-type-of gives GPU {index} two types, `{earlier}` and `{name}`"
                    ));
                }
                _ => {}
            }
        }
        Ok(TypeOverrides {
            node,
            by_index: map,
        })
    }

    /// Whether there are none: the probe's types stand.
    pub fn is_empty(&self) -> bool {
        self.node.is_none() && self.by_index.is_empty()
    }

    /// Sets each GPU's type: its own override, else the node's, else what the probe said.
    pub fn apply(&self, gpus: &mut [GpuStatus]) {
        for gpu in gpus {
            if let Some(name) = self.by_index.get(&gpu.index).or(self.node.as_ref()) {
                gpu.gpu_type = Some(name.clone());
            }
        }
    }

    /// The `--gpu-type-of` indexes that no GPU of `gpus` has.
    pub fn unknown_indexes(&self, gpus: &[GpuStatus]) -> Vec<u32> {
        self.by_index
            .keys()
            .copied()
            .filter(|index| !gpus.iter().any(|gpu| gpu.index == *index))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1024;

    #[test]
    fn model_names_become_short_types() {
        for (model, memory_gib, expected) in [
            ("NVIDIA H100 80GB HBM3", 80, "h100"),
            ("NVIDIA H100 NVL", 94, "h100"),
            ("NVIDIA H100 PCIe", 80, "h100"),
            ("NVIDIA A100-SXM4-80GB", 80, "a100-80gb"),
            ("NVIDIA A100-PCIE-40GB", 40, "a100-40gb"),
            ("NVIDIA A100 80GB PCIe", 80, "a100-80gb"),
            ("NVIDIA GeForce RTX 4090", 24, "rtx-4090"),
            ("NVIDIA GeForce RTX 3090 Ti", 24, "rtx-3090-ti"),
            ("NVIDIA RTX A6000", 48, "rtx-a6000"),
            ("NVIDIA RTX 6000 Ada Generation", 48, "rtx-6000-ada"),
            ("Tesla V100-SXM2-32GB", 32, "v100-32gb"),
            ("Tesla V100-PCIE-16GB", 16, "v100-16gb"),
            ("Tesla V100-DGXS-32GB", 32, "v100-32gb"),
            ("NVIDIA A10G", 24, "a10g"),
            ("NVIDIA L40S", 48, "l40s"),
            ("Tesla T4", 15, "t4"),
            ("Quadro RTX 8000", 48, "rtx-8000"),
            ("NVIDIA H200", 141, "h200"),
            ("NVIDIA GH200 480GB", 96, "gh200"),
            ("NVIDIA TITAN RTX", 24, "titan-rtx"),
        ] {
            assert_eq!(
                type_of_model(model, memory_gib * GIB).as_deref(),
                Some(expected),
                "{model}"
            );
        }
    }

    #[test]
    fn a_multi_memory_model_without_a_size_in_its_name_takes_the_nearest() {
        // NVML reports a little less than the nominal size.
        assert_eq!(
            type_of_model("Tesla V100-SXM2", 32_510).as_deref(),
            Some("v100-32gb")
        );
        assert_eq!(
            type_of_model("Tesla V100-SXM2", 16_160).as_deref(),
            Some("v100-16gb")
        );
        assert_eq!(
            type_of_model("NVIDIA A100-SXM4", 81_920).as_deref(),
            Some("a100-80gb")
        );
        assert_eq!(
            type_of_model("NVIDIA A100-SXM4", 0).as_deref(),
            Some("a100")
        );
        // The name's size wins over the memory read.
        assert_eq!(
            type_of_model("NVIDIA A100-PCIE-40GB", 80 * GIB).as_deref(),
            Some("a100-40gb")
        );
    }

    #[test]
    fn names_with_nothing_usable_give_no_type() {
        for model in ["NVIDIA GPU", "", "NVIDIA", "Tesla PCIe 80GB", "-- --"] {
            assert_eq!(type_of_model(model, 80 * GIB), None, "{model:?}");
        }
        let long = "NVIDIA Some Extraordinarily Long Model Name That Goes On And On";
        assert_eq!(type_of_model(long, 80 * GIB), None);
    }

    #[test]
    fn derived_types_are_valid_names() {
        for model in [
            "NVIDIA A100-SXM4-80GB",
            "NVIDIA B200",
            "NVIDIA A10",
            "X_y z",
        ] {
            if let Some(name) = type_of_model(model, 40 * GIB) {
                assert!(check_name(&name, "GPU type").is_ok(), "{name}");
            }
        }
    }

    #[test]
    fn flag_values_are_lower_cased_and_checked() {
        assert_eq!(parse_gpu_type("A100-80GB"), Ok("a100-80gb".to_owned()));
        assert_eq!(parse_feature(" IB "), Ok("ib".to_owned()));
        assert_eq!(parse_gpu_type_of("0=H100"), Ok((0, "h100".to_owned())));
        assert_eq!(parse_gpu_type_of(" 3 = l40s"), Ok((3, "l40s".to_owned())));
        for bad in ["", "rtx 4090", "a100_80gb", "-h100"] {
            let err = parse_gpu_type(bad).err().unwrap_or_default();
            assert!(err.contains("GPU type"), "{bad:?}: {err}");
        }
        let err = parse_feature("nv/link").err().unwrap_or_default();
        assert!(err.contains("feature"), "{err}");
        for bad in ["h100", "x=h100", "-1=h100", "0=", "0=rtx 4090"] {
            assert!(parse_gpu_type_of(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn features_are_sorted_and_listed_once() {
        let given = ["nvlink", "ib", "nvlink"].map(str::to_owned);
        assert_eq!(node_features(&given), vec!["ib", "nvlink"]);
        assert!(node_features(&[]).is_empty());
    }

    #[test]
    fn an_index_given_two_types_is_refused() {
        let twice = [(0, "h100".to_owned()), (0, "a100".to_owned())];
        let err = TypeOverrides::new(None, &twice).err().unwrap_or_default();
        assert!(
            err.contains("GPU 0") && err.contains("--gpu-type-of"),
            "{err}"
        );
        let same = [(0, "h100".to_owned()), (0, "h100".to_owned())];
        assert!(TypeOverrides::new(None, &same).is_ok());
    }

    fn nvml_gpu(index: u32, name: &str, memory_total_mib: u64) -> GpuStatus {
        GpuStatus {
            index,
            uuid: format!("GPU-{index}"),
            name: name.to_owned(),
            gpu_type: type_of_model(name, memory_total_mib),
            memory_total_mib,
            memory_used_mib: 0,
            utilization_pct: 0,
            temperature_c: None,
            power_w: None,
            foreign_processes: Vec::new(),
        }
    }

    fn types(gpus: &[GpuStatus]) -> Vec<Option<&str>> {
        gpus.iter().map(|gpu| gpu.gpu_type.as_deref()).collect()
    }

    #[test]
    fn per_index_beats_node_wide_beats_the_probes_type() {
        let model = "NVIDIA A100-SXM4-80GB";
        let sample = || {
            (0..3)
                .map(|i| nvml_gpu(i, model, 80 * GIB))
                .collect::<Vec<_>>()
        };
        let mut gpus = sample();
        TypeOverrides::default().apply(&mut gpus);
        assert_eq!(types(&gpus), vec![Some("a100-80gb"); 3]);

        let Ok(one) = TypeOverrides::new(None, &[(1, "a100".to_owned())]) else {
            panic!("overrides refused");
        };
        let mut gpus = sample();
        one.apply(&mut gpus);
        assert_eq!(
            types(&gpus),
            vec![Some("a100-80gb"), Some("a100"), Some("a100-80gb")]
        );

        let Ok(both) = TypeOverrides::new(Some("l40s".to_owned()), &[(2, "h100".to_owned())])
        else {
            panic!("overrides refused");
        };
        let mut gpus = sample();
        both.apply(&mut gpus);
        assert_eq!(types(&gpus), vec![Some("l40s"), Some("l40s"), Some("h100")]);
        assert!(both.unknown_indexes(&gpus).is_empty());

        let Ok(missing) = TypeOverrides::new(None, &[(0, "t4".to_owned()), (7, "t4".to_owned())])
        else {
            panic!("overrides refused");
        };
        assert_eq!(missing.unknown_indexes(&gpus), vec![7]);
    }
}
