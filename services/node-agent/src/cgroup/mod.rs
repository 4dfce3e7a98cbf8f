//! Containment: every job in a cgroup of its own, so that everything it starts (a daemon, a
//! double fork, a `setsid` escape from its process group) is found and killed when the job
//! ends, the job counts as ended only once none of it is left, it can open only its own GPUs'
//! device nodes, and its host memory and CPU cores are its own.
//!
//! Both cgroup versions: v2 (one unified hierarchy, the common case on current GPU hosts,
//! `v2.rs`) and v1 (a hierarchy per controller, as on older hosts, `v1.rs`). The version is
//! detected when the agent starts (`--cgroup auto`), or named (`--cgroup v1|v2|off`). Where the
//! agent cannot contain (not root, no writable hierarchy, no freezer), jobs are contained by
//! their process group as before; where a controller is missing, what it would enforce is
//! not. [`Containment::describe`] says which, in the log and in the node's heartbeat.
//!
//! The agent makes the job's cgroup and writes its limits before it starts the job's guard;
//! the guard (or, for the built-in guard, the agent between fork and exec) moves itself into
//! it before it starts the job, so the job's first instruction already runs inside (see
//! `guard.rs`). Killing and measuring a made cgroup is `job_cgroup.rs`; cgroups made ahead of
//! their jobs, for guards waiting in the pool, are `pooled.rs`.

mod device_filter;
mod job_cgroup;
mod pooled;
mod v1;
mod v2;

use std::path::{Path, PathBuf};

pub use job_cgroup::{Emptied, JobCgroup, LiveUsage};
use v1::V1;
use v2::V2;

use crate::running::AttemptKey;

/// Where the kernel mounts the cgroup hierarchies.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The directory, in each hierarchy used, under which every job's cgroup is made.
const PARENT: &str = "mgpu";
/// NVIDIA's character device major: `/dev/nvidiaN` is 195:N, `nvidiactl` 195:255,
/// `nvidia-modeset` 195:254 (the control devices every CUDA program opens).
pub const NVIDIA_MAJOR: u32 = 195;

/// What `--cgroup` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupChoice {
    /// v2 where the host has only the unified hierarchy, else the v1 freezer, else v2.
    Auto,
    V1,
    V2,
    Off,
}

impl std::str::FromStr for CgroupChoice {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "auto" => Ok(CgroupChoice::Auto),
            "v1" => Ok(CgroupChoice::V1),
            "v2" => Ok(CgroupChoice::V2),
            "off" => Ok(CgroupChoice::Off),
            other => Err(format!(
                "`{other}` is not a cgroup choice: auto, v1, v2 or off"
            )),
        }
    }
}

/// Which hierarchy holds the jobs' cgroups.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Layout {
    V2(V2),
    V1(V1),
}

/// What one job's cgroup enforces, from its assignment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobLimits {
    /// The device minors of the GPUs the job was given (`/dev/nvidiaN` is minor N).
    pub gpu_minors: Vec<u32>,
    /// The device minors of every GPU of this node (v1 denies the others one by one).
    pub node_gpu_minors: Vec<u32>,
    /// Its host memory limit (`--mem-host`); None: none.
    pub mem_host_mib: Option<u64>,
    /// The CPU cores it is pinned to (`--cpus`); None: not pinned.
    pub cores: Option<Vec<u32>>,
}

impl JobLimits {
    /// The node's GPUs the job was not given.
    fn denied_gpu_minors(&self) -> impl Iterator<Item = u32> + '_ {
        self.node_gpu_minors
            .iter()
            .copied()
            .filter(|minor| !self.gpu_minors.contains(minor))
    }
}

/// How this agent contains its jobs, decided once at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Containment {
    layout: Option<Layout>,
    /// Why there is no cgroup containment, when there is none.
    why_not: Option<String>,
}

impl Containment {
    /// Decides how the agent of `node` contains jobs under `root` (normally [`CGROUP_ROOT`])
    /// as `choice` asks, making the parent directories of its jobs' cgroups. Each agent has a
    /// parent of its own (`…/mgpu/<node>`): agents sharing a host (a test or development
    /// cluster) may run ranks of the same job, and must never empty each other's.
    pub fn detect(root: &Path, choice: CgroupChoice, node: &str) -> Containment {
        let unified = if root.join("cgroup.controllers").is_file() {
            Some(root.to_owned())
        } else if root.join("unified/cgroup.controllers").is_file() {
            // A hybrid layout: v1 controllers, and a unified hierarchy beside them.
            Some(root.join("unified"))
        } else {
            None
        };
        let pure_v2 = unified.as_deref() == Some(root);
        let own = v2::own_cgroup();
        let v2 = |mount: &PathBuf| Layout::V2(V2::at(mount, &own, node));
        let v1 = || V1::find(root, node).map(Layout::V1);
        let layout = match choice {
            CgroupChoice::Off => return Containment::none("cgroups turned off (--cgroup off)"),
            CgroupChoice::V2 => unified.as_ref().map(v2),
            CgroupChoice::V1 => v1(),
            CgroupChoice::Auto if pure_v2 => unified.as_ref().map(v2),
            CgroupChoice::Auto => v1().or_else(|| unified.as_ref().map(v2)),
        };
        let Some(mut layout) = layout else {
            return Containment::none(match choice {
                CgroupChoice::V1 => "no cgroup v1 freezer hierarchy",
                CgroupChoice::V2 => "no cgroup v2 hierarchy",
                _ => "no cgroup hierarchy found",
            });
        };
        let prepared = match &mut layout {
            Layout::V2(v2) => unified
                .as_deref()
                .map_or(Ok(()), |mount| v2.prepare(mount, &own)),
            Layout::V1(v1) => v1.prepare(),
        };
        let parent = layout.parent().to_owned();
        match prepared.and_then(|()| probe_writable(&parent)) {
            Ok(()) => Containment {
                layout: Some(layout),
                why_not: None,
            },
            Err(err) => Containment::none(&format!(
                "cgroup {} not writable at {}: {err}",
                layout.name(),
                parent.display()
            )),
        }
    }

    fn none(why: &str) -> Containment {
        Containment {
            layout: None,
            why_not: Some(why.to_owned()),
        }
    }

    /// What this agent enforces, for its log and its heartbeat (`mgpu nodes`).
    pub fn describe(&self) -> String {
        match (&self.layout, &self.why_not) {
            (Some(layout), _) => {
                let missing = layout.missing();
                let gaps = if missing.is_empty() {
                    "; GPUs isolated, host memory limited, CPUs pinned".to_owned()
                } else {
                    format!("; not enforced: {}", missing.join(", "))
                };
                format!(
                    "cgroup {} (each job in its own cgroup under {}{gaps})",
                    layout.name(),
                    layout.parent().display()
                )
            }
            (None, why) => format!(
                "process group only ({})",
                why.as_deref().unwrap_or("no cgroups")
            ),
        }
    }

    /// Whether jobs get a cgroup each.
    pub fn enabled(&self) -> bool {
        self.layout.is_some()
    }

    /// Whether a job here can open only its own GPUs' device nodes.
    pub fn isolates_gpus(&self) -> bool {
        match &self.layout {
            Some(Layout::V2(v2)) => v2.devices_missing.is_none(),
            Some(Layout::V1(v1)) => v1.devices.is_some(),
            None => false,
        }
    }

    /// Whether a job's cores can be pinned.
    pub fn pins_cpus(&self) -> bool {
        match &self.layout {
            Some(Layout::V2(v2)) => v2.cpuset,
            Some(Layout::V1(v1)) => v1.cpuset.is_some(),
            None => false,
        }
    }

    /// Empties and removes the cgroup an earlier agent made for `key`, if there is one: the
    /// one it `recorded`, if it named one (a pooled cgroup on v2), else the attempt's.
    pub async fn empty_left_over(
        &self,
        key: &AttemptKey,
        recorded: Option<&str>,
    ) -> Result<(), String> {
        let Some(cgroup) = self.attempt_cgroup(key, recorded) else {
            return Ok(());
        };
        if !cgroup.dir.is_dir() {
            return Ok(());
        }
        cgroup.kill_all().await.map(|_| ())
    }

    fn cgroup_of(&self, key: &AttemptKey, pinned: bool) -> Option<JobCgroup> {
        let name = cgroup_name(key);
        Some(match self.layout.as_ref()? {
            Layout::V2(v2) => v2.job(&name),
            Layout::V1(v1) => v1.job(&name, pinned),
        })
    }

    /// Makes the cgroup of one attempt with `limits` written (None where jobs are not
    /// contained). One left over by an earlier agent for the same attempt is emptied first.
    pub fn create(
        &self,
        key: &AttemptKey,
        limits: &JobLimits,
    ) -> Result<Option<JobCgroup>, String> {
        let pinned = limits.cores.is_some();
        let (Some(layout), Some(cgroup)) = (&self.layout, self.cgroup_of(key, pinned)) else {
            return Ok(None);
        };
        if cgroup.dir.is_dir() {
            cgroup.kill_all_blocking()?;
        }
        let set_up = match layout {
            Layout::V2(v2) => std::fs::create_dir_all(&cgroup.dir)
                .map_err(|err| {
                    format!(
                        "cannot make the job's cgroup {}: {err}",
                        cgroup.dir.display()
                    )
                })
                .and_then(|()| v2.set_up(&cgroup.dir, limits)),
            Layout::V1(v1) => v1.set_up(&cgroup_name(key), limits),
        };
        match set_up {
            Ok(()) => Ok(Some(cgroup)),
            Err(err) => {
                let _ = cgroup.remove();
                Err(err)
            }
        }
    }
}

/// The name of an attempt's cgroup, the same in every hierarchy.
fn cgroup_name(key: &AttemptKey) -> String {
    format!("job-{}-{}", key.job_id, key.attempt)
}

impl Layout {
    fn parent(&self) -> &Path {
        match self {
            Layout::V2(v2) => &v2.parent,
            Layout::V1(v1) => &v1.freezer,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Layout::V2(_) => "v2",
            Layout::V1(_) => "v1",
        }
    }

    fn missing(&self) -> Vec<String> {
        match self {
            Layout::V2(v2) => v2.missing(),
            Layout::V1(v1) => v1.missing().into_iter().map(str::to_owned).collect(),
        }
    }
}

/// Whether a cgroup can be made (and removed) under `parent`.
fn probe_writable(parent: &Path) -> std::io::Result<()> {
    let probe = parent.join(format!("probe-{}", std::process::id()));
    std::fs::create_dir(&probe)?;
    std::fs::remove_dir(&probe)
}

/// Writes one control file, the error naming it.
fn write(path: &Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value)
        .map_err(|err| format!("cannot write `{value}` to {}: {err}", path.display()))
}

/// Cores as a cpuset list: `0,2,5`.
fn core_list(cores: &[u32]) -> String {
    let cores: Vec<String> = cores.iter().map(u32::to_string).collect();
    cores.join(",")
}

/// Moves the calling process into each cgroup whose `cgroup.procs` is in `procs`. Made for the
/// time between fork and exec: system calls only, nothing allocated.
pub fn join(procs: &[std::ffi::CString]) -> std::io::Result<()> {
    use nix::fcntl::{OFlag, open};
    use nix::sys::stat::Mode;
    for file in procs {
        let fd = open(
            file.as_c_str(),
            OFlag::O_WRONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        nix::unistd::write(&fd, b"0")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_choice_is_read_as_typed() {
        assert_eq!("auto".parse(), Ok(CgroupChoice::Auto));
        assert_eq!("v1".parse(), Ok(CgroupChoice::V1));
        assert_eq!("v2".parse(), Ok(CgroupChoice::V2));
        assert_eq!("off".parse(), Ok(CgroupChoice::Off));
        assert!("v3".parse::<CgroupChoice>().is_err());
    }

    /// A fake hierarchy of plain directories: detection only looks at which files exist.
    fn fake_root(files: &[&str]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        for file in files {
            let path = root.path().join(file);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{e}"));
            }
            std::fs::write(&path, b"").unwrap_or_else(|e| panic!("{e}"));
        }
        root
    }

    #[test]
    fn a_pure_v2_host_uses_v2_and_a_hybrid_one_the_v1_freezer() {
        let v2 = fake_root(&["cgroup.controllers"]);
        let found = Containment::detect(v2.path(), CgroupChoice::Auto, "n1");
        assert!(found.describe().starts_with("cgroup v2"), "{found:?}");
        let hybrid = fake_root(&["unified/cgroup.controllers", "freezer/cgroup.procs"]);
        let found = Containment::detect(hybrid.path(), CgroupChoice::Auto, "n1");
        assert!(found.describe().starts_with("cgroup v1"), "{found:?}");
        let asked = Containment::detect(hybrid.path(), CgroupChoice::V2, "n1");
        let Some(Layout::V2(layout)) = asked.layout else {
            panic!("{asked:?}");
        };
        let expected = v2::parent_dir(&hybrid.path().join("unified"), &v2::own_cgroup());
        assert_eq!(layout.parent, expected.join("n1"));
    }

    #[test]
    fn what_a_missing_controller_would_enforce_is_named() {
        let freezer_only = fake_root(&["freezer/cgroup.procs"]);
        let found = Containment::detect(freezer_only.path(), CgroupChoice::V1, "n1");
        let text = found.describe();
        assert!(
            text.contains("not enforced: GPU isolation (no devices controller)"),
            "{text}"
        );
        assert!(
            text.contains("host memory (no memory controller)"),
            "{text}"
        );
        assert!(!found.isolates_gpus());
        let all = fake_root(&[
            "freezer/cgroup.procs",
            "devices/cgroup.procs",
            "memory/cgroup.procs",
            "cpuacct/cgroup.procs",
        ]);
        let found = Containment::detect(all.path(), CgroupChoice::V1, "n1");
        assert!(found.isolates_gpus(), "{found:?}");
        assert!(
            found
                .describe()
                .contains("CPU pinning (no cpuset controller)")
        );
    }

    #[test]
    fn a_job_is_denied_exactly_the_nodes_other_gpus() {
        let limits = JobLimits {
            gpu_minors: vec![1, 3],
            node_gpu_minors: vec![0, 1, 2, 3],
            ..JobLimits::default()
        };
        assert_eq!(limits.denied_gpu_minors().collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!(core_list(&[0, 2, 5]), "0,2,5");
    }

    #[test]
    fn without_a_hierarchy_or_when_off_jobs_are_contained_by_their_group_and_it_says_why() {
        let bare = fake_root(&[]);
        let found = Containment::detect(bare.path(), CgroupChoice::Auto, "n1");
        assert!(!found.enabled());
        assert_eq!(
            found.describe(),
            "process group only (no cgroup hierarchy found)"
        );
        let v2 = fake_root(&["cgroup.controllers"]);
        let off = Containment::detect(v2.path(), CgroupChoice::Off, "n1");
        assert_eq!(
            off.describe(),
            "process group only (cgroups turned off (--cgroup off))"
        );
        let v1 = Containment::detect(v2.path(), CgroupChoice::V1, "n1");
        assert!(v1.describe().contains("no cgroup v1 freezer"), "{v1:?}");
    }
}
