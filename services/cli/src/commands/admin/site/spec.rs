//! The site description `mgpu admin site` reads (`site.toml`), and what makes one valid: every
//! name usable as a principal, every host usable as a host name and a directory, no host given
//! two agents, and TLS wherever servers route to each other across hosts.
//!
//! ```toml
//! tls = true                     # clients and routes speak TLS only (a CA is made)
//! users = ["alice", "bob"]       # may submit jobs (their jobs run as the Unix account alike)
//! admins = ["carol"]             # may do anything
//! viewers = ["wall"]             # read-only: nodes, GPUs, the queue, public output (a
//!                                # wall screen's web dashboard)
//!
//! [[server]]                     # one or more nats-servers (three form a cluster)
//! name = "mgpu-1"                # server_name, unique
//! host = "head.lab"              # how the other hosts reach it
//! port = 4222                    # client port (default 4222)
//! cluster_port = 6222            # route port, with several servers (default 6222)
//! store_dir = "/var/lib/nats/jetstream"   # JetStream's data (the default)
//!
//! [[node]]                       # one per GPU host
//! name = "gpu01"                 # the node's name in mgpu
//! host = "gpu01.lab"             # default: the name
//! gpus = "2x24GiB"               # declared GPUs; default: read through NVML
//! config = { cpus = 32 }         # more keys for its node.toml, as given
//!
//! [scheduler]
//! hosts = ["head.lab"]           # where mgpu-scheduler runs (default: the first server's
//!                                # host); two hosts: an active scheduler and a standby
//! config = { placement = "spread" }   # more keys for scheduler.toml, as given
//!
//! [notify]
//! host = "head.lab"              # where mgpu-notify runs, one host only (default: the first
//!                                # scheduler host)
//! config = { notify = { smtp = "smtp://mail.lab:25" } }   # more keys for notify.toml
//! ```

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, anyhow, bail};
use serde::Deserialize;

use crate::setup::auth::validate_principal_name;

/// Directory names in the output that hold no host: a host may not be called so.
pub const RESERVED: [&str; 2] = ["auth", "users"];

/// Where the JetStream data of a server goes when `store_dir` is not given: the state
/// directory of the example nats-server unit (`packaging/nats-server/nats-server.service`).
pub const DEFAULT_STORE_DIR: &str = "/var/lib/nats/jetstream";

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Site {
    #[serde(default)]
    pub tls: bool,
    #[serde(default)]
    pub users: Vec<String>,
    #[serde(default)]
    pub admins: Vec<String>,
    /// Read-only principals: a wall screen showing the web dashboard.
    #[serde(default)]
    pub viewers: Vec<String>,
    #[serde(rename = "server", default)]
    pub servers: Vec<Server>,
    #[serde(rename = "node", default)]
    pub nodes: Vec<Node>,
    #[serde(default)]
    pub scheduler: Scheduler,
    #[serde(default)]
    pub notify: Notify,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Server {
    pub name: String,
    pub host: String,
    #[serde(default = "default_port")]
    pub port: u16,
    #[serde(default = "default_cluster_port")]
    pub cluster_port: u16,
    #[serde(default = "default_store_dir")]
    pub store_dir: PathBuf,
    /// Where browsers (the web dashboard) connect over WebSocket; 0 for none.
    #[serde(default = "default_websocket_port")]
    pub websocket_port: u16,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    pub name: String,
    pub host: Option<String>,
    pub gpus: Option<String>,
    /// More keys for this node's `node.toml` (`labels`, `cpus`, …), written as given.
    #[serde(default)]
    pub config: toml::Table,
}

impl Node {
    /// The host the agent runs on: `host`, else the node's name.
    pub fn host(&self) -> &str {
        self.host.as_deref().unwrap_or(&self.name)
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scheduler {
    #[serde(default)]
    pub hosts: Vec<String>,
    /// More keys for `scheduler.toml` (the policy: `placement`, `max_job_time`, …), written
    /// as given.
    #[serde(default)]
    pub config: toml::Table,
}

/// The notification service (`mgpu-notify`): one instance per site, as two would each deliver.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Notify {
    pub host: Option<String>,
    /// More keys for `notify.toml` (`time80_interval`, the `[notify]` section with `smtp`,
    /// `from`, `max_per_minute`), written as given.
    #[serde(default)]
    pub config: toml::Table,
}

fn default_port() -> u16 {
    4222
}

fn default_cluster_port() -> u16 {
    6222
}

fn default_websocket_port() -> u16 {
    4280
}

fn default_store_dir() -> PathBuf {
    PathBuf::from(DEFAULT_STORE_DIR)
}

impl Site {
    /// Reads and checks a site description.
    pub fn load(path: &Path) -> Result<Site> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        Site::parse(&text).with_context(|| format!("in {}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Site> {
        let site: Site = toml::from_str(text).map_err(|e| anyhow!("{}", e.to_string().trim()))?;
        site.check()?;
        Ok(site)
    }

    /// The hosts that run mgpu-scheduler: as given, else the first server's.
    pub fn scheduler_hosts(&self) -> Vec<String> {
        if self.scheduler.hosts.is_empty() {
            self.servers
                .iter()
                .take(1)
                .map(|s| s.host.clone())
                .collect()
        } else {
            self.scheduler.hosts.clone()
        }
    }

    /// The host that runs mgpu-notify: as given, else the first scheduler host.
    pub fn notify_host(&self) -> Option<String> {
        match &self.notify.host {
            Some(host) => Some(host.clone()),
            None => self.scheduler_hosts().into_iter().next(),
        }
    }

    /// Every host that gets files, each once, in a stable order.
    pub fn hosts(&self) -> BTreeSet<String> {
        self.servers
            .iter()
            .map(|s| s.host.clone())
            .chain(self.nodes.iter().map(|n| n.host().to_owned()))
            .chain(self.scheduler_hosts())
            .chain(self.notify_host())
            .collect()
    }

    /// The URLs every client is given: each server's, comma-separated.
    pub fn server_urls(&self) -> String {
        let urls: Vec<String> = self
            .servers
            .iter()
            .map(|s| {
                let host = if s.host.contains(':') {
                    format!("[{}]", s.host)
                } else {
                    s.host.clone()
                };
                format!("nats://{host}:{}", s.port)
            })
            .collect();
        urls.join(",")
    }

    fn check(&self) -> Result<()> {
        if self.servers.is_empty() {
            bail!("a site needs at least one [[server]]");
        }
        if self.servers.len() > 1 && !self.tls {
            bail!(
                "{} servers route to each other across hosts: set `tls = true`, so that only \
                 servers holding a certificate of the site's CA can join the cluster",
                self.servers.len()
            );
        }
        unique("server name", self.servers.iter().map(|s| s.name.as_str()))?;
        for server in &self.servers {
            validate_principal_name(&server.name).map_err(|e| anyhow!("server name: {e}"))?;
            check_host(&server.host)?;
            if !server.store_dir.is_absolute() {
                bail!(
                    "server {}: store_dir must be an absolute path, not {}",
                    server.name,
                    server.store_dir.display()
                );
            }
        }
        unique("node name", self.nodes.iter().map(|n| n.name.as_str()))?;
        unique("node host", self.nodes.iter().map(Node::host))?;
        for node in &self.nodes {
            validate_principal_name(&node.name).map_err(|e| anyhow!("node name: {e}"))?;
            check_host(node.host())?;
        }
        for host in &self.scheduler.hosts {
            check_host(host)?;
        }
        unique(
            "scheduler host",
            self.scheduler.hosts.iter().map(String::as_str),
        )?;
        if let Some(host) = &self.notify.host {
            check_host(host)?;
        }
        let people = self.users.iter().chain(&self.admins).chain(&self.viewers);
        unique("user, admin or viewer", people.clone().map(String::as_str))?;
        for name in people {
            validate_principal_name(name).map_err(|e| anyhow!("user: {e}"))?;
        }
        Ok(())
    }
}

/// Fails naming the first value that appears twice.
fn unique<'a>(what: &str, values: impl Iterator<Item = &'a str>) -> Result<()> {
    let mut seen = BTreeSet::new();
    for value in values {
        if !seen.insert(value) {
            bail!("{what} `{value}` appears twice");
        }
    }
    Ok(())
}

/// A host name (letters, digits, `-`, `.`) or an IP address: it names the host's directory in
/// the output and, for servers, the address in every URL and the server certificate.
fn check_host(host: &str) -> Result<()> {
    let ip = host.parse::<std::net::IpAddr>().is_ok();
    let name = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    if !ip && !name {
        bail!("`{host}` is not a host name or an IP address");
    }
    if RESERVED.contains(&host) {
        bail!("a host may not be called `{host}`: the output keeps its own files there");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = r#"
        users = ["alice", "bob"]
        admins = ["carol"]
        [[server]]
        name = "mgpu-1"
        host = "head"
        [[node]]
        name = "gpu01"
        gpus = "2x24GiB"
        [[node]]
        name = "gpu02"
        host = "gpu02.lab"
    "#;

    #[test]
    fn a_small_site_reads_with_its_defaults() {
        let site = Site::parse(SMALL);
        assert!(site.is_ok(), "{site:?}");
        let Ok(site) = site else { return };
        assert!(!site.tls);
        assert_eq!(site.servers[0].port, 4222);
        assert_eq!(site.servers[0].store_dir, Path::new(DEFAULT_STORE_DIR));
        assert_eq!(site.nodes[0].host(), "gpu01");
        assert_eq!(site.scheduler_hosts(), ["head"]);
        assert_eq!(site.notify_host().as_deref(), Some("head"));
        let hosts: Vec<String> = site.hosts().into_iter().collect();
        assert_eq!(hosts, ["gpu01", "gpu02.lab", "head"]);
        assert_eq!(site.server_urls(), "nats://head:4222");
    }

    fn error_of(text: &str) -> String {
        Site::parse(text)
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default()
    }

    #[test]
    fn the_notify_service_goes_where_it_is_told_else_with_the_first_scheduler() {
        let text = format!("{SMALL}[scheduler]\nhosts = [\"s1\", \"s2\"]\n");
        let site = Site::parse(&text).ok();
        assert_eq!(site.and_then(|s| s.notify_host()).as_deref(), Some("s1"));
        let text = format!("{SMALL}[notify]\nhost = \"mail-gw\"\n");
        let site = Site::parse(&text).ok();
        assert_eq!(
            site.as_ref().and_then(Site::notify_host).as_deref(),
            Some("mail-gw")
        );
        let hosts: Vec<String> = site
            .map(|s| s.hosts().into_iter().collect())
            .unwrap_or_default();
        assert_eq!(hosts, ["gpu01", "gpu02.lab", "head", "mail-gw"]);
    }

    #[test]
    fn mistakes_are_named() {
        assert!(error_of("users = []").contains("at least one [[server]]"));
        let two_plain =
            "[[server]]\nname = \"a\"\nhost = \"h1\"\n[[server]]\nname = \"b\"\nhost = \"h2\"\n";
        assert!(error_of(two_plain).contains("tls = true"));
        let server = "[[server]]\nname = \"a\"\nhost = \"h1\"\n";
        assert!(error_of(&format!("users = [\"a.b\"]\n{server}")).contains("not a valid name"));
        assert!(
            error_of(&format!("users = [\"x\"]\nadmins = [\"x\"]\n{server}"))
                .contains("appears twice")
        );
        assert!(
            error_of(&format!("users = [\"x\"]\nviewers = [\"x\"]\n{server}"))
                .contains("appears twice")
        );
        let same_host = format!(
            "{server}[[node]]\nname = \"n1\"\nhost = \"g\"\n[[node]]\nname = \"n2\"\nhost = \"g\"\n"
        );
        assert!(error_of(&same_host).contains("node host `g` appears twice"));
        assert!(error_of(&format!("{server}[[node]]\nname = \"users\"\n")).contains("may not be"));
        assert!(
            error_of(&format!("{server}[[node]]\nname = \"n\"\nhost = \"a/b\"\n"))
                .contains("not a host")
        );
        assert!(error_of(&format!("colour = 1\n{server}")).contains("colour"));
        assert!(error_of(&format!("{server}[notify]\nhost = \"auth\"\n")).contains("may not be"));
        assert!(error_of(&format!("{server}[notify]\nhosts = [\"h1\"]\n")).contains("hosts"));
    }
}
