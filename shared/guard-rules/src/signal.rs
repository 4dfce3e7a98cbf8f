//! The Linux signal numbers the guard's rules speak of (the same on every Linux
//! architecture), and which of them mean what to a guard.

pub const SIGHUP: i32 = 1;
pub const SIGINT: i32 = 2;
pub const SIGQUIT: i32 = 3;
pub const SIGKILL: i32 = 9;
pub const SIGTERM: i32 = 15;

/// The signals that make the guard stop its job: SIGTERM (also what the kernel sends when
/// the agent dies), SIGINT and SIGHUP (a hung-up terminal). The guard notes them rather
/// than dying of them.
pub const STOP: [i32; 3] = [SIGTERM, SIGINT, SIGHUP];

/// What the guard asks the kernel to send it when the agent dies (`PR_SET_PDEATHSIG`): a
/// stop signal, so the agent's death stops the job like any other.
pub const AGENT_DIED: i32 = SIGTERM;

/// On a job's terminal (`--pty`), the keys the terminal turns into signals (Ctrl+C,
/// Ctrl+\): they are the job's, and the guard, in the same foreground group, neither stops
/// nor dies of them. SIGHUP still stops it.
pub const TERMINAL_KEYS: [i32; 2] = [SIGINT, SIGQUIT];
