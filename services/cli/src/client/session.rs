//! Connecting to NATS as the current user: the connection options every command accepts
//! ([`ConnectionArgs`]), the live [`Session`] (whose key signs requests, see
//! [`super::request`]), and who the user is.

use std::path::PathBuf;

use anyhow::{Result, anyhow};
use async_nats::jetstream;
use async_nats::{ConnectOptions, Event, ServerError};
use mgpu_nats::connect::{ConnectTarget, connect_with};

use crate::errors::plain;

/// Where the NATS server is and who we are to it. Accepted before or after the subcommand.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Connection")]
pub struct ConnectionArgs {
    /// NATS server URL; several, comma-separated, for a cluster.
    #[arg(
        long,
        global = true,
        env = "MGPU_SERVER",
        default_value = "nats://127.0.0.1:4222",
        value_name = "URL[,URL…]"
    )]
    pub server: String,

    /// File holding your nkey seed (written by `mgpu admin add-user`).
    #[arg(long, global = true, env = "MGPU_CREDS", value_name = "FILE")]
    pub creds: Option<PathBuf>,

    /// CA certificate (PEM) the server's must be signed by: connect with TLS only (`ca.pem`
    /// from `mgpu admin init --tls`).
    #[arg(long, global = true, env = "MGPU_CA", value_name = "FILE")]
    pub ca: Option<PathBuf>,
}

/// A live connection: the core client (for plain publishes) and its JetStream context.
pub struct Session {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    /// The name jobs are submitted and cancelled under.
    pub user: String,
    /// The user's nkey, which signs every request (the scheduler records the signer).
    pub key: std::sync::Arc<nkeys::KeyPair>,
    /// What the server's permissions refused on this connection so far.
    refusals: std::sync::Arc<Refusals>,
}

/// The server's permission refusals (`Permissions Violation for Publish to "jobs.submit"`),
/// as they arrive on the connection.
#[derive(Default)]
struct Refusals {
    texts: std::sync::Mutex<Vec<String>>,
    arrived: tokio::sync::Notify,
}

impl Refusals {
    fn add(&self, text: String) {
        self.texts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(text);
        self.arrived.notify_waiters();
    }

    fn find(&self, needle: &str) -> Option<String> {
        self.texts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .find(|text| text.contains(needle))
            .cloned()
    }
}

impl Session {
    /// Connects with the credentials from `--creds` / `MGPU_CREDS`.
    pub async fn connect(connection: &ConnectionArgs) -> Result<Session> {
        Session::connect_with(connection).await
    }

    /// Resolves with the server's refusal once it refuses a publish to a subject beginning
    /// with one of `subjects` on this connection; never, otherwise. A refused publish is
    /// dropped and never acknowledged: raced against the acknowledgement, it says at once why
    /// none will come.
    pub async fn publish_refused(&self, subjects: &[&str]) -> String {
        let needles: Vec<String> = subjects
            .iter()
            .map(|subject| format!("Publish to \"{subject}"))
            .collect();
        self.refused_any(&needles).await
    }

    /// Resolves with the server's first permission refusal on this connection that names
    /// `needle` (a subject, a stream); never, otherwise. Raced against a read or a subscription
    /// the server may refuse, it says at once what waiting for an answer that will never come
    /// would say only after a timeout.
    pub async fn refused(&self, needle: &str) -> String {
        self.refused_any(&[needle.to_owned()]).await
    }

    async fn refused_any(&self, needles: &[String]) -> String {
        loop {
            // Asked for before looking, so a refusal that arrives in between still wakes us.
            let arrived = self.refusals.arrived.notified();
            if let Some(text) = needles.iter().find_map(|n| self.refusals.find(n)) {
                return text;
            }
            arrived.await;
        }
    }

    /// Connects, keeping the server's permission refusals ([`Session::refused`]): a publish,
    /// subscription or consumer the server's permissions forbid is dropped with an `-ERR` on
    /// the connection (`Permissions Violation for Publish to "admin.requests"`), and no answer
    /// ever comes.
    async fn connect_with(connection: &ConnectionArgs) -> Result<Session> {
        let refusals = std::sync::Arc::new(Refusals::default());
        let kept = std::sync::Arc::clone(&refusals);
        let options = ConnectOptions::new().event_callback(move |event| {
            let kept = std::sync::Arc::clone(&kept);
            async move {
                if let Event::ServerError(ServerError::Other(text)) = event
                    && text.contains("Permissions Violation")
                {
                    kept.add(text);
                }
            }
        });
        let creds = connection.creds.clone().ok_or_else(|| {
            anyhow!(
                "no credentials: pass --creds FILE or set MGPU_CREDS \
                 (scripts/dev-up.sh writes .mgpu/env to source)"
            )
        })?;
        let user = current_user();
        let seed = mgpu_nats::connect::read_seed(&creds).map_err(plain)?;
        let key = nkeys::KeyPair::from_seed(&seed)
            .map_err(|e| anyhow!("{}: not a valid nkey seed: {e}", creds.display()))?;
        let target = ConnectTarget {
            server: connection.server.clone(),
            creds,
            ca: connection.ca.clone(),
        };
        // The shared error is already one sentence a person can act on; adding context would
        // only repeat the server address.
        let client = connect_with(&target, &format!("mgpu {user}"), options)
            .await
            .map_err(plain)?;
        let js = jetstream::new(client.clone());
        Ok(Session {
            client,
            js,
            user,
            key: std::sync::Arc::new(key),
            refusals,
        })
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
