//! The command that starts a job attempt: its guard (which stops the job if the agent dies)
//! with the program `launch.rs` makes of the spec, in its own process group, with exactly the
//! environment `environment.rs` built, its terminal or pipes, and the switch to the job's
//! account and the move into its cgroup where the agent does those itself.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStringExt;

use mgpu_protocol::job::JobSpec;
use tokio::process::Command;

use crate::cgroup::JobCgroup;
use crate::guard::{GuardFence, GuardProgram, guard_args};
use crate::job_io::JobIo;
use crate::launch::{launch, shell_program};
use crate::run_as::Account;

/// The guard every job starts under, as the agent runs it: its program, the kill grace it
/// gives, and the fence it keeps.
pub struct GuardSetup<'a> {
    pub program: &'a GuardProgram,
    pub kill_grace: std::time::Duration,
    pub fence: Option<&'a GuardFence>,
}

/// What the job's command is made of.
pub struct JobParts<'a> {
    pub spec: &'a JobSpec,
    pub gpus: &'a [u32],
    pub environment: &'a BTreeMap<String, String>,
    pub account: Option<Account>,
    pub cgroup: Option<&'a JobCgroup>,
    /// The guard is in `cgroup` already (a pooled guard, `guard_pool.rs`).
    pub cgroup_joined: bool,
    pub io: &'a JobIo,
}

/// The command that starts the job under its guard, in its own process group, with exactly
/// `environment` (and the account's variables). The job runs under a guard that stops it if
/// the agent dies. `mgpu-job-guard` switches to the job's account itself; otherwise the child
/// is switched between fork and exec. The guard moves into `cgroup` before it starts the job,
/// or where the child is switched, the child moves in before it is.
pub fn guarded_command(guard: &GuardSetup<'_>, parts: JobParts<'_>) -> std::io::Result<Command> {
    let JobParts {
        spec,
        gpus,
        environment,
        account,
        cgroup,
        cgroup_joined,
        io,
    } = parts;
    let (program, program_args) = launch(spec, gpus).into_program(shell_program());
    let switch_in_guard = guard.program.switches_accounts();
    let join_before_switch = account.is_some() && !switch_in_guard;
    // Where the child joins before its switch, the guard is told it joined already (`@`): it
    // still empties the cgroup when it stops the job without the agent.
    let guard_procs = cgroup.map(|cgroup| {
        let list = cgroup.guard_argument();
        if join_before_switch || cgroup_joined {
            format!("@{list}")
        } else {
            list
        }
    });
    let guard_account = account
        .as_ref()
        .filter(|_| switch_in_guard)
        .map(|a| a.guard_spec());
    let (guard_program, guard_prefix) = guard.program.program();
    let mut command = Command::new(guard_program);
    command
        .args(guard_prefix)
        .args(guard_args(
            std::process::id(),
            guard.kill_grace,
            guard.fence,
            guard_account,
            guard_procs.as_deref(),
            &program,
        ))
        .args(program_args)
        .env_clear()
        .envs(environment)
        .envs(account.iter().flat_map(|a| a.environment()))
        // As a shell would set it (a job started without one still sees it).
        .env("PWD", &spec.workdir)
        .current_dir(&spec.workdir);
    if spec.pty.is_some() && !spec.env.contains_key("TERM") {
        // Submitted from no terminal: programs still need to know what this one speaks.
        command.env("TERM", "xterm-256color");
    }
    // Before the account switch below: the session is made while still allowed to.
    io.configure(&mut command)?;
    if let Some(account) = account.filter(|_| !switch_in_guard) {
        let join: Vec<CString> = cgroup
            .map(JobCgroup::procs_files)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|path| CString::new(path.into_os_string().into_vec()).ok())
            .collect();
        // SAFETY: between fork and exec the closure makes only system calls (open, write,
        // close, setgroups, setgid, setuid) on data prepared before the fork; it allocates
        // nothing.
        unsafe {
            command.pre_exec(move || {
                crate::cgroup::join(&join)?;
                account.switch()
            });
        }
    }
    Ok(command)
}
