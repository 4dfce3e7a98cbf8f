//! Test harness: a real mgpu cluster on this machine, torn down on drop.
//!
//! [`Cluster::start`] writes credentials and a server config with the same code `mgpu admin
//! init` uses, starts a real `nats-server` on a free port with its own JetStream directory,
//! then the real `mgpu-scheduler` and `mgpu-node` binaries. Tests drive it through the real
//! `mgpu` CLI (its helpers are in `cli.rs`; for attacks and raw checks, an async-nats client).
//! Nothing is mocked.
//!
//! [`Cluster::start_with`] also passes flags to the scheduler (`--config FILE`, `--placement`,
//! `--missed-heartbeats`), [`NodeSpec::agent_args`] to an agent (`--mem-threshold`), and
//! [`NodeSpec::without_agent`] gives a node credentials but no agent, so a test can speak for it
//! (heartbeats describing GPUs busy with foreign processes, which declared GPUs never are).
//! [`Cluster::start_tls`] makes certificates as `mgpu admin init --tls` does and runs the server
//! with TLS required; every component (and [`Cluster::with_nats`]) is given the CA.
//! [`Cluster::start_with_sync`] runs the server with nats-server's default disk sync instead of
//! mgpu's `sync_interval: always`, for the benchmark that compares them.
//!
//! Failures are real too: [`Cluster::kill_agent`] and [`Cluster::kill_scheduler_named`] SIGKILL
//! one process and return once it is dead, [`Cluster::signal_agent`] sends SIGSTOP/SIGCONT, and
//! [`Cluster::start_standby_scheduler`] runs a second scheduler replica beside the first. Agents
//! keep their state files in `<cluster dir>/state`; at teardown, job processes a killed agent
//! left behind (recorded there) are killed, so no test leaks them.
//!
//! The binaries come from the cargo target directory the tests run from; `scripts/test.sh`
//! builds them first. The nats-server is `$MGPU_NATS_SERVER`, else `.tools/bin/nats-server`,
//! else the one on PATH.
//!
//! This file owns the cluster's processes (starting, killing and reaping them) and the small
//! helpers stories share; the principals' keys, the server configuration and NATS clients are
//! in `auth.rs`, the components' logs in `logs.rs`, the CLI helpers in `cli.rs`, the failures
//! stories cause in `faults.rs`, and clusters of several nats-servers in `nats_cluster.rs`.
//! `installed.rs` runs the services from their configuration files instead, as the packages'
//! units and `mgpu admin site` set them up.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use mgpu_cli::setup::auth::Role;
use serde_json::Value;

mod auth;
mod cli;
mod faults;
pub mod host_faults;
pub mod installed;
mod logs;
mod nats_cluster;
pub mod netns;
mod terminal;
pub mod web;

pub use auth::public_key_of;
pub use faults::process_running;
pub use logs::without_colours;
pub use terminal::{PaneExit, Terminal};

/// Heartbeat interval the agents use in tests (short, so node changes are seen quickly).
pub const HEARTBEAT: &str = "200ms";

/// One node agent to start.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub name: String,
    /// Declared GPUs, e.g. `1x24GiB`; empty: the host's own, read through NVML.
    pub gpus: String,
    /// Extra flags for its agent (`--mem-threshold 0.5`).
    pub agent_args: Vec<String>,
    /// False: the node gets credentials but no agent is started for it.
    pub agent: bool,
    /// Run jobs as their owners' Unix accounts (the agent's default as root). Off for most
    /// stories: they run as root with users that have no account here, so their agents run
    /// jobs as themselves (`MGPU_JOBS_AS_AGENT_USER`, `MGPU_ALLOW_ROOT_JOBS`).
    pub jobs_as_owners: bool,
}

impl NodeSpec {
    pub fn new(name: &str, gpus: &str) -> Self {
        NodeSpec {
            name: name.into(),
            gpus: gpus.into(),
            agent_args: Vec::new(),
            agent: true,
            jobs_as_owners: false,
        }
    }

    /// An agent that runs each job as its owner's Unix account.
    pub fn jobs_as_owners(mut self) -> Self {
        self.jobs_as_owners = true;
        self
    }

    /// A node the test speaks for itself (with [`Cluster::creds`] of `Role::Node`).
    pub fn without_agent(name: &str) -> Self {
        NodeSpec {
            agent: false,
            ..NodeSpec::new(name, "")
        }
    }

    pub fn agent_args(mut self, args: &[&str]) -> Self {
        self.agent_args = args.iter().map(|a| (*a).to_owned()).collect();
        self
    }
}

/// When the nats-server writes JetStream's messages to disk ([`Cluster::start_with_sync`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JetStreamSync {
    /// `sync_interval: always`: before acknowledging each one, as mgpu configures it.
    Always,
    /// nats-server's default: every two minutes.
    Default,
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub port: u16,
    /// The single server's WebSocket port (`ws://127.0.0.1:PORT`; `wss://` with TLS); unused
    /// on a NATS cluster.
    pub websocket_port: u16,
    auth_dir: PathBuf,
    nats: Option<Child>,
    /// Running scheduler replicas by name (`scheduler`, `scheduler-2`, …), oldest first.
    schedulers: Vec<(String, Child)>,
    agents: Vec<(String, Child)>,
    nodes: Vec<NodeSpec>,
    /// Flags every scheduler start gets, restarts included.
    scheduler_args: Vec<String>,
    /// Environment added to every `mgpu` run (a PATH with fake `python` and `conda`, say):
    /// jobs run with the environment captured at submit, so it reaches them too.
    cli_env: Vec<(String, String)>,
    /// Set when the cluster runs on several nats-servers ([`Cluster::start_on_nats_cluster`]).
    nats_cluster: Option<nats_cluster::NatsCluster>,
    /// The CA certificate when the server requires TLS ([`Cluster::start_tls`]).
    ca: Option<PathBuf>,
    /// Set when each component runs in a network namespace of its own
    /// ([`Cluster::start_in_namespaces`]).
    net: Option<std::sync::Arc<netns::Net>>,
    /// Where each agent's and scheduler's wall-clock offset file is, when clocks can be stepped
    /// ([`Cluster::step_clock`]).
    clocks: Option<PathBuf>,
}

/// Where the mgpu binaries are: the target directory of this test executable.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    // target/debug/deps/<test> → target/debug
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_default();
    // The job guard is its own workspace (services/job-guard), which scripts/setup.sh builds
    // on Linux x86_64; the stories run jobs under it, as a deployed agent does.
    let guard: &[&str] = if cfg!(all(target_os = "linux", target_arch = "x86_64")) {
        &["mgpu-job-guard"]
    } else {
        &[]
    };
    for bin in ["mgpu", "mgpu-scheduler", "mgpu-node"].iter().chain(guard) {
        assert!(
            dir.join(bin).exists(),
            "{} is missing: build first with scripts/setup.sh (scripts/test.sh does it)",
            dir.join(bin).display()
        );
    }
    dir
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The nats-server binary the tests start.
pub fn nats_server_bin() -> PathBuf {
    if let Ok(path) = std::env::var("MGPU_NATS_SERVER") {
        return PathBuf::from(path);
    }
    let local = repo_root().join(".tools/bin/nats-server");
    if local.exists() {
        return local;
    }
    PathBuf::from("nats-server")
}

/// A TCP port nothing listens on now (for a server a story starts: a nats-server, a
/// metrics endpoint). Drawn below the kernel's ephemeral range (32768 and up on Linux), where
/// a port the kernel hands to an outgoing connection meanwhile cannot take it before the
/// server binds it (a route port of a three-server cluster was lost that way), and never the
/// same twice in one test binary; a process-dependent start keeps binaries apart.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 10_000;
    const SPAN: u32 = 22_000;
    static HANDED_OUT: AtomicU32 = AtomicU32::new(0);
    let start = (std::process::id() % 100) * (SPAN / 100);
    for _ in 0..SPAN {
        let offset = (start + HANDED_OUT.fetch_add(1, Ordering::Relaxed)) % SPAN;
        let Ok(port) = u16::try_from(FIRST + offset) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

/// Waits until `check` returns Some, or panics with `what` after `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A timestamp field of a job's `show --json` (`started_at`, `ended_at`); panics when unset.
pub fn time_of(job: &Value, field: &str) -> chrono::DateTime<chrono::Utc> {
    job[field]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{field} missing in {job}"))
}

/// The GPU indices a job got, from its `show --json` (empty while queued).
pub fn gpus_of(job: &Value) -> Vec<u64> {
    job["gpus"]
        .as_array()
        .map(|g| g.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

/// Writes an executable script (a fake `python` or `conda` put first on a job's PATH).
pub fn write_executable(path: &Path, content: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, content).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// True while a process with this pid exists.
pub fn process_alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

impl Cluster {
    /// Server, scheduler and the given agents.
    pub fn start(nodes: &[NodeSpec]) -> Cluster {
        Cluster::start_with(nodes, &[])
    }

    /// Server, a scheduler started with `scheduler_args` (`--config FILE`, `--placement
    /// spread`), and the agents of the nodes that have one.
    pub fn start_with(nodes: &[NodeSpec], scheduler_args: &[&str]) -> Cluster {
        let mut cluster = Cluster::prepare(nodes, false);
        cluster.start_nats();
        cluster.start_all(scheduler_args);
        cluster
    }

    /// Like [`Cluster::start`], with a server that accepts only TLS connections, using a CA
    /// and server certificate made as `mgpu admin init --tls` makes them. Every component
    /// gets `MGPU_CA`.
    pub fn start_tls(nodes: &[NodeSpec]) -> Cluster {
        let mut cluster = Cluster::prepare(nodes, true);
        cluster.start_nats();
        cluster.start_all(&[]);
        cluster
    }

    /// Like [`Cluster::start`], with the server's JetStream syncing to disk as `sync` says:
    /// the benchmark measures what `sync_interval: always` (in every configuration mgpu
    /// writes) costs against nats-server's default.
    pub fn start_with_sync(nodes: &[NodeSpec], sync: JetStreamSync) -> Cluster {
        let mut cluster = Cluster::prepare(nodes, false);
        if sync == JetStreamSync::Default {
            auth::use_default_sync(&cluster.auth_dir);
        }
        cluster.start_nats();
        cluster.start_all(&[]);
        cluster
    }

    /// The scheduler, then every agent, waiting until the agents are online.
    fn start_all(&mut self, scheduler_args: &[&str]) {
        self.scheduler_args = scheduler_args.iter().map(|a| (*a).to_owned()).collect();
        self.start_scheduler();
        let with_agents: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| n.agent)
            .map(|n| n.name.clone())
            .collect();
        for name in &with_agents {
            self.start_agent(name);
        }
        self.wait_nodes_online(with_agents.len());
        // Listings read heartbeats straight from JetStream, so nodes show online before the
        // scheduler has loaded its state: a story starts once it acts, and hears what comes
        // next live.
        let log = self.log_path("scheduler");
        wait_for("the scheduler to be ready", Duration::from_secs(30), || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.contains("scheduler ready").then_some(())
        });
    }

    /// Only the nats-server, with credentials for the scheduler, `admin`, users `alice` and
    /// `bob`, and each node in `nodes`.
    pub fn server_only(nodes: &[NodeSpec]) -> Cluster {
        let mut cluster = Cluster::prepare(nodes, false);
        cluster.start_nats();
        cluster
    }

    /// Only the nats-server, its JetStream storage capped at `limit` (`1G`), as on a machine
    /// with little free disk.
    pub fn server_only_with_storage(nodes: &[NodeSpec], limit: &str) -> Cluster {
        let mut cluster = Cluster::prepare(nodes, false);
        auth::limit_jetstream_storage(&cluster.auth_dir, limit);
        cluster.start_nats();
        cluster
    }

    /// Credentials and a single-server configuration (requiring TLS with `tls`), nothing
    /// started yet.
    fn prepare(nodes: &[NodeSpec], tls: bool) -> Cluster {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        let auth_dir = dir.path().join("auth");
        auth::write_principals(&auth_dir, nodes);
        let ((port, websocket_port), ca) =
            auth::write_server_conf(&auth_dir, &dir.path().join("jetstream"), tls);
        std::fs::create_dir_all(dir.path().join("logs")).unwrap_or_else(|e| panic!("{e}"));
        Cluster {
            dir,
            port,
            websocket_port,
            auth_dir,
            nats: None,
            schedulers: Vec::new(),
            agents: Vec::new(),
            nodes: nodes.to_vec(),
            scheduler_args: Vec::new(),
            cli_env: Vec::new(),
            nats_cluster: None,
            ca,
            net: None,
            clocks: None,
        }
    }

    /// The network namespaces the components run in, when they do.
    pub fn net(&self) -> Option<&std::sync::Arc<netns::Net>> {
        self.net.as_ref()
    }

    /// Steps the wall clock of agent or scheduler `name` to `offset_secs` from the kernel's
    /// (0: back in step); false when clocks cannot be stepped here.
    pub fn step_clock(&self, name: &str, offset_secs: i64) -> bool {
        let Some(dir) = &self.clocks else {
            return false;
        };
        host_faults::write_offset(&dir.join(format!("{name}.offset")), offset_secs);
        true
    }

    /// The environment that lets [`Cluster::step_clock`] step component `name`'s wall clock,
    /// when clocks can be stepped (empty otherwise).
    fn fake_clock_env(&self, name: &str) -> Vec<(String, String)> {
        self.clocks.as_ref().map_or_else(Vec::new, |dir| {
            host_faults::fake_clock_env(&dir.join(format!("{name}.offset")))
        })
    }

    /// Makes `command` run in component `name`'s network namespace, when components have
    /// their own.
    fn place(&self, name: &str, command: &mut Command) {
        if let Some(net) = &self.net {
            net.place(name, command);
        }
    }

    /// Every server's URL, comma-separated, as the components are given it.
    pub fn server_url(&self) -> String {
        if let Some(servers) = &self.nats_cluster {
            return servers.urls();
        }
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn start_nats(&mut self) {
        let log = self.dir.path().join("logs").join("nats-server.log");
        // The log is appended to across restarts: this start is ready at its own line.
        let readies = |log: &Path| {
            std::fs::read_to_string(log)
                .unwrap_or_default()
                .matches("Server is ready")
                .count()
        };
        let ready_before = readies(&log);
        let child = Command::new(nats_server_bin())
            .arg("-c")
            .arg(self.auth_dir.join("server.conf"))
            .stdout(self.log("nats-server"))
            .stderr(self.log("nats-server"))
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {}: {e} (run scripts/setup.sh)",
                    nats_server_bin().display()
                )
            });
        self.nats = Some(child);
        let port = self.port;
        // Ready when the server started here says so and its port answers: a port that answers
        // alone may be another process's (in CI a story's first command once found nothing
        // listening on a port that had answered).
        wait_for("nats-server to be ready", Duration::from_secs(10), || {
            if let Some(child) = self.nats.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                let said = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("nats-server exited at start ({status}):\n{said}");
            }
            let ready = readies(&log) > ready_before;
            (ready && TcpStream::connect(("127.0.0.1", port)).is_ok()).then_some(())
        });
    }

    /// Starts the scheduler (named `scheduler`), with the flags given at [`Cluster::start_with`].
    pub fn start_scheduler(&mut self) {
        assert!(self.schedulers.is_empty(), "scheduler already running");
        self.spawn_scheduler("scheduler");
    }

    /// Starts the scheduler with `args` (after [`Cluster::server_only`]).
    pub fn start_scheduler_with(&mut self, args: &[&str]) {
        self.scheduler_args = args.iter().map(|a| (*a).to_owned()).collect();
        self.start_scheduler();
    }

    fn spawn_scheduler(&mut self, name: &str) {
        let mut command = Command::new(bin_dir().join("mgpu-scheduler"));
        self.set_ca_env(&mut command);
        self.place(name, &mut command);
        let child = command
            .args(&self.scheduler_args)
            .env("MGPU_SCHEDULER_CONFIG", self.empty_config())
            .env_remove("MGPU_LOG_FORMAT")
            .env("MGPU_SERVER", self.server_url())
            .env("MGPU_CREDS", self.creds(Role::Scheduler, "scheduler"))
            .env(
                "MGPU_PRINCIPALS",
                self.auth_dir.join(mgpu_protocol::principals::REGISTRY_FILE),
            )
            .env("RUST_LOG", "info")
            .envs(self.fake_clock_env(name))
            .stdout(self.log(name))
            .stderr(self.log(name))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        self.schedulers.push((name.to_owned(), child));
    }

    /// An empty config file the components are pointed at (`MGPU_SCHEDULER_CONFIG`,
    /// `MGPU_NODE_CONFIG`), so that this host's own `/etc/mgpu` never reaches a story; a
    /// story's `--config FILE` still wins, as a flag does over the environment.
    fn empty_config(&self) -> PathBuf {
        let path = self.dir.path().join("empty.toml");
        if !path.exists() {
            std::fs::write(&path, "").unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
        path
    }

    /// Process ids of the running scheduler replicas (the benchmark reads their memory).
    pub fn scheduler_pids(&self) -> Vec<u32> {
        self.schedulers
            .iter()
            .map(|(_, child)| child.id())
            .collect()
    }

    /// SIGKILLs every scheduler replica: no chance to clean up, as in a crash.
    pub fn kill_scheduler(&mut self) {
        for (_, mut child) in self.schedulers.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Components (schedulers and agents) whose process has exited, by name.
    pub fn exited_components(&mut self) -> Vec<String> {
        self.schedulers
            .iter_mut()
            .chain(self.agents.iter_mut())
            .filter_map(|(name, child)| {
                (!matches!(child.try_wait(), Ok(None))).then(|| name.clone())
            })
            .collect()
    }

    /// Where agents keep their state files (`<node>.json`).
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Starts the agent of a node declared at [`Cluster::start`].
    pub fn start_agent(&mut self, name: &str) {
        let spec = self
            .nodes
            .iter()
            .find(|n| n.name == name)
            .cloned()
            .unwrap_or_else(|| panic!("node {name} was not declared"));
        let mut command = Command::new(bin_dir().join("mgpu-node"));
        self.set_ca_env(&mut command);
        self.place(name, &mut command);
        // No inventory declared: the agent reads the host's GPUs through NVML.
        let declared: &[&str] = if spec.gpus.is_empty() {
            &[]
        } else {
            &["--gpus", &spec.gpus]
        };
        let child = command
            .args(["--node", &spec.name])
            .args(declared)
            .args(["--heartbeat-interval", HEARTBEAT, "--kill-grace", "2s"])
            .arg("--state-dir")
            .arg(self.state_dir())
            .args(&spec.agent_args)
            .env("MGPU_NODE_CONFIG", self.empty_config())
            .env_remove("MGPU_LOG_FORMAT")
            .env("MGPU_SERVER", self.server_url())
            .env("MGPU_CREDS", self.creds(Role::Node, name))
            // Stories lose nodes on purpose: fence (and requeue) within seconds, not the
            // production default of 10 s. A story may pass its own `--fence-after`.
            .env("MGPU_FENCE_AFTER", "2s")
            .env("RUST_LOG", "info")
            .envs(self.fake_clock_env(name))
            .stdout(self.log(name))
            .stderr(self.log(name))
            .envs(if spec.jobs_as_owners {
                Vec::new()
            } else {
                vec![
                    ("MGPU_JOBS_AS_AGENT_USER", "true"),
                    ("MGPU_ALLOW_ROOT_JOBS", "true"),
                ]
            })
            .spawn()
            .unwrap_or_else(|e| panic!("starting agent {name}: {e}"));
        self.agents.push((name.to_owned(), child));
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        // MGPU_TEST_DUMP_LOGS=1 shows them for a story that passed too (with --nocapture).
        if std::thread::panicking() || std::env::var_os("MGPU_TEST_DUMP_LOGS").is_some() {
            self.dump_logs();
        }
        for (_, child) in &mut self.agents {
            let pid = Pid::from_raw(child.id() as i32);
            // A frozen agent (a test that failed between SIGSTOP and SIGCONT) must run to stop.
            let _ = kill(pid, Signal::SIGCONT);
            let _ = kill(pid, Signal::SIGTERM);
        }
        for (_, child) in &mut self.agents {
            let deadline = Instant::now() + Duration::from_secs(8);
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        self.kill_orphaned_jobs();
        let schedulers = self.schedulers.drain(..).map(|(_, child)| child);
        for mut child in schedulers.chain(self.nats.take()) {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Before the directory goes: their JetStream disks are mounted in it.
        self.nats_cluster.take();
        self.net.take();
    }
}
