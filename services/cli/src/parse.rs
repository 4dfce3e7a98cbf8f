//! Parsers for what people type on the command line that the shared crate does not cover:
//! GPU id lists and memory sizes. Each error says what was wrong and what would be accepted.

use std::fmt;

use mgpu_shared::gpu_amount::GpuAmount;

/// `--gpu-ids 0,2` or `0-3` or `0-1,4`: physical GPU indices, in the order given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuIds(pub Vec<u32>);

impl fmt::Display for GpuIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::human::index_list(&self.0))
    }
}

pub fn gpu_ids(text: &str) -> Result<GpuIds, String> {
    let bad = |detail: String| {
        format!("`{text}` is not a GPU id list ({detail}): use indices like 0,2 or ranges like 0-3")
    };
    let index = |word: &str| -> Result<u32, String> {
        let word = word.trim();
        let value: u32 = word
            .parse()
            .map_err(|_| bad(format!("`{word}` is not a GPU index")))?;
        // Anything this large is a typo, and a range up to it would allocate for nothing.
        if value >= GpuAmount::MAX_GPUS {
            return Err(bad(format!("GPU {value} is beyond any node")));
        }
        Ok(value)
    };
    let mut ids = Vec::new();
    for part in text.split(',') {
        if part.trim().is_empty() {
            return Err(bad("an empty entry".into()));
        }
        match part.split_once('-') {
            Some((first, last)) => {
                let (first, last) = (index(first)?, index(last)?);
                if first > last {
                    return Err(bad(format!("the range {first}-{last} runs backwards")));
                }
                ids.extend(first..=last);
            }
            None => ids.push(index(part)?),
        }
    }
    Ok(GpuIds(ids))
}

/// `--mem`: GPU memory in MiB. A plain number is MiB; `512MiB`, `24GiB`, `1TiB` (and the
/// short `M`, `G`, `T`, or `MB`, `GB`, `TB`, read as the same binary units) are accepted.
pub fn mem_mib(text: &str) -> Result<u64, String> {
    let bad = || {
        format!("`{text}` is not a memory size: use MiB (24576) or a unit (512MiB, 24GiB, 1.5GiB)")
    };
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "m" | "mb" | "mib" => 1,
        "g" | "gb" | "gib" => 1024,
        "t" | "tb" | "tib" => 1024 * 1024,
        _ => return Err(bad()),
    };
    if number.is_empty() {
        return Err(bad());
    }
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(factor).ok_or_else(bad);
    }
    // Fractions only make sense with a larger unit, and must land on a whole MiB.
    let value: f64 = number.parse().map_err(|_| bad())?;
    let mib = value * factor as f64;
    if !mib.is_finite() || mib.fract() != 0.0 || mib > u64::MAX as f64 {
        return Err(format!(
            "`{text}` is not a whole number of MiB; give the size in MiB"
        ));
    }
    Ok(mib as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(text: &str) -> Option<Vec<u32>> {
        gpu_ids(text).ok().map(|ids| ids.0)
    }

    #[test]
    fn gpu_ids_take_lists_and_ranges() {
        assert_eq!(ids("0"), Some(vec![0]));
        assert_eq!(ids("0,2"), Some(vec![0, 2]));
        assert_eq!(ids("0-3"), Some(vec![0, 1, 2, 3]));
        assert_eq!(ids("0-1, 4"), Some(vec![0, 1, 4]));
        assert_eq!(ids("3-3"), Some(vec![3]));
    }

    #[test]
    fn bad_gpu_ids_say_why() {
        for bad in [
            "", "a", "0,", ",1", "3-1", "-1", "1-", "0-99999", "1.5", "0;1",
        ] {
            let err = gpu_ids(bad).err();
            assert!(err.is_some(), "`{bad}` accepted");
            assert!(err.unwrap_or_default().contains("GPU id list"));
        }
        let err = gpu_ids("3-1").err().unwrap_or_default();
        assert!(err.contains("runs backwards"), "{err}");
    }

    #[test]
    fn memory_sizes_take_mib_and_units() {
        assert_eq!(mem_mib("24576").ok(), Some(24_576));
        assert_eq!(mem_mib("512MiB").ok(), Some(512));
        assert_eq!(mem_mib("24GiB").ok(), Some(24_576));
        assert_eq!(mem_mib("24G").ok(), Some(24_576));
        assert_eq!(mem_mib("24gb").ok(), Some(24_576));
        assert_eq!(mem_mib("1.5GiB").ok(), Some(1_536));
        assert_eq!(mem_mib("1TiB").ok(), Some(1_048_576));
        assert_eq!(mem_mib(" 80 GiB ").ok(), Some(81_920));
    }

    #[test]
    fn bad_memory_sizes_are_refused() {
        for bad in [
            "",
            "GiB",
            "abc",
            "-5",
            "12KiB",
            "1.5",
            "0.3MiB",
            "1e3",
            "99999999999999999999T",
        ] {
            assert!(mem_mib(bad).is_err(), "`{bad}` accepted");
        }
    }
}
