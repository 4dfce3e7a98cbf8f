//! `mgpu notify`: where the signed-in user's notices go (`add`, `list`, `remove`), and a test
//! notice to all of them (`test`). Destinations live in the KV bucket `mgpu-notify` under the
//! user's own public key, where the server lets only them (and admins, and `mgpu-notify`) read
//! or write; `add` also makes the user's webhook signing secret, once. The `mgpu-notify`
//! service does the sending (see docs/notifications.md); this command only writes what it
//! reads, and refuses a destination it would refuse.

use std::process::ExitCode;

use anyhow::{Context as _, Result, anyhow, bail};
use async_nats::jetstream::kv;
use clap::{Args, Subcommand, ValueEnum};
use mgpu_protocol::idle::{Notice, NoticeKind};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::notify::destination::Destination;
use mgpu_protocol::notify::{self, DESTINATIONS_BUCKET, DESTINATIONS_BUCKET_STREAM};
use mgpu_protocol::subjects;
use serde::Serialize;

use crate::client::session::{ConnectionArgs, Session};
use crate::console;
use crate::errors::plain;
use crate::tables::Table;

#[derive(Debug, Args)]
#[command(after_long_help = "\
Examples:
  mgpu notify add slack https://hooks.slack.com/services/T000/B000/XXXX
  mgpu notify add email alice@example.org
  mgpu notify add webhook https://ci.example.org/mgpu-hook
  mgpu notify list
  mgpu notify test
  mgpu submit --notify end,fail -- python train.py

Webhooks carry X-Mgpu-Signature: sha256=<hex HMAC-SHA256 of the body with your secret>;
`mgpu notify list --show-secret` prints the secret. See docs/notifications.md.")]
pub struct NotifyArgs {
    #[command(subcommand)]
    pub action: NotifyAction,
}

#[derive(Debug, Subcommand)]
pub enum NotifyAction {
    /// Add a destination for your notices (an https URL, or an e-mail address).
    Add(AddArgs),
    /// List your destinations.
    List(ListArgs),
    /// Remove one of your destinations by its id (from `mgpu notify list`).
    Remove(RemoveArgs),
    /// Send a test notice to every destination you have.
    Test,
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// What receives the notices: a chat's incoming webhook (slack, mattermost, discord),
    /// any HTTP receiver (webhook: the notice as JSON), or email.
    #[arg(value_enum)]
    pub kind: Kind,
    /// The webhook's URL (https; http only to this host), or the e-mail address.
    #[arg(value_name = "URL|ADDRESS")]
    pub target: String,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Kind {
    Slack,
    Mattermost,
    Discord,
    Webhook,
    Email,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print one JSON document: `destinations` (each `id`, `kind`, `target`), and `secret`
    /// with --show-secret.
    #[arg(long)]
    pub json: bool,
    /// Also print your webhook signing secret (receivers check X-Mgpu-Signature with it).
    #[arg(long)]
    pub show_secret: bool,
    #[command(flatten)]
    pub other: super::notices::OtherUser,
}

#[derive(Debug, Args)]
pub struct RemoveArgs {
    /// The destination's id, as `mgpu notify list` prints it.
    pub id: String,
}

pub async fn run(connection: &ConnectionArgs, args: &NotifyArgs) -> Result<ExitCode> {
    match &args.action {
        NotifyAction::Add(add_args) => add(connection, add_args).await,
        NotifyAction::List(list_args) => list(connection, list_args).await,
        NotifyAction::Remove(remove_args) => remove(connection, remove_args).await,
        NotifyAction::Test => test(connection).await,
    }
}

/// The destinations bucket, or a sentence saying it is missing.
async fn bucket(session: &Session) -> Result<kv::Store> {
    session
        .js
        .get_key_value(DESTINATIONS_BUCKET)
        .await
        .map_err(|e| {
            anyhow!(
                "cannot open the destinations bucket {DESTINATIONS_BUCKET} ({e}): ask an admin \
                 to run `mgpu admin setup` with this version of mgpu"
            )
        })
}

async fn add(connection: &ConnectionArgs, args: &AddArgs) -> Result<ExitCode> {
    let kind = format!("{:?}", args.kind).to_ascii_lowercase();
    // Refused before connecting: a bad URL needs no server to say so.
    let destination = Destination::parse(&kind, &args.target).map_err(plain)?;
    let session = Session::connect(connection).await?;
    let key = session.key.public_key();
    let bucket = bucket(&session).await?;
    let value = serde_json::to_vec(&destination)?;
    bucket
        .put(destination.key(&key), value.into())
        .await
        .map_err(|e| anyhow!("cannot store the destination: {e}"))?;
    let new_secret = ensure_secret(&bucket, &key).await?;
    console::println(&format!(
        "Added {} destination {}: {}",
        destination.kind(),
        destination.id(),
        destination.target()
    ))?;
    if new_secret && !matches!(destination, Destination::Email { .. }) {
        console::println(
            "Webhooks are signed (X-Mgpu-Signature); `mgpu notify list --show-secret` prints \
             your secret.",
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Makes the user's signing secret unless they have one; true when it was made now.
async fn ensure_secret(bucket: &kv::Store, key: &str) -> Result<bool> {
    let secret = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    match bucket.create(notify::secret_key(key), secret.into()).await {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(anyhow!("cannot store your signing secret: {e}")),
    }
}

/// One destination as `list --json` prints it.
#[derive(Serialize)]
struct Listed {
    id: String,
    kind: &'static str,
    target: String,
}

#[derive(Serialize)]
struct Listing {
    destinations: Vec<Listed>,
    #[serde(skip_serializing_if = "Option::is_none")]
    secret: Option<String>,
}

async fn list(connection: &ConnectionArgs, args: &ListArgs) -> Result<ExitCode> {
    let other = args.other.key()?;
    let session = Session::connect(connection).await?;
    let key = other.unwrap_or_else(|| session.key.public_key());
    let (destinations, secret) = read_entries(&session, &key).await.map_err(|e| {
        if args.other.user.is_some() {
            anyhow!("cannot read that user's destinations (admins only): {e}")
        } else {
            e
        }
    })?;
    let listing = Listing {
        destinations: destinations
            .iter()
            .map(|d| Listed {
                id: d.id(),
                kind: d.kind(),
                target: d.target().to_owned(),
            })
            .collect(),
        secret: secret.filter(|_| args.show_secret),
    };
    if args.json {
        console::print_json(&listing)?;
        return Ok(ExitCode::SUCCESS);
    }
    if listing.destinations.is_empty() {
        console::println("No destinations: add one with `mgpu notify add KIND URL|ADDRESS`.")?;
    } else {
        let mut table = Table::new(["ID", "KIND", "TARGET"]);
        for d in &listing.destinations {
            table.row(vec![d.id.clone(), d.kind.to_owned(), d.target.clone()]);
        }
        console::print(&table.render())?;
    }
    if let Some(secret) = &listing.secret {
        console::println(&format!("Signing secret: {secret}"))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Every destination of the user whose key is `key`, and their secret: one read through a
/// consumer whose filter names their key (the only one the server lets a user create).
async fn read_entries(session: &Session, key: &str) -> Result<(Vec<Destination>, Option<String>)> {
    let filter = notify::user_entries(key);
    let messages = mgpu_nats::reading::last_per_subject(
        &session.js,
        DESTINATIONS_BUCKET_STREAM,
        &filter,
        false,
    )
    .await
    .map_err(plain)?;
    let secret_subject = format!("$KV.{DESTINATIONS_BUCKET}.{}", notify::secret_key(key));
    let mut destinations = Vec::new();
    let mut secret = None;
    for message in messages {
        // A removed entry stays as an empty delete marker.
        if message.payload.is_empty() {
            continue;
        }
        if message.subject.as_str() == secret_subject {
            secret = Some(String::from_utf8_lossy(&message.payload).into_owned());
        } else if let Ok(destination) = serde_json::from_slice::<Destination>(&message.payload) {
            destinations.push(destination);
        }
    }
    Ok((destinations, secret))
}

async fn remove(connection: &ConnectionArgs, args: &RemoveArgs) -> Result<ExitCode> {
    let session = Session::connect(connection).await?;
    let key = session.key.public_key();
    let (destinations, _) = read_entries(&session, &key).await?;
    let Some(found) = destinations.iter().find(|d| d.id() == args.id.trim()) else {
        bail!(
            "you have no destination `{}`: `mgpu notify list` shows their ids",
            args.id.trim()
        );
    };
    bucket(&session)
        .await?
        .delete(found.key(&key))
        .await
        .map_err(|e| anyhow!("cannot remove the destination: {e}"))?;
    console::println(&format!("Removed {} {}", found.kind(), found.target()))?;
    Ok(ExitCode::SUCCESS)
}

async fn test(connection: &ConnectionArgs) -> Result<ExitCode> {
    let session = Session::connect(connection).await?;
    let key = session.key.public_key();
    let (destinations, _) = read_entries(&session, &key).await?;
    if destinations.is_empty() {
        bail!("you have no destinations: add one with `mgpu notify add KIND URL|ADDRESS`");
    }
    // The notice's id: mgpu-notify sends each id once to each destination.
    let id = format!("test-{}", uuid::Uuid::new_v4().simple());
    let notice = Notice {
        job: Some(JobId::random()),
        at: mgpu_protocol::now(),
        message: format!(
            "test notice {id} from `mgpu notify test` by {}",
            session.user
        ),
        kind: NoticeKind::Test,
    };
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", id.as_str());
    session
        .js
        .publish_with_headers(
            subjects::notices(&key),
            headers,
            serde_json::to_vec(&notice)?.into(),
        )
        .await
        .map_err(plain)?
        .await
        .context("the notices stream did not store the test notice (is mgpu set up?)")?;
    console::println(&format!(
        "Test notice queued for {} destination(s); mgpu-notify sends it.",
        destinations.len()
    ))?;
    Ok(ExitCode::SUCCESS)
}
