//! The principals file (`principals.json`): who exists (scheduler, nodes, users, admins, the
//! notification service), in which role, with which public nkey. `mgpu admin` writes it; the
//! scheduler reads it to know who signed a request. It holds no secrets: each seed stays in
//! its own key file.

use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::InvalidInput;
use crate::ids::validate_node_name;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Scheduler,
    Node,
    User,
    Admin,
    /// The `mgpu-notify` service: reads job events and notices, sends them on.
    Notify,
    /// Reads what a wall screen shows (nodes, GPUs, the queue, public output) and nothing
    /// else: no request, no environment, no private output, no history.
    Viewer,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Scheduler => "scheduler",
            Role::Node => "node",
            Role::User => "user",
            Role::Admin => "admin",
            Role::Notify => "notify",
            Role::Viewer => "viewer",
        }
    }
}

/// One identity known to the server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    pub name: String,
    pub role: Role,
    /// The nkey's public key (`U…`); the seed never leaves the key file.
    pub public_key: String,
    /// The Unix account this user's jobs run as on agents running as root (`--unix-user`);
    /// None: the account named like the user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unix_user: Option<String>,
    /// The group whose `[limits.group.<name>]` apply to this user (`--group`); None: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

impl Principal {
    /// Whether this principal may act on any user's jobs.
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// The Unix account its jobs run as (see [`Principal::unix_user`]).
    pub fn unix_account(&self) -> &str {
        self.unix_user.as_deref().unwrap_or(&self.name)
    }
}

impl Principal {
    /// File name of this principal's seed under `keys/`.
    pub fn key_file_name(&self) -> String {
        format!("{}-{}.nk", self.role.as_str(), self.name)
    }
}

/// The registry file: every principal, in the order they were added.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registry {
    pub principals: Vec<Principal>,
}

pub const REGISTRY_FILE: &str = "principals.json";
pub const KEYS_DIR: &str = "keys";

impl Registry {
    pub fn load(dir: &Path) -> std::io::Result<Registry> {
        let path = dir.join(REGISTRY_FILE);
        if !path.exists() {
            return Ok(Registry::default());
        }
        let text = fs::read_to_string(&path)?;
        serde_json::from_str(&text).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        })
    }

    /// The principal whose nkey is `public_key`.
    pub fn by_key(&self, public_key: &str) -> Option<&Principal> {
        self.principals.iter().find(|p| p.public_key == public_key)
    }

    pub fn find(&self, role: Role, name: &str) -> Option<&Principal> {
        self.principals
            .iter()
            .find(|p| p.role == role && p.name == name)
    }
}

/// Principal names become subject tokens and file names: the node-name rules apply.
pub fn validate_principal_name(name: &str) -> Result<(), InvalidInput> {
    validate_node_name(name).map_err(|_| {
        InvalidInput::new(format!(
            "`{name}` is not a valid name: use 1-64 letters, digits, `-` or `_`"
        ))
    })
}

/// The inbox prefix of the principal with `public_key`: every mgpu client uses it for
/// replies, and users may subscribe to theirs only.
pub fn inbox_prefix(public_key: &str) -> String {
    format!("_INBOX.{public_key}")
}
