//! Per-user limits, for labs where one person could fill the cluster (Slurm's QOS limits): the
//! `[limits.default]`, `[limits.group.<name>]` and `[limits.user.<name>]` tables of the
//! scheduler's config file. Each key is resolved on its own: the user's table if it sets it,
//! else their group's (`mgpu admin add-user NAME --group G`), else the default; a key set
//! nowhere is no limit.
//!
//! ```toml
//! [limits.default]
//! max_gpus_running = 4    # GPUs a user's running jobs hold at most (shares count as shares)
//! max_jobs_queued = 100   # a submission past this many queued jobs of the user is refused
//! max_time_limit = "2d"   # a longer --time-limit is refused; a job without one gets this
//! max_gpus_per_job = 8    # a job asking for more (GPUs x nodes) is refused
//!
//! [limits.group.students]
//! max_gpus_running = 2
//!
//! [limits.user.alice]
//! max_gpus_running = 8
//!
//! [limits.group.interns.max_gpus_running]   # per GPU type, beside the total
//! total = 4
//! h100 = 1
//! ```
//!
//! A job that would take its owner past `max_gpus_running` waits (`WaitReason::UserLimit`)
//! without holding anything up for other users (the core skips it, see `core::owner_gpus`);
//! the other limits refuse a submission at once, naming the limit. A time limit given by
//! `max_time_limit` is like any other: it ends an `--on-timeout fail` job, and is a time slice
//! for one that requeues. The file is re-read when it changes (`limits_file.rs`); new limits
//! apply from the next pass and to later submissions.

use std::collections::{BTreeMap, HashMap};

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;

use mgpu_protocol::duration::{format_duration, parse_duration};
use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::job::JobSpec;

/// One table as written: every key optional.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TableText {
    max_gpus_running: Option<toml::Value>,
    max_jobs_queued: Option<i64>,
    max_time_limit: Option<String>,
    max_gpus_per_job: Option<toml::Value>,
}

/// `[limits]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SectionText {
    default: Option<TableText>,
    #[serde(default)]
    group: BTreeMap<String, TableText>,
    #[serde(default)]
    user: BTreeMap<String, TableText>,
}

/// One table, checked: GPU amounts in [`GpuAmount::UNITS_PER_GPU`] units.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Table {
    max_gpus_running: Option<u64>,
    /// `max_gpus_running.<type>`: per GPU type.
    max_gpus_running_by_type: BTreeMap<String, u64>,
    max_jobs_queued: Option<u32>,
    max_time_limit_secs: Option<u64>,
    max_gpus_per_job: Option<u64>,
}

/// One limit in force for a user, with the table that set it (`[limits.user.alice]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit<T> {
    pub value: T,
    pub from: String,
}

/// The limits in force for one user.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserLimits {
    /// In GPU units.
    pub max_gpus_running: Option<Limit<u64>>,
    /// In GPU units, by GPU type (each type's from the most specific table that sets it).
    pub max_gpus_running_by_type: BTreeMap<String, Limit<u64>>,
    pub max_jobs_queued: Option<Limit<u32>>,
    pub max_time_limit_secs: Option<Limit<u64>>,
    /// In GPU units.
    pub max_gpus_per_job: Option<Limit<u64>>,
}

/// Every table of `[limits]`, checked, and the limits keys of `[qos.<name>]` sections.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    default: Table,
    groups: BTreeMap<String, Table>,
    users: BTreeMap<String, Table>,
    /// By class: each user's limits on their jobs of that class, beside the ones above.
    classes: BTreeMap<String, Table>,
}

/// The keys of a `[limits]` table that a `[qos.<name>]` section may hold too.
pub const CLASS_LIMIT_KEYS: [&str; 4] = [
    "max_gpus_running",
    "max_jobs_queued",
    "max_time_limit",
    "max_gpus_per_job",
];

impl Limits {
    /// `[limits]` of a config file (None: no limits); errors name the table and the key.
    pub fn parse(section: Option<&toml::Value>) -> Result<Limits> {
        let Some(section) = section else {
            return Ok(Limits::default());
        };
        let text: SectionText = section
            .clone()
            .try_into()
            .context("[limits] has tables default, group.<name> and user.<name>")?;
        let check_all = |tables: BTreeMap<String, TableText>, kind: &str| {
            tables
                .into_iter()
                .map(|(name, table)| {
                    let checked = check(&table, &format!("[limits.{kind}.{name}]"))?;
                    Ok((name, checked))
                })
                .collect::<Result<BTreeMap<_, _>>>()
        };
        Ok(Limits {
            default: check(&text.default.unwrap_or_default(), "[limits.default]")?,
            groups: check_all(text.group, "group")?,
            users: check_all(text.user, "user")?,
            classes: BTreeMap::new(),
        })
    }

    /// With the limits keys of the config file's `[qos]` sections: each class's apply to
    /// every user's jobs of that class (counted apart from their other jobs).
    pub fn with_classes(mut self, qos: Option<&toml::Value>) -> Result<Limits> {
        let Some(classes) = qos.and_then(toml::Value::as_table) else {
            return Ok(self);
        };
        for (name, section) in classes {
            let Some(section) = section.as_table() else {
                continue;
            };
            let keys: toml::Table = section
                .iter()
                .filter(|(key, _)| CLASS_LIMIT_KEYS.contains(&key.as_str()))
                .map(|(key, value)| (key.clone(), value.clone()))
                .collect();
            if keys.is_empty() {
                continue;
            }
            let where_ = format!("[qos.{name}]");
            let text: TableText = toml::Value::Table(keys)
                .try_into()
                .context(where_.clone())?;
            let table = check(&text, &where_)?;
            if !table.max_gpus_running_by_type.is_empty() {
                bail!(
                    "max_gpus_running in {where_}: a number of GPUs (caps per type are [limits] keys)"
                );
            }
            self.classes.insert(name.clone(), table);
        }
        Ok(self)
    }

    /// The limits every user's jobs of `class` (None: `normal`) have, if it sets any.
    pub fn for_class(&self, class: Option<&str>) -> Option<UserLimits> {
        let name = mgpu_protocol::qos::class_name(class);
        let table = self.classes.get(name)?;
        let from = format!("[qos.{name}]");
        let limit = |value: Option<u64>| {
            value.map(|value| Limit {
                value,
                from: from.clone(),
            })
        };
        Some(UserLimits {
            max_gpus_running: limit(table.max_gpus_running),
            max_gpus_running_by_type: BTreeMap::new(),
            max_jobs_queued: table.max_jobs_queued.map(|value| Limit {
                value,
                from: from.clone(),
            }),
            max_time_limit_secs: limit(table.max_time_limit_secs),
            max_gpus_per_job: limit(table.max_gpus_per_job),
        })
    }

    /// The limits keys a class sets, as `--print-config` shows them in its section.
    pub fn class_settings(&self, class: &str) -> Vec<mgpu_config::Setting> {
        self.classes
            .get(class)
            .map(Table::settings)
            .unwrap_or_default()
    }

    /// Each class's cap on the GPUs one user's running jobs of it hold (in units).
    pub fn class_running_caps(&self) -> HashMap<String, u64> {
        self.classes
            .iter()
            .filter_map(|(name, t)| Some((name.clone(), t.max_gpus_running?)))
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        *self == Limits::default()
    }

    /// The limits of `user`, a member of `group`: each key from the most specific table.
    pub fn for_user(&self, user: &str, group: Option<&str>) -> UserLimits {
        let tables: Vec<(String, &Table)> = [
            self.users
                .get(user)
                .map(|t| (format!("[limits.user.{user}]"), t)),
            group.and_then(|g| {
                self.groups
                    .get(g)
                    .map(|t| (format!("[limits.group.{g}]"), t))
            }),
            Some(("[limits.default]".to_owned(), &self.default)),
        ]
        .into_iter()
        .flatten()
        .collect();
        fn pick<T: Copy>(
            tables: &[(String, &Table)],
            key: impl Fn(&Table) -> Option<T>,
        ) -> Option<Limit<T>> {
            tables.iter().find_map(|(from, table)| {
                key(table).map(|value| Limit {
                    value,
                    from: from.clone(),
                })
            })
        }
        let types: std::collections::BTreeSet<&String> = tables
            .iter()
            .flat_map(|(_, t)| t.max_gpus_running_by_type.keys())
            .collect();
        let by_type = types
            .into_iter()
            .filter_map(|gpu_type| {
                let limit = pick(&tables, |t| {
                    t.max_gpus_running_by_type.get(gpu_type).copied()
                })?;
                Some((gpu_type.clone(), limit))
            })
            .collect();
        UserLimits {
            max_gpus_running: pick(&tables, |t| t.max_gpus_running),
            max_gpus_running_by_type: by_type,
            max_jobs_queued: pick(&tables, |t| t.max_jobs_queued),
            max_time_limit_secs: pick(&tables, |t| t.max_time_limit_secs),
            max_gpus_per_job: pick(&tables, |t| t.max_gpus_per_job),
        }
    }

    /// Each user's caps on running GPUs of each type (in units), for those who have any.
    pub fn running_type_caps<'a>(
        &self,
        users: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
    ) -> HashMap<String, BTreeMap<String, u64>> {
        users
            .into_iter()
            .filter_map(|(user, group)| {
                let caps: BTreeMap<String, u64> = self
                    .for_user(user, group)
                    .max_gpus_running_by_type
                    .into_iter()
                    .map(|(gpu_type, limit)| (gpu_type, limit.value))
                    .collect();
                (!caps.is_empty()).then(|| (user.to_owned(), caps))
            })
            .collect()
    }

    /// Each user's cap on running GPUs (in units), for those who have one: `users` are the
    /// known users with their groups.
    pub fn running_caps<'a>(
        &self,
        users: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
    ) -> HashMap<String, u64> {
        users
            .into_iter()
            .filter_map(|(user, group)| {
                self.for_user(user, group)
                    .max_gpus_running
                    .map(|limit| (user.to_owned(), limit.value))
            })
            .collect()
    }
}

impl Limits {
    /// The tables as `--print-config` shows them: `limits.default`, then groups and users.
    pub fn printable(&self) -> Vec<(String, Vec<mgpu_config::Setting>)> {
        let named = std::iter::once(("limits.default".to_owned(), &self.default))
            .chain(
                self.groups
                    .iter()
                    .map(|(n, t)| (format!("limits.group.{n}"), t)),
            )
            .chain(
                self.users
                    .iter()
                    .map(|(n, t)| (format!("limits.user.{n}"), t)),
            );
        named
            .map(|(name, table)| (name, table.settings()))
            .filter(|(_, settings)| !settings.is_empty())
            .collect()
    }
}

impl Table {
    fn settings(&self) -> Vec<mgpu_config::Setting> {
        let gpus = |units: u64| match gpus_text(units).parse::<i64>() {
            Ok(whole) => toml::Value::Integer(whole),
            Err(_) => toml::Value::Float(units as f64 / f64::from(GpuAmount::UNITS_PER_GPU)),
        };
        let by_type = self
            .max_gpus_running_by_type
            .iter()
            .map(|(gpu_type, units)| (format!("max_gpus_running.{gpu_type}"), Some(gpus(*units))));
        // Beside caps per type, the total is `max_gpus_running.total`: TOML cannot give a
        // key both a number and keys of its own, and what is printed must read back.
        let total_key = match self.max_gpus_running_by_type.is_empty() {
            true => "max_gpus_running",
            false => "max_gpus_running.total",
        };
        let values = [
            (total_key.to_owned(), self.max_gpus_running.map(gpus)),
            (
                "max_jobs_queued".to_owned(),
                self.max_jobs_queued
                    .map(|n| toml::Value::Integer(i64::from(n))),
            ),
            (
                "max_time_limit".to_owned(),
                self.max_time_limit_secs.map(|secs| {
                    toml::Value::String(format_duration(std::time::Duration::from_secs(secs)))
                }),
            ),
            (
                "max_gpus_per_job".to_owned(),
                self.max_gpus_per_job.map(gpus),
            ),
        ];
        values
            .into_iter()
            .chain(by_type)
            .filter_map(|(key, value)| {
                value.map(|value| mgpu_config::Setting {
                    key,
                    value: Some(value),
                    source: mgpu_config::Source::File,
                })
            })
            .collect()
    }
}

fn check(table: &TableText, name: &str) -> Result<Table> {
    let gpus = |value: &Option<toml::Value>, key: &str| -> Result<Option<u64>> {
        value
            .as_ref()
            .map(|value| gpu_units(value).with_context(|| format!("{key} in {name}")))
            .transpose()
    };
    let max_jobs_queued = table
        .max_jobs_queued
        .map(|n| {
            u32::try_from(n)
                .map_err(|_| anyhow!("max_jobs_queued in {name}: {n} is not 0 to 4294967295"))
        })
        .transpose()?;
    let max_time_limit_secs = table
        .max_time_limit
        .as_deref()
        .map(|text| {
            parse_duration(text)
                .map(|d| d.as_secs().max(1))
                .with_context(|| format!("max_time_limit in {name}"))
        })
        .transpose()?;
    let (max_gpus_running, max_gpus_running_by_type) =
        running_limits(table.max_gpus_running.as_ref(), name)?;
    Ok(Table {
        max_gpus_running,
        max_gpus_running_by_type,
        max_jobs_queued,
        max_time_limit_secs,
        max_gpus_per_job: gpus(&table.max_gpus_per_job, "max_gpus_per_job")?,
    })
}

/// `max_gpus_running`: a number (the total), or a table of a `total` and GPU types.
fn running_limits(
    value: Option<&toml::Value>,
    name: &str,
) -> Result<(Option<u64>, BTreeMap<String, u64>)> {
    let Some(value) = value else {
        return Ok((None, BTreeMap::new()));
    };
    let toml::Value::Table(table) = value else {
        let units = gpu_units(value).with_context(|| format!("max_gpus_running in {name}"))?;
        return Ok((Some(units), BTreeMap::new()));
    };
    let mut total = None;
    let mut by_type = BTreeMap::new();
    for (key, value) in table {
        let units =
            gpu_units(value).with_context(|| format!("max_gpus_running.{key} in {name}"))?;
        if key == "total" {
            total = Some(units);
        } else {
            mgpu_protocol::gpu_type::check_name(key, "GPU type")
                .map_err(|e| anyhow!("max_gpus_running.{key} in {name}: {e}"))?;
            by_type.insert(key.clone(), units);
        }
    }
    Ok((total, by_type))
}

/// A GPU count written as a number (`2`, `0.5`), in units.
fn gpu_units(value: &toml::Value) -> Result<u64> {
    let gpus = match value {
        toml::Value::Integer(n) => *n as f64,
        toml::Value::Float(x) => *x,
        other => bail!("`{other}` is not a number of GPUs"),
    };
    if !gpus.is_finite() || gpus < 0.0 {
        bail!("`{gpus}` is not a number of GPUs: 0 or more");
    }
    Ok((gpus * f64::from(GpuAmount::UNITS_PER_GPU)).round() as u64)
}

/// GPU units as a person reads them (`2`, `0.5`).
pub fn gpus_text(units: u64) -> String {
    let per = u64::from(GpuAmount::UNITS_PER_GPU);
    if units.is_multiple_of(per) {
        (units / per).to_string()
    } else {
        let text = format!("{:.4}", units as f64 / per as f64);
        text.trim_end_matches('0').to_owned()
    }
}

/// GPU units a job asks for: per node, times its nodes.
pub fn job_gpu_units(spec: &JobSpec) -> u64 {
    u64::from(spec.gpus.units()) * u64::from(spec.nodes.max(1))
}

impl UserLimits {
    /// Why a submission of `spec` by `user`, who has `queued` jobs queued, is refused at once;
    /// None when it is within every limit.
    pub fn refusal(&self, user: &str, spec: &JobSpec, queued: usize) -> Option<String> {
        if let Some(limit) = &self.max_jobs_queued
            && queued >= limit.value as usize
        {
            return Some(format!(
                "over the limit max_jobs_queued = {} ({}): {user} has {queued} jobs queued",
                limit.value, limit.from
            ));
        }
        if let Some(limit) = &self.max_gpus_running {
            let asked = job_gpu_units(spec);
            if asked > limit.value {
                return Some(format!(
                    "over the limit max_gpus_running = {} ({}): the job asks for {} GPUs, so it \
                     could never start",
                    gpus_text(limit.value),
                    limit.from,
                    gpus_text(asked)
                ));
            }
        }
        if let Some(why) = self.type_refusal(spec) {
            return Some(why);
        }
        if let Some(limit) = &self.max_gpus_per_job {
            let asked = job_gpu_units(spec);
            if asked > limit.value {
                return Some(format!(
                    "over the limit max_gpus_per_job = {} ({}): the job asks for {} GPUs",
                    gpus_text(limit.value),
                    limit.from,
                    gpus_text(asked)
                ));
            }
        }
        if let (Some(limit), Some(asked)) = (&self.max_time_limit_secs, spec.time_limit_secs)
            && asked > limit.value
        {
            return Some(format!(
                "over the limit max_time_limit = {} ({}): the job asks for {}",
                format_duration(std::time::Duration::from_secs(limit.value)),
                limit.from,
                format_duration(std::time::Duration::from_secs(asked))
            ));
        }
        None
    }

    /// Why a job that names GPU types could never start: each of its types is capped below
    /// what it asks for (a type without a cap, or a job naming no type, can).
    fn type_refusal(&self, spec: &JobSpec) -> Option<String> {
        let asked = job_gpu_units(spec);
        if spec.gpu_types.is_empty() || asked == 0 {
            return None;
        }
        let caps: Vec<(&String, &Limit<u64>)> = spec
            .gpu_types
            .iter()
            .map(|t| Some((t, self.max_gpus_running_by_type.get(t)?)))
            .collect::<Option<_>>()?;
        if caps.iter().any(|(_, limit)| limit.value >= asked) {
            return None;
        }
        let named: Vec<String> = caps
            .iter()
            .map(|(t, limit)| {
                format!(
                    "max_gpus_running.{t} = {} ({})",
                    gpus_text(limit.value),
                    limit.from
                )
            })
            .collect();
        Some(format!(
            "over the limit {}: the job asks for {} GPUs of type {}, so it could never start",
            named.join(", "),
            gpus_text(asked),
            spec.gpu_types.join(" or ")
        ))
    }

    /// A job submitted without a time limit gets `max_time_limit`, as Slurm's QOS gives it.
    pub fn cap_time_limit(&self, spec: &mut JobSpec) {
        if spec.time_limit_secs.is_none()
            && let Some(limit) = &self.max_time_limit_secs
        {
            spec.time_limit_secs = Some(limit.value);
        }
    }
}

#[cfg(test)]
#[path = "limits_tests.rs"]
mod tests;
