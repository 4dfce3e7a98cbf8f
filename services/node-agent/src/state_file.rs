//! The agent's memory across its own deaths: `<state dir>/<node>.json` lists the job attempts
//! whose processes this agent started and has not yet seen through to a stored `Exited` report.
//!
//! A SIGKILLed agent leaves its jobs running (each leads its own process group), but their
//! output pipes died with it, and the scheduler will run them again elsewhere. The next agent
//! reads this file before taking work and stops those orphans (`reconcile.rs`), so no
//! attempt keeps running where it is no longer wanted.
//!
//! An attempt is recorded as soon as its process is spawned (before the assignment is
//! acknowledged) and removed once its exit report is stored; the last [`ENDED_KEPT`] removed
//! are kept as ended, so that an assignment delivered again after the agent died (its
//! acknowledgement lost) is not run a second time by the next agent. Every change rewrites the whole
//! file atomically (write a temporary file, swap it into place), so an agent killed mid-write
//! leaves either the old list or the new one, never half of one.
//!
//! Nothing is fsynced: the file guards against the agent's death, not the host's. The page
//! cache outlives a killed agent, and a power cut kills every job with it, so the list is
//! then moot (each attempt carries the boot id, and the scheduler counts a rebooted node's
//! jobs lost anyway). An fsync per job start and end was the agent's largest single cost.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::{Context, anyhow};
use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::running::AttemptKey;
use crate::throttle::{Throttle, Verdict};

/// Bumped when the file's shape changes incompatibly; an agent refuses files it cannot read
/// rather than guessing.
const FORMAT_VERSION: u32 = 1;

/// One attempt whose process this agent started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedAttempt {
    pub job_id: JobId,
    pub attempt: u32,
    /// The job's main process, which leads its process group: also the group id.
    pub pid: u32,
    pub started_at: Timestamp,
    /// The kernel's boot id when the process started: after a reboot the pid means nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// The process's start time (clock ticks since boot, from /proc), so that a pid reused
    /// by an unrelated process is not taken for the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_ticks: Option<u64>,
    /// Its cgroup's name where that is not the attempt's own: a pooled cgroup on v2, which
    /// cannot be renamed (`cgroup/pooled.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
}

impl RecordedAttempt {
    pub fn key(&self) -> AttemptKey {
        AttemptKey {
            job_id: self.job_id.clone(),
            attempt: self.attempt,
        }
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct FileContents {
    version: u32,
    node: String,
    attempts: Vec<RecordedAttempt>,
    /// Attempts whose exit report is stored (or that were reconciled), oldest first; a file
    /// of before has none.
    #[serde(default)]
    ended: Vec<EndedAttempt>,
}

/// An attempt this node ran to its end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct EndedAttempt {
    job_id: JobId,
    attempt: u32,
}

/// How many ended attempts the file remembers: an unacknowledged assignment comes back to
/// the next agent among the last few a node ran, and the file stays a few KiB.
pub const ENDED_KEPT: usize = 256;

/// The state file of one node, shared by every job of the agent.
#[derive(Clone)]
pub struct StateFile {
    inner: Arc<Mutex<Inner>>,
}

struct Inner {
    /// Held while the agent runs: a second agent for the same node with the same state
    /// directory refuses to start instead of sharing (and clobbering) the file.
    _lock: nix::fcntl::Flock<std::fs::File>,
    path: PathBuf,
    node: String,
    attempts: BTreeMap<(JobId, u32), RecordedAttempt>,
    /// The last [`ENDED_KEPT`] attempts removed, oldest first.
    ended: std::collections::VecDeque<EndedAttempt>,
    write_failures: Throttle,
}

/// Takes `<node>.lock` in `dir` (an advisory lock the kernel drops when the process dies, so a
/// crashed agent never blocks its successor); an error naming the other agent's lock when it
/// is held.
fn lock_for(dir: &Path, node: &str) -> anyhow::Result<nix::fcntl::Flock<std::fs::File>> {
    use nix::fcntl::{Flock, FlockArg};
    let path = dir.join(format!("{node}.lock"));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open the lock file {}", path.display()))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(lock),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(anyhow::anyhow!(
            "another mgpu-node for node `{node}` is running on this host (it holds {}): stop \
             it first, or give this agent a name of its own (--node)",
            path.display()
        )),
        Err((_, err)) => Err(anyhow::anyhow!("cannot lock {}: {err}", path.display())),
    }
}

impl StateFile {
    /// Opens (creating the directory if needed) the state file of `node` in `dir`, and returns
    /// it with the attempts a previous agent left in it. Fails when the directory cannot be
    /// written: an agent that could not remember its jobs would leave orphans after a crash.
    pub fn open(dir: &Path, node: &str) -> anyhow::Result<(StateFile, Vec<RecordedAttempt>)> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the state directory {}", dir.display()))?;
        let lock = lock_for(dir, node)?;
        let path = dir.join(format!("{node}.json"));
        let FileContents {
            attempts: left,
            ended,
            ..
        } = read(&path, node)?;
        let state = StateFile {
            inner: Arc::new(Mutex::new(Inner {
                _lock: lock,
                path,
                node: node.to_owned(),
                attempts: left
                    .iter()
                    .map(|a| ((a.job_id.clone(), a.attempt), a.clone()))
                    .collect(),
                ended: ended.into(),
                write_failures: Throttle::new(std::time::Duration::from_secs(60)),
            })),
        };
        // Written once now, so an unwritable directory is found at start, not after a crash.
        state.lock().write()?;
        Ok((state, left))
    }

    pub fn path(&self) -> PathBuf {
        self.lock().path.clone()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every critical section leaves the map consistent; a panic elsewhere changes nothing.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Remembers a spawned attempt (on a blocking thread: it writes a file).
    pub async fn record(&self, attempt: RecordedAttempt) {
        self.change(move |inner| {
            let key = (attempt.job_id.clone(), attempt.attempt);
            inner.attempts.insert(key, attempt);
        })
        .await;
    }

    /// Forgets an attempt whose exit report is stored (or that was reconciled), keeping it
    /// among the ended ones.
    pub async fn remove(&self, key: &AttemptKey) {
        let id = (key.job_id.clone(), key.attempt);
        self.change(move |inner| {
            inner.attempts.remove(&id);
            let (job_id, attempt) = id;
            inner.ended.push_back(EndedAttempt { job_id, attempt });
            while inner.ended.len() > ENDED_KEPT {
                inner.ended.pop_front();
            }
        })
        .await;
    }

    /// The attempts this node ran to their end, as the file remembers them (the last
    /// [`ENDED_KEPT`]), oldest first.
    pub fn ended(&self) -> Vec<AttemptKey> {
        self.lock()
            .ended
            .iter()
            .map(|e| AttemptKey {
                job_id: e.job_id.clone(),
                attempt: e.attempt,
            })
            .collect()
    }

    /// Applies `edit` and rewrites the file. The lock is held across the write, so concurrent
    /// changes reach the disk in the order they were made and the file always holds the latest
    /// list. A failed write is logged (sparingly) and the agent carries on: the job runs either
    /// way, only a crash would then leave it unknown to the next agent.
    async fn change(&self, edit: impl FnOnce(&mut Inner) + Send + 'static) {
        let state = self.clone();
        let task = tokio::task::spawn_blocking(move || {
            let mut inner = state.lock();
            edit(&mut inner);
            match inner.write() {
                Ok(()) => {
                    if inner.write_failures.success() {
                        info!("the state file is written again");
                    }
                }
                Err(err) => {
                    let text = format!("{err:#}");
                    if let Verdict::Log { suppressed } = inner.write_failures.failure(&text) {
                        warn!(suppressed, "cannot update the state file: {text}");
                    }
                }
            }
        });
        if let Err(err) = task.await {
            warn!("updating the state file failed: {err}");
        }
    }
}

impl Inner {
    fn write(&self) -> anyhow::Result<()> {
        let contents = FileContents {
            version: FORMAT_VERSION,
            node: self.node.clone(),
            attempts: self.attempts.values().cloned().collect(),
            ended: self.ended.iter().cloned().collect(),
        };
        let json = serde_json::to_vec_pretty(&contents).context("encoding the state file")?;
        write_atomically(&self.path, &json)
    }
}

/// What the file records; nothing when it does not exist. A file that cannot be read as a
/// state file is moved aside (and the agent starts afresh) rather than blocking the node.
fn read(path: &Path, node: &str) -> anyhow::Result<FileContents> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Ok(FileContents::default());
        }
        Err(err) => {
            return Err(anyhow!(
                "cannot read the state file {}: {err}",
                path.display()
            ));
        }
    };
    let problem = match serde_json::from_slice::<FileContents>(&bytes) {
        Ok(contents) if contents.version != FORMAT_VERSION => format!(
            "it has format version {}, this agent reads {FORMAT_VERSION}",
            contents.version
        ),
        Ok(contents) if contents.node != node => {
            format!("it belongs to node {}, not {node}", contents.node)
        }
        Ok(contents) => return Ok(contents),
        Err(err) => format!("it is not a state file: {err}"),
    };
    let aside = path.with_extension("json.unreadable");
    std::fs::rename(path, &aside)
        .with_context(|| format!("cannot move {} aside ({problem})", path.display()))?;
    warn!(
        file = %path.display(),
        moved_to = %aside.display(),
        "ignoring the state file: {problem}; jobs a previous agent left running are not stopped"
    );
    Ok(FileContents::default())
}

/// Writes `path` so that readers see the old contents or the new, never a part: a temporary
/// file in the same directory, swapped with it. Not synced to disk (see the module doc).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = PathBuf::from(temporary);
    let written = (|| {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(bytes)?;
        replace(&temporary, path)
    })();
    if let Err(err) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(anyhow!("cannot write {}: {err}", path.display()));
    }
    Ok(())
}

/// Puts `new` in the place of `path` atomically. ext4 writes a file's data to disk at once when
/// a rename replaces another file (`auto_da_alloc`, which spares programs that never fsync an
/// empty file after a power cut): one disk write per job start and end here, which this file
/// does not need. Exchanging the two names (`RENAME_EXCHANGE`) is as atomic and does not do
/// that; the old contents, now under `new`, are then removed. A plain rename where there is no
/// file to exchange with yet, or the file system cannot exchange names.
fn replace(new: &Path, path: &Path) -> std::io::Result<()> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
        match renameat2(AT_FDCWD, new, AT_FDCWD, path, RenameFlags::RENAME_EXCHANGE) {
            Ok(()) => {
                // A copy left behind is harmless: the next write replaces it.
                let _ = std::fs::remove_file(new);
                return Ok(());
            }
            Err(
                nix::errno::Errno::ENOENT | nix::errno::Errno::EINVAL | nix::errno::Errno::ENOSYS,
            ) => {}
            Err(err) => return Err(err.into()),
        }
    }
    std::fs::rename(new, path)
}

/// This boot's id (Linux); None where the kernel does not say.
pub fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|id| id.trim().to_owned())
        .filter(|id| !id.is_empty())
}

/// When process `pid` started, in clock ticks since boot (field 22 of /proc/PID/stat); None
/// when it does not exist or /proc cannot say.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_ticks(&stat)
}

/// The command name (field 2) is in parentheses and may itself hold spaces and parentheses,
/// so fields are counted from the last `)`: the state is field 3, the start time field 22.
fn parse_start_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(n: u32) -> RecordedAttempt {
        RecordedAttempt {
            job_id: JobId::random(),
            attempt: n,
            pid: 4000 + n,
            started_at: mgpu_protocol::now(),
            boot_id: Some("boot".into()),
            start_ticks: Some(77),
            cgroup: None,
        }
    }

    #[tokio::test]
    async fn attempts_survive_the_agent_and_leave_when_removed() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let state_dir = dir.path().join("nested/state");
        let (state, left) = StateFile::open(&state_dir, "node001")
            .unwrap_or_else(|e| panic!("opening a fresh state file: {e:#}"));
        assert!(left.is_empty());
        assert_eq!(state.path(), state_dir.join("node001.json"));
        assert!(state.path().exists(), "written at open");

        let (first, second) = (attempt(1), attempt(2));
        state.record(first.clone()).await;
        state.record(second.clone()).await;
        drop(state);
        // A new agent finds both.
        let (state, mut left) =
            StateFile::open(&state_dir, "node001").unwrap_or_else(|e| panic!("reopening: {e:#}"));
        left.sort_by_key(|a| a.attempt);
        assert_eq!(left, vec![first.clone(), second.clone()]);

        state.remove(&first.key()).await;
        drop(state);
        let (_, left) = StateFile::open(&state_dir, "node001").unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(left, vec![second]);
        // No temporary file is left behind by the atomic writes (the lock file stays).
        let mut names: Vec<String> = std::fs::read_dir(&state_dir)
            .unwrap_or_else(|e| panic!("{e}"))
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            vec!["node001.json".to_owned(), "node001.lock".to_owned()]
        );
    }

    #[tokio::test]
    async fn the_last_ended_attempts_are_remembered_by_the_next_agent() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (state, _) = StateFile::open(dir.path(), "node001").unwrap_or_else(|e| panic!("{e:#}"));
        let ran: Vec<RecordedAttempt> = (0..ENDED_KEPT as u32 + 3).map(attempt).collect();
        for one in &ran {
            state.record(one.clone()).await;
            state.remove(&one.key()).await;
        }
        drop(state);
        let (state, left) =
            StateFile::open(dir.path(), "node001").unwrap_or_else(|e| panic!("{e:#}"));
        assert!(left.is_empty());
        let ended = state.ended();
        // The oldest three are forgotten; the rest, in order, are known to the next agent.
        let expected: Vec<AttemptKey> = ran[3..].iter().map(RecordedAttempt::key).collect();
        assert_eq!(ended, expected);
    }

    #[test]
    fn a_file_of_before_without_ended_attempts_still_reads() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let old = r#"{"version": 1, "node": "node001", "attempts": []}"#;
        std::fs::write(dir.path().join("node001.json"), old).unwrap_or_else(|e| panic!("{e}"));
        let (state, left) =
            StateFile::open(dir.path(), "node001").unwrap_or_else(|e| panic!("{e:#}"));
        assert!(left.is_empty() && state.ended().is_empty());
    }

    #[test]
    fn each_node_has_its_own_file_and_a_foreign_or_broken_one_is_set_aside() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("node002.json");
        std::fs::write(&path, b"{ half a file").unwrap_or_else(|e| panic!("{e}"));
        let (_, left) = StateFile::open(dir.path(), "node002").unwrap_or_else(|e| panic!("{e:#}"));
        assert!(left.is_empty());
        assert!(dir.path().join("node002.json.unreadable").exists());

        // A file naming another node (copied by hand, say) is not trusted with its pids.
        let foreign = FileContents {
            version: FORMAT_VERSION,
            node: "node009".into(),
            attempts: vec![attempt(1)],
            ended: Vec::new(),
        };
        let json = serde_json::to_vec(&foreign).unwrap_or_default();
        std::fs::write(&path, json).unwrap_or_else(|e| panic!("{e}"));
        let (_, left) = StateFile::open(dir.path(), "node002").unwrap_or_else(|e| panic!("{e:#}"));
        assert!(left.is_empty());
    }

    #[test]
    fn an_unwritable_directory_is_refused_at_open() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let not_a_dir = dir.path().join("file");
        std::fs::write(&not_a_dir, b"x").unwrap_or_else(|e| panic!("{e}"));
        let err = StateFile::open(&not_a_dir, "n1")
            .err()
            .map(|e| format!("{e:#}"));
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("state directory")),
            "{err:?}"
        );
    }

    #[test]
    fn a_second_agent_for_the_same_node_is_refused_until_the_first_is_gone() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let first = StateFile::open(dir.path(), "node001").unwrap_or_else(|e| panic!("{e:#}"));
        let second = StateFile::open(dir.path(), "node001")
            .err()
            .map(|e| format!("{e:#}"));
        assert!(
            second
                .as_deref()
                .is_some_and(|e| e.contains("another mgpu-node for node `node001`")),
            "{second:?}"
        );
        // Another node's file is its own.
        assert!(StateFile::open(dir.path(), "node002").is_ok());
        drop(first);
        assert!(StateFile::open(dir.path(), "node001").is_ok());
    }

    #[test]
    fn start_ticks_are_read_past_odd_command_names() {
        let stat =
            "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_ticks(stat), Some(987_654));
        assert_eq!(parse_start_ticks("garbage"), None);
        // This very process has a start time and a boot id on Linux.
        if cfg!(target_os = "linux") {
            assert!(start_ticks(std::process::id()).is_some());
            assert!(boot_id().is_some());
        }
        assert_eq!(start_ticks(u32::MAX), None);
    }
}
