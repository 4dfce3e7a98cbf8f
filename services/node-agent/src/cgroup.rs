//! Containment: every job in a cgroup of its own, so that everything it starts (a daemon, a
//! double fork, a `setsid` escape from its process group) is found and killed when the job
//! ends, and the job counts as ended only once none of it is left.
//!
//! Both cgroup versions: v2 (one unified hierarchy, the common case on current GPU hosts: the
//! job is killed with `cgroup.kill`) and v1 (a hierarchy per controller, as on older hosts:
//! the job's freezer cgroup is frozen, every process in it killed, and thawed). The version is
//! detected when the agent starts (`--cgroup auto`), or named (`--cgroup v1|v2|off`). Where the
//! agent cannot contain (not root, no writable hierarchy, no freezer), jobs are contained by
//! their process group as before, and [`Containment::describe`] says so in the log and in the
//! node's heartbeat.
//!
//! The agent makes the job's cgroup before it starts the job's guard; the guard (or, for the
//! built-in guard, the agent between fork and exec) moves itself into it before it starts the
//! job, so the job's first instruction already runs inside (see `guard.rs`).

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::running::AttemptKey;

/// Where the kernel mounts the cgroup hierarchies.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The directory, in each hierarchy used, under which every job's cgroup is made.
const PARENT: &str = "mgpu";
/// How long killing a job's cgroup may take before the agent gives up on emptying it.
const EMPTY_WITHIN: Duration = Duration::from_secs(10);

/// What `--cgroup` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupChoice {
    /// v2 where the unified hierarchy has controllers, else v1, else nothing.
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
enum Version {
    /// The unified hierarchy: `dir` is the parent of the jobs' cgroups.
    V2 { parent: PathBuf },
    /// The freezer controller's hierarchy: `parent` is the parent of the jobs' cgroups.
    V1 { parent: PathBuf },
}

/// How this agent contains its jobs, decided once at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Containment {
    version: Option<Version>,
    /// Why there is no cgroup containment, when there is none.
    why_not: Option<String>,
}

impl Containment {
    /// Decides how the agent of `node` contains jobs under `root` (normally [`CGROUP_ROOT`])
    /// as `choice` asks, making the parent directory of its jobs' cgroups. Each agent has a
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
        let freezer = root.join("freezer");
        let freezer = freezer.join("cgroup.procs").is_file().then_some(freezer);
        let pure_v2 = unified.as_deref() == Some(root);
        let v2 = |dir: PathBuf| Version::V2 {
            parent: v2_parent(&dir, &own_v2_cgroup()),
        };
        let version = match choice {
            CgroupChoice::Off => return Containment::none("cgroups turned off (--cgroup off)"),
            CgroupChoice::V2 => unified.map(v2),
            CgroupChoice::V1 => freezer.map(|dir| Version::V1 {
                parent: dir.join(PARENT),
            }),
            CgroupChoice::Auto if pure_v2 => unified.map(v2),
            CgroupChoice::Auto => freezer
                .map(|dir| Version::V1 {
                    parent: dir.join(PARENT),
                })
                .or_else(|| unified.map(v2)),
        };
        let version = version.map(|version| version.for_node(node));
        let Some(version) = version else {
            return Containment::none(match choice {
                CgroupChoice::V1 => "no cgroup v1 freezer hierarchy",
                CgroupChoice::V2 => "no cgroup v2 hierarchy",
                _ => "no cgroup hierarchy found",
            });
        };
        let parent = version.parent();
        match std::fs::create_dir_all(parent).and_then(|()| probe_writable(parent)) {
            Ok(()) => Containment {
                version: Some(version),
                why_not: None,
            },
            Err(err) => Containment::none(&format!(
                "cgroup {} not writable at {}: {err}",
                version.name(),
                parent.display()
            )),
        }
    }

    fn none(why: &str) -> Containment {
        Containment {
            version: None,
            why_not: Some(why.to_owned()),
        }
    }

    /// What this agent enforces, for its log and its heartbeat (`mgpu nodes`).
    pub fn describe(&self) -> String {
        match (&self.version, &self.why_not) {
            (Some(version), _) => format!(
                "cgroup {} (each job in its own cgroup under {})",
                version.name(),
                version.parent().display()
            ),
            (None, why) => format!(
                "process group only ({})",
                why.as_deref().unwrap_or("no cgroups")
            ),
        }
    }

    /// Whether jobs get a cgroup each.
    pub fn enabled(&self) -> bool {
        self.version.is_some()
    }

    /// Empties and removes the cgroup an earlier agent made for `key`, if there is one.
    pub async fn empty_left_over(&self, key: &AttemptKey) -> Result<(), String> {
        let Some(cgroup) = self.cgroup_of(key) else {
            return Ok(());
        };
        if !cgroup.dir.is_dir() {
            return Ok(());
        }
        cgroup.kill_all().await
    }

    fn cgroup_of(&self, key: &AttemptKey) -> Option<JobCgroup> {
        let version = self.version.as_ref()?;
        Some(JobCgroup {
            dir: version
                .parent()
                .join(format!("job-{}-{}", key.job_id, key.attempt)),
            v2: matches!(version, Version::V2 { .. }),
        })
    }

    /// Makes the cgroup of one attempt (None where jobs are not contained). One left over by
    /// an earlier agent for the same attempt is emptied first.
    pub fn create(&self, key: &AttemptKey) -> Result<Option<JobCgroup>, String> {
        let Some(cgroup) = self.cgroup_of(key) else {
            return Ok(None);
        };
        match std::fs::create_dir(&cgroup.dir) {
            Ok(()) => Ok(Some(cgroup)),
            Err(err) if err.kind() == ErrorKind::AlreadyExists => {
                cgroup.kill_all_blocking()?;
                Ok(Some(cgroup))
            }
            Err(err) => Err(format!(
                "cannot make the job's cgroup {}: {err}",
                cgroup.dir.display()
            )),
        }
    }
}

/// This process's cgroup in the unified hierarchy (`0::/PATH` in `/proc/self/cgroup`), `/`
/// where it cannot be read.
fn own_v2_cgroup() -> String {
    std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix("0::").map(str::to_owned))
        })
        .unwrap_or_else(|| "/".to_owned())
}

/// Where the jobs' cgroups go in the unified hierarchy mounted at `mount`, for an agent in
/// cgroup `own`: below the agent's own cgroup when it has one (under systemd, the unit's, which
/// `Delegate=yes` hands to the agent), so the agent never writes around systemd; else
/// `mgpu` at the top.
fn v2_parent(mount: &Path, own: &str) -> PathBuf {
    let own = own.trim().trim_start_matches('/');
    if own.is_empty() {
        mount.join(PARENT)
    } else {
        mount.join(own).join("mgpu-jobs")
    }
}

impl Version {
    fn for_node(self, node: &str) -> Version {
        match self {
            Version::V2 { parent } => Version::V2 {
                parent: parent.join(node),
            },
            Version::V1 { parent } => Version::V1 {
                parent: parent.join(node),
            },
        }
    }

    fn parent(&self) -> &Path {
        match self {
            Version::V2 { parent } | Version::V1 { parent } => parent,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Version::V2 { .. } => "v2",
            Version::V1 { .. } => "v1",
        }
    }
}

/// Whether a cgroup can be made (and removed) under `parent`.
fn probe_writable(parent: &Path) -> std::io::Result<()> {
    let probe = parent.join(format!("probe-{}", std::process::id()));
    std::fs::create_dir(&probe)?;
    std::fs::remove_dir(&probe)
}

/// One attempt's cgroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobCgroup {
    dir: PathBuf,
    v2: bool,
}

impl JobCgroup {
    /// The file a process writes `0` to, to move itself in.
    pub fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// The processes in it now.
    pub fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.procs_file())
            .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Kills every process in it and waits until none is left, then removes it. An error says
    /// what is left when it would not empty.
    pub async fn kill_all(self) -> Result<(), String> {
        tokio::task::spawn_blocking(move || {
            let emptied = self.kill_all_blocking();
            let removed = self.remove();
            emptied.and(removed)
        })
        .await
        .map_err(|err| format!("killing the job's cgroup: {err}"))?
    }

    fn kill_all_blocking(&self) -> Result<(), String> {
        let deadline = Instant::now() + EMPTY_WITHIN;
        let mut pause = Duration::from_millis(1);
        loop {
            if self.pids().is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "processes {:?} are still in {} after {EMPTY_WITHIN:?}",
                    self.pids(),
                    self.dir.display()
                ));
            }
            if self.v2 {
                self.kill_v2();
            } else {
                self.kill_v1();
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    /// `cgroup.kill` kills every process, forks in flight included (Linux 5.14 and later);
    /// before that, a frozen cgroup is killed process by process.
    fn kill_v2(&self) {
        if std::fs::write(self.dir.join("cgroup.kill"), b"1").is_ok() {
            return;
        }
        let _ = std::fs::write(self.dir.join("cgroup.freeze"), b"1");
        self.kill_each();
        let _ = std::fs::write(self.dir.join("cgroup.freeze"), b"0");
    }

    /// Frozen first, so nothing forks between reading the list and the kills; the killed
    /// processes die once thawed.
    fn kill_v1(&self) {
        let state = self.dir.join("freezer.state");
        let _ = std::fs::write(&state, b"FROZEN");
        let frozen_by = Instant::now() + Duration::from_secs(1);
        while std::fs::read_to_string(&state).is_ok_and(|s| s.trim() == "FREEZING")
            && Instant::now() < frozen_by
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.kill_each();
        let _ = std::fs::write(&state, b"THAWED");
    }

    fn kill_each(&self) {
        for pid in self.pids() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    /// Removes the (empty) cgroup.
    fn remove(&self) -> Result<(), String> {
        match std::fs::remove_dir(&self.dir) {
            Ok(()) => Ok(()),
            Err(err) if err.kind() == ErrorKind::NotFound => Ok(()),
            Err(err) => Err(format!("removing {}: {err}", self.dir.display())),
        }
    }
}

/// Moves the calling process into the cgroup whose `cgroup.procs` is `procs`. Made for the
/// time between fork and exec: system calls only, nothing allocated.
pub fn join(procs: &std::ffi::CStr) -> std::io::Result<()> {
    use nix::fcntl::{OFlag, open};
    use nix::sys::stat::Mode;
    let fd = open(procs, OFlag::O_WRONLY | OFlag::O_CLOEXEC, Mode::empty())?;
    nix::unistd::write(&fd, b"0")?;
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
        assert_eq!(
            asked.version,
            Some(Version::V2 {
                parent: v2_parent(&hybrid.path().join("unified"), &own_v2_cgroup()).join("n1")
            })
        );
    }

    #[test]
    fn under_systemd_the_jobs_go_below_the_agents_own_cgroup() {
        let mount = Path::new("/sys/fs/cgroup");
        assert_eq!(v2_parent(mount, "/"), mount.join("mgpu"));
        assert_eq!(
            v2_parent(mount, "/system.slice/mgpu-node.service\n"),
            mount.join("system.slice/mgpu-node.service/mgpu-jobs")
        );
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
