//! One attempt's cgroup once made: the `cgroup.procs` files its guard joins, killing
//! everything in it, what it uses while it runs (for the metrics), and what it used (read
//! after the kill, before it is removed).

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mgpu_protocol::host::JobUsage;

/// How long killing a job's cgroup may take before the agent gives up on emptying it.
const EMPTY_WITHIN: Duration = Duration::from_secs(10);

/// One attempt's cgroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobCgroup {
    /// v2: the job's one directory. v1: its freezer directory, the one frozen and killed.
    pub(super) dir: PathBuf,
    pub(super) v2: bool,
    /// v1: the job's directories in the other controllers' hierarchies (devices, memory,
    /// cpuset, cpuacct), joined and removed with it.
    pub(super) v1_others: Vec<PathBuf>,
    /// Where its memory controller's files are, if it has one.
    pub(super) memory: Option<PathBuf>,
    /// v1: its cpuacct directory (v2 reads `cpu.stat` in `dir`).
    pub(super) cpuacct: Option<PathBuf>,
}

/// How a job's cgroup ended: what it used, and whether the kernel killed a process of it for
/// going over its memory limit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Emptied {
    pub usage: JobUsage,
    pub out_of_memory: bool,
}

/// What a running job's cgroup says it uses now; None where its hierarchy lacks the
/// controller (no memory controller on this v1 host, say).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LiveUsage {
    /// CPU time used so far, every process of the job together.
    pub cpu_seconds: Option<f64>,
    /// Host memory it uses now (page cache included, as the limit counts it).
    pub memory_bytes: Option<u64>,
}

impl JobCgroup {
    /// What the job uses now: cheap reads of a couple of small files.
    pub fn live_usage(&self) -> LiveUsage {
        let current = if self.v2 {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        };
        LiveUsage {
            cpu_seconds: self.cpu_time().map(|time| time.as_secs_f64()),
            memory_bytes: self
                .memory
                .as_deref()
                .and_then(|dir| std::fs::read_to_string(dir.join(current)).ok())
                .and_then(|text| text.trim().parse().ok()),
        }
    }

    /// CPU time used so far: `cpu.stat` (µs) on v2, `cpuacct.usage` (ns) on v1.
    fn cpu_time(&self) -> Option<Duration> {
        let read = |dir: &Path, file: &str| std::fs::read_to_string(dir.join(file)).ok();
        if self.v2 {
            read(&self.dir, "cpu.stat")
                .and_then(|text| keyed_value(&text, "usage_usec"))
                .map(Duration::from_micros)
        } else {
            self.cpuacct
                .as_deref()
                .and_then(|dir| read(dir, "cpuacct.usage"))
                .and_then(|text| text.trim().parse::<u64>().ok())
                .map(Duration::from_nanos)
        }
    }

    /// The `cgroup.procs` files a process writes `0` to, to move itself in (one per
    /// hierarchy on v1).
    pub fn procs_files(&self) -> Vec<PathBuf> {
        std::iter::once(&self.dir)
            .chain(&self.v1_others)
            .map(|dir| dir.join("cgroup.procs"))
            .collect()
    }

    /// [`JobCgroup::procs_files`] as the guard's CGROUP argument: joined by `:`.
    pub fn guard_argument(&self) -> String {
        let files: Vec<String> = self
            .procs_files()
            .iter()
            .map(|path| path.display().to_string())
            .collect();
        files.join(":")
    }

    /// The processes in it now.
    pub fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Kills every process in it and waits until none is left, reads what it used, then
    /// removes it. An error says what is left when it would not empty.
    pub async fn kill_all(self) -> Result<Emptied, String> {
        tokio::task::spawn_blocking(move || {
            let emptied = self.kill_all_blocking();
            let measured = self.measure();
            let removed = self.remove();
            emptied.and(removed).map(|()| measured)
        })
        .await
        .map_err(|err| format!("killing the job's cgroup: {err}"))?
    }

    pub(super) fn kill_all_blocking(&self) -> Result<(), String> {
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

    /// What the (emptied) cgroup says the job used: the counters outlive its processes.
    fn measure(&self) -> Emptied {
        let read = |dir: &Path, file: &str| std::fs::read_to_string(dir.join(file)).ok();
        let memory = self.memory.as_deref();
        let (peak, oom) = if self.v2 {
            (
                memory.and_then(|dir| read(dir, "memory.peak")),
                memory.and_then(|dir| read(dir, "memory.events")),
            )
        } else {
            (
                memory.and_then(|dir| read(dir, "memory.max_usage_in_bytes")),
                memory.and_then(|dir| read(dir, "memory.oom_control")),
            )
        };
        let cpu_time_ms = self
            .cpu_time()
            .map(|time| u64::try_from(time.as_millis()).unwrap_or(u64::MAX));
        Emptied {
            usage: JobUsage {
                peak_mem_host_bytes: peak.and_then(|text| text.trim().parse().ok()),
                cpu_time_ms,
                gpu_peak_mem: Vec::new(),
                idle_gpu_secs: None,
            },
            out_of_memory: oom
                .and_then(|text| keyed_value(&text, "oom_kill"))
                .is_some_and(|kills| kills > 0),
        }
    }

    /// Removes the (empty) cgroup from every hierarchy it is in.
    pub(super) fn remove(&self) -> Result<(), String> {
        let mut failures = Vec::new();
        for dir in std::iter::once(&self.dir).chain(&self.v1_others) {
            match std::fs::remove_dir(dir) {
                Ok(()) => {}
                Err(err) if err.kind() == ErrorKind::NotFound => {}
                Err(err) => failures.push(format!("removing {}: {err}", dir.display())),
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(failures.join("; "))
        }
    }
}

/// The number after `key` in a flat-keyed cgroup file (`oom_kill 1`, `usage_usec 5230`).
fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        (name == key).then(|| value.trim().parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_keyed_files_are_read_by_key() {
        let events = "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(keyed_value(events, "oom_kill"), Some(2));
        assert_eq!(keyed_value(events, "oom"), Some(1));
        assert_eq!(
            keyed_value("oom_kill_disable 0\nunder_oom 0\n", "oom_kill"),
            None
        );
    }

    #[test]
    fn counters_are_read_where_each_version_keeps_them() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let write = |name: &str, text: &str| {
            std::fs::write(dir.path().join(name), text).unwrap_or_else(|e| panic!("{e}"))
        };
        write("memory.peak", "209715200\n");
        write("memory.events", "oom 1\noom_kill 1\n");
        write("cpu.stat", "usage_usec 2500000\nuser_usec 2000000\n");
        let v2 = JobCgroup {
            dir: dir.path().to_owned(),
            v2: true,
            v1_others: Vec::new(),
            memory: Some(dir.path().to_owned()),
            cpuacct: None,
        };
        let measured = v2.measure();
        assert_eq!(measured.usage.peak_mem_host_bytes, Some(209_715_200));
        assert_eq!(measured.usage.cpu_time_ms, Some(2500));
        assert!(measured.out_of_memory);
        write("memory.max_usage_in_bytes", "1048576\n");
        write(
            "memory.oom_control",
            "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
        );
        write("cpuacct.usage", "1500000000\n");
        let v1 = JobCgroup {
            v2: false,
            cpuacct: Some(dir.path().to_owned()),
            ..v2
        };
        let measured = v1.measure();
        assert_eq!(measured.usage.peak_mem_host_bytes, Some(1_048_576));
        assert_eq!(measured.usage.cpu_time_ms, Some(1500));
        assert!(!measured.out_of_memory);
    }

    #[test]
    fn a_running_job_s_usage_is_read_where_each_version_keeps_it() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let write = |name: &str, text: &str| {
            std::fs::write(dir.path().join(name), text).unwrap_or_else(|e| panic!("{e}"))
        };
        write("memory.current", "52428800\n");
        write("cpu.stat", "usage_usec 1250000\nuser_usec 1000000\n");
        write("memory.usage_in_bytes", "4096\n");
        write("cpuacct.usage", "2000000000\n");
        let v2 = JobCgroup {
            dir: dir.path().to_owned(),
            v2: true,
            v1_others: Vec::new(),
            memory: Some(dir.path().to_owned()),
            cpuacct: None,
        };
        let usage = v2.live_usage();
        assert_eq!(usage.memory_bytes, Some(52_428_800));
        assert_eq!(usage.cpu_seconds, Some(1.25));
        let v1 = JobCgroup {
            v2: false,
            cpuacct: Some(dir.path().to_owned()),
            ..v2.clone()
        };
        let usage = v1.live_usage();
        assert_eq!(usage.memory_bytes, Some(4096));
        assert_eq!(usage.cpu_seconds, Some(2.0));
        let bare = JobCgroup {
            memory: None,
            cpuacct: None,
            ..v1
        };
        assert_eq!(bare.live_usage(), LiveUsage::default());
    }
}
