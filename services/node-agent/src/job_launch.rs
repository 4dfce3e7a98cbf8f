//! One attempt's guard started in the attempt's cgroup: a guard waiting in the pool
//! (`guard_pool.rs`) where the job may use one, its cgroup adopted and its start message sent;
//! otherwise a cgroup made now and a guard spawned into it (the guard moves in itself). A
//! pooled start that fails at any step is undone and the job starts the usual way.

use std::collections::BTreeMap;

use tokio::process::{Child, Command};
use tracing::warn;

use crate::cgroup::{Containment, JobCgroup, JobLimits};
use crate::guard_pool::{GuardPool, PooledGuard, start_message};
use crate::host::JobHost;
use crate::job_command::{GuardSetup, JobParts, guarded_command};
use crate::job_io::JobIo;
use crate::run_as::Account;
use crate::running::AttemptKey;
use mgpu_protocol::job::JobSpec;

/// An environment larger than this (names and values) is not sent to a pooled guard: what
/// the guard's own arguments and the cgroup's paths add stays far below the message's bound.
const POOLED_ENVIRONMENT_MAX: usize = mgpu_guard_rules::pooled::MESSAGE_MAX / 2;

/// What starting a guard needs of the agent.
pub struct Launcher<'a> {
    pub node: &'a str,
    pub containment: &'a Containment,
    pub pool: Option<&'a std::sync::Arc<GuardPool>>,
    pub guard: GuardSetup<'a>,
    pub host: &'a JobHost,
}

/// What the guard's command is made of.
pub struct Parts<'a> {
    pub spec: &'a JobSpec,
    pub gpus: &'a [u32],
    pub environment: &'a BTreeMap<String, String>,
    pub account: Option<Account>,
    pub io: &'a JobIo,
}

/// The attempt's guard, started, and its cgroup (None where jobs are not contained).
pub struct Launched {
    pub child: Child,
    pub cgroup: Option<JobCgroup>,
}

/// Starts the attempt's guard in its cgroup. The error is the `FailedToStart` text.
pub async fn launch(
    ctx: &Launcher<'_>,
    key: &AttemptKey,
    limits: &JobLimits,
    parts: Parts<'_>,
) -> Result<Launched, String> {
    if let Some(pooled) = take_pooled(ctx, limits, &parts) {
        match start_pooled(ctx, key, limits, &parts, pooled).await {
            Ok(launched) => return Ok(launched),
            Err(err) => warn!(job = %key.job_id, attempt = key.attempt,
                "starting under a pooled guard failed ({err}); starting the usual way"),
        }
    }
    let node = &ctx.node;
    let cgroup = ctx.containment.create(key, limits).map_err(|err| {
        ctx.host.cores.release(key);
        format!("{err} on {node}")
    })?;
    let command = command(ctx, &parts, cgroup.as_ref(), false).map_err(|err| {
        ctx.host.cores.release(key);
        format!("cannot set up the job's terminal on {node}: {err}")
    })?;
    let child = spawn(ctx, key, command, &parts.spec.workdir, cgroup.clone()).await?;
    Ok(Launched { child, cgroup })
}

/// A waiting guard, when this job may use one (see `guard_pool.rs` for which may).
fn take_pooled(ctx: &Launcher<'_>, limits: &JobLimits, parts: &Parts<'_>) -> Option<PooledGuard> {
    let plain_pipes = matches!(parts.io, JobIo::Pipes { interactive: false });
    let environment: usize = parts
        .environment
        .iter()
        .map(|(name, value)| name.len() + value.len() + 2)
        .sum();
    let fits = environment < POOLED_ENVIRONMENT_MAX;
    if !plain_pipes || limits.cores.is_some() || !fits {
        return None;
    }
    ctx.pool?.take()
}

/// Adopts the pooled guard's cgroup for the attempt and sends the guard its start message;
/// on an error the guard is ended and the cgroup emptied and removed.
async fn start_pooled(
    ctx: &Launcher<'_>,
    key: &AttemptKey,
    limits: &JobLimits,
    parts: &Parts<'_>,
    pooled: PooledGuard,
) -> Result<Launched, String> {
    let adopted = match ctx.containment.adopt(&pooled.cgroup, key, limits) {
        Ok(adopted) => adopted,
        Err(err) => {
            let pooled_cgroup = pooled.cgroup.clone();
            end(
                pooled.child,
                [
                    Some(pooled_cgroup),
                    ctx.containment.attempt_cgroup(key, None),
                ],
            )
            .await;
            return Err(err);
        }
    };
    let message = command(ctx, parts, Some(&adopted), true)
        .ok()
        .and_then(|command| start_message(&command));
    let Some(message) = message else {
        end(pooled.child, [Some(adopted), None]).await;
        return Err("its start message does not fit".to_owned());
    };
    match pooled.start(&message).await {
        Ok(child) => Ok(Launched {
            child,
            cgroup: Some(adopted),
        }),
        Err((err, child)) => {
            end(child, [Some(adopted), None]).await;
            Err(err)
        }
    }
}

/// Kills a pooled guard that will not serve, then empties and removes `cgroups`.
async fn end(mut child: Child, cgroups: [Option<JobCgroup>; 2]) {
    let _ = child.start_kill();
    let _ = child.wait().await;
    for cgroup in cgroups.into_iter().flatten() {
        if let Err(err) = cgroup.kill_all().await {
            warn!("removing the cgroup of a pooled guard that did not serve: {err}");
        }
    }
}

/// The guard's command; `joined`: the guard is in `cgroup` already.
fn command(
    ctx: &Launcher<'_>,
    parts: &Parts<'_>,
    cgroup: Option<&JobCgroup>,
    joined: bool,
) -> std::io::Result<Command> {
    guarded_command(
        &ctx.guard,
        JobParts {
            spec: parts.spec,
            gpus: parts.gpus,
            environment: parts.environment,
            account: parts.account.clone(),
            cgroup,
            cgroup_joined: joined,
            io: parts.io,
        },
    )
}

/// Starts the guard; a cgroup made for a job that could not start is removed again.
async fn spawn(
    ctx: &Launcher<'_>,
    key: &AttemptKey,
    mut command: Command,
    workdir: &str,
    cgroup: Option<JobCgroup>,
) -> Result<Child, String> {
    match command.spawn() {
        Ok(child) => Ok(child),
        Err(err) => {
            if let Some(cgroup) = cgroup {
                let _ = cgroup.kill_all().await;
            }
            ctx.host.cores.release(key);
            Err(format!(
                "cannot start the job's guard {} in {workdir} on {}: {err}",
                ctx.guard.program.program().0.display(),
                ctx.node
            ))
        }
    }
}
