//! The guard's command line, one format for both guards: the agent writes it
//! (`services/node-agent/src/guard.rs`), `mgpu-job-guard` reads it after its own name and the
//! built-in guard after `mgpu-node __mgpu-job-guard`:
//!
//! `AGENT_PID GRACE_MS FENCE_MS CONTACT_FILE ACCOUNT CGROUP PROGRAM [ARGS...]`
//!
//! - FENCE_MS: 0 never fences, and CONTACT_FILE is then unused (the agent writes `-`).
//! - ACCOUNT: `-` (stay as started) or `UID:GID:GROUPS`, GROUPS a comma-separated list, maybe
//!   empty ([`parse_account`]); only `mgpu-job-guard` switches accounts.
//! - CGROUP: the `cgroup.procs` file of the cgroup the agent made for the job, several joined
//!   by `:` on cgroup v1 where each controller has its own hierarchy; `@` before them: joined
//!   already, by the agent; or `-`: none ([`Cgroup`]).
//!
//! PROGRAM and its arguments are the job's, left where they are for the exec.

use core::time::Duration;

/// The arguments, for a usage message after the guard's name.
pub const USAGE: &str = "AGENT_PID GRACE_MS FENCE_MS CONTACT_FILE ACCOUNT CGROUP PROGRAM [ARGS...]";

/// Where PROGRAM is among the guard's arguments (counted from AGENT_PID).
pub const PROGRAM_AT: usize = 6;
/// Where CONTACT_FILE is among them (a driver that needs it NUL-terminated for the kernel
/// takes it from there, rather than from [`Fence::contact`]).
pub const CONTACT_AT: usize = 3;

/// The guard's arguments before PROGRAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arguments<'a> {
    /// The agent's pid: the guard's parent, which must still be there once the guard asked to
    /// hear of its death.
    pub agent: i32,
    pub grace: Duration,
    /// None: never fence.
    pub fence: Option<Fence<'a>>,
    /// `UID:GID:GROUPS` to switch to; None: `-`.
    pub account: Option<&'a [u8]>,
    pub cgroup: Cgroup<'a>,
}

/// How the guard fences its job: stop it once `contact` is older than `after`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence<'a> {
    pub after: Duration,
    pub contact: &'a [u8],
}

/// The job's cgroup, as CGROUP gives it: a `:`-separated list of `cgroup.procs` files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cgroup<'a> {
    /// `-`: the job has none, and starts inside the guard's.
    None,
    /// The guard moves itself in before it starts the job (the job starts inside, and so
    /// does everything it starts).
    Join(&'a [u8]),
    /// `@LIST`: the agent moved the guard in already (before switching its account).
    Joined(&'a [u8]),
}

impl<'a> Cgroup<'a> {
    fn parse(text: &'a [u8]) -> Self {
        match text {
            b"-" | b"@-" => Cgroup::None,
            [b'@', list @ ..] => Cgroup::Joined(list),
            list => Cgroup::Join(list),
        }
    }

    /// The `cgroup.procs` files the guard writes itself into (none unless [`Cgroup::Join`]).
    pub fn to_join(&self) -> impl Iterator<Item = &'a [u8]> + use<'a> {
        let list = match *self {
            Cgroup::Join(list) => Some(list),
            Cgroup::None | Cgroup::Joined(_) => None,
        };
        list.into_iter()
            .flat_map(|list| list.split(|byte| *byte == b':'))
    }

    /// The `cgroup.procs` file that lists the job's processes, to signal them
    /// ([`crate::Command::SignalCgroup`]): the first of the list (on cgroup v1 every
    /// hierarchy holds the same processes).
    pub fn members(&self) -> Option<&'a [u8]> {
        match *self {
            Cgroup::None => None,
            Cgroup::Join(list) | Cgroup::Joined(list) => list.split(|byte| *byte == b':').next(),
        }
    }
}

/// What is wrong with a command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgumentError {
    /// Fewer arguments than AGENT_PID to PROGRAM.
    Usage,
    AgentPid,
    Grace,
    Fence,
}

impl ArgumentError {
    /// The guard's message (`usage:` wants the guard's name and [`USAGE`] after it).
    pub const fn message(self) -> &'static str {
        match self {
            ArgumentError::Usage => "usage:",
            ArgumentError::AgentPid => "bad agent pid",
            ArgumentError::Grace => "bad grace",
            ArgumentError::Fence => "bad fence",
        }
    }

    /// The position of the bad argument (counted from AGENT_PID), to quote it.
    pub const fn position(self) -> Option<usize> {
        match self {
            ArgumentError::Usage => None,
            ArgumentError::AgentPid => Some(0),
            ArgumentError::Grace => Some(1),
            ArgumentError::Fence => Some(2),
        }
    }
}

impl<'a> Arguments<'a> {
    /// Reads `args`, from AGENT_PID on; PROGRAM must be there, and what follows it is not
    /// looked at.
    pub fn parse(args: &[&'a [u8]]) -> Result<Self, ArgumentError> {
        let [agent, grace, fence, contact, account, cgroup, _program, ..] = *args else {
            return Err(ArgumentError::Usage);
        };
        let agent = number(agent)
            .and_then(|pid| i32::try_from(pid).ok())
            .ok_or(ArgumentError::AgentPid)?;
        let grace = number(grace)
            .map(Duration::from_millis)
            .ok_or(ArgumentError::Grace)?;
        let fence = match number(fence).ok_or(ArgumentError::Fence)? {
            0 => None,
            ms => Some(Fence {
                after: Duration::from_millis(ms),
                contact,
            }),
        };
        Ok(Arguments {
            agent,
            grace,
            fence,
            account: (account != b"-").then_some(account),
            cgroup: Cgroup::parse(cgroup),
        })
    }
}

/// A decimal number of milliseconds or a pid.
pub fn number(text: &[u8]) -> Option<u64> {
    core::str::from_utf8(text).ok()?.parse().ok()
}

/// The ids of ACCOUNT (`UID:GID:GROUPS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccountIds {
    pub uid: u32,
    pub gid: u32,
    /// How many supplementary groups [`parse_account`] wrote.
    pub groups: usize,
}

/// `UID:GID:G1,G2,...` into its ids, the supplementary groups written to the start of
/// `groups`; None when it is not that, or lists more groups than `groups` holds.
pub fn parse_account(text: &[u8], groups: &mut [u32]) -> Option<AccountIds> {
    let text = core::str::from_utf8(text).ok()?;
    let mut parts = text.splitn(3, ':');
    let uid = parts.next()?.parse().ok()?;
    let gid = parts.next()?.parse().ok()?;
    let mut count = 0;
    for group in parts.next()?.split(',').filter(|g| !g.is_empty()) {
        *groups.get_mut(count)? = group.parse().ok()?;
        count += 1;
    }
    Some(AccountIds {
        uid,
        gid,
        groups: count,
    })
}

#[cfg(test)]
#[path = "args_tests.rs"]
mod tests;
