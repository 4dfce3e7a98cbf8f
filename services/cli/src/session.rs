//! Connecting to NATS as the current user, and who that user is.

use anyhow::{Result, anyhow};
use async_nats::jetstream;
use mgpu_shared::connect::{ConnectTarget, connect};

use crate::cli::GlobalArgs;
use crate::errors::plain;

/// A live connection: the core client (for plain publishes) and its JetStream context.
pub struct Session {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    /// The name jobs are submitted and cancelled under.
    pub user: String,
}

impl Session {
    /// Connects with the credentials from `--creds` / `MGPU_CREDS`.
    pub async fn connect(global: &GlobalArgs) -> Result<Session> {
        let creds = global.creds.clone().ok_or_else(|| {
            anyhow!(
                "no credentials: pass --creds FILE or set MGPU_CREDS \
                 (scripts/dev-up.sh writes .mgpu/env to source)"
            )
        })?;
        let user = current_user();
        let target = ConnectTarget {
            server: global.server.clone(),
            creds,
        };
        // The shared error is already one sentence a person can act on; adding context would
        // only repeat the server address.
        let client = connect(&target, &format!("mgpu {user}"))
            .await
            .map_err(plain)?;
        let js = jetstream::new(client.clone());
        Ok(Session { client, js, user })
    }
}

/// The login name: `$USER`, else the password database entry for our uid, else the uid itself.
pub fn current_user() -> String {
    if let Ok(user) = std::env::var("USER")
        && !user.trim().is_empty()
    {
        return user.trim().to_owned();
    }
    let uid = nix::unistd::getuid();
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(entry)) => entry.name,
        _ => uid.to_string(),
    }
}
