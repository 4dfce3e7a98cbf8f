//! Connecting to NATS with an nkey seed file, turning failures into one clear sentence.
//!
//! With a CA certificate (`--ca FILE` / `MGPU_CA`, written by `mgpu admin init --tls`) the connection must be
//! TLS and the server's certificate must be signed by that CA; the nkey login happens inside
//! the encrypted connection. A `tls://` URL also insists on TLS, trusting the system's CAs
//! unless a CA file is given.

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
    /// The CA certificate the server's must be signed by; Some means TLS is required.
    pub ca: Option<std::path::PathBuf>,
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
    let options = match &target.ca {
        // Checked here: async-nats would only say "No such file" from deep in the handshake.
        Some(ca) if !ca.is_file() => {
            return Err(ConnectError::CaMissing {
                path: ca.display().to_string(),
            });
        }
        Some(ca) => options.require_tls(true).add_root_certificates(ca.clone()),
        None => options,
    };
    // Replies come to an inbox named after the key, which only its holder may subscribe to
    // (see `auth::inbox_prefix`): nobody reads another user's replies.
    let public_key = nkeys::KeyPair::from_seed(&seed)
        .map(|pair| pair.public_key())
        .map_err(|_| ConnectError::NoSeed {
            path: target.creds.display().to_string(),
        })?;
    let options = options
        .custom_inbox_prefix(mgpu_protocol::principals::inbox_prefix(&public_key))
        .reconnect_to_server_callback(|servers, _| async move { first_try(&servers) })
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
            kind if is_tls_failure(kind, &err.to_string()) => ConnectError::Tls {
                server: target.server.clone(),
                detail: err.to_string(),
                hint: match &target.ca {
                    Some(ca) => format!(
                        "is TLS on at the server (`mgpu admin init --tls`), and is its \
                         certificate signed by {}?",
                        ca.display()
                    ),
                    None => "the server requires TLS: set MGPU_CA (or --ca) to the cluster's \
                             CA certificate, ca.pem in the credentials directory"
                        .to_owned(),
                },
            },
            _ => ConnectError::Unreachable {
                server: target.server.clone(),
                detail: err.to_string(),
            },
        })
}

/// The very first connection attempt to a single server, made at once.
///
/// async-nats waits its reconnect delay before every attempt, the first one included, and a
/// zero delay still waits for the runtime's next 1 ms timer tick: a millisecond added to
/// every `mgpu` command, a sixth of the time a submission takes. A server chosen here is the
/// only one tried by that attempt, so with several servers (a cluster, one of them perhaps
/// down) the library keeps its own choice, which goes on to the next server. Later attempts
/// (a reconnect) keep the library's choice and backoff too.
fn first_try(servers: &[async_nats::Server]) -> Option<async_nats::ReconnectToServer> {
    let [server] = servers else {
        return None;
    };
    if server.did_connect || server.failed_attempts > 0 {
        return None;
    }
    Some(async_nats::ReconnectToServer {
        addr: server.addr.clone(),
        delay: Some(Duration::ZERO),
    })
}

/// Whether a failed connection failed at TLS. async-nats reports a certificate it could not
/// verify as an I/O error (`invalid peer certificate: UnknownIssuer`), so the text counts too.
fn is_tls_failure(kind: ConnectErrorKind, detail: &str) -> bool {
    let detail = detail.to_ascii_lowercase();
    kind == ConnectErrorKind::Tls
        || (kind == ConnectErrorKind::Io
            // A server without TLS answers the handshake in plaintext: "corrupt message".
            && ["certificate", "tls", "handshake", "corrupt message"]
                .iter()
                .any(|word| detail.contains(word)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unverifiable_certificate_is_a_tls_failure_and_a_refused_connection_is_not() {
        assert!(is_tls_failure(
            ConnectErrorKind::Io,
            "IO error: invalid peer certificate: UnknownIssuer"
        ));
        assert!(is_tls_failure(ConnectErrorKind::Tls, "TLS error"));
        assert!(is_tls_failure(
            ConnectErrorKind::Io,
            "IO error: received corrupt message of type InvalidContentType"
        ));
        assert!(!is_tls_failure(
            ConnectErrorKind::Io,
            "IO error: Connection refused (os error 111)"
        ));
    }

    #[tokio::test]
    async fn a_missing_ca_file_is_named_before_any_connection_is_tried() {
        let Ok(dir) = tempfile::tempdir() else { return };
        let creds = dir.path().join("user.nk");
        let _ = std::fs::write(&creds, "SUNOTAREALSEED\n");
        let target = ConnectTarget {
            // Nothing listens there: the CA check must come first.
            server: "nats://127.0.0.1:1".into(),
            creds,
            ca: Some(dir.path().join("ca.pem")),
        };
        let err = connect(&target, "test").await.err().map(|e| e.to_string());
        let err = err.unwrap_or_default();
        assert!(err.starts_with("CA certificate "), "{err}");
        assert!(err.contains("ca.pem does not exist"), "{err}");
    }
}
