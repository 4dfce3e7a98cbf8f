//! `mgpu admin add-node NAME [--out PATH]`: a node whose agent may run jobs.

use std::path::{Path, PathBuf};

use crate::setup::auth::Role;
use anyhow::Result;
use clap::Args;

use super::announce;
use super::registry::add_principal;
use crate::client::session::ConnectionArgs;

#[derive(Debug, Args)]
pub struct AddNodeArgs {
    /// The node's name, as its agent reports it.
    pub name: String,

    /// Also copy the key to this file (mode 0600), to install on the node.
    #[arg(long, value_name = "PATH")]
    pub out: Option<PathBuf>,
}

pub async fn run(connection: &ConnectionArgs, dir: &Path, args: &AddNodeArgs) -> Result<()> {
    add_principal(dir, Role::Node, &args.name, args.out.as_deref())?;
    let what = format!("added node {}", args.name);
    announce::credentials_changed(connection, dir, &args.name, what).await
}
