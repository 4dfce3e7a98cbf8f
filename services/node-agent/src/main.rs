//! `mgpu-node`, the mgpu node agent: one per GPU host. It reports the host's GPUs and running
//! jobs in heartbeats, runs the jobs the scheduler assigns to it, streams their output and
//! reports their starts and exits, all through NATS.
//!
//! This file owns the command line (merged with the config file by `mgpu-config`), startup
//! (GPU discovery, the state file, the address, connecting, reconciling what a previous agent
//! left running, starting the loops) and the shutdown sequence: on SIGTERM or SIGINT the agent
//! stops taking assignments, stops every job (each still reports its exit), sends a last
//! heartbeat and drains its connection.
//!
//! The other modules, by concern; their imports form no cycle (no module imports one that
//! imports it back, directly or through others):
//!
//! - startup: `cli` (flags, host facts), `address` (this node's address), `gpu_spec`
//!   (`COUNTxSIZE[:TYPE]`), `gpu_type` (GPU types from model names, the operator's types and
//!   the node's features), `gpu` (the `GpuProbe` trait, declared GPUs), `gpu_samples` (the
//!   `--gpu-samples` file declared GPUs read), `gpu_processes` (a GPU's processes: the jobs'
//!   or foreign), `nvml` (the NVML probe), `gpu_choice` (which probe, with the operator's
//!   types), `state_file` (attempts remembered on disk), `reconcile` (what a previous agent
//!   left running);
//! - loops: `heartbeat`, `fence` (self-fencing, the guards' contact file), `assignments` (the
//!   node's inbox), `running` (the attempts running here), `report` (reports retried until
//!   stored), `shutdown` (one-way signals), `throttle` (log throttling), `metrics` (what
//!   `--metrics-listen` serves to Prometheus), `holdings` (each job's user, GPUs, cgroup),
//!   `gpu_peaks` (each job's peak GPU memory) and `idle_tracker` (each job's GPU idleness);
//! - one job: `job` (start, supervise), `launch` (direct or through a shell), `script` (the
//!   shell script), `batch_script` (a script captured at submit), `environment` (its
//!   variables), `hostfile` (multi-node), `run_as` (whose account), `guard` (the guard it
//!   starts under; `guard_setup`: which, chosen at start; `guard_pool`: guards waiting in
//!   cgroups; `job_launch`: a pooled guard or a fresh one), `stopping` (time limit, kills),
//!   `output` and `input` (its streams);
//! - `builtin_guard`: this binary as a job's guard (`__mgpu-job-guard`), a driver of the
//!   guard's rules (`mgpu-guard-rules`, which `mgpu-job-guard` drives too).

mod address;
mod assignments;
mod batch_script;
mod builtin_guard;
mod cgroup;
mod cli;
mod environment;
mod fence;
mod gpu;
mod gpu_choice;
mod gpu_peaks;
mod gpu_processes;
mod gpu_samples;
mod gpu_spec;
mod gpu_type;
mod guard;
mod guard_pool;
mod guard_setup;
mod heartbeat;
mod holdings;
mod host;
mod hostfile;
mod idle_tracker;
mod input;
mod job;
mod job_command;
mod job_io;
mod job_launch;
mod launch;
mod lease;
mod metrics;
mod nvml;
mod output;
mod process_owner;
mod pty;
mod reconcile;
mod report;
mod run_as;
mod running;
mod script;
mod shutdown;
mod state_file;
mod stop_notice;
mod stop_state;
mod stopping;
mod throttle;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use mgpu_nats::connect::{ConnectTarget, connect_with};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};
use tracing::{debug, error, info, warn};

use crate::assignments::Dispatcher;
use crate::cli::Args;
use crate::guard_setup::Guards;
use crate::heartbeat::{Heartbeater, Identity, Thresholds};
use crate::job::JobContext;
use crate::report::Reporter;
use crate::running::{RunningTable, StopReason};
use crate::shutdown::Trigger;
use crate::state_file::{RecordedAttempt, StateFile};

/// Time allowed, beyond the kill grace, for stopped jobs to report their exits at shutdown.
const REPORT_MARGIN: Duration = Duration::from_secs(5);
/// Time allowed to flush what is still buffered for NATS when leaving.
const DRAIN_LIMIT: Duration = Duration::from_secs(5);

fn main() -> ExitCode {
    // A job whose guard is built in starts as this binary in guard mode (`builtin_guard`):
    // checked before anything else.
    if let Some(code) = builtin_guard::run_if_guard() {
        return code;
    }
    let loaded = mgpu_config::load_or_exit::<Args>(&cli::SERVICE);
    let args = loaded.args;
    if args.print_config {
        // Written, not `print!`ed: `--print-config | head` closes the pipe early, which is
        // the reader's choice and no reason to panic.
        let _ =
            std::io::Write::write_all(&mut std::io::stdout(), loaded.settings.render().as_bytes());
        return ExitCode::SUCCESS;
    }
    let node = match cli::node_name(&args) {
        Ok(node) => node,
        Err(err) => {
            eprintln!("error: {err:#}");
            return ExitCode::FAILURE;
        }
    };
    // async-nats logs every connection event at info; the agent logs them itself, once. In
    // JSON every line names the node, so that lines from many hosts can be told apart.
    let log_format = args.log_format;
    mgpu_config::logging::init(log_format, "info,async_nats=warn", &[("node", &node)]);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            let why = format_args!("cannot start the async runtime: {err}");
            mgpu_config::logging::fatal(log_format, &why);
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args, node)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            mgpu_config::logging::fatal(log_format, &format_args!("{err:#}"));
            ExitCode::FAILURE
        }
    }
}

/// Startup in the order that keeps the agent safe: it learns its GPUs (or only prints them),
/// opens its state file before connecting (an agent that cannot remember its jobs must not
/// take any), connects, sets up the guards' fencing, then runs until SIGTERM or SIGINT.
async fn run(args: Args, node: String) -> anyhow::Result<()> {
    let mut probe = gpu_choice::choose_probe(
        &node,
        args.gpus.as_ref(),
        args.fallback_gpus.as_ref(),
        args.gpu_samples.as_deref(),
        cli::type_overrides(&args)?,
    )?;
    if args.print_gpus {
        return cli::print_gpus(probe.as_mut());
    }
    let Some(creds) = args.creds.clone() else {
        return Err(anyhow!("--creds FILE (or MGPU_CREDS) is required"));
    };
    // The node's key also signs its job reports, so no other node can speak for it.
    let signer = mgpu_nats::connect::read_seed(&creds)
        .map_err(|err| anyhow!("{err}"))
        .and_then(|seed| {
            nkeys::KeyPair::from_seed(&seed)
                .map_err(|err| anyhow!("{}: not a valid nkey seed: {err}", creds.display()))
        })?;
    let state_dir = match args.state_dir.clone() {
        Some(dir) => dir,
        None => cli::default_state_dir()?,
    };
    // Before connecting: a taken address stops the agent at once.
    let metrics = match args.metrics_listen {
        Some(address) => Some(
            mgpu_metrics::http::bind(address)
                .await
                .with_context(|| format!("--metrics-listen {address}"))?,
        ),
        None => None,
    };
    let (state, left) = StateFile::open(&state_dir, &node)?;
    info!(file = %state.path().display(), unreported = left.len(), "state file opened");
    let address = match args.address.clone() {
        Some(address) => address,
        None => detect_address(&args.server).await?,
    };
    let client = connect(&args, creds, &node).await?;
    info!(node, server = args.server, address, "mgpu-node connected");
    // Before anything runs: a live agent already running as this node makes this one stop.
    let holder = lease::Holder::this_agent(cli::hostname().unwrap_or_else(|_| "?".to_owned()));
    let js = async_nats::jetstream::new(client.clone());
    let replicas = mgpu_nats::streams::Replicas::Auto.resolve(&args.server);
    let lease = lease::acquire(&js, &node, &holder, replicas).await?;

    let run_as = run_as::RunAsPolicy::new(args.jobs_as_agent_user, args.allow_root_jobs);
    let (containment, host) = contain(&args, &node, probe.as_mut());
    let mut identity = identity(&args, node, address, &run_as);
    identity.containment = Some(containment.describe());
    identity.gpu_isolation = containment.isolates_gpus();
    identity.cpus = Some(host.resources.cpus);
    identity.mem_host_mib = Some(host.resources.mem_mib);
    let guards = Guards::set_up(&args, &identity, &run_as, &state_dir)?;
    let taken: Vec<String> = left.iter().filter_map(|a| a.cgroup.clone()).collect();
    let pool = guard_pool::GuardPool::start(args.guard_pool, &guards.program, &containment, &taken);
    let memory = Memory {
        pool,
        state,
        left,
        guards,
        run_as,
        containment,
        host,
        lease: (holder, lease, replicas),
        metrics,
        signer: Arc::new(signer),
    };
    let agent = start_loops(client, identity, probe, memory);
    wait_for_stop_signal().await?;
    agent.shut_down().await;
    Ok(())
}

/// How jobs are contained here, and the host's cores and memory and GPU device minors the
/// jobs' cgroups are set up with.
fn contain(
    args: &Args,
    node: &str,
    probe: &mut dyn gpu::GpuProbe,
) -> (cgroup::Containment, Arc<host::JobHost>) {
    let containment =
        cgroup::Containment::detect(std::path::Path::new(cgroup::CGROUP_ROOT), args.cgroup, node);
    if containment.enabled() {
        info!(containment = containment.describe(), "jobs are contained");
    } else {
        warn!(
            containment = containment.describe(),
            "jobs are not contained by cgroups: a job that leaves its process group outlives it"
        );
    }
    let resources = host::HostResources::detect(args.cpus, args.mem_host);
    info!(
        cpus = resources.cpus,
        mem_host_mib = resources.mem_mib,
        "host resources offered to jobs"
    );
    let host = host::JobHost {
        resources,
        gpu_minors: probe.device_minors(),
        cores: host::CoreBook::default(),
        pins_cpus: containment.pins_cpus(),
        gpu_peaks: gpu_peaks::GpuPeaks::default(),
        holdings: holdings::Holdings::default(),
    };
    (containment, Arc::new(host))
}

/// This node's address as other nodes reach it, found from the route to the NATS servers
/// (which may block on name resolution, so off the async threads).
async fn detect_address(servers: &str) -> anyhow::Result<String> {
    let servers = servers.to_owned();
    tokio::task::spawn_blocking(move || address::detect(&servers, cli::hostname))
        .await
        .context("detecting this node's address")?
        .context("cannot tell this host's address; pass --address ADDR")
}

/// Connects to NATS as this node, logging connection events once each.
async fn connect(
    args: &Args,
    creds: std::path::PathBuf,
    node: &str,
) -> anyhow::Result<async_nats::Client> {
    let target = ConnectTarget {
        server: args.server.clone(),
        creds,
        ca: args.ca.clone(),
    };
    let options = async_nats::ConnectOptions::new().event_callback(|event| async move {
        match event {
            // Draining and closed are the agent's own shutdown.
            async_nats::Event::Connected
            | async_nats::Event::Draining
            | async_nats::Event::Closed => info!("NATS connection: {event}"),
            // Repeated on every reconnect try during an outage; `disconnected` already said it.
            async_nats::Event::ClientError(_) => debug!("NATS connection: {event}"),
            _ => warn!("NATS connection: {event}"),
        }
    });
    Ok(connect_with(&target, &format!("mgpu-node {node}"), options).await?)
}

/// What the heartbeats say about this node.
fn identity(args: &Args, node: String, address: String, run_as: &run_as::RunAsPolicy) -> Identity {
    Identity {
        node,
        address,
        runs_jobs_as: run_as.describe(),
        containment: None,
        gpu_isolation: false,
        cpus: None,
        mem_host_mib: None,
        interval: args.heartbeat_interval,
        thresholds: Thresholds {
            mem: args.mem_threshold,
            load: args.load_threshold,
        },
        labels: args.labels.iter().cloned().collect(),
        features: gpu_type::node_features(&args.features),
        fence_after: args.fence_after.resolve(args.heartbeat_interval),
        kill_grace: args.kill_grace,
    }
}

/// What the loops start from: the state file and what a previous agent left in it, the
/// guards (with the contact file they watch for self-fencing) and whose account jobs run as.
struct Memory {
    state: StateFile,
    left: Vec<RecordedAttempt>,
    guards: Guards,
    run_as: run_as::RunAsPolicy,
    containment: cgroup::Containment,
    host: Arc<host::JobHost>,
    pool: Option<Arc<guard_pool::GuardPool>>,
    /// This agent, the node-name lease it took at start (None: not yet), and the copies of
    /// the lease bucket it makes if it must.
    lease: (lease::Holder, Option<lease::NodeLease>, usize),
    /// Where `--metrics-listen` listens, if it was given.
    metrics: Option<tokio::net::TcpListener>,
    /// The node's key, which signs its job reports.
    signer: Arc<nkeys::KeyPair>,
}

/// Starts the heartbeat, then (once what a previous agent left running is stopped and
/// reported) the assignment loop.
fn start_loops(
    client: async_nats::Client,
    identity: Identity,
    probe: Box<dyn gpu::GpuProbe>,
    memory: Memory,
) -> Agent {
    let node = identity.node.clone();
    let kill_grace = identity.kill_grace;
    let js = async_nats::jetstream::new(client.clone());
    let (stop_taking_work, shutdown) = shutdown::signal();
    let (stop_heartbeats, heartbeat_stop) = shutdown::signal();
    let (give_up_reports, give_up) = shutdown::signal();
    let table = RunningTable::default();
    // Attempts ended under an agent of before: an assignment for one delivered again (its
    // acknowledgement was lost) is not run a second time.
    for ended in memory.state.ended() {
        table.finish(&ended);
    }
    let heartbeat_now = Arc::new(Notify::new());

    // Before the first heartbeat, so that it lists the jobs a previous agent left running.
    let leftovers = reconcile::survey(memory.left, &table);
    let contact = memory.guards.contact;
    if let Some(fence_after) = identity.fence_after {
        tokio::spawn(fence::watch(
            contact.clone(),
            fence_after,
            table.clone(),
            heartbeat_stop.clone(),
        ));
    }
    let heartbeater = Heartbeater::new(
        js.clone(),
        identity,
        probe,
        table.clone(),
        contact,
        memory.host.gpu_peaks.clone(),
    );
    if let Some(listener) = memory.metrics {
        let sources = metrics::Sources {
            node: node.clone(),
            readings: heartbeater.readings(),
            holdings: memory.host.holdings.clone(),
        };
        metrics::spawn(listener, sources);
    }
    let (holder, taken, replicas) = memory.lease;
    let lease = tokio::spawn(lease::hold(
        js.clone(),
        (node.clone(), replicas),
        holder,
        taken,
        heartbeat_stop.clone(),
    ));
    let heartbeat = tokio::spawn(heartbeater.run(heartbeat_now.clone(), heartbeat_stop));

    let ctx = JobContext {
        client: client.clone(),
        js: js.clone(),
        node: node.clone(),
        kill_grace,
        table: table.clone(),
        reporter: Reporter::new(js, node, give_up, memory.signer.clone()),
        state: memory.state,
        heartbeat_now,
        guard: memory.guards.program,
        guard_fence: memory.guards.fence,
        run_as: memory.run_as,
        containment: memory.containment,
        host: memory.host,
        pool: memory.pool.clone(),
    };
    let dispatcher = start_dispatcher(leftovers, ctx, shutdown);
    Agent {
        client,
        table,
        kill_grace,
        stop_taking_work,
        stop_heartbeats,
        give_up_reports,
        dispatcher,
        heartbeat,
        lease,
        pool: memory.pool,
    }
}

/// Settles what a previous agent left, then takes assignments until `shutdown` fires.
fn start_dispatcher(
    leftovers: reconcile::Leftovers,
    ctx: JobContext,
    shutdown: shutdown::Signal,
) -> JoinHandle<JoinSet<()>> {
    tokio::spawn(async move {
        let reconciled = reconcile::settle(leftovers, &ctx);
        tokio::select! {
            () = shutdown.fired() => {
                warn!("stopping before reconciliation finished; the next start finishes it");
                return JoinSet::new();
            }
            () = reconciled => {}
        }
        Dispatcher::new(ctx).run(shutdown).await
    })
}

/// The running agent: what shutdown needs to stop it in order.
struct Agent {
    client: async_nats::Client,
    table: RunningTable,
    kill_grace: Duration,
    stop_taking_work: Trigger,
    stop_heartbeats: Trigger,
    give_up_reports: Trigger,
    dispatcher: JoinHandle<JoinSet<()>>,
    heartbeat: JoinHandle<()>,
    /// Renews the node-name lease; gives it up once heartbeats stop.
    lease: JoinHandle<()>,
    /// Guards waiting for jobs: ended with the agent.
    pool: Option<Arc<guard_pool::GuardPool>>,
}

impl Agent {
    /// Stops taking assignments, stops every job and waits (bounded) for their exit reports,
    /// sends a last heartbeat and drains the connection.
    async fn shut_down(self) {
        info!("shutting down: no new assignments; stopping running jobs");
        self.stop_taking_work.fire();
        exit_at_second_signal();

        let mut jobs = match self.dispatcher.await {
            Ok(jobs) => jobs,
            Err(err) => {
                error!("the assignment loop failed: {err}");
                JoinSet::new()
            }
        };
        let stopping = self.table.request_stop_all(StopReason::AgentShutdown);
        if stopping > 0 {
            info!(
                jobs = stopping,
                "waiting for stopped jobs to report their exits"
            );
        }
        let report_limit = self.kill_grace + REPORT_MARGIN;
        if tokio::time::timeout(report_limit, join_all(&mut jobs))
            .await
            .is_err()
        {
            warn!(
                unreported = jobs.len(),
                "some jobs did not report their exits within {report_limit:?}; giving up on them"
            );
            self.give_up_reports.fire();
            // The reports notice within moments; whatever is left after that is abandoned.
            let _ = tokio::time::timeout(Duration::from_secs(1), join_all(&mut jobs)).await;
            jobs.shutdown().await;
        }

        if let Some(pool) = &self.pool {
            pool.close().await;
        }
        self.stop_heartbeats.fire();
        if let Err(err) = self.heartbeat.await {
            error!("the heartbeat loop failed: {err}");
        }
        if let Err(err) = self.lease.await {
            error!("the node-name lease loop failed: {err}");
        }
        match tokio::time::timeout(DRAIN_LIMIT, self.client.drain()).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => warn!("draining the NATS connection: {err}"),
            Err(_) => warn!("draining the NATS connection took longer than {DRAIN_LIMIT:?}"),
        }
        info!("mgpu-node stopped");
    }
}

async fn join_all(tasks: &mut JoinSet<()>) {
    while let Some(result) = tasks.join_next().await {
        if let Err(err) = result {
            error!("a job supervisor failed: {err}");
        }
    }
}

/// Waits for SIGTERM or SIGINT.
async fn wait_for_stop_signal() -> anyhow::Result<()> {
    let mut terminate = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
    tokio::select! {
        _ = terminate.recv() => info!("SIGTERM received"),
        _ = interrupt.recv() => info!("SIGINT received"),
    }
    Ok(())
}

/// A second SIGTERM or SIGINT during shutdown means "now": leave without waiting for reports.
fn exit_at_second_signal() {
    tokio::spawn(async {
        if wait_for_stop_signal().await.is_ok() {
            warn!("second stop signal: exiting without waiting for job reports");
            std::process::exit(1);
        }
    });
}
