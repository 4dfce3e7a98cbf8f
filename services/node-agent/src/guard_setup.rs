//! The guards every job starts under, chosen once at the agent's start: the program
//! (`--job-guard`), the contact file the agent touches after every stored heartbeat, and the
//! fence each guard keeps with it.

use anyhow::Context;
use tracing::info;

use crate::cli::Args;
use crate::heartbeat::Identity;
use crate::{fence, guard, run_as};

/// The contact file the agent touches after every stored heartbeat, and the guard every job
/// starts under with the fencing it is told to do.
pub struct Guards {
    pub contact: fence::Contact,
    pub program: guard::GuardProgram,
    pub fence: Option<guard::GuardFence>,
}

impl Guards {
    /// Makes the contact file under `state_dir` and chooses the guard program (`--job-guard`)
    /// and its fence, logging which guard jobs start under.
    pub fn set_up(
        args: &Args,
        identity: &Identity,
        run_as: &run_as::RunAsPolicy,
        state_dir: &std::path::Path,
    ) -> anyhow::Result<Self> {
        let contact_file = state_dir.join(format!("{}.contact", identity.node));
        let contact = fence::Contact::with_file(&contact_file)
            .with_context(|| format!("creating the contact file {}", contact_file.display()))?;
        // The guards fence half an interval after this agent would, so the agent normally
        // stops (and reports) its jobs itself; a guard acts when the agent is frozen.
        let fence = identity.fence_after.map(|after| guard::GuardFence {
            after: after.saturating_add(identity.interval / 2),
            contact_file,
        });
        let agent_exe = std::env::current_exe().context("cannot find the agent's own binary")?;
        let program = guard::GuardProgram::choose(args.job_guard.as_deref(), &agent_exe)
            .map_err(anyhow::Error::msg)?;
        match &program {
            guard::GuardProgram::Slim(_) => {
                info!(guard = program.describe(), "jobs start under their guard")
            }
            guard::GuardProgram::Builtin(_) => info!(
                guard = program.describe(),
                "jobs start under the built-in guard ({} not found beside this binary; each \
                 job's start then costs about a millisecond more CPU)",
                guard::SLIM_GUARD_NAME
            ),
        }
        // A built-in guard runs as the job's account, which may not enter the state directory:
        // it reads the contact file through a descriptor the agent keeps open.
        let fence = match fence {
            Some(fence) if run_as.as_owner && !program.switches_accounts() => {
                let contact_file = guard::inheritable_contact(&fence.contact_file)
                    .with_context(|| format!("opening {}", fence.contact_file.display()))?;
                Some(guard::GuardFence {
                    contact_file,
                    ..fence
                })
            }
            other => other,
        };
        Ok(Guards {
            contact,
            program,
            fence,
        })
    }
}
