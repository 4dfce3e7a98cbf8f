//! One job attempt's process: spawning it (script and environment from [`crate::script`]) in
//! its own process group, watching it (time limit, kill requests), and reporting how it ended
//! after its output was flushed.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_nats::jetstream::{self, message::PublishMessage};
use bytes::Bytes;
use mgpu_protocol::assign::Assignment;
use mgpu_protocol::event::JobEventKind;
use mgpu_protocol::job::Placement;
use mgpu_protocol::{output, subjects};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::input::InputForwarder;
use crate::output::{OutputPipeline, output_headers};
use crate::reports::Reporter;
use crate::running::{AttemptKey, RunningTable, StopReason, StopRequests};
use crate::script::{Launch, RankInfo, job_environment, launch};
use crate::state_file::{self, RecordedAttempt, StateFile};

/// How long output may keep flowing after the job's process group is dead: only a process
/// that escaped the group (a daemon) can hold the pipes open that long.
const OUTPUT_DRAIN_LIMIT: Duration = Duration::from_secs(3);

/// What every job needs from the agent.
#[derive(Clone)]
pub struct JobContext {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub node: String,
    pub kill_grace: Duration,
    pub table: RunningTable,
    pub reporter: Reporter,
    /// Attempts running here, remembered on disk so a restarted agent can stop its orphans.
    pub state: StateFile,
    /// Notified when the set of running jobs changed, so the heartbeat says so at once.
    pub heartbeat_now: Arc<Notify>,
    /// The program every job starts under.
    pub guard: crate::guard::GuardProgram,
    /// Given to every job's guard, which stops the job if this agent loses contact or freezes.
    pub guard_fence: Option<crate::guard::GuardFence>,
    /// Whose account jobs run under.
    pub run_as: crate::run_as::RunAsPolicy,
}

/// A spawned job attempt, recorded in the running table; [`StartedJob::supervise`] sees it
/// through to its `Exited` report.
pub struct StartedJob {
    ctx: JobContext,
    key: AttemptKey,
    rank: u32,
    /// The hostfile written for a multi-node job, removed when it ends.
    hostfile: Option<PathBuf>,
    child: Child,
    pid: u32,
    started: Instant,
    time_limit: Option<Duration>,
    output: OutputPipeline,
    input: Option<InputForwarder>,
    stop_requests: StopRequests,
}

/// Starts an assignment's process. The error is the `FailedToStart` text, phrased for the user
/// who submitted the job.
pub async fn start(ctx: &JobContext, assignment: &Assignment) -> Result<StartedJob, String> {
    let key = AttemptKey {
        job_id: assignment.job_id.clone(),
        attempt: assignment.attempt,
    };
    let spec = &assignment.spec;
    let node = &ctx.node;
    spec.validate()
        .map_err(|err| format!("the job cannot run: {err}"))?;
    let account = crate::run_as::resolve(
        &ctx.run_as,
        &assignment.user,
        assignment.unix_user.as_deref(),
        node,
    )?;
    check_workdir(&spec.workdir, node).await?;
    // Subscribed before the process starts, so input sent right after the start is not lost.
    let input = if spec.interactive {
        let subscription = ctx
            .client
            .subscribe(subjects::input(&key.job_id))
            .await
            .map_err(|err| format!("cannot receive the job's standard input on {node}: {err}"))?;
        Some(subscription)
    } else {
        None
    };

    let rank = assignment.rank;
    let gpus: Vec<u32> = assignment
        .placement
        .gpus_on(node)
        .unwrap_or_default()
        .iter()
        .map(|g| g.index)
        .collect();
    // Multi-node and distributed jobs get the rendezvous variables and a hostfile.
    let hostfile = match &assignment.placement.launch {
        Some(_) => Some(write_hostfile(&key, node, &assignment.placement).await?),
        None => None,
    };
    let ranks = hostfile.as_ref().map(|path| RankInfo {
        placement: &assignment.placement,
        rank,
        hostfile: path,
    });
    let (program, program_args) = match launch(spec, &gpus) {
        Launch::Shell(script) => (shell_program().to_owned(), vec!["-c".to_owned(), script]),
        Launch::Direct { program, args } => (program, args),
    };
    // The job runs under a guard that stops it if the agent dies. `mgpu-job-guard` switches
    // to the job's account itself; otherwise the child is switched between fork and exec.
    let switch_in_guard = ctx.guard.switches_accounts();
    let guard_account = account
        .as_ref()
        .filter(|_| switch_in_guard)
        .map(|a| a.guard_spec());
    let (guard, guard_prefix) = ctx.guard.program();
    let mut command = Command::new(guard);
    command
        .args(guard_prefix)
        .args(crate::guard::guard_args(
            std::process::id(),
            ctx.kill_grace,
            ctx.guard_fence.as_ref(),
            guard_account,
            &program,
        ))
        .args(program_args)
        .env_clear()
        .envs(job_environment(spec, &key, node, &gpus, ranks.as_ref()))
        .envs(account.iter().flat_map(|a| a.environment()))
        // As a shell would set it (a job started without one still sees it).
        .env("PWD", &spec.workdir)
        .current_dir(&spec.workdir)
        // Its own process group, so a kill reaches everything the job started.
        .process_group(0)
        .stdin(if spec.interactive {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(account) = account.clone().filter(|_| !switch_in_guard) {
        // SAFETY: between fork and exec the closure makes only system calls (setgroups,
        // setgid, setuid) on data prepared before the fork; it allocates nothing.
        unsafe {
            command.pre_exec(move || account.switch());
        }
    }
    let mut child = command.spawn().map_err(|err| {
        format!(
            "cannot start the job's guard {} in {} on {node}: {err}",
            guard.display(),
            spec.workdir
        )
    })?;

    // A freshly spawned child has its pid and the pipes asked for; the checks below only keep
    // a broken invariant from becoming a panic.
    let Some(pid) = child.id() else {
        return Err(format!(
            "the job's process on {node} ended before it could be watched"
        ));
    };
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        signal_group(pid, Signal::SIGKILL, &key);
        return Err(format!("cannot read the job's output on {node}"));
    };
    let output = OutputPipeline::start(ctx.js.clone(), key.clone(), rank, stdout, stderr);
    let input = match (input, child.stdin.take()) {
        (Some(subscription), Some(stdin)) => Some(InputForwarder::start(
            subscription,
            stdin,
            key.clone(),
            assignment.input_keys.clone(),
        )),
        _ => None,
    };
    let stop_requests = ctx.table.insert(key.clone(), pid);
    // On disk before the assignment is acknowledged: if this agent is SIGKILLed from here on,
    // the next one finds the process and stops it.
    ctx.state
        .record(RecordedAttempt {
            job_id: key.job_id.clone(),
            attempt: key.attempt,
            pid,
            started_at: mgpu_protocol::now(),
            boot_id: state_file::boot_id(),
            start_ticks: state_file::start_ticks(pid),
        })
        .await;
    info!(%key, pid, rank, ?gpus, "job started");
    Ok(StartedJob {
        ctx: ctx.clone(),
        key,
        rank,
        hostfile,
        child,
        pid,
        started: Instant::now(),
        time_limit: spec.time_limit(),
        output,
        input,
        stop_requests,
    })
}

impl StartedJob {
    /// Reports the start, waits for the end (stopping the job on its time limit or when
    /// asked), flushes its output and reports how it ended.
    pub async fn supervise(self) {
        let StartedJob {
            ctx,
            key,
            rank,
            hostfile,
            mut child,
            pid,
            started,
            time_limit,
            output,
            input,
            mut stop_requests,
        } = self;
        // Reported alongside the run, so a slow JetStream never delays a kill or time limit.
        let started_report = {
            let reporter = ctx.reporter.clone();
            let key = key.clone();
            tokio::spawn(async move {
                reporter
                    .job_event(&key, JobEventKind::Started { pid })
                    .await
            })
        };
        let watch = Watch {
            key: &key,
            pid,
            kill_grace: ctx.kill_grace,
            // Checked: assignments are validated, but an overflowing `Instant + Duration`
            // panics; no deadline beats a dead agent.
            time_limit_at: time_limit.and_then(|limit| started.checked_add(limit)),
        };
        let ending = watch.until_exit(&mut child, &mut stop_requests).await;

        // Background processes the job left behind would keep its output pipes open forever.
        signal_group(pid, Signal::SIGKILL, &key);
        if let Some(input) = input {
            input.stop().await;
        }
        let summary = output.finish(&key, OUTPUT_DRAIN_LIMIT).await;
        let (exit_code, signal) = exit_code_of(ending.status);

        let mut eof_headers = output_headers(output::EOF, summary.next_seq, key.attempt, rank);
        if let Some(path) = &hostfile {
            let _ = tokio::fs::remove_file(path).await;
        }
        eof_headers.insert(output::EXIT_CODE, exit_code.to_string());
        let eof = PublishMessage::build()
            .payload(Bytes::new())
            .headers(eof_headers)
            .message_id(format!("{}-{}-{}-eof", key.job_id, key.attempt, ctx.node));
        ctx.reporter
            .publish_until_stored(subjects::output(&key.job_id), eof, &key, "output end")
            .await;

        // The scheduler must see `started` before `exited`.
        let _ = started_report.await;
        info!(
            %key,
            exit_code,
            ?signal,
            cancelled = ending.cancelled,
            timed_out = ending.timed_out,
            preempted = ending.preempted,
            output_bytes = summary.bytes,
            output_chunks_lost = summary.lost_chunks,
            "job exited"
        );
        let reported = ctx
            .reporter
            .job_event(
                &key,
                JobEventKind::Exited {
                    exit_code,
                    signal,
                    cancelled: ending.cancelled,
                    timed_out: ending.timed_out,
                    preempted: ending.preempted,
                    lost: ending.lost,
                },
            )
            .await;
        // Forgotten on disk only once the scheduler can learn how it ended; otherwise the next
        // agent reports it (as lost).
        if reported {
            ctx.state.remove(&key).await;
        }
        ctx.table.finish(&key);
        ctx.heartbeat_now.notify_one();
    }
}

/// How the main process ended, and why the agent stopped it if it did.
struct Ending {
    /// `None` when the exit status could not be read.
    status: Option<ExitStatus>,
    cancelled: bool,
    timed_out: bool,
    /// Stopped so that it goes back to the queue (a Kill with `requeue`).
    preempted: bool,
    /// Stopped by the agent itself (shutdown, fencing): the scheduler treats it like a job
    /// whose node was lost.
    lost: bool,
}

/// The rules for stopping one running job.
struct Watch<'a> {
    key: &'a AttemptKey,
    pid: u32,
    kill_grace: Duration,
    time_limit_at: Option<Instant>,
}

impl Watch<'_> {
    /// Waits for the main process to exit. On the time limit or a stop request: SIGTERM to the
    /// process group, then SIGKILL once the kill grace has passed.
    async fn until_exit(&self, child: &mut Child, stop_requests: &mut StopRequests) -> Ending {
        let mut cancelled = false;
        let mut timed_out = false;
        let mut preempted = false;
        let mut lost = false;
        // When SIGKILL is due, once a stop has begun.
        let mut kill_at: Option<Instant> = None;
        let mut killed = false;
        let mut stop_requests_open = true;
        loop {
            let stopping = kill_at.is_some();
            tokio::select! {
                status = child.wait() => {
                    let status = status
                        .inspect_err(|err| error!(key = %self.key, "cannot read the job's exit status: {err}"))
                        .ok();
                    return Ending { status, cancelled, timed_out, preempted, lost };
                }
                () = sleep_until(self.time_limit_at), if !stopping && self.time_limit_at.is_some() => {
                    info!(key = %self.key, "time limit reached; stopping the job");
                    timed_out = true;
                    kill_at = Some(self.terminate());
                }
                changed = stop_requests.changed(), if !stopping && stop_requests_open => {
                    if changed.is_err() {
                        // The table dropped its side; no stop can come any more.
                        stop_requests_open = false;
                        continue;
                    }
                    let Some(reason) = *stop_requests.borrow_and_update() else { continue };
                    match reason {
                        StopReason::Cancelled => info!(key = %self.key, "cancelling the job"),
                        StopReason::AgentShutdown => info!(key = %self.key, "stopping the job: the agent is shutting down"),
                        StopReason::Requeued => info!(key = %self.key, "stopping the job: the scheduler puts it back in the queue"),
                        StopReason::Fenced => warn!(key = %self.key, "stopping the job: this node lost contact with NATS (fenced)"),
                    }
                    cancelled = reason == StopReason::Cancelled;
                    preempted = reason == StopReason::Requeued;
                    lost = matches!(reason, StopReason::AgentShutdown | StopReason::Fenced);
                    kill_at = Some(self.terminate());
                }
                () = sleep_until(kill_at), if stopping && !killed => {
                    warn!(key = %self.key, grace = ?self.kill_grace, "the job ignored SIGTERM; sending SIGKILL");
                    signal_group(self.pid, Signal::SIGKILL, self.key);
                    killed = true;
                }
            }
        }
    }

    /// Sends SIGTERM to the job's group and returns when SIGKILL is due.
    fn terminate(&self) -> Instant {
        signal_group(self.pid, Signal::SIGTERM, self.key);
        Instant::now() + self.kill_grace
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Signals every process in the job's group (the job leads it, so its pid is the group id).
fn signal_group(pgid: u32, signal: Signal, key: &AttemptKey) {
    let Ok(raw) = i32::try_from(pgid) else { return };
    match killpg(Pid::from_raw(raw), signal) {
        Ok(()) => debug!(%key, ?signal, "signalled the job's process group"),
        // Nobody left in the group: the usual case after a clean exit.
        Err(nix::errno::Errno::ESRCH) => {}
        Err(err) => warn!(%key, ?signal, "cannot signal the job's process group: {err}"),
    }
}

/// The exit code the shell convention gives (128 + N after signal N) and the signal if any.
/// -1 stands for a status that could not be read.
fn exit_code_of(status: Option<ExitStatus>) -> (i32, Option<i32>) {
    let Some(status) = status else {
        return (-1, None);
    };
    match (status.code(), status.signal()) {
        (Some(code), _) => (code, None),
        (None, Some(signal)) => (128 + signal, Some(signal)),
        (None, None) => (-1, None),
    }
}

/// `/bin/bash` where there is one (`source` and `conda activate` need it), else `/bin/sh`.
fn shell_program() -> &'static str {
    static SHELL: OnceLock<&'static str> = OnceLock::new();
    SHELL.get_or_init(|| {
        if std::path::Path::new("/bin/bash").exists() {
            "/bin/bash"
        } else {
            "/bin/sh"
        }
    })
}

/// Checks the job's directory before spawning, so the user gets a sentence rather than an errno.
async fn check_workdir(workdir: &str, node: &str) -> Result<(), String> {
    match tokio::fs::metadata(workdir).await {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(format!("workdir {workdir} is not a directory on {node}")),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            Err(format!("workdir {workdir} does not exist on {node}"))
        }
        Err(err) => Err(format!(
            "workdir {workdir} is not accessible on {node}: {err}"
        )),
    }
}

/// Writes the MPI hostfile of a multi-node job (`ADDRESS slots=GPUS`, one line per node, rank
/// order) where the job can read it: the temporary directory, named after the attempt.
async fn write_hostfile(
    key: &AttemptKey,
    node: &str,
    placement: &Placement,
) -> Result<PathBuf, String> {
    let addresses = placement
        .launch
        .as_ref()
        .map(|l| l.addresses.clone())
        .unwrap_or_default();
    let mut text = String::new();
    for (rank, node, gpus) in placement.ranks() {
        let address = addresses.get(rank as usize).map_or(node, String::as_str);
        text.push_str(&format!("{address} slots={}\n", gpus.len().max(1)));
    }
    // Named after the node too: agents sharing a host must not remove each other's file.
    let path =
        std::env::temp_dir().join(format!("mgpu-{}-{}-{node}.hosts", key.job_id, key.attempt));
    tokio::fs::write(&path, text)
        .await
        .map_err(|err| format!("cannot write the hostfile {}: {err}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(exit_code_of(Some(ExitStatus::from_raw(0))), (0, None));
        assert_eq!(exit_code_of(Some(ExitStatus::from_raw(3 << 8))), (3, None));
        // Raw wait status of a process killed by SIGTERM (15) is the signal number itself.
        assert_eq!(
            exit_code_of(Some(ExitStatus::from_raw(15))),
            (143, Some(15))
        );
        assert_eq!(exit_code_of(None), (-1, None));
    }

    /// Spawns `sleep` as the agent spawns jobs (own process group), asks the table to stop it
    /// for `reason` and returns how the watch saw it end.
    async fn stop_a_sleeping_job(reason: StopReason) -> Ending {
        let table = RunningTable::default();
        let key = AttemptKey {
            job_id: mgpu_protocol::ids::JobId::random(),
            attempt: 1,
        };
        let mut child = Command::new("sleep")
            .arg("30")
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning sleep: {e}"));
        let pid = child.id().unwrap_or_else(|| panic!("sleep has no pid"));
        let mut stop_requests = table.insert(key.clone(), pid);
        assert!(table.request_stop(&key, reason));
        let watch = Watch {
            key: &key,
            pid,
            kill_grace: Duration::from_secs(5),
            time_limit_at: None,
        };
        tokio::time::timeout(
            Duration::from_secs(10),
            watch.until_exit(&mut child, &mut stop_requests),
        )
        .await
        .unwrap_or_else(|_| panic!("the job was not stopped"))
    }

    #[tokio::test]
    async fn a_requeue_kill_stops_the_job_as_a_cancel_does_but_reports_it_preempted() {
        let requeued = stop_a_sleeping_job(StopReason::Requeued).await;
        assert!(requeued.preempted && !requeued.cancelled && !requeued.timed_out);
        let cancelled = stop_a_sleeping_job(StopReason::Cancelled).await;
        assert!(cancelled.cancelled && !cancelled.preempted && !cancelled.timed_out);
        // Both end the same way: SIGTERM to the group.
        assert_eq!(exit_code_of(requeued.status), (143, Some(15)));
        assert_eq!(exit_code_of(cancelled.status), (143, Some(15)));
    }

    #[tokio::test]
    async fn a_missing_workdir_is_named_with_the_node() {
        let err = check_workdir("/definitely/not/here", "node001").await.err();
        assert_eq!(
            err.as_deref(),
            Some("workdir /definitely/not/here does not exist on node001")
        );
        assert!(check_workdir("/", "node001").await.is_ok());
        let file = check_workdir("/etc/hostname", "n")
            .await
            .err()
            .unwrap_or_default();
        assert!(file.contains("not a directory") || file.contains("does not exist"));
    }
}
