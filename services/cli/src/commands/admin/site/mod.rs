//! `mgpu admin site SITE.toml --out DIR`: a whole site (nats-servers, schedulers, GPU hosts,
//! users, admins, viewers, TLS on or off) written from one description into a directory per
//! host, ready to copy onto each host as it is laid out there.
//!
//! ```text
//! DIR/auth/                  the credentials directory (as `mgpu admin init` makes it: every
//!                            seed, principals.json, auth.conf, the CA and its key); keep it
//! DIR/<host>/etc/mgpu/...    what the host needs, by its roles (see `render`)
//! DIR/<host>/etc/profile.d/mgpu.sh
//! DIR/users/<name>/          a person's key (mgpu.nk), mgpu.env, with TLS ca.pem
//! ```
//!
//! It uses the code of `mgpu admin init` for the keys, the principals file, the servers'
//! authorization and the TLS authority. Running it again never makes a key that exists anew:
//! adding a node or a user writes only that principal's files and the files naming every
//! principal (`auth.conf` on the servers, `principals.json` beside the scheduler), and says
//! which files it wrote. Principals the description no longer names are removed (their keys
//! stop working once the servers reload), and so are the files an earlier run wrote for them.
//! The modules: [`spec`] (the description), [`render`] (every file, in memory), [`write`]
//! (only what differs).

mod render;
mod spec;
mod write;

use std::path::{Path, PathBuf};

use crate::setup::auth::{KEYS_DIR, Registry, RegistryFiles, Role};
use crate::setup::{files, tls};
use anyhow::{Context as _, Result};
use clap::Args;

use super::registry::load;
use crate::console::println;
use crate::errors::plain;

#[derive(Debug, Args)]
#[command(after_long_help = "\
The description (TOML):
  tls = true
  users = [\"alice\", \"bob\"]
  admins = [\"carol\"]
  viewers = [\"wall\"]    # read-only (a wall screen's web dashboard)
  [[server]]            # name, host; port = 4222, cluster_port = 6222,
  name = \"mgpu-1\"       # store_dir = \"/var/lib/nats/jetstream\"
  host = \"head.lab\"
  [[node]]              # name; host = the name, gpus = \"2x24GiB\" (default: NVML),
  name = \"gpu01\"        # config = { ... } (more node.toml keys)
  [scheduler]           # hosts = [first server's host], config = { placement = \"spread\" }
  [notify]              # host = first scheduler host (mgpu-notify runs on one host only),
                        # config = { notify = { smtp = \"smtp://mail.lab:25\" } }

Then copy each host's files into place (`tar -C DIR/head -cf - etc | ssh root@head tar -C /
-xf - --no-overwrite-dir`), and give each person DIR/users/<name>/mgpu.nk. See
docs/operations.md.")]
pub struct SiteArgs {
    /// The site's description (TOML).
    pub file: PathBuf,

    /// Where to write the site: a directory per host, users/, and auth/ (the credentials
    /// directory, kept for the next run).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

pub fn run(args: &SiteArgs) -> Result<()> {
    let site = spec::Site::load(&args.file)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let out = args
        .out
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", args.out.display()))?;
    let auth = out.join("auth");
    let mut registry = load(&auth)?;
    let principals = sync_principals(&auth, &site, &mut registry)?;
    if site.tls {
        ensure_certificates(&auth, &site)?;
    }
    let files = render::site_files(&render::Inputs {
        site: &site,
        registry: &registry,
        auth: &auth,
    })?;
    let outcome = write::apply(&out, &files)?;
    report(&out, &site, &principals, &outcome)
}

/// Principals added and removed by [`sync_principals`], as `role name`.
#[derive(Debug, Default)]
struct PrincipalChanges {
    added: Vec<String>,
    removed: Vec<String>,
}

/// Makes the registry in `auth` hold exactly the site's principals: the scheduler, the
/// notification service, each node, user, admin and viewer. Existing ones keep their keys;
/// new ones get one; the others are removed with their key files.
fn sync_principals(
    auth: &Path,
    site: &spec::Site,
    registry: &mut Registry,
) -> Result<PrincipalChanges> {
    let services = [(Role::Scheduler, "scheduler"), (Role::Notify, "notify")];
    let wanted: Vec<(Role, &str)> = services
        .into_iter()
        .chain(site.nodes.iter().map(|n| (Role::Node, n.name.as_str())))
        .chain(site.users.iter().map(|u| (Role::User, u.as_str())))
        .chain(site.admins.iter().map(|a| (Role::Admin, a.as_str())))
        .chain(site.viewers.iter().map(|v| (Role::Viewer, v.as_str())))
        .collect();
    let mut changes = PrincipalChanges::default();
    let (kept, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut registry.principals)
        .into_iter()
        .partition(|p| wanted.contains(&(p.role, p.name.as_str())));
    registry.principals = kept;
    for principal in gone {
        let key = auth.join(KEYS_DIR).join(principal.key_file_name());
        match std::fs::remove_file(&key) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot delete {}", key.display())),
        }
        changes
            .removed
            .push(format!("{} {}", principal.role.as_str(), principal.name));
    }
    for (role, name) in wanted {
        let key = auth
            .join(KEYS_DIR)
            .join(format!("{}-{name}.nk", role.as_str()));
        let known = registry.find(role, name).is_some() && key.exists();
        if !known {
            // A principal whose key file went missing gets a new key: the old one is lost.
            registry
                .principals
                .retain(|p| !(p.role == role && p.name == name));
            registry.add(auth, role, name).map_err(plain)?;
            changes.added.push(format!("{} {name}", role.as_str()));
        }
    }
    Ok(changes)
}

/// The file beside the servers' certificate that lists the names it was issued for.
const CERT_HOSTS_FILE: &str = "server-cert.hosts";

/// The CA and the servers' certificate in `auth`, made when missing. A certificate not issued
/// for every server host (as `server-cert.hosts` records) is issued again by the same CA, so
/// clients need nothing new.
fn ensure_certificates(auth: &Path, site: &spec::Site) -> Result<()> {
    std::fs::create_dir_all(auth).with_context(|| format!("cannot create {}", auth.display()))?;
    let hosts = tls::server_hosts(
        &site
            .servers
            .iter()
            .map(|s| s.host.clone())
            .collect::<Vec<_>>(),
    );
    let files = tls::TlsFiles::in_dir(auth);
    let record = auth.join(CERT_HOSTS_FILE);
    let issued_for = std::fs::read_to_string(&record).unwrap_or_default();
    let covered = hosts.iter().all(|host| {
        issued_for
            .lines()
            .any(|line| line.eq_ignore_ascii_case(host))
    });
    if files.cert_file.exists() && !covered {
        for stale in [&files.cert_file, &files.key_file] {
            match std::fs::remove_file(stale) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot replace {}", stale.display()));
                }
            }
        }
    }
    let made = tls::ensure_certificates(auth, &hosts)
        .map_err(plain)
        .with_context(|| format!("cannot set up TLS in {}", auth.display()))?;
    if made.written.contains(&files.cert_file) {
        let names: String = hosts.iter().map(|h| format!("{h}\n")).collect();
        files::write_atomically(&record, &names)
            .with_context(|| format!("cannot write {}", record.display()))?;
    }
    Ok(())
}

/// Says what changed, file by file, and what to do with it.
fn report(
    out: &Path,
    site: &spec::Site,
    principals: &PrincipalChanges,
    outcome: &write::Outcome,
) -> Result<()> {
    for added in &principals.added {
        println(&format!("added {added} (a new key)"))?;
    }
    for removed in &principals.removed {
        println(&format!("removed {removed} (its key is deleted)"))?;
    }
    for path in &outcome.written {
        println(&format!("wrote     {}", path.display()))?;
    }
    for path in &outcome.unchanged {
        println(&format!("unchanged {}", path.display()))?;
    }
    for path in &outcome.removed {
        println(&format!("deleted   {}", path.display()))?;
    }
    println(&format!(
        "{} written, {} unchanged, {} deleted in {}",
        outcome.written.len(),
        outcome.unchanged.len(),
        outcome.removed.len(),
        out.display()
    ))?;
    let hosts: Vec<String> = site
        .hosts()
        .into_iter()
        .filter(|h| {
            outcome
                .written
                .iter()
                .chain(&outcome.removed)
                .any(|p| p.starts_with(h))
        })
        .collect();
    if !hosts.is_empty() {
        println(&format!(
            "hosts whose files changed: {}: copy each one's files into place (`tar -C {}/HOST \
             -cf - etc | ssh root@HOST tar -C / -xf - --no-overwrite-dir`, see \
             docs/operations.md), then reload nats-server where auth.conf changed",
            hosts.join(", "),
            out.display()
        ))?;
    }
    Ok(())
}
