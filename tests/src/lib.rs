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

use std::collections::BTreeMap;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use mgpu_cli::setup::auth::{Registry, RegistryFiles, Role, render_server_conf};
use mgpu_cli::setup::tls::{ensure_certificates, server_hosts};
use mgpu_nats::connect::read_seed;
use mgpu_nats::records;
use mgpu_protocol::node::{NodeAdmin, NodeHeartbeat};
use mgpu_protocol::subjects;
use serde_json::Value;

mod cli;
mod faults;
mod nats_cluster;
pub use faults::process_running;

/// Heartbeat interval the agents use in tests (short, so node changes are seen quickly).
pub const HEARTBEAT: &str = "200ms";

/// One node agent to start.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub name: String,
    /// Declared GPUs, e.g. `1x24GiB`.
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

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub port: u16,
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

fn repo_root() -> PathBuf {
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

fn free_port() -> u16 {
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
    }

    /// Only the nats-server, with credentials for the scheduler, `admin`, users `alice` and
    /// `bob`, and each node in `nodes`.
    pub fn server_only(nodes: &[NodeSpec]) -> Cluster {
        let mut cluster = Cluster::prepare(nodes, false);
        cluster.start_nats();
        cluster
    }

    /// Credentials and a single-server configuration (requiring TLS with `tls`), nothing
    /// started yet.
    fn prepare(nodes: &[NodeSpec], tls: bool) -> Cluster {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        let auth_dir = dir.path().join("auth");
        let mut registry = Registry::default();
        let add = |registry: &mut Registry, role, name: &str| {
            registry
                .add(&auth_dir, role, name)
                .unwrap_or_else(|e| panic!("adding {name}: {e}"));
        };
        add(&mut registry, Role::Scheduler, "scheduler");
        add(&mut registry, Role::Admin, "admin");
        add(&mut registry, Role::User, "alice");
        add(&mut registry, Role::User, "bob");
        for node in nodes {
            add(&mut registry, Role::Node, &node.name);
        }
        registry
            .save(&auth_dir)
            .unwrap_or_else(|e| panic!("saving auth: {e}"));
        let certificates = tls.then(|| {
            ensure_certificates(&auth_dir, &server_hosts(&[]))
                .unwrap_or_else(|e| panic!("making certificates: {e}"))
        });
        let tls_files = certificates.as_ref().map(|c| &c.files);
        let port = free_port();
        let conf = render_server_conf(port, &dir.path().join("jetstream"), "mgpu-test", tls_files);
        std::fs::write(auth_dir.join("server.conf"), conf).unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir_all(dir.path().join("logs")).unwrap_or_else(|e| panic!("{e}"));
        Cluster {
            dir,
            port,
            auth_dir,
            nats: None,
            schedulers: Vec::new(),
            agents: Vec::new(),
            nodes: nodes.to_vec(),
            scheduler_args: Vec::new(),
            cli_env: Vec::new(),
            nats_cluster: None,
            ca: tls_files.map(|files| files.ca_file.clone()),
        }
    }

    /// The CA certificate clients must trust, when the server requires TLS.
    pub fn ca(&self) -> Option<&Path> {
        self.ca.as_deref()
    }

    /// Gives a component the CA when the server requires TLS, and otherwise makes sure an
    /// `MGPU_CA` from the developer's shell (`source .mgpu/env`) does not leak into it.
    fn set_ca_env(&self, command: &mut Command) {
        match &self.ca {
            Some(ca) => command.env("MGPU_CA", ca),
            None => command.env_remove("MGPU_CA"),
        };
    }

    /// Every server's URL, comma-separated, as the components are given it.
    pub fn server_url(&self) -> String {
        if let Some(servers) = &self.nats_cluster {
            return servers.urls();
        }
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The seed file of a principal.
    pub fn creds(&self, role: Role, name: &str) -> PathBuf {
        self.auth_dir
            .join("keys")
            .join(format!("{}-{name}.nk", role.as_str()))
    }

    pub fn user_creds(&self, name: &str) -> PathBuf {
        self.creds(Role::User, name)
    }

    pub fn admin_creds(&self) -> PathBuf {
        self.creds(Role::Admin, "admin")
    }

    fn log(&self, name: &str) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("logs").join(format!("{name}.log")))
            .unwrap_or_else(|e| panic!("log file: {e}"))
    }

    fn start_nats(&mut self) {
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
        wait_for("nats-server to listen", Duration::from_secs(10), || {
            TcpStream::connect(("127.0.0.1", port)).ok()
        });
    }

    /// Starts the scheduler (named `scheduler`), with the flags given at [`Cluster::start_with`].
    pub fn start_scheduler(&mut self) {
        assert!(self.schedulers.is_empty(), "scheduler already running");
        self.spawn_scheduler("scheduler");
    }

    fn spawn_scheduler(&mut self, name: &str) {
        let mut command = Command::new(bin_dir().join("mgpu-scheduler"));
        self.set_ca_env(&mut command);
        let child = command
            .args(&self.scheduler_args)
            .env("MGPU_SERVER", self.server_url())
            .env("MGPU_CREDS", self.creds(Role::Scheduler, "scheduler"))
            .env(
                "MGPU_PRINCIPALS",
                self.auth_dir.join(mgpu_protocol::principals::REGISTRY_FILE),
            )
            .env("RUST_LOG", "info")
            .stdout(self.log(name))
            .stderr(self.log(name))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        self.schedulers.push((name.to_owned(), child));
    }

    /// Process ids of the running scheduler replicas (the benchmark reads their memory).
    pub fn scheduler_pids(&self) -> Vec<u32> {
        self.schedulers
            .iter()
            .map(|(_, child)| child.id())
            .collect()
    }

    /// A component's log file (`scheduler`, `nats-server`, a node's name).
    pub fn log_path(&self, name: &str) -> PathBuf {
        self.dir.path().join("logs").join(format!("{name}.log"))
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
        let child = command
            .args(["--node", &spec.name, "--gpus", &spec.gpus])
            .args(["--heartbeat-interval", HEARTBEAT, "--kill-grace", "2s"])
            .arg("--state-dir")
            .arg(self.state_dir())
            .args(&spec.agent_args)
            .env("MGPU_SERVER", self.server_url())
            .env("MGPU_CREDS", self.creds(Role::Node, name))
            // Stories lose nodes on purpose: fence (and requeue) within seconds, not the
            // production default of 10 s. A story may pass its own `--fence-after`.
            .env("MGPU_FENCE_AFTER", "2s")
            .env("RUST_LOG", "info")
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

    /// Runs `work` with a NATS client connected with `creds`, on a runtime of its own: the
    /// stories are synchronous, and a few speak NATS directly (as a node, as an admin).
    pub fn with_nats<T, Fut>(&self, creds: &Path, work: impl FnOnce(async_nats::Client) -> Fut) -> T
    where
        Fut: std::future::Future<Output = T>,
    {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("tokio runtime: {e}"));
        runtime.block_on(async {
            let client = self.connect(&self.server_url(), creds).await;
            let result = work(client.clone()).await;
            let _ = client.flush().await;
            result
        })
    }

    /// A NATS client connected with `creds` to `urls` (comma-separated), as mgpu's own
    /// clients connect: for stories that keep one client across several steps.
    pub async fn connect(&self, urls: &str, creds: &Path) -> async_nats::Client {
        let seed = read_seed(creds).unwrap_or_else(|e| panic!("{e}"));
        // The inbox every mgpu client uses (users may subscribe to theirs only).
        let public_key = nkeys::KeyPair::from_seed(&seed)
            .map(|pair| pair.public_key())
            .unwrap_or_else(|e| panic!("{e}"));
        let mut options = async_nats::ConnectOptions::with_nkey(seed)
            .custom_inbox_prefix(mgpu_protocol::principals::inbox_prefix(&public_key));
        if let Some(ca) = &self.ca {
            options = options.require_tls(true).add_root_certificates(ca.clone());
        }
        options
            .connect(mgpu_nats::connect::server_list(urls))
            .await
            .unwrap_or_else(|e| panic!("connecting with {}: {e}", creds.display()))
    }

    /// Publishes a heartbeat as its node would (with that node's credentials), so a test can
    /// describe GPUs declared inventories never have: busy with processes mgpu did not start.
    pub fn publish_heartbeat(&self, beat: &NodeHeartbeat) {
        let payload = serde_json::to_vec(beat).unwrap_or_else(|e| panic!("{e}"));
        let subject = subjects::heartbeat(&beat.node);
        self.with_nats(&self.creds(Role::Node, &beat.node), |client| async move {
            let js = async_nats::jetstream::new(client);
            js.publish(subject, payload.into())
                .await
                .unwrap_or_else(|e| panic!("publishing a heartbeat: {e}"))
                .await
                .unwrap_or_else(|e| panic!("heartbeat not stored: {e}"));
        });
    }

    /// Drained nodes and paused GPUs as the scheduler recorded them (empty until it did).
    pub fn node_admin(&self) -> BTreeMap<String, NodeAdmin> {
        self.with_nats(&self.admin_creds(), |client| async move {
            let js = async_nats::jetstream::new(client);
            records::node_admin(&js).await.unwrap_or_default()
        })
    }

    /// Prints the component logs; call before failing to see what happened.
    ///
    /// The nats-servers' logs come first and mgpu's after them, and the warnings and errors
    /// of every log are repeated at the very end: a CI report that keeps only the head and
    /// the tail of a long output still shows what went wrong.
    pub fn dump_logs(&self) {
        let Ok(entries) = std::fs::read_dir(self.dir.path().join("logs")) else {
            return;
        };
        let mut logs: Vec<(bool, PathBuf, String)> = entries
            .flatten()
            .map(|entry| {
                let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
                let is_nats = text.contains("Starting nats-server");
                (!is_nats, entry.path(), text)
            })
            .collect();
        logs.sort();
        let mut complaints = Vec::new();
        for (_, path, text) in &logs {
            eprintln!("===== {} =====\n{text}", path.display());
            let name = path.file_stem().map(|n| n.to_string_lossy().into_owned());
            for line in text.lines().map(without_colours) {
                if ["WARN", "ERROR", "[ERR]", "[WRN]"]
                    .iter()
                    .any(|w| line.contains(w))
                {
                    complaints.push(format!("{}: {line}", name.as_deref().unwrap_or("?")));
                }
            }
        }
        let skipped = complaints.len().saturating_sub(MAX_COMPLAINTS_SHOWN);
        eprintln!("===== warnings and errors of every log ({skipped} earlier ones left out) =====");
        for line in &complaints[skipped..] {
            eprintln!("{line}");
        }
    }
}

/// How many warning and error lines [`Cluster::dump_logs`] repeats at the end.
const MAX_COMPLAINTS_SHOWN: usize = 150;

/// A log line without its terminal escape sequences (colour codes: `ESC [ … m`).
pub fn without_colours(line: &str) -> String {
    let mut plain = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // A sequence ends with its first letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
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
    }
}

#[cfg(test)]
mod log_line_tests {
    #[test]
    fn colour_codes_are_taken_out_of_log_lines() {
        assert_eq!(
            super::without_colours(
                "\u{1b}[2m2026-11-23T20:00:00Z\u{1b}[0m \u{1b}[33m WARN\u{1b}[0m x"
            ),
            "2026-11-23T20:00:00Z  WARN x"
        );
        assert_eq!(super::without_colours("plain"), "plain");
    }
}
