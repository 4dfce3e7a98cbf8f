//! The scheduler's configuration: a TOML file (`--config`) and flags that override it, and
//! what follows from it for one job (its time limit).
//!
//! ```toml
//! placement = "fill_first"     # or "spread"
//! max_job_time = "12h"         # cluster-wide time limit (slices for --on-timeout requeue)
//! age_weight = 100.0           # effective-priority points per hour waited
//! age_cap = "7d"               # age stops counting after this
//! fairshare_weight = 100.0     # points per decayed GPU-hour of the user's usage
//! half_life = "1d"             # usage halves every half_life
//! max_reservations = 16        # blocked jobs that get a backfill reservation
//! topology_label = "rack"      # multi-node jobs prefer nodes sharing this label ("" = off)
//! cpus_per_gpu = 8             # CPU cores a job without --cpus gets per GPU (0 = not counted)
//! mem_per_gpu = "64GiB"        # host memory a job without --mem-host gets per GPU ("0" = none)
//! require_gpu_isolation = true # place jobs only where a job can open only its own GPUs
//! keep_finished = "1d"         # finished jobs move to the history stream after this
//! ```

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Deserialize;

use mgpu_protocol::duration::parse_duration;
use mgpu_protocol::job::JobSpec;
use mgpu_protocol::priority::{PlacementPolicy, Policy};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    placement: Option<PlacementPolicy>,
    max_job_time: Option<String>,
    age_weight: Option<f64>,
    age_cap: Option<String>,
    fairshare_weight: Option<f64>,
    half_life: Option<String>,
    max_reservations: Option<usize>,
    topology_label: Option<String>,
    cpus_per_gpu: Option<u32>,
    mem_per_gpu: Option<String>,
    require_gpu_isolation: Option<bool>,
    keep_finished: Option<String>,
}

/// Reads the policy from `path` (if any) over the defaults.
pub fn load_policy(path: Option<&Path>) -> Result<Policy> {
    let mut policy = Policy::default();
    let Some(path) = path else {
        return Ok(policy);
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config {}", path.display()))?;
    let file: ConfigFile =
        toml::from_str(&text).with_context(|| format!("config {}", path.display()))?;
    let seconds = |text: &str| -> Result<u64> { Ok(parse_duration(text)?.as_secs()) };
    if let Some(p) = file.placement {
        policy.placement = p;
    }
    if let Some(t) = &file.max_job_time {
        policy.max_job_time_secs = Some(seconds(t).context("max_job_time")?);
    }
    if let Some(w) = file.age_weight {
        anyhow::ensure!(w.is_finite() && w >= 0.0, "age_weight must be 0 or more");
        policy.age_weight = w;
    }
    if let Some(t) = &file.age_cap {
        policy.age_cap_hours = seconds(t).context("age_cap")? as f64 / 3600.0;
    }
    if let Some(w) = file.fairshare_weight {
        anyhow::ensure!(
            w.is_finite() && w >= 0.0,
            "fairshare_weight must be 0 or more"
        );
        policy.fairshare_weight = w;
    }
    if let Some(t) = &file.half_life {
        policy.half_life_secs = seconds(t).context("half_life")?;
    }
    if let Some(t) = &file.keep_finished {
        policy.keep_finished_secs = seconds(t).context("keep_finished")?;
    }
    if let Some(n) = file.max_reservations {
        policy.max_reservations = n;
    }
    if let Some(label) = file.topology_label.clone() {
        anyhow::ensure!(
            label
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c)),
            "topology_label `{label}` must be letters, digits, `-`, `_`, `.` or `/`"
        );
        policy.topology_label = label;
    }
    apply_host_defaults(&mut policy, &file)?;
    Ok(policy)
}

/// `cpus_per_gpu`, `mem_per_gpu` and `require_gpu_isolation`.
fn apply_host_defaults(policy: &mut Policy, file: &ConfigFile) -> Result<()> {
    if let Some(cpus) = file.cpus_per_gpu {
        anyhow::ensure!(
            cpus <= mgpu_protocol::host::MAX_CPUS,
            "cpus_per_gpu {cpus} is more cores than any host has"
        );
        policy.cpus_per_gpu = cpus;
    }
    if let Some(size) = &file.mem_per_gpu {
        policy.mem_per_gpu_mib = mgpu_protocol::host::parse_mib(size)
            .map_err(|err| anyhow::anyhow!("mem_per_gpu: {err}"))?;
    }
    if let Some(required) = file.require_gpu_isolation {
        policy.require_gpu_isolation = required;
    }
    Ok(())
}

/// The time limit a job runs under: its own, capped by the cluster's `max_job_time`.
pub fn effective_time_limit(policy: &Policy, spec: &JobSpec) -> Option<Duration> {
    let cluster = policy.max_job_time_secs.map(Duration::from_secs);
    match (spec.time_limit(), cluster) {
        (Some(own), Some(max)) => Some(own.min(max)),
        (own, max) => own.or(max),
    }
}

/// The CPU cores and host memory (MiB) a job is booked on each of its nodes: what it asked
/// for (`--cpus`, `--mem-host`), else the cluster's `cpus_per_gpu` and `mem_per_gpu` for each
/// GPU it asks for (a share or none counts as one); 0: not counted.
pub fn effective_host_request(policy: &Policy, spec: &JobSpec) -> (u32, u64) {
    let gpus = spec.gpus.gpu_count().max(1);
    let cpus = spec
        .cpus
        .unwrap_or_else(|| policy.cpus_per_gpu.saturating_mul(gpus));
    let mem = spec
        .mem_host_mib
        .unwrap_or_else(|| policy.mem_per_gpu_mib.saturating_mul(u64::from(gpus)));
    (cpus, mem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_file_sets_the_policy_and_typos_are_errors() {
        let dir = std::env::temp_dir().join(format!("mgpu-config-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let good = dir.join("good.toml");
        let _ = std::fs::write(
            &good,
            "placement = \"spread\"\nmax_job_time = \"10m\"\nhalf_life = \"1h\"\n",
        );
        let policy = load_policy(Some(&good)).ok();
        assert_eq!(
            policy.as_ref().map(|p| p.placement),
            Some(PlacementPolicy::Spread)
        );
        assert_eq!(policy.as_ref().and_then(|p| p.max_job_time_secs), Some(600));
        let bad = dir.join("bad.toml");
        let _ = std::fs::write(&bad, "placment = \"spread\"\n");
        assert!(load_policy(Some(&bad)).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn host_defaults_per_gpu_apply_to_jobs_that_do_not_say() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let file = dir.path().join("host.toml");
        let _ = std::fs::write(
            &file,
            "cpus_per_gpu = 4\nmem_per_gpu = \"16GiB\"\nrequire_gpu_isolation = true\n",
        );
        let policy = load_policy(Some(&file)).unwrap_or_else(|e| panic!("{e:#}"));
        assert!(policy.require_gpu_isolation);
        let mut spec = JobSpec::new(vec!["true".into()], "/");
        spec.gpus = mgpu_protocol::gpu_amount::GpuAmount::whole(2);
        assert_eq!(effective_host_request(&policy, &spec), (8, 32 * 1024));
        spec.cpus = Some(1);
        spec.mem_host_mib = Some(64);
        assert_eq!(effective_host_request(&policy, &spec), (1, 64));
        assert_eq!(
            effective_host_request(&Policy::default(), &JobSpec::new(vec![], "/")),
            (0, 0)
        );
        let _ = std::fs::write(&file, "mem_per_gpu = \"lots\"\n");
        let err = load_policy(Some(&file)).err().map(|e| format!("{e:#}"));
        assert!(err.is_some_and(|e| e.contains("mem_per_gpu")));
    }
}
