//! Every file of a site, rendered in memory from its description, its principals and its
//! credentials directory: what each host gets under `<host>/` (laid out as on the host, from
//! `/`), what each person gets under `users/<name>/`, and the credentials directory's own
//! registry files under `auth/`. Nothing here writes; [`super::write`] does.
//!
//! A host gets, by role (a host may have several):
//!
//! | role | files |
//! | --- | --- |
//! | server | `/etc/mgpu/nats-server.conf`, `/etc/mgpu/auth.conf`, with TLS `/etc/mgpu/tls/server-cert.pem` and `server-key.pem` |
//! | scheduler | `/etc/mgpu/scheduler.toml`, `/etc/mgpu/keys/scheduler.nk`, `/etc/mgpu/principals.json` |
//! | node | `/etc/mgpu/node.toml`, `/etc/mgpu/keys/node.nk` |
//! | notify (one host) | `/etc/mgpu/notify.toml`, `/etc/mgpu/keys/notify.nk` |
//! | every host | `/etc/profile.d/mgpu.sh` (the CLI's server, CA and key for every login), with TLS `/etc/mgpu/ca.pem` |

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, anyhow};
use serde_json::json;

use crate::setup::auth::{
    AUTH_CONF_FILE, CLUSTER_NAME, KEYS_DIR, REGISTRY_FILE, Registry, RegistryFiles, Role,
    render_jetstream_block, render_websocket_block,
};
use crate::setup::tls::{self, TlsFiles, render_tls_block};

use super::spec::{Node, Server, Site};

/// Where the generated files live on each host.
pub const CONFIG_DIR: &str = "/etc/mgpu";
/// The agent's state directory on a GPU host (the unit's `StateDirectory=mgpu/node`).
pub const NODE_STATE_DIR: &str = "/var/lib/mgpu/node";
/// Where a user's key goes in their home directory; `/etc/profile.d/mgpu.sh` looks there.
pub const USER_KEY: &str = ".config/mgpu/mgpu.nk";

/// One file of the site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteFile {
    /// Relative to the output directory: `<host>/etc/mgpu/node.toml`, `users/alice/mgpu.nk`.
    pub path: PathBuf,
    pub contents: String,
    /// A key: written mode 0600.
    pub secret: bool,
}

/// What the files are rendered from.
pub struct Inputs<'a> {
    pub site: &'a Site,
    pub registry: &'a Registry,
    /// The credentials directory: the seeds and the TLS files are read from it.
    pub auth: &'a Path,
}

/// Every file of the site, hosts in name order.
pub fn site_files(inputs: &Inputs) -> Result<Vec<SiteFile>> {
    let Inputs {
        site,
        registry,
        auth,
    } = inputs;
    let mut files = vec![
        plain(
            Path::new("auth").join(REGISTRY_FILE),
            serde_json::to_string_pretty(registry)?,
        ),
        plain(
            Path::new("auth").join(AUTH_CONF_FILE),
            registry.render_auth_conf(),
        ),
    ];
    for host in site.hosts() {
        files.extend(host_files(inputs, &host)?);
    }
    let people = [
        (Role::User, &site.users),
        (Role::Admin, &site.admins),
        (Role::Viewer, &site.viewers),
    ];
    for (role, names) in people {
        for name in names {
            files.extend(person_files(site, auth, role, name)?);
        }
    }
    Ok(files)
}

/// A file that is no secret.
fn plain(path: PathBuf, contents: String) -> SiteFile {
    SiteFile {
        path,
        contents,
        secret: false,
    }
}

/// `<host>/` + an absolute path on the host.
fn on_host(host: &str, path: &str) -> PathBuf {
    Path::new(host).join(path.trim_start_matches('/'))
}

/// The files of one host, by its roles.
fn host_files(inputs: &Inputs, host: &str) -> Result<Vec<SiteFile>> {
    let Inputs {
        site,
        registry,
        auth,
    } = inputs;
    let etc = |name: &str| on_host(host, &format!("{CONFIG_DIR}/{name}"));
    let mut files = vec![plain(
        on_host(host, "/etc/profile.d/mgpu.sh"),
        render_profile(site),
    )];
    if site.tls {
        files.push(plain(
            etc(tls::CA_CERT_FILE),
            read(&auth.join(tls::CA_CERT_FILE))?,
        ));
    }
    for (index, server) in site.servers.iter().enumerate() {
        if server.host != host {
            continue;
        }
        files.push(plain(
            etc("nats-server.conf"),
            render_server_conf(site, index, server),
        ));
        files.push(plain(etc(AUTH_CONF_FILE), registry.render_auth_conf()));
        if site.tls {
            files.push(plain(
                etc(&format!("tls/{}", tls::SERVER_CERT_FILE)),
                read(&auth.join(tls::SERVER_CERT_FILE))?,
            ));
            files.push(SiteFile {
                path: etc(&format!("tls/{}", tls::SERVER_KEY_FILE)),
                contents: read(&auth.join(tls::SERVER_KEY_FILE))?,
                secret: true,
            });
        }
    }
    if site.scheduler_hosts().iter().any(|h| h == host) {
        files.push(plain(etc("scheduler.toml"), render_scheduler_toml(site)?));
        files.push(seed(
            auth,
            Role::Scheduler,
            "scheduler",
            etc("keys/scheduler.nk"),
        )?);
        files.push(plain(
            etc(REGISTRY_FILE),
            serde_json::to_string_pretty(registry)?,
        ));
    }
    if site.notify_host().as_deref() == Some(host) {
        files.push(plain(etc("notify.toml"), render_notify_toml(site)?));
        files.push(seed(auth, Role::Notify, "notify", etc("keys/notify.nk"))?);
    }
    if let Some(node) = site.nodes.iter().find(|n| n.host() == host) {
        files.push(plain(etc("node.toml"), render_node_toml(site, node)?));
        files.push(seed(auth, Role::Node, &node.name, etc("keys/node.nk"))?);
    }
    Ok(files)
}

/// A person's key and the settings to use it from anywhere.
fn person_files(site: &Site, auth: &Path, role: Role, name: &str) -> Result<Vec<SiteFile>> {
    let dir = Path::new("users").join(name);
    let mut files = vec![seed(auth, role, name, dir.join("mgpu.nk"))?];
    let mut env = format!(
        "# mgpu for {name} ({role}), written by `mgpu admin site`.\n\
         # On a host of the site: install mgpu.nk as ~/{USER_KEY} (mode 0600); the host's\n\
         # /etc/profile.d/mgpu.sh does the rest. Elsewhere: copy mgpu.nk{ca} to ~/.config/mgpu/\n\
         # and source this file.\n\
         export MGPU_SERVER={server}\n\
         export MGPU_CREDS=\"$HOME/{USER_KEY}\"\n",
        role = role.as_str(),
        ca = if site.tls { " and ca.pem" } else { "" },
        server = shell_quote(&site.server_urls()),
    );
    if site.tls {
        env.push_str("export MGPU_CA=\"$HOME/.config/mgpu/ca.pem\"\n");
        files.push(plain(
            dir.join(tls::CA_CERT_FILE),
            read(&auth.join(tls::CA_CERT_FILE))?,
        ));
    }
    files.push(plain(dir.join("mgpu.env"), env));
    Ok(files)
}

/// A principal's seed from the credentials directory, to be written at `path`.
fn seed(auth: &Path, role: Role, name: &str, path: PathBuf) -> Result<SiteFile> {
    let file = auth
        .join(KEYS_DIR)
        .join(format!("{}-{name}.nk", role.as_str()));
    Ok(SiteFile {
        path,
        contents: read(&file)?,
        secret: true,
    })
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

/// `/etc/profile.d/mgpu.sh`: every login on the host finds the cluster, and the user's key
/// when it is in place; what a person set themselves wins.
fn render_profile(site: &Site) -> String {
    let mut text = format!(
        "# Written by `mgpu admin site`: where the mgpu CLI finds the cluster on this host.\n\
         : \"${{MGPU_SERVER:={server}}}\"\n\
         export MGPU_SERVER\n",
        server = site.server_urls(),
    );
    if site.tls {
        text.push_str(&format!(
            ": \"${{MGPU_CA:={CONFIG_DIR}/{}}}\"\nexport MGPU_CA\n",
            tls::CA_CERT_FILE
        ));
    }
    text.push_str(&format!(
        "if [ -z \"${{MGPU_CREDS:-}}\" ] && [ -r \"$HOME/{USER_KEY}\" ]; then\n\
         \x20 export MGPU_CREDS=\"$HOME/{USER_KEY}\"\n\
         fi\n"
    ));
    text
}

/// `scheduler.toml`: the server, its key, the principals file, the CA; then the site's
/// `[scheduler] config` keys.
fn render_scheduler_toml(site: &Site) -> Result<String> {
    let mut table = toml::Table::new();
    table.insert("server".into(), site.server_urls().into());
    table.insert(
        "creds".into(),
        format!("{CONFIG_DIR}/keys/scheduler.nk").into(),
    );
    table.insert(
        "principals".into(),
        format!("{CONFIG_DIR}/{REGISTRY_FILE}").into(),
    );
    insert_ca(site, &mut table);
    render_toml(
        "mgpu-scheduler",
        table,
        &site.scheduler.config,
        "[scheduler] config",
    )
}

/// `notify.toml`: the server, the service's key, the CA; then the site's `[notify] config`
/// keys (its `[notify]` section: the SMTP relay, the sender, the throttle).
fn render_notify_toml(site: &Site) -> Result<String> {
    let mut table = toml::Table::new();
    table.insert("server".into(), site.server_urls().into());
    table.insert(
        "creds".into(),
        format!("{CONFIG_DIR}/keys/notify.nk").into(),
    );
    insert_ca(site, &mut table);
    render_toml("mgpu-notify", table, &site.notify.config, "[notify] config")
}

/// `node.toml`: the node's name, the server, its key, the CA, its state directory and
/// declared GPUs; then its `config` keys.
fn render_node_toml(site: &Site, node: &Node) -> Result<String> {
    let mut table = toml::Table::new();
    table.insert("node".into(), node.name.clone().into());
    table.insert("server".into(), site.server_urls().into());
    table.insert("creds".into(), format!("{CONFIG_DIR}/keys/node.nk").into());
    insert_ca(site, &mut table);
    table.insert("state_dir".into(), NODE_STATE_DIR.into());
    if let Some(gpus) = &node.gpus {
        table.insert("gpus".into(), gpus.clone().into());
    }
    render_toml(
        &format!("mgpu-node {}", node.name),
        table,
        &node.config,
        &format!("node {}'s config", node.name),
    )
}

fn insert_ca(site: &Site, table: &mut toml::Table) {
    if site.tls {
        table.insert(
            "ca".into(),
            format!("{CONFIG_DIR}/{}", tls::CA_CERT_FILE).into(),
        );
    }
}

/// A service's TOML file: a header, the generated keys, then the site's extra keys (which may
/// not repeat a generated one).
fn render_toml(
    what: &str,
    mut table: toml::Table,
    extra: &toml::Table,
    from: &str,
) -> Result<String> {
    for (key, value) in extra {
        if table.contains_key(key) {
            return Err(anyhow!(
                "{from} sets `{key}`, which `mgpu admin site` writes itself"
            ));
        }
        table.insert(key.clone(), value.clone());
    }
    let body = toml::to_string(&table).with_context(|| format!("rendering {what}'s config"))?;
    Ok(format!(
        "# {what}, written by `mgpu admin site`: change site.toml and run it again rather than\n\
         # editing this file.\n{body}"
    ))
}

/// nats-server's configuration on a server host: clients on every address of the host, the
/// site's TLS files, JetStream (syncing every write), and, with several servers, routes to the
/// others over TLS with each peer's certificate verified.
fn render_server_conf(site: &Site, index: usize, me: &Server) -> String {
    let tls_files = TlsFiles {
        ca_file: PathBuf::from(format!("{CONFIG_DIR}/{}", tls::CA_CERT_FILE)),
        cert_file: PathBuf::from(format!("{CONFIG_DIR}/tls/{}", tls::SERVER_CERT_FILE)),
        key_file: PathBuf::from(format!("{CONFIG_DIR}/tls/{}", tls::SERVER_KEY_FILE)),
    };
    let client_tls = if site.tls {
        render_tls_block(&tls_files, "", false)
    } else {
        String::new()
    };
    let mut text = format!(
        "# nats-server {name} on {host}, written by `mgpu admin site`.\n\
         server_name: {name_json}\nlisten: \"0.0.0.0:{port}\"\n{client_tls}{jetstream}",
        name = me.name,
        host = me.host,
        name_json = json!(me.name),
        port = me.port,
        jetstream = render_jetstream_block(&me.store_dir),
    );
    if site.servers.len() > 1 {
        let routes: String = site
            .servers
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != index)
            .map(|(_, peer)| {
                format!(
                    "    {}\n",
                    json!(format!("nats-route://{}:{}", peer.host, peer.cluster_port))
                )
            })
            .collect();
        text.push_str(&format!(
            "cluster {{\n  name: {cluster}\n  listen: \"0.0.0.0:{port}\"\n{tls}  routes: [\n{routes}  ]\n}}\n",
            cluster = json!(CLUSTER_NAME),
            port = me.cluster_port,
            tls = render_tls_block(&tls_files, "  ", true),
        ));
    }
    if me.websocket_port != 0 {
        let tls = site.tls.then_some(&tls_files);
        text.push_str(&render_websocket_block("0.0.0.0", me.websocket_port, tls));
    }
    text.push_str(&format!("include \"{AUTH_CONF_FILE}\"\n"));
    text
}

/// A value for a POSIX shell, in single quotes.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(text: &str) -> Site {
        Site::parse(text).unwrap_or_else(|e| panic!("{e:#}"))
    }

    #[test]
    fn a_cluster_of_three_routes_over_tls_to_the_other_two() {
        let site = site(
            "tls = true\n\
             [[server]]\nname = \"s1\"\nhost = \"h1\"\n\
             [[server]]\nname = \"s2\"\nhost = \"h2\"\nport = 4223\n\
             [[server]]\nname = \"s3\"\nhost = \"h3\"\ncluster_port = 7000\n",
        );
        let conf = render_server_conf(&site, 1, &site.servers[1]);
        assert!(conf.contains("listen: \"0.0.0.0:4223\"\ntls {"), "{conf}");
        assert!(conf.contains("\"nats-route://h1:6222\""), "{conf}");
        assert!(conf.contains("\"nats-route://h3:7000\""), "{conf}");
        assert!(!conf.contains("nats-route://h2"), "{conf}");
        assert!(conf.contains("  sync_interval: always\n"), "{conf}");
        assert!(conf.contains("    verify: true\n"), "{conf}");
        assert!(conf.contains("\"/etc/mgpu/tls/server-key.pem\""), "{conf}");
        assert!(
            conf.contains("websocket {\n  listen: \"0.0.0.0:4280\"\n  tls {"),
            "{conf}"
        );
        assert!(conf.ends_with("include \"auth.conf\"\n"), "{conf}");
        assert_eq!(
            site.server_urls(),
            "nats://h1:4222,nats://h2:4223,nats://h3:4222"
        );
    }

    #[test]
    fn service_configs_name_the_installed_paths_and_take_extra_keys() {
        let site = site(
            "[[server]]\nname = \"s1\"\nhost = \"head\"\n\
             [scheduler]\nconfig = { placement = \"spread\" }\n\
             [[node]]\nname = \"gpu01\"\ngpus = \"2x24GiB\"\nconfig = { cpus = 8 }\n",
        );
        let scheduler = render_scheduler_toml(&site).unwrap_or_default();
        let parsed: toml::Table = toml::from_str(&scheduler).unwrap_or_default();
        assert_eq!(parsed["server"].as_str(), Some("nats://head:4222"));
        assert_eq!(
            parsed["creds"].as_str(),
            Some("/etc/mgpu/keys/scheduler.nk")
        );
        assert_eq!(
            parsed["principals"].as_str(),
            Some("/etc/mgpu/principals.json")
        );
        assert_eq!(parsed["placement"].as_str(), Some("spread"));
        assert!(!parsed.contains_key("ca"));
        let node = render_node_toml(&site, &site.nodes[0]).unwrap_or_default();
        let parsed: toml::Table = toml::from_str(&node).unwrap_or_default();
        assert_eq!(parsed["node"].as_str(), Some("gpu01"));
        assert_eq!(parsed["creds"].as_str(), Some("/etc/mgpu/keys/node.nk"));
        assert_eq!(parsed["state_dir"].as_str(), Some(NODE_STATE_DIR));
        assert_eq!(parsed["gpus"].as_str(), Some("2x24GiB"));
        assert_eq!(parsed["cpus"].as_integer(), Some(8));

        let clash = self::site(
            "[[server]]\nname = \"s1\"\nhost = \"head\"\n[scheduler]\nconfig = { creds = \"x\" }\n",
        );
        let err = render_scheduler_toml(&clash)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("`creds`"), "{err}");
    }

    #[test]
    fn the_notify_config_names_its_key_and_takes_the_relay() {
        let site = site(
            "tls = true\n[[server]]\nname = \"s1\"\nhost = \"head\"\n\
             [notify]\nconfig = { time80_interval = \"30s\", notify = { smtp = \"smtp://mail:25\" } }\n",
        );
        let text = render_notify_toml(&site).unwrap_or_default();
        let parsed: toml::Table = toml::from_str(&text).unwrap_or_default();
        assert_eq!(parsed["server"].as_str(), Some("nats://head:4222"));
        assert_eq!(parsed["creds"].as_str(), Some("/etc/mgpu/keys/notify.nk"));
        assert_eq!(parsed["ca"].as_str(), Some("/etc/mgpu/ca.pem"));
        assert_eq!(parsed["time80_interval"].as_str(), Some("30s"));
        assert_eq!(parsed["notify"]["smtp"].as_str(), Some("smtp://mail:25"));

        let clash = self::site(
            "[[server]]\nname = \"s1\"\nhost = \"head\"\n[notify]\nconfig = { server = \"x\" }\n",
        );
        let err = render_notify_toml(&clash)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("`server`"), "{err}");
    }

    #[test]
    fn the_profile_keeps_what_a_person_set() {
        let site = site("tls = true\n[[server]]\nname = \"s1\"\nhost = \"head\"\n");
        let profile = render_profile(&site);
        assert!(
            profile.contains(": \"${MGPU_SERVER:=nats://head:4222}\"\n"),
            "{profile}"
        );
        assert!(
            profile.contains(": \"${MGPU_CA:=/etc/mgpu/ca.pem}\"\n"),
            "{profile}"
        );
        assert!(
            profile.contains("[ -r \"$HOME/.config/mgpu/mgpu.nk\" ]"),
            "{profile}"
        );
        assert_eq!(shell_quote("a'b"), "'a'\\''b'");
    }
}
