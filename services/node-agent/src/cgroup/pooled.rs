//! Cgroups made ahead of their jobs, for the guard pool (`guard_pool.rs`): a pooled guard
//! moves into one while no job waits, and the job that takes the guard gets the cgroup with
//! its limits written then. On v1 the cgroup is then renamed after the attempt, as if made for
//! it; v2 does not rename cgroups, so there the attempt's cgroup keeps its pool name, which the
//! agent's state file records for a successor to find.

use std::path::PathBuf;

use super::{Containment, JobCgroup, JobLimits, Layout, cgroup_name};
use crate::running::AttemptKey;

/// What every pooled cgroup's name starts with.
const POOL_PREFIX: &str = "pool-";

impl Containment {
    /// Makes a cgroup named `pool-<id>` with no limits yet, for a pooled guard (None where
    /// jobs are not contained). On v1 it has no cpuset directory: pinned jobs are not pooled.
    pub fn make_pooled(&self, id: &str) -> Result<Option<JobCgroup>, String> {
        let name = format!("{POOL_PREFIX}{id}");
        let Some(layout) = &self.layout else {
            return Ok(None);
        };
        let cgroup = match layout {
            Layout::V2(v2) => v2.job(&name),
            Layout::V1(v1) => v1.job(&name, false),
        };
        let made = match layout {
            Layout::V2(_) => std::fs::create_dir(&cgroup.dir)
                .map_err(|err| format!("cannot make the cgroup {}: {err}", cgroup.dir.display())),
            Layout::V1(v1) => v1.set_up(&name, &JobLimits::default()),
        };
        match made {
            Ok(()) => Ok(Some(cgroup)),
            Err(err) => {
                let _ = cgroup.remove();
                Err(err)
            }
        }
    }

    /// Makes the pooled cgroup `pooled` the cgroup of attempt `key`: writes `limits` (not
    /// pinned cores: a pinned job is not pooled) and on v1 renames it after the attempt, one
    /// left over there by an earlier agent emptied first. The attempt's cgroup; on an error
    /// the pooled one may be half renamed, and the caller empties both.
    pub fn adopt(
        &self,
        pooled: &JobCgroup,
        key: &AttemptKey,
        limits: &JobLimits,
    ) -> Result<JobCgroup, String> {
        let Some(layout) = &self.layout else {
            return Err("jobs are not contained here".to_owned());
        };
        let pool_name = pooled.name().ok_or("a pooled cgroup without a name")?;
        match layout {
            Layout::V2(v2) => {
                v2.set_up(&pooled.dir, limits)?;
                Ok(pooled.clone())
            }
            Layout::V1(v1) => {
                v1.set_up(&pool_name, limits)?;
                let own = v1.job(&cgroup_name(key), false);
                if own.dir.is_dir() {
                    own.kill_all_blocking()?;
                    own.remove()?;
                }
                for (from, to) in pooled.dirs().zip(own.dirs()) {
                    std::fs::rename(from, to).map_err(|err| {
                        format!(
                            "cannot rename {} to {}: {err}",
                            from.display(),
                            to.display()
                        )
                    })?;
                }
                Ok(own)
            }
        }
    }

    /// The attempt's cgroup as a successor finds it: by the name the state file recorded
    /// (a pooled cgroup on v2), else by the attempt.
    pub fn attempt_cgroup(&self, key: &AttemptKey, recorded: Option<&str>) -> Option<JobCgroup> {
        let name = recorded.map_or_else(|| cgroup_name(key), str::to_owned);
        Some(match self.layout.as_ref()? {
            Layout::V2(v2) => v2.job(&name),
            // Pinned or not, it is unknown: a directory that is not there is skipped.
            Layout::V1(v1) => v1.job(&name, true),
        })
    }

    /// Empties and removes every pooled cgroup an earlier agent left but those in `taken`
    /// (pooled cgroups that became jobs', which the jobs' own clean-up empties). Its pooled
    /// guards died with it; nothing else runs in those.
    pub fn remove_idle_pooled(&self, taken: &[String]) {
        let Some(layout) = &self.layout else {
            return;
        };
        let Ok(entries) = std::fs::read_dir(layout.parent()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with(POOL_PREFIX) || taken.contains(&name) {
                continue;
            }
            let cgroup = match layout {
                Layout::V2(v2) => v2.job(&name),
                Layout::V1(v1) => v1.job(&name, false),
            };
            if let Err(err) = cgroup.kill_all_blocking().and_then(|()| cgroup.remove()) {
                tracing::warn!("removing an idle pooled cgroup left by an earlier agent: {err}");
            }
        }
    }
}

impl JobCgroup {
    /// Its name, the same in every hierarchy.
    pub fn name(&self) -> Option<String> {
        self.dir
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
    }

    /// Its directories: the freezer's (or v2's one) first.
    fn dirs(&self) -> impl Iterator<Item = &PathBuf> {
        std::iter::once(&self.dir).chain(&self.v1_others)
    }

    /// Removes it where nothing ever ran in it.
    pub fn remove_empty(&self) -> Result<(), String> {
        self.remove()
    }

    /// Whether it is named after no attempt: a pooled cgroup kept by a job on v2.
    pub fn is_pooled(&self) -> bool {
        self.name()
            .is_some_and(|name| name.starts_with(POOL_PREFIX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::CgroupChoice;

    /// A v1 hierarchy of plain directories, with the node's parents made by detection.
    fn fake_v1() -> (tempfile::TempDir, Containment) {
        let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let freezer = root.path().join("freezer");
        std::fs::create_dir_all(&freezer).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(freezer.join("cgroup.procs"), b"").unwrap_or_else(|e| panic!("{e}"));
        let containment = Containment::detect(root.path(), CgroupChoice::V1, "n1");
        assert!(containment.enabled(), "{containment:?}");
        (root, containment)
    }

    #[test]
    fn a_pooled_cgroup_becomes_the_attempts_on_v1() {
        let (root, containment) = fake_v1();
        let parent = root.path().join("freezer/mgpu/n1");
        let pooled = containment
            .make_pooled("7-1")
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("no cgroup"));
        assert!(pooled.is_pooled());
        assert!(parent.join("pool-7-1").is_dir());
        let job_id = mgpu_protocol::ids::JobId::random();
        let key = AttemptKey {
            job_id: job_id.clone(),
            attempt: 2,
        };
        let adopted = containment
            .adopt(&pooled, &key, &JobLimits::default())
            .unwrap_or_else(|e| panic!("{e}"));
        let own = format!("job-{job_id}-2");
        assert_eq!(adopted.name(), Some(own.clone()));
        assert!(!adopted.is_pooled());
        assert!(parent.join(&own).is_dir());
        assert!(!parent.join("pool-7-1").exists());
    }

    #[test]
    fn idle_pooled_cgroups_are_removed_but_those_jobs_took() {
        let (root, containment) = fake_v1();
        let parent = root.path().join("freezer/mgpu/n1");
        for id in ["9-1", "9-2"] {
            containment
                .make_pooled(id)
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let job_id = mgpu_protocol::ids::JobId::random();
        let own = format!("job-{job_id}-1");
        std::fs::create_dir(parent.join(&own)).unwrap_or_else(|e| panic!("{e}"));
        containment.remove_idle_pooled(&["pool-9-2".to_owned()]);
        assert!(!parent.join("pool-9-1").exists());
        assert!(parent.join("pool-9-2").is_dir());
        assert!(parent.join(&own).is_dir());
        let key = AttemptKey { job_id, attempt: 1 };
        let recorded = containment.attempt_cgroup(&key, Some("pool-9-2"));
        assert_eq!(recorded.and_then(|c| c.name()).as_deref(), Some("pool-9-2"));
        assert_eq!(
            containment
                .attempt_cgroup(&key, None)
                .and_then(|c| c.name()),
            Some(own)
        );
    }
}
