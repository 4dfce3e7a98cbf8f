//! The `[reservations]` section of the scheduler's config file: the caps on what users book
//! (`mgpu reserve`; admins book without them) and how windows are kept. Without the section
//! a user books up to one node's GPUs for up to 24 h, with no notice needed.
//!
//! ```toml
//! [reservations]
//! max_gpus = 16                 # most GPUs one user holds in bookings at once
//! max_duration = "24h"          # longest window a user books
//! max_gpu_hours_per_week = 200  # per user, per calendar week (Monday 00:00 UTC)
//! min_notice = "1h"             # least time between booking and the window's start
//! horizon = "24h"               # jobs without a time limit keep off booked GPUs this long before
//! release_unused_after = "30m"  # a window no job used this long gives its GPUs back
//! ```

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use mgpu_protocol::duration::{format_duration, parse_duration};
use mgpu_protocol::reservation::{MAX_WINDOW_SECS, ReservationPolicy};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Section {
    max_gpus: Option<u32>,
    max_duration: Option<String>,
    max_gpu_hours_per_week: Option<f64>,
    min_notice: Option<String>,
    horizon: Option<String>,
    release_unused_after: Option<String>,
}

/// The policy of the `[reservations]` table over the defaults.
pub fn load(table: Option<&toml::Value>) -> Result<ReservationPolicy> {
    let mut policy = ReservationPolicy::default();
    let Some(table) = table else {
        return Ok(policy);
    };
    let section: Section = table.clone().try_into().context(
        "[reservations]: keys are max_gpus, max_duration, max_gpu_hours_per_week, min_notice, \
         horizon and release_unused_after",
    )?;
    let seconds = |text: &Option<String>, default: u64, key: &str| -> Result<u64> {
        match text {
            Some(text) => Ok(parse_duration(text)
                .with_context(|| format!("[reservations] {key}"))?
                .as_secs()),
            None => Ok(default),
        }
    };
    policy.max_gpus = section.max_gpus.or(policy.max_gpus);
    policy.max_duration_secs = seconds(
        &section.max_duration,
        policy.max_duration_secs,
        "max_duration",
    )?;
    policy.min_notice_secs = seconds(&section.min_notice, 0, "min_notice")?;
    policy.horizon_secs = seconds(&section.horizon, policy.horizon_secs, "horizon")?;
    policy.release_unused_after_secs = seconds(
        &section.release_unused_after,
        policy.release_unused_after_secs,
        "release_unused_after",
    )?;
    if let Some(hours) = section.max_gpu_hours_per_week {
        if !(hours.is_finite() && hours >= 0.0) {
            bail!("[reservations] max_gpu_hours_per_week must be 0 or more");
        }
        policy.max_gpu_hours_per_week = Some(hours);
    }
    if policy.max_duration_secs == 0 || policy.max_duration_secs > MAX_WINDOW_SECS {
        bail!("[reservations] max_duration must be from a minute to a year");
    }
    if policy.release_unused_after_secs == 0 {
        bail!("[reservations] release_unused_after: a window needs some time to be used");
    }
    Ok(policy)
}

/// The policy as `--print-config` shows it (every key with its value in force).
pub fn printable(
    policy: &ReservationPolicy,
    written: Option<&toml::Value>,
) -> Vec<mgpu_config::Setting> {
    use toml::Value;
    let duration = |secs: u64| {
        Some(Value::String(format_duration(
            std::time::Duration::from_secs(secs),
        )))
    };
    let values = [
        (
            "max_gpus",
            policy.max_gpus.map(|n| Value::Integer(i64::from(n))),
        ),
        ("max_duration", duration(policy.max_duration_secs)),
        (
            "max_gpu_hours_per_week",
            policy.max_gpu_hours_per_week.map(Value::Float),
        ),
        ("min_notice", duration(policy.min_notice_secs)),
        ("horizon", duration(policy.horizon_secs)),
        (
            "release_unused_after",
            duration(policy.release_unused_after_secs),
        ),
    ];
    mgpu_config::section_settings(values, written.and_then(toml::Value::as_table))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ReservationPolicy> {
        let table: toml::Table = text.parse().unwrap_or_else(|e| panic!("{e}"));
        load(table.get("reservations"))
    }

    #[test]
    fn the_section_reads_over_the_defaults() {
        assert_eq!(parse("").ok(), Some(ReservationPolicy::default()));
        let policy = parse(
            "[reservations]\nmax_gpus = 16\nmin_notice = \"1h\"\nmax_gpu_hours_per_week = 200\n",
        )
        .ok();
        assert_eq!(
            policy,
            Some(ReservationPolicy {
                max_gpus: Some(16),
                min_notice_secs: 3600,
                max_gpu_hours_per_week: Some(200.0),
                ..ReservationPolicy::default()
            })
        );
    }

    #[test]
    fn bad_values_are_refused_naming_the_key() {
        for (text, key) in [
            ("[reservations]\nmax_duration = \"soon\"\n", "max_duration"),
            ("[reservations]\nmax_duration = \"0s\"\n", "max_duration"),
            (
                "[reservations]\nmax_gpu_hours_per_week = -1\n",
                "max_gpu_hours_per_week",
            ),
            ("[reservations]\nhorizn = \"1h\"\n", "keys are"),
            (
                "[reservations]\nrelease_unused_after = \"0s\"\n",
                "release_unused_after",
            ),
        ] {
            let error = parse(text)
                .err()
                .map(|e| format!("{e:#}"))
                .unwrap_or_default();
            assert!(error.contains(key), "{text}: {error}");
        }
    }
}
