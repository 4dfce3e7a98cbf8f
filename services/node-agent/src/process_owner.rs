//! Who runs a GPU process mgpu did not start: the Unix account of a pid, for the heartbeat's
//! foreign processes (`mgpu nodes` names them). It owns reading a process's real uid from
//! `/proc/<pid>/status`, resolving it to an account name through the passwd database, and a
//! small cache of those names, keyed by pid and start time, so each heartbeat does not query
//! passwd (which may be LDAP or sssd behind NSS) for every process again.
//!
//! What the agent cannot see it does not name: a process gone between NVML's list and the
//! read, or one in another PID namespace (the pid NVML gives is not the agent's), has no owner.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use mgpu_protocol::node::GpuStatus;
use nix::unistd::{Uid, User};

/// Processes remembered at most. Foreign GPU processes on a node are few; past this, entries
/// of processes that have exited are dropped first, then everything (one passwd lookup per
/// process again, never an unbounded map).
const CACHE_CAPACITY: usize = 512;

/// Names already resolved, for the whole agent (the heartbeat is the only caller).
static CACHE: Mutex<OwnerCache> = Mutex::new(OwnerCache::new(CACHE_CAPACITY));

/// Fills in the owner of each foreign process of a GPU sample, where the probe left none.
pub fn name_foreign_owners(gpus: &mut [GpuStatus]) {
    for process in gpus.iter_mut().flat_map(|gpu| &mut gpu.foreign_processes) {
        if process.user.is_none() {
            process.user = owner_of(process.pid);
        }
    }
}

/// The account name process `pid` runs as (its real uid: who started it, even through a
/// setuid program); the uid as text when passwd has no name for it. None when the process is
/// gone or its `/proc` entry cannot be read.
pub fn owner_of(pid: u32) -> Option<String> {
    let start = crate::state_file::start_ticks(pid)?;
    let uid = real_uid(pid)?;
    // The pid may have been reused between the two reads: the start time tells.
    if crate::state_file::start_ticks(pid)? != start {
        return None;
    }
    let key = ProcessKey { pid, start };
    if let Some(name) = lock().get(key, uid) {
        return Some(name);
    }
    // Looked up without the lock held: NSS may be slow.
    let resolved = account_name(uid);
    if resolved.lasting {
        lock().insert(key, uid, resolved.name.clone());
    }
    Some(resolved.name)
}

fn lock() -> std::sync::MutexGuard<'static, OwnerCache> {
    // The cache holds no invariant a panic could break halfway.
    CACHE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The real uid of a live process, from its `/proc/<pid>/status`.
fn real_uid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_real_uid(&status)
}

/// The real uid in a `/proc/<pid>/status` text: the first of the four ids on its `Uid:` line
/// (real, effective, saved, filesystem).
fn parse_real_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A name for a uid, and whether it may be cached.
struct Resolved {
    name: String,
    /// False when passwd could not be asked (an NSS failure may be passing): the numeric
    /// fallback is then used this once, and the next heartbeat asks again.
    lasting: bool,
}

fn account_name(uid: u32) -> Resolved {
    match User::from_uid(Uid::from_raw(uid)) {
        Ok(found) => Resolved {
            name: name_or_uid(found.map(|user| user.name), uid),
            lasting: true,
        },
        Err(_) => Resolved {
            name: uid.to_string(),
            lasting: false,
        },
    }
}

/// The account's name, or the uid as text for an account passwd does not know (a container's
/// user, a deleted account).
fn name_or_uid(name: Option<String>, uid: u32) -> String {
    name.unwrap_or_else(|| uid.to_string())
}

/// One process: its pid and start time (clock ticks since boot), so a reused pid is a new key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct ProcessKey {
    pid: u32,
    start: u64,
}

/// Resolved names by process, bounded in number.
struct OwnerCache {
    entries: BTreeMap<ProcessKey, (u32, String)>,
    capacity: usize,
}

impl OwnerCache {
    const fn new(capacity: usize) -> Self {
        OwnerCache {
            entries: BTreeMap::new(),
            capacity,
        }
    }

    /// The cached name of this process, if it was resolved for the uid it has now. The uid is
    /// read at every heartbeat (a cheap /proc read): a launcher may drop root after it was
    /// first seen, and the name must follow it.
    fn get(&self, key: ProcessKey, uid: u32) -> Option<String> {
        self.entries
            .get(&key)
            .filter(|(cached_uid, _)| *cached_uid == uid)
            .map(|(_, name)| name.clone())
    }

    fn insert(&mut self, key: ProcessKey, uid: u32, name: String) {
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&key) {
            self.entries
                .retain(|k, _| crate::state_file::start_ticks(k.pid) == Some(k.start));
            if self.entries.len() >= self.capacity {
                self.entries.clear();
            }
        }
        self.entries.insert(key, (uid, name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::GpuProbe;
    use mgpu_protocol::node::ForeignProcess;
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    const STATUS: &str = "Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t4242\n\
                          Pid:\t4242\nPPid:\t1\nUid:\t1001\t0\t0\t0\nGid:\t1001\t1001\t1001\t1001\n";

    #[test]
    fn the_real_uid_is_the_first_of_the_uid_line() {
        assert_eq!(parse_real_uid(STATUS), Some(1001));
        assert_eq!(parse_real_uid("Uid:\t0\t0\t0\t0\n"), Some(0));
        assert_eq!(parse_real_uid("Name:\tx\nGid:\t5\t5\t5\t5\n"), None);
        assert_eq!(parse_real_uid("Uid:\t\n"), None);
        assert_eq!(parse_real_uid("Uid:\tbob\t0\t0\t0\n"), None);
        assert_eq!(parse_real_uid(""), None);
    }

    #[test]
    fn an_unknown_uid_is_named_by_its_number() {
        assert_eq!(name_or_uid(Some("bob".into()), 1001), "bob");
        assert_eq!(name_or_uid(None, 4_000_000), "4000000");
    }

    #[test]
    fn the_cache_follows_the_uid_and_a_reused_pid() {
        let mut cache = OwnerCache::new(8);
        let first = ProcessKey { pid: 7, start: 100 };
        cache.insert(first, 0, "root".into());
        assert_eq!(cache.get(first, 0).as_deref(), Some("root"));
        // It dropped root since: not the cached name.
        assert_eq!(cache.get(first, 1001), None);
        // The same pid, started later: another process.
        assert_eq!(cache.get(ProcessKey { pid: 7, start: 900 }, 0), None);
    }

    fn live(pid: u32) -> ProcessKey {
        ProcessKey {
            pid,
            start: crate::state_file::start_ticks(pid).unwrap_or_default(),
        }
    }

    /// Pids far above any real pid_max: never alive.
    fn exited(n: u32) -> ProcessKey {
        ProcessKey {
            pid: u32::MAX - n,
            start: 1,
        }
    }

    #[test]
    fn a_full_cache_drops_exited_processes_first_then_everything() {
        let mut cache = OwnerCache::new(4);
        let me = live(std::process::id());
        cache.insert(me, 0, "root".into());
        for n in 0..3 {
            cache.insert(exited(n), 0, "root".into());
        }
        cache.insert(exited(3), 0, "root".into());
        assert_eq!(cache.entries.len(), 2);
        assert!(cache.get(me, 0).is_some());
        assert!(cache.get(exited(3), 0).is_some());

        // Full of live processes: emptied, so it never grows past its bound.
        let mut cache = OwnerCache::new(2);
        cache.insert(me, 0, "root".into());
        cache.insert(live(std::os::unix::process::parent_id()), 0, "root".into());
        cache.insert(live(1), 0, "root".into());
        assert_eq!(cache.entries.len(), 1);
        assert!(cache.get(live(1), 0).is_some());
    }

    /// Kills and reaps the child however the test ends.
    struct Reaped(Child);

    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn spawn(program: &str, args: &[&str]) -> Option<Reaped> {
        Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()
            .map(Reaped)
    }

    /// The `sleep` a child runs: the child itself once it exec'd it (`setpriv` switches
    /// accounts, then execs), or a child of it (`runuser` forks for its PAM session). None if
    /// the child exited or no `sleep` shows up within 5 s.
    fn sleep_of(child: &mut Reaped) -> Option<u32> {
        let pid = child.0.id();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if !matches!(child.0.try_wait(), Ok(None)) {
                return None;
            }
            if is_sleep(pid) {
                return Some(pid);
            }
            if let Some(grandchild) = sleeping_child_of(pid) {
                return Some(grandchild);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    fn is_sleep(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|comm| comm.trim() == "sleep")
    }

    fn sleeping_child_of(parent: u32) -> Option<u32> {
        std::fs::read_dir("/proc")
            .ok()?
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .find(|&pid| {
                let status =
                    std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
                let ppid = status
                    .lines()
                    .find_map(|line| line.strip_prefix("PPid:"))
                    .and_then(|v| v.trim().parse::<u32>().ok());
                ppid == Some(parent) && is_sleep(pid)
            })
    }

    #[test]
    fn a_real_process_is_owned_by_whoever_started_it() {
        let Some(mut child) = spawn("sleep", &["30"]) else {
            panic!("cannot start sleep");
        };
        let pid = sleep_of(&mut child).unwrap_or_else(|| child.0.id());
        let me = crate::cli::current_user();
        assert_eq!(owner_of(pid), Some(me.clone()));
        // A second look comes from the cache, and agrees.
        assert_eq!(owner_of(pid), Some(me.clone()));
        let Ok(spec) = crate::gpu_spec::parse_gpu_spec("1x24GiB") else {
            panic!("spec did not parse");
        };
        let mut gpus = crate::gpu::DeclaredProbe::new("node001", &spec, None)
            .sample(&[])
            .unwrap_or_default();
        gpus[0].foreign_processes = vec![ForeignProcess {
            pid,
            used_mib: 512,
            user: None,
        }];
        name_foreign_owners(&mut gpus);
        assert_eq!(gpus[0].foreign_processes[0].user, Some(me));
        drop(child);
        // Gone (and reaped): no owner.
        assert_eq!(owner_of(pid), None);
    }

    #[test]
    fn a_process_started_as_nobody_is_nobodys() {
        if !nix::unistd::geteuid().is_root() {
            println!("not root: cannot start a process as nobody, skipped");
            return;
        }
        let wrappers: [(&str, &[&str]); 2] = [
            (
                "setpriv",
                &[
                    "--reuid=nobody",
                    "--regid=nogroup",
                    "--clear-groups",
                    "sleep",
                    "30",
                ],
            ),
            ("runuser", &["-u", "nobody", "--", "sleep", "30"]),
        ];
        for (program, args) in wrappers {
            // Missing, or unable to switch (no `nogroup` group on some distributions).
            let Some(mut child) = spawn(program, args) else {
                continue;
            };
            let Some(pid) = sleep_of(&mut child) else {
                continue;
            };
            assert_eq!(
                owner_of(pid).as_deref(),
                Some("nobody"),
                "started with {program}"
            );
            return;
        }
        println!("neither setpriv nor runuser could start a process as nobody, skipped");
    }
}
