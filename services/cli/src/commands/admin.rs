//! `mgpu admin`: credentials, the nats-server configuration, and mgpu's streams.
//!
//! Everything but `setup` works on the credentials directory alone, with no server running:
//! that is how a cluster gets its first configuration.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, Result, anyhow};
use clap::{Args, Subcommand};
use mgpu_cli::setup::auth::{self, Registry, RegistryFiles, Role};
use mgpu_cli::setup::{files, tls};
use mgpu_nats::streams::{self, Replicas, StreamSettings};
use mgpu_protocol::audit::AuditRecord;

use crate::console::{print, print_json, println};
use crate::errors::plain;
use crate::session::ConnectionArgs;
use crate::session::Session;
use crate::tables::Table;

#[derive(Debug, Args)]
pub struct AdminArgs {
    /// Credentials directory: principals.json, auth.conf, server.conf and keys/.
    #[arg(
        long,
        global = true,
        env = "MGPU_AUTH_DIR",
        default_value = ".mgpu/auth",
        value_name = "DIR"
    )]
    pub dir: PathBuf,

    #[command(subcommand)]
    pub command: AdminCommand,
}

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Create the credentials directory with the scheduler and admin keys, and a nats-server
    /// configuration. Safe to run again: existing keys are kept.
    Init(InitArgs),
    /// Add a user who may submit jobs (or, with --admin, an administrator).
    AddUser(AddUserArgs),
    /// Add a node whose agent may run jobs.
    AddNode(AddNodeArgs),
    /// List the principals the server knows.
    List(ListArgs),
    /// Remove a user or node: its key stops working once the server reloads its
    /// configuration (done here for the servers of `scripts/dev-up.sh`).
    Remove(RemoveArgs),
    /// Show the audit trail: every request the scheduler handled, who signed it, and whether
    /// it was carried out.
    Audit(AuditArgs),
    /// Create mgpu's JetStream streams and buckets (needs admin credentials).
    Setup(SetupArgs),
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// Port the server listens on (127.0.0.1 only); with --servers N, the first of N
    /// consecutive ports.
    #[arg(long, default_value_t = 4222)]
    pub port: u16,

    /// Where JetStream keeps its data (default: DIR/../jetstream); with --servers N, each
    /// server keeps its own in a subdirectory named after it.
    #[arg(long, value_name = "DIR")]
    pub store_dir: Option<PathBuf>,

    /// The server's name; with --servers N, servers are NAME-1, NAME-2, ….
    #[arg(long, default_value = "mgpu")]
    pub server_name: String,

    /// Servers in the NATS cluster, all on this machine: writes server.conf, server-2.conf, …
    /// Three keep every stream alive when any one of them dies.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=9))]
    pub servers: u16,

    /// With --servers N: the first of N consecutive ports the servers' routes listen on.
    #[arg(long, default_value_t = 6222)]
    pub cluster_port: u16,

    /// Serve clients (and, with --servers N, routes) over TLS only: creates a CA and a server
    /// certificate in DIR unless they exist; clients then need `--ca DIR/ca.pem` (MGPU_CA).
    /// Without it the configuration is written without TLS (certificates are kept).
    #[arg(long)]
    pub tls: bool,

    /// With --tls: another name or address clients reach the server by, for a new server
    /// certificate (localhost, 127.0.0.1, ::1 and this host's name are always in it). Repeatable.
    #[arg(long, value_name = "NAME", requires = "tls")]
    pub tls_host: Vec<String>,
}

#[derive(Debug, Args)]
pub struct SetupArgs {
    /// Copies of each stream and bucket: `auto` = min(3, distinct servers in --server), as
    /// the scheduler does, or 1 to 5. Existing streams are updated to this count.
    #[arg(long, default_value = "auto")]
    pub replicas: Replicas,
}

#[derive(Debug, Args)]
pub struct AddUserArgs {
    /// The user's login name (what `mgpu` finds in $USER).
    pub name: String,

    /// Make the principal an administrator, allowed everything.
    #[arg(long)]
    pub admin: bool,

    /// Also copy the key to this file (mode 0600), to hand to the user.
    #[arg(long, value_name = "PATH")]
    pub out: Option<PathBuf>,

    /// The Unix account this user's jobs run as on agents running as root (default: the
    /// account named like the user).
    #[arg(long, value_name = "ACCOUNT")]
    pub unix_user: Option<String>,
}

#[derive(Debug, Args)]
pub struct RemoveArgs {
    /// The user's or node's name.
    pub name: String,

    /// Remove the node of that name (when a user has the same name).
    #[arg(long)]
    pub node: bool,
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Only records from this long ago on: `1h`, `2d`, `90` (seconds). Default: a day.
    #[arg(long, value_name = "DUR", default_value = "1d")]
    pub since: String,

    /// Print one JSON object per line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct AddNodeArgs {
    /// The node's name, as its agent reports it.
    pub name: String,

    /// Also copy the key to this file (mode 0600), to install on the node.
    #[arg(long, value_name = "PATH")]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print an array of {name, role, public_key}.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(connection: &ConnectionArgs, args: &AdminArgs) -> Result<ExitCode> {
    match &args.command {
        AdminCommand::Init(init_args) => init(&args.dir, init_args)?,
        AdminCommand::AddUser(add) => {
            let role = if add.admin { Role::Admin } else { Role::User };
            add_principal(&args.dir, role, &add.name, add.out.as_deref())?;
            if let Some(account) = &add.unix_user {
                set_unix_user(&args.dir, role, &add.name, account)?;
            }
            reload_servers(&args.dir)?;
            let what = format!("added {} {}", role.as_str(), add.name);
            record_in_audit(connection, &args.dir, &add.name, what).await;
        }
        AdminCommand::AddNode(add) => {
            add_principal(&args.dir, Role::Node, &add.name, add.out.as_deref())?;
            reload_servers(&args.dir)?;
            record_in_audit(
                connection,
                &args.dir,
                &add.name,
                format!("added node {}", add.name),
            )
            .await;
        }
        AdminCommand::List(list_args) => list(&args.dir, list_args)?,
        AdminCommand::Remove(remove_args) => {
            remove(&args.dir, remove_args)?;
            reload_servers(&args.dir)?;
            let what = format!("removed {}", remove_args.name);
            record_in_audit(connection, &args.dir, &remove_args.name, what).await;
        }
        AdminCommand::Audit(audit_args) => audit(connection, audit_args).await?,
        AdminCommand::Setup(setup_args) => setup(connection, setup_args).await?,
    }
    Ok(ExitCode::SUCCESS)
}

fn load(dir: &Path) -> Result<Registry> {
    Registry::load(dir).with_context(|| format!("cannot read the registry in {}", dir.display()))
}

fn save(registry: &Registry, dir: &Path) -> Result<()> {
    registry
        .save(dir)
        .with_context(|| format!("cannot write the registry in {}", dir.display()))
}

fn init(dir: &Path, args: &InitArgs) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    // nats-server resolves relative paths against its own working directory, not ours.
    let dir = dir
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", dir.display()))?;
    let store_dir = match &args.store_dir {
        Some(given) => std::path::absolute(given)
            .with_context(|| format!("cannot resolve {}", given.display()))?,
        None => dir
            .parent()
            .map(|parent| parent.join("jetstream"))
            .unwrap_or_else(|| dir.join("jetstream")),
    };

    let mut registry = load(&dir)?;
    let mut keys = Vec::new();
    for (role, name) in [(Role::Scheduler, "scheduler"), (Role::Admin, "admin")] {
        let path = registry.add(&dir, role, name).map_err(plain)?;
        keys.push((name, path));
    }
    save(&registry, &dir)?;
    let certificates = if args.tls {
        Some(ensure_certificates(&dir, &args.tls_host)?)
    } else {
        None
    };
    let confs = write_server_confs(
        &dir,
        &store_dir,
        args,
        certificates.as_ref().map(|c| &c.files),
    )?;

    println(&format!(
        "Wrote {}",
        dir.join(auth::REGISTRY_FILE).display()
    ))?;
    println(&format!(
        "Wrote {}",
        dir.join(auth::AUTH_CONF_FILE).display()
    ))?;
    for (conf, store) in &confs {
        println(&format!(
            "Wrote {} (JetStream data in {})",
            conf.display(),
            store.display()
        ))?;
    }
    if let Some(certificates) = &certificates {
        if certificates.written.is_empty() {
            println("Kept the existing TLS certificates")?;
        }
        for path in &certificates.written {
            println(&format!("Wrote {}", path.display()))?;
        }
    }
    for (name, path) in keys {
        println(&format!("Key for {name}: {}", path.display()))?;
    }
    for (conf, _) in &confs {
        println(&format!(
            "Start the server with: nats-server -c {}",
            conf.display()
        ))?;
    }
    if let Some(certificates) = &certificates {
        println(&format!(
            "Clients connect with TLS given --ca {0} (or MGPU_CA={0})",
            certificates.files.ca_file.display()
        ))?;
    }
    Ok(())
}

/// The CA and server certificate in `dir`, made unless they exist; the server certificate
/// names this host and every `--tls-host` besides the local names.
fn ensure_certificates(dir: &Path, extra_hosts: &[String]) -> Result<tls::Certificates> {
    let mut hosts = Vec::new();
    // Without a host name the certificate still serves local clients; say so, do not fail.
    match nix::unistd::gethostname().map(|name| name.into_string()) {
        Ok(Ok(name)) => hosts.push(name),
        _ => eprintln!(
            "warning: cannot read this host's name; the server certificate names only \
             localhost and --tls-host"
        ),
    }
    hosts.extend(extra_hosts.iter().cloned());
    tls::ensure_certificates(dir, &tls::server_hosts(&hosts))
        .map_err(plain)
        .with_context(|| format!("cannot set up TLS in {}", dir.display()))
}

/// Writes `server.conf` (and, for a cluster, `server-2.conf`, …), returning each file with its
/// JetStream directory.
fn write_server_confs(
    dir: &Path,
    store_dir: &Path,
    args: &InitArgs,
    tls: Option<&tls::TlsFiles>,
) -> Result<Vec<(PathBuf, PathBuf)>> {
    if args.servers <= 1 {
        let conf = dir.join("server.conf");
        files::write_atomically(
            &conf,
            &auth::render_server_conf(args.port, store_dir, &args.server_name, tls),
        )
        .with_context(|| format!("cannot write {}", conf.display()))?;
        return Ok(vec![(conf, store_dir.to_path_buf())]);
    }
    let members = auth::local_cluster(
        args.servers,
        args.port,
        args.cluster_port,
        store_dir,
        &args.server_name,
    );
    let mut written = Vec::new();
    for (index, member) in members.iter().enumerate() {
        let text = auth::render_cluster_server_conf(auth::CLUSTER_NAME, &members, index, tls)
            .ok_or_else(|| anyhow!("no cluster member {index}"))?;
        let conf = dir.join(auth::cluster_conf_file_name(index));
        files::write_atomically(&conf, &text)
            .with_context(|| format!("cannot write {}", conf.display()))?;
        written.push((conf, member.store_dir.clone()));
    }
    Ok(written)
}

fn add_principal(dir: &Path, role: Role, name: &str, out: Option<&Path>) -> Result<()> {
    let mut registry = load(dir)?;
    let existed = registry.find(role, name).is_some();
    let key = registry.add(dir, role, name).map_err(plain)?;
    save(&registry, dir)?;
    let what = role.as_str();
    if existed {
        println(&format!(
            "{what} {name} already exists; key: {}",
            key.display()
        ))?;
    } else {
        println(&format!("Added {what} {name}; key: {}", key.display()))?;
    }
    if let Some(out) = out {
        let seed = std::fs::read_to_string(&key)
            .with_context(|| format!("cannot read {}", key.display()))?;
        files::write_secret(out, &seed)
            .with_context(|| format!("cannot write {}", out.display()))?;
        println(&format!("Copied the key to {} (mode 0600)", out.display()))?;
    }
    Ok(())
}

/// Adds a credentials change to the audit trail when a server is reachable with these
/// credentials (the change itself needs none: it is made in files). Says so when it is not.
async fn record_in_audit(connection: &ConnectionArgs, dir: &Path, target: &str, detail: String) {
    if connection.creds.is_none() {
        let _ = println("(not in the audit trail: no credentials to reach an mgpu server)");
        return;
    }
    // A fresh connection can miss a server busy reloading its configuration: a few tries.
    for attempt in 0..3 {
        let recorded = async {
            let session = Session::connect(connection).await?;
            let key = session.key.public_key();
            // The signer's name as the credentials directory knows it.
            let by = Registry::load(dir)
                .ok()
                .and_then(|registry| registry.by_key(&key).map(|p| p.name.clone()));
            let record = AuditRecord {
                at: mgpu_protocol::now(),
                action: "admin".into(),
                by,
                key: Some(key),
                target: Some(target.to_owned()),
                accepted: true,
                detail: detail.clone(),
            };
            let payload = serde_json::to_vec(&record)?;
            session
                .js
                .publish(mgpu_protocol::subjects::audit("admin"), payload.into())
                .await?
                .await?;
            Ok::<(), anyhow::Error>(())
        };
        let timeout = std::time::Duration::from_secs(5);
        if let Ok(Ok(())) = tokio::time::timeout(timeout, recorded).await {
            return;
        }
        if attempt < 2 {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
    }
    let _ = println("(not in the audit trail: no mgpu server reachable with these credentials)");
}

/// Records the Unix account a user's jobs run as.
fn set_unix_user(dir: &Path, role: Role, name: &str, account: &str) -> Result<()> {
    let valid = !account.is_empty()
        && account.len() <= 32
        && account
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if !valid {
        return Err(anyhow!(
            "`{account}` is not a Unix account name (letters, digits, `-`, `_`, `.`)"
        ));
    }
    let mut registry = load(dir)?;
    if let Some(principal) = registry
        .principals
        .iter_mut()
        .find(|p| p.role == role && p.name == name)
    {
        principal.unix_user = Some(account.to_owned());
    }
    save(&registry, dir)?;
    println(&format!(
        "{name}'s jobs run as Unix account {account} (on agents running as root)"
    ))?;
    Ok(())
}

/// Removes a user or node and its key file.
fn remove(dir: &Path, args: &RemoveArgs) -> Result<()> {
    let mut registry = load(dir)?;
    let matches = |p: &auth::Principal| {
        p.name == args.name
            && if args.node {
                p.role == Role::Node
            } else {
                matches!(p.role, Role::User | Role::Admin)
            }
    };
    let Some(index) = registry.principals.iter().position(matches) else {
        let what = if args.node { "node" } else { "user" };
        return Err(anyhow!(
            "no {what} named {} in {} (see `mgpu admin list`)",
            args.name,
            dir.display()
        ));
    };
    let principal = registry.principals.remove(index);
    if principal.role == Role::Admin && !registry.principals.iter().any(|p| p.is_admin()) {
        return Err(anyhow!(
            "{} is the last admin; add another admin first",
            principal.name
        ));
    }
    save(&registry, dir)?;
    let key = dir.join(auth::KEYS_DIR).join(principal.key_file_name());
    match std::fs::remove_file(&key) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(anyhow!("cannot delete {}: {err}", key.display())),
    }
    println(&format!(
        "Removed {} {}; deleted {}",
        principal.role.as_str(),
        principal.name,
        key.display()
    ))?;
    Ok(())
}

/// Makes running nats-servers re-read `auth.conf` (SIGHUP: a configuration reload keeps every
/// connection open). The servers found are those whose pid files `scripts/dev-up.sh` keeps
/// next to the credentials directory; others are named in a hint.
fn reload_servers(dir: &Path) -> Result<()> {
    let run_dir = dir
        .canonicalize()
        .ok()
        .and_then(|d| d.parent().map(|p| p.join("run")));
    let mut reloaded = 0;
    if let Some(run_dir) = run_dir
        && let Ok(entries) = std::fs::read_dir(&run_dir)
    {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !(name.starts_with("nats-server") && name.ends_with(".pid")) {
                continue;
            }
            let pid = std::fs::read_to_string(entry.path())
                .ok()
                .and_then(|text| text.trim().parse::<i32>().ok());
            // A stale pid file may name some other process by now: signal only nats-server.
            let is_nats_server = |pid: i32| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|comm| comm.trim() == "nats-server")
            };
            if let Some(pid) = pid
                && is_nats_server(pid)
                && nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGHUP,
                )
                .is_ok()
            {
                reloaded += 1;
            }
        }
    }
    if reloaded > 0 {
        println(&format!(
            "Reloaded the configuration of {reloaded} running nats-server(s); connections stay open"
        ))?;
    } else {
        println(
            "Make running nats-servers pick this up: `nats-server --signal reload` (or SIGHUP).",
        )?;
    }
    Ok(())
}

/// Prints the audit records of the last `--since`.
async fn audit(connection: &ConnectionArgs, args: &AuditArgs) -> Result<()> {
    use async_nats::jetstream::consumer;
    use futures::StreamExt;
    let since = mgpu_protocol::duration::parse_duration(&args.since).map_err(plain)?;
    let start = mgpu_protocol::now()
        - chrono::Duration::from_std(since).unwrap_or_else(|_| chrono::Duration::days(1));
    let start_time = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(
        start.timestamp_nanos_opt().unwrap_or(0),
    ))
    .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let session = Session::connect(connection).await?;
    let stream = session
        .js
        .get_stream(mgpu_protocol::subjects::AUDIT_STREAM)
        .await
        .map_err(crate::errors::lookup)?;
    let consumer = mgpu_nats::records::create_reader("reading the audit trail", || {
        stream.create_consumer(consumer::pull::OrderedConfig {
            deliver_policy: consumer::DeliverPolicy::ByStartTime { start_time },
            ..Default::default()
        })
    })
    .await
    .map_err(plain)?;
    let pending = consumer.cached_info().num_pending;
    let mut table = Table::new(["TIME", "ACTION", "BY", "TARGET", "OUTCOME", "DETAIL"]);
    if pending > 0 {
        let mut messages = consumer.messages().await.map_err(plain)?;
        while let Some(message) = messages.next().await {
            let message = message.map_err(plain)?;
            let left = message.info().map_err(plain)?.pending;
            if let Ok(record) = serde_json::from_slice::<AuditRecord>(&message.payload) {
                if args.json {
                    println(&serde_json::to_string(&record)?)?;
                } else {
                    table.row(vec![
                        record.at.format("%Y-%m-%d %H:%M:%S").to_string(),
                        record.action.clone(),
                        record
                            .by
                            .clone()
                            .or_else(|| {
                                record
                                    .key
                                    .as_ref()
                                    .map(|k| format!("key {}…", &k[..k.len().min(12)]))
                            })
                            .unwrap_or_else(|| "unsigned".into()),
                        record.target.clone().unwrap_or_default(),
                        if record.accepted { "done" } else { "refused" }.to_owned(),
                        record.detail.clone(),
                    ]);
                }
            }
            if left == 0 {
                break;
            }
        }
    }
    if !args.json {
        if pending == 0 {
            println(&format!("No audit records in the last {}.", args.since))?;
        } else {
            print(&table.render())?;
        }
    }
    Ok(())
}

fn list(dir: &Path, args: &ListArgs) -> Result<()> {
    let registry = load(dir)?;
    if args.json {
        return print_json(&registry.principals);
    }
    if registry.principals.is_empty() {
        println(&format!(
            "No principals in {} (create them with `mgpu admin init`).",
            dir.display()
        ))?;
        return Ok(());
    }
    let mut table = Table::new(["NAME", "ROLE", "PUBLIC KEY"]);
    for principal in &registry.principals {
        table.row(vec![
            principal.name.clone(),
            principal.role.as_str().to_owned(),
            principal.public_key.clone(),
        ]);
    }
    print(&table.render())?;
    Ok(())
}

async fn setup(connection: &ConnectionArgs, args: &SetupArgs) -> Result<()> {
    let session = Session::connect(connection).await?;
    let settings = StreamSettings {
        replicas: args.replicas.resolve(&connection.server),
        ..StreamSettings::default()
    };
    streams::ensure(&session.js, &settings)
        .await
        .map_err(plain)
        .map_err(|err| anyhow!("{err:#} (are these admin credentials?)"))?;
    println(&format!(
        "mgpu streams ready ({} replica(s) each)",
        settings.replicas
    ))?;
    Ok(())
}
