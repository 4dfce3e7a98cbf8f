//! Where `mgpu top`'s inputs come from, each a stream of [`Input`]s: the jobs bucket and the
//! cluster bucket watched (every current value, then each change), the heartbeats (each
//! node's last stored one, then the live ones), and the submissions the scheduler has not
//! recorded yet. Everything is read from JetStream and core NATS, never asked of the
//! scheduler, so the screen stays live while it is down.
//!
//! Nothing here writes to stderr: the screen is on the terminal. Problems become a line on
//! the status bar.

use std::time::Duration;

use super::screen::model::Input;
use async_nats::jetstream::{self, kv};
use futures::stream::{self, BoxStream};
use futures::{Stream, StreamExt};
use mgpu_nats::records;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::JobRecord;
use mgpu_protocol::node::NodeHeartbeat;
use mgpu_protocol::subjects;

use crate::client::session::Session;
use crate::errors::plain;

/// How often submissions waiting in `MGPU_REQUESTS` are read again: only a stopped scheduler
/// leaves them there long, and a read of an empty stream is one small request.
const PENDING_EVERY: Duration = Duration::from_secs(5);

/// A stream that first has to be opened: its opening's failure becomes a status line.
fn opened<S>(
    what: &'static str,
    open: impl Future<Output = anyhow::Result<S>> + Send + 'static,
) -> BoxStream<'static, Input>
where
    S: Stream<Item = Input> + Send + 'static,
{
    stream::once(open)
        .flat_map(move |opened| match opened {
            Ok(inputs) => inputs.boxed(),
            Err(err) => stream::iter([Input::Said(format!("cannot read {what}: {err:#}"))]).boxed(),
        })
        .boxed()
}

/// Every job record in the bucket, then each change.
pub fn jobs(js: jetstream::Context) -> BoxStream<'static, Input> {
    opened("the jobs", async move {
        let bucket = records::jobs_bucket(&js).await.map_err(plain)?;
        let watch = records::create_reader("watching the jobs", || bucket.watch_with_history(">"))
            .await
            .map_err(plain)?;
        Ok(watch.filter_map(|entry| async move {
            match entry {
                Ok(entry) => job_change(&entry),
                Err(err) => Some(Input::Said(format!("watching the jobs: {err}"))),
            }
        }))
    })
}

fn job_change(entry: &kv::Entry) -> Option<Input> {
    match entry.operation {
        // Listings need only part of each spec; the rest is skipped without being decoded.
        // A record that cannot be read is left out, as `mgpu queue` would stop on it.
        kv::Operation::Put => JobRecord::from_listing_json(&entry.value)
            .ok()
            .map(Input::job),
        kv::Operation::Delete | kv::Operation::Purge => {
            entry.key.parse::<JobId>().ok().map(Input::JobGone)
        }
    }
}

/// The policy, usage and admin marks in the cluster bucket, then each change. A server set
/// up before the bucket existed has none: the defaults stand.
pub fn cluster(js: jetstream::Context) -> BoxStream<'static, Input> {
    opened("the cluster state", async move {
        let watch = match records::cluster_bucket(&js).await {
            Ok(bucket) => Some(
                records::create_reader("watching the cluster state", || {
                    bucket.watch_with_history(">")
                })
                .await
                .map_err(plain)?,
            ),
            Err(mgpu_nats::error::StateError::NotSetUp) => None,
            Err(err) => return Err(plain(err)),
        };
        Ok(stream::iter(watch)
            .flatten()
            .filter_map(|entry| async move {
                match entry {
                    Ok(entry) => cluster_change(&entry),
                    Err(err) => Some(Input::Said(format!("watching the cluster state: {err}"))),
                }
            }))
    })
}

fn cluster_change(entry: &kv::Entry) -> Option<Input> {
    let put = entry.operation == kv::Operation::Put;
    if entry.key == subjects::POLICY_KEY {
        let policy = if put {
            serde_json::from_slice(&entry.value).ok()?
        } else {
            Default::default()
        };
        return Some(Input::Policy(policy));
    }
    if entry.key == subjects::USAGE_KEY {
        let usage = if put {
            serde_json::from_slice(&entry.value).ok()?
        } else {
            Default::default()
        };
        return Some(Input::Usage(usage));
    }
    let node = entry.key.strip_prefix("node.")?.to_owned();
    let marks = if put {
        Some(serde_json::from_slice(&entry.value).ok()?)
    } else {
        None
    };
    Some(Input::Marks { node, marks })
}

/// Each node's last stored heartbeat, then every heartbeat as it is sent. The subscription
/// is made before the stored ones are read, so none is missed in between; the model keeps
/// the newest of each node.
pub fn heartbeats(session: &Session) -> BoxStream<'static, Input> {
    let (client, js) = (session.client.clone(), session.js.clone());
    opened("the heartbeats", async move {
        let live = client
            .subscribe(subjects::ALL_HEARTBEATS)
            .await
            .map_err(plain)?;
        // Read here rather than with `records::list_nodes`, which warns on stderr about a
        // malformed heartbeat: under the full screen, that would scribble over it.
        let stored =
            records::last_per_subject(&js, subjects::NODES_STREAM, subjects::ALL_HEARTBEATS, false)
                .await
                .map_err(plain)?;
        let stored: Vec<Input> = stored
            .iter()
            .filter_map(|message| heartbeat(&message.payload))
            .collect();
        let live = live.filter_map(|message| async move { heartbeat(&message.payload) });
        Ok(stream::iter(stored).chain(live))
    })
}

fn heartbeat(payload: &[u8]) -> Option<Input> {
    serde_json::from_slice::<NodeHeartbeat>(payload)
        .ok()
        .map(Input::heartbeat)
}

/// The submissions waiting for the scheduler, read now and every [`PENDING_EVERY`].
pub fn pending(js: jetstream::Context) -> BoxStream<'static, Input> {
    let ticks = tokio::time::interval(PENDING_EVERY);
    stream::unfold((js, ticks), |(js, mut ticks)| async move {
        ticks.tick().await;
        // A failed read says nothing new: the jobs watch reports a server it cannot read.
        let read = records::pending_submissions(&js).await.ok();
        Some((read.map(Input::Pending), (js, ticks)))
    })
    .filter_map(|input| async move { input })
    .boxed()
}

/// Whether the user is an admin, as the server's permissions say: a user may not subscribe
/// outside a few subjects, and the server answers such a subscription with a permissions
/// error; an admin's goes through without a word ([`Session::refused`]).
pub async fn admin(session: &Session) -> Input {
    /// How long after the server's answer to the ping a refusal may still be on its way
    /// through the client's event handler.
    const LATE: Duration = Duration::from_millis(500);
    let probe = format!("mgpu.top.admin-probe.{}", JobId::random());
    let Ok(mut subscription) = session.client.subscribe(probe.clone()).await else {
        return Input::Said("cannot tell whether you are an admin".to_owned());
    };
    // The server handles the subscription before the ping the flush sends.
    let _ = session.client.flush().await;
    let _ = subscription.unsubscribe().await;
    let refused = tokio::time::timeout(LATE, session.refused(&probe))
        .await
        .is_ok();
    Input::Admin(!refused)
}
