//! How a job is told it is about to be stopped, so it can save its work (`--signal`, a kill's
//! warning): the stop file `$MGPU_STOP_FILE` names, which says why (`preempted`,
//! `time_limit`, …), and the warning signal, sent to every process of the job but its guard.
//! The guard is spared because it leads the job's process group and would take SIGTERM,
//! SIGINT or SIGHUP as its own order to stop the job at once, and die of SIGUSR1.
//!
//! The file lives in a directory of its own per attempt, made by the agent under an
//! unpredictable name (`mkdir` never follows a link), owned by the agent and mode 0711: the
//! job reaches the file by its path, but nobody else can list the directory and the job
//! cannot plant a link where the agent (perhaps root) writes. The file does not exist until a
//! stop is announced, and goes with its directory when the job ended.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use mgpu_protocol::stop::StopCause;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::cgroup::JobCgroup;
use crate::running::AttemptKey;

/// The stop file's name in its directory.
const FILE_NAME: &str = "stop";

/// One attempt's stop file (not yet written) and its directory, removed when this is dropped.
#[derive(Debug)]
pub struct StopFile {
    dir: PathBuf,
    path: PathBuf,
}

impl Drop for StopFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl StopFile {
    /// Makes the attempt's directory; the file itself is written by [`StopFile::announce`].
    /// The error is the `FailedToStart` text.
    pub async fn create(key: &AttemptKey, node: &str) -> Result<StopFile, String> {
        let dir = std::env::temp_dir().join(format!(
            "mgpu-stop-{}-{}-{}",
            key.job_id,
            key.attempt,
            uuid::Uuid::new_v4().simple()
        ));
        let made = {
            let dir = dir.clone();
            tokio::task::spawn_blocking(move || make_dir(&dir)).await
        };
        match made {
            Ok(Ok(())) => Ok(StopFile {
                path: dir.join(FILE_NAME),
                dir,
            }),
            Ok(Err(err)) => {
                let _ = tokio::fs::remove_dir_all(&dir).await;
                Err(format!(
                    "cannot make the job's stop file directory {} on {node}: {err}",
                    dir.display()
                ))
            }
            Err(err) => Err(format!(
                "cannot make the job's stop file directory on {node}: {err}"
            )),
        }
    }

    /// The path the job finds in `MGPU_STOP_FILE`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes why the job is stopped, with a newline, replacing what an earlier warning wrote:
    /// a temporary file swapped in, so a job reading it sees one cause whole, never a part.
    pub fn announce(&self, cause: StopCause) -> std::io::Result<()> {
        let temporary = self.dir.join(format!("{FILE_NAME}.tmp"));
        let written = (|| {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o644)
                .open(&temporary)?;
            // Explicitly: the agent's umask (077 under some service managers) would leave a
            // file owned by root unreadable to the job's account.
            file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
            file.write_all(format!("{}\n", cause.as_str()).as_bytes())?;
            std::fs::rename(&temporary, &self.path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&temporary);
        }
        written
    }
}

/// Makes `dir`, mode 0711 whatever the umask: the job's account may pass through it, not list
/// it or write in it.
fn make_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new().mode(0o700).create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
}

/// The processes a warning goes to: those of the job's process group (led by its guard,
/// `guard`) and of its cgroup, each once, never the guard, nor init or the kernel's.
pub fn warning_targets(guard: u32, group: &[u32], cgroup: &[u32]) -> BTreeSet<u32> {
    group
        .iter()
        .chain(cgroup)
        .copied()
        .filter(|pid| *pid != guard && *pid > 1)
        .collect()
}

/// Sends `signal` to every process of the job but its guard ([`warning_targets`]); returns how
/// many it reached. A process that forks while the list is read may miss the warning; SIGTERM
/// later reaches the whole group all the same.
pub fn warn_processes(guard: u32, signal: Signal, cgroup: Option<&JobCgroup>) -> usize {
    let in_cgroup: Vec<u32> = cgroup
        .map(JobCgroup::pids)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|pid| u32::try_from(pid).ok())
        .collect();
    let targets = warning_targets(guard, &group_members(guard), &in_cgroup);
    targets
        .into_iter()
        .filter_map(|pid| i32::try_from(pid).ok())
        .filter(|pid| kill(Pid::from_raw(*pid), signal).is_ok())
        .count()
}

/// The processes whose process group is `pgid`, read from `/proc`.
fn group_members(pgid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| crate::gpu_processes::process_group_from_stat(&stat))
                == Some(pgid)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use mgpu_protocol::ids::JobId;

    use super::*;

    #[test]
    fn a_warning_spares_the_guard_and_reaches_each_process_once() {
        let targets = warning_targets(100, &[100, 101, 102], &[100, 102, 250, 1, 0]);
        assert_eq!(targets.into_iter().collect::<Vec<_>>(), vec![101, 102, 250]);
        assert!(warning_targets(7, &[7], &[]).is_empty());
    }

    #[tokio::test]
    async fn the_file_appears_only_when_a_stop_is_announced_and_goes_with_the_job() {
        let key = AttemptKey {
            job_id: JobId::random(),
            attempt: 2,
        };
        let file = StopFile::create(&key, "n1")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let dir = file.dir.clone();
        assert!(!file.path().exists(), "no stop announced yet");
        let mode = |p: &Path| std::fs::metadata(p).map(|m| m.mode() & 0o777).ok();
        assert_eq!(mode(&dir), Some(0o711));
        file.announce(StopCause::TimeLimit)
            .unwrap_or_else(|e| panic!("{e}"));
        let read = || std::fs::read_to_string(file.path()).unwrap_or_default();
        assert_eq!(read(), "time_limit\n");
        assert_eq!(mode(file.path()), Some(0o644));
        file.announce(StopCause::Preempted)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read(), "preempted\n");
        drop(file);
        assert!(!dir.exists());
    }

    #[test]
    fn the_members_of_this_process_group_include_this_process() {
        let own = nix::unistd::getpgrp().as_raw().unsigned_abs();
        assert!(group_members(own).contains(&std::process::id()));
    }
}
