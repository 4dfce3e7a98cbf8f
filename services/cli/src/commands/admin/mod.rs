//! `mgpu admin`: credentials, the nats-server configuration, and mgpu's streams. One module
//! per subcommand; this one holds the command line and the dispatch.
//!
//! Everything but `setup` and `audit` works on the credentials directory alone, with no server
//! running: that is how a cluster gets its first configuration.

mod add_node;
mod add_user;
mod announce;
mod audit;
mod init;
mod list;
mod registry;
mod remove;
mod setup;
mod site;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Subcommand};

use crate::client::session::ConnectionArgs;

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
    Init(init::InitArgs),
    /// Add a user who may submit jobs (or, with --admin, an administrator).
    AddUser(add_user::AddUserArgs),
    /// Add a node whose agent may run jobs.
    AddNode(add_node::AddNodeArgs),
    /// List the principals the server knows.
    List(list::ListArgs),
    /// Remove a user or node: its key stops working once the server reloads its
    /// configuration (done here for the servers of `scripts/dev-up.sh`).
    Remove(remove::RemoveArgs),
    /// Show the audit trail: every request the scheduler handled, who signed it, and whether
    /// it was carried out.
    Audit(audit::AuditArgs),
    /// Create mgpu's JetStream streams and buckets (needs admin credentials); existing ones
    /// keep their sizes.
    Setup(setup::SetupArgs),
    /// Write a whole site (servers, schedulers, GPU hosts, users) from one description into
    /// a directory per host, ready to copy. Safe to run again: existing keys are kept and
    /// only files that differ are written.
    Site(site::SiteArgs),
}

pub async fn run(connection: &ConnectionArgs, args: &AdminArgs) -> Result<ExitCode> {
    let dir = args.dir.as_path();
    match &args.command {
        AdminCommand::Init(init_args) => init::run(dir, init_args)?,
        AdminCommand::AddUser(add) => add_user::run(connection, dir, add).await?,
        AdminCommand::AddNode(add) => add_node::run(connection, dir, add).await?,
        AdminCommand::List(list_args) => list::run(dir, list_args)?,
        AdminCommand::Remove(remove_args) => remove::run(connection, dir, remove_args).await?,
        AdminCommand::Audit(audit_args) => audit::run(connection, audit_args).await?,
        AdminCommand::Setup(setup_args) => setup::run(connection, setup_args).await?,
        AdminCommand::Site(site_args) => site::run(site_args)?,
    }
    Ok(ExitCode::SUCCESS)
}
