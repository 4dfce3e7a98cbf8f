//! The exit codes a guard gives of its own (not the job's), as a shell gives them.

/// The guard's own failure (bad command line, the agent already gone, ...), and a program
/// that cannot be found ("command not found").
pub const NOT_FOUND: u8 = 127;
/// A program found but not runnable ("Permission denied").
pub const NOT_RUNNABLE: u8 = 126;
