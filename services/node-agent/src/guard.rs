//! How the agent starts every job under a guard, the job's first process, so a job never
//! outlives its agent: which guard program ([`GuardProgram`]) and the command line it gets
//! ([`guard_args`]). The guard process itself is `builtin_guard.rs` (this binary in guard
//! mode) or `mgpu-job-guard` (`services/job-guard`); both drive the same rules
//! (`mgpu-guard-rules`), and read this command line with its parser.
//!
//! The agent starts each job as
//! `mgpu-job-guard AGENT_PID GRACE_MS FENCE_MS CONTACT_FILE ACCOUNT CGROUP PROGRAM [ARGS...]`
//! (a small static binary installed beside the agent), or where that is missing (or
//! `--job-guard builtin`) as `mgpu-node __mgpu-job-guard AGENT_PID ...`. PROGRAM is the shell
//! with `-c SCRIPT`, or a simple command itself (see `launch.rs`). ACCOUNT is `UID:GID:GROUPS`
//! for `mgpu-job-guard` to switch to once it has opened CONTACT_FILE, or `-`: the built-in
//! guard never switches (started as root, a dynamically linked program would load libraries
//! under the job's `LD_LIBRARY_PATH`), so for it the agent switches the child before the
//! exec, and passes CONTACT_FILE as an inherited descriptor, `/proc/self/fd/N`
//! ([`inheritable_contact`]). The agent touches CONTACT_FILE whenever JetStream stored a
//! heartbeat; a guard stops its job when that is older than FENCE_MS (0: never). CGROUP is
//! the `cgroup.procs` of the job's cgroup (`cgroup.rs`) for the guard to move into before it
//! starts the job, or `-`: none, or the agent moved the child itself before switching its
//! account.

use std::os::fd::{IntoRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use nix::fcntl::{FcntlArg, FdFlag};

/// argv[1] that turns `mgpu-node` into a job guard.
pub const GUARD_ARG: &str = "__mgpu-job-guard";

/// How a guard fences its job: stop it once `contact_file` is older than `after`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardFence {
    pub after: Duration,
    pub contact_file: PathBuf,
}

impl GuardFence {
    /// Whether the guards fence now: the contact file is `after` old or older (read as the
    /// guard reads it). A job that ends then was stopped by its guard, or would have been, and
    /// the scheduler may already count it lost with its node: it is reported `lost`, as one
    /// the agent's own fence stopped, whichever of the two fences came first.
    pub fn lapsed(&self) -> bool {
        let age = std::fs::metadata(&self.contact_file)
            .and_then(|meta| meta.modified())
            .ok()
            .map(|stored| SystemTime::now().duration_since(stored).unwrap_or_default());
        contact_lapsed(age, self.after)
    }
}

/// [`GuardFence::lapsed`]'s rule: a contact `age` (None: unreadable, then not counted as
/// fenced: the exit is reported as it was seen) of `after` or more.
fn contact_lapsed(age: Option<Duration>, after: Duration) -> bool {
    age.is_some_and(|age| age >= after)
}

/// Opens `contact` for reading as a descriptor that every guard inherits (no close-on-exec),
/// held for the agent's whole life: the built-in guard runs as the job's account, which
/// usually cannot enter a root agent's state directory, but reads the file through
/// `/proc/self/fd/N` whatever the directory's permissions. The guard keeps it from the job.
pub fn inheritable_contact(contact: &Path) -> std::io::Result<PathBuf> {
    let fd = OwnedFd::from(std::fs::File::open(contact)?);
    nix::fcntl::fcntl(&fd, FcntlArg::F_SETFD(FdFlag::empty()))?;
    // Never closed: it serves every job this agent starts.
    Ok(PathBuf::from(format!("/proc/self/fd/{}", fd.into_raw_fd())))
}

/// The name of the standalone guard, looked for beside the agent's binary.
pub const SLIM_GUARD_NAME: &str = "mgpu-job-guard";

/// The program every job starts under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GuardProgram {
    /// `mgpu-job-guard`: no C library, so it starts in microseconds.
    Slim(PathBuf),
    /// This agent's own binary in guard mode.
    Builtin(PathBuf),
}

impl GuardProgram {
    /// The guard `--job-guard` names: `builtin`, a path, or (None) `mgpu-job-guard` beside
    /// `agent_exe` when it is there, else the built-in one.
    pub fn choose(setting: Option<&str>, agent_exe: &Path) -> Result<Self, String> {
        match setting {
            Some("builtin") => Ok(GuardProgram::Builtin(agent_exe.to_owned())),
            Some(path) => {
                // Absolute: the guard is started in the job's directory.
                match std::fs::canonicalize(path) {
                    Ok(path) if path.is_file() => Ok(GuardProgram::Slim(path)),
                    _ => Err(format!(
                        "--job-guard {path}: no such file (give the path of {SLIM_GUARD_NAME}, \
                         or `builtin`)"
                    )),
                }
            }
            None => {
                let beside = agent_exe.with_file_name(SLIM_GUARD_NAME);
                Ok(if beside.is_file() {
                    GuardProgram::Slim(beside)
                } else {
                    GuardProgram::Builtin(agent_exe.to_owned())
                })
            }
        }
    }

    /// Whether the guard switches to the job's account itself ([`guard_args`]' ACCOUNT).
    pub fn switches_accounts(&self) -> bool {
        matches!(self, GuardProgram::Slim(_))
    }

    /// The binary to run and the arguments that come before [`guard_args`].
    pub fn program(&self) -> (&Path, &'static [&'static str]) {
        match self {
            GuardProgram::Slim(path) => (path, &[]),
            GuardProgram::Builtin(path) => (path, &[GUARD_ARG]),
        }
    }

    /// For the agent's log.
    pub fn describe(&self) -> String {
        match self {
            GuardProgram::Slim(path) => path.display().to_string(),
            GuardProgram::Builtin(path) => format!("{} {GUARD_ARG} (built in)", path.display()),
        }
    }
}

/// The arguments (after [`GuardProgram::program`]'s) that make the guard run `program` for
/// the agent with pid `agent`, as `account` (`UID:GID:GROUPS`; None: as the guard was
/// started), inside the cgroup whose `cgroup.procs` is `cgroup_procs` (None: none, or joined
/// already); the program's own arguments follow.
pub fn guard_args(
    agent: u32,
    grace: Duration,
    fence: Option<&GuardFence>,
    account: Option<String>,
    cgroup_procs: Option<&str>,
    program: &str,
) -> Vec<String> {
    let (fence_ms, contact) = match fence {
        Some(f) => (
            f.after.as_millis().max(1).to_string(),
            f.contact_file.display().to_string(),
        ),
        None => ("0".to_owned(), "-".to_owned()),
    };
    vec![
        agent.to_string(),
        grace.as_millis().to_string(),
        fence_ms,
        contact,
        account.unwrap_or_else(|| "-".to_owned()),
        cgroup_procs.unwrap_or("-").to_owned(),
        program.to_owned(),
    ]
}

#[cfg(test)]
mod tests {
    use mgpu_guard_rules::Arguments;
    use mgpu_guard_rules::args::PROGRAM_AT;

    use super::*;

    #[test]
    fn the_slim_guard_is_used_where_it_is_beside_the_agent() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let agent = dir.path().join("mgpu-node");
        let builtin = GuardProgram::Builtin(agent.clone());
        assert_eq!(GuardProgram::choose(None, &agent), Ok(builtin.clone()));
        let slim = dir.path().join(SLIM_GUARD_NAME);
        std::fs::write(&slim, b"").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            GuardProgram::choose(None, &agent),
            Ok(GuardProgram::Slim(slim.clone()))
        );
        assert_eq!(GuardProgram::choose(Some("builtin"), &agent), Ok(builtin));
        let elsewhere = slim.display().to_string();
        let absolute = std::fs::canonicalize(&slim).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            GuardProgram::choose(Some(&elsewhere), Path::new("/nowhere/mgpu-node")),
            Ok(GuardProgram::Slim(absolute.clone()))
        );
        // A relative path is made absolute: the guard starts in the job's directory.
        let here = std::env::current_dir().unwrap_or_else(|e| panic!("{e}"));
        let relative = pathdiff(&absolute, &here);
        assert_eq!(
            GuardProgram::choose(Some(&relative), &agent),
            Ok(GuardProgram::Slim(absolute))
        );
        let missing = GuardProgram::choose(Some("/no/such/guard"), &agent);
        assert!(missing.is_err_and(|e| e.contains("no such file")));
    }

    /// `path` relative to `base`, through `..` (both absolute).
    fn pathdiff(path: &Path, base: &Path) -> String {
        let ups = base.components().count().saturating_sub(1);
        let mut relative = "../".repeat(ups);
        relative.push_str(&path.display().to_string()[1..]);
        relative
    }

    #[test]
    fn a_contact_as_old_as_the_fence_has_lapsed() {
        let after = Duration::from_secs(3);
        assert!(!contact_lapsed(Some(Duration::from_millis(2_999)), after));
        assert!(contact_lapsed(Some(after), after));
        assert!(!contact_lapsed(None, after));
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let contact_file = dir.path().join("contact");
        let file = std::fs::File::create(&contact_file).unwrap_or_else(|e| panic!("{e}"));
        let fence = GuardFence {
            after,
            contact_file,
        };
        assert!(!fence.lapsed());
        file.set_modified(SystemTime::now() - Duration::from_secs(4))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(fence.lapsed());
    }

    #[test]
    fn guard_arguments_round_trip() {
        let args = guard_args(
            42,
            Duration::from_millis(1500),
            None,
            None,
            None,
            "/bin/bash",
        );
        assert_eq!(args, vec!["42", "1500", "0", "-", "-", "-", "/bin/bash"]);
        let fence = GuardFence {
            after: Duration::from_millis(700),
            contact_file: "/state/n1.contact".into(),
        };
        let args = guard_args(
            42,
            Duration::from_millis(1500),
            Some(&fence),
            Some("1000:1000:1000,27".into()),
            Some("/sys/fs/cgroup/mgpu/job-1-1/cgroup.procs"),
            "/bin/sh",
        );
        assert_eq!(
            args,
            vec![
                "42",
                "1500",
                "700",
                "/state/n1.contact",
                "1000:1000:1000,27",
                "/sys/fs/cgroup/mgpu/job-1-1/cgroup.procs",
                "/bin/sh"
            ]
        );
    }

    /// Both guards read the command line with the rules' parser: what the agent writes must
    /// read back as it meant it.
    #[test]
    fn what_the_agent_passes_is_what_the_guards_read() {
        let fence = GuardFence {
            after: Duration::from_millis(700),
            contact_file: "/proc/self/fd/9".into(),
        };
        let read = |args: &[String]| {
            let bytes: Vec<&[u8]> = args.iter().map(|arg| arg.as_bytes()).collect();
            let parsed = Arguments::parse(&bytes).unwrap_or_else(|e| panic!("{e:?}"));
            (
                parsed.agent,
                parsed.grace,
                parsed.fence.map(|f| (f.after, f.contact.to_vec())),
                parsed.account.map(<[u8]>::to_vec),
                parsed.cgroup.members().map(<[u8]>::to_vec),
                parsed.cgroup.to_join().count(),
            )
        };
        let args = guard_args(
            7,
            Duration::from_millis(1500),
            Some(&fence),
            Some("1000:1000:".into()),
            Some("/cg/a/cgroup.procs:/cg/b/cgroup.procs"),
            "python",
        );
        assert_eq!(
            read(&args),
            (
                7,
                Duration::from_millis(1500),
                Some((Duration::from_millis(700), b"/proc/self/fd/9".to_vec())),
                Some(b"1000:1000:".to_vec()),
                Some(b"/cg/a/cgroup.procs".to_vec()),
                2,
            )
        );
        assert_eq!(args.get(PROGRAM_AT).map(String::as_str), Some("python"));
        // Joined by the agent already, no fence, no account; and a fence under a millisecond
        // is not "never".
        let short = GuardFence {
            after: Duration::from_micros(10),
            contact_file: "/c".into(),
        };
        let args = guard_args(7, Duration::ZERO, Some(&short), None, Some("@/cg/j"), "x");
        let (_, _, fence, account, members, joins) = read(&args);
        assert_eq!(fence.map(|f| f.0), Some(Duration::from_millis(1)));
        assert_eq!(
            (account, members, joins),
            (None, Some(b"/cg/j".to_vec()), 0)
        );
        let args = guard_args(7, Duration::ZERO, None, None, None, "x");
        assert_eq!(read(&args).2, None);
    }
}
