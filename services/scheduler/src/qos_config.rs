//! The `[qos.<name>]` sections of the scheduler's config file: one quality-of-service class
//! each, read into the policy's classes (`mgpu_protocol::qos`).
//!
//! ```toml
//! [qos.scavenger]
//! priority = -10          # added to its jobs' --priority
//! preemptible = true      # its jobs may be stopped for classes that may preempt
//! may_preempt = false     # its jobs may not stop others
//! grace = "2m"            # warning signal to SIGTERM (default 5m)
//! min_runtime = "10m"     # not preempted before it ran this long (default 0)
//! allow_idle_ok = true    # its jobs may say --idle-ok (default false)
//! max_gpus_running = 16   # the [limits] keys: per user, over their jobs of this class
//!
//! [qos.urgent]
//! priority = 100
//! allowed_groups = ["staff"]   # who may use it (with allowed_users); none named: everyone
//! ```
//!
//! `normal`, the class of a job that names none, exists with its defaults (no extra
//! priority, not preemptible, may preempt) unless a section sets it otherwise.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use mgpu_protocol::duration::parse_duration;
use mgpu_protocol::qos::{QosClass, QosClasses};

/// One `[qos.<name>]` section as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct QosSection {
    priority: Option<i32>,
    preemptible: Option<bool>,
    may_preempt: Option<bool>,
    grace: Option<String>,
    min_runtime: Option<String>,
    allow_idle_ok: Option<bool>,
    // The limits keys: read by `limits.rs` (`Limits::with_classes`), which checks them.
    #[serde(rename = "max_gpus_running")]
    _max_gpus_running: Option<toml::Value>,
    #[serde(rename = "max_jobs_queued")]
    _max_jobs_queued: Option<toml::Value>,
    #[serde(rename = "max_time_limit")]
    _max_time_limit: Option<toml::Value>,
    #[serde(rename = "max_gpus_per_job")]
    _max_gpus_per_job: Option<toml::Value>,
    #[serde(default)]
    allowed_users: Vec<String>,
    #[serde(default)]
    allowed_groups: Vec<String>,
}

/// The classes of the `[qos]` table of the config file (none: `normal` alone).
pub fn load(qos: Option<&toml::Value>) -> Result<QosClasses> {
    let Some(qos) = qos else {
        return Ok(QosClasses::default());
    };
    let Some(table) = qos.as_table() else {
        bail!("[qos] must hold one table per class: [qos.scavenger]");
    };
    let mut classes = BTreeMap::new();
    for (name, section) in table {
        let class = class_of(name, section).with_context(|| format!("[qos.{name}]"))?;
        classes.insert(name.clone(), class);
    }
    Ok(QosClasses(classes))
}

/// The classes as `--print-config` shows them, one `[qos.<name>]` table each, every key
/// with its value in force: from the file when `written` (the file's `[qos]` table) sets it,
/// else the default.
pub fn printable(
    classes: &QosClasses,
    written: Option<&toml::Value>,
) -> Vec<(String, Vec<mgpu_config::Setting>)> {
    classes
        .0
        .iter()
        .map(|(name, class)| {
            let table = written
                .and_then(|qos| qos.get(name))
                .and_then(toml::Value::as_table);
            (format!("qos.{name}"), settings_of(class, table))
        })
        .collect()
}

fn settings_of(class: &QosClass, written: Option<&toml::Table>) -> Vec<mgpu_config::Setting> {
    use mgpu_protocol::duration::format_duration;
    use toml::Value;
    let duration = |secs: u64| Value::String(format_duration(std::time::Duration::from_secs(secs)));
    let names = |list: &[String]| Value::Array(list.iter().cloned().map(Value::String).collect());
    let values = [
        ("priority", Value::Integer(i64::from(class.priority))),
        ("preemptible", Value::Boolean(class.preemptible)),
        ("may_preempt", Value::Boolean(class.may_preempt)),
        ("grace", duration(class.grace_secs)),
        ("min_runtime", duration(class.min_runtime_secs)),
        ("allow_idle_ok", Value::Boolean(class.allow_idle_ok)),
        ("allowed_users", names(&class.allowed_users)),
        ("allowed_groups", names(&class.allowed_groups)),
    ]
    .into_iter()
    .map(|(key, value)| (key, Some(value)));
    mgpu_config::section_settings(values, written)
}

fn class_of(name: &str, section: &toml::Value) -> Result<QosClass> {
    let plain = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !plain {
        bail!("a class name is letters, digits, `-` and `_`");
    }
    let section: QosSection = section.clone().try_into()?;
    let defaults = QosClass::default();
    let seconds = |text: &Option<String>, default: u64| -> Result<u64> {
        match text {
            Some(text) => Ok(parse_duration(text)?.as_secs()),
            None => Ok(default),
        }
    };
    let grace_secs = seconds(&section.grace, defaults.grace_secs).context("grace")?;
    if grace_secs > mgpu_protocol::stop::MAX_WARNING_SECS {
        bail!("grace: at most {} s", mgpu_protocol::stop::MAX_WARNING_SECS);
    }
    Ok(QosClass {
        priority: section.priority.unwrap_or(defaults.priority),
        preemptible: section.preemptible.unwrap_or(defaults.preemptible),
        may_preempt: section.may_preempt.unwrap_or(defaults.may_preempt),
        grace_secs,
        min_runtime_secs: seconds(&section.min_runtime, 0).context("min_runtime")?,
        allow_idle_ok: section.allow_idle_ok.unwrap_or(defaults.allow_idle_ok),
        allowed_users: section.allowed_users,
        allowed_groups: section.allowed_groups,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<QosClasses> {
        let table: toml::Table = text.parse()?;
        load(table.get("qos"))
    }

    #[test]
    fn a_typical_site_reads_with_normal_left_at_its_defaults() {
        let classes = parse(
            "[qos.scavenger]\npriority = -10\npreemptible = true\nmay_preempt = false\n\
             grace = \"2m\"\nmin_runtime = \"10m\"\n",
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        let scavenger = classes.get(Some("scavenger")).unwrap_or_default();
        assert_eq!(
            (
                scavenger.priority,
                scavenger.grace_secs,
                scavenger.min_runtime_secs
            ),
            (-10, 120, 600)
        );
        assert!(scavenger.preemptible && !scavenger.may_preempt);
        assert_eq!(classes.get(None), Some(QosClass::default()));
    }

    #[test]
    fn printed_classes_read_back_as_the_same_classes() {
        let classes = parse(
            "[qos.scavenger]\npriority = -10\npreemptible = true\nmay_preempt = false\n\
             grace = \"2m\"\nmin_runtime = \"10m\"\nallowed_groups = [\"students\"]\n",
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        let mut text = String::new();
        for (name, settings) in printable(&classes, None) {
            text.push_str(&format!("[{name}]\n"));
            for setting in settings {
                let value = setting.value.map(|v| v.to_string()).unwrap_or_default();
                text.push_str(&format!("{} = {value}\n", setting.key));
            }
        }
        assert_eq!(parse(&text).ok(), Some(classes), "{text}");
    }

    #[test]
    fn a_misspelt_key_or_a_bad_duration_names_its_class() {
        let typo = parse("[qos.scavenger]\npreemtible = true\n").map(|_| ());
        let said = format!(
            "{:#}",
            typo.err().map(|e| e.to_string()).unwrap_or_default()
        );
        assert!(said.contains("scavenger"), "{said}");
        let bad = parse("[qos.x]\ngrace = \"soon\"\n");
        assert!(bad.is_err_and(|e| format!("{e:#}").contains("grace")));
        assert!(parse("[qos]\nscavenger = 3\n").is_err());
    }

    #[test]
    fn a_class_may_hold_the_limits_keys_which_the_limits_read() {
        let classes = parse("[qos.scavenger]\npreemptible = true\nmax_gpus_running = 4\n");
        assert!(classes.is_ok_and(|c| c.get(Some("scavenger")).is_some_and(|c| c.preemptible)));
        assert!(parse("[qos.scavenger]\nmax_gpus = 4\n").is_err());
    }
}
