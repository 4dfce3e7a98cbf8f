//! The declared GPU inventory as operators type it (`--gpus 2x24GiB`, `4x80GiB,2x16GiB`,
//! `2x24GiB:rtx-4090,1x80GiB:a100-80gb`): comma-separated `COUNTxSIZE[:TYPE]` groups, numbered
//! in the order given; a group's GPUs report its type, if it has one.

use std::fmt;

/// More GPUs than this on one host is a typo.
const MAX_DECLARED_GPUS: u32 = 1024;
/// Largest memory a declared GPU may have (16 TiB), the same bound job specs use for `--mem`.
const MAX_GPU_MEMORY_MIB: u64 = 16 * 1024 * 1024;

/// `count` identical GPUs with `memory_mib` MiB each, of type `gpu_type` (a checked,
/// lower-case name) when the operator gave one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuGroup {
    pub count: u32,
    pub memory_mib: u64,
    pub gpu_type: Option<String>,
}

/// A parsed `--gpus` / `--fallback-gpus` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeclaredSpec {
    pub groups: Vec<GpuGroup>,
}

impl DeclaredSpec {
    /// Memory and type of each GPU in index order.
    pub fn gpus(&self) -> impl Iterator<Item = (u64, Option<&str>)> + '_ {
        self.groups.iter().flat_map(|g| {
            std::iter::repeat_n((g.memory_mib, g.gpu_type.as_deref()), g.count as usize)
        })
    }
}

/// Canonical form (`2x24GiB,1x16384MiB:t4` style), used in notes and logs.
impl fmt::Display for DeclaredSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, group) in self.groups.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let mib = group.memory_mib;
            if mib % (1024 * 1024) == 0 {
                write!(f, "{}x{}TiB", group.count, mib / (1024 * 1024))?;
            } else if mib % 1024 == 0 {
                write!(f, "{}x{}GiB", group.count, mib / 1024)?;
            } else {
                write!(f, "{}x{}MiB", group.count, mib)?;
            }
            if let Some(gpu_type) = &group.gpu_type {
                write!(f, ":{gpu_type}")?;
            }
        }
        Ok(())
    }
}

/// Parses a declared inventory. The error is a sentence for the person who typed it (clap
/// prints it after the flag name).
pub fn parse_gpu_spec(text: &str) -> Result<DeclaredSpec, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err("empty GPU inventory: write COUNTxSIZE[:TYPE] groups, e.g. 2x24GiB".into());
    }
    let mut groups = Vec::new();
    let mut total: u32 = 0;
    for part in trimmed.split(',').map(str::trim) {
        let group = parse_group(part)?;
        total = total.saturating_add(group.count);
        groups.push(group);
    }
    if total > MAX_DECLARED_GPUS {
        return Err(format!(
            "`{trimmed}` declares {total} GPUs; at most {MAX_DECLARED_GPUS} are supported"
        ));
    }
    Ok(DeclaredSpec { groups })
}

fn parse_group(part: &str) -> Result<GpuGroup, String> {
    if part.is_empty() {
        return Err("empty group in GPU inventory (two commas in a row?)".into());
    }
    let (shape, gpu_type) = match part.split_once(':') {
        Some((shape, name)) => {
            let name =
                crate::gpu_type::parse_gpu_type(name).map_err(|why| format!("`{part}`: {why}"))?;
            (shape.trim(), Some(name))
        }
        None => (part, None),
    };
    let Some((count, size)) = shape.split_once(['x', 'X']) else {
        return Err(
            if !shape.is_empty() && shape.bytes().all(|b| b.is_ascii_digit()) {
                format!(
                    "`{shape}` gives a GPU count but no memory size: write {shape}x24GiB (COUNTxSIZE)"
                )
            } else {
                format!(
                    "`{part}` is not COUNTxSIZE[:TYPE] (e.g. 2x24GiB, 4x80G, 1x16384MiB, 2x24GiB:rtx-4090)"
                )
            },
        );
    };
    let count: u32 = count
        .trim()
        .parse()
        .map_err(|_| format!("`{part}`: `{count}` is not a GPU count"))?;
    if count == 0 {
        return Err(format!("`{part}`: a group needs at least one GPU"));
    }
    let memory_mib = parse_memory_size(size.trim()).map_err(|why| format!("`{part}`: {why}"))?;
    Ok(GpuGroup {
        count,
        memory_mib,
        gpu_type,
    })
}

/// `24GiB`, `80G`, `80GB`, `16384MiB`, `1TiB` (units case-insensitive; G and GB mean GiB, as
/// GPU vendors use them) → MiB.
fn parse_memory_size(size: &str) -> Result<u64, String> {
    let digits_end = size
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(size.len());
    let (number, unit) = size.split_at(digits_end);
    if number.is_empty() {
        return Err(format!(
            "`{size}` is not a memory size (e.g. 24GiB, 80G, 16384MiB)"
        ));
    }
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" => {
            return Err(format!(
                "memory size `{size}` needs a unit: {size}GiB or {size}MiB"
            ));
        }
        "m" | "mb" | "mib" => 1,
        "g" | "gb" | "gib" => 1024,
        "t" | "tb" | "tib" => 1024 * 1024,
        other => {
            return Err(format!(
                "unknown memory unit `{other}` in `{size}` (use MiB, GiB or TiB)"
            ));
        }
    };
    let mib = number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .filter(|mib| *mib <= MAX_GPU_MEMORY_MIB)
        .ok_or_else(|| format!("memory size `{size}` is larger than 16 TiB"))?;
    if mib == 0 {
        return Err("a GPU needs more than 0 memory".into());
    }
    Ok(mib)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(text: &str) -> Option<Vec<(u32, u64)>> {
        parse_gpu_spec(text)
            .ok()
            .map(|s| s.groups.iter().map(|g| (g.count, g.memory_mib)).collect())
    }

    #[test]
    fn documented_forms_parse() {
        assert_eq!(groups("2x24GiB"), Some(vec![(2, 24 * 1024)]));
        assert_eq!(groups("1x80G"), Some(vec![(1, 80 * 1024)]));
        assert_eq!(groups("1x80GB"), Some(vec![(1, 80 * 1024)]));
        assert_eq!(groups("3x16384MiB"), Some(vec![(3, 16384)]));
        assert_eq!(groups("1X1TiB"), Some(vec![(1, 1024 * 1024)]));
        assert_eq!(
            groups(" 4x80GiB, 2x16gib "),
            Some(vec![(4, 80 * 1024), (2, 16 * 1024)])
        );
    }

    #[test]
    fn gpus_are_numbered_in_group_order() {
        let spec = parse_gpu_spec("1x80GiB,2x16GiB").ok();
        let memory: Option<Vec<u64>> = spec.map(|s| s.gpus().map(|(mib, _)| mib).collect());
        assert_eq!(memory, Some(vec![80 * 1024, 16 * 1024, 16 * 1024]));
    }

    #[test]
    fn groups_may_carry_a_type() {
        let Ok(spec) = parse_gpu_spec("2x24GiB:RTX-4090, 1x80GiB:a100-80gb,1x16GiB") else {
            panic!("typed inventory refused");
        };
        let gpus: Vec<(u64, Option<&str>)> = spec.gpus().collect();
        assert_eq!(
            gpus,
            vec![
                (24 * 1024, Some("rtx-4090")),
                (24 * 1024, Some("rtx-4090")),
                (80 * 1024, Some("a100-80gb")),
                (16 * 1024, None),
            ]
        );
        assert_eq!(
            spec.to_string(),
            "2x24GiB:rtx-4090,1x80GiB:a100-80gb,1x16GiB"
        );
        for bad in [
            "2x24GiB:",
            "2x24GiB:rtx 4090",
            "2x24GiB:rtx_4090",
            "2x24GiB:-x",
            ":t4",
        ] {
            let err = parse_gpu_spec(bad).err().unwrap_or_default();
            assert!(!err.is_empty(), "`{bad}` accepted");
        }
        let err = parse_gpu_spec("2x24GiB:rtx_4090").err().unwrap_or_default();
        assert!(
            err.contains("2x24GiB:rtx_4090") && err.contains("GPU type `rtx_4090`"),
            "{err}"
        );
        let err = parse_gpu_spec("2:t4").err().unwrap_or_default();
        assert!(err.contains("no memory size"), "{err}");
    }

    #[test]
    fn bad_inventories_are_refused_with_a_reason() {
        for bad in [
            "",
            "4",
            "x24GiB",
            "2x",
            "2x24",
            "0x24GiB",
            "2x0GiB",
            "2x24PiB",
            "2x24GiB,,1x8GiB",
            "twox24GiB",
            "2x24GiBx",
            "2000x24GiB",
            "2x99999TiB",
            "-1x24GiB",
            "2x-24GiB",
        ] {
            let result = parse_gpu_spec(bad);
            assert!(result.is_err(), "`{bad}` accepted: {result:?}");
        }
        let bare = parse_gpu_spec("4").err().unwrap_or_default();
        assert!(bare.contains("no memory size"), "{bare}");
        let unitless = parse_gpu_spec("2x24").err().unwrap_or_default();
        assert!(unitless.contains("needs a unit"), "{unitless}");
    }

    #[test]
    fn the_canonical_form_reads_back() {
        for text in [
            "2x24GiB",
            "4x80GiB,2x16GiB",
            "1x1000MiB",
            "1x2TiB",
            "1x15GiB:t4",
        ] {
            let shown = parse_gpu_spec(text).map(|s| s.to_string()).ok();
            assert_eq!(shown.as_deref(), Some(text));
        }
        let shown = parse_gpu_spec("2x24576MiB").map(|s| s.to_string()).ok();
        assert_eq!(shown.as_deref(), Some("2x24GiB"));
    }
}
