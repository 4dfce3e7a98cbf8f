//! `mgpu admin remove NAME [--node]`: a user or node loses its key; the servers stop
//! accepting it once they reload their authorization.

use std::path::Path;

use crate::setup::auth::{self, Role};
use anyhow::{Result, anyhow};
use clap::Args;

use super::announce;
use super::registry::{load, save};
use crate::client::session::ConnectionArgs;
use crate::console::println;

#[derive(Debug, Args)]
pub struct RemoveArgs {
    /// The user's or node's name.
    pub name: String,

    /// Remove the node of that name (when a user has the same name).
    #[arg(long)]
    pub node: bool,
}

pub async fn run(connection: &ConnectionArgs, dir: &Path, args: &RemoveArgs) -> Result<()> {
    remove(dir, args)?;
    let what = format!("removed {}", args.name);
    announce::credentials_changed(connection, dir, &args.name, what).await
}

/// Removes a user or node and its key file.
fn remove(dir: &Path, args: &RemoveArgs) -> Result<()> {
    let mut registry = load(dir)?;
    let matches = |p: &auth::Principal| {
        p.name == args.name
            && if args.node {
                p.role == Role::Node
            } else {
                matches!(p.role, Role::User | Role::Admin | Role::Viewer)
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
