//! Quality-of-service classes (`[qos.<name>]` in the scheduler's config, `mgpu submit --qos`):
//! what a class adds to its jobs' priority, whether its jobs may be stopped for others
//! (`preemptible`) and may stop others (`may_preempt`), the warning its victims get (`grace`),
//! how long they run before anything stops them (`min_runtime`), and who may use it. They
//! travel in the policy, so `mgpu queue` ranks jobs as the scheduler does.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The class of a job that names none; it exists even when the config does not name it.
pub const DEFAULT_QOS: &str = "normal";

/// The class a job of `--qos name` is in: `normal` when it names none.
pub fn class_name(name: Option<&str>) -> &str {
    name.unwrap_or(DEFAULT_QOS)
}

/// The grace of a class that does not say: 5 minutes between the warning and SIGTERM.
pub const DEFAULT_GRACE_SECS: u64 = 300;

/// One class.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QosClass {
    /// Added to its jobs' own `--priority`.
    pub priority: i32,
    /// Its running jobs may be stopped (and requeued) for jobs of a class that may preempt.
    pub preemptible: bool,
    /// Its waiting jobs may stop preemptible ones to start.
    pub may_preempt: bool,
    /// Seconds between a victim's warning signal and its SIGTERM.
    pub grace_secs: u64,
    /// Seconds a job of it runs before it may be preempted, so nothing thrashes.
    pub min_runtime_secs: u64,
    /// Its jobs may say `--idle-ok` (the `[idle]` policy leaves them alone).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_idle_ok: bool,
    /// Who may submit to it; a class that names neither users nor groups is open to all.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_users: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_groups: Vec<String>,
}

impl Default for QosClass {
    /// `normal` unless the config says otherwise: no extra priority, never stopped for
    /// others, may stop preemptible jobs (none exist unless a class says so).
    fn default() -> Self {
        QosClass {
            priority: 0,
            preemptible: false,
            may_preempt: true,
            grace_secs: DEFAULT_GRACE_SECS,
            min_runtime_secs: 0,
            allow_idle_ok: false,
            allowed_users: Vec::new(),
            allowed_groups: Vec::new(),
        }
    }
}

impl QosClass {
    /// Whether `user` (of `group`, if any) may submit to it.
    pub fn allows(&self, user: &str, group: Option<&str>) -> bool {
        (self.allowed_users.is_empty() && self.allowed_groups.is_empty())
            || self.allowed_users.iter().any(|u| u == user)
            || group.is_some_and(|g| self.allowed_groups.iter().any(|a| a == g))
    }
}

/// The classes the config names; `normal` is there with its defaults when it names none.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct QosClasses(pub BTreeMap<String, QosClass>);

impl QosClasses {
    /// Whether the config names no class.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The class `name` (None: `normal`); None when no such class exists.
    pub fn get(&self, name: Option<&str>) -> Option<QosClass> {
        let name = name.unwrap_or(DEFAULT_QOS);
        match self.0.get(name) {
            Some(class) => Some(class.clone()),
            None => (name == DEFAULT_QOS).then(QosClass::default),
        }
    }

    /// The class of a job naming `name`, falling back to `normal` for a class that is gone
    /// (removed from the config after the job was accepted).
    pub fn of_job(&self, name: Option<&str>) -> QosClass {
        self.get(name)
            .or_else(|| self.get(None))
            .unwrap_or_default()
    }

    /// The priority a job of class `name` adds to its own.
    pub fn priority_of(&self, name: Option<&str>) -> i32 {
        match name {
            None if self.0.is_empty() => 0,
            name => self.of_job(name).priority,
        }
    }

    /// The names a user may pick from, `normal` included.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.0.keys().cloned().collect();
        if !self.0.contains_key(DEFAULT_QOS) {
            names.push(DEFAULT_QOS.into());
            names.sort();
        }
        names
    }

    /// Why `user` (of `group`) may not submit to `name`, if they may not.
    pub fn refusal(&self, name: Option<&str>, user: &str, group: Option<&str>) -> Option<String> {
        let Some(class) = self.get(name) else {
            return Some(format!(
                "no quality-of-service class {:?}; the classes are {}",
                name.unwrap_or(DEFAULT_QOS),
                self.names().join(", ")
            ));
        };
        (!class.allows(user, group)).then(|| {
            format!(
                "{user} may not use the quality-of-service class {:?} (its allowed users and \
                 groups do not include them)",
                name.unwrap_or(DEFAULT_QOS)
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site() -> QosClasses {
        let scavenger = QosClass {
            priority: -10,
            preemptible: true,
            may_preempt: false,
            grace_secs: 120,
            ..QosClass::default()
        };
        let urgent = QosClass {
            priority: 50,
            allowed_groups: vec!["staff".into()],
            allowed_users: vec!["carol".into()],
            ..QosClass::default()
        };
        QosClasses(BTreeMap::from([
            ("scavenger".to_owned(), scavenger),
            ("urgent".to_owned(), urgent),
        ]))
    }

    #[test]
    fn normal_exists_unnamed_and_an_unknown_class_names_the_real_ones() {
        let classes = site();
        assert_eq!(classes.get(None).map(|c| c.may_preempt), Some(true));
        assert_eq!(classes.priority_of(Some("scavenger")), -10);
        assert_eq!(classes.priority_of(Some("gone")), 0, "falls back to normal");
        let refused = classes
            .refusal(Some("fast"), "alice", None)
            .unwrap_or_default();
        assert!(refused.contains("normal, scavenger, urgent"), "{refused}");
    }

    #[test]
    fn a_class_naming_users_or_groups_is_closed_to_others() {
        let classes = site();
        assert_eq!(classes.refusal(Some("scavenger"), "alice", None), None);
        assert!(
            classes
                .refusal(Some("urgent"), "alice", Some("students"))
                .is_some()
        );
        assert_eq!(classes.refusal(Some("urgent"), "bob", Some("staff")), None);
        assert_eq!(classes.refusal(Some("urgent"), "carol", None), None);
    }
}
