//! The guard's rules as one pure state machine, [`Guard`]: when to stop the job's process
//! group (a stop signal, which is also how the kernel reports the agent's death, or a contact
//! file that says no heartbeat was stored for the fence time), the kill sequence (SIGTERM to
//! what left the group, then to the group; SIGKILL to both once the grace has passed, again at
//! every look until the guard dies of it), how long to wait before looking again, and how the
//! guard ends (the way the job ended; emptying the job's cgroup first when it stopped the job
//! without its agent).
//!
//! A driver (the static guard, or the agent's built-in one) feeds it what it saw and carries
//! out the [`Command`]s it returns, in order:
//!
//! 1. Reap the job without blocking; when it ended, [`Guard::job_ended`] says how to end.
//! 2. Otherwise read the monotonic clock, whether a stop signal arrived, and (when
//!    [`Guard::reads_contact`]) the contact file's modification time with the wall clock,
//!    and hand them to [`Guard::look`].
//! 3. Carry out the commands; the last is a [`Command::Wait`], after which go back to 1.
//!
//! Times are [`Duration`]s: on the monotonic clock from any origin the driver keeps fixed, or
//! on the wall clock since the Unix epoch for the contact file (which the agent touches on
//! the wall clock, so no other clock can tell its age).

use core::time::Duration;

use crate::signal::{SIGKILL, SIGTERM};

/// How often a stopping guard looks whether the job is gone or SIGKILL is due.
pub const STOPPING_PAUSE: Duration = Duration::from_millis(20);
/// A fencing guard reads the contact file every eighth of the fence, but at least this far
/// apart (reading it costs a system call)...
const CHECK_AT_LEAST_EVERY: Duration = Duration::from_millis(20);
/// ...and at most this far apart: the agent's heartbeat margin covers the delay.
const CHECK_AT_MOST_EVERY: Duration = Duration::from_millis(100);

/// What [`Command::AnnounceFence`] writes to the job's stderr, before and after the fence in
/// milliseconds: the job's own output then says why it stopped.
pub const FENCED_MESSAGE: [&str; 2] = [
    "mgpu: this node has not reached the cluster for longer than ",
    " ms; stopping the job, which may already run elsewhere (fenced)\n",
];

/// How many times [`Command::SignalCgroup`] with SIGKILL reads the cgroup's process list
/// again while it still finds others than the guard: a forking job may add processes while
/// the list is read.
pub const CGROUP_KILL_ROUNDS: usize = 20;

/// Whether [`Command::SignalCgroup`] with `signal` spares the members of the guard's own
/// process group: they get the stop signal from [`Command::SignalGroup`], and a second SIGTERM
/// would run a job's TERM handler twice. SIGKILL goes to every member, whatever its group.
pub const fn cgroup_signal_spares_group(signal: i32) -> bool {
    signal != SIGKILL
}

/// `time` in nanoseconds, where sums of two cannot overflow: `Duration`'s own checked
/// arithmetic would bring the panic machinery of `core` into the static guard.
const fn nanos(time: Duration) -> u128 {
    time.as_nanos()
}

/// Where the guard stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// The job runs; the guard waits for it, and watches for the reasons to stop it.
    Watching,
    /// SIGTERM sent to the group `since` then (on the monotonic clock); SIGKILL is due once
    /// the grace has passed since.
    Stopping { since: Duration },
    /// The job ended; the guard ends the same way.
    Ended,
}

/// What the contact file said at one look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contact {
    /// Not read: the guard does not fence, or it is stopping the job already.
    NotRead,
    /// It cannot be read. The guard keeps the job: fencing on a missing file would turn an
    /// operator's mistake into lost work.
    Unreadable,
    /// Last touched (a heartbeat stored) at `stored`, read when the wall clock said `now`;
    /// both since the Unix epoch (a file touched before it: zero).
    StoredAt { stored: Duration, now: Duration },
}

/// What one look at a job that has not ended found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Look {
    /// The monotonic clock.
    pub now: Duration,
    /// Whether a stop signal ([`crate::signal::STOP`]) has arrived, at any time so far.
    pub stop_signal: bool,
    pub contact: Contact,
}

/// How the job's process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobEnd {
    Exited(u8),
    Signaled(i32),
}

impl JobEnd {
    /// From a Linux wait status (`wait4`'s, of a process that ended).
    pub const fn from_wait_status(status: i32) -> Self {
        let signal = status & 0x7f;
        if signal == 0 {
            JobEnd::Exited(((status >> 8) & 0xff) as u8)
        } else {
            JobEnd::Signaled(signal)
        }
    }
}

/// What the guard does, in the order given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Write [`FENCED_MESSAGE`] with `after_ms` to stderr, which is the job's.
    AnnounceFence { after_ms: u64 },
    /// Send `signal` to every process in the job's cgroup but the guard (see
    /// [`cgroup_signal_spares_group`] and [`CGROUP_KILL_ROUNDS`]), so that what left the
    /// process group (a daemon, `setsid`) goes too; nothing when the job has no cgroup.
    SignalCgroup(i32),
    /// Send `signal` to the guard's process group, the job's. The guard notes its own
    /// SIGTERM (its handler is set) and dies of its SIGKILL, which the agent, if alive, sees.
    SignalGroup(i32),
    /// Wait until the job ends, a stop signal arrives or `at_most` has passed (None: no
    /// limit), then reap the job or look again.
    Wait { at_most: Option<Duration> },
    /// End the guard with this exit code.
    Exit(u8),
    /// End the guard by `signal` (default disposition, unblocked, sent to itself), as the job
    /// ended, so the agent reports the same thing; exit with `otherwise` if that did not end
    /// it (a signal whose default is not to end a process cannot have ended the job).
    DieBy { signal: i32, otherwise: u8 },
}

/// The most commands one step returns: the fence announced, SIGTERM to the cgroup and the
/// group, SIGKILL to both (a grace of zero), and the wait.
const MOST_COMMANDS: usize = 6;

/// The commands of one step, in order; a fixed array, since the static guard allocates
/// nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Commands {
    items: [Command; MOST_COMMANDS],
    len: usize,
}

impl Commands {
    const fn new() -> Self {
        Commands {
            items: [Command::Wait { at_most: None }; MOST_COMMANDS],
            len: 0,
        }
    }

    fn push(&mut self, command: Command) {
        // Never full: no step returns more than MOST_COMMANDS (tested).
        if let Some(slot) = self.items.get_mut(self.len) {
            *slot = command;
            self.len += 1;
        }
    }

    pub fn as_slice(&self) -> &[Command] {
        self.items.get(..self.len).unwrap_or(&[])
    }
}

impl<'a> IntoIterator for &'a Commands {
    type Item = &'a Command;
    type IntoIter = core::slice::Iter<'a, Command>;

    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

/// One guard's rules and where it stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Guard {
    grace: Duration,
    /// None: never fence.
    fence: Option<Duration>,
    state: State,
}

impl Guard {
    /// A guard watching a job just started: SIGKILL follows SIGTERM after `grace`; the job is
    /// fenced once the contact file is older than `fence` (None: never).
    pub const fn new(grace: Duration, fence: Option<Duration>) -> Self {
        Guard {
            grace,
            fence,
            state: State::Watching,
        }
    }

    pub const fn state(&self) -> State {
        self.state
    }

    /// Whether the next look needs the contact file ([`Contact::StoredAt`] or
    /// [`Contact::Unreadable`]); otherwise [`Contact::NotRead`] will do.
    pub fn reads_contact(&self) -> bool {
        self.fence.is_some() && self.state == State::Watching
    }

    /// A look at a job that has not ended: the first stop signal or fencing stops the group,
    /// SIGKILL follows once the grace has passed; the last command is how long to wait.
    pub fn look(&mut self, look: Look) -> Commands {
        let mut commands = Commands::new();
        if self.state == State::Watching {
            let fenced = self.fenced(look.contact);
            if let (true, Some(after)) = (fenced, self.fence) {
                let after_ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
                commands.push(Command::AnnounceFence { after_ms });
            }
            if look.stop_signal || fenced {
                // What left the group first, so nothing it does on the group's SIGTERM can
                // bring it back before it is signalled.
                commands.push(Command::SignalCgroup(SIGTERM));
                commands.push(Command::SignalGroup(SIGTERM));
                self.state = State::Stopping { since: look.now };
            }
        }
        match self.state {
            State::Watching => commands.push(Command::Wait {
                at_most: self.check_every(),
            }),
            State::Stopping { since } => {
                if nanos(look.now) >= nanos(since) + nanos(self.grace) {
                    // What left the group first: the group's SIGKILL takes the guard down too.
                    commands.push(Command::SignalCgroup(SIGKILL));
                    commands.push(Command::SignalGroup(SIGKILL));
                }
                commands.push(Command::Wait {
                    at_most: Some(STOPPING_PAUSE),
                });
            }
            State::Ended => {}
        }
        commands
    }

    /// The job ended: the guard ends the same way. Stopped without its agent (dead, or
    /// fenced), nothing of the job may outlive the guard, not even what left its group.
    pub fn job_ended(&mut self, end: JobEnd) -> Commands {
        let mut commands = Commands::new();
        if matches!(self.state, State::Stopping { .. }) {
            commands.push(Command::SignalCgroup(SIGKILL));
        }
        self.state = State::Ended;
        commands.push(match end {
            JobEnd::Exited(code) => Command::Exit(code),
            JobEnd::Signaled(signal) => Command::DieBy {
                signal,
                otherwise: 128u8.wrapping_add(signal as u8),
            },
        });
        commands
    }

    /// Whether the contact file says the agent has not stored a heartbeat for longer than
    /// the fence.
    fn fenced(&self, contact: Contact) -> bool {
        match (self.fence, contact) {
            (Some(fence), Contact::StoredAt { stored, now }) => {
                nanos(now) > nanos(stored) + nanos(fence)
            }
            _ => false,
        }
    }

    /// How long a watching guard waits before it looks again: while fencing, an eighth of
    /// the fence within [`CHECK_AT_LEAST_EVERY`] and [`CHECK_AT_MOST_EVERY`]; otherwise only
    /// the job's end or a stop signal wakes it.
    fn check_every(&self) -> Option<Duration> {
        let fence = self.fence?;
        let eighth = fence.checked_div(8).unwrap_or(fence);
        Some(eighth.max(CHECK_AT_LEAST_EVERY).min(CHECK_AT_MOST_EVERY))
    }
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
