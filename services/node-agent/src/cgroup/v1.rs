//! cgroup v1: a hierarchy per controller, as on older hosts (and hybrid ones). The freezer
//! holds the job (it is frozen, killed and thawed); the devices controller denies the node's
//! other GPUs, the memory controller limits host memory, cpuset pins cores and cpuacct counts
//! CPU time, each where mounted. A job's cgroup is one directory of the same name in each.

use std::path::{Path, PathBuf};

use super::{JobCgroup, JobLimits, NVIDIA_MAJOR, PARENT, write};

/// The node's parent directory in each v1 hierarchy this agent uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct V1 {
    pub freezer: PathBuf,
    pub devices: Option<PathBuf>,
    pub memory: Option<PathBuf>,
    pub cpuset: Option<PathBuf>,
    pub cpuacct: Option<PathBuf>,
}

impl V1 {
    /// The hierarchies mounted under `root`, with `mgpu/<node>` parents; None without a
    /// freezer, which containment needs.
    pub fn find(root: &Path, node: &str) -> Option<V1> {
        let mounted = |controller: &str| {
            let dir = root.join(controller);
            dir.join("cgroup.procs")
                .is_file()
                .then(|| dir.join(PARENT).join(node))
        };
        Some(V1 {
            freezer: mounted("freezer")?,
            devices: mounted("devices"),
            memory: mounted("memory"),
            cpuset: mounted("cpuset"),
            cpuacct: mounted("cpuacct"),
        })
    }

    /// Makes the parents. A cpuset cgroup takes no process before it has CPUs and memory
    /// nodes, so the parents get their own parent's.
    pub fn prepare(&self) -> std::io::Result<()> {
        for parent in self.all() {
            std::fs::create_dir_all(parent)?;
        }
        if let Some(cpuset) = &self.cpuset
            && let Some(mgpu) = cpuset.parent()
        {
            inherit_cpuset(mgpu)?;
            inherit_cpuset(cpuset)?;
        }
        Ok(())
    }

    fn all(&self) -> impl Iterator<Item = &PathBuf> {
        std::iter::once(&self.freezer).chain(
            [&self.devices, &self.memory, &self.cpuset, &self.cpuacct]
                .into_iter()
                .flatten(),
        )
    }

    /// The controllers that are missing, by what they would enforce.
    pub fn missing(&self) -> Vec<&'static str> {
        let mut missing = Vec::new();
        if self.devices.is_none() {
            missing.push("GPU isolation (no devices controller)");
        }
        if self.memory.is_none() {
            missing.push("host memory (no memory controller)");
        }
        if self.cpuset.is_none() {
            missing.push("CPU pinning (no cpuset controller)");
        }
        missing
    }

    /// The job's cgroup named `name` (not made yet). Only a `pinned` job is in a cpuset
    /// cgroup of its own: an unpinned one stays in the parent's, which spares every start a
    /// directory, four writes and a move.
    pub fn job(&self, name: &str, pinned: bool) -> JobCgroup {
        let cpuset = self.cpuset.as_ref().filter(|_| pinned);
        let others: Vec<PathBuf> = [
            self.devices.as_ref(),
            self.memory.as_ref(),
            cpuset,
            self.cpuacct.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(|parent| parent.join(name))
        .collect();
        JobCgroup {
            dir: self.freezer.join(name),
            v2: false,
            v1_others: others,
            memory: self.memory.as_ref().map(|parent| parent.join(name)),
            cpuacct: self.cpuacct.as_ref().map(|parent| parent.join(name)),
        }
    }

    /// Makes the job's directories and writes its limits, before anything joins.
    pub fn set_up(&self, name: &str, limits: &JobLimits) -> Result<(), String> {
        let pinned = limits.cores.is_some();
        for parent in self
            .all()
            .filter(|parent| pinned || Some(*parent) != self.cpuset.as_ref())
        {
            let dir = parent.join(name);
            match std::fs::create_dir(&dir) {
                Ok(()) => {}
                Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(err) => return Err(format!("cannot make {}: {err}", dir.display())),
            }
        }
        if let Some(devices) = &self.devices {
            // The devices controller adds exceptions to an allow-all parent one rule at a
            // time: each GPU of the node the job was not given is denied.
            for minor in limits.denied_gpu_minors() {
                write(
                    &devices.join(name).join("devices.deny"),
                    &format!("c {NVIDIA_MAJOR}:{minor} rwm"),
                )?;
            }
        }
        if let (Some(memory), Some(mib)) = (&self.memory, limits.mem_host_mib) {
            let dir = memory.join(name);
            let bytes = (mib.saturating_mul(1024 * 1024)).to_string();
            write(&dir.join("memory.limit_in_bytes"), &bytes)?;
            // With swap accounting, memory plus swap gets the same limit: a job over its
            // memory is killed, not swapped out at its neighbours' expense.
            let _ = std::fs::write(dir.join("memory.memsw.limit_in_bytes"), &bytes);
        }
        if let (Some(cpuset), Some(cores)) = (&self.cpuset, &limits.cores) {
            let dir = cpuset.join(name);
            inherit_cpuset(&dir)
                .map_err(|err| format!("cannot give {} its CPUs: {err}", dir.display()))?;
            write(&dir.join("cpuset.cpus"), &super::core_list(cores))?;
        }
        Ok(())
    }
}

/// Gives a cpuset cgroup its parent's CPUs and memory nodes where it has none yet.
fn inherit_cpuset(dir: &Path) -> std::io::Result<()> {
    let Some(parent) = dir.parent() else {
        return Ok(());
    };
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let own = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        if own.trim().is_empty() {
            let inherited = std::fs::read_to_string(parent.join(file))?;
            std::fs::write(dir.join(file), inherited.trim())?;
        }
    }
    Ok(())
}
