//! The `[idle]` section of the scheduler's config file: the policy that reclaims GPUs held
//! idle while others wait (`mgpu_protocol::idle::IdlePolicy`). Without the section, agents
//! still measure idleness (below 5 %) for accounting, and nothing is reclaimed.
//!
//! ```toml
//! [idle]
//! after = "2h"        # idle this long (below min_util, memory not growing): owner warned
//! min_util = 5        # percent of GPU time a kernel ran, below which a GPU is idle
//! grace = "30m"       # after the warning, before the action
//! action = "requeue"  # or "cancel", or "warn" (only warn)
//! ```

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use mgpu_protocol::duration::{format_duration, parse_duration};
use mgpu_protocol::idle::{IdleAction, IdlePolicy};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct IdleSection {
    after: Option<String>,
    min_util: Option<u32>,
    grace: Option<String>,
    action: Option<IdleAction>,
}

/// The policy of the `[idle]` table (None: no table, nothing reclaimed).
pub fn load(idle: Option<&toml::Value>) -> Result<Option<IdlePolicy>> {
    let Some(idle) = idle else {
        return Ok(None);
    };
    let section: IdleSection = idle
        .clone()
        .try_into()
        .context("[idle]: keys are after, min_util, grace and action (requeue, cancel or warn)")?;
    let defaults = IdlePolicy::default();
    let seconds = |text: &Option<String>, default: u64, key: &str| -> Result<u64> {
        match text {
            Some(text) => Ok(parse_duration(text)
                .with_context(|| format!("[idle] {key}"))?
                .as_secs()),
            None => Ok(default),
        }
    };
    let policy = IdlePolicy {
        after_secs: seconds(&section.after, defaults.after_secs, "after")?,
        min_util_pct: section.min_util.unwrap_or(defaults.min_util_pct),
        grace_secs: seconds(&section.grace, defaults.grace_secs, "grace")?,
        action: section.action.unwrap_or(defaults.action),
    };
    if policy.min_util_pct == 0 || policy.min_util_pct > 100 {
        bail!(
            "[idle] min_util: {} is not a percentage from 1 to 100",
            policy.min_util_pct
        );
    }
    if policy.after_secs == 0 {
        bail!("[idle] after: a job must be idle for some time before it is warned");
    }
    Ok(Some(policy))
}

/// The policy as `--print-config` shows it (every key with its value in force).
pub fn printable(policy: &IdlePolicy, written: Option<&toml::Value>) -> Vec<mgpu_config::Setting> {
    use toml::Value;
    let duration = |secs: u64| Value::String(format_duration(std::time::Duration::from_secs(secs)));
    let values = [
        ("after", duration(policy.after_secs)),
        ("min_util", Value::Integer(i64::from(policy.min_util_pct))),
        ("grace", duration(policy.grace_secs)),
        ("action", Value::String(policy.action.as_str().to_owned())),
    ];
    let values = values.into_iter().map(|(key, value)| (key, Some(value)));
    mgpu_config::section_settings(values, written.and_then(toml::Value::as_table))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Option<IdlePolicy>> {
        let table: toml::Table = text.parse().unwrap_or_else(|e| panic!("{e}"));
        load(table.get("idle"))
    }

    #[test]
    fn the_section_reads_with_its_defaults_and_its_absence_is_no_policy() {
        assert_eq!(parse("").ok(), Some(None));
        let policy = parse("[idle]\nafter = \"1h\"\naction = \"cancel\"\n")
            .ok()
            .flatten();
        assert_eq!(
            policy,
            Some(IdlePolicy {
                after_secs: 3600,
                action: IdleAction::Cancel,
                ..IdlePolicy::default()
            })
        );
    }

    #[test]
    fn bad_values_are_refused_naming_the_key() {
        for (text, key) in [
            ("[idle]\nmin_util = 0\n", "min_util"),
            ("[idle]\nmin_util = 101\n", "min_util"),
            ("[idle]\nafter = \"soon\"\n", "after"),
            ("[idle]\naction = \"explode\"\n", "requeue, cancel or warn"),
            ("[idle]\nafer = \"1h\"\n", "keys are"),
        ] {
            let error = parse(text)
                .err()
                .map(|e| format!("{e:#}"))
                .unwrap_or_default();
            assert!(error.contains(key), "{text}: {error}");
        }
    }
}
