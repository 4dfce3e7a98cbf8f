//! Whose account a job runs under. An agent running as root runs each job as the Unix account
//! mapped to the user who submitted it (`mgpu admin add-user NAME --unix-user ACCOUNT`, else
//! the account named like the user): its uid, gid and supplementary groups, with `HOME`,
//! `USER` and `LOGNAME` set to match. It refuses to run a job as root unless started with
//! `--allow-root-jobs`. An agent not running as root (or started with `--jobs-as-agent-user`)
//! runs every job as itself, and its heartbeat says so.

use std::collections::BTreeMap;
use std::ffi::CString;

use nix::unistd::{Gid, Uid, User};

/// The agent's policy, from its flags and the account it runs under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunAsPolicy {
    /// Run each job as its owner's account (the agent is root and was not told otherwise).
    pub as_owner: bool,
    /// A job may run as root.
    pub allow_root: bool,
}

impl RunAsPolicy {
    pub fn new(jobs_as_agent_user: bool, allow_root: bool) -> Self {
        RunAsPolicy {
            as_owner: Uid::effective().is_root() && !jobs_as_agent_user,
            allow_root,
        }
    }

    /// What heartbeats say about it (`mgpu nodes`).
    pub fn describe(&self) -> String {
        if self.as_owner {
            mgpu_protocol::node::RUNS_AS_OWNER.to_owned()
        } else {
            crate::cli::current_user()
        }
    }
}

/// The account a job runs as, resolved before it starts.
#[derive(Clone, Debug)]
pub struct Account {
    pub name: String,
    pub uid: Uid,
    pub gid: Gid,
    pub groups: Vec<Gid>,
    pub home: String,
}

impl Account {
    /// Variables that must name the account the job runs as, not the submitter's shell.
    pub fn environment(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("HOME".to_owned(), self.home.clone()),
            ("USER".to_owned(), self.name.clone()),
            ("LOGNAME".to_owned(), self.name.clone()),
        ])
    }

    /// The account as `mgpu-job-guard` takes it: `UID:GID:GROUPS`, GROUPS comma-separated.
    pub fn guard_spec(&self) -> String {
        let groups: Vec<String> = self.groups.iter().map(|g| g.as_raw().to_string()).collect();
        format!("{}:{}:{}", self.uid, self.gid, groups.join(","))
    }

    /// Switches the calling process to this account: supplementary groups, group, then user
    /// (the order that works when dropping root). Meant for the child between fork and exec,
    /// so it makes plain system calls only.
    pub fn switch(&self) -> std::io::Result<()> {
        nix::unistd::setgroups(&self.groups).map_err(std::io::Error::from)?;
        nix::unistd::setgid(self.gid).map_err(std::io::Error::from)?;
        nix::unistd::setuid(self.uid).map_err(std::io::Error::from)
    }
}

/// The account the job of `owner` (mapped to `unix_user` by the scheduler) runs as: None to run
/// as the agent itself. The error is the job's `failed_to_start` reason.
pub fn resolve(
    policy: &RunAsPolicy,
    owner: &str,
    unix_user: Option<&str>,
    node: &str,
) -> Result<Option<Account>, String> {
    if !policy.as_owner {
        if Uid::effective().is_root() && !policy.allow_root {
            return Err(format!(
                "the agent on {node} runs as root and was told to run jobs as itself: start it \
                 with --allow-root-jobs to allow that"
            ));
        }
        return Ok(None);
    }
    let name = unix_user.unwrap_or(owner);
    let user = User::from_name(name)
        .map_err(|err| format!("looking up Unix account {name} on {node}: {err}"))?
        .ok_or_else(|| {
            format!(
                "no Unix account {name} on {node} for user {owner} (map it with `mgpu admin \
                 add-user {owner} --unix-user ACCOUNT`)"
            )
        })?;
    if user.uid.is_root() && !policy.allow_root {
        return Err(format!(
            "refusing to run {owner}'s job as root on {node} (the agent allows it with \
             --allow-root-jobs)"
        ));
    }
    let c_name = CString::new(user.name.clone())
        .map_err(|_| format!("Unix account name {name} contains a NUL byte"))?;
    let groups = nix::unistd::getgrouplist(&c_name, user.gid)
        .map_err(|err| format!("reading the groups of {name} on {node}: {err}"))?;
    Ok(Some(Account {
        name: user.name,
        uid: user.uid,
        gid: user.gid,
        groups,
        home: user.dir.display().to_string(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_running_jobs_as_itself_needs_no_account() {
        let policy = RunAsPolicy {
            as_owner: false,
            allow_root: true,
        };
        assert!(matches!(resolve(&policy, "alice", None, "n1"), Ok(None)));
    }

    #[test]
    fn a_missing_account_is_a_clear_refusal() {
        let policy = RunAsPolicy {
            as_owner: true,
            allow_root: false,
        };
        let err = resolve(&policy, "no-such-user-xyz", None, "n1")
            .err()
            .unwrap_or_default();
        assert!(err.contains("no Unix account no-such-user-xyz"), "{err}");
    }

    #[test]
    fn root_is_refused_unless_allowed() {
        let strict = RunAsPolicy {
            as_owner: true,
            allow_root: false,
        };
        let err = resolve(&strict, "alice", Some("root"), "n1")
            .err()
            .unwrap_or_default();
        assert!(err.contains("refusing to run alice's job as root"), "{err}");
        let lenient = RunAsPolicy {
            as_owner: true,
            allow_root: true,
        };
        let root = resolve(&lenient, "alice", Some("root"), "n1");
        assert!(
            matches!(root, Ok(Some(ref a)) if a.uid.is_root()),
            "{root:?}"
        );
    }
}
