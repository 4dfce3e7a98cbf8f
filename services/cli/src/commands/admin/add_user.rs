//! `mgpu admin add-user NAME [--role user|admin|viewer] [--unix-user ACCOUNT] [--group GROUP]
//! [--out PATH]`: a user who may submit jobs, an administrator, or a viewer that only reads (a
//! wall screen), with the Unix account their jobs run as and the group whose limits apply to
//! them. Run again for an existing user, it changes those.

use std::path::{Path, PathBuf};

use crate::setup::auth::Role;
use anyhow::{Result, anyhow};
use clap::Args;

use super::announce;
use super::registry::{add_principal, load, save};
use crate::client::session::ConnectionArgs;
use crate::console::println;

#[derive(Debug, Args)]
pub struct AddUserArgs {
    /// The user's login name (what `mgpu` finds in $USER).
    pub name: String,

    /// What the principal may do: `user` (submit and manage their own jobs), `admin`
    /// (everything), or `viewer` (read nodes, GPUs, the queue and public output; nothing
    /// else: for a wall screen).
    #[arg(long, value_enum, default_value_t = AddedRole::User)]
    pub role: AddedRole,

    /// The same as `--role admin`.
    #[arg(long, conflicts_with = "role")]
    pub admin: bool,

    /// Also copy the key to this file (mode 0600), to hand to the user.
    #[arg(long, value_name = "PATH")]
    pub out: Option<PathBuf>,

    /// The Unix account this user's jobs run as on agents running as root (default: the
    /// account named like the user).
    #[arg(long, value_name = "ACCOUNT")]
    pub unix_user: Option<String>,

    /// The group whose `[limits.group.GROUP]` (the scheduler's config) apply to this user,
    /// where the user has no table of their own; `--group ''` takes the user out of theirs.
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,
}

/// The roles a person's principal may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AddedRole {
    User,
    Admin,
    Viewer,
}

pub async fn run(connection: &ConnectionArgs, dir: &Path, args: &AddUserArgs) -> Result<()> {
    let role = match (args.admin, args.role) {
        (true, _) | (_, AddedRole::Admin) => Role::Admin,
        (false, AddedRole::User) => Role::User,
        (false, AddedRole::Viewer) => Role::Viewer,
    };
    if role == Role::Viewer && (args.unix_user.is_some() || args.group.is_some()) {
        return Err(anyhow!(
            "a viewer runs no jobs: --unix-user and --group are for users and admins"
        ));
    }
    if let Some(group) = &args.group {
        check_group_name(group)?;
    }
    add_principal(dir, role, &args.name, args.out.as_deref())?;
    if let Some(account) = &args.unix_user {
        set_unix_user(dir, role, &args.name, account)?;
    }
    if let Some(group) = &args.group {
        set_group(dir, role, &args.name, group)?;
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

/// A group name as `[limits.group.<name>]` can name it: a name like a user's, or empty (no
/// group).
fn check_group_name(group: &str) -> Result<()> {
    if group.is_empty() {
        return Ok(());
    }
    mgpu_protocol::principals::validate_principal_name(group).map_err(|err| anyhow!("group: {err}"))
}

/// Records the group whose limits apply to a user (empty: none).
fn set_group(dir: &Path, role: Role, name: &str, group: &str) -> Result<()> {
    let mut registry = load(dir)?;
    if let Some(principal) = registry
        .principals
        .iter_mut()
        .find(|p| p.role == role && p.name == name)
    {
        principal.group = (!group.is_empty()).then(|| group.to_owned());
    }
    save(&registry, dir)?;
    if group.is_empty() {
        println(&format!("{name} is in no group"))?;
    } else {
        println(&format!(
            "{name} is in group {group} ([limits.group.{group}] applies)"
        ))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_names_are_those_a_limits_table_can_name() {
        assert!(check_group_name("students").is_ok());
        assert!(check_group_name("").is_ok());
        let err = check_group_name("a.b")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("group: `a.b` is not a valid name"), "{err}");
    }
}
