//! `mgpu admin add-user NAME [--admin] [--unix-user ACCOUNT] [--out PATH]`: a user who may
//! submit jobs, or an administrator, with the Unix account their jobs run as.

use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow};
use clap::Args;
use mgpu_cli::setup::auth::Role;

use super::announce;
use super::registry::{add_principal, load, save};
use crate::console::println;
use crate::session::ConnectionArgs;

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

pub async fn run(connection: &ConnectionArgs, dir: &Path, args: &AddUserArgs) -> Result<()> {
    let role = if args.admin { Role::Admin } else { Role::User };
    add_principal(dir, role, &args.name, args.out.as_deref())?;
    if let Some(account) = &args.unix_user {
        set_unix_user(dir, role, &args.name, account)?;
    }
    let what = format!("added {} {}", role.as_str(), args.name);
    announce::credentials_changed(connection, dir, &args.name, what).await
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
