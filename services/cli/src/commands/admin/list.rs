//! `mgpu admin list [--json]`: the principals the credentials directory holds.

use std::path::Path;

use anyhow::Result;
use clap::Args;

use super::registry::load;
use crate::console::{print, print_json, println};
use crate::tables::Table;

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print an array of {name, role, public_key}.
    #[arg(long)]
    pub json: bool,
}

pub fn run(dir: &Path, args: &ListArgs) -> Result<()> {
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
