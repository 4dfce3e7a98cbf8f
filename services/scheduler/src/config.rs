//! The scheduler's configuration: its config file (`--config`, by default
//! `/etc/mgpu/scheduler.toml`), read with `mgpu-config` (a key per flag, flags and environment
//! over the file), whose `[policy]` section is the scheduling policy; and what follows from the
//! policy for one job (its time limit, its host resources).
//!
//! ```toml
//! server = "nats://sched:4222"  # any flag, by its long name with `_` for `-`
//! missed_heartbeats = 3
//!
//! [policy]
//! placement = "fill_first"     # or "spread"
//! max_job_time = "12h"         # cluster-wide time limit (slices for --on-timeout requeue)
//! age_weight = 100.0           # effective-priority points per hour waited
//! age_cap = "7d"               # age stops counting after this
//! fairshare_weight = 100.0     # points per decayed GPU-hour of the user's usage
//! half_life = "1d"             # usage halves every half_life
//! max_reservations = 16        # blocked jobs that get a backfill reservation
//! max_start_estimates = 256    # waiting jobs past those that get an expected start
//! topology_label = "rack"      # multi-node jobs prefer nodes sharing this label ("" = off)
//! cpus_per_gpu = 8             # CPU cores a job without --cpus gets per GPU (0 = not counted)
//! mem_per_gpu = "64GiB"        # host memory a job without --mem-host gets per GPU ("0" = none)
//! require_gpu_isolation = true # place jobs only where a job can open only its own GPUs
//! keep_finished = "1d"         # finished jobs move to the history stream after this
//! private_output = true        # every job's output readable by its owner and admins only
//! ```
//!
//! The policy file of before (these keys alone, at the top level) still loads as `[policy]`.

use std::path::Path;

use anyhow::{Context, Result};
use serde::Deserialize;

use mgpu_config::{Setting, Settings, Source};
use mgpu_protocol::duration::parse_duration;
use mgpu_protocol::job::JobSpec;
use mgpu_protocol::priority::{PlacementPolicy, Policy};

/// The keys of `[policy]`, which are [`ConfigFile`]'s fields (a test keeps the two equal).
pub const POLICY_KEYS: &[&str] = &[
    "placement",
    "max_job_time",
    "age_weight",
    "age_cap",
    "fairshare_weight",
    "half_life",
    "max_reservations",
    "max_start_estimates",
    "topology_label",
    "cpus_per_gpu",
    "mem_per_gpu",
    "require_gpu_isolation",
    "keep_finished",
    "private_output",
];

/// What the config file holds beside the flags' keys: the `[policy]` section (and the policy
/// file of before read as that section) and the per-user `[limits]` (`limits.rs`).
pub const SERVICE: mgpu_config::Service = mgpu_config::Service {
    command_line_only: &["print_config"],
    sections: &["policy", "limits", "qos", "idle", "reservations"],
    legacy: Some(mgpu_config::Legacy {
        section: "policy",
        keys: POLICY_KEYS,
    }),
};

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
    max_start_estimates: Option<usize>,
    topology_label: Option<String>,
    cpus_per_gpu: Option<u32>,
    mem_per_gpu: Option<String>,
    require_gpu_isolation: Option<bool>,
    keep_finished: Option<String>,
    private_output: Option<bool>,
}

/// The `[policy]` table of the config file, if it has one.
pub fn policy_section(sections: &toml::Table) -> Option<&toml::Table> {
    sections.get("policy").and_then(toml::Value::as_table)
}

/// The policy `section` sets over the defaults; `file` names it in errors.
pub fn load_policy(section: Option<&toml::Table>, file: Option<&Path>) -> Result<Policy> {
    let mut policy = Policy::default();
    let Some(section) = section else {
        return Ok(policy);
    };
    let file = file.map_or_else(|| "the config file".to_owned(), |f| f.display().to_string());
    // serde names an unknown key and lists the known ones.
    toml::Value::Table(section.clone())
        .try_into()
        .map_err(anyhow::Error::from)
        .and_then(|keys| apply_policy(&mut policy, &keys))
        .with_context(|| format!("[policy] in {file}"))?;
    Ok(policy)
}

/// The keys of `[policy]` over the defaults, each checked.
fn apply_policy(policy: &mut Policy, file: &ConfigFile) -> Result<()> {
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
    if let Some(n) = file.max_start_estimates {
        policy.max_start_estimates = n;
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
    apply_host_defaults(policy, file)
}

/// `cpus_per_gpu`, `mem_per_gpu`, `require_gpu_isolation` and `private_output`.
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
    if let Some(private) = file.private_output {
        policy.private_output = private;
    }
    Ok(())
}

/// `[policy]` as `--print-config` shows it: every key with the value in force, and where it
/// came from; `placement` and `max_job_time` may come from the flags (or top-level keys) of
/// the same name, which `flags` has.
pub fn policy_settings(
    policy: &Policy,
    section: Option<&toml::Table>,
    flags: &Settings,
) -> Vec<Setting> {
    use toml::Value;
    let duration = |secs: u64| Value::String(exact_duration(secs));
    let placement = match policy.placement {
        PlacementPolicy::FillFirst => "fill_first",
        PlacementPolicy::Spread => "spread",
    };
    let age_cap_secs = (policy.age_cap_hours * 3600.0).round() as u64;
    let values = [
        ("placement", Some(Value::String(placement.into()))),
        ("max_job_time", policy.max_job_time_secs.map(duration)),
        ("age_weight", Some(Value::Float(policy.age_weight))),
        ("age_cap", Some(duration(age_cap_secs))),
        (
            "fairshare_weight",
            Some(Value::Float(policy.fairshare_weight)),
        ),
        ("half_life", Some(duration(policy.half_life_secs))),
        (
            "max_reservations",
            Some(Value::Integer(
                i64::try_from(policy.max_reservations).unwrap_or(i64::MAX),
            )),
        ),
        (
            "max_start_estimates",
            Some(Value::Integer(
                i64::try_from(policy.max_start_estimates).unwrap_or(i64::MAX),
            )),
        ),
        (
            "topology_label",
            Some(Value::String(policy.topology_label.clone())),
        ),
        (
            "cpus_per_gpu",
            Some(Value::Integer(policy.cpus_per_gpu.into())),
        ),
        (
            "mem_per_gpu",
            Some(Value::String(mib_text(policy.mem_per_gpu_mib))),
        ),
        (
            "require_gpu_isolation",
            Some(Value::Boolean(policy.require_gpu_isolation)),
        ),
        ("keep_finished", Some(duration(policy.keep_finished_secs))),
        (
            "private_output",
            Some(Value::Boolean(policy.private_output)),
        ),
    ];
    values
        .into_iter()
        .map(|(key, value)| {
            let by_flag = flags
                .get(key)
                .is_some_and(|flag| flag.value.is_some() && flag.source != Source::Default);
            let source = if by_flag {
                Source::Note(format!("from `{key}` above"))
            } else if section.is_some_and(|keys| keys.contains_key(key)) {
                Source::File
            } else {
                Source::Default
            };
            Setting {
                key: key.to_owned(),
                value,
                source,
            }
        })
        .collect()
}

/// A duration as the config file takes it, exactly: `1d2h`, `90s` rather than `1m30s`'s
/// rounding in listings.
fn exact_duration(secs: u64) -> String {
    if secs == 0 {
        return "0s".into();
    }
    let parts = [
        (secs / 86_400, "d"),
        (secs % 86_400 / 3600, "h"),
        (secs % 3600 / 60, "m"),
        (secs % 60, "s"),
    ];
    parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect()
}

/// A size in MiB as the config file takes it: `64GiB`, `1536MiB`, `0`.
fn mib_text(mib: u64) -> String {
    match mib {
        0 => "0".into(),
        _ if mib.is_multiple_of(1024) => format!("{}GiB", mib / 1024),
        _ => format!("{mib}MiB"),
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

    /// The policy a `[policy]` section written as TOML gives.
    fn policy(text: &str) -> Result<Policy> {
        let table: toml::Table = text.parse()?;
        load_policy(Some(&table), Some(Path::new("/etc/mgpu/scheduler.toml")))
    }

    #[test]
    fn the_policy_section_sets_the_policy_and_typos_are_errors() {
        let policy = policy("placement = \"spread\"\nmax_job_time = \"10m\"\nhalf_life = \"1h\"\n")
            .unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(policy.placement, PlacementPolicy::Spread);
        assert_eq!(policy.max_job_time_secs, Some(600));
        assert_eq!(policy.half_life_secs, 3600);
        let err = policy_error("placment = \"spread\"\n");
        assert!(
            err.contains("placment") && err.contains("[policy] in /etc/mgpu/scheduler.toml"),
            "{err}"
        );
        let err = policy_error("half_life = \"soon\"\n");
        assert!(err.contains("half_life") && err.contains("soon"), "{err}");
        assert_eq!(load_policy(None, None).ok(), Some(Policy::default()));
    }

    fn policy_error(text: &str) -> String {
        policy(text)
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default()
    }

    #[test]
    fn the_policy_keys_are_the_sections_fields() {
        // serde lists the fields it knows when it meets one it does not.
        let err = policy_error("not_a_key = 1\n");
        let listed: Vec<&str> = err
            .split("expected one of")
            .nth(1)
            .unwrap_or_default()
            .split('`')
            .skip(1)
            .step_by(2)
            .collect();
        assert_eq!(listed, POLICY_KEYS, "{err}");
    }

    #[test]
    fn printed_policy_values_read_back_as_the_same_policy() {
        let text = "placement = \"spread\"\nmax_job_time = \"1d2h3m4s\"\nage_cap = \"90m\"\n\
                    mem_per_gpu = \"1536MiB\"\ncpus_per_gpu = 4\nrequire_gpu_isolation = true\n";
        let first = policy(text).unwrap_or_else(|e| panic!("{e:#}"));
        let section: toml::Table = text.parse().unwrap_or_default();
        let settings = policy_settings(&first, Some(&section), &Settings::default());
        let source = |key: &str| {
            settings
                .iter()
                .find(|s| s.key == key)
                .map(|s| s.source.clone())
        };
        assert_eq!(source("placement"), Some(Source::File));
        assert_eq!(source("half_life"), Some(Source::Default));
        let printed: toml::Table = settings
            .iter()
            .filter_map(|s| Some((s.key.clone(), s.value.clone()?)))
            .collect();
        let again = load_policy(Some(&printed), None).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(again, first);
        assert_eq!(exact_duration(93_784), "1d2h3m4s");
        assert_eq!(mib_text(64 * 1024), "64GiB");
    }

    #[test]
    fn host_defaults_per_gpu_apply_to_jobs_that_do_not_say() {
        let policy =
            policy("cpus_per_gpu = 4\nmem_per_gpu = \"16GiB\"\nrequire_gpu_isolation = true\n")
                .unwrap_or_else(|e| panic!("{e:#}"));
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
        assert!(policy_error("mem_per_gpu = \"lots\"\n").contains("mem_per_gpu"));
    }
}
