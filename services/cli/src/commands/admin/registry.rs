//! The credentials directory's registry as the admin commands change it: read, written back,
//! and a principal added with its key file (and, on request, a copy of the key to hand over).

use std::path::Path;

use crate::setup::auth::{Registry, RegistryFiles, Role};
use crate::setup::files;
use anyhow::{Context as _, Result};

use crate::console::println;
use crate::errors::plain;

/// The registry in `dir`; an empty one when there is none yet.
pub fn load(dir: &Path) -> Result<Registry> {
    Registry::load(dir).with_context(|| format!("cannot read the registry in {}", dir.display()))
}

/// Writes `principals.json` and the `auth.conf` the servers include.
pub fn save(registry: &Registry, dir: &Path) -> Result<()> {
    registry
        .save(dir)
        .with_context(|| format!("cannot write the registry in {}", dir.display()))
}

/// Adds a principal (a user, an admin or a node) with a fresh key, or says it exists; with
/// `out`, copies its key there (mode 0600).
pub fn add_principal(dir: &Path, role: Role, name: &str, out: Option<&Path>) -> Result<()> {
    let mut registry = load(dir)?;
    let existed = registry.find(role, name).is_some();
    let key = registry.add(dir, role, name).map_err(plain)?;
    save(&registry, dir)?;
    let what = role.as_str();
    if existed {
        println(&format!(
            "{what} {name} already exists; key: {}",
            key.display()
        ))?;
    } else {
        println(&format!("Added {what} {name}; key: {}", key.display()))?;
    }
    if let Some(out) = out {
        let seed = std::fs::read_to_string(&key)
            .with_context(|| format!("cannot read {}", key.display()))?;
        files::write_secret(out, &seed)
            .with_context(|| format!("cannot write {}", out.display()))?;
        println(&format!("Copied the key to {} (mode 0600)", out.display()))?;
    }
    Ok(())
}
