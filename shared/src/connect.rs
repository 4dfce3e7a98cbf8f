//! Connecting to NATS with an nkey seed file, turning failures into one clear sentence.

use std::path::Path;
use std::time::Duration;

use async_nats::{Client, ConnectErrorKind, ConnectOptions};

use crate::error::ConnectError;

/// Where to connect and as whom.
#[derive(Clone, Debug)]
pub struct ConnectTarget {
    /// One URL or several, comma-separated (every server of a cluster).
    pub server: String,
    /// File holding the principal's nkey seed.
    pub creds: std::path::PathBuf,
}

/// Reads the nkey seed from a credentials file: the first line starting with `SU`.
pub fn read_seed(path: &Path) -> Result<String, ConnectError> {
    let text = std::fs::read_to_string(path).map_err(|error| ConnectError::Credentials {
        path: path.display().to_string(),
        error,
    })?;
    text.lines()
        .map(str::trim)
        .find(|line| line.starts_with("SU"))
        .map(str::to_owned)
        .ok_or_else(|| ConnectError::NoSeed {
            path: path.display().to_string(),
        })
}

/// The servers in a comma-separated list.
pub fn server_list(server: &str) -> Vec<String> {
    server
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Connects as the principal whose seed is in `target.creds`. `client_name` shows in the
/// server's connection list (`mgpu-node node001`, `mgpu alice`).
pub async fn connect(target: &ConnectTarget, client_name: &str) -> Result<Client, ConnectError> {
    connect_with(target, client_name, ConnectOptions::new()).await
}

/// Like [`connect`], starting from caller-tuned options (long-running services add event callbacks).
pub async fn connect_with(
    target: &ConnectTarget,
    client_name: &str,
    options: ConnectOptions,
) -> Result<Client, ConnectError> {
    let seed = read_seed(&target.creds)?;
    let servers = server_list(&target.server);
    // Replies come to an inbox named after the key, which only its holder may subscribe to
    // (see `auth::inbox_prefix`): nobody reads another user's replies.
    let public_key = nkeys::KeyPair::from_seed(&seed)
        .map(|pair| pair.public_key())
        .map_err(|_| ConnectError::NoSeed {
            path: target.creds.display().to_string(),
        })?;
    let options = options
        .custom_inbox_prefix(crate::auth::inbox_prefix(&public_key))
        .nkey(seed)
        .name(client_name)
        .connection_timeout(Duration::from_secs(5));
    options
        .connect(servers)
        .await
        .map_err(|err| match err.kind() {
            ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication => {
                ConnectError::AuthenticationFailed {
                    server: target.server.clone(),
                    creds: target.creds.display().to_string(),
                }
            }
            _ => ConnectError::Unreachable {
                server: target.server.clone(),
                detail: err.to_string(),
            },
        })
}
