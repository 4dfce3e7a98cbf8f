//! `mgpu admin init`: the credentials directory with the scheduler's and an admin's keys, the
//! nats-server configuration (one server, or a cluster of them on this machine) and, with
//! `--tls`, the certificate authority and the server's certificate.

use std::path::{Path, PathBuf};

use crate::setup::auth::{self, RegistryFiles, Role};
use crate::setup::{files, tls};
use anyhow::{Context as _, Result, anyhow};
use clap::Args;

use super::registry::{load, save};
use crate::console::{self, println};
use crate::errors::plain;

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

    /// Port browsers (the web dashboard) connect to over WebSocket, 127.0.0.1 only, with the
    /// same keys and permissions (TLS with --tls); with --servers N, the first of N
    /// consecutive ports. Default: --port + 58 (4280).
    #[arg(long, value_name = "PORT", conflicts_with = "no_websocket")]
    pub websocket_port: Option<u16>,

    /// No WebSocket listener.
    #[arg(long)]
    pub no_websocket: bool,
}

impl InitArgs {
    /// The WebSocket port of server `index` (0 for the first), if any.
    fn websocket_port(&self, index: usize) -> Option<u16> {
        if self.no_websocket {
            return None;
        }
        let first = self
            .websocket_port
            .unwrap_or_else(|| self.port.saturating_add(auth::WEBSOCKET_PORT_OFFSET));
        first.checked_add(u16::try_from(index).ok()?)
    }
}

pub fn run(dir: &Path, args: &InitArgs) -> Result<()> {
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
    let services = [(Role::Scheduler, "scheduler"), (Role::Notify, "notify")];
    for (role, name) in services.into_iter().chain([(Role::Admin, "admin")]) {
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
    report(&Written {
        dir,
        keys,
        confs,
        certificates,
    })
}

/// What `init` wrote (or kept), for [`report`].
struct Written {
    dir: PathBuf,
    /// The scheduler's and the admin's key files.
    keys: Vec<(&'static str, PathBuf)>,
    /// Each server's configuration with its JetStream directory.
    confs: Vec<(PathBuf, PathBuf)>,
    certificates: Option<tls::Certificates>,
}

/// Says what was written, then how to start the servers and connect to them.
fn report(written: &Written) -> Result<()> {
    let Written {
        dir,
        keys,
        confs,
        certificates,
    } = written;
    println(&format!(
        "Wrote {}",
        dir.join(auth::REGISTRY_FILE).display()
    ))?;
    println(&format!(
        "Wrote {}",
        dir.join(auth::AUTH_CONF_FILE).display()
    ))?;
    for (conf, store) in confs {
        println(&format!(
            "Wrote {} (JetStream data in {})",
            conf.display(),
            store.display()
        ))?;
    }
    if let Some(certificates) = certificates {
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
    for (conf, _) in confs {
        println(&format!(
            "Start the server with: nats-server -c {}",
            conf.display()
        ))?;
    }
    if let Some(certificates) = certificates {
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
        _ => console::stderr_line(
            "warning: cannot read this host's name; the server certificate names only \
             localhost and --tls-host",
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
        let mut text = auth::render_server_conf(args.port, store_dir, &args.server_name, tls);
        text.push_str(&websocket_block(args, 0, tls));
        files::write_atomically(&conf, &text)
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
        let mut text = auth::render_cluster_server_conf(auth::CLUSTER_NAME, &members, index, tls)
            .ok_or_else(|| anyhow!("no cluster member {index}"))?;
        text.push_str(&websocket_block(args, index, tls));
        let conf = dir.join(auth::cluster_conf_file_name(index));
        files::write_atomically(&conf, &text)
            .with_context(|| format!("cannot write {}", conf.display()))?;
        written.push((conf, member.store_dir.clone()));
    }
    Ok(written)
}

/// Server `index`'s `websocket` block, or nothing with --no-websocket.
fn websocket_block(args: &InitArgs, index: usize, tls: Option<&tls::TlsFiles>) -> String {
    args.websocket_port(index)
        .map(|port| auth::render_websocket_block("127.0.0.1", port, tls))
        .unwrap_or_default()
}
