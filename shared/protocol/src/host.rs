//! Host resources, next to the GPUs: CPU cores and host memory (RAM) a job asks for
//! (`--cpus`, `--mem-host`), memory sizes as people type them, and what a job used, as its
//! node measured it from the job's cgroup (and NVML) when it ended.

use serde::{Deserialize, Serialize};

use crate::error::InvalidInput;

/// Most CPU cores one job may ask for on a node (a large host has a few hundred).
pub const MAX_CPUS: u32 = 65_536;
/// Largest host memory anyone could ask for, in MiB (1 PiB).
pub const MAX_MEM_HOST_MIB: u64 = 1024 * 1024 * 1024;

/// Parses a memory size: MiB (`24576`) or with a unit (`512MiB`, `24GiB`, `1.5GiB`, `1TiB`;
/// `M`/`MB`, `G`/`GB`, `T`/`TB` mean the binary units, as GPU vendors and Slurm use them).
pub fn parse_mib(text: &str) -> Result<u64, String> {
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

/// A size in MiB as people read it: `512 MiB`, `24 GiB`, `1.5 GiB`.
pub fn format_mib(mib: u64) -> String {
    if mib >= 1024 && mib.is_multiple_of(1024) {
        format!("{} GiB", mib / 1024)
    } else if mib >= 1024 {
        format!("{:.1} GiB", mib as f64 / 1024.0)
    } else {
        format!("{mib} MiB")
    }
}

/// Checks `--cpus` and `--mem-host` as a job asks for them.
pub fn check_request(cpus: Option<u32>, mem_host_mib: Option<u64>) -> Result<(), InvalidInput> {
    if let Some(cpus) = cpus
        && !(1..=MAX_CPUS).contains(&cpus)
    {
        return Err(InvalidInput::new(format!(
            "--cpus {cpus}: a job needs at least 1 CPU core (and at most {MAX_CPUS})"
        )));
    }
    if let Some(mib) = mem_host_mib
        && !(1..=MAX_MEM_HOST_MIB).contains(&mib)
    {
        return Err(InvalidInput::new(format!(
            "--mem-host {mib} MiB: a job needs more than 0 host memory (and at most 1 PiB)"
        )));
    }
    Ok(())
}

/// What one attempt of a job used, measured by its node when it ended. Each part is None
/// where the node could not measure it (no cgroup, no NVML).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobUsage {
    /// The most host memory the job's processes held at once (its cgroup's peak), in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_mem_host_bytes: Option<u64>,
    /// CPU time used by all of its processes (user and system), in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_time_ms: Option<u64>,
    /// The most memory its processes held on each of its GPUs (NVML), in MiB.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_peak_mem: Vec<GpuPeak>,
    /// GPU-seconds its GPUs spent idle (see `idle`), where the agent measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_gpu_secs: Option<u64>,
}

/// Peak memory on one GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuPeak {
    pub index: u32,
    pub peak_mib: u64,
}

impl JobUsage {
    /// Whether nothing was measured.
    pub fn is_empty(&self) -> bool {
        self.peak_mem_host_bytes.is_none()
            && self.cpu_time_ms.is_none()
            && self.gpu_peak_mem.is_empty()
            && self.idle_gpu_secs.is_none()
    }

    /// Refuses what no node could have measured (a hostile report).
    pub fn validate(&self) -> Result<(), InvalidInput> {
        crate::wire::check_count(
            "GPUs in a usage report",
            self.gpu_peak_mem.len(),
            crate::gpu_amount::GpuAmount::MAX_GPUS as usize,
        )?;
        if self
            .gpu_peak_mem
            .iter()
            .any(|gpu| gpu.peak_mib > crate::gpu_amount::MAX_GPU_MEMORY_MIB)
        {
            return Err(InvalidInput::new("a GPU peak memory is not plausible"));
        }
        if let Some(secs) = self.idle_gpu_secs {
            crate::idle::IdleSample {
                idle_for_secs: 0,
                idle_gpu_secs: secs,
            }
            .validate()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_sizes_read_as_typed() {
        assert_eq!(parse_mib("24576"), Ok(24576));
        assert_eq!(parse_mib("64MiB"), Ok(64));
        assert_eq!(parse_mib("24GiB"), Ok(24 * 1024));
        assert_eq!(parse_mib("1.5G"), Ok(1536));
        assert_eq!(parse_mib("1tb"), Ok(1024 * 1024));
        assert!(parse_mib("lots").is_err());
        assert!(parse_mib("1.3MiB").is_err());
        assert!(parse_mib("GiB").is_err());
    }

    #[test]
    fn sizes_print_in_the_largest_fitting_unit() {
        assert_eq!(format_mib(64), "64 MiB");
        assert_eq!(format_mib(2048), "2 GiB");
        assert_eq!(format_mib(1536), "1.5 GiB");
    }

    #[test]
    fn zero_or_absurd_requests_are_refused_with_the_flag_named() {
        assert!(check_request(Some(1), Some(64)).is_ok());
        assert!(check_request(None, None).is_ok());
        let zero_cpus = check_request(Some(0), None).err().map(|e| e.to_string());
        assert!(zero_cpus.is_some_and(|e| e.contains("--cpus 0")));
        let zero_mem = check_request(None, Some(0)).err().map(|e| e.to_string());
        assert!(zero_mem.is_some_and(|e| e.contains("--mem-host 0")));
        assert!(check_request(None, Some(MAX_MEM_HOST_MIB + 1)).is_err());
    }
}
