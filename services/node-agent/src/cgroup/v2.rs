//! cgroup v2: one unified hierarchy. A job's cgroup is one directory: `cgroup.kill` ends it,
//! a device BPF program (`device_filter.rs`) keeps it off the GPUs it was not given,
//! `memory.max` limits its host memory and `cpuset.cpus` pins it, where the memory and cpuset
//! controllers reach the agent's subtree.

use std::path::{Path, PathBuf};

use super::{JobCgroup, JobLimits, PARENT, device_filter, write};

/// Where the jobs' cgroups go in the unified hierarchy, and what they can enforce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct V2 {
    pub parent: PathBuf,
    /// Why GPUs cannot be isolated, when they cannot (the device filter did not load).
    pub devices_missing: Option<String>,
    pub memory: bool,
    pub cpuset: bool,
}

impl V2 {
    /// The layout for an agent of `node` in cgroup `own` of the hierarchy mounted at `mount`
    /// (nothing is made yet).
    pub fn at(mount: &Path, own: &str, node: &str) -> V2 {
        V2 {
            parent: parent_dir(mount, own).join(node),
            devices_missing: None,
            memory: false,
            cpuset: false,
        }
    }

    /// Makes the parent, hands the memory and cpuset controllers down to it where the
    /// hierarchy has them, and checks that a device filter loads.
    pub fn prepare(&mut self, mount: &Path, own: &str) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.parent)?;
        let top = own_dir(mount, own);
        // A cgroup with processes cannot hand controllers to its children (v2's "no internal
        // processes"): under systemd the agent leaves its unit's cgroup for a leaf of its own.
        if top != mount {
            let leaf = top.join("mgpu-agent");
            let moved = std::fs::create_dir_all(&leaf)
                .and_then(|()| std::fs::write(leaf.join("cgroup.procs"), b"0"));
            if let Err(err) = moved {
                tracing::warn!("cannot move the agent into {}: {err}", leaf.display());
            }
        }
        let mut dir = top.clone();
        let below: Vec<_> = self
            .parent
            .strip_prefix(&top)
            .map(|rest| rest.components().collect())
            .unwrap_or_default();
        for step in std::iter::once(None).chain(below.into_iter().map(Some)) {
            if let Some(step) = step {
                dir.push(step);
            }
            for controller in ["+memory", "+cpuset"] {
                let _ = std::fs::write(dir.join("cgroup.subtree_control"), controller);
            }
        }
        let enabled =
            std::fs::read_to_string(self.parent.join("cgroup.subtree_control")).unwrap_or_default();
        self.memory = enabled.split_whitespace().any(|c| c == "memory");
        self.cpuset = enabled.split_whitespace().any(|c| c == "cpuset");
        self.devices_missing = self.probe_device_filter().err();
        Ok(())
    }

    /// Loads a device filter onto a scratch cgroup, to know before any job whether it can.
    fn probe_device_filter(&self) -> Result<(), String> {
        let probe = self
            .parent
            .join(format!("probe-devices-{}", std::process::id()));
        std::fs::create_dir(&probe).map_err(|err| err.to_string())?;
        let attached = device_filter::attach(&probe, &[]);
        let _ = std::fs::remove_dir(&probe);
        attached
    }

    /// What the layout cannot enforce, by what it would enforce.
    pub fn missing(&self) -> Vec<String> {
        let mut missing = Vec::new();
        if let Some(why) = &self.devices_missing {
            missing.push(format!("GPU isolation ({why})"));
        }
        if !self.memory {
            missing.push("host memory (no memory controller delegated)".to_owned());
        }
        if !self.cpuset {
            missing.push("CPU pinning (no cpuset controller delegated)".to_owned());
        }
        missing
    }

    /// The job's cgroup named `name` (not made yet).
    pub fn job(&self, name: &str) -> JobCgroup {
        let dir = self.parent.join(name);
        JobCgroup {
            memory: self.memory.then(|| dir.clone()),
            dir,
            v2: true,
            v1_others: Vec::new(),
            cpuacct: None,
        }
    }

    /// Writes the job's limits into its (made, still empty) cgroup.
    pub fn set_up(&self, dir: &Path, limits: &JobLimits) -> Result<(), String> {
        if self.devices_missing.is_none() {
            device_filter::attach(dir, &limits.gpu_minors)?;
        }
        if let (true, Some(mib)) = (self.memory, limits.mem_host_mib) {
            write(
                &dir.join("memory.max"),
                &mib.saturating_mul(1024 * 1024).to_string(),
            )?;
            // Over its memory a job is killed, not swapped out at its neighbours' expense.
            let _ = std::fs::write(dir.join("memory.swap.max"), b"0");
        }
        if let (true, Some(cores)) = (self.cpuset, &limits.cores) {
            write(&dir.join("cpuset.cpus"), &super::core_list(cores))?;
        }
        Ok(())
    }
}

/// This process's cgroup in the unified hierarchy (`0::/PATH` in `/proc/self/cgroup`), `/`
/// where it cannot be read.
pub(super) fn own_cgroup() -> String {
    std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix("0::").map(str::to_owned))
        })
        .unwrap_or_else(|| "/".to_owned())
}

fn own_dir(mount: &Path, own: &str) -> PathBuf {
    let own = own.trim().trim_start_matches('/');
    // An agent started again from the leaf an earlier one moved into still owns the unit's.
    let own = own
        .strip_suffix("mgpu-agent")
        .map_or(own, |o| o.trim_end_matches('/'));
    if own.is_empty() {
        mount.to_owned()
    } else {
        mount.join(own)
    }
}

/// Where the jobs' cgroups go in the unified hierarchy mounted at `mount`, for an agent in
/// cgroup `own`: below the agent's own cgroup when it has one (under systemd, the unit's, which
/// `Delegate=yes` hands to the agent), so the agent never writes around systemd; else
/// `mgpu` at the top.
pub(super) fn parent_dir(mount: &Path, own: &str) -> PathBuf {
    let top = own_dir(mount, own);
    if top == mount {
        mount.join(PARENT)
    } else {
        top.join("mgpu-jobs")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_systemd_the_jobs_go_below_the_agents_own_cgroup() {
        let mount = Path::new("/sys/fs/cgroup");
        assert_eq!(parent_dir(mount, "/"), mount.join("mgpu"));
        assert_eq!(
            parent_dir(mount, "/system.slice/mgpu-node.service\n"),
            mount.join("system.slice/mgpu-node.service/mgpu-jobs")
        );
        assert_eq!(
            parent_dir(mount, "/system.slice/mgpu-node.service/mgpu-agent"),
            mount.join("system.slice/mgpu-node.service/mgpu-jobs")
        );
    }
}
