//! One job attempt's life on this node: [`start`] checks and spawns it under its guard in its
//! cgroup (`job_launch.rs`: a pooled guard or a fresh one, with the command from
//! `job_command.rs`; the environment from `environment.rs`, the hostfile of a multi-node job
//! from `hostfile.rs`, the stop file from `stop_notice.rs`) in its own process group and
//! records it; then [`StartedJob::supervise`] reports its start, lets `stopping.rs`
//! warn and stop it when it must, flushes its output and reports how it ended.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_nats::Subscriber;
use async_nats::jetstream::{self, message::PublishMessage};
use bytes::Bytes;
use mgpu_protocol::assign::Assignment;
use mgpu_protocol::job::Placement;
use mgpu_protocol::report::{Exit, ReportKind};
use mgpu_protocol::stop::StopSignal;
use mgpu_protocol::{output, subjects};
use nix::sys::signal::Signal;
use tokio::process::Child;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::cgroup::{Containment, Emptied, JobCgroup};
use crate::environment::{RankInfo, job_environment};
use crate::guard::{GuardFence, GuardProgram};
use crate::host::JobHost;
use crate::hostfile::write_hostfile;
use crate::input::{InputForwarder, JobInput};
use crate::job_command::GuardSetup;
use crate::job_io::{ConnectedIo, JobIo};
use crate::job_launch::{Launched, Launcher, Parts, launch};
use crate::output::{OutputPipeline, OutputSummary, output_headers, restart_line};
use crate::report::Reporter;
use crate::run_as::RunAsPolicy;
use crate::running::{AttemptKey, RunningTable, StopRequests};
use crate::state_file::{self, RecordedAttempt, StateFile};
use crate::stop_notice::StopFile;
use crate::stop_state::{Stopped, limit_warning};
use crate::stopping::{Ending, Notice, Watch, exit_code_of, signal_group};

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
    pub guard: GuardProgram,
    /// Given to every job's guard, which stops the job if this agent loses contact or freezes.
    pub guard_fence: Option<GuardFence>,
    /// Whose account jobs run under.
    pub run_as: RunAsPolicy,
    /// Whether each job gets its own cgroup, and where.
    pub containment: Containment,
    /// The host's cores, memory and GPU device minors the jobs' cgroups are set up from.
    pub host: Arc<JobHost>,
    /// Guards waiting in cgroups for the next jobs; None where none are kept.
    pub pool: Option<Arc<crate::guard_pool::GuardPool>>,
}

/// A spawned job attempt, recorded in the running table; [`StartedJob::supervise`] sees it
/// through to its `Exited` report.
pub struct StartedJob {
    ctx: JobContext,
    key: AttemptKey,
    rank: u32,
    child: Child,
    pid: u32,
    started: Instant,
    time_limit: Option<Duration>,
    /// `--signal`: how the job is warned before it is stopped.
    warning_signal: Option<StopSignal>,
    stop_requests: StopRequests,
    /// Where the job reads why it is stopped; removed with its directory when dropped.
    stop_file: StopFile,
    streams: Streams,
    /// The job's cgroup, emptied when it ends; None where jobs are not contained.
    cgroup: Option<JobCgroup>,
}

/// What carries the job's data besides its process, closed once the job ended.
struct Streams {
    output: OutputPipeline,
    /// Where the output goes (public, or the owner's private subject), its end marker too.
    output_subject: String,
    input: Option<InputForwarder>,
    /// The hostfile written for a multi-node job, removed when it ends.
    hostfile: Option<PathBuf>,
    /// The job's batch script, removed when this is dropped.
    script: Option<crate::batch_script::ScriptFile>,
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
    let script = crate::batch_script::write(spec, &key, node, account.as_ref()).await?;
    let io = JobIo::for_spec(spec)
        .map_err(|err| format!("cannot open a terminal for the job on {node}: {err}"))?;
    // Subscribed before the process starts, so input sent right after the start is not lost.
    let input = if io.takes_input() {
        Some(subscribe_input(ctx, &key).await?)
    } else {
        None
    };

    let rank = assignment.rank;
    let gpus = gpus_on(&assignment.placement, node);
    let stop_file = StopFile::create(&key, node).await?;
    let (environment, hostfile) =
        environment_and_hostfile(assignment, &key, node, &gpus, stop_file.path()).await?;
    let (cpus, mem_host_mib) = (assignment.placement.cpus, assignment.placement.mem_host_mib);
    let limits = ctx.host.limits_for(&key, &gpus, cpus, mem_host_mib);
    let launched = crate::batch_script::launched_spec(spec, script.as_ref());
    let parts = Parts {
        spec: &launched,
        gpus: &gpus,
        environment: &environment,
        account,
        io: &io,
    };
    let launcher = Launcher {
        node,
        containment: &ctx.containment,
        pool: ctx.pool.as_ref(),
        guard: GuardSetup {
            program: &ctx.guard,
            kill_grace: ctx.kill_grace,
            fence: ctx.guard_fence.as_ref(),
        },
        host: &ctx.host,
    };
    let Launched { mut child, cgroup } = launch(&launcher, &key, &limits, parts).await?;
    let (pid, streams) = connect(&mut child, io, &key, node).inspect_err(|_| {
        ctx.host.cores.release(&key);
    })?;
    let (output, input) = carry_streams(ctx, &key, rank, streams, input, assignment);
    let stop_requests = ctx.table.insert(key.clone(), pid);
    if let Some(watched) = crate::idle_tracker::Watched::of(assignment, node) {
        ctx.table.watch_idle(&key, watched);
    }
    ctx.host
        .holdings
        .started(&key, &assignment.user, &gpus, cgroup.as_ref());
    // On disk before the assignment is acknowledged: if this agent is SIGKILLed from here on,
    // the next one finds the process and stops it.
    ctx.state.record(recorded(&key, pid, cgroup.as_ref())).await;
    info!(job = %key.job_id, attempt = key.attempt, pid, rank, ?gpus, "job started");
    Ok(StartedJob {
        ctx: ctx.clone(),
        key,
        rank,
        child,
        pid,
        started: Instant::now(),
        time_limit: spec.time_limit(),
        warning_signal: spec.signal,
        stop_requests,
        stop_file,
        streams: Streams {
            output,
            output_subject: assignment.output_subject(),
            input,
            hostfile,
            script,
        },
        cgroup,
    })
}

/// The job's environment; multi-node and distributed jobs also get the rendezvous variables
/// and a hostfile, whose path comes back to be removed when the job ends.
async fn environment_and_hostfile(
    assignment: &Assignment,
    key: &AttemptKey,
    node: &str,
    gpus: &[u32],
    stop_file: &Path,
) -> Result<(BTreeMap<String, String>, Option<PathBuf>), String> {
    let hostfile = match &assignment.placement.launch {
        Some(_) => Some(write_hostfile(key, node, &assignment.placement).await?),
        None => None,
    };
    let ranks = hostfile.as_ref().map(|path| RankInfo {
        placement: &assignment.placement,
        rank: assignment.rank,
        hostfile: path,
    });
    let spec = &assignment.spec;
    let environment = job_environment(spec, key, node, gpus, stop_file, ranks.as_ref());
    Ok((environment, hostfile))
}

/// Starts publishing the job's output, and passing it the input that arrives on
/// `subscription` (when it takes input).
fn carry_streams(
    ctx: &JobContext,
    key: &AttemptKey,
    rank: u32,
    streams: ConnectedIo,
    subscription: Option<Subscriber>,
    assignment: &Assignment,
) -> (OutputPipeline, Option<InputForwarder>) {
    // Rank 0 alone says why the attempt before this one stopped: the line is the job's, once.
    let preamble = (rank == 0)
        .then(|| restart_line(assignment.attempt, assignment.previous_stop.as_deref()))
        .flatten();
    let output = OutputPipeline::start(
        ctx.js.clone(),
        (key.clone(), assignment.output_subject()),
        rank,
        preamble,
        (streams.stdout, streams.stderr),
    );
    let input = match (subscription, streams.stdin) {
        (Some(subscription), Some(stdin)) => Some(InputForwarder::start(
            subscription,
            JobInput {
                stdin,
                resizer: streams.resizer,
            },
            key.clone(),
            assignment.input_keys.clone(),
        )),
        _ => None,
    };
    (output, input)
}

/// The subscription an interactive job's standard input arrives on.
async fn subscribe_input(ctx: &JobContext, key: &AttemptKey) -> Result<Subscriber, String> {
    ctx.client
        .subscribe(subjects::input(&key.job_id))
        .await
        .map_err(|err| {
            format!(
                "cannot receive the job's standard input on {}: {err}",
                ctx.node
            )
        })
}

/// The indices of the GPUs the placement gives this node (none when it names no GPU here).
fn gpus_on(placement: &Placement, node: &str) -> Vec<u32> {
    placement
        .gpus_on(node)
        .unwrap_or_default()
        .iter()
        .map(|g| g.index)
        .collect()
}

/// The spawned child's pid and the agent's ends of its streams. A freshly spawned child has
/// its pid and the pipes asked for; the checks only keep a broken invariant from becoming a
/// panic.
fn connect(
    child: &mut Child,
    io: JobIo,
    key: &AttemptKey,
    node: &str,
) -> Result<(u32, ConnectedIo), String> {
    let Some(pid) = child.id() else {
        return Err(format!(
            "the job's process on {node} ended before it could be watched"
        ));
    };
    match io.connect(child) {
        Ok(streams) => Ok((pid, streams)),
        Err(err) => {
            signal_group(pid, Signal::SIGKILL, key);
            Err(format!("cannot read the job's output on {node}: {err}"))
        }
    }
}

/// The state file's entry for a process just started.
fn recorded(key: &AttemptKey, pid: u32, cgroup: Option<&JobCgroup>) -> RecordedAttempt {
    RecordedAttempt {
        job_id: key.job_id.clone(),
        attempt: key.attempt,
        pid,
        started_at: mgpu_protocol::now(),
        boot_id: state_file::boot_id(),
        start_ticks: state_file::start_ticks(pid),
        // A pooled cgroup on v2 keeps its name: a successor must know it.
        cgroup: cgroup.filter(|c| c.is_pooled()).and_then(JobCgroup::name),
    }
}

impl StartedJob {
    /// Reports the start, waits for the end (stopping the job on its time limit or when
    /// asked), flushes its output and reports how it ended.
    pub async fn supervise(self) {
        let StartedJob {
            ctx,
            key,
            rank,
            mut child,
            pid,
            started,
            time_limit,
            warning_signal,
            mut stop_requests,
            stop_file,
            streams,
            cgroup,
        } = self;
        // Reported alongside the run, so a slow JetStream never delays a kill or time limit.
        let started_report = report_started(&ctx.reporter, &key, pid);
        // Checked: assignments are validated, but an overflowing `Instant + Duration` panics;
        // no deadline beats a dead agent.
        let time_limit_at = time_limit.and_then(|limit| started.checked_add(limit));
        let watch = Watch {
            key: &key,
            pid,
            kill_grace: ctx.kill_grace,
            time_limit_at,
            limit_warning: limit_warning(warning_signal, time_limit_at),
            notice: Notice {
                stop_file: Some(&stop_file),
                cgroup: cgroup.as_ref(),
            },
        };
        let mut ending = watch.until_exit(&mut child, &mut stop_requests).await;
        // The guard's fence beats the agent's own by up to its look interval, and its SIGTERM
        // ends the job before the agent's stop request names a reason.
        if ending.stopped == Stopped::default()
            && ctx.guard_fence.as_ref().is_some_and(GuardFence::lapsed)
        {
            ending.stopped.lost = true;
        }
        drop(stop_file);

        // Background processes the job left behind would keep its output pipes open forever.
        signal_group(pid, Signal::SIGKILL, &key);
        // And those that left its group (`setsid`, a daemon): the job has ended once its
        // cgroup is empty.
        let mut emptied = match cgroup {
            Some(cgroup) => cgroup.kill_all().await.unwrap_or_else(|err| {
                warn!(job = %key.job_id, attempt = key.attempt, "emptying the job's cgroup: {err}");
                Emptied::default()
            }),
            None => Emptied::default(),
        };
        ctx.host.cores.release(&key);
        ctx.host.holdings.remove(&key);
        emptied.usage.gpu_peak_mem = ctx.host.gpu_peaks.take(&key);
        // Up to the last heartbeat's sample: idleness is measured at that resolution.
        emptied.usage.idle_gpu_secs = ctx.table.take_idle_gpu_secs(&key);
        let (exit_code, signal) = exit_code_of(ending.status);
        let summary = streams.close(&ctx, &key, rank, exit_code).await;

        // The scheduler must see `started` before `exited`.
        let _ = started_report.await;
        info!(
            job = %key.job_id,
            attempt = key.attempt,
            exit_code,
            ?signal,
            cancelled = ending.stopped.cancelled,
            timed_out = ending.stopped.timed_out,
            preempted = ending.stopped.preempted,
            output_bytes = summary.bytes,
            output_chunks_lost = summary.lost_chunks,
            "job exited"
        );
        report_exit(&ctx, &key, &ending, emptied).await;
    }
}

/// Sends the `Started` report in its own task.
fn report_started(reporter: &Reporter, key: &AttemptKey, pid: u32) -> JoinHandle<bool> {
    let reporter = reporter.clone();
    let key = key.clone();
    tokio::spawn(async move { reporter.report(&key, ReportKind::Started { pid }).await })
}

impl Streams {
    /// Stops forwarding input, flushes the output, removes the hostfile and the batch script,
    /// and publishes the end of the output with the job's exit code (retried until stored).
    async fn close(
        self,
        ctx: &JobContext,
        key: &AttemptKey,
        rank: u32,
        exit_code: i32,
    ) -> OutputSummary {
        if let Some(input) = self.input {
            input.stop().await;
        }
        let summary = self.output.finish(key, OUTPUT_DRAIN_LIMIT).await;
        let mut eof_headers = output_headers(output::EOF, summary.next_seq, key.attempt, rank);
        if let Some(path) = &self.hostfile {
            let _ = tokio::fs::remove_file(path).await;
        }
        drop(self.script);
        eof_headers.insert(output::EXIT_CODE, exit_code.to_string());
        let eof = PublishMessage::build()
            .payload(Bytes::new())
            .headers(eof_headers)
            .message_id(format!("{}-{}-{}-eof", key.job_id, key.attempt, ctx.node));
        ctx.reporter
            .publish_until_stored(self.output_subject.clone(), eof, key, "output end")
            .await;
        summary
    }
}

/// Reports how the job ended, then forgets it: on disk only once the scheduler can learn how
/// it ended (otherwise the next agent reports it, as lost), in the table at once.
async fn report_exit(ctx: &JobContext, key: &AttemptKey, ending: &Ending, emptied: Emptied) {
    let (exit_code, signal) = exit_code_of(ending.status);
    let stopped = ending.stopped;
    let reported = ctx
        .reporter
        .report(
            key,
            ReportKind::Exited(Exit {
                exit_code,
                signal,
                cancelled: stopped.cancelled,
                timed_out: stopped.timed_out,
                preempted: stopped.preempted,
                lost: stopped.lost,
                out_of_memory: emptied.out_of_memory,
                usage: (!emptied.usage.is_empty()).then_some(emptied.usage),
            }),
        )
        .await;
    if reported {
        ctx.state.remove(key).await;
    }
    ctx.table.finish(key);
    ctx.heartbeat_now.notify_one();
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

#[cfg(test)]
mod tests {
    use mgpu_protocol::gpu_amount::GpuAmount;
    use mgpu_protocol::job::{GpuShare, NodeShare};

    use super::*;

    #[test]
    fn a_job_gets_the_gpus_placed_on_this_node_only() {
        let share = |index| GpuShare {
            index,
            amount: GpuAmount::ONE,
            mem_mib: 0,
        };
        let mut placement = Placement::single("a", vec![share(0), share(3)]);
        placement.peers.push(NodeShare {
            node: "b".into(),
            gpus: vec![share(1)],
        });
        assert_eq!(gpus_on(&placement, "a"), vec![0, 3]);
        assert_eq!(gpus_on(&placement, "b"), vec![1]);
        assert_eq!(gpus_on(&placement, "elsewhere"), Vec::<u32>::new());
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
